"""A discrete-event simulator of RL iterations on a cluster, built on SimPy (Matloff, "Introduction
to Discrete-Event Simulation and the SimPy Language"; https://simpy.readthedocs.io).

**What it models.** A :class:`Scenario` gives the policy (a
:class:`~rlm_course.cost.architectures.TransformerSpec`), the algorithm (an
:class:`~rlm_course.rl.algorithms.RLConfig` preset: which scoring passes and updates run), the
workload (a :class:`~rlm_course.cost.anatomy.Workload`: prompts, group size, one length per
response), the cluster (a catalog device and a count), the **placement** (``colocated``: every
role time-shares all devices, as verl's hybrid engine; ``disaggregated``: a rollout pool and a
trainer pool), each role's layout (generation replicas of ``generation_tp`` devices; the
trainer's :class:`~rlm_course.cost.layouts.Layout`), the **execution mode** (:class:`Mode`) and
the rates (:class:`~rlm_course.cost.phases.Rates`).

**How.** Worker groups are SimPy processes, not GPUs or tokens:

* each **generation replica** is a process that decodes the sequences it holds with continuous
  batching: it admits queued sequences while its KV cache has room (a prefill each), decodes all
  of them one step at a time until the next one finishes, lets it go, admits the next, and so
  on. Between two such events every step costs the closed form of
  :class:`~rlm_course.cost.phases.DecodeCost`, so a replica's whole rollout is one event per
  finishing length, and a long-tailed batch keeps a replica busy with ever fewer sequences: the
  tail;
* a **controller** admits prompts as far as the staleness bound allows, giving the replicas
  work in turn, a whole group at a time or one sample at a time (:attr:`Rates.routing`: an
  offline generate split in contiguous shards, or an engine served request by request as
  NeMo-RL's asynchronous engine and verl's agent loop are), and collects finished groups (all
  ``group_size`` samples) in a FIFO buffer;
* the **trainer** (a process) takes ``prompts`` finished groups, runs the reward, scoring and
  update stages (:class:`~rlm_course.cost.phases.TrainerCost`), then publishes new weights:
  it waits for the rollout to **drain** the sequences already given to it, queued or decoding,
  while no new prompts are admitted (or, with partial rollouts, **pauses** them where they
  are), transfers the weights (:func:`~rlm_course.cost.phases.weight_sync`, the one weight-sync
  model of :mod:`rlm_course.cost.weight_sync`) and lets the rollout resume;
* colocated, one process runs the phases of an iteration in turn on the shared devices:
  (offload the trainer's states,) generate, (reload,) reward, score, update, reshard.

**Execution modes** (:class:`Mode`), after the systems that introduced them:

* ``staleness`` eta: prompts are admitted while ``admitted <= (version + 1 + eta) x prompts``
  (:func:`rlm_course.systems.async_rl.rollout_capacity`, the gate chapter 13 runs on real
  processes), so the batches in flight are at most eta versions ahead of the trainer (AReaL's
  ``max_head_offpolicyness``, arXiv:2505.24298; verl's ``staleness_threshold``, fractional).
  Trained in order (``in_order``), a sample is then at most eta versions behind the weights that
  train on it; trained in the order groups finish with partial rollouts, a straggler paused across
  updates can train later than that (``SimResult.staleness_max``).
  eta = 0 is synchronous (generate, then train), eta = 1 one step off-policy (generation of batch
  k + 1 overlaps training on batch k; verl's one-step-off recipe, NeMo-RL's
  ``max_trajectory_age_steps``);
* ``streaming``: the trainer takes mini-batches as soon as their groups finish (verl's
  fully-async streaming, StreamRL arXiv:2504.15930) instead of a whole batch;
* ``partial_rollout``: a weight update pauses in-flight sequences and resumes them with the new
  weights instead of waiting for them to finish (Kimi k1.5, arXiv:2501.12599; AReaL's
  interruptible rollouts, which re-prefill the context, ``recompute_kv``; verl keeps it);
  colocated, it ends a generation phase as soon as a batch of groups is done and carries the
  unfinished ones over;
* ``in_order``: the trainer trains on the groups in the order their prompts were admitted, so
  step k waits for every group of batch k, its longest sample included, however many later
  groups are done (NeMo-RL's replay buffer samples only the trajectories targeted at the current
  training step, ``nemo_rl/algorithms/async_utils/replay_buffer.py``); without it the trainer
  takes the groups in the order they finish, so with partial rollouts a later batch's short
  groups stand in for an earlier batch's stragglers (verl's fully-async message queue);
* ``inflight_batches`` k: at most ``k x prompts`` groups are generating at once, a new one
  admitted as one finishes (NeMo-RL's trajectory collector runs each prompt's group as one
  request under a semaphore of ``num_prompts_per_step x max_trajectory_age_steps``,
  ``nemo_rl/algorithms/async_utils.py``): one step off, the next batch's groups take the places
  of the current batch's finished ones instead of decoding beside all of them; 0, no limit but the
  staleness bound (AReaL's rule);
* ``stage_fusion`` (colocated): when a fraction ``fusion_threshold`` of the batch's groups is
  done, the tail migrates to a few replicas (``fusion_tail`` of the devices) and the others start
  scoring the finished groups (RLHFuse's inter-stage fusion, arXiv:2409.13221).

**Outputs** (:class:`SimResult`): per-worker timelines, the steady-state step time, throughput,
the generation share of the step, MFU (all the iteration's model FLOPs over the cluster's peak)
and the training MFU, memory per device of each role; a layout that does not fit memory is
refused up front (:class:`~rlm_course.cost.layouts.DoesNotFit`).

Closed forms the simulator reproduces (tests): a synchronous step is the sum of its stages; with
eta >= 1 and disaggregated pools the steady-state step is the longer of generation and training
(plus the weight sync); stage fusion saves ``min(T_score, ...)`` as its formula says.
"""

from __future__ import annotations

import heapq
import math
import numbers
from collections import Counter, deque
from dataclasses import dataclass, field

import simpy

from rlm_course.cost.anatomy import Workload
from rlm_course.cost.architectures import TransformerSpec
from rlm_course.algorithms import GROUP_ADVANTAGES, RLConfig, preset
from rlm_course.systems.async_rl import rollout_capacity
from rlm_course.utils import as_int, check_kinds, is_real
from rlm_course.vocabulary import PLACEMENTS
from rlm_course.cost.layouts import (Layout, check_training, generation_memory, kv_slots,
                                    training_memory, usable)
from rlm_course.cost.phases import (Cluster, DecodeCost, Rates, TrainerCost, offload_seconds,
                                   weight_sync)



#: The deepest staleness a Mode takes (versions): a pipeline that deep already holds 65 batches;
#: the simulation warms up over 2 (eta + 1) iterations.
MAX_STALENESS = 64
#: The end of a colocated scenario's (and plan's) name whose trainer states go to host memory
#: while it generates and come back before training (``Scenario.offload_trainer``).
OFFLOADED = ", offload while generating"


