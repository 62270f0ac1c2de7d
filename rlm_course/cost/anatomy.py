"""Anatomy of one RL iteration at any scale: FLOPs, bytes moved, memory and time per stage.

For a policy architecture (:class:`~rlm_course.cost.architectures.TransformerSpec`), an algorithm
(:class:`~rlm_course.rl.algorithms.RLConfig`, whose passes come from
:func:`rlm_course.cost.accounting.predict_passes`) and a :class:`Workload`, predict per stage:

* **FLOPs** (the convention of :mod:`rlm_course.cost.architectures`): a teacher-forced pass over
  ``S`` tokens costs ``2 N S + 4 L H d_h S^2`` per sequence (the full score matrix, as kernels
  compute it); a decode step at context ``c`` costs ``2 N + 4 L H d_h c``; a training pass is a
  forward and a backward, ``3x`` the forward (``4x`` with full activation recomputation: one more
  forward; Korthikanti et al. 2022, arXiv:2205.05198);
* **bytes moved from device memory**: each pass reads the weights once per micro-batch; each
  decode step reads all the weights once for the whole batch (the reason decode is memory-bound),
  reads the KV cache of every sequence and writes one token's keys and values; an optimizer step
  reads and writes the 16 bytes of mixed-precision Adam state per parameter (ZeRO,
  arXiv:1910.02054, section 3.1);
* **time** on ``p`` devices of a catalog type: ``max(FLOPs / (p x peak), bytes / (p x bandwidth))``
  per stage: the roofline (Williams et al. 2009) with perfect scaling, so a lower bound; except
  that generation runs in replicas, and every replica reads all of its weights at every decode
  step;
* **memory**: weights, gradients and optimizer state per model, activations per micro-batch (with
  or without recomputation) and the KV cache of the whole rollout.

**Response lengths.** By default every response is ``response_len`` tokens long. A workload may
instead carry one length per response (:attr:`Workload.response_lengths`, e.g. drawn from a
long-tailed log-normal by :func:`lognormal_lengths`): the FLOPs and the KV-cache traffic then
follow each response's own length (their sum: the mean), while the batch keeps decoding, and
re-reading the weights at every step, until its **longest** response ends, so the decode time
follows the maximum. Scoring and training count each sequence at its own length (sequence packing,
no padding). :func:`generation_time_bounds` turns the depth of decoding into seconds: one decode
step's roofline time plus a per-step latency, times the longest response, against the work
``W / (p x peak)``.

**Weight sync** (stage 4): the trainer's new weights reach the rollout engine, priced by the one
model of :func:`rlm_course.cost.weight_sync.sync_cost` (reshard, transfer, copies, software,
fixed; the same function chapter 14's simulator calls): a bucketed broadcast over the network when
the two are disaggregated (``B alpha + M / beta``, Hockney's alpha-beta model; measured on real
processes in chapter 12, :mod:`rlm_course.systems.weight_sync`), a reshard and a load of each
device's generation shard when they are colocated. :func:`iteration_report` adds it only when
asked (``weight_sync=``), so the other stages' shares are unchanged otherwise.

Activations use Korthikanti et al.'s per-layer count for 16-bit training,
``s b h (34 + 5 a s / h)`` bytes (``a`` heads), or ``2 s b h`` with full recomputation.
"""

from __future__ import annotations

import math
import numbers
import random
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass

from rlm_course.cost.accounting import predict_passes
from rlm_course.cost.architectures import TransformerSpec, teacher_forced_flops
from rlm_course.cost.hardware import Device
from rlm_course.algorithms import RLConfig
from rlm_course.utils import as_int, check_amount, check_kinds, is_real, plain_ints
from rlm_course.vocabulary import COST_STAGES

STAGES = COST_STAGES  # what this module prices (rlm_course.vocabulary)
ADAM_STATE_BYTES = 16  # bf16 weight + bf16 gradient + fp32 master weight, momentum, variance
MAX_RESPONSES = 10**7  # responses per iteration a Workload may hold (each length is kept)


