"""How each role's model is laid out on devices, and what that costs in memory per device.

A :class:`Layout` gives the degrees of data (``dp``), tensor (``tp``), pipeline (``pp``), context
(``cp``) and expert (``ep``) parallelism of one role, its ZeRO stage, micro-batch, activation
recomputation and optimizer offload. Its devices are ``dp x tp x pp x cp``; expert parallelism
takes its ``ep`` ranks from the ``tp x cp x dp`` ranks of a pipeline stage, the experts
themselves not split by TP (Megatron-Core's expert parallelism with expert-tensor-parallel size
1; the ranks that hold the same experts form the expert-data-parallel group). On a mesh the axes
are ordered ``pp, dp, cp, tp`` from slowest to fastest, so a TP group sits inside a node
(:func:`axis_strides`).

**Which RL stage uses what.** Training (policy and critic updates, and the scoring forwards that
run in the training layout) uses FSDP/ZeRO or Megatron 3-D (DP x TP x PP, plus CP for long
sequences and EP for MoE); generation uses tensor-parallel *replicas* (``tp`` devices each, as
many replicas as fit) because decode reads every weight at every token: the fewer devices a
replica spans, the fewer all-reduces per token, and the more replicas decode side by side.

**Memory per device** (bytes), training role (:func:`training_memory`):

* model states: weights, gradients and Adam states, 2 + 2 + 12 bytes per parameter of the device's
  share, sharded by ZeRO over the data-parallel degree (:func:`rlm_course.cost.anatomy.zero_model_state_bytes`;
  Rajbhandari et al. 2019); with ``main_grads_fp32`` the gradients are fp32 (4 bytes) and stay
  whole under ZeRO-1: Megatron-Core's distributed optimizer with bf16 parameters keeps
  ``6 + 12 / d`` bytes per parameter (its guide's "Distributed Optimizer" table: bf16 weights,
  fp32 main gradients, and fp32 main weights, momentum and variance sharded over ``d``); the share is the dense weights ``/ (tp x pp)`` plus the experts
  ``/ (ep x pp)`` (``/ (tp x pp)`` without EP); ``offload`` keeps the optimizer states in host
  memory (the CPU-Adam of DeepSpeed, slime, verl); the experts' states are sharded over the
  expert-data-parallel degree ``tp x cp x dp / ep``;
* activations of the micro-batches in flight: one micro-batch of all layers under 1F1B
  (stage 0 holds ``pp`` micro-batches of ``n_layer / pp`` layers), counted by
  :func:`rlm_course.cost.anatomy.activation_bytes` for its tokens (``micro_batch`` sequences of
  the longest length, or the packed token budget ``micro_batch_tokens``; FlashAttention keeps
  them linear in the tokens) and divided by ``tp x cp`` with sequence parallelism
  (``sequence_parallel``, Megatron's ``--sequence-parallel``); without it TP splits only the
  values inside its matmuls (attention's Q, K, V and output, the MLP's hidden tensors) and every
  rank keeps those around them (the norms' and the blocks' inputs):
  :func:`~rlm_course.cost.anatomy.layer_activation_values`, ``s h (8 + 25.5 / t)`` per layer of
  Llama-3-70B where the paper's GPT layer keeps ``s h (10 + 24 / t)`` (Korthikanti et al. 2022,
  arXiv:2205.05198, section 4.2.2 and Table 2), and with full recomputation the layer inputs are
  whole on every rank;
* the fp32 logits of a micro-batch, ``tokens x vocab x 4 / tp``, the RL-specific peak of
  computing log-probs and entropy (chunking removes it; not assumed);

generation role (:func:`generation_memory`): the weights ``/ tp`` (bf16, or fp8 for a quantized
rollout) and, in the rest of the device's usable memory, the KV cache, whose per-token bytes split
over ``min(tp, kv_heads)`` devices, or none for a latent cache that every rank holds whole
(:meth:`~rlm_course.cost.architectures.TransformerSpec.kv_shards`). A replica admits as many sequences as their KV caches fit (a paged cache holds what each
sequence has written: prompt plus mean response), at most ``max_batch``.

A layout that does not fit raises :class:`DoesNotFit` with what does not fit and how to fix it.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace

from rlm_course.cost.anatomy import activation_bytes, zero_model_state_bytes
from rlm_course.cost.architectures import TransformerSpec
from rlm_course.cost.hardware import Device
from rlm_course.utils import as_int, check_amount, check_kinds, is_real, plain_ints

GB = 1e9
ADAM_STATE_BYTES = 12  # fp32 master weights, momentum, variance


class DoesNotFit(ValueError):
    """A layout needs more memory per device than the device has; the message says what."""


@dataclass(frozen=True)
class Layout:
    """One role's parallel layout.

    Attributes:
        dp, tp, pp, cp, ep: degrees (``ep`` divides ``tp x cp x dp``).
        zero: ZeRO stage 0-3 of the data-parallel ranks (3 = FSDP).
        micro_batch: sequences per micro-batch per data-parallel rank.
        micro_batch_tokens: instead, a token budget per micro-batch (dynamic batching with
            sequence packing: verl's ``ppo_max_token_len_per_gpu``, NeMo-RL's
            ``train_mb_tokens``); 0: use ``micro_batch``.
        scoring_micro_batch_tokens: a forward-only pass's token budget per micro-batch (the
            log-probs of the policy and the reference: NeMo-RL's ``logprob_mb_tokens``, verl's
            ``log_prob_max_token_len_per_gpu``, often larger than the training budget, as a
            forward keeps no activations for a backward); 0: the training micro-batch's.
        recompute: full activation recomputation.
        offload: optimizer states in host memory.
        overlap: overlap gradient communication with the backward (DDP buckets, FSDP prefetch).
        sequence_parallel: Megatron's sequence parallelism, which splits the activations outside
            TP's matmuls over the ``tp`` ranks too (on by default, as in Megatron-Core's
            recommended settings; off: only the parts inside the split matmuls are divided).
        main_grads_fp32: gradients accumulated and reduced in fp32 (Megatron-Core's default
            ``accumulate_allreduce_grads_in_fp32``): 4 bytes per parameter in memory and on the
            data-parallel wire instead of 2.

    Raises:
        ValueError: for non-positive degrees, an unknown ZeRO stage, an ``ep`` that does not
            divide ``tp x cp x dp``, a token budget that is not an integer >= 0, or a flag that
            is not a bool.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 0
    micro_batch: int = 1
    micro_batch_tokens: int = 0
    scoring_micro_batch_tokens: int = 0
    recompute: bool = False
    offload: bool = False
    overlap: bool = True
    main_grads_fp32: bool = False
    sequence_parallel: bool = True

    def __post_init__(self) -> None:
        plain_ints(self)  # numpy's integers too
        for name in ("dp", "tp", "pp", "cp", "ep", "micro_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Layout.{name}={value!r} must be a positive integer.")
        for name, zero in (("micro_batch_tokens", "micro-batches of micro_batch sequences"),
                           ("scoring_micro_batch_tokens", "the training micro-batch's")):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
                raise ValueError(f"Layout.{name}={value!r} must be an integer >= 0 (0: {zero}).")
        if not isinstance(self.zero, int) or isinstance(self.zero, bool) or self.zero not in (
                0, 1, 2, 3):
            raise ValueError(f"Layout.zero={self.zero!r}: choose ZeRO stage 0, 1, 2 or 3 (an "
                             "integer).")
        for name in ("recompute", "offload", "overlap", "main_grads_fp32", "sequence_parallel"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Layout.{name}={getattr(self, name)!r} must be True or False.")
        if (self.tp * self.cp * self.dp) % self.ep:
            raise ValueError(f"Layout: ep={self.ep} must divide tp x cp x dp = "
                             f"{self.tp * self.cp * self.dp} (the expert-parallel ranks come from "
                             "a pipeline stage's ranks).")

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def check(self, spec: TransformerSpec) -> None:
        """Raise ``ValueError`` if the degrees do not fit the architecture: ``tp`` must divide the
        query heads and hold whole key/value heads, ``pp`` be at most the layers, ``ep`` divide
        the experts (and be 1 for a dense model)."""
        spec.check_degree("tp", self.tp)  # the query heads, and whole KV heads per rank
        if self.pp > spec.n_layer:
            raise ValueError(f"pp={self.pp} exceeds {spec.name}'s {spec.n_layer} layers.")
        if self.ep > 1 and (not spec.is_moe or spec.n_experts % self.ep):
            raise ValueError(f"ep={self.ep}: {spec.name} has {spec.n_experts} expert(s); expert "
                             "parallelism needs an MoE model and a degree dividing its experts.")
        if self.ep > 1 and self.tp > 1 and not self.sequence_parallel:
            raise ValueError(f"ep={self.ep} with tp={self.tp} and sequence_parallel=False: "
                             "Megatron-Core requires sequence parallelism when expert and tensor "
                             "parallelism are combined (each rank dispatches its 1/tp of the "
                             "tokens); set sequence_parallel=True or tp=1.")

    def describe(self) -> str:
        parts = [f"dp{self.dp}"] + [f"{a}{getattr(self, a)}" for a in ("tp", "pp", "cp", "ep")
                                    if getattr(self, a) > 1]
        if self.zero:
            parts.append("fsdp" if self.zero == 3 else f"zero{self.zero}")
        if self.recompute:
            parts.append("recompute")
        if self.offload:
            parts.append("cpu-optimizer")  # ZeRO-Offload: not the states parked while generating
        if self.main_grads_fp32:
            parts.append("fp32-grads")
        return " ".join(parts)

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element, in memory and on the data-parallel wire."""
        return 4 if self.main_grads_fp32 else 2

    def micro_tokens(self, seq_len: int, scoring: bool = False) -> int:
        """Tokens in one micro-batch: the token budget, or ``micro_batch`` sequences of
        ``seq_len``; a sequence is never split across micro-batches (only across ``cp``).
        ``scoring``: of a forward-only pass, at ``scoring_micro_batch_tokens`` when set."""
        if scoring and self.scoring_micro_batch_tokens:
            return max(self.scoring_micro_batch_tokens, seq_len)
        if self.micro_batch_tokens:
            return max(self.micro_batch_tokens, seq_len)
        return self.micro_batch * seq_len


def _kinds(owner: str, **values) -> None:
    """A ValueError for a name or a dict where a spec, device or Layout belongs: ``values`` maps
    ``spec``, ``device`` or ``layout`` to what the caller passed."""
    kinds = {"spec": (TransformerSpec, "get_spec('llama-3.1-8b')"),
             "device": (Device, "get_device('H100-SXM-80GB')"),
             "layout": (Layout, "Layout(tp=8, dp=2)")}
    check_kinds([(name, value, *kinds[name]) for name, value in values.items()], f"{owner}: ")


def _degrees(owner: str, name: str, values) -> list[int]:
    """``values`` as a list of Python ints (numpy's integers too), or a ValueError naming
    ``owner`` and ``name`` unless it is a non-empty list of positive integers."""
    if (isinstance(values, (str, bytes)) or not hasattr(values, "__iter__")
            or not list(values) or not all(isinstance(v, numbers.Integral)
                                           and not isinstance(v, bool) and v >= 1 for v in values)):
        raise ValueError(f"{owner}: {name}={values!r} must be a list of positive integers, e.g. "
                         "(1, 2, 4, 8).")
    return [int(v) for v in values]


def _bandwidth_share(owner: str, value) -> None:
    if not (is_real(value) and 0 < value <= 1):
        raise ValueError(f"{owner}: bandwidth_efficiency={value!r} must be a share of the memory "
                         "bandwidth in (0, 1] (0.7 is typical for decode).")


def _bytes_per_element(owner: str, name: str, value) -> None:
    if not (is_real(value) and math.isfinite(value) and value > 0):
        raise ValueError(f"{owner}: {name}={value!r} must be a positive number of bytes per "
                         "element (2: bf16, 1: fp8).")


def axis_strides(layout: Layout) -> dict[str, tuple[int, int]]:
    """``{axis: (degree, stride)}`` on the mesh ``pp, dp, cp, tp`` (``tp`` fastest): the
    ranks of a group along an axis are ``stride`` apart. An expert-parallel group is ``ep``
    consecutive ranks of a stage; the expert-data-parallel group (``edp``) the ranks ``ep``
    apart that hold the same experts."""
    t, c, d = layout.tp, layout.cp, layout.dp
    return {"tp": (t, 1), "cp": (c, t), "ep": (layout.ep, 1), "dp": (d, t * c),
            "edp": (t * c * d // layout.ep, layout.ep), "pp": (layout.pp, t * c * d)}


def params_per_device(spec: TransformerSpec, layout: Layout) -> tuple[float, float]:
    """``(dense, expert)`` parameters the busiest device holds before ZeRO: its pipeline stage's
    dense part ``/ tp``, its experts ``/ ep`` (``/ tp`` without EP).

    Without pipeline parallelism the stage is the whole model. With ``pp`` stages, Megatron-LM's
    default split (``num_layers / pp`` layers a stage; arXiv:2104.04473) gives the heaviest stage
    ``ceil(n_layer / pp)`` layers plus the larger of the first stage's input embedding (and
    learned positions) and the last stage's final norm and output head (a copy of the embedding
    when tied: Megatron keeps one on the last stage to compute the logits). For Qwen3-4B at
    ``pp = 4``, 9 layers and the 389M-parameter embedding: 1.30B parameters, where an even
    quarter of the model is 1.01B."""
    _kinds("params_per_device", spec=spec, layout=layout)
    experts = spec.expert_params()
    split = layout.ep if layout.ep > 1 else layout.tp
    if layout.pp == 1:
        return (spec.params() - experts) / layout.tp, experts / split
    layers = -(-spec.n_layer // layout.pp)
    routed = spec.n_experts * spec.mlp_params() if spec.is_moe else 0
    first = spec.vocab_size * spec.d_model + spec.learned_positions * spec.d_model
    last = spec.vocab_size * spec.d_model + spec._norms() // 2
    dense = layers * (spec.layer_params() - routed) + max(first, last)
    return dense / layout.tp, layers * routed / split


def model_states(params: float, dp: int, zero: int, offload: bool,
            grad_bytes: int = 2) -> dict[str, float]:
    """Weights, gradients and (device-resident) optimizer states of ``params`` parameters under
    ZeRO ``zero`` over ``dp`` ranks, from :func:`zero_model_state_bytes`; ``grad_bytes = 4``
    (fp32 main gradients) doubles the gradients' share; no parameters, no bytes.

    Raises:
        ValueError: for a parameter count that is not a finite number >= 0, a ``dp`` that is not
            a positive integer, an unknown ZeRO stage or ``grad_bytes`` other than 2 and 4.
    """
    check_amount("model_states: params", params)
    if isinstance(grad_bytes, bool) or grad_bytes not in (2, 4):
        raise ValueError(f"model_states: grad_bytes={grad_bytes!r} must be 2 (bf16 gradients) or "
                         "4 (fp32 main gradients).")
    if not isinstance(offload, bool):
        raise ValueError(f"model_states: offload={offload!r} must be True or False.")
    n = int(params)
    if n == 0:
        return {"weights": 0.0, "gradients": 0.0, "optimizer": 0.0}
    total = zero_model_state_bytes(n, dp, zero, ADAM_STATE_BYTES)
    no_optimizer = zero_model_state_bytes(n, dp, zero, 0)
    weights = 2 * n / dp if zero == 3 else 2.0 * n
    return {"weights": weights, "gradients": (no_optimizer - weights) * grad_bytes / 2,
            "optimizer": 0.0 if offload else total - no_optimizer}


def training_memory(spec: TransformerSpec, layout: Layout, seq_len: int,
                    trained: bool = True) -> dict[str, float]:
    """Bytes per device of one role in its training layout: ``weights``, ``gradients``,
    ``optimizer`` (trained roles; see the module docstring), ``activations`` and ``logits`` of
    the micro-batches in flight (trained roles), or the bf16 weights alone (frozen roles such as
    the reference, sharded like the trainer; ZeRO-3 shards them over the data-parallel ranks
    too).

    Raises:
        ValueError: for a layout that does not fit the architecture, or a sequence length that
            is not a finite number >= 0.
    """
    _kinds("training_memory", spec=spec, layout=layout)
    layout.check(spec)
    check_amount("seq_len", seq_len)
    if not isinstance(trained, bool):
        raise ValueError(f"training_memory: trained={trained!r} must be True (a trained role) or "
                         "False (frozen weights, e.g. the reference).")
    if spec.max_context is not None and seq_len > spec.max_context:
        raise ValueError(f"training_memory: seq_len={seq_len:,} tokens exceeds {spec.name}'s "
                         f"context window of {spec.max_context:,}; train on shorter sequences.")
    dense, experts = params_per_device(spec, layout)
    dp_dense = layout.dp * layout.cp
    dp_expert = layout.tp * dp_dense // layout.ep if layout.ep > 1 else dp_dense
    if not trained:
        shard = (lambda p, n: p / n) if layout.zero == 3 else (lambda p, n: p)
        return {"weights": 2 * (shard(dense, dp_dense) + shard(experts, dp_expert))}
    out = {}
    for part, n in ((dense, dp_dense), (experts, dp_expert)):
        for k, v in model_states(part, n, layout.zero, layout.offload, layout.grad_bytes).items():
            out[k] = out.get(k, 0.0) + v
    tokens = layout.micro_tokens(seq_len)  # packed: one sequence of this many tokens
    split = layout.sequence_parallel or layout.tp == 1
    # with sequence parallelism every value splits over TP; without, the inside values only
    # (the layer inputs that recomputation keeps are whole on every TP rank)
    acts = activation_bytes(spec, 1, tokens, layout.recompute,
                            tp=1 if split or layout.recompute else layout.tp)
    if layout.pp > 1:  # 1F1B: the first stage holds pp micro-batches of its ceil(L / pp) layers
        acts *= layout.pp * -(-spec.n_layer // layout.pp) / spec.n_layer
    out["activations"] = acts / ((layout.tp if split else 1) * layout.cp)
    out["logits"] = 4.0 * tokens / layout.cp * spec.vocab_size / layout.tp
    return out


def generation_memory(spec: TransformerSpec, tp: int, weight_bytes: int = 2,
                      kv_bytes: int = 2, draft_layers: int = 0) -> dict[str, float]:
    """Per device of a generation replica of ``tp`` devices: ``weights`` (all parameters at
    ``weight_bytes``, 1 for an fp8 rollout, split ``tp`` ways) and ``kv_per_token``, the KV-cache
    bytes of one token on one device at ``kv_bytes`` per element, split over
    :meth:`~rlm_course.cost.architectures.TransformerSpec.kv_shards` devices (``min(tp,
    kv_heads)``: past the KV heads TP replicates them; a latent cache, whole on every rank), and
    ``draft_layers`` more layers' worth of it for a speculative draft's own cache (DeepSeek-V3's
    multi-token-prediction module: 1); ``draft_weights``, that draft's own layers (a layer's
    share of the parameters without the embedding and output head, which it shares with the
    model), split ``tp`` ways.

    Raises:
        ValueError: if ``tp`` does not divide the heads, for a byte width that is not a
            positive number, or a ``draft_layers`` that is not an integer >= 0.
    """
    _kinds("generation_memory", spec=spec)
    _bytes_per_element("generation_memory", "weight_bytes", weight_bytes)
    _bytes_per_element("generation_memory", "kv_bytes", kv_bytes)
    if isinstance(draft_layers, bool) or not isinstance(draft_layers, int) or draft_layers < 0:
        raise ValueError(f"generation_memory: draft_layers={draft_layers!r} must be an integer "
                         ">= 0 (the layers of a speculative draft's own KV cache; 0 without one).")
    if isinstance(tp, int) and not isinstance(tp, bool) and tp >= 1 and spec.n_head % tp:
        raise ValueError(f"generation tp={tp} does not divide {spec.name}'s {spec.n_head} heads; "
                         "choose a divisor.")
    spec.check_degree("tp", tp)
    body = spec.params() - spec.vocab_size * spec.d_model * (1 if spec.tied_embeddings else 2)
    return {"weights": spec.params() * weight_bytes / tp,
            "kv_per_token": spec.kv_cache_bytes_per_token(kv_bytes) / spec.kv_shards(tp)
            * (spec.n_layer + draft_layers) / spec.n_layer,
            "draft_weights": draft_layers * body / spec.n_layer * weight_bytes / tp}


def usable(device: Device, memory_fraction: float) -> float:
    """Bytes of a device that allocations may use: ``memory_fraction`` of the total CUDA reports
    (:attr:`Device.engine_memory_bytes <rlm_course.cost.hardware.Device.engine_memory_bytes>`:
    84.9e9 bytes of an H100 "80 GB"; the rest: CUDA context, fragmentation, workspaces).

    Raises:
        ValueError: for a ``memory_fraction`` outside (0, 1].
    """
    check_kinds([("device", device, Device, "get_device('H100-SXM-80GB')")], "usable: ")
    if not (is_real(memory_fraction) and 0 < memory_fraction <= 1):
        raise ValueError(f"memory_fraction={memory_fraction!r} must be a fraction in (0, 1] of "
                         "the device's memory (0.9 is typical).")
    return device.engine_memory_bytes * memory_fraction


def _no_room(spec, tp, device, mem, resident, memory_fraction, kv, what) -> DoesNotFit:
    """:func:`kv_slots`' refusal: the weights, the resident state and ``kv`` bytes of KV cache
    for ``what`` do not fit a device of a ``tp``-way replica."""
    return DoesNotFit(
        f"a generation replica of {spec.name} with tp={tp} on {device.name} needs "
        f"{mem['weights'] / GB:,.1f} GB of weights"
        + (f" + {resident / GB:,.1f} GB of resident trainer state" if resident else "")
        + f" + {kv / GB:,.2f} GB of KV cache for {what}, but a device has "
          f"{usable(device, memory_fraction) / GB:,.1f} GB usable; raise the generation tp"
        + (", or offload the trainer's states during generation" if resident else "") + ".")


def kv_slots(spec: TransformerSpec, tp: int, device: Device, tokens_per_sequence: float,
             memory_fraction: float = 0.9, resident: float = 0.0, max_batch: int = 1024,
             weight_bytes: int = 2, kv_bytes: int = 2, draft_layers: int = 0,
             longest: float | None = None) -> int:
    """Sequences one generation replica of ``tp`` devices can decode at once: the KV caches of
    ``tokens_per_sequence`` tokens each that fit beside the weights (:func:`generation_memory`
    at ``weight_bytes``, ``kv_bytes`` and ``draft_layers``: a draft's weights and cache too) and
    ``resident`` bytes of other state per device (e.g. a colocated trainer's), at most
    ``max_batch``. ``longest``: the tokens of the longest sequence the engine must admit (the
    prompt and response budget, vLLM's ``max_model_len``): an engine whose cache cannot hold one
    such sequence alone refuses to start, whatever the mean length (vLLM raises at start-up
    when max_model_len's KV cache exceeds the memory left).

    Raises:
        DoesNotFit: if not even one sequence fits (of ``tokens_per_sequence`` tokens, or of
            ``longest``).
        ValueError: for a ``tp`` that does not fit the model, a token count that is not a finite
            number from 1 to the model's context window, a ``memory_fraction`` outside (0, 1], a
            negative ``resident``, a ``max_batch`` below 1 or a byte width that is not positive.
    """
    _kinds("kv_slots", spec=spec, device=device)
    if not (is_real(tokens_per_sequence) and 1 <= tokens_per_sequence < math.inf):
        raise ValueError(f"tokens_per_sequence={tokens_per_sequence!r} must be a finite number of "
                         "tokens >= 1.")
    if spec.max_context is not None and tokens_per_sequence > spec.max_context:
        raise ValueError(f"kv_slots: tokens_per_sequence={tokens_per_sequence:,} exceeds "
                         f"{spec.name}'s context window of {spec.max_context:,} tokens.")
    if not (is_real(resident) and 0 <= resident < math.inf):
        raise ValueError(f"resident={resident!r} must be a finite number of bytes >= 0.")
    max_batch = as_int(max_batch)  # numpy's integers too
    if isinstance(max_batch, bool) or not (isinstance(max_batch, int) and max_batch >= 1):
        raise ValueError(f"max_batch={max_batch!r} must be a positive integer.")
    mem = generation_memory(spec, tp, weight_bytes, kv_bytes, draft_layers)
    room = usable(device, memory_fraction) - mem["weights"] - mem["draft_weights"] - resident
    per_sequence = mem["kv_per_token"] * tokens_per_sequence
    if longest is not None:
        if not (is_real(longest) and tokens_per_sequence <= longest < math.inf):
            raise ValueError(f"longest={longest!r} must be a finite number of tokens >= "
                             f"tokens_per_sequence={tokens_per_sequence:,}.")
        whole = mem["kv_per_token"] * longest
        if room < whole:
            raise _no_room(spec, tp, device, mem, resident, memory_fraction, whole,
                           f"one sequence of the {longest:,.0f}-token budget per device (an "
                           "engine admits no longer a sequence than its cache holds)")
    if room < per_sequence:
        raise _no_room(spec, tp, device, mem, resident, memory_fraction, per_sequence,
                       "one sequence per device")
    return int(min(max_batch, room // per_sequence))


def check_training(spec: TransformerSpec, layout: Layout, device: Device, seq_len: int,
                   memory_fraction: float = 0.9, role: str = "policy",
                   extra: dict[str, float] | None = None) -> dict[str, float]:
    """The training memory per device of ``role`` (plus ``extra`` bytes such as a frozen
    reference's weights); returns it.

    Raises:
        DoesNotFit: naming the layout, the bytes of each part and the usable memory, with the
            fixes that shrink the parts that overflow: ZeRO-3, TP or PP for the model states;
            CP, TP (with sequence parallelism), sequence parallelism itself under TP, or fewer
            tokens per micro-batch (down to one sequence) for the activations and logits (PP
            does not shrink them: under 1F1B the first stage holds ``pp`` micro-batches of its
            layers); offloading; recomputation (the layer inputs stay). A fix is named alone
            only if what it frees covers the excess.
        ValueError: for ``extra`` that is not ``{name: bytes}`` of finite numbers >= 0, or as
            :func:`training_memory`.
    """
    memory = dict(training_memory(spec, layout, seq_len))
    if extra is not None and not isinstance(extra, dict):
        raise ValueError(f"check_training: extra={extra!r} must be a dict of {{name: bytes}}.")
    for k, v in (extra or {}).items():
        check_amount(f"check_training: extra[{k!r}]", v)
        memory[k] = memory.get(k, 0.0) + v
    _kinds("check_training", device=device)
    total, room = sum(memory.values()), usable(device, memory_fraction)
    if total > room:
        parts = ", ".join(f"{k} {v / GB:,.1f}" for k, v in memory.items() if v)
        excess = total - room
        states = sum(memory.get(k, 0.0) for k in ("weights", "gradients", "optimizer"))
        per_micro_batch = memory.get("activations", 0.0) + memory.get("logits", 0.0)
        # (fix, the most it can save): a fix that alone cannot cover the excess is named only
        # when none can
        acts = memory.get("activations", 0.0)
        fixes = []
        if layout.zero < 3 and layout.dp > 1:  # one data-parallel rank: nothing to shard
            # what ZeRO-3 frees beyond the stage in use (ZeRO-1 already shards the optimizer,
            # ZeRO-2 the gradients too)
            sharded = training_memory(spec, replace(layout, zero=3), seq_len)
            fixes.append(("shard with ZeRO-3/FSDP (zero=3)", states - sum(
                sharded.get(k, 0.0) for k in ("weights", "gradients", "optimizer"))))
        fixes.append(("split each model copy over more GPUs (raise tp or pp)", states))
        fixes.append(("split each sequence's activations and logits over more GPUs (raise cp"
                      + (", or tp" if layout.sequence_parallel else "") + ")", per_micro_batch))
        if layout.tp > 1 and not layout.sequence_parallel:  # TP then splits every value
            with_sp = training_memory(spec, replace(layout, sequence_parallel=True), seq_len)
            fixes.append(("turn on sequence parallelism (sequence_parallel=True)",
                          acts - with_sp["activations"]))
        if layout.micro_batch > 1 or layout.micro_batch_tokens > seq_len:
            # down to one sequence a micro-batch, which keeps its own activations and logits
            one = training_memory(spec, replace(layout, micro_batch=1, micro_batch_tokens=0),
                                  seq_len)
            fixes.append(("put fewer tokens in a micro-batch (micro_batch_tokens, micro_batch)",
                          per_micro_batch - one["activations"] - one["logits"]))
        if not layout.offload:
            fixes.append(("offload the optimizer", memory.get("optimizer", 0.0)))
        if not layout.recompute:  # keeps each layer's input (whole on every TP rank without SP)
            kept = training_memory(spec, replace(layout, recompute=True), seq_len)["activations"]
            fixes.append(("recompute activations", acts - kept))
        enough = [fix for fix, saves in fixes if saves > excess]
        advice = (", or ".join(enough) if enough else
                  "no one change frees enough; combine: " + ", and ".join(
                      fix for fix, saves in fixes if saves > 0))
        raise DoesNotFit(f"{role} layout {layout.describe()} of {spec.name} needs "
                         f"{total / GB:,.1f} GB per {device.name} ({parts} GB) but a device has "
                         f"{room / GB:,.1f} GB usable ({memory_fraction:.0%} of "
                         f"{device.engine_memory_bytes / GB:,.1f} GB): {advice}.")
    return memory


def replica_decode_step_seconds(spec: TransformerSpec, device: Device, tp: int, sequences: int,
                                context: int, link, bandwidth_efficiency: float = 1.0) -> float:
    """Roofline seconds of one decode step of a ``tp``-way replica with ``sequences`` sequences
    at ``context`` tokens: ``max(FLOPs / (tp peak), bytes per device / (bandwidth x
    efficiency))`` (:func:`rlm_course.cost.anatomy.decode_step_seconds`) plus its two
    all-reduces per layer (:func:`rlm_course.cost.comm.decode_tp_comm`, the engine's one-shot
    all-reduce when the replica fits in a node; ``link`` may be None for ``tp = 1``, or the
    cluster's :class:`~rlm_course.cost.comm.Fabric`, whose link for ``tp`` devices is taken: on
    a mesh node each degree has its own, 64 GB/s for an MI300X pair and 448 for eight).

    Raises:
        ValueError: for a ``tp`` that does not fit the model, or ``tp > 1`` without a ``link``.
    """
    from rlm_course.cost.anatomy import decode_step_seconds
    from rlm_course.cost.comm import Fabric, decode_tp_comm

    _kinds("replica_decode_step_seconds", spec=spec, device=device)
    spec.check_degree("tp", tp)
    tp = int(tp)  # numpy's integers too
    _bandwidth_share("replica_decode_step_seconds", bandwidth_efficiency)
    if tp > 1 and link is None:
        raise ValueError(f"a tp={tp} replica needs the link its all-reduces cross; give link.")
    if isinstance(link, Fabric):
        link = link.link(tp) if tp > 1 else None

    scaled = replace(device, memory_bandwidth=device.memory_bandwidth * bandwidth_efficiency)
    roofline = decode_step_seconds(spec, scaled, tp, sequences, context)
    if tp == 1:
        return roofline
    return roofline + decode_tp_comm(spec, tp, sequences, link,
                                     in_node=tp <= device.devices_per_node).seconds


def choose_generation_tp(spec: TransformerSpec, device: Device, gpus: int, sequences: int,
                         tokens_per_sequence: int, link, candidates=(1, 2, 4, 8),
                         memory_fraction: float = 0.9,
                         bandwidth_efficiency: float = 0.7) -> tuple[int, dict[int, float]]:
    """The tensor-parallel degree for generation replicas on ``gpus`` devices decoding
    ``sequences`` sequences of ``tokens_per_sequence`` tokens: among ``candidates`` that divide
    ``gpus`` and that the model allows (:meth:`~rlm_course.cost.architectures.TransformerSpec.
    check_degree`: dividing the heads, whole KV heads a rank), the one whose rollout takes least
    time, estimated as

        waves x steps x step_seconds(sequences per wave, at mid-sequence context)

    with ``replicas = gpus / tp``, ``per_replica = ceil(sequences / replicas)``,
    ``waves = ceil(per_replica / kv_slots)`` (:func:`kv_slots`), ``steps = tokens_per_sequence``
    and :func:`replica_decode_step_seconds` over ``link`` (one Link for every candidate, or the
    cluster's Fabric: each candidate's own group link, which a mesh node needs). A ``tp`` whose
    weights do not fit is skipped; ties go to the smaller ``tp`` (more replicas, fewer
    collectives).

    Returns:
        ``(best tp, {tp: estimated seconds})`` over the candidates that fit.

    Raises:
        DoesNotFit: if no candidate fits.
        ValueError: for ``gpus`` or ``sequences`` that is not a positive integer, ``candidates``
            that are not a list of positive integers, or a ``bandwidth_efficiency`` outside
            (0, 1].
    """
    _kinds("choose_generation_tp", spec=spec, device=device)
    for name, value in (("gpus", gpus), ("sequences", sequences)):
        if isinstance(value, bool) or not (isinstance(value, int) and value >= 1):
            raise ValueError(f"choose_generation_tp: {name}={value!r} must be a positive integer.")
    candidates = _degrees("choose_generation_tp", "candidates", candidates)
    _bandwidth_share("choose_generation_tp", bandwidth_efficiency)
    estimates: dict[int, float] = {}
    # BEGIN SOLUTION: for each candidate tp (skip those not dividing gpus, or that the model refuses: spec.allows("tp", tp)): replicas, sequences per replica, slots (kv_slots; skip on DoesNotFit), waves, then waves x steps x replica_decode_step_seconds at context tokens_per_sequence // 2 with min(per_replica, slots) sequences; keep the smallest
    for tp in candidates:
        if gpus % tp or not spec.allows("tp", tp):  # the heads, and whole KV heads a rank
            continue
        try:
            slots = kv_slots(spec, tp, device, tokens_per_sequence, memory_fraction)
        except DoesNotFit:
            continue
        per_replica = -(-sequences // (gpus // tp))
        waves = -(-per_replica // slots)
        batch = min(per_replica, slots)
        step = replica_decode_step_seconds(spec, device, tp, batch, tokens_per_sequence // 2, link,
                                           bandwidth_efficiency)
        estimates[tp] = waves * tokens_per_sequence * step
    # END SOLUTION
    if not estimates:
        raise DoesNotFit(f"no generation tp in {tuple(candidates)} fits {spec.name} on {gpus} x "
                         f"{device.name}; use more devices per replica or a larger device.")
    best = min(estimates, key=lambda tp: (estimates[tp], tp))
    return best, estimates