@dataclass(frozen=True)
class Mode:
    """How generation and training are ordered (see the module docstring).

    Raises:
        ValueError: for a negative staleness, a threshold outside (0, 1), or stage fusion
            combined with staleness, streaming or partial rollouts.
    """

    staleness: float = 0.0
    streaming: bool = False
    partial_rollout: bool = False
    recompute_kv: bool = True
    in_order: bool = False
    stage_fusion: bool = False
    fusion_threshold: float = 0.9
    fusion_tail: float = 0.125
    inflight_batches: float = 0.0

    def __post_init__(self) -> None:
        if (isinstance(self.staleness, bool) or not isinstance(self.staleness, numbers.Real)
                or not 0 <= self.staleness <= MAX_STALENESS):
            raise ValueError(f"Mode.staleness={self.staleness!r} must be a number from 0 to "
                             f"{MAX_STALENESS} (0: synchronous, 1: one step off-policy; "
                             "published asynchronous runs use 1 to 8).")
        for flag in ("streaming", "partial_rollout", "recompute_kv", "in_order", "stage_fusion"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"Mode.{flag}={getattr(self, flag)!r} must be True or False.")
        if (isinstance(self.inflight_batches, bool)
                or not isinstance(self.inflight_batches, numbers.Real)
                or not 0 <= self.inflight_batches <= MAX_STALENESS + 1):
            raise ValueError(f"Mode.inflight_batches={self.inflight_batches!r} must be a number "
                             f"from 0 to {MAX_STALENESS + 1} (batches of prompts generating at "
                             "once; 0: no limit but the staleness bound).")
        if not all(is_real(v) and 0 < v < 1 for v in (self.fusion_threshold, self.fusion_tail)):
            raise ValueError(f"Mode.fusion_threshold={self.fusion_threshold!r} and fusion_tail="
                             f"{self.fusion_tail!r} must be fractions in (0, 1).")
        if self.stage_fusion and (self.streaming or self.partial_rollout or self.staleness
                                  or self.in_order):
            raise ValueError("Mode: stage fusion reorders one synchronous colocated iteration; it "
                             "does not combine with staleness, streaming, partial rollouts or "
                             "in-order consumption.")

    @property
    def name(self) -> str:
        base = ("sync" if self.staleness == 0 else "one-step-off" if self.staleness == 1
                else f"async eta={self.staleness:g}")
        k = self.inflight_batches
        flags = [f for f, on in (("streaming", self.streaming), ("partial", self.partial_rollout),
                                 ("in order", self.in_order), ("fused", self.stage_fusion),
                                 (f"{k:g} batch{'' if k == 1 else 'es'} in flight", k)) if on]
        return " + ".join([base] + flags)


#: Named modes: what the planner tries and the CLI accepts.
MODES = {
    "sync": Mode(),
    "fused": Mode(stage_fusion=True),
    "one-step-off": Mode(staleness=1),
    "async": Mode(staleness=1, streaming=True, partial_rollout=True),
    "async-eta2": Mode(staleness=2, streaming=True, partial_rollout=True),
}