@dataclass(frozen=True)
class Workload:
    """The batch of one iteration.

    Attributes:
        prompts, group_size: ``prompts x group_size`` responses per iteration.
        prompt_len, response_len: tokens; every response is ``response_len`` long unless
            ``response_lengths`` is given, and then ``response_len`` is the generation budget
            (the most tokens a response may have).
        micro_batch: sequences per forward/backward micro-batch (weights are re-read per
            micro-batch).
        weight_bytes, kv_bytes: bytes per weight and per cached key/value element (2: bf16).
        recompute: full activation recomputation in training.
        response_lengths: optional, one length per response (``prompts x group_size`` of them,
            each in ``1..response_len``; the ``group_size`` responses of a prompt contiguous),
            e.g. from :func:`lognormal_lengths`.

    Raises:
        ValueError: for non-positive sizes, more than :data:`MAX_RESPONSES` responses, or
            response lengths of the wrong count or outside ``1..response_len``.
    """

    prompts: int
    group_size: int
    prompt_len: int
    response_len: int
    micro_batch: int = 8
    weight_bytes: int = 2
    kv_bytes: int = 2
    recompute: bool = False
    response_lengths: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        plain_ints(self)  # numpy's integers too
        for name in ("prompts", "group_size", "prompt_len", "response_len", "micro_batch",
                     "weight_bytes", "kv_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Workload.{name}={value!r} must be a positive integer.")
        if not isinstance(self.recompute, bool):
            raise ValueError(f"Workload.recompute={self.recompute!r} must be True or False.")
        if self.responses > MAX_RESPONSES:
            raise ValueError(f"Workload: prompts x group_size = {self.prompts:,} x "
                             f"{self.group_size:,} = {self.responses:,} responses; the cost model "
                             f"prices at most {MAX_RESPONSES:,} per iteration (published RL "
                             "batches hold thousands to tens of thousands): lower prompts or "
                             "group_size.")
        if self.response_lengths is not None:
            lengths = tuple(as_int(t) for t in self.response_lengths)  # numpy's arrays too
            if len(lengths) != self.responses:
                raise ValueError(f"Workload.response_lengths has {len(lengths)} lengths for "
                                 f"{self.responses} responses (prompts x group_size); give one "
                                 "per response.")
            bad = [t for t in lengths if not isinstance(t, int) or isinstance(t, bool)
                   or not 1 <= t <= self.response_len]
            if bad:
                raise ValueError(f"Workload.response_lengths: {bad[:3]} not integers in "
                                 f"1..response_len={self.response_len}; raise the budget "
                                 "response_len or cap the lengths.")
            object.__setattr__(self, "response_lengths", lengths)

    @classmethod
    def long_tailed(cls, prompts: int, group_size: int, prompt_len: int, mean_len: float,
                    sigma: float, max_len: int, seed: int = 0, group_share: float = 0.0,
                    mean_after_cap: bool = False, **options) -> "Workload":
        """A workload whose response lengths are drawn from a log-normal
        (:func:`lognormal_lengths`, ``group_share`` of the log-variance shared by the samples of
        a prompt, ``mean_after_cap``: ``mean_len`` is the mean of the capped lengths), with
        generation budget ``max_len``; ``options`` are the other fields (``micro_batch``,
        ``weight_bytes``, ...)."""
        lengths = lognormal_lengths(prompts * group_size, mean_len, sigma, max_len, seed,
                                    group_size=group_size, group_share=group_share,
                                    mean_after_cap=mean_after_cap)
        return cls(prompts, group_size, prompt_len, max_len, response_lengths=lengths, **options)

    @property
    def responses(self) -> int:
        return self.prompts * self.group_size

    @property
    def seq_len(self) -> int:
        """Prompt plus the generation budget: the longest a sequence may be."""
        return self.prompt_len + self.response_len

    @property
    def lengths(self) -> tuple[int, ...]:
        """Each response's length (all ``response_len`` unless ``response_lengths`` is given)."""
        if self.response_lengths is None:
            return (self.response_len,) * self.responses
        return self.response_lengths

    @property
    def mean_response_len(self) -> float:
        """``E[T]``: the mean response length (the FLOPs follow it)."""
        if self.response_lengths is None:
            return float(self.response_len)
        return sum(self.response_lengths) / self.responses

    @property
    def max_response_len(self) -> int:
        """``T_max``: the longest response (the decode steps, and so the decode time, follow it)."""
        if self.response_lengths is None:
            return self.response_len
        return max(self.response_lengths)

    def group_max_lengths(self) -> list[int]:
        """The longest response of each prompt's group."""
        lengths, g = self.lengths, self.group_size
        return [max(lengths[i:i + g]) for i in range(0, len(lengths), g)]

    def active_sequences(self, step: int) -> int:
        """Sequences still decoding at decode step ``step`` (1-based; the prefill samples each
        response's first token, decode step ``t`` its token ``t + 1``): those longer than
        ``step`` tokens."""
        if self.response_lengths is None:
            return self.responses if step < self.response_len else 0
        ordered = self._sorted_lengths()
        return len(ordered) - bisect_right(ordered, step)

    def _sorted_lengths(self) -> list[int]:
        cached = self.__dict__.get("_sorted")
        if cached is None:
            cached = sorted(self.lengths)
            object.__setattr__(self, "_sorted", cached)
        return cached

    @property
    def micro_batches(self) -> int:
        return -(-self.responses // self.micro_batch)


#: The widest log-normal spread :func:`lognormal_lengths` draws: at ``sigma = 3`` the median is
#: ``exp(-4.5)``, about 1%, of the mean, so nearly every response is a few tokens and the mean
#: rests on a few rare long ones that a batch of thousands rarely holds (published RL runs fit
#: sigma 0.5-1.2).
LOGNORMAL_MAX_SIGMA = 3.0


def lognormal_lengths(n: int, mean_len: float, sigma: float, max_len: int, seed: int = 0,
                      group_size: int = 1, group_share: float = 0.0,
                      mean_after_cap: bool = False) -> tuple[int, ...]:
    """``n`` response lengths from a log-normal distribution, rounded and capped to
    ``1..max_len`` (a generation budget truncates what runs past it).

    ``log T ~ Normal(mu, sigma^2)`` with ``mu = ln(mean_len) - sigma^2 / 2``, so that the
    uncapped mean is ``E[T] = exp(mu + sigma^2 / 2) = mean_len``; ``sigma`` sets the tail
    (``sigma = 0``: every length ``mean_len``; ``sigma = 1``: the 99th percentile is about 10x
    the median). A model of the long tails of reasoning traces, whose longest sample bounds the
    step (slime's release notes; ROLL Flash, arXiv:2510.11345, bounds generation time under
    long-tailed lengths); the shape is an assumption, to be replaced by measured lengths. The
    draws come from Python's ``random.Random(seed)``: the same seed gives the same lengths.

    **Groups.** The ``group_size`` consecutive responses of a prompt share ``group_share`` of the
    log-variance: ``log T = mu + sigma (sqrt(rho) z_prompt + sqrt(1 - rho) z_sample)``, so a hard
    prompt is long for all its samples (lengths within a GRPO group are strongly correlated,
    which decides when a group completes, what streaming and dynamic sampling see). The marginal
    distribution is the same for every ``rho``.

    **Mean after the cap.** A budget that cuts many responses lowers the mean below ``mean_len``;
    with ``mean_after_cap`` the location ``mu`` is solved (bisection, on the same draws) so that
    the *capped* lengths have mean ``mean_len``, the form in which runs publish their mean length.

    Returns:
        a tuple of ``n`` integers.

    Raises:
        ValueError: for ``n < 1``, a ``mean_len`` outside ``[1, max_len]``, ``sigma`` outside
            ``[0, LOGNORMAL_MAX_SIGMA]``, a
            ``group_size`` that does not divide ``n``, or ``group_share`` outside ``[0, 1]``.
    """
    if not (isinstance(n, int) and n >= 1):
        raise ValueError(f"lognormal_lengths: n={n!r} (prompts x group_size) must be a positive "
                         "integer.")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"lognormal_lengths: seed={seed!r} must be an integer (the same seed "
                         "draws the same lengths; None would draw new ones every time).")
    for name, value in (("mean_len", mean_len), ("sigma", sigma), ("group_share", group_share)):
        if not is_real(value):
            raise ValueError(f"lognormal_lengths: {name}={value!r} must be a number.")
    if not (isinstance(max_len, int) and max_len >= 1 and 1 <= mean_len <= max_len):
        raise ValueError(f"lognormal_lengths: need 1 <= mean_len={mean_len} <= max_len={max_len}.")
    if not (math.isfinite(sigma) and 0 <= sigma <= LOGNORMAL_MAX_SIGMA):
        raise ValueError(f"lognormal_lengths: sigma={sigma} must be a finite number from 0 to "
                         f"{LOGNORMAL_MAX_SIGMA:g} (0.8 is typical; wider, nearly every response "
                         "is a few tokens and the draws miss the mean).")
    if not (isinstance(group_size, int) and group_size >= 1 and n % group_size == 0):
        raise ValueError(f"lognormal_lengths: group_size={group_size!r} must be a positive divisor "
                         f"of n={n}.")
    if not 0 <= group_share <= 1:
        raise ValueError(f"lognormal_lengths: group_share={group_share} must be in [0, 1].")
    rng = random.Random(seed)
    if group_share == 0:
        z = [rng.gauss(0.0, 1.0) for _ in range(n)]
    else:
        shared, own = math.sqrt(group_share), math.sqrt(1 - group_share)
        z = []
        for _ in range(n // group_size):
            prompt = rng.gauss(0.0, 1.0)
            z += [shared * prompt + own * rng.gauss(0.0, 1.0) for _ in range(group_size)]

    def draw(mu: float) -> tuple[int, ...]:
        return tuple(min(max_len, max(1, round(math.exp(mu + sigma * x)))) for x in z)

    mu = math.log(mean_len) - sigma**2 / 2
    if not mean_after_cap:
        return draw(mu)
    if mean_len >= max_len:  # a capped mean at the cap: every response at the cap
        return (max_len,) * n
    # bracket the location on both sides (these draws' capped mean at mu can be above the
    # target as well as below it), then bisect: the capped mean grows with mu
    lo, hi = mu, mu
    while sum(draw(lo)) / n > mean_len and mu - lo < 20:
        lo -= 1.0
    while sum(draw(hi)) / n < mean_len and hi - mu < 20:
        hi += 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(draw(mid)) / n < mean_len else (lo, mid)
    return draw(hi)


@dataclass(frozen=True)
class StageCost:
    """FLOPs and bytes of one stage, as run by one model replica.

    ``replica_bytes`` are the bytes that every extra replica reads again (the weights, once per
    decode step): spreading generation over ``r`` replicas divides the FLOPs and the KV-cache
    traffic but multiplies these. ``kv_bytes`` is the KV-cache part of ``bytes``, which a
    ``tp``-way replica reads ``tp / kv_shards`` times over when its ranks hold copies of the same
    KV heads (``kv_shards = min(tp, kv_split)``, ``kv_split`` the KV heads, 1 for a latent
    cache: :meth:`~rlm_course.cost.architectures.TransformerSpec.kv_shards`). ``intensity`` is
    FLOP per byte for one replica.
    """

    flops: float
    bytes: float
    replica_bytes: float = 0.0
    sequences: int = 0
    weights: float = 0.0
    kv_per_sequence: float = 0.0
    kv_bytes: float = 0.0
    kv_split: int = 1

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")

    def waves(self, device: Device, devices: int, tp: int) -> int:
        """Decode rounds each replica needs when the KV caches of all its sequences do not fit
        beside its weights: ``ceil(sequences per replica / sequences that fit)``; 1 for stages
        that hold no KV cache. A sequence's cache takes ``kv_per_sequence`` bytes on its
        ``kv_shards`` devices and is copied on the others.

        Raises:
            ValueError: if the weights alone do not fit in the ``tp`` devices of a replica.
        """
        if not self.sequences:
            return 1
        def room(t: int) -> tuple[float, float]:  # (bytes beside the weights, one sequence's KV)
            return t * device.engine_memory_bytes - self.weights, self.kv_per_sequence * t / min(
                t, self.kv_split)

        def holds(t: int) -> bool:
            capacity, per_sequence = room(t)
            return capacity > per_sequence

        capacity, per_sequence = room(tp)
        if capacity <= per_sequence:
            # the smallest degree that holds them: a divisor of the devices, so replicas are whole
            fits = next((t for t in range(tp + 1, devices + 1) if devices % t == 0 and holds(t)),
                        None)
            fix = (f"raise the generation TP degree to {fits} (the smallest that divides the "
                   f"{devices} devices and holds them)" if fits else
                   f"no TP degree up to the {devices} devices holds them: use more devices or a "
                   "device with more memory")
            raise ValueError(f"{self.weights / 1e9:.0f} GB of weights plus one sequence's KV cache "
                             f"do not fit in tp={tp} x {device.engine_memory_bytes / 1e9:.1f} GB "
                             f"({device.name}); {fix}.")
        per_replica = -(-self.sequences // (devices // tp))
        fit = int(capacity // per_sequence)
        return -(-per_replica // fit)

    def seconds(self, device: Device, devices: int = 1, tp: int = 1) -> float:
        """Roofline time on ``devices`` devices in replicas of ``tp`` devices each:
        ``max(F / (p peak), (B + (r w - 1) B_replica + (c - 1) B_kv) / (p bandwidth))``,
        ``r = p / tp`` replicas, each decoding in ``w`` waves (:meth:`waves`), its KV cache read
        ``c = tp / kv_shards`` times over.

        Raises:
            ValueError: unless ``devices >= 1`` and ``tp`` divides ``devices``, or if a replica's
                weights do not fit.
        """
        if not (isinstance(devices, int) and devices >= 1):
            raise ValueError(f"devices={devices!r}: need at least one device.")
        if not (isinstance(tp, int) and tp >= 1 and devices % tp == 0):
            raise ValueError(f"tp={tp!r} must be a positive divisor of devices={devices}.")
        reads = devices // tp * self.waves(device, devices, tp)
        copies = tp / min(tp, self.kv_split)
        traffic = self.bytes + (reads - 1) * self.replica_bytes + (copies - 1) * self.kv_bytes
        return max(self.flops / (devices * device.peak_flops),
                   traffic / (devices * device.memory_bandwidth))


def decode_step_flops(spec: TransformerSpec, context: int, sequences: int) -> float:
    """One decode step of ``sequences`` sequences at ``context`` keys each: the matmuls of a
    token and, per key, the decode kernel's attention FLOPs
    (:attr:`~rlm_course.cost.architectures.TransformerSpec.decode_flops_per_key`: MLA's absorbed
    kernel)."""
    return sequences * (spec.flop_terms[0] + spec.decode_flops_per_key * context)


def weight_bytes(spec: TransformerSpec, workload: Workload, tokens: int) -> float:
    """Bytes of the weights a pass over ``tokens`` tokens reads (a decode step: one token per
    sequence; a prefill: every prompt token): all of a dense model; of an MoE model, the experts
    those tokens touch: with routing spread evenly, an expert escapes all of them with
    probability ``(1 - k/E)^a``, so ``E (1 - (1 - k/E)^a)`` are touched on average (``E``
    experts, ``k`` per token, ``a`` tokens): 163 of DeepSeek-V3's 256 at 32 tokens, where the
    bound ``min(E, a k)`` says all 256."""
    if spec.is_moe:
        e, k = spec.n_experts, spec.experts_per_token
        touched = e * (1 - (1 - k / e) ** tokens)
        total = spec.params() - (spec.n_experts - touched) * spec.moe_layers * spec.mlp_params()
    else:
        total = spec.params()
    return total * workload.weight_bytes


def generation_costs(spec: TransformerSpec, workload: Workload) -> dict[str, StageCost]:
    """FLOPs and bytes of generation, the same for every algorithm: a prefill of the prompts,
    then decode steps until the longest response ends. Decode step ``t`` computes for the
    sequences still decoding (:meth:`Workload.active_sequences`) and reads their KV caches, but
    reads the weights once as long as any sequence is left: the FLOPs follow the mean response
    length, the weight traffic the longest. For the decode waves (:meth:`StageCost.waves`) a
    sequence holds the KV cache of its prompt and a mean-length response (a paged KV cache
    stores what each sequence has written, and short responses free theirs early).

    Returns:
        ``{"prefill": StageCost, "decode": StageCost}`` (no ``decode`` for one-token responses,
        whose only token comes from the prefill).
    """
    w, b = workload, workload.responses
    kv = spec.kv_cache_bytes_per_token(w.kv_bytes)
    costs = {}
    prefill_flops = teacher_forced_flops(spec, w.prompt_len, b)
    # each micro-batch's forward reads the weights once (of an MoE, the experts its tokens touch)
    prefill_bytes = (w.micro_batches * weight_bytes(spec, w, w.micro_batch * w.prompt_len)
                     + b * w.prompt_len * kv)
    costs["prefill"] = StageCost(prefill_flops, prefill_bytes)
    steps = range(1, w.max_response_len)
    active = [w.active_sequences(t) for t in steps]
    decode_flops = sum(decode_step_flops(spec, w.prompt_len + t, a) for t, a in zip(steps, active))
    decode_weights = sum(weight_bytes(spec, w, a) for a in active)
    decode_kv = sum(a * (w.prompt_len + t) * kv + a * kv for t, a in zip(steps, active))
    if steps:
        costs["decode"] = StageCost(decode_flops, decode_weights + decode_kv, decode_weights,
                                    sequences=b, weights=spec.params() * w.weight_bytes,
                                    kv_per_sequence=(w.prompt_len + w.mean_response_len) * kv,
                                    kv_bytes=decode_kv, kv_split=spec.kv_shards(spec.kv_heads))
    return costs


def stage_costs(spec: TransformerSpec, config: RLConfig, workload: Workload) -> dict[str, StageCost]:
    """FLOPs and bytes of each stage of one iteration (see the module docstring); the critic, if
    the algorithm holds one, has the policy's architecture.

    Returns:
        ``{stage: StageCost}`` for the stages of :data:`STAGES` that the algorithm runs.

    Raises:
        ValueError: for an argument of the wrong kind, or a prompt and response budget past the
            model's context window.
    """
    check_kinds([("spec", spec, TransformerSpec, "get_spec('qwen2.5-7b')"),
                 ("config", config, RLConfig, "preset('grpo')"),
                 ("workload", workload, Workload, "Workload(8, 4, 128, 256)")], "stage_costs: ")
    spec.check_context(workload.prompt_len, workload.response_len)
    w = workload
    passes = predict_passes(config)
    costs = generation_costs(spec, w)
    # scoring: one teacher-forced forward per scoring model, each sequence at its own length
    pass_bytes = w.micro_batches * weight_bytes(
        spec, w, math.ceil(w.micro_batch * (w.prompt_len + w.mean_response_len)))
    flops = bytes_ = 0.0
    critic = {"critic"}
    for model, count in passes["scoring"].items():
        flops += count["forward"] * _teacher_forced(spec, w, model in critic)
        bytes_ += count["forward"] * pass_bytes
    if passes["scoring"]:
        costs["scoring"] = StageCost(flops, bytes_)
    # updates: forward + backward (+ a recomputed forward) per epoch, and Adam per gradient step
    factor = 4 if w.recompute else 3
    optimizer_bytes = 2 * ADAM_STATE_BYTES * spec.params()  # read and write every state
    steps_per_epoch = config.minibatches
    for model, stage in (("policy", "policy update"), ("critic", "critic update")):
        if model not in passes["training"]:
            continue
        epochs = passes["training"][model]["forward"]
        flops = epochs * factor * _teacher_forced(spec, w, model in critic)
        bytes_ = epochs * ((factor - 1) * pass_bytes
                           + steps_per_epoch * optimizer_bytes)
        costs[stage] = StageCost(flops, bytes_)
    return costs


def _teacher_forced(spec: TransformerSpec, w: Workload, critic: bool) -> float:
    """Forward FLOPs of one teacher-forced pass over every sequence of ``w`` at its own length
    (the critic's value head on its response positions)."""
    if w.response_lengths is None:
        return teacher_forced_flops(spec, w.seq_len, w.responses,
                                    w.response_len if critic else None)
    return sum(teacher_forced_flops(spec, w.prompt_len + t, count, t if critic else None)
               for t, count in sorted(Counter(w.response_lengths).items()))


def stage_seconds(costs: dict[str, StageCost], device: Device, devices: int = 1,
                  generation_tp: int = 1) -> dict[str, float]:
    """Roofline seconds of each stage on ``devices`` devices; generation runs in replicas of
    ``generation_tp`` devices (see :meth:`StageCost.seconds`), the other stages use every device
    on its share of the batch.

    Raises:
        ValueError: for a device that is not a Device, or ``devices`` or ``generation_tp``
            that is not a positive integer.
    """
    check_kinds([("device", device, Device, "get_device('H100-SXM-80GB')")], "stage_seconds: ")
    devices, generation_tp = as_int(devices), as_int(generation_tp)  # numpy's integers too
    for name, value in (("devices", devices), ("generation_tp", generation_tp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"stage_seconds: {name}={value!r} must be a positive integer.")
    return {stage: cost.seconds(device, devices,
                                generation_tp if stage in ("prefill", "decode") else 1)
            for stage, cost in costs.items()}


def decode_step_seconds(spec: TransformerSpec, device: Device, tp: int = 1, sequences: int = 1,
                        context: int = 0, step_latency: float = 0.0,
                        workload: Workload | None = None) -> float:
    """Time of one decode step of one generation replica of ``tp`` devices: its roofline on one
    device of the replica, ``max(FLOPs / (tp x peak), bytes per device / bandwidth)``, plus a
    fixed ``step_latency``.

    FLOPs: :func:`decode_step_flops` for ``sequences`` sequences at ``context`` keys, split over
    the ``tp`` devices; bytes per device: the replica's weights ``/ tp``, read once for all the
    sequences (:func:`weight_bytes`), plus each sequence's ``context`` cached keys and values
    ``/ kv_shards(tp)``: past the KV heads, and always for a latent cache (DeepSeek's MLA), the
    ranks of a replica hold and read copies of the same cache
    (:meth:`~rlm_course.cost.architectures.TransformerSpec.kv_shards`). ``step_latency``
    (seconds) stands for what the roofline leaves out: kernel launches, sampling, the scheduler
    and the TP collectives of every layer; it is an input, to be measured on the engine at hand
    (chapter 05 measures the tiny model's).

    With one sequence (the last one of a long tail) a step is memory-bound: it takes at least the
    time to stream the replica's share of the weights, ``2 N / (tp x bandwidth)`` in bf16 (the
    per-step bound of the JAX scaling book's inference chapter and of Pope et al. 2022,
    arXiv:2211.05102).

    Raises:
        ValueError: for a spec or device of the wrong kind, ``tp < 1`` or one that does not
            divide the heads, ``sequences < 1``, a context that is not a finite number >= 0 or
            is past the model's window (:attr:`TransformerSpec.max_context`), or a negative
            latency.
    """
    check_kinds([("spec", spec, TransformerSpec, "get_spec('llama-3.1-8b')"),
                 ("device", device, Device, "get_device('H100-SXM-80GB')")],
                "decode_step_seconds: ")
    tp, sequences = as_int(tp), as_int(sequences)  # numpy's integers too
    if not (isinstance(tp, int) and tp >= 1 and isinstance(sequences, int) and sequences >= 1):
        raise ValueError(f"decode_step_seconds: tp={tp!r} and sequences={sequences!r} must be "
                         "positive integers.")
    spec.check_degree("tp", tp)
    check_amount("decode_step_seconds: context", context)
    check_amount("decode_step_seconds: step_latency", step_latency)
    if spec.max_context is not None and context >= spec.max_context:
        # the step writes position `context`: the window holds positions 0 .. max_context - 1
        raise ValueError(f"decode_step_seconds: a step at context={context:,} writes a token past "
                         f"{spec.name}'s {spec.max_context:,}-token window; a released model "
                         f"decodes at contexts below it (or pick a model with a longer window).")
    w = workload or Workload(1, 1, 1, 1)
    kv = spec.kv_cache_bytes_per_token(w.kv_bytes) / spec.kv_shards(tp)
    flops = decode_step_flops(spec, context, sequences)
    per_device = weight_bytes(spec, w, sequences) / tp + sequences * context * kv
    return max(flops / (tp * device.peak_flops), per_device / device.memory_bandwidth) + step_latency


def generation_time_bounds(spec: TransformerSpec, workload: Workload, device: Device,
                           devices: int = 1, tp: int = 1,
                           step_latency: float = 0.0) -> dict[str, float]:
    """Brent's bound for generation, in seconds: the work term against the depth term.

    Brent's theorem (``T_p <= W/p + D``; Blelloch 1996, section 2) counts work and depth in the
    same unit-time operations. In seconds, each term must be a time the hardware can achieve:

    * ``work_seconds``: generation's work on all ``devices`` at the roofline (chapter 05):
      ``max(FLOPs / (p peak), bytes(p) / (p bandwidth))`` per stage (prefill and decode,
      :meth:`StageCost.seconds`), where ``bytes(p)`` counts the KV-cache reads and the weights
      re-read by each of the ``p / tp`` replicas at every decode step. Decode is memory-bound,
      so its work in seconds is its bytes, not its FLOPs at peak; the work term shrinks as
      devices are added, but more slowly than ``1/p``;
    * ``depth_seconds``: the ``T_max - 1`` decode steps of the longest response, one after the
      other (token ``t + 1`` needs token ``t``), each at least :func:`decode_step_seconds` of that
      sequence alone at its context ``prompt_len + t`` on its replica of ``tp`` devices; no
      number of replicas shortens it;
    * ``step_seconds``: the first of those steps (``2 N / (tp x bandwidth)`` plus the latency,
      about);
    * ``lower``: ``max(work, depth)``; ``upper``: ``work + depth``;
    * ``crossover_devices``: the smallest device count (a multiple of ``tp``, up to 2^20) at
      which the depth term is at least the work term (``inf`` if none).

    Chapter 06 counts depth in scalar operations; this is the same critical path timed by the
    roofline of chapter 05.

    Raises:
        ValueError: for non-positive ``devices``, a ``tp`` that does not divide them, a replica
            whose weights do not fit its ``tp`` devices, or the errors of
            :func:`decode_step_seconds`.
    """
    devices, tp = as_int(devices), as_int(tp)  # numpy's integers too
    if isinstance(devices, bool) or not (isinstance(devices, int) and devices >= 1):
        raise ValueError(f"devices={devices!r} must be a positive integer (devices).")
    if isinstance(tp, bool) or not (isinstance(tp, int) and tp >= 1 and devices % tp == 0):
        raise ValueError(f"tp={tp!r} must be a positive divisor of devices={devices}.")
    costs = generation_costs(spec, workload)

    def work_seconds(p: int) -> float:
        return sum(cost.seconds(device, p, tp) for cost in costs.values())

    steps = range(1, workload.max_response_len)
    times = [decode_step_seconds(spec, device, tp, 1, workload.prompt_len + t, step_latency,
                                 workload) for t in steps]
    depth_seconds = sum(times)
    work = work_seconds(devices)
    # the crossover: double the replicas while the work term exceeds the depth, then bisect
    # between the last two counts (the work term falls with the devices)
    crossover = math.inf
    if depth_seconds > 0:
        hi = 1
        while work_seconds(hi * tp) > depth_seconds and hi < 2**20:
            hi *= 2
        if work_seconds(hi * tp) <= depth_seconds:
            lo = hi // 2  # work(lo) > depth, or lo == 0
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if work_seconds(mid * tp) > depth_seconds else (lo, mid)
            crossover = hi * tp
    return {"work_seconds": work, "depth_seconds": depth_seconds,
            "step_seconds": times[0] if times else 0.0,
            "lower": max(work, depth_seconds), "upper": work + depth_seconds,
            "crossover_devices": crossover}


def shares(values: dict[str, float]) -> dict[str, float]:
    """Each entry's fraction of the total."""
    total = sum(values.values())
    return {k: v / total if total else 0.0 for k, v in values.items()}


def decode_intensity(spec: TransformerSpec, batch: int, context: int,
                     workload: Workload | None = None) -> float:
    """FLOP per byte of one decode step for ``batch`` sequences at ``context``: grows with the
    batch (the weights are read once for all of them) until the KV-cache reads dominate.

    FLOPs: :func:`decode_step_flops`; bytes: the weights (:func:`weight_bytes`) plus every
    sequence's ``context`` cached tokens (``spec.kv_cache_bytes_per_token``).
    """
    check_kinds([("spec", spec, TransformerSpec, "get_spec('llama-3.1-8b')")],
                "decode_intensity: ")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"decode_intensity: batch={batch!r} must be a positive integer.")
    check_amount("decode_intensity: context", context)
    w = workload or Workload(1, 1, 1, 1)
    # BEGIN SOLUTION: FLOPs of the step over the bytes it reads: the weights once for the whole batch, plus each sequence's KV cache
    kv = spec.kv_cache_bytes_per_token(w.kv_bytes)
    bytes_ = weight_bytes(spec, w, batch) + batch * context * kv
    return decode_step_flops(spec, context, batch) / bytes_
    # END SOLUTION


def prefill_intensity(spec: TransformerSpec, batch: int, seq_len: int,
                      workload: Workload | None = None) -> float:
    """FLOP per byte of a prefill of ``batch`` sequences of ``seq_len`` tokens (weights read once,
    the prompt's keys and values written).

    Raises:
        ValueError: for a spec that is not a TransformerSpec, or a batch or length that is not a
            positive integer."""
    check_kinds([("spec", spec, TransformerSpec, "get_spec('llama-3.1-8b')")],
                "prefill_intensity: ")
    for name, value in (("batch", batch), ("seq_len", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"prefill_intensity: {name}={value!r} must be a positive integer.")
    w = workload or Workload(1, 1, 1, 1)
    kv = spec.kv_cache_bytes_per_token(w.kv_bytes)
    return (teacher_forced_flops(spec, seq_len, batch)
            / (weight_bytes(spec, w, batch * seq_len) + batch * seq_len * kv))


def memory(spec: TransformerSpec, config: RLConfig, workload: Workload) -> dict[str, float]:
    """Bytes of each kind of state.

    Returns:
        ``policy states`` and ``critic states`` (16 bytes per parameter, mixed-precision Adam),
        ``reference weights`` (``weight_bytes`` per parameter) and ``kv cache`` (every prompt and
        response of the rollout at its full length): **totals for the whole job**, to be divided
        among the devices that shard or hold them; ``activations``: one training micro-batch of
        the longest sequences, all layers, with FlashAttention (on the device that runs it).
    """
    w = workload
    out = {"policy states": ADAM_STATE_BYTES * spec.params()}
    if config.use_critic:
        out["critic states"] = ADAM_STATE_BYTES * spec.params()
    if config.uses_reference:
        out["reference weights"] = w.weight_bytes * spec.params()
    kv_tokens = w.responses * w.prompt_len + sum(w.lengths)
    out["kv cache"] = kv_tokens * spec.kv_cache_bytes_per_token(w.kv_bytes)
    out["activations"] = activation_bytes(spec, w.micro_batch, w.prompt_len + w.max_response_len,
                                          w.recompute)
    return out


ZERO_STAGES = (0, 1, 2, 3)


def zero_model_state_bytes(params: int, dp: int, stage: int, optimizer_bytes: int = 12) -> float:
    """Model-state bytes per device under ZeRO data parallelism (Rajbhandari et al. 2019,
    arXiv:1910.02054, section 5, Figure 1), mixed-precision Adam: 2 bytes of fp16/bf16 weights,
    2 of gradients, ``K = optimizer_bytes`` (12: fp32 weights, momentum, variance) per parameter.

    Stage 0 (plain DP) replicates all ``(2 + 2 + K) P``; stage 1 shards the optimizer states
    (``4P + K P / N``), stage 2 also the gradients (``2P + (2 + K) P / N``), stage 3 also the
    weights (``(2 + 2 + K) P / N``), over ``N = dp`` devices.

    Raises:
        ValueError: for an unknown stage, a ``dp`` that is not a positive integer, a parameter
            count that is not a positive finite number, or a negative ``optimizer_bytes``.
    """
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"ZeRO stage={stage!r}: choose 0 (plain DP), 1, 2 or 3.")
    if isinstance(dp, bool) or not (isinstance(dp, int) and dp >= 1):
        raise ValueError(f"dp={dp!r} must be a positive integer.")
    check_amount("params", params, positive=True)
    check_amount("optimizer_bytes", optimizer_bytes)
    k = optimizer_bytes
    if stage == 0:
        return (4 + k) * params
    if stage == 1:
        return 4 * params + k * params / dp
    if stage == 2:
        return 2 * params + (2 + k) * params / dp
    return (4 + k) * params / dp


def layer_activation_values(spec: TransformerSpec) -> tuple[float, float]:
    """16-bit values one token keeps for the backward in one layer (the mean over an MoE model's
    dense and expert layers), split by where they live under tensor parallelism: ``(around,
    inside)``, around TP's split matmuls (whole on every TP rank without sequence parallelism)
    and inside them (a rank holds its heads' or columns' share). Korthikanti et al. 2022
    (arXiv:2205.05198, section 4.1) counted them for a GPT layer; the same accounting for the
    layers of today's models, with FlashAttention (no ``s^2`` term) and no dropout (RL
    fine-tuning runs LLaMA, Qwen and DeepSeek models with dropout 0):

    * around: the two norms' inputs and the inputs of attention and of the MLP, ``4 h``; under
      MLA also the latents its down-projections make, whole on every rank (the query's latent and
      its norm's output, ``2 q_lora_rank``; the key/value latent with the RoPE key and its
      norm's output, ``2 kv_lora_rank + qk_rope_head_dim``);
    * inside: attention's ``Q``, ``K``, ``V`` and output (``H d_qk + H_kv (d_qk + d_v) + H
      d_v``), and the inputs of a QK-norm (Qwen3's, ``(H + H_kv) d_h``); the MLP's hidden
      tensors, ``3 d_ff`` for a gated MLP (gate and up outputs, their product) and ``2 d_ff``
      for a GELU one (its input and output); of an MoE layer, each of the ``k`` routed copies of
      the token (``h``) and its expert's hidden tensors, and the shared experts'.

    Llama-3-8B: ``16,384 + 53,248 = 69,632`` values, ``34 h`` bytes, Korthikanti's count (the GPT
    layer's 32 h and two 1-byte dropout masks); DeepSeek-V3: 63 h bytes a layer on average,
    Qwen3-30B-A3B 55.5 h (its QK-norm's inputs too).
    """
    h = spec.d_model
    around = 4 * h
    if spec.kv_latent:
        around += 2 * (spec.q_lora_rank or 0) + 2 * spec.kv_lora_rank + spec.qk_rope_head_dim
    inside = (spec.n_head * (spec.qk_head_dim + spec.v_dim)
              + spec.kv_heads * (spec.qk_head_dim + spec.v_dim))
    if (spec.norm_params_per_layer or 2 * h) > 2 * h:  # QK-norm (Qwen3): its inputs, per head
        inside += (spec.n_head + spec.kv_heads) * spec.head_dim
    hidden = 3 if spec.glu else 2  # values per unit of MLP width
    if spec.is_moe:
        k = spec.experts_per_token
        moe = k * (h + hidden * spec.d_ff) + hidden * spec.n_shared_experts * spec.d_ff
        dense = hidden * spec.dense_d_ff if spec.n_dense_layers else 0
        inside += (spec.moe_layers * moe + spec.n_dense_layers * dense) / spec.n_layer
    else:
        inside += hidden * spec.d_ff
    return around, inside


def activation_bytes(spec: TransformerSpec, batch: int, seq_len: int, recompute: bool,
                     flash_attention: bool = True, tp: int = 1) -> float:
    """Activations kept for the backward pass, 16-bit, per micro-batch of ``batch`` sequences of
    ``seq_len`` tokens: ``2 L s b (around + inside)`` bytes
    (:func:`layer_activation_values`), Korthikanti et al. 2022 (arXiv:2205.05198, eq. 1)'s
    ``34 s b h`` a layer for a Llama layer; without a fused attention kernel (FlashAttention,
    Dao et al. 2022, recomputes it) also the softmax's output, ``2 a s^2 b`` (the paper's
    ``5 a s^2 b`` adds a dropout mask and the dropout's output);
    full recomputation keeps only each layer's input, ``2 L s b h``. ``tp``: on one rank of a
    TP group without sequence parallelism, the inside values split ``tp`` ways and the rest
    whole (Korthikanti's ``s b h (10 + 24 / t)``).

    Raises:
        ValueError: for a batch or sequence length that is not a finite number >= 0, or a
            ``tp`` that is not a positive integer.
    """
    check_amount("batch", batch)
    check_amount("seq_len", seq_len)
    if isinstance(tp, bool) or not (isinstance(tp, numbers.Integral) and tp >= 1):
        raise ValueError(f"activation_bytes: tp={tp!r} must be a positive integer.")
    s, b, h, a = seq_len, batch, spec.d_model, spec.n_head
    if recompute:
        return spec.n_layer * 2 * s * b * h
    around, inside = layer_activation_values(spec)
    per_layer = 2 * s * b * (around + inside / tp)
    if not flash_attention:
        per_layer += 2 * a * s * s * b / tp
    return spec.n_layer * per_layer


def iteration_report(spec: TransformerSpec, config: RLConfig, workload: Workload, device: Device,
                     devices: int = 1, generation_tp: int = 1,
                     weight_sync: str | None = None) -> dict:
    """Everything the calculators show for one iteration: per-stage FLOPs, bytes, intensity,
    roofline seconds and shares; memory; and the work-depth summary of the iteration
    (:mod:`rlm_course.cost.workdepth`: W, D, W/D, and the same for generation alone).

    ``weight_sync``: ``None`` (the default: stages 1-3 only, as chapters 05-06 show them),
    ``"colocated"`` or ``"disaggregated"``: adds stage 4, ``"weight sync"``, to the stages'
    seconds and shares (:func:`rlm_course.cost.weight_sync.sync_cost` with its default rates: one
    trainer rank, one receiver per generation device) and a sync node to the work-depth DAG.

    Raises:
        ValueError: for an argument of the wrong kind (e.g. a model's name for ``spec``), an
            unknown ``weight_sync``, a prompt and response budget past the model's context window
            (:meth:`~rlm_course.cost.architectures.TransformerSpec.check_context`), or an
            inconsistent setting (from the functions it calls).
    """
    from rlm_course.cost import workdepth as wd  # the DAG is only built when asked for
    from rlm_course.cost.weight_sync import sync_cost

    check_kinds([
        ("spec", spec, TransformerSpec, "rlm_course.cost.architectures.get_spec('llama-3-8b')"),
        ("config", config, RLConfig, "rlm_course.algorithms.preset('grpo')"),
        ("workload", workload, Workload, "Workload(prompts=8, group_size=4, prompt_len=512, "
                                         "response_len=1024)"),
        ("device", device, Device, "rlm_course.cost.hardware.get_device('H100-SXM-80GB')")],
        "iteration_report: ")
    if weight_sync not in (None, "colocated", "disaggregated"):
        raise ValueError(f"iteration_report: weight_sync={weight_sync!r}; choose None (stages 1-3), "
                         "'colocated' or 'disaggregated'.")
    spec.check_context(workload.prompt_len, workload.response_len)
    spec.check_degree("tp", generation_tp)  # the heads, and whole KV heads a rank
    costs = stage_costs(spec, config, workload)
    seconds = stage_seconds(costs, device, devices, generation_tp)
    n_params = spec.params()
    passes = predict_passes(config)["scoring"]
    sync = None
    if weight_sync is not None:
        replicas = max(1, devices // generation_tp)
        sync = sync_cost(spec, device, weight_sync, generation_tp=generation_tp,
                         replicas=replicas, weight_bytes=workload.weight_bytes)
        seconds = {**seconds, "weight sync": sync.seconds}
    if config.use_critic:
        dag = wd.ppo_iteration(spec, workload.responses, workload.prompt_len,
                               workload.response_len, n_params, config.ppo_epochs,
                               config.minibatches, reference=config.uses_reference,
                               response_lengths=workload.response_lengths)
    else:
        dag = wd.grpo_iteration(spec, workload.prompts, workload.group_size, workload.prompt_len,
                                workload.response_len, n_params, config.ppo_epochs,
                                config.minibatches, reference=config.uses_reference,
                                old_policy="policy" in passes,
                                response_lengths=workload.response_lengths)
    if sync is not None:
        receivers = 0 if weight_sync == "colocated" else max(1, devices // generation_tp)
        dag = wd.seq(dag.name, *dag.parts, wd.weight_sync(n_params, receivers, sync.messages))
    waves = costs["decode"].waves(device, devices, generation_tp) if "decode" in costs else 1
    generation = dag.parts[0]
    stages = {s: {"flops": c.flops, "bytes": c.bytes, "intensity": c.intensity,
                  "seconds": seconds[s]} for s, c in costs.items()}
    if sync is not None:
        stages["weight sync"] = {"flops": 0.0, "bytes": sync.bytes, "intensity": 0.0,
                                 "seconds": sync.seconds, "network_bytes": sync.network_bytes}
    return {
        "stages": stages,
        "time_shares": shares(seconds),
        "flop_shares": shares({s: c.flops for s, c in costs.items()}),
        "seconds": sum(seconds.values()),
        "memory": memory(spec, config, workload),
        "work": dag.work, "depth": dag.depth, "parallelism": dag.parallelism,
        "generation_work": generation.work, "generation_depth": generation.depth,
        "decode_waves": waves,
    }
