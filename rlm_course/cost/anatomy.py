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

Activations use Korthikanti et al.'s per-layer count for 16-bit training,
``s b h (34 + 5 a s / h)`` bytes (``a`` heads), or ``2 s b h`` with full recomputation.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlm_course.cost.accounting import predict_passes
from rlm_course.cost.architectures import TransformerSpec, teacher_forced_flops
from rlm_course.cost.hardware import Device
from rlm_course.rl.algorithms import RLConfig

STAGES = ("prefill", "decode", "scoring", "policy update", "critic update")
ADAM_STATE_BYTES = 16  # bf16 weight + bf16 gradient + fp32 master weight, momentum, variance


@dataclass(frozen=True)
class Workload:
    """The batch of one iteration.

    Attributes:
        prompts, group_size: ``prompts x group_size`` responses per iteration.
        prompt_len, response_len: tokens (every response assumed ``response_len`` long).
        micro_batch: sequences per forward/backward micro-batch (weights are re-read per
            micro-batch).
        weight_bytes, kv_bytes: bytes per weight and per cached key/value element (2: bf16).
        recompute: full activation recomputation in training.

    Raises:
        ValueError: for non-positive sizes.
    """

    prompts: int
    group_size: int
    prompt_len: int
    response_len: int
    micro_batch: int = 8
    weight_bytes: int = 2
    kv_bytes: int = 2
    recompute: bool = False

    def __post_init__(self) -> None:
        for name in ("prompts", "group_size", "prompt_len", "response_len", "micro_batch",
                     "weight_bytes", "kv_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Workload.{name}={value!r} must be a positive integer.")

    @property
    def responses(self) -> int:
        return self.prompts * self.group_size

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len

    @property
    def micro_batches(self) -> int:
        return -(-self.responses // self.micro_batch)


@dataclass(frozen=True)
class StageCost:
    """FLOPs and bytes of one stage, as run by one model replica.

    ``replica_bytes`` are the bytes that every extra replica reads again (the weights, once per
    decode step): spreading generation over ``r`` replicas divides the FLOPs and the KV-cache
    traffic but multiplies these. ``intensity`` is FLOP per byte for one replica.
    """

    flops: float
    bytes: float
    replica_bytes: float = 0.0
    sequences: int = 0
    weights: float = 0.0
    kv_per_sequence: float = 0.0

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")

    def waves(self, device: Device, devices: int, tp: int) -> int:
        """Decode rounds each replica needs when the KV caches of all its sequences do not fit
        beside its weights: ``ceil(sequences per replica / sequences that fit)``; 1 for stages
        that hold no KV cache.

        Raises:
            ValueError: if the weights alone do not fit in the ``tp`` devices of a replica.
        """
        if not self.sequences:
            return 1
        capacity = tp * device.memory_bytes - self.weights
        if capacity <= self.kv_per_sequence:
            raise ValueError(f"{self.weights / 1e9:.0f} GB of weights plus one sequence's KV cache "
                             f"do not fit in tp={tp} x {device.memory_bytes / 1e9:.0f} GB "
                             f"({device.name}); raise the generation TP degree.")
        per_replica = -(-self.sequences // (devices // tp))
        fit = int(capacity // self.kv_per_sequence)
        return -(-per_replica // fit)

    def seconds(self, device: Device, devices: int = 1, tp: int = 1) -> float:
        """Roofline time on ``devices`` devices in replicas of ``tp`` devices each:
        ``max(F / (p peak), (B + (r w - 1) B_replica) / (p bandwidth))``, ``r = p / tp``
        replicas, each decoding in ``w`` waves (:meth:`waves`).

        Raises:
            ValueError: unless ``devices >= 1`` and ``tp`` divides ``devices``, or if a replica's
                weights do not fit.
        """
        if not (isinstance(devices, int) and devices >= 1):
            raise ValueError(f"devices={devices!r}: need at least one device.")
        if not (isinstance(tp, int) and tp >= 1 and devices % tp == 0):
            raise ValueError(f"tp={tp!r} must be a positive divisor of devices={devices}.")
        reads = devices // tp * self.waves(device, devices, tp)
        traffic = self.bytes + (reads - 1) * self.replica_bytes
        return max(self.flops / (devices * device.peak_flops),
                   traffic / (devices * device.memory_bandwidth))


def decode_step_flops(spec: TransformerSpec, context: int, sequences: int) -> float:
    """One decode step of ``sequences`` sequences at ``context`` keys each."""
    return sequences * spec.forward_flops_per_token(context)


def weight_bytes(spec: TransformerSpec, workload: Workload, sequences: int) -> float:
    """Bytes of the weights a pass reads: all of a dense model; of an MoE model, the experts that
    ``sequences`` tokens touch (all of them once ``sequences x experts_per_token`` reaches
    ``n_experts``)."""
    if spec.is_moe:
        touched = min(spec.n_experts, sequences * spec.experts_per_token)
        total = spec.params() - (spec.n_experts - touched) * spec.n_layer * spec.mlp_params()
    else:
        total = spec.params()
    return total * workload.weight_bytes


def stage_costs(spec: TransformerSpec, config: RLConfig, workload: Workload) -> dict[str, StageCost]:
    """FLOPs and bytes of each stage of one iteration (see the module docstring); the critic, if
    the algorithm holds one, has the policy's architecture.

    Returns:
        ``{stage: StageCost}`` for the stages of :data:`STAGES` that the algorithm runs.
    """
    w, b = workload, workload.responses
    kv = spec.kv_cache_bytes_per_token(w.kv_bytes)
    passes = predict_passes(config)
    costs = {}
    # generation: a prefill of the prompts, then response_len - 1 decode steps
    prefill_flops = teacher_forced_flops(spec, w.prompt_len, b)
    prefill_bytes = w.micro_batches * weight_bytes(spec, w, w.micro_batch) + b * w.prompt_len * kv
    costs["prefill"] = StageCost(prefill_flops, prefill_bytes)
    steps = range(1, w.response_len)  # empty for one-token responses (sampled from the prefill)
    decode_flops = sum(decode_step_flops(spec, w.prompt_len + t, b) for t in steps)
    decode_weights = len(steps) * weight_bytes(spec, w, b)
    decode_kv = sum(b * (w.prompt_len + t) * kv + b * kv for t in steps)
    if steps:
        costs["decode"] = StageCost(decode_flops, decode_weights + decode_kv, decode_weights,
                                    sequences=b, weights=spec.params() * w.weight_bytes,
                                    kv_per_sequence=w.seq_len * kv)
    # scoring: one teacher-forced forward per scoring model
    pass_bytes = w.micro_batches * weight_bytes(spec, w, w.micro_batch)
    flops = bytes_ = 0.0
    values = {"critic": w.response_len}
    for model, count in passes["scoring"].items():
        flops += count["forward"] * teacher_forced_flops(spec, w.seq_len, b, values.get(model))
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
        flops = epochs * factor * teacher_forced_flops(spec, w.seq_len, b, values.get(model))
        bytes_ = epochs * ((factor - 1) * pass_bytes
                           + steps_per_epoch * optimizer_bytes)
        costs[stage] = StageCost(flops, bytes_)
    return costs


def stage_seconds(costs: dict[str, StageCost], device: Device, devices: int = 1,
                  generation_tp: int = 1) -> dict[str, float]:
    """Roofline seconds of each stage on ``devices`` devices; generation runs in replicas of
    ``generation_tp`` devices (see :meth:`StageCost.seconds`), the other stages use every device
    on its share of the batch."""
    return {stage: cost.seconds(device, devices,
                                generation_tp if stage in ("prefill", "decode") else 1)
            for stage, cost in costs.items()}


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
    if batch < 1 or context < 0:
        raise ValueError(f"decode_intensity: batch={batch} must be >= 1 and context={context} >= 0.")
    w = workload or Workload(1, 1, 1, 1)
    # BEGIN SOLUTION: FLOPs of the step over the bytes it reads: the weights once for the whole batch, plus each sequence's KV cache
    kv = spec.kv_cache_bytes_per_token(w.kv_bytes)
    bytes_ = weight_bytes(spec, w, batch) + batch * context * kv
    return decode_step_flops(spec, context, batch) / bytes_
    # END SOLUTION


def prefill_intensity(spec: TransformerSpec, batch: int, seq_len: int,
                      workload: Workload | None = None) -> float:
    """FLOP per byte of a prefill of ``batch`` sequences of ``seq_len`` tokens (weights read once,
    the prompt's keys and values written)."""
    w = workload or Workload(1, 1, 1, 1)
    kv = spec.kv_cache_bytes_per_token(w.kv_bytes)
    return (teacher_forced_flops(spec, seq_len, batch)
            / (weight_bytes(spec, w, batch) + batch * seq_len * kv))


def memory(spec: TransformerSpec, config: RLConfig, workload: Workload) -> dict[str, float]:
    """Bytes of each kind of state.

    Returns:
        ``policy states`` and ``critic states`` (16 bytes per parameter, mixed-precision Adam),
        ``reference weights`` (``weight_bytes`` per parameter) and ``kv cache`` (every response at
        full length): totals for the whole job, to be divided among the devices that shard them;
        ``activations``: one training micro-batch, all layers, with FlashAttention (on the device
        that runs it).
    """
    w = workload
    out = {"policy states": ADAM_STATE_BYTES * spec.params()}
    if config.use_critic:
        out["critic states"] = ADAM_STATE_BYTES * spec.params()
    if config.uses_reference:
        out["reference weights"] = w.weight_bytes * spec.params()
    out["kv cache"] = w.responses * w.seq_len * spec.kv_cache_bytes_per_token(w.kv_bytes)
    out["activations"] = activation_bytes(spec, w.micro_batch, w.seq_len, w.recompute)
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
        ValueError: for an unknown stage or a non-positive ``dp``.
    """
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(f"ZeRO stage={stage!r}: choose 0 (plain DP), 1, 2 or 3.")
    if not (isinstance(dp, int) and dp >= 1):
        raise ValueError(f"dp={dp!r} must be a positive integer.")
    if params <= 0 or optimizer_bytes < 0:
        raise ValueError(f"params={params} must be positive and optimizer_bytes={optimizer_bytes} "
                         ">= 0.")
    k = optimizer_bytes
    if stage == 0:
        return (4 + k) * params
    if stage == 1:
        return 4 * params + k * params / dp
    if stage == 2:
        return 2 * params + (2 + k) * params / dp
    return (4 + k) * params / dp


def activation_bytes(spec: TransformerSpec, batch: int, seq_len: int, recompute: bool,
                     flash_attention: bool = True) -> float:
    """Activations kept for the backward pass, 16-bit (Korthikanti et al. 2022, arXiv:2205.05198,
    eq. 1): ``L s b h (34 + 5 a s / h)`` per micro-batch, where ``5 a s^2 b`` bytes are the
    attention scores, softmax and dropout mask; a fused attention kernel (FlashAttention, Dao et
    al. 2022) recomputes those and keeps ``34 L s b h``; full recomputation keeps only each
    layer's input, ``2 L s b h``."""
    s, b, h, a = seq_len, batch, spec.d_model, spec.n_head
    if recompute:
        per_layer = 2 * s * b * h
    else:
        per_layer = s * b * h * (34 + (0 if flash_attention else 5 * a * s / h))
    return spec.n_layer * per_layer


def iteration_report(spec: TransformerSpec, config: RLConfig, workload: Workload, device: Device,
                     devices: int = 1, generation_tp: int = 1) -> dict:
    """Everything the calculators show for one iteration: per-stage FLOPs, bytes, intensity,
    roofline seconds and shares; memory; and the work-depth summary of the iteration
    (:mod:`rlm_course.cost.workdepth`: W, D, W/D, and the same for generation alone).

    Raises:
        ValueError: for an inconsistent setting (from the functions it calls).
    """
    from rlm_course.cost import workdepth as wd  # the DAG is only built when asked for

    costs = stage_costs(spec, config, workload)
    seconds = stage_seconds(costs, device, devices, generation_tp)
    n_params = spec.params()
    passes = predict_passes(config)["scoring"]
    if config.use_critic:
        dag = wd.ppo_iteration(spec, workload.responses, workload.prompt_len,
                               workload.response_len, n_params, config.ppo_epochs,
                               config.minibatches, reference=config.uses_reference)
    else:
        dag = wd.grpo_iteration(spec, workload.prompts, workload.group_size, workload.prompt_len,
                                workload.response_len, n_params, config.ppo_epochs,
                                config.minibatches, reference=config.uses_reference,
                                old_policy="policy" in passes)
    waves = costs["decode"].waves(device, devices, generation_tp) if "decode" in costs else 1
    generation = dag.parts[0]
    return {
        "stages": {s: {"flops": c.flops, "bytes": c.bytes, "intensity": c.intensity,
                       "seconds": seconds[s]} for s, c in costs.items()},
        "time_shares": shares(seconds),
        "flop_shares": shares({s: c.flops for s, c in costs.items()}),
        "seconds": sum(seconds.values()),
        "memory": memory(spec, config, workload),
        "work": dag.work, "depth": dag.depth, "parallelism": dag.parallelism,
        "generation_work": generation.work, "generation_depth": generation.depth,
        "decode_waves": waves,
    }