@dataclass(frozen=True)
class Scenario:
    """Everything one simulation needs (see the module docstring).

    Attributes:
        rollout_gpus: disaggregated only: the rollout pool's devices (the rest train).
        generation_tp: devices per generation replica.
        trainer: the trainer's layout (default: plain data parallelism over the trainer's
            devices); its devices must be the trainer pool's.
        offload_trainer: colocated only: move the trainer's states to host memory while the
            rollout generates (slime's and verl's offload), paying the transfer both ways.
        engine_log_probs: take ``pi_old`` from the rollout engine and skip the old policy's
            scoring forward (:func:`~rlm_course.cost.phases.pass_flops`).
        offload_reference: keep the reference model's weights in host memory and swap them into
            the policy's place for the reference's scoring pass (NeMo-RL's Megatron worker keeps
            the reference state dict on the CPU: ``use_reference_model`` in
            ``nemo_rl/models/policy/workers/megatron_policy_worker.py``): no reference weights on
            the trainer's devices, and each iteration's scoring moves a device's weight shard
            three times over the host link (the policy's out, the reference's in, the policy's
            back in; :func:`reference_swap_seconds`). Needs a configuration with a reference.
        oversample: prompts generated per prompt trained (DAPO's dynamic sampling generates a
            larger batch and keeps the groups with right and wrong answers, e.g. verl's
            ``gen_batch_size`` 1536 for ``train_batch_size`` 512: 3); the extra groups are
            generated, then dropped.

    Raises:
        ValueError: for an unknown placement, pools that do not add up, a ``generation_tp`` that
            does not divide the rollout pool, a mode the placement cannot run (a colocated
            staleness bound without partial rollouts among them), a prompt and response budget
            longer than the model's context window, an ``oversample`` outside 1 to
            :data:`MAX_OVERSAMPLE`, a group baseline with one response per prompt, more trainer
            data-parallel ranks than a gradient step has sequences, or ``offload_reference``
            without a reference.
    """

    spec: TransformerSpec
    config: RLConfig
    workload: Workload
    cluster: Cluster
    placement: str = "colocated"
    rollout_gpus: int | None = None
    generation_tp: int = 1
    trainer: Layout | None = None
    mode: Mode = field(default_factory=Mode)
    rates: Rates = field(default_factory=Rates)
    offload_trainer: bool = False
    engine_log_probs: bool = False
    oversample: float = 1.0
    offload_reference: bool = False

    def __post_init__(self) -> None:
        h100 = "Cluster(get_device('H100-SXM-80GB'), 16)"
        check_kinds([("spec", self.spec, TransformerSpec, "get_spec('qwen2.5-7b')"),
                     ("config", self.config, RLConfig, "algorithm('grpo')"),
                     ("workload", self.workload, Workload, "Workload.long_tailed(...)"),
                     ("cluster", self.cluster, Cluster, h100),
                     ("rates", self.rates, Rates, "calibrated_rates('nemo-rl')")]
                    + ([("trainer", self.trainer, Layout, "Layout(dp=8)")]
                       if self.trainer is not None else []), "Scenario.")
        for name in ("offload_trainer", "engine_log_probs", "offload_reference"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Scenario.{name}={getattr(self, name)!r} must be True or False.")
        if isinstance(self.rollout_gpus, bool):
            raise ValueError(f"Scenario.rollout_gpus={self.rollout_gpus!r} must be a number of "
                             "devices (an integer), or None.")
        for name in ("rollout_gpus", "generation_tp"):  # numpy's integers (np.arange sweeps)
            value = getattr(self, name)
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                object.__setattr__(self, name, int(value))
        if not isinstance(self.mode, Mode):
            raise ValueError(f"mode={self.mode!r}: give a Mode, e.g. MODES[{self.mode!r}] "
                             f"(named modes: {', '.join(MODES)}).")
        if self.offload_reference and not self.config.uses_reference:
            raise ValueError("offload_reference moves the reference model's weights to host "
                             "memory, but this configuration holds no reference (its KL term is "
                             "off); drop offload_reference.")
        g = self.cluster.gpus
        self.spec.check_context(self.workload.prompt_len, self.workload.response_len)
        if not (is_real(self.oversample) and 1 <= self.oversample <= MAX_OVERSAMPLE):
            raise ValueError(f"Scenario.oversample={self.oversample!r} must be a number from 1 to "
                             f"{MAX_OVERSAMPLE} (prompts generated per prompt trained: 3 for "
                             "DAPO's usual 3x generation batch).")
        object.__setattr__(self, "oversample", float(self.oversample))
        if self.config.advantage in GROUP_ADVANTAGES and self.workload.group_size < 2:
            raise ValueError(f"a workload of {self.workload.group_size} response per prompt with "
                             f"advantage={self.config.advantage!r}: a group baseline needs 2 or "
                             "more responses per prompt (with one, every advantage is 0); give "
                             "the workload a larger group, or an algorithm without a group "
                             "baseline.")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement={self.placement!r}: choose one of {PLACEMENTS}.")
        if self.placement == "disaggregated":
            if not (isinstance(self.rollout_gpus, int) and 0 < self.rollout_gpus < g):
                raise ValueError(f"disaggregated placement: rollout_gpus={self.rollout_gpus!r} must "
                                 f"leave devices to both pools (1..{g - 1} of {g}).")
            if self.mode.stage_fusion:
                raise ValueError("stage fusion overlaps scoring with the decode tail on shared "
                                 "devices: use the colocated placement.")
            if self.offload_trainer:
                raise ValueError("offload_trainer frees a colocated trainer's memory for generation; "
                                 "disaggregated pools do not share memory.")
        else:
            if self.rollout_gpus not in (None, g):
                raise ValueError(f"colocated placement: every role uses all {g} devices; drop "
                                 f"rollout_gpus={self.rollout_gpus}.")
            if self.mode.streaming:
                raise ValueError("streaming trains while generating: it needs disaggregated pools.")
            if self.mode.staleness and not self.mode.partial_rollout:
                raise ValueError(f"a colocated placement with staleness {self.mode.staleness:g}: "
                                 "the shared devices take turns generating and training, so a "
                                 "staleness bound lets nothing overlap and the step is the sync "
                                 "one; use the disaggregated placement for an off-policy mode (or "
                                 "partial_rollout, which carries unfinished groups to the next "
                                 "generation phase).")
            if self.mode.partial_rollout and not self.mode.recompute_kv:
                raise ValueError("a colocated rollout frees its KV cache while the shared devices "
                                 "train (vLLM's sleep mode gives the trainer that memory), so the "
                                 "groups carried to the next generation phase prefill their "
                                 "contexts again (Kimi k1.5's partial rollouts); set "
                                 "recompute_kv=True (Mode's default), or use the disaggregated "
                                 "placement to keep the cache.")
        if (isinstance(self.generation_tp, bool) or not isinstance(self.generation_tp, int)
                or self.generation_tp < 1):
            raise ValueError(f"generation_tp={self.generation_tp!r} must be a positive integer "
                             "(devices per generation replica).")
        self.spec.check_degree("tp", self.generation_tp)  # the heads, whole KV heads a rank
        if self.rollout_pool % self.generation_tp:
            raise ValueError(f"generation_tp={self.generation_tp!r} must divide the "
                             f"{self.rollout_pool} rollout devices.")
        per_step = sequences_per_step(self.workload, self.config)
        if self.trainer_layout.dp > per_step:
            steps = min(self.config.minibatches, self.workload.responses)
            raise ValueError(f"the trainer's {self.trainer_layout.dp} data-parallel ranks are more "
                             f"than the {per_step} sequences of a gradient step "
                             f"({self.workload.responses} responses in {steps} gradient steps), so "
                             "ranks would hold none; use fewer data-parallel ranks (raise tp or "
                             "pp) or fewer gradient steps.")
        if self.mode.stage_fusion and self.replicas < 2:
            raise ValueError(f"stage fusion moves the tail to some replicas while the others score: "
                             f"it needs at least 2 generation replicas, and {self.rollout_pool} "
                             f"devices at generation_tp={self.generation_tp} make "
                             f"{self.replicas}; use the sync mode or a smaller generation_tp.")
        if self.trainer_layout.devices != self.trainer_pool:
            raise ValueError(f"the trainer layout {self.trainer_layout.describe()} uses "
                             f"{self.trainer_layout.devices} devices, but the trainer pool has "
                             f"{self.trainer_pool}; make dp x tp x pp x cp equal it.")

    @property
    def rollout_pool(self) -> int:
        return self.cluster.gpus if self.placement == "colocated" else self.rollout_gpus

    @property
    def trainer_pool(self) -> int:
        return self.cluster.gpus if self.placement == "colocated" else self.cluster.gpus - self.rollout_gpus

    @property
    def trainer_layout(self) -> Layout:
        return self.trainer or Layout(dp=self.trainer_pool)

    @property
    def replicas(self) -> int:
        return self.rollout_pool // self.generation_tp

    def describe(self) -> str:
        pools = pool_label(self.cluster.gpus,
                           None if self.placement == "colocated" else self.rollout_gpus)
        return (f"{pools}, generation tp{self.generation_tp} x {self.replicas}, trainer "
                f"{self.trainer_layout.describe()}, {self.mode.name}"
                + (OFFLOADED if self.offload_trainer else "")
                + (", reference on the host" if self.offload_reference else ""))


def sequences_per_step(workload: Workload, config: RLConfig) -> int:
    """The sequences of one gradient step, at least one (a step holds at least one response:
    :class:`~rlm_course.cost.phases.TrainerCost` takes at most one step each); a trainer's
    data-parallel degree is at most this."""
    return max(1, workload.responses // max(1, config.minibatches))


#: The most prompts generated per prompt trained a scenario takes (:attr:`Scenario.oversample`):
#: published dynamic-sampling recipes generate 3x (NeMo-RL's batch_multiplier, verl's
#: gen_batch_size) and allow up to about 10 rounds.
MAX_OVERSAMPLE = 64

#: The most gradient steps per iteration :func:`algorithm` sets (published recipes use 1 to 64).
MAX_MINIBATCHES = 1_024


def pool_label(gpus: int, rollout_gpus: int | None) -> str:
    """How plans name a placement: ``colocated`` (``rollout_gpus`` None: every role on every
    device) or ``disaggregated: R rollout GPUs + T training GPUs`` (``1 rollout GPU``, ``7,504
    rollout GPUs``)."""
    if rollout_gpus is None:
        return "colocated"

    def count(n: int, role: str) -> str:
        return f"{n:,} {role} GPU{'' if n == 1 else 's'}"

    return (f"disaggregated: {count(rollout_gpus, 'rollout')} + "
            f"{count(gpus - rollout_gpus, 'training')}")


def algorithm(name: str, minibatches: int = 1, **overrides) -> RLConfig:
    """The preset ``name`` of :data:`rlm_course.rl.algorithms.PRESETS` as the simulator uses it:
    its parts (which scoring passes, which models train, epochs) and ``minibatches`` gradient
    steps per epoch. The batch itself is the :class:`~rlm_course.cost.anatomy.Workload`'s, so the
    configuration's own ``prompts_per_step`` is only set to satisfy its checks.

    Raises:
        ValueError: for an unknown preset, ``minibatches`` outside 1 to 1,024, or an
            inconsistent override.
    """
    minibatches = as_int(minibatches)  # numpy's integers too
    if not (isinstance(minibatches, int) and not isinstance(minibatches, bool)
            and 1 <= minibatches <= MAX_MINIBATCHES):
        raise ValueError(f"minibatches={minibatches!r}: give 1 to {MAX_MINIBATCHES:,} gradient "
                         "steps per iteration (1 to 64 is typical).")
    return preset(name, minibatches=minibatches, prompts_per_step=minibatches, **overrides)


# ---------------------------------------------------------------------- memory
def memory_plan(s: Scenario) -> dict:
    """Memory per device of each role, checked against the usable memory; the KV-cache slots of
    a generation replica.

    Returns:
        ``{"trainer": {part: bytes}, "rollout": {part: bytes}, "slots": int, "usable": bytes}``.

    Raises:
        DoesNotFit: for the first role that does not fit, saying what does not fit.
    """
    check_kinds([("scenario", s, Scenario, "Scenario(spec, config, workload, cluster)")],
                "memory_plan: ")
    spec, w, dev, r = s.spec, s.workload, s.cluster.device, s.rates
    seq = w.seq_len  # the budget: any iteration may reach it
    lay = s.trainer_layout
    extra = {}
    if s.config.use_critic:
        critic = training_memory(spec, lay, seq)
        extra.update({f"critic {k}": v for k, v in critic.items() if k in ("weights", "gradients", "optimizer")})
    if s.config.uses_reference and not s.offload_reference:
        extra["reference weights"] = training_memory(spec, lay, seq, trained=False)["weights"]
    trainer = check_training(spec, lay, dev, seq, r.memory_fraction, "trainer", extra)
    resident = 0.0
    if s.placement == "colocated" and not s.offload_trainer:
        resident = sum(v for k, v in trainer.items() if k not in ("activations", "logits"))
    fraction = r.memory_fraction
    if r.rollout_memory_fraction is not None:  # the engine takes its share, the trainer the rest
        # vLLM's gpu_memory_utilization: a share of the total CUDA reports, as usable() takes it
        fraction = r.rollout_memory_fraction
        resident = 0.0
    per_sequence = w.prompt_len + w.mean_response_len
    # a speculative draft beside the model: one more layer, its weights and its KV cache
    # (DeepSeek-V3's multi-token-prediction module, an EAGLE head; one module run k times)
    draft_layers = 1 if r.speculative_tokens else 0
    slots = kv_slots(spec, s.generation_tp, dev, per_sequence, fraction, resident,
                     r.max_batch, w.weight_bytes, w.kv_bytes, draft_layers,
                     longest=w.seq_len)
    gen = generation_memory(spec, s.generation_tp, w.weight_bytes, w.kv_bytes, draft_layers)
    rollout = {"weights": gen["weights"], "kv cache": slots * per_sequence * gen["kv_per_token"]}
    if draft_layers:
        rollout["draft weights"] = gen["draft_weights"]
    if resident:
        rollout["resident trainer state"] = resident
    return {"trainer": trainer, "rollout": rollout, "slots": slots,
            "usable": usable(dev, r.memory_fraction)}


def reference_swap_seconds(s: Scenario) -> float:
    """Seconds an iteration's scoring spends swapping the reference model in and out when its
    weights live in host memory (:attr:`Scenario.offload_reference`): a trainer device's weight
    shard three times over the host link (the policy's copied out, the reference's loaded, the
    policy's loaded back; NeMo-RL's ``use_reference_model``); 0 without the offload."""
    if not s.offload_reference:
        return 0.0
    seq = s.workload.prompt_len + s.workload.max_response_len
    shard = training_memory(s.spec, s.trainer_layout, seq, trained=False)["weights"]
    return 3 * shard / s.rates.host(s.cluster.device)


# ---------------------------------------------------------------------- results
@dataclass
class SimResult:
    """What :func:`simulate` returns.

    Attributes:
        step_seconds: steady-state seconds per iteration (mean over the iterations after the
            warm-up).
        stages: mean seconds per iteration of each trainer stage (``reward``, ``scoring``,
            ``policy update``, ``critic update``, ``weight sync``, ``offload``, ``overhead``) and of
            ``generation`` (colocated: the generation phase; disaggregated: the trainer's wait for
            samples, the part of generation on the critical path).
        generation_share: ``stages["generation"] / step_seconds``.
        tokens_per_second, responses_per_second: trained prompt + response tokens, and responses,
            per second.
        mfu: the iteration's model FLOPs (generation, scoring, updates, no recomputation) over
            ``gpus x peak x step_seconds``; training_mfu: the updates' model FLOPs (``3x`` a
            forward) over the trainer pool's peak during the update stages; training_hfu: the
            same with the hardware's FLOPs (the recomputed forward counted: ``4x``).
        sync: the weight sync's terms (:class:`~rlm_course.cost.weight_sync.SyncCost`).
        memory: :func:`memory_plan`.
        timeline: ``{worker: [(phase, start, end, iteration)]}`` for ``trainer``, ``rollout``
            (busy while any replica decodes) and the first eight replicas.
        replica_utilisation: per replica, the fraction of the measured window it decoded.
        staleness: mean versions between a sample's admission and the update that trains on it
            (after the warm-up); staleness_max: the largest. Groups are trained in the order they
            finish, so with partial rollouts or streaming a long group admitted early can be
            trained later than eta allows: the maximum can exceed eta, as in AReaL.
    """

    scenario: Scenario
    step_seconds: float
    iteration_ends: list[float]
    stages: dict[str, float]
    generation_share: float
    tokens_per_second: float
    responses_per_second: float
    mfu: float
    training_mfu: float
    training_hfu: float
    sync: object
    memory: dict
    timeline: dict[str, list[tuple]]
    replica_utilisation: list[float]
    staleness: float
    staleness_max: int = 0

    def events(self, replicas: int = 4) -> list:
        """The timeline as :class:`rlm_course.timeline.Event` objects, the form real
        runs record (chapters 12-13), so that :func:`rlm_course.tools.plots.plot_timelines`
        draws simulated and measured runs alike: the trainer's stages, the rollout pool's
        decoding and weight syncs, and the first ``replicas`` replicas; waiting is left out (the
        gaps)."""
        from rlm_course.timeline import Event

        stage = {"decoding": "generation", "scoring (fused)": "scoring",
                 "policy update": "training", "critic update": "training", "weight sync": "sync"}
        out = []
        for worker, intervals in self.timeline.items():
            if worker.startswith("replica") and int(worker.split()[1]) >= replicas:
                continue
            # a colocated rollout's generation phase holds its decoding intervals: one bar each
            detailed = any(phase == "decoding" for phase, *_ in intervals)
            for phase, start, end, iteration in intervals:
                if phase.startswith("wait") or (detailed and phase == "generation"):
                    continue
                name = stage.get(phase, phase)
                out.append(Event(worker, name, start, end, max(iteration, 0), max(iteration, 0) + 1))
        return out

    def summary(self) -> str:
        parts = ", ".join(f"{k} {v:,.1f}" for k, v in self.stages.items() if v > 0)
        return (f"{self.scenario.describe()}: step {self.step_seconds:,.1f} s ({parts}); "
                f"generation {self.generation_share:.0%} of the step, MFU {self.mfu:.1%}, "
                f"{self.tokens_per_second:,.0f} tokens/s")


# ---------------------------------------------------------------------- the simulation
class _Replica:
    """One generation replica: a SimPy process decoding with continuous batching."""

    def __init__(self, sim: "_Sim", index: int) -> None:
        self.sim, self.index = sim, index
        self.queue: deque = deque()
        self.active: list = []  # heap of [finish_step, id, group, context, admit_step, length]
        self.step = 0                   # decode steps this replica has run
        self.base = 0                   # sum of (context at admission - admission step)
        self.hold: str | None = None    # "drain" or "pause" requested by a weight update
        self.parked = sim.env.event()   # succeeds when the replica has drained / paused
        self.resume = sim.env.event()
        self.wake = sim.env.event()
        self.decoding = False
        self.needs_recompute = False
        self.rows = 0           # static batching: rows of the running batch, finished or not
        self.rows_context = 0   # static batching: their contexts' sum at the batch's start step
        self.busy: list[list[float]] = []
        self.prefilled: set[int] = set()  # groups whose prompt this replica has prefilled
        self.process = sim.env.process(self.run())

    @property
    def load(self) -> int:
        return len(self.queue) + len(self.active)

    def _busy(self, start: float, end: float) -> None:
        if end <= start:
            return
        if self.busy and self.busy[-1][1] >= start - 1e-12:
            self.busy[-1][1] = max(self.busy[-1][1], end)
        else:
            self.busy.append([start, end])

    def notify(self) -> None:
        """New work or a hold request: wake the replica, interrupting a decode only when it has
        free slots for the new work or must stop at once (a pause)."""
        if not self.wake.triggered:
            self.wake.succeed()
        if self.decoding and (self.hold == "pause" or
                              (self.hold != "pause" and self.queue
                               and len(self.active) < self.sim.slots)):
            self.decoding = False  # one interrupt per decode
            self.process.interrupt()

    def run(self):
        sim, env, cost = self.sim, self.sim.env, self.sim.decode
        static, shared = sim.s.rates.static_batching, sim.s.rates.prefix_caching
        while True:
            if self.hold == "pause" or (self.hold == "drain" and not self.active and not self.queue):
                if not self.parked.triggered:
                    self.parked.succeed()
                yield self.resume
                continue
            if self.needs_recompute and self.active:
                start = env.now
                contexts = Counter(seq[3] + self.step - seq[4] for seq in self.active)
                yield env.timeout(cost.prefill_seconds(contexts, count=False))  # done before
                self._busy(start, env.now)
                self.needs_recompute = False
            if static and not self.active:
                self.rows = self.rows_context = 0
            admitted = prefill = again = None
            while (self.hold != "pause" and self.queue and len(self.active) < sim.slots
                   and not (static and self.rows)):
                if admitted is None:
                    admitted, prefill, again, model = Counter(), Counter(), Counter(), Counter()
                group, length, prompt, steps, fresh = self.queue.popleft()
                finish = self.step + steps   # the prefill samples the first token
                # the first decode step attends over the prompt and the token the prefill sampled
                heapq.heappush(self.active, [finish, sim.next_id(), group, prompt + 1, self.step,
                                             length])
                self.base += prompt + 1 - self.step
                admitted[prompt] += 1
                # a group's shared prompt is prefilled once; a migrated sequence's own context
                # is prefilled again in full
                if not fresh:  # its model FLOPs were counted where it started
                    again[prompt] += 1
                    self.prefilled.add(group)
                elif not shared or group not in self.prefilled:
                    prefill[prompt] += 1
                    self.prefilled.add(group)
                # a group's prompt is the model's work once, wherever and however often the
                # replicas prefill it (again without prefix caching, or on each replica its
                # samples reach): MFU counts it once, the seconds count every prefill
                if fresh and group not in sim.prompt_counted:
                    model[prompt] += 1
                    sim.prompt_counted.add(group)
            if static and admitted:  # the batch runs in lockstep from here until it all ends
                self.rows = sum(admitted.values())
                self.rows_context = (sum((c + 1) * n for c, n in admitted.items())
                                     - self.rows * self.step)
            if prefill or again:
                start = env.now
                cost.count_prefill(model)  # each group's prompt once: model FLOPs
                yield env.timeout(cost.prefill_seconds(prefill + again, count=False))
                self._busy(start, env.now)
            self._finish()
            if not self.active:
                if self.hold is not None or self.queue:
                    continue
                sim.idle(self)
                yield self.wake
                self.wake = env.event()
                continue
            steps = self.active[0][0] - self.step
            if static:  # every row computes, finished or not
                a, context_sum = self.rows, self.rows_context + self.rows * self.step
            else:
                a, context_sum = len(self.active), self.base + len(self.active) * self.step
            duration = cost.seconds(steps, a, context_sum)
            start = env.now
            self.decoding = True
            try:
                yield env.timeout(duration)
                done = steps
            except simpy.Interrupt:
                done = cost.steps_within(env.now - start, a, context_sum, steps)
            self.decoding = False
            cost.count(done, a, context_sum)
            self.step += done
            self._busy(start, env.now)
            if self.wake.triggered:
                self.wake = env.event()
            self._finish()

    def _finish(self) -> None:
        while self.active and self.active[0][0] <= self.step:
            finish, _, group, context, admit, length = heapq.heappop(self.active)
            self.base -= context - admit
            self.sim.sample_done(group, length)

    def take_unfinished(self) -> list[tuple]:
        """Remove every sequence this (paused) replica holds, queued or decoding, as queue items
        that continue where they stopped: a decoding sequence re-prefills its context so far
        (RLHFuse migrates the tail this way, arXiv:2409.13221, section 4)."""
        items = list(self.queue)
        for finish, _, group, context, admit, length in self.active:
            now = context + self.step - admit  # the tokens it has attended over so far
            items.append((group, length, now - 1, finish - self.step, False))
        self.queue.clear()
        self.active = []
        self.base = 0
        self.rows = self.rows_context = 0
        return items

    def request(self, kind: str) -> simpy.Event:
        self.hold = kind
        self.parked = self.sim.env.event()
        self.resume = self.sim.env.event()
        self.notify()
        return self.parked

    def release(self, recompute: bool) -> None:
        self.hold = None
        self.needs_recompute = recompute and bool(self.active)
        if not self.resume.triggered:
            self.resume.succeed()
        self.notify()


class _Sim:
    def __init__(self, s: Scenario, iterations: int, length_buckets: int | None) -> None:
        self.s, self.iterations = s, iterations
        self.env = simpy.Environment()
        self.memory = memory_plan(s)
        self.slots = self.memory["slots"]
        w, r = s.workload, s.rates
        fabric = s.cluster.fabric(r) if s.cluster.gpus > 1 else None
        self.decode = DecodeCost(s.spec, s.cluster.device, s.generation_tp, r, fabric, w)
        self.trainer_cost = TrainerCost(s.spec, s.config, s.trainer_layout, s.cluster.device, r,
                                        fabric, w.prompt_len, s.engine_log_probs)
        self.sync = weight_sync(s.spec, s.cluster.device, s.placement, s.generation_tp,
                                s.replicas, s.trainer_layout, r, fabric, w.weight_bytes)
        self.sync_seconds = self.sync.seconds
        self.reference_swap = reference_swap_seconds(s)
        lengths = list(w.lengths)
        if length_buckets:
            # levels of the longest response drawn, not of the budget: a budget far above every
            # length would otherwise round them all to one level
            q = max(1, math.ceil(max(lengths) / length_buckets))
            lengths = [max(1, min(w.response_len, q * round(t / q))) for t in lengths]
        g = w.group_size
        self.prompt_lengths = [lengths[i:i + g] for i in range(0, len(lengths), g)]
        self.replicas = [_Replica(self, i) for i in range(s.replicas)]
        self.tail_replicas = min(s.replicas - 1, max(1, round(s.mode.fusion_tail * s.replicas)))
        # groups allowed to generate at once (Mode.inflight_batches); 0: no such limit
        self.inflight_cap = (max(1, math.floor(s.mode.inflight_batches * s.workload.prompts
                                               * s.oversample + 1e-9))
                             if s.mode.inflight_batches else 0)
        self.cursor = 0
        self.admitted = 0
        self.dropped = 0.0
        self.version = 0
        self.groups: dict[int, list] = {}     # group -> [remaining samples, admit version]
        self.prompt_counted: set[int] = set()  # groups whose prompt's model FLOPs are counted
        self.buffer: deque = deque()           # finished groups: (group, admit version)
        self.done_early: dict[int, int] = {}   # in order: finished past a pending group
        self.next_in_order = 0                 # in order: the next group the buffer takes
        self.finished: list[int] = []           # lengths of the samples finished (this phase)
        self.changed = self.env.event()
        self.idle_count = 0
        self._busy_hint = 0
        self.all_idle = self.env.event()
        self.holding = False  # a weight update is draining or pausing the replicas
        self._id = 0
        self.timeline = {"trainer": [], "rollout": []}
        self.ends: list[float] = []
        self.flops_at_end: list[float] = []
        self.trainer_flops: list[float] = []
        self.update_flops: list[float] = []
        self.update_hardware_flops: list[float] = []
        self.update_seconds: list[float] = []
        self.stage_log: list[dict[str, float]] = []
        self.staleness: list[list[int]] = []
        self.tokens: list[int] = []

    # -- bookkeeping
    def next_id(self) -> int:
        self._id += 1
        return self._id

    def idle(self, replica: _Replica) -> None:
        self.idle_count += 1
        # the replica last found busy is checked first: it usually still is, and the scan of
        # every replica on each idle would cost replicas^2 over a phase
        hint = self.replicas[self._busy_hint]
        if hint.active or hint.queue:
            return
        for i, rep in enumerate(self.replicas):
            if rep.active or rep.queue:
                self._busy_hint = i
                return
        if not self.all_idle.triggered:
            self.all_idle.succeed()

    def sample_done(self, group: int, length: int) -> None:
        self.finished.append(length)
        entry = self.groups[group]
        entry[0] -= 1
        if entry[0] == 0:
            del self.groups[group]
            if not self.s.mode.in_order:
                self.buffer.append((group, entry[1]))
            else:  # the buffer takes groups in admission order; a group done early waits
                self.done_early[group] = entry[1]
                while self.next_in_order in self.done_early:
                    self.buffer.append((self.next_in_order,
                                        self.done_early.pop(self.next_in_order)))
                    self.next_in_order += 1
            if self.inflight_cap:  # its place goes to the next admissible group
                self.admit()
        if not self.changed.triggered:
            self.changed.succeed()

    def admit(self) -> None:
        """Give the replicas every prompt the staleness bound allows, in turn (a group's samples
        to one replica, or each sample to the next: :attr:`Rates.routing`); none while a
        weight update drains or pauses them (the groups it would admit wait for the new
        weights, as the module docstring says)."""
        if self.holding:
            return
        s = self.s
        per_version = s.workload.prompts * s.oversample
        allowed = math.floor(rollout_capacity(self.version, s.mode.staleness, per_version,
                                              self.admitted) + 1e-9)
        horizon = math.ceil((self.iterations + math.ceil(s.mode.staleness) + 1) * per_version)
        touched = set()
        target = min(self.admitted + allowed, horizon)
        if self.inflight_cap:  # a semaphore on the groups generating at once
            target = min(target, self.admitted + max(0, self.inflight_cap - len(self.groups)))
        per_sample = s.rates.routing == "sample"
        while self.admitted < target:
            prompt = self.admitted % s.workload.prompts
            group = self.admitted
            self.groups[group] = [s.workload.group_size, self.version]
            # the replicas in turn: per group, or per sample (Rates.routing)
            for length in self.prompt_lengths[prompt]:
                rep = self.replicas[self.cursor]
                rep.queue.append((group, length, s.workload.prompt_len, max(0, length - 1), True))
                touched.add(rep.index)
                if per_sample:
                    self.cursor = (self.cursor + 1) % len(self.replicas)
            if not per_sample:
                self.cursor = (self.cursor + 1) % len(self.replicas)
            self.admitted += 1
        # a new "all idle" only once the last one fired: a loop already waiting on an unfired
        # one (a colocated phase whose groups are admitted as others finish) must see it fire
        if touched and self.all_idle.triggered:
            self.all_idle = self.env.event()
        for i in touched:
            self.replicas[i].notify()

    def wait_groups(self, n: int):
        """Until ``n`` groups can be trained: ``n`` plus the groups dropped with them."""
        need = n + math.floor(self.dropped + (self.s.oversample - 1) * n + 1e-9)
        yield from self._wait(lambda: len(self.buffer) >= need)

    def _wait(self, ready):
        while not ready():
            event = self.changed
            yield event
            if self.changed is event:
                self.changed = self.env.event()

    def take(self, n: int) -> list[int]:
        """The lengths of the next ``n`` finished groups, for training; with oversampling, the
        groups dropped for each one kept leave the buffer too. Which of the finished groups are
        kept does not depend on their lengths (DAPO's filter looks at the rewards): the earliest
        admitted, not the first to finish (that trained the short ones: a mean response of
        229.6 tokens where the workload's is 456.2, at oversample 3)."""
        self.dropped += (self.s.oversample - 1) * n
        extra = min(math.floor(self.dropped + 1e-9), max(0, len(self.buffer) - n))
        self.dropped -= extra
        ready = [self.buffer.popleft() for _ in range(n + extra)]
        kept = set(sorted(group for group, _ in ready)[:n])
        taken = [entry for entry in ready if entry[0] in kept]  # in the order they finished
        self.staleness[-1] += [self.version - v for _, v in taken]
        lengths = []
        for group, _ in taken:
            lengths += self.prompt_lengths[group % self.s.workload.prompts]
        return lengths

    def log(self, worker: str, phase: str, start: float, iteration: int) -> None:
        if self.env.now > start:
            self.timeline[worker].append((phase, start, self.env.now, iteration))

    # -- trainer stages
    def train(self, lengths: list[int], it: int, stages: dict, optimizer_steps=None,
              skip_scoring: bool = False):
        env, s = self.env, self.s
        if s.rates.reward_seconds:
            start = env.now
            yield env.timeout(s.rates.reward_seconds * len(lengths))
            self.log("trainer", "reward", start, it)
            stages["reward"] = stages.get("reward", 0.0) + env.now - start
        seconds = self.trainer_cost.seconds(lengths, optimizer_steps)
        model = self.trainer_cost.flops(lengths, recompute=False)
        hardware = self.trainer_cost.flops(lengths)
        for stage, t in seconds.items():
            if stage == "scoring" and skip_scoring:
                continue
            if stage == "scoring":
                t += self.reference_swap
            start = env.now
            yield env.timeout(t)
            self.log("trainer", stage, start, it)
            stages[stage] = stages.get(stage, 0.0) + t
            if stage != "scoring":
                self.update_seconds[-1] += t
        self.trainer_flops[-1] += sum(model.values())
        self.update_flops[-1] += sum(v for k, v in model.items() if k != "scoring")
        self.update_hardware_flops[-1] += sum(v for k, v in hardware.items() if k != "scoring")
        self.tokens[-1] += sum(lengths) + len(lengths) * s.workload.prompt_len

    def publish(self, it: int, stages: dict):
        """New weights to the rollout: drain or pause the replicas, transfer, resume."""
        env, s = self.env, self.s
        start = env.now
        kind = "pause" if s.mode.partial_rollout else "drain"
        self.holding = True
        parked = [rep.request(kind) for rep in self.replicas]
        yield simpy.AllOf(env, parked)
        waited = env.now - start
        if waited > 0:
            self.log("trainer", "wait for rollout to drain", start, it)
            stages["generation"] = stages.get("generation", 0.0) + waited
        start = env.now
        yield env.timeout(self.sync_seconds)
        self.log("trainer", "weight sync", start, it)
        self.log("rollout", "weight sync", start, it)
        stages["weight sync"] = stages.get("weight sync", 0.0) + env.now - start
        self.version = it + 1
        self.holding = False
        recompute = s.mode.partial_rollout and s.mode.recompute_kv
        for rep in self.replicas:
            rep.release(recompute)
        self.admit()

    def _begin(self) -> dict:
        self.trainer_flops.append(0.0)
        self.staleness.append([])
        self.update_flops.append(0.0)
        self.update_hardware_flops.append(0.0)
        self.update_seconds.append(0.0)
        self.tokens.append(0)
        return {}

    def _end(self, it: int, stages: dict):
        env = self.env
        if self.s.rates.iteration_overhead:
            start = env.now
            yield env.timeout(self.s.rates.iteration_overhead)
            self.log("trainer", "overhead", start, it)
            stages["overhead"] = self.s.rates.iteration_overhead

    def _record(self, stages: dict) -> None:
        self.ends.append(self.env.now)
        self.flops_at_end.append(self.decode.flops)
        self.stage_log.append(stages)

    # -- disaggregated
    def trainer_loop(self):
        env, s = self.env, self.s
        prompts = s.workload.prompts
        chunks = s.config.minibatches if s.mode.streaming else 1
        sizes = [prompts // chunks + (1 if c < prompts % chunks else 0) for c in range(chunks)]
        for it in range(self.iterations):
            stages = self._begin()
            for n in sizes:
                start = env.now
                yield from self.wait_groups(n)
                self.log("trainer", "wait for samples", start, it)
                stages["generation"] = stages.get("generation", 0.0) + env.now - start
                lengths = self.take(n)
                yield from self.train(lengths, it, stages, 1 if s.mode.streaming else None)
            yield from self._end(it, stages)
            yield from self.publish(it, stages)
            self._record(stages)

    # -- colocated
    def colocated_loop(self):
        env, s = self.env, self.s
        prompts = s.workload.prompts
        trainer_state = sum(v for k, v in self.memory["trainer"].items()
                            if k not in ("activations", "logits"))
        for it in range(self.iterations):
            stages = self._begin()
            if s.offload_trainer:  # the trainer's states to host memory, back after generation
                start = env.now
                yield env.timeout(offload_seconds(trainer_state, s.rates, s.cluster.device) / 2)
                self.log("trainer", "offload", start, it)
                stages["offload"] = env.now - start
            start = env.now
            self.finished = []
            for rep in self.replicas:
                # carried-over groups re-prefill: a colocated rollout always recomputes them
                rep.release(s.mode.partial_rollout and it > 0)
            self.admit()
            if s.mode.partial_rollout:
                yield from self.wait_groups(prompts)
                yield simpy.AllOf(env, [rep.request("pause") for rep in self.replicas])
            elif s.mode.stage_fusion:
                # RLHFuse: once most samples are done, the tail migrates to a few replicas and the
                # other devices score the finished samples while it decodes
                total = prompts * s.workload.group_size
                yield from self._wait(
                    lambda: len(self.finished) >= math.ceil(s.mode.fusion_threshold * total))
                reached, head = env.now, list(self.finished)
                # the unfinished sequences migrate to the tail replicas (longest first, each to
                # the least loaded), re-prefilling their contexts there
                yield simpy.AllOf(env, [rep.request("pause") for rep in self.replicas])
                tail = self.replicas[:self.tail_replicas]
                moved = [item for rep in self.replicas for item in rep.take_unfinished()]
                for item in sorted(moved, key=lambda it: -it[3]):
                    min(tail, key=lambda rep: (rep.load, rep.index)).queue.append(item)
                self.all_idle = env.event()
                for rep in self.replicas:
                    rep.release(False)
                # the tail's devices score too when nothing is left to migrate to them
                share = self.tail_replicas / len(self.replicas) if moved else 0.0
                fused_scoring = self.trainer_cost.seconds(head).get("scoring", 0.0) / (1 - share)
                if not self.all_idle.triggered:
                    yield self.all_idle
            else:
                if not self.all_idle.triggered:
                    yield self.all_idle
            self.log("rollout", "generation", start, it)
            stages["generation"] = env.now - start
            if s.mode.stage_fusion and reached + fused_scoring > env.now:
                scored_from = env.now  # the part of the fused scoring that outlasts the tail
                yield env.timeout(reached + fused_scoring - env.now)
                self.log("trainer", "scoring (fused)", scored_from, it)
                stages["scoring"] = env.now - scored_from
            if s.offload_trainer:
                start = env.now
                yield env.timeout(offload_seconds(trainer_state, s.rates, s.cluster.device) / 2)
                self.log("trainer", "reload", start, it)
                stages["offload"] += env.now - start
            if s.mode.stage_fusion:  # what the fused scoring left: the tail's samples
                batch = self.take(prompts)
                score = self.trainer_cost.seconds(batch).get("scoring", 0.0)
                head_scoring = self.trainer_cost.seconds(head).get("scoring", 0.0)
                tail_scoring = max(0.0, score - head_scoring) + self.reference_swap
                start = env.now
                yield env.timeout(tail_scoring)
                self.log("trainer", "scoring", start, it)
                stages["scoring"] = stages.get("scoring", 0.0) + tail_scoring
                yield from self.train(batch, it, stages, skip_scoring=True)
            else:
                yield from self.train(self.take(prompts), it, stages)
            yield from self._end(it, stages)
            start = env.now
            yield env.timeout(self.sync_seconds)
            self.log("trainer", "weight sync", start, it)
            stages["weight sync"] = env.now - start
            self.version = it + 1
            self._record(stages)

    def run(self) -> None:
        if self.s.placement == "colocated":
            for rep in self.replicas:
                rep.request("pause")
            driver = self.env.process(self.colocated_loop())
        else:
            self.admit()
            driver = self.env.process(self.trainer_loop())
        self.env.run(until=driver)


def simulate(scenario: Scenario, iterations: int | None = None, warmup: int | None = None,
             length_buckets: int | None = None) -> SimResult:
    """Simulate ``iterations`` RL iterations of ``scenario`` and measure the steady state after
    ``warmup`` of them (defaults: ``warmup + 2`` and ``1 + ceil(eta)``: an eta-deep pipeline
    fills within that many iterations, or never needs to when generation is the slower side; a
    pipeline deeper than 3, which starts with eta + 1 batches admitted at once and swings for
    about two such bursts, warms up ``2 (eta + 1)`` iterations and measures ``2 eta``; in order
    (:attr:`Mode.in_order`), whose steps repeat every eta + 1 iterations, it measures whole
    cycles of them. On NeMo-RL's 8-step-off run: 42.5 s against 41.3 s after a 40-iteration
    warm-up measuring 40, where 4 and 2 measured 18.3 s, a transient). ``length_buckets``
    rounds the response lengths to that many levels up to the longest one (fewer events, for
    large clusters; the default keeps every length).

    Raises:
        DoesNotFit: if a role's layout does not fit memory (checked before anything runs).
        ValueError: for inconsistent settings, or ``length_buckets`` below 2.
    """
    check_kinds([("scenario", scenario, Scenario, "Scenario(spec, config, workload, cluster)")],
                "simulate: ")
    for name, value in (("iterations", iterations), ("warmup", warmup)):
        if value is not None and (isinstance(value, bool) or not isinstance(value,
                                                                            numbers.Integral)):
            raise ValueError(f"simulate: {name}={value!r} must be an integer (None: the default).")
    iterations = None if iterations is None else int(iterations)
    warmup = None if warmup is None else int(warmup)
    eta = math.ceil(scenario.mode.staleness)
    deep = eta > 3
    if warmup is None:
        warmup = 2 * (eta + 1) if deep else 1 + eta
    if iterations is None:
        measured = 2 * eta if deep else 2
        if scenario.mode.in_order and eta:  # its steps repeat every eta + 1: whole cycles
            measured = (eta + 1) * math.ceil(measured / (eta + 1))
        iterations = warmup + measured
    if not (isinstance(iterations, int) and isinstance(warmup, int) and 0 <= warmup < iterations):
        raise ValueError(f"iterations={iterations!r} must exceed warmup={warmup!r} >= 0.")
    length_buckets = as_int(length_buckets)  # numpy's integers too
    if length_buckets is not None and not (isinstance(length_buckets, int)
                                           and not isinstance(length_buckets, bool)
                                           and length_buckets >= 2):
        raise ValueError(f"length_buckets={length_buckets!r}: give 2 or more levels (e.g. 64), or "
                         "None to keep every length.")
    sim = _Sim(scenario, iterations, length_buckets)
    sim.run()
    return _result(sim, warmup)


def _result(sim: _Sim, warmup: int) -> SimResult:
    s = sim.s
    ends = sim.ends
    n = len(ends) - warmup
    t0 = ends[warmup - 1] if warmup else 0.0
    step = (ends[-1] - t0) / n
    measured = sim.stage_log[warmup:]
    keys = sorted({k for st in measured for k in st})
    stages = {k: sum(st.get(k, 0.0) for st in measured) / n for k in keys}
    gen_flops = sim.flops_at_end[-1] - (sim.flops_at_end[warmup - 1] if warmup else 0.0)
    train_flops = sum(sim.trainer_flops[warmup:])
    device = s.cluster.device
    mfu = (gen_flops + train_flops) / (s.cluster.gpus * device.peak_flops * (ends[-1] - t0))
    update_flops = sum(sim.update_flops[warmup:])
    update_time = sum(sim.update_seconds[warmup:])
    pool_peak = s.trainer_pool * device.peak_flops
    training_mfu = update_flops / (pool_peak * update_time) if update_time else 0.0
    training_hfu = (sum(sim.update_hardware_flops[warmup:]) / (pool_peak * update_time)
                    if update_time else 0.0)
    tokens = sum(sim.tokens[warmup:]) / n
    window = ends[-1] - t0
    utilisation = [sum(max(0.0, min(e, ends[-1]) - max(b, t0)) for b, e in rep.busy) / window
                   for rep in sim.replicas]
    merged: list[list[float]] = []
    for b, e in sorted(iv for rep in sim.replicas for iv in rep.busy):
        if merged and b <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([b, e])
    sim.timeline["rollout"] += [("decoding", b, e, -1) for b, e in merged]
    sim.timeline["rollout"].sort(key=lambda x: x[1])
    for rep in sim.replicas[:8]:
        sim.timeline[f"replica {rep.index}"] = [("decoding", b, e, -1) for b, e in rep.busy]
    return SimResult(
        scenario=s, step_seconds=step, iteration_ends=list(ends), stages=stages,
        generation_share=stages.get("generation", 0.0) / step,
        tokens_per_second=tokens / step,
        responses_per_second=s.workload.responses / step,
        mfu=mfu, training_mfu=training_mfu, training_hfu=training_hfu, sync=sim.sync,
        memory=sim.memory,
        timeline=sim.timeline, replica_utilisation=utilisation,
        staleness=(sum(sum(x) for x in sim.staleness[warmup:])
                   / max(1, sum(len(x) for x in sim.staleness[warmup:]))),
        staleness_max=max((max(x) for x in sim.staleness[warmup:] if x), default=0))
