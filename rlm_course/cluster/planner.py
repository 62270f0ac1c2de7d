"""A planner for an RL run on a cluster: which placement, which layout for each role and which
execution mode give the shortest iteration, and why the others lose.

:func:`plan` searches, for a model, an algorithm, a workload and ``gpus`` devices of a catalog
type:

* **placements**: colocated (every role on every device) and disaggregated pools (the rollout
  gets 1/4, 3/8, 1/2, 5/8 or 3/4 of the devices, whole nodes where the pool is at least one);
* **generation layouts**: tensor-parallel replicas of 1-32 devices that fit the weights and at
  least one sequence's KV cache (:func:`~rlm_course.cost.layouts.kv_slots`), priced on the link
  each replica spans (NVLink inside a node, the network across nodes);
* **trainer layouts**: TP x PP (x EP for MoE) with data parallelism over the rest, ZeRO-3/FSDP
  when there is no model parallelism and Megatron's distributed optimizer (ZeRO-1 with fp32 main
  gradients) with it, activation recomputation, packed
  micro-batches (:class:`~rlm_course.cost.layouts.Layout`), kept when they fit memory
  (:func:`~rlm_course.cost.layouts.check_training`);
* **execution modes**: synchronous and stage-fused (colocated); synchronous, one step
  off-policy and streaming asynchronous with partial rollouts (disaggregated)
  (:data:`~rlm_course.cluster.simulator.MODES`).

To stay fast it prunes: the trainer layouts of each pool size are ranked by the trainer's own
seconds on the workload (:class:`~rlm_course.cost.phases.TrainerCost`), the generation layouts
by :func:`generation_estimate` (waves of mean-length responses, then the longest one alone), and
only the best two of each are simulated whole (:func:`~rlm_course.cluster.simulator.simulate`, with
the response lengths rounded to 64 levels): colocated, every mode with the best-ranked layouts,
then the other layouts in the best mode, each both with the trainer's states resident and
offloaded to host memory while it generates (more KV cache for a copy each way over the host
link; offloaded only, when no KV cache fits beside the resident states); disaggregated, first
the best layouts in the streaming asynchronous mode at the two splits whose pools' estimates
balance best, then, at the better split, every mode with the best layouts and the other layouts
in the best mode.
Every candidate that does not fit memory is kept with its reason, whose fixes are those that
apply to its layout (:func:`advise`: ZeRO-3/FSDP only where a parameter has more than one
data-parallel rank, a larger TP or PP only where the pool has room for it). When nothing fits,
:func:`plan` says how many GPUs would (:func:`smallest_fitting_gpus`, a memory check of the
counts above, in a fraction of a second).

Placements and modes have one name each in every plan: ``colocated`` or ``disaggregated: R
rollout GPUs + T training GPUs`` (:func:`pool_label`), and the keys of
:data:`~rlm_course.cluster.simulator.MODES` (:func:`mode_key`).

:func:`format_plan` prints the best few with their step time, throughput, memory per device and
where the time goes, then why the others lose. ``python -m rlm_course plan`` and
:class:`rlm_course.cluster.planner_widget.PlannerWidget` call these.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field

from rlm_course.cluster.calibration import FITTABLE
from rlm_course.cost.anatomy import LOGNORMAL_MAX_SIGMA, Workload
from rlm_course.cost.architectures import TransformerSpec
from rlm_course.cost.hardware import Device
from rlm_course.algorithms import RLConfig
from rlm_course.cost.layouts import DoesNotFit, Layout, check_training, kv_slots, training_memory
from rlm_course.cost.phases import HOST_ADAM_MEASURED, Cluster, DecodeCost, Rates, TrainerCost
from rlm_course.utils import check_kinds, is_real, seconds_text
from rlm_course.cluster.simulator import (MAX_MINIBATCHES, MAX_OVERSAMPLE, MODES, OFFLOADED,
                                          Scenario, SimResult,
                                          memory_plan, pool_label, sequences_per_step, simulate)

GB = 1e9
#: The largest cluster the planner searches (chapter 14 validates the simulator up to here).
MAX_PLAN_GPUS = 10_000
#: The most responses per iteration the planner simulates (prompts x group size; the published
#: runs of data/published/rl_systems.json use at most 8,192; a search at 65,536 takes about half
#: a minute on 2 cores).
MAX_PLAN_RESPONSES = 65_536
ROLLOUT_SHARES = (1 / 4, 3 / 8, 1 / 2, 5 / 8, 3 / 4)
COLOCATED_MODES = ("sync", "fused")
DISAGGREGATED_MODES = ("sync", "one-step-off", "async")


def runnable_modes(modes=None) -> dict[str, list[str]]:
    """``{placement: the modes of modes it runs}`` (default: :data:`COLOCATED_MODES` and
    :data:`DISAGGREGATED_MODES`): colocated devices take turns generating and training, so no
    streaming and nothing generated a step ahead; disaggregated pools have no stage fusion."""
    return {"colocated": [m for m in (modes or COLOCATED_MODES)
                          if not MODES[m].streaming and not MODES[m].staleness],
            "disaggregated": [m for m in (modes or DISAGGREGATED_MODES)
                              if not MODES[m].stage_fusion]}


#: Extra training steps per version of mean staleness to reach the same accuracy: the planner's
#: default price of asynchrony (an assumption; chapter 13 measures the toy's cost, published runs
#: at staleness <= 1 report accuracy close to synchronous; ``plan(staleness_penalty=...)``).
STALENESS_PENALTY = 0.1
#: Levels the simulator rounds the response lengths to, up to the longest drawn, when planning
#: (:func:`plan`, ``plan --length-buckets``): fewer plan faster and coarser.
LENGTH_BUCKETS = 64
#: what a trainer layout's text adds when the planner gave it micro-batches of one sequence (the
#: response budget's tokens) because none fit at two
ONE_SEQUENCE = " (micro-batches of one sequence)"
#: The largest price the planner takes: at 1,000 extra steps per version any staleness loses, and
#: a larger one only overflows the cost (1e308 printed 'infx the cost').
MAX_STALENESS_PENALTY = 1000.0


@dataclass
class Candidate:
    """One evaluated plan: its scenario and simulation, or why it was refused.

    ``step`` is the simulated seconds per iteration; ``cost`` the same priced for staleness,
    ``step x (1 + penalty x mean staleness)``: seconds per iteration's worth of progress when
    each version of staleness costs ``penalty`` more steps to the same accuracy."""

    name: str
    scenario: Scenario | None = None
    result: SimResult | None = None
    refused: str = ""
    staleness_penalty: float = STALENESS_PENALTY

    @property
    def step(self) -> float:
        return self.result.step_seconds if self.result else math.inf

    @property
    def cost(self) -> float:
        if not self.result:
            return math.inf
        return self.step * (1 + self.staleness_penalty * self.result.staleness)

    @property
    def samples_per_second(self) -> float:
        """Trained responses per second (at the candidate's staleness)."""
        return self.result.responses_per_second if self.result else 0.0


@dataclass
class Plan:
    """What :func:`plan` returns: every candidate, the feasible ones best first by
    :attr:`Candidate.cost` (the step priced for staleness)."""

    candidates: list[Candidate] = field(default_factory=list)

    @property
    def ranked(self) -> list[Candidate]:
        return sorted((c for c in self.candidates if c.result), key=lambda c: (c.cost, c.step))

    @property
    def refused(self) -> list[Candidate]:
        return [c for c in self.candidates if c.refused]

    @property
    def best(self) -> Candidate:
        return self.ranked[0]


def _divisors(n: int, options) -> list[int]:
    return [k for k in options if k <= n and n % k == 0]


def _trainer_tps(spec: TransformerSpec, device: Device) -> list[int]:
    return [t for t in (1, 2, 4, 8) if t <= device.devices_per_node and spec.allows("tp", t)]


def _trainer_pps(spec: TransformerSpec) -> list[int]:
    return [p for p in (1, 2, 4, 8, 16) if p <= spec.n_layer]


def _generation_tps(spec: TransformerSpec, devices: int) -> list[int]:
    return [t for t in (1, 2, 4, 8, 16, 32) if devices % t == 0 and spec.allows("tp", t)]


def data_parallel_ranks(spec: TransformerSpec, layout: Layout) -> int:
    """The largest group of ranks that hold the same parameters in ``layout``, the group ZeRO
    shards over: ``dp x cp`` for the dense part, ``tp x cp x dp / ep`` for an MoE's experts when
    ``ep > 1``. 1 means ZeRO (and FSDP) has nothing to shard."""
    dense = layout.dp * layout.cp
    experts = layout.tp * dense // layout.ep if spec.is_moe and layout.ep > 1 else dense
    return max(dense, experts)


def trainer_layouts(spec: TransformerSpec, config: RLConfig, device: Device, devices: int,
                    seq_len: int, micro_batch_tokens: int,
                    memory_fraction: float = 0.9,
                    first_fit: bool = False,
                    max_dp: int | None = None) -> tuple[list[Layout], list[str]]:
    """The trainer layouts of ``devices`` devices that fit memory (with the critic and the
    reference ``config`` holds), and the reasons the others do not: TP in 1, 2, 4, 8 (within a
    node), PP in 1, 2, 4, 8, 16 (at most the layers), EP in powers of two dividing the experts
    (MoE), data parallelism over the rest; ZeRO-3 when there is no model parallelism, ZeRO-1 with
    it (Megatron's distributed optimizer, with its fp32 main gradients: ``6 + 12 / d`` bytes per
    parameter), no ZeRO when every parameter has one rank (:func:`data_parallel_ranks` is 1:
    nothing to shard); recomputation on; ``micro_batch_tokens`` a micro-batch, and when nothing
    fits, micro-batches of one sequence (``seq_len``), then the optimizer offloaded to the host
    with either.
    ``first_fit``: stop at the first layout that fits (a memory check, not a search).
    ``max_dp``: the sequences of one gradient step; a layout with more data-parallel ranks is
    refused, as frameworks refuse it (each rank needs at least one sequence of every mini-batch:
    veRL divides ``ppo_mini_batch_size`` by the data-parallel size, Megatron the global batch by
    ``micro_batch x dp``).

    Each refusal ends with the fixes that apply to its layout (:func:`advise`).

    Raises:
        ValueError: if ``devices`` or ``max_dp`` is not a positive integer.
    """
    if max_dp is not None and not (isinstance(max_dp, int) and max_dp >= 1):
        raise ValueError(f"max_dp={max_dp!r} must be a positive integer (sequences per step).")
    if not (isinstance(devices, int) and devices >= 1):
        raise ValueError(f"devices={devices!r} must be a positive integer.")
    fits, refused = [], []
    fewest = None  # (dp, tp, pp) of the layout with the fewest ranks refused for max_dp
    tps = _divisors(devices, _trainer_tps(spec, device))
    pps = _trainer_pps(spec)
    eps = [e for e in (1, 2, 4, 8, 16, 32, 64) if not spec.is_moe and e == 1
           or spec.is_moe and spec.n_experts % e == 0]
    # what nothing else fits tries next: micro-batches of one sequence (a micro-batch's
    # activations and logits halved, for more micro-batches a step), then the CPU optimizer
    tiers = [(False, micro_batch_tokens), (False, seq_len), (True, micro_batch_tokens),
             (True, seq_len)]
    for offload, budget in dict.fromkeys(tiers):
        for tp in tps:
            for pp in pps:
                if devices % (tp * pp):
                    continue
                dp = devices // (tp * pp)
                for ep in eps:
                    if (tp * dp) % ep:
                        continue
                    if max_dp is not None and dp > max_dp:
                        if fewest is None or dp < fewest[0]:
                            fewest = (dp, tp, pp)
                        continue
                    megatron = tp * pp > 1
                    lay = Layout(dp=dp, tp=tp, pp=pp, ep=ep, zero=1 if megatron else 3,
                                 recompute=True, micro_batch_tokens=budget,
                                 offload=offload, main_grads_fp32=megatron)
                    if data_parallel_ranks(spec, lay) == 1:  # one rank per parameter: no ZeRO
                        lay = Layout(dp=dp, tp=tp, pp=pp, ep=ep, zero=0, recompute=True,
                                     micro_batch_tokens=budget, offload=offload,
                                     main_grads_fp32=megatron)
                    try:
                        check_training(spec, lay, device, seq_len, memory_fraction, "trainer",
                                       _extra(spec, config, lay, seq_len))
                        fits.append(lay)
                        if first_fit:
                            return fits, refused
                    except DoesNotFit as err:
                        reason = advise(str(err), spec, device, devices, trainer=lay)
                        if budget != micro_batch_tokens:  # say which budget these bytes are at
                            reason = reason.replace(f" {lay.describe()} of ",
                                                    f" {lay.describe()}{ONE_SEQUENCE} of ", 1)
                        refused.append(reason)
        if fits:
            break
    if fewest is not None and not fits:
        dp, tp, pp = fewest
        refused.append(f"trainer: every layout of {devices:,} devices has at least {dp:,} "
                       f"data-parallel ranks (tp{tp} pp{pp}), more than the {max_dp:,} "
                       f"sequence{'s' if max_dp != 1 else ''} of a gradient step, so ranks would "
                       "hold none; take fewer gradient steps "
                       "per iteration or a larger batch, or give the trainer fewer devices (a "
                       "disaggregated split).")
    return fits, refused


def shortfall_gb(reason: str) -> float:
    """GB per device by which a refusal (a :class:`~rlm_course.cost.layouts.DoesNotFit` message
    of a trainer layout or a generation replica) misses: what it needs minus what a device has
    usable; ``inf`` for a refusal that is not about memory."""
    def number(text: str) -> float:
        return float(text.replace(",", ""))

    m = re.search(r"needs (.*?),? but a device has ([\d,.]+) GB usable", reason)
    if not m:
        return math.inf
    per_device = re.match(r"([\d,.]+) GB per ", m.group(1))
    need = (number(per_device.group(1)) if per_device else
            sum(number(x) for x in re.findall(r"([\d,.]+) GB of ", m.group(1))))
    return need - number(m.group(2))


def _activation_gb(reason: str) -> float:
    """GB per device of activations and logits in a trainer layout's refusal (0 if it names
    none)."""
    return sum(float(x.replace(",", "")) for x in
               re.findall(r"(?:activations|logits) ([\d,.]+)", reason))


def advise(reason: str, spec: TransformerSpec, device: Device, devices: int,
           trainer: Layout | None = None, generation_tp: int | None = None) -> str:
    """A refusal of a trainer layout (on a pool of ``devices``) or of a generation replica of
    ``generation_tp`` devices (in a rollout pool of ``devices``), its fixes replaced by those that
    apply to that layout: ZeRO-3/FSDP only where a parameter has more than one data-parallel
    rank (:func:`data_parallel_ranks`), more TP or PP only where the pool has room for a larger
    model-parallel group the planner tries and it would shrink the excess (with ZeRO-3 over the
    whole pool, TP added to FSDP, which splits only the activations: at least half of them must
    cover it; the planner's own TP layouts pair TP with ZeRO-1), a larger generation
    TP only where one divides the pool and the heads, offloading only what is not offloaded yet;
    more GPUs or a device with more memory always. A message of another form is returned as it
    is."""
    fixes = []
    if trainer is not None:
        ranks = data_parallel_ranks(spec, trainer)
        if ranks > 1 and trainer.zero < 3:
            fixes.append(f"shard the model states over its {ranks} data-parallel ranks with "
                         "ZeRO-3/FSDP")
        group = trainer.tp * trainer.pp
        # ZeRO-3 over the whole pool already gives each device 1/devices of the model states:
        # only a larger TP (with sequence parallelism) then splits what is left, the activations
        # (a pipeline's first stage keeps pp micro-batches of 1/pp of the layers: as many), a
        # fix when half of them cover the excess; the planner's TP layouts use ZeRO-1 instead
        sharded = trainer.zero == 3 and trainer.devices == devices
        larger = (any(t > trainer.tp and devices % t == 0 for t in _trainer_tps(spec, device))
                  if sharded else
                  any(t * p > group and devices % (t * p) == 0
                      for t in _trainer_tps(spec, device) for p in _trainer_pps(spec)))
        if larger and (not sharded or _activation_gb(reason) / 2 >= shortfall_gb(reason)):
            fixes.append(
                "add tensor parallelism to FSDP (raise tp, keeping the states sharded: it splits "
                "the activations; the layouts searched here pair TP with ZeRO-1)" if sharded else
                f"split each model copy over more of the {devices} GPUs (raise tp or pp)")
        if not trainer.offload:
            fixes.append("offload the optimizer states to the host")
        fixes.append("use more GPUs or a device with more memory")
    elif generation_tp is not None:
        wider = [t for t in _generation_tps(spec, devices) if t > generation_tp]
        if wider:
            fixes.append(f"raise the generation tp (to {wider[0]})")
        if "resident trainer state" in reason:
            fixes.append("offload the trainer's states during generation")
        fixes.append("give the rollout more GPUs or use a device with more memory")
    else:
        return reason
    advised, n = re.subn(r"(GB usable(?: \([^)]*\))?)[:;] .*$",
                         lambda m: f"{m.group(1)}: {', or '.join(fixes)}.", reason)
    return advised if n else reason


def _extra(spec: TransformerSpec, config: RLConfig, layout: Layout, seq_len: int) -> dict:
    """Per device: the critic's states and the reference's weights, in the trainer's layout."""
    extra = {}
    if config.use_critic:
        critic = training_memory(spec, layout, seq_len)
        extra["critic states"] = sum(v for k, v in critic.items()
                                     if k in ("weights", "gradients", "optimizer"))
    if config.uses_reference:
        extra["reference weights"] = training_memory(spec, layout, seq_len, trained=False)["weights"]
    return extra


def _best_trainers(spec, config, workload, device, devices, rates, keep=2):
    seq = workload.seq_len  # the budget: any step may reach it
    fitting, refused = trainer_layouts(spec, config, device, devices, seq, 2 * seq,
                                       rates.memory_fraction,
                                       max_dp=sequences_per_step(workload, config))
    fabric = Cluster(device, devices).fabric(rates) if devices > 1 else None
    scored = []
    for lay in fitting:
        cost = TrainerCost(spec, config, lay, device, rates, fabric, workload.prompt_len)
        scored.append((sum(cost.seconds(workload.lengths).values()), lay))
    scored.sort(key=lambda x: x[0])
    return [lay for _, lay in scored[:keep]], refused, (scored[0][0] if scored else math.inf)


def generation_estimate(spec: TransformerSpec, workload: Workload, device: Device, devices: int,
                        tp: int, rates: Rates) -> float:
    """Seconds a rollout pool of ``devices`` devices in replicas of ``tp`` takes for
    ``workload``, estimated without simulating (the planner's pre-ranking): each replica decodes
    its share of the responses in waves of as many as its KV cache holds for a mean-length
    response, then its longest response decodes alone to the end (the tail, at one sequence per
    step), both priced by the simulator's own :class:`~rlm_course.cost.phases.DecodeCost`: the
    rates' per-step latency, the KV bytes a device really reads, the TP all-reduce over the link
    the replica spans (NVLink inside a node, the network across nodes).

    Raises:
        DoesNotFit: if a replica of ``tp`` devices cannot hold the weights and one sequence.
        ValueError: for a ``tp`` that does not fit the model or does not divide ``devices``.
    """
    spec.check_degree("tp", tp)
    if isinstance(devices, bool) or not (isinstance(devices, int) and devices >= 1) or devices % tp:
        raise ValueError(f"devices={devices!r} must be a positive multiple of tp={tp} (the pool "
                         "is made of whole replicas).")
    fabric = Cluster(device, max(devices, 2)).fabric(rates)
    w = workload
    mean, longest = max(1, round(w.mean_response_len)), w.max_response_len
    slots = kv_slots(spec, tp, device, w.prompt_len + mean, rates.memory_fraction, 0.0,
                     rates.max_batch, w.weight_bytes, w.kv_bytes,
                     longest=w.seq_len)
    per_replica = -(-w.responses // (devices // tp))
    batch, waves = min(per_replica, slots), -(-per_replica // slots)
    cost = DecodeCost(spec, device, tp, rates, fabric if tp > 1 else None, w)
    body = waves * cost.seconds(mean, batch, batch * (w.prompt_len + 1))
    return body + cost.seconds(max(0, longest - mean), 1, w.prompt_len + mean)


def _no_generation_tp(spec, devices) -> str:
    return (f"no generation tp in (1, 2, 4, 8, 16, 32) divides both {devices} devices and "
            f"{spec.name}'s {spec.n_head} heads: use a GPU count that one of them divides.")


def _best_generation(spec, workload, device, devices, rates, keep=2):
    candidates = _generation_tps(spec, devices)
    times, refused = {}, []
    for tp in candidates:
        try:
            times[tp] = generation_estimate(spec, workload, device, devices, tp, rates)
        except DoesNotFit as err:
            refused.append(advise(str(err), spec, device, devices, generation_tp=tp))
    if not times:
        return [], refused or [_no_generation_tp(spec, devices)], math.inf
    return sorted(times, key=lambda t: (times[t], t))[:keep], [], min(times.values())


def _generation_fits(spec, workload, device, devices, rates) -> tuple[bool, list[str]]:
    """Whether a generation replica of some tp fits a rollout pool of ``devices`` (the memory
    check of :func:`_best_generation`, without pricing), and the refusals."""
    refused = []
    seq = workload.prompt_len + max(1, round(workload.mean_response_len))
    for tp in _generation_tps(spec, devices):
        try:
            kv_slots(spec, tp, device, seq, rates.memory_fraction, 0.0, rates.max_batch,
                     workload.weight_bytes, workload.kv_bytes,
                     longest=workload.seq_len)
            return True, refused
        except DoesNotFit as err:
            refused.append(advise(str(err), spec, device, devices, generation_tp=tp))
    return False, refused or [_no_generation_tp(spec, devices)]


def _splits(gpus: int, node: int) -> list[int]:
    """The rollout pool sizes a disaggregated placement of ``gpus`` devices tries: the
    :data:`ROLLOUT_SHARES` of the devices, in whole nodes once there are two nodes or more."""
    splits = []
    for share in ROLLOUT_SHARES:
        rollout = round(gpus * share)
        if gpus >= 2 * node:  # whole nodes for each pool
            rollout = max(node, min(gpus - node, round(gpus * share / node) * node))
        if 0 < rollout < gpus and rollout not in splits:
            splits.append(rollout)
    return splits



def mode_key(mode) -> str:
    """The name of a :class:`~rlm_course.cluster.simulator.Mode` as plans, the CLI's ``--modes``
    and :data:`~rlm_course.cluster.simulator.MODES` spell it (``sync``, ``fused``,
    ``one-step-off``, ``async``, ``async-eta2``); a mode outside MODES keeps its
    :attr:`~rlm_course.cluster.simulator.Mode.name`."""
    return next((k for k, m in MODES.items() if m == mode), mode.name)


def describe_placement(scenario: Scenario) -> str:
    """A scenario's pools as plans name them (:func:`pool_label`)."""
    return pool_label(scenario.cluster.gpus, None if scenario.placement == "colocated"
                      else scenario.rollout_gpus)


def fits_memory(spec: TransformerSpec, config: RLConfig, workload: Workload, device: Device,
                gpus: int, rates: Rates | None = None, placements=("colocated", "disaggregated")
                ) -> tuple[bool, str]:
    """Whether some plan of ``gpus`` devices fits memory at ``rates`` (None: the device's
    calibrated ones) (the planner's memory checks alone,
    nothing simulated): a trainer layout (with at most as many data-parallel ranks as a
    gradient step has sequences, as :func:`plan` allows) and a generation replica that fit the
    colocated pool (the trainer offloaded during generation, as the planner does), or both pools
    of one of the disaggregated splits the planner tries.

    Returns:
        ``(fits, nearest miss)``: the miss (a refusal with its fixes) is ``""`` when it fits.

    Raises:
        ValueError: for an argument of the wrong kind (a name where a spec, device or Rates
            belongs), ``gpus`` that is not a positive integer, or an unknown placement.
    """
    rates = _checked_search_args("fits_memory", spec, config, workload, device, gpus, rates,
                                 placements)
    gpus = int(gpus)
    seq = workload.seq_len  # the budget: any step may reach it
    misses = []
    pools = ([(gpus, gpus)] if "colocated" in placements else []) + (
        [(r, gpus - r) for r in _splits(gpus, device.devices_per_node)]
        if "disaggregated" in placements and gpus >= 2 else [])
    max_dp = sequences_per_step(workload, config)
    for rollout, trainer in pools:
        fitting, refused = trainer_layouts(spec, config, device, trainer, seq, 2 * seq,
                                           rates.memory_fraction, first_fit=True, max_dp=max_dp)
        if not fitting:
            misses.append(_closest(refused))
            continue
        ok, refused = _generation_fits(spec, workload, device, rollout, rates)
        if ok:
            return True, ""
        misses.append(_closest(refused))
    return False, _closest(misses)


BELOW_TRIES = 8  # counts under the one asked that smallest_fitting_gpus checks


def _counts_to_try(device: Device, above: int, up_to: int) -> list[int]:
    """Cluster sizes in ``(above, up_to]`` one would provision: powers of two below a node,
    whole nodes from one node on."""
    node = device.devices_per_node
    small = [2 ** k for k in range(0, 31) if above < 2 ** k < node and 2 ** k <= up_to]
    first = max(1, above // node + 1)
    return small + list(range(first * node, up_to + 1, node))


@dataclass
class GpuSearch:
    """What :func:`smallest_fitting_gpus` found.

    Attributes:
        asked: the GPU count that was planned.
        fits: the smallest count one would provision (a power of two below a node, whole
            nodes from one node on) that fits memory (None: none up to ``limit``).
        below: the largest count under ``fits`` (or ``limit`` itself) that was checked and
            misses, and ``miss_gb``, the GB per device its nearest layout lacks; ``reason``: that
            refusal in full.
        limit: the largest count searched.
        checked: the counts checked, in order.
        asked_reason: why ``asked`` misses: its nearest layout over every pool split ("" when it
            fits).
        fits_below: the largest count under ``asked`` that fits memory, among the few one
            would provision just below it (None: none of them; not searched when ``asked``
            fits): a count that factors badly (e.g. 1,000 or 10,000 devices for a model whose
            layouts need powers of two) can miss where a slightly smaller one fits.
        fits_between: the smallest count between ``below`` and ``fits`` (one that is not a
            whole number of nodes) that fits memory, if any: Llama-3.1-70B under chapter 14's
            R1-style workload misses on 8 H100s and fits on 12 as well as on 16.
    """

    asked: int
    fits: int | None
    below: int
    miss_gb: float
    reason: str
    limit: int
    checked: list[int] = field(default_factory=list)
    fits_below: int | None = None
    asked_reason: str = ""
    fits_between: int | None = None

    def describe(self) -> str:
        """One clause: ``the smallest count that fits is 128 (on 120 the nearest layout misses
        by 3.1 GB)``."""
        if self.fits == self.asked:
            return (f"{self.asked:,} fits memory, but no plan of the placements and modes asked "
                    "runs on it")
        miss = (f"on {self.below:,} the nearest layout misses by {self.miss_gb:,.1f} GB"
                if math.isfinite(self.miss_gb) else f"nothing fits on {self.below:,}")
        smaller = (f"; {self.fits_below:,}, below it, fits" if self.fits_below is not None
                   else "")
        if self.fits is None and self.fits_below is not None:  # only counts below the asked fit
            if self.asked >= self.limit:
                return (f"{self.asked:,} does not fit ({miss}) and the planner plans at most "
                        f"{self.limit:,} GPUs{smaller}")
            return f"no count from {self.asked:,} up to {self.limit:,} fits ({miss}){smaller}"
        if self.fits is None:
            return f"no count up to {self.limit:,} fits ({miss})"
        above = "" if self.fits_below is None else f" above {self.asked:,}"
        if self.fits_between is not None:
            return (f"the smallest count above {self.asked:,} that fits is "
                    f"{self.fits_between:,}, of whole nodes {self.fits:,} ({miss}){smaller}")
        return f"the smallest count{above} that fits is {self.fits:,} ({miss}){smaller}"


def smallest_fitting_gpus(spec: TransformerSpec, config: RLConfig, workload: Workload,
                          device: Device, gpus: int, rates: Rates | None = None,
                          placements=("colocated", "disaggregated"),
                          limit: int = MAX_PLAN_GPUS) -> GpuSearch:
    """How many GPUs would fit, when ``gpus`` does not: the smallest count above ``gpus`` for
    which some plan of the same model, algorithm, workload and device fits memory
    (:func:`fits_memory`; memory only, nothing simulated, so it takes a fraction of a second to a
    few seconds). It doubles ``gpus`` until a count fits (at most ``limit``, which is tried last),
    then checks the counts one would provision from ``gpus`` up to that count (powers of two below
    a node, whole nodes from one node on), smallest first, and returns the first that fits. Every
    one is checked, not only those above the last miss: fitting is not monotonic in the count (a
    count that factors badly misses where smaller ones fit: Llama-3.1-70B misses on 28 and 34
    GPUs and fits on 16, 24 and 32).

    Counts are devices; memory in GB (1e9 bytes) per device.

    Returns:
        a :class:`GpuSearch`: the count that fits (None if none up to ``limit``), and the
        largest count under it that misses with the GB per device it lacks.

    Raises:
        ValueError: if ``gpus`` is not a positive integer or ``limit`` is below it.
    """
    rates = _checked_search_args("smallest_fitting_gpus", spec, config, workload, device, gpus,
                                 rates, placements)
    gpus = int(gpus)
    if isinstance(limit, bool) or not (isinstance(limit, numbers.Integral) and limit >= gpus):
        raise ValueError(f"limit={limit!r} must be an integer >= gpus={gpus}.")
    limit = int(limit)
    checked, misses = [], {}

    def check(count: int) -> bool:
        ok, reason = fits_memory(spec, config, workload, device, count, rates, placements)
        checked.append(count)
        if not ok:
            misses[count] = reason
        return ok

    if check(gpus):
        return GpuSearch(gpus, gpus, 0, 0.0, "", limit, checked)
    found, count = None, gpus
    while count < limit:
        count = min(2 * count, limit)
        if check(count):
            found = count
            break
    if found is not None:  # the smallest count from gpus up that fits
        for between in _counts_to_try(device, gpus, found - 1):
            if between not in misses and check(between):
                found = between
                break
    # the nearest miss named: the largest count one would provision under the one that fits
    # (the doubling search also tries counts nobody provisions: 7 -> 14)
    under = [c for c in misses if found is None or c < found]
    counts = set(_counts_to_try(device, gpus, max(under))) | {gpus}
    below = max((c for c in under if c in counts), default=max(under))
    reason = misses[below]
    # the counts nobody provisions between that miss and the count that fits (at most a node's
    # worth): a pool of 12 devices may fit where 8 misses and 16 is the next whole-node count
    between = None
    if found is not None:
        between = next((c for c in range(max(gpus, below) + 1, found)
                        if c not in misses and check(c)), None)
    # a few counts just below the one asked: the largest that fits, if any
    below_counts = _counts_to_try(device, 0, gpus - 1)[::-1]
    fits_below = next((c for c in below_counts[:BELOW_TRIES] if check(c)), None)
    # then halving: a batch too small for this many devices fits far below (ranks would hold
    # no sequence), where a model too large for them never does
    target = gpus // 2
    while fits_below is None and target >= 1:
        count = next((c for c in below_counts if c <= target), None)
        if count is None:
            break
        if count not in checked and check(count):
            fits_below = count
        target = count // 2
    return GpuSearch(gpus, found, below, shortfall_gb(reason), reason, limit, checked, fits_below,
                     misses[gpus], between)


class NoLayoutFits(DoesNotFit):
    """:func:`plan` found no plan that fits memory; ``search`` (a :class:`GpuSearch`) says how
    many GPUs would."""

    def __init__(self, message: str, search: GpuSearch) -> None:
        super().__init__(message)
        self.search = search


def _uses_groups(config: RLConfig) -> bool:
    """Whether ``config``'s advantage is a group baseline, or it samples dynamically by group."""
    from rlm_course.algorithms import GROUP_ADVANTAGES

    return config.advantage in GROUP_ADVANTAGES or config.dynamic_sampling


def _without_group_baseline() -> list[str]:
    """The presets whose advantage needs no group (one response per prompt is enough)."""
    from rlm_course.algorithms import PRESETS, preset

    return [n for n in PRESETS if not _uses_groups(preset(n))]


def check_group(algorithm_name: str, group_size: int, name=lambda key: key) -> None:
    """Refuse a group of fewer than 2 responses for an algorithm whose advantage is a group
    baseline (or that samples dynamically by group): with one, every advantage is 0.
    ``name(key)`` is how the caller's user knows ``group_size`` and ``algorithm``.

    Raises:
        ValueError: naming both settings and the algorithms without a group baseline.
    """
    others = _without_group_baseline()
    if group_size < 2 and algorithm_name not in others:
        raise ValueError(f"{name('group_size')} {group_size} with {name('algorithm')} "
                         f"{algorithm_name}: its group baseline needs 2 or more responses per "
                         f"prompt (with one, every advantage is 0); give {name('group_size')} 2 "
                         f"or more (16 is the default), or an {name('algorithm')} without a "
                         f"group baseline ({', '.join(others)}).")


def check_settings(settings: dict, name=lambda key: key, max_context: int | None = None) -> None:
    """Check a planning request before planning: ``settings`` holds ``gpus, top, prompts,
    group_size, minibatches, prompt_len`` (counts, 1 or more), ``mean_response`` (tokens, at
    least 1), ``sigma`` (the log-normal spread, 0 to
    :data:`~rlm_course.cost.anatomy.LOGNORMAL_MAX_SIGMA`) and ``max_response`` (tokens, at least
    the mean); ``gpus`` at most :data:`MAX_PLAN_GPUS`, ``prompts x
    group_size`` at most :data:`MAX_PLAN_RESPONSES`, ``minibatches`` at most
    :data:`MAX_MINIBATCHES` (more than the responses run one response per step). Keys that are
    absent are not checked.
    ``name(key)`` is how the caller's user knows a setting (the CLI: ``--group-size``; the
    widget: its control's label), so that the message names what to change. ``max_context``: the
    model's context window (tokens), so that a suggested budget fits it.

    Raises:
        ValueError: one line naming the setting, its value and the fix.
    """
    numbers = ("gpus", "top", "prompts", "group_size", "minibatches", "prompt_len",
               "mean_response", "sigma", "max_response")
    for key, value in settings.items():  # a string or a bool from a caller: named as given
        if key in numbers and (isinstance(value, bool) or not is_real(value)):
            raise ValueError(f"{name(key)} {value!r}: give a number.")
    for key in ("gpus", "top", "prompts", "group_size", "minibatches", "prompt_len"):
        value = settings.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name(key)} {value}: give 1 or more.")
    responses = settings.get("prompts", 1) * settings.get("group_size", 1)
    if responses > MAX_PLAN_RESPONSES:
        raise ValueError(f"{name('prompts')} {settings.get('prompts', 1)} x "
                         f"{name('group_size')} {settings.get('group_size', 1)} = "
                         f"{responses:,} responses per iteration: "
                         f"the planner simulates at most {MAX_PLAN_RESPONSES:,}; plan a smaller "
                         f"batch (e.g. {name('prompts')} 512 {name('group_size')} 16).")
    steps = settings.get("minibatches", 1)
    if steps > MAX_MINIBATCHES:  # more than the responses: one response per step (TrainerCost)
        raise ValueError(f"{name('minibatches')} {steps}: give at most {MAX_MINIBATCHES:,} "
                         "gradient steps per iteration (1 to 64 is typical).")
    mean = settings.get("mean_response", 1)
    if not (isinstance(mean, (int, float)) and math.isfinite(mean) and mean >= 1):
        raise ValueError(f"{name('mean_response')} {mean:g}: the mean response length must be at "
                         f"least 1 token, and finite (e.g. {name('mean_response')} 4000).")
    sigma = settings.get("sigma", 0)
    widest = LOGNORMAL_MAX_SIGMA
    if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and 0 <= sigma <= widest):
        raise ValueError(f"{name('sigma')} {sigma:g}: the spread of the log-normal lengths must "
                         f"be >= 0 and at most {widest:g}, and finite (0: every response of the "
                         "mean length; 0.8 is typical; wider, nearly every response is a few "
                         "tokens and the draws miss the mean).")
    budget = settings.get("max_response", math.inf)
    room = None if max_context is None else max_context - settings.get("prompt_len", 0)
    if room is not None and room < 1:
        raise ValueError(f"{name('prompt_len')} {settings.get('prompt_len', 0):,}: the model reads "
                         f"at most {max_context:,} tokens (its context window), so the prompt "
                         f"leaves no room for a response; shorten {name('prompt_len')} to below "
                         f"{max_context:,}, or choose a model with a longer window.")
    window = ("" if room is None else
              f"the model reads at most {max_context:,} tokens (its context window), so a prompt "
              f"of {settings.get('prompt_len', 0):,} leaves at most {max(room, 0):,} for a "
              "response")
    if "mean_response" in settings and budget >= mean and room is not None and room < mean:
        # a budget past the window fails next too: say both in one message
        raise ValueError(f"{name('mean_response')} {mean:g} and {name('max_response')} {budget}: "
                         f"{window}: lower {name('mean_response')} and {name('max_response')} to "
                         f"at most {max(room, 0):,}, shorten {name('prompt_len')}, or choose a "
                         "model with a longer window.")
    if "mean_response" in settings and budget < mean:
        suggest = max(16384, int(min(4 * mean, 2**31)))  # 4x the mean, kept a finite integer
        if room is not None and room < mean:
            # the mean must fit the budget as well as the window: name the budget when it is
            # the tighter limit, and what raising it would allow
            most = max(min(budget, room), 0)
            if budget >= room:  # the window is the limit (the CLI's default budget is the room)
                raise ValueError(f"{name('mean_response')} {mean:g} does not fit the window: "
                                 f"{window}: lower {name('mean_response')} to at most {most:,}, "
                                 f"shorten {name('prompt_len')}, or choose a model with a longer "
                                 "window.")
            raise ValueError(f"{name('max_response')} {budget} is below {name('mean_response')} "
                             f"{mean:g}, and {window}: lower {name('mean_response')} to at most "
                             f"{most:,} (its budget, {name('max_response')} {budget}), or raise "
                             f"{name('max_response')} to at most {room:,} and the mean with it, "
                             f"shorten {name('prompt_len')}, or choose a model with a longer "
                             "window.")
        if room is not None:
            suggest = min(suggest, room)
        raise ValueError(f"{name('max_response')} {budget} is below {name('mean_response')} "
                         f"{mean:g}: the budget caps the lengths, so raise it (e.g. "
                         f"{name('max_response')} {suggest}) or lower the mean.")
    if settings.get("gpus", 1) > MAX_PLAN_GPUS:
        raise ValueError(f"{name('gpus')} {settings['gpus']}: the planner searches clusters of up "
                         f"to {MAX_PLAN_GPUS:,} devices (the largest size bench simulator runs); "
                         "plan a share of the cluster (e.g. one job's pool) instead.")


def linked_gpus(device: Device, rates: Rates | None = None) -> float:
    """The most devices of ``device`` one plan can join: 1 without a link inside a node (a
    measured CPU such as ``this-machine``), a node without a link between nodes, else no limit
    (``inf``); ``rates.intra_link`` / ``inter_link`` stand in for a missing one."""
    intra = device.intra_node_bandwidth > 0 or (rates is not None and rates.intra_link)
    inter = device.inter_node_bandwidth > 0 or (rates is not None and rates.inter_link)
    if device.devices_per_node > 1 and not intra or device.devices_per_node == 1 and not inter:
        return 1
    return math.inf if inter else device.devices_per_node


def _missing_link(device: Device, rates: Rates | None) -> str:
    if device.devices_per_node > 1 and linked_gpus(device, rates) == device.devices_per_node:
        return f"none between its nodes of {device.devices_per_node}"
    return "one device per node and no network between nodes"


def _checked_search_args(owner, spec, config, workload, device, gpus, rates, placements):
    """The checks :func:`fits_memory` and :func:`smallest_fitting_gpus` share with :func:`plan`;
    returns ``rates``, the device's calibrated ones when None."""
    _check_types(spec, config, workload, device, rates)
    if isinstance(gpus, bool) or not (isinstance(gpus, numbers.Integral) and gpus >= 1):
        raise ValueError(f"{owner}: gpus={gpus!r} must be a positive integer.")
    if isinstance(placements, str):
        placements = (placements,)
    if (not hasattr(placements, "__iter__") or not list(placements)
            or any(p not in ("colocated", "disaggregated") for p in placements)):
        raise ValueError(f"{owner}: placements={placements!r}: give colocated, disaggregated or "
                         "both.")
    return _rates_or_calibrated(rates, device)


def _rates_or_calibrated(rates: Rates | None, device: Device) -> Rates:
    """``rates``, or when None the rates calibrated for ``device``
    (:func:`rlm_course.cluster.calibration.calibrated_rates`)."""
    if rates is not None:
        return rates
    from rlm_course.cluster.calibration import calibrated_rates

    return calibrated_rates(device)


def _check_types(spec, config, workload, device, rates) -> None:
    """A clear error for an argument of the wrong kind (a name where an object is expected)."""
    check_kinds([
        ("spec", spec, TransformerSpec, "rlm_course.cost.architectures.get_spec('llama-3-8b')"),
        ("config", config, RLConfig, "rlm_course.cluster.simulator.algorithm('grpo')"),
        ("workload", workload, Workload, "rlm_course.cost.anatomy.Workload.long_tailed(...)"),
        ("device", device, Device, "rlm_course.cost.hardware.get_device('H100-SXM-80GB')")])
    if rates is not None and not isinstance(rates, Rates):
        raise ValueError(f"rates={rates!r} must be a Rates or None (the device's calibrated "
                         "rates); pass e.g. "
                         "rlm_course.cluster.calibration.calibrated_rates('verl').")


def plan(spec: TransformerSpec, config: RLConfig, workload: Workload, device: Device, gpus: int,
         rates: Rates | None = None, placements=("colocated", "disaggregated"),
         modes=None, length_buckets: int = LENGTH_BUCKETS, keep: int = 2,
         staleness_penalty: float = STALENESS_PENALTY, oversample: float = 1.0) -> Plan:
    """Search placements x layouts x execution modes for ``gpus`` devices (see the module
    docstring), with ``rates`` (default: the rates calibrated on published runs for ``device``,
    :func:`rlm_course.cluster.calibration.calibrated_rates`), ranking by the step priced for
    staleness (:attr:`Candidate.cost`, ``staleness_penalty`` per version). ``oversample``:
    prompts generated per prompt trained (:attr:`~rlm_course.cluster.simulator.Scenario.oversample`:
    DAPO's dynamic sampling generates more groups than it keeps, verl's recipes 3x).

    Raises:
        NoLayoutFits: (a :class:`~rlm_course.cost.layouts.DoesNotFit`) if no candidate fits
            memory: the message gives the smallest GPU count that fits
            (:func:`smallest_fitting_gpus`, its ``search`` attribute), the nearest miss and what
            to change: more devices, a larger device, shorter sequences.
        ValueError: for an argument of the wrong kind (e.g. a model's name for ``spec``: pass
            ``get_spec(name)``), a prompt and response budget longer than the model's context
            window (:meth:`~rlm_course.cost.architectures.TransformerSpec.check_context`), an
            unknown placement or mode, ``gpus < 1``, an ``oversample`` outside 1 to
            :data:`~rlm_course.cluster.simulator.MAX_OVERSAMPLE`, more devices than the
            device's links can join (:func:`linked_gpus`), modes that none of the placements
            runs (fused needs colocated, streaming modes disaggregated), or a
            disaggregated-only search on one device, or a negative staleness penalty.
    """
    _check_types(spec, config, workload, device, rates)
    spec.check_context(workload.prompt_len, workload.response_len)
    if isinstance(gpus, numbers.Integral) and not isinstance(gpus, bool):
        gpus = int(gpus)  # numpy's integers too
    if placements is None:
        raise ValueError("placements=None: give colocated, disaggregated or both.")
    rates = _rates_or_calibrated(rates, device)
    if not (isinstance(staleness_penalty, (int, float)) and not isinstance(staleness_penalty, bool)
            and 0 <= staleness_penalty <= MAX_STALENESS_PENALTY):
        raise ValueError(f"staleness_penalty={staleness_penalty!r} must be a number from 0 to "
                         f"{MAX_STALENESS_PENALTY:,.0f} (extra steps per version of staleness; 0 "
                         "prices staleness at nothing, 1,000 rules out any).")
    if isinstance(gpus, bool) or not (isinstance(gpus, int) and gpus >= 1):
        raise ValueError(f"gpus={gpus!r} must be a positive integer.")
    if not (is_real(oversample) and 1 <= oversample <= MAX_OVERSAMPLE):
        raise ValueError(f"oversample={oversample!r} must be a number from 1 to "
                         f"{MAX_OVERSAMPLE} (prompts generated per prompt trained: 3 for DAPO's "
                         "usual 3x generation batch).")
    check_settings({"gpus": gpus, "prompts": workload.prompts, "group_size": workload.group_size})
    if gpus > linked_gpus(device, rates):
        raise ValueError(f"gpus={gpus}: {device.name} has no link between devices "
                         f"({_missing_link(device, rates)}), so a plan holds at most "
                         f"{linked_gpus(device, rates)} of it; plan that many, or an accelerator "
                         "of the catalog (e.g. H100-SXM-80GB).")
    if isinstance(placements, str):
        placements = (placements,)
    placements = tuple(placements)
    for p in placements:
        if p not in ("colocated", "disaggregated"):
            raise ValueError(f"unknown placement {p!r}; choose colocated or disaggregated.")
    if not placements:
        raise ValueError("placements is empty; give colocated, disaggregated or both.")
    if not (isinstance(keep, int) and keep >= 1):
        raise ValueError(f"keep={keep!r} must be a positive integer (layouts kept per pool).")
    if isinstance(modes, str):
        modes = [modes]
    if workload.group_size < 2 and _uses_groups(config):
        raise ValueError(f"workload.group_size={workload.group_size} with a group baseline "
                         f"(advantage {config.advantage!r}): it needs 2 or more responses per "
                         "prompt (with one, every advantage is 0); plan a workload of groups of "
                         "2 or more, or an algorithm without a group baseline "
                         f"({', '.join(_without_group_baseline())}).")
    if modes is not None and not list(modes):
        raise ValueError("modes is empty; give one or more of "
                         f"{', '.join(MODES)}, or None for every mode the placements run.")
    for m in modes or ():
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; choose among {', '.join(MODES)}.")
    runnable = runnable_modes(modes)
    if not any(runnable[p] for p in placements):
        raise ValueError(f"modes {', '.join(modes)} do not run on the {' or '.join(placements)} "
                         "placement: stage fusion (fused) needs colocated devices, the off-policy "
                         "modes (one-step-off, async, async-eta2) need disaggregated pools.")
    if placements == ("disaggregated",) and gpus < 2:
        raise ValueError(f"gpus={gpus}: a disaggregated placement needs at least 2 devices (one "
                         "per pool); use the colocated placement.")
    if gpus < 2 and not ("colocated" in placements and runnable["colocated"]):
        raise ValueError(f"gpus={gpus} with modes {', '.join(modes)}: they run on disaggregated "
                         "pools only, which need at least 2 devices (one per pool); plan 2 or "
                         f"more devices, or a colocated mode ({', '.join(COLOCATED_MODES)}).")
    out = Plan()
    cluster = Cluster(device, gpus)
    node = device.devices_per_node
    cache: dict = {}

    def layouts_for(rollout):
        if rollout not in cache:
            trainer_pool = gpus if rollout is None else gpus - rollout
            rollout_pool = gpus if rollout is None else rollout
            cache[rollout] = (_best_trainers(spec, config, workload, device, trainer_pool, rates, keep),
                              _best_generation(spec, workload, device, rollout_pool, rates, keep))
        return cache[rollout]

    def evaluate(rollout, tp, lay, name, offload=False) -> Candidate:
        one = lay.micro_batch_tokens == workload.seq_len
        label = (f"{pool_label(gpus, rollout)}, generation tp{tp}, trainer {lay.describe()}"
                 f"{ONE_SEQUENCE if one else ''}, {name}" + (OFFLOADED if offload else ""))
        for c in out.candidates:
            if c.name == label:
                return c
        try:
            s = Scenario(spec, config, workload, cluster,
                         placement="colocated" if rollout is None else "disaggregated",
                         rollout_gpus=rollout, generation_tp=tp, trainer=lay, mode=MODES[name],
                         rates=rates, offload_trainer=offload, oversample=oversample)
            memory_plan(s)
        except DoesNotFit as err:
            if rollout is None and not offload:  # a hybrid engine can offload the trainer
                return evaluate(rollout, tp, lay, name, True)
            trainer_pool = gpus if rollout is None else gpus - rollout
            reason = str(err)
            reason = (advise(reason, spec, device, trainer_pool, trainer=lay)
                      if reason.startswith("trainer") else
                      advise(reason, spec, device, gpus if rollout is None else rollout,
                             generation_tp=tp))
            c = Candidate(label, refused=reason)
        else:
            c = Candidate(label, s, simulate(s, length_buckets=length_buckets),
                          staleness_penalty=staleness_penalty)
        out.candidates.append(c)
        if rollout is None and not offload and c.result is not None:
            # a hybrid engine may also offload the trainer's states while it generates (veRL's
            # and NeMo-RL's colocated recipes do): more room for the KV cache, for a copy each
            # way over the host link; both are ranked, and the faster one leads the search
            other = evaluate(rollout, tp, lay, name, True)
            if other.result is not None and other.cost < c.cost:
                return other
        return c

    def search(rollout, names, first_only=False):
        (trainers, t_refused, _), (gens, g_refused, _) = layouts_for(rollout)
        pool = pool_label(gpus, rollout)
        if not trainers:
            out.candidates.append(Candidate(f"{pool} (trainer)", refused=_closest(t_refused)))
            return []
        if not gens:
            out.candidates.append(Candidate(f"{pool} (generation)", refused=_closest(g_refused)))
            return []
        if first_only:
            trainers, gens = trainers[:1], gens[:1]
        pool_devices = gpus if rollout is None else rollout

        def runs(tp, name):
            return not (MODES[name].stage_fusion and pool_devices // tp < 2)

        # every mode with the best-ranked layouts it can run (stage fusion needs two replicas:
        # the best generation TP that leaves two), then the other layouts in the best mode
        best_tp = {name: next((tp for tp in gens if runs(tp, name)), None) for name in names}
        first = [evaluate(rollout, best_tp[name], trainers[0], name) for name in names
                 if best_tp[name] is not None]
        simulated = [c for c in first if c.result]
        if not simulated:
            return first
        top = min(simulated, key=lambda c: c.cost)
        name = next(n for n in names if MODES[n] == top.scenario.mode)
        rest = [evaluate(rollout, tp, lay, name) for tp in gens for lay in trainers
                if (tp, lay) != (best_tp[name], trainers[0]) and runs(tp, name)]
        return first + rest

    if "colocated" in placements:
        search(None, runnable["colocated"])
    if "disaggregated" in placements and gpus >= 2 and runnable["disaggregated"]:
        splits = _splits(gpus, node)
        names = runnable["disaggregated"]
        probe = "async" if "async" in names else names[-1]
        # rank the splits by the longer of the two pools' estimates (an overlapped step), then
        # simulate the two best in the probe mode, then every layout and mode at the better one
        estimate = {r: max(layouts_for(r)[0][2], oversample * layouts_for(r)[1][2])
                    for r in splits}
        shortlist = sorted(splits, key=lambda r: estimate[r])[:2]
        tried = {r: min((c.step for c in search(r, [probe], first_only=True)), default=math.inf)
                 for r in shortlist}
        best = min(tried, key=tried.get)
        if tried[best] < math.inf:
            search(best, names)
    if not out.ranked:
        # only counts the device's links can join (a machine without links: this one alone)
        most = min(MAX_PLAN_GPUS, linked_gpus(device, rates))
        # memory is searched on the placements that run a mode asked (async: disaggregated)
        runs = tuple(p for p in placements if runnable[p])
        found = smallest_fitting_gpus(spec, config, workload, device, gpus, rates, runs,
                                      max(gpus, int(most)))
        if found.fits == gpus:  # memory is not what stops it: the modes asked cannot run here
            raise NoLayoutFits(
                f"no plan of {spec.name} runs on {gpus:,} x {device.name}: {gpus:,} fits "
                "memory, but not with the placements and modes asked (stage fusion needs two "
                "generation replicas, a disaggregated mode a pool of devices for each role). Use "
                "more devices, or the sync mode.", found)
        # the nearest miss over every pool split (the candidates above are the shortlisted ones)
        closest = (found.asked_reason or _closest([c.refused for c in out.candidates])).rstrip(".")
        # the refusal's generic advice; the search below says how many devices would fit
        generic = "use more GPUs or a device with more memory"
        closest = closest.replace(f", or {generic}", "").replace(f": {generic}", "")
        if found.fits is not None and found.fits > gpus:
            fix = f"Use {found.fits:,} or more devices" + (
                f" (or {found.fits_below:,})" if found.fits_below is not None else "") + (
                f" ({found.fits_between:,}, not whole nodes, fits too)"
                if found.fits_between is not None else "")
        elif found.fits_below is not None:
            fix = f"Use {found.fits_below:,} devices"
        else:
            fix = "Use more devices" if found.fits == gpus else ""
        # shorter sequences are a fix only where the sequences' memory could cover the excess:
        # a KV cache, or activations and logits at least the shortfall (not weights and states)
        shorter = "KV cache" in closest or _activation_gb(closest) >= shortfall_gb(closest)
        if "would hold none" in closest and found.fits_below is not None:
            # too many devices for the batch, not too little memory
            fix = f"Use {found.fits_below:,} devices, or a larger batch."
        elif shorter:
            fix = (f"{fix}, a device with more memory, or shorter sequences." if fix else
                   "Use a device with more memory or shorter sequences.")
        else:
            fix = f"{fix} or a device with more memory." if fix else "Use a device with more memory."
        raise NoLayoutFits(f"no layout of {spec.name} fits {gpus:,} x {device.name} for this "
                           f"workload; {found.describe()}. The nearest miss on {gpus:,}: "
                           f"{closest}. {fix}"
                           + _other_placement_fits(spec, config, workload, device, gpus, rates,
                                                   placements, runnable, modes), found)
    return out


def _other_placement_fits(spec, config, workload, device, gpus, rates, placements, runnable,
                          modes) -> str:
    """The sentence a memory refusal adds when a placement the search left out fits ``gpus``:
    one the modes asked do not run on (async on colocated devices) or one not asked; ``""`` when
    none does."""
    for other in ("colocated", "disaggregated"):
        if other in placements and runnable[other]:
            continue  # searched
        if other == "disaggregated" and gpus < 2:
            continue
        if not fits_memory(spec, config, workload, device, gpus, rates, (other,))[0]:
            continue
        if other in placements:  # asked, but none of the modes asked runs on it
            runs = COLOCATED_MODES if other == "colocated" else DISAGGREGATED_MODES
            return (f" A {other} plan fits {gpus:,} devices, but the modes asked "
                    f"({', '.join(modes)}) do not run on {other} devices; add "
                    f"{' or '.join(runs)} to the modes, or leave the modes out.")
        return (f" A {other} plan fits {gpus:,} devices: the placement asked is "
                f"{' or '.join(placements)}; allow {other} (placement any) to plan it.")
    return ""


#: How much cheaper (a share of the step) a smaller count's plan must be for
#: :func:`fewer_devices` to offer it: less is within the simulator's rounding.
FEWER_MARGIN = 0.01


def fewer_devices(spec: TransformerSpec, config: RLConfig, workload: Workload, device: Device,
                  gpus: int, result: Plan, rates: Rates | None = None,
                  **options) -> tuple[int, Plan] | None:
    """A count just below ``gpus`` that plans a cheaper step than ``result`` (the plan of
    ``gpus``), when ``gpus`` is not a count one provisions (a power of two below a node, whole
    nodes from one node on): layouts need degrees that divide the pools, so a count with few
    divisors (17, a prime) offers fewer layouts than the round count under it (16), whose best
    plan can be faster although a device idles. ``options`` go to :func:`plan`.

    Returns:
        ``(count, its plan)`` when that count's best plan costs at least :data:`FEWER_MARGIN`
        less than ``result``'s, else None (and None when ``gpus`` is a provisioned count, or the
        smaller count fits no plan).
    """
    counts = _counts_to_try(device, 0, gpus)
    if not counts or gpus in counts or not result.ranked:
        return None
    fewer = max(c for c in counts if c < gpus)
    try:
        other = plan(spec, config, workload, device, fewer, rates=rates, **options)
    except DoesNotFit:
        return None
    if other.ranked and other.best.cost < (1 - FEWER_MARGIN) * result.best.cost:
        return fewer, other
    return None


#: How much longer (a share of the step) the plan of half the devices may be for
#: :func:`half_the_devices` to say so: within it, each GPU of the half does at least 1.6x the work.
HALF_MARGIN = 0.25


def half_the_devices(spec: TransformerSpec, config: RLConfig, workload: Workload, device: Device,
                     gpus: int, result: Plan, rates: Rates | None = None,
                     **options) -> tuple[int, Plan] | None:
    """The largest count one provisions at or below ``gpus / 2`` when its best plan costs less
    than ``1 +`` :data:`HALF_MARGIN` times ``result``'s (the plan of ``gpus``): a batch too small
    for the cluster, whose step is bound by the longest response's decode steps and by fixed
    costs, so that doubling the devices barely shortens it. ``options`` go to :func:`plan`.

    Returns:
        ``(count, its plan)``, or None (also for fewer than 16 GPUs, or when that count fits no
        plan).
    """
    counts = [c for c in _counts_to_try(device, 0, gpus // 2) if c >= 8]
    if gpus < 16 or not counts or not result.ranked:
        return None
    half = max(counts)
    try:
        other = plan(spec, config, workload, device, half, rates=rates, **options)
    except DoesNotFit:
        return None
    if other.ranked and other.best.cost < (1 + HALF_MARGIN) * result.best.cost:
        return half, other
    return None


def _closest(reasons: list[str]) -> str:
    """The refusal that misses by the fewest GB per device (the nearest miss,
    :func:`shortfall_gb`), or the first."""
    if not reasons:
        return "nothing fits"
    return min(reasons, key=shortfall_gb)


def host_optimizer_seconds(result: SimResult) -> tuple[float, int] | None:
    """``(seconds, steps)``: one optimizer step of a trainer whose optimizer is offloaded (Adam
    on its host's CPUs, :meth:`~rlm_course.cost.phases.TrainerCost.adam_seconds`) and the
    optimizer steps an iteration takes; None when the optimizer stays on the devices."""
    s = result.scenario
    if not s.trainer_layout.offload:
        return None
    fabric = s.cluster.fabric(s.rates) if s.cluster.gpus > 1 else None
    cost = TrainerCost(s.spec, s.config, s.trainer_layout, s.cluster.device, s.rates, fabric,
                       s.workload.prompt_len, s.engine_log_probs)
    return cost.adam_seconds(), cost.optimizer_steps(s.workload.responses)


def where_time_goes(result: SimResult) -> str:
    """The step's largest parts, as shares."""
    parts = sorted(result.stages.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v / result.step_seconds:.0%}" for k, v in parts if v > 0.005 * result.step_seconds)


#: The share of a step a disaggregated plan's trainer must wait for samples for :func:`why` to
#: call the plan generation-bound (the rollout pool sets its step), not held back by its own stages.
WAIT_SHARE = 0.02


def why(candidate: Candidate, best: Candidate) -> str:
    """Why a candidate loses to ``best``: refused for memory, or slower, and by what: the stage
    that takes longest beyond the best's same stage (its largest if none does), with both
    seconds; on separate pools, waiting for generation whenever the trainer waits more than
    :data:`WAIT_SHARE` of its step (the rollout pool then sets the step, whatever the trainer's
    stages), else the trainer's own stage."""
    if candidate.refused:
        return f"does not fit: {candidate.refused}"
    r = candidate.result
    slower = candidate.cost / best.cost
    if candidate.step <= best.step:  # faster per step, but its staleness costs more steps
        return (f"{slower:.2f}x the cost: {seconds_text(r.step_seconds, 0)} per step at a mean "
                f"staleness of {r.staleness:.2f} versions (priced at {candidate.staleness_penalty:g} extra "
                "steps per version)")
    stages, theirs = r.stages, best.result.stages
    # separate pools: "generation" is the trainer's wait for samples, the rest its own work; a
    # trainer that waits is held back by the rollout pool however long its stages are (two
    # trainers of different speeds behind one rollout pool take the same step)
    separate = candidate.scenario.placement == "disaggregated"
    wait = stages.get("generation", 0.0)
    if separate and wait > WAIT_SHARE * r.step_seconds:
        where = (f"generation-bound (its {candidate.scenario.rollout_pool} rollout GPUs set "
                 f"the {seconds_text(r.step_seconds, 0)} step: the trainer waits "
                 f"{seconds_text(wait, 0)} of it, {wait / r.step_seconds:.0%}, for samples)")
        return _loses(candidate, best, slower, where)
    # what it loses by: the stage that takes longest beyond the best's same stage (the largest
    # stage of a loser can be one it shares with the best: the same trainer in both); on
    # separate pools one of the trainer's own
    own = [k for k in stages if not (separate and k == "generation")]
    excess = {k: stages[k] - theirs.get(k, 0.0) for k in own}
    top = max(own, key=lambda k: (excess[k], stages[k]))
    if excess[top] <= 0:  # no stage longer than the best's: its largest
        top = max(own, key=stages.get)
    seconds = stages[top]
    reason = {"generation": "waits for generation", "policy update": "training-bound",
              "critic update": "training-bound", "scoring": "scoring-bound",
              "weight sync": "weight sync", "offload": "offloading"}.get(top, top)
    best_separate = best.scenario.placement == "disaggregated"
    if top == "generation" and best_separate and not separate:
        # the best's "generation" is its trainer's wait for samples, not a generation phase:
        # comparing the two would set a whole generation against the part left exposed
        wait_best = theirs.get("generation", 0.0)
        against = (f"where the best generates on its own {best.scenario.rollout_pool} rollout GPUs "
                   "while its trainer trains" + (
                       f", the trainer waiting {seconds_text(wait_best, 0)} of its "
                       f"{seconds_text(best.result.step_seconds, 0)} step for samples"
                       if wait_best > 0.005 * best.result.step_seconds else ""))
    elif theirs.get(top, 0.0) > 0.005 * best.result.step_seconds:
        against = f"against {seconds_text(theirs[top], 0)} in the best"
    else:
        against = "where the best spends none"
    where = (f"{reason} ({top} {seconds_text(seconds, 0)}, {seconds / r.step_seconds:.0%} of its "
             f"step, {against})")
    return _loses(candidate, best, slower, where)


def _loses(candidate: Candidate, best: Candidate, slower: float, where: str) -> str:
    """``why``'s line: how much dearer ``candidate`` is than ``best``, then ``where``, and that
    the two tie when it is :data:`FEWER_MARGIN` dearer or less."""
    r = candidate.result
    if slower <= 1 + FEWER_MARGIN:
        where += (f"; within {FEWER_MARGIN:.0%} of the best, a tie at the simulator's resolution "
                  "(its length levels alone move a step about that much)")
    # the two pay different prices for staleness: the cost ratio is not the steps' ratio
    if abs(candidate.cost / candidate.step - best.cost / best.step) > 0.005:
        return (f"{slower:.2f}x the cost ({seconds_text(r.step_seconds, 0)} per step, "
                f"{candidate.step / best.step:.2f}x the best's step, at a mean staleness of "
                f"{r.staleness:.2f} versions against {best.result.staleness:.2f}): {where}")
    return f"{slower:.2f}x slower ({seconds_text(r.step_seconds, 0)}): {where}"


def format_plan(result: Plan, top: int = 5, width: int = 100) -> str:
    """The best ``top`` plans (step, throughput, MFU and HFU, staleness and its price, memory
    per device, where the time goes), then why the others lose; lines wrapped at spaces to at
    most ``width`` characters (a number is never split), continuation lines indented.

    Raises:
        ValueError: for ``top`` or ``width`` below 1 (``width`` below 40).
    """
    import textwrap

    if not isinstance(result, Plan):
        raise ValueError(f"format_plan: result={result!r} must be a Plan (what plan(...) "
                         "returns).")
    if not (isinstance(top, int) and not isinstance(top, bool) and top >= 1):
        raise ValueError(f"top={top!r}: give 1 or more plans to print.")
    if not (isinstance(width, int) and not isinstance(width, bool) and width >= 40):
        raise ValueError(f"width={width!r}: give 40 or more characters per line.")
    lines = []
    ranked = result.ranked
    for i, c in enumerate(ranked[:top], 1):
        r = c.result
        trainer_mem = sum(r.memory["trainer"].values()) / GB
        rollout_mem = sum(r.memory["rollout"].values()) / GB
        lines.append(f"{i}. {c.name}")
        lines.append(f"   step {seconds_text(r.step_seconds)}, "
                     f"{r.tokens_per_second:,.0f} tokens/s "
                     f"({r.tokens_per_second / c.scenario.cluster.gpus:,.1f} per GPU), MFU "
                     f"{r.mfu:.1%} (training MFU {r.training_mfu:.1%}, HFU {r.training_hfu:.1%}), "
                     + (f"generation {r.generation_share:.0%} of the step"
                        if c.scenario.placement == "colocated" else
                        f"the trainer waits for samples {r.generation_share:.0%} of the step"))
        lines.append(f"   staleness {r.staleness:.2f} versions: {c.samples_per_second:,.2f} samples/s, "
                     f"{seconds_text(c.cost)} per step priced at {c.staleness_penalty:g} extra "
                     "steps per version")
        lines.append(f"   memory per device: trainer {trainer_mem:,.1f} GB, rollout "
                     f"{rollout_mem:,.1f} GB of {r.memory['usable'] / GB:,.1f} GB usable; "
                     + (f"a replica decodes at most {r.memory['slots']:,} sequences at once (the "
                        "engine's max_batch; its KV cache has room for more)"
                        if r.memory["slots"] >= c.scenario.rates.max_batch else
                        f"KV cache room for {r.memory['slots']:,} sequences per replica"))
        lines.append(f"   time: {where_time_goes(r)}")
        host = host_optimizer_seconds(r)
        if host is not None:
            seconds, steps = host
            lines.append(f"   optimizer offloaded: Adam on the hosts' CPUs, {seconds_text(seconds)} "
                         f"an optimizer step x {steps} = {seconds_text(seconds * steps)} of the "
                         f"step, at {c.scenario.rates.host_adam_params_per_second / 1e9:.2g}B "
                         "parameters/s a host (host_adam_params_per_second: measured "
                         f"{HOST_ADAM_MEASURED[0] / 1e9:.2g}-{HOST_ADAM_MEASURED[1] / 1e9:.2g}B on "
                         "Megatron's hybrid optimizer; measure your hosts')")
    others = ranked[top:] + result.refused
    if others:
        lines.append("why the others lose:")
        best = ranked[0]
        for c in others:
            lines.append(f" - {c.name}: {why(c, best)}")
    wrapped = []
    for line in lines:
        indent = " " * (len(line) - len(line.lstrip(" -0123456789.")) + 2)
        wrapped.extend(textwrap.wrap(line, width, subsequent_indent=indent,
                                     break_long_words=False, break_on_hyphens=False))
    return "\n".join(wrapped)


#: The rates (and the staleness price) whose plausible range decides most plans, and the values
#: ``plan --sensitivity`` moves each to, around the calibrated ones (NeMo-RL's: decode step
#: latency 12 ms, training HFU 0.51): a roofline engine (0) to one without CUDA graphs (30 ms), a
#: trainer at half that HFU to the most measured training reaches counting recomputation (the
#: calibration's own bound, ``FITTABLE["train_hfu"]``: 0.65), no to a minute of fixed weight-sync
#: seconds, and a version of staleness free to dear.
SENSITIVITY = {"decode_step_latency": (0.0, 0.01, 0.03),
               "train_hfu": (0.25, 0.4, FITTABLE["train_hfu"][1]),
               "sync_fixed_seconds": (0.0, 10.0, 60.0), "staleness_penalty": (0.0, 0.1, 0.3)}
#: With speculative decoding, the acceptances ``plan --sensitivity`` also tries: below the 0.60
#: fitted on NeMo-RL v0.7's DeepSeek-V3 runs (sampling at temperature 1), and the DeepSeek-V3
#: report's 0.85-0.9 for its multi-token-prediction token (arXiv:2412.19437, section 5.4.3).
DRAFT_ACCEPTANCE_RANGE = (0.4, 0.6, 0.9)


def sensitivity(spec: TransformerSpec, config: RLConfig, workload: Workload, device: Device,
                gpus: int, rates: Rates | None = None, variations: dict | None = None,
                staleness_penalty: float = STALENESS_PENALTY, base: Plan | None = None,
                progress: bool = False, **options) -> list[dict]:
    """Plan again with one rate (or the staleness penalty) changed at a time, the others held at
    ``rates`` (default: the calibrated ones): which plan wins at each value, and whether that
    flips the ranking. ``variations``: ``{rate or "staleness_penalty": values}`` (default
    :data:`SENSITIVITY`); ``base``: the plan at ``rates`` when already made (else it is made);
    ``progress``: a progress bar over the plans (each takes seconds); ``options`` go to
    :func:`plan`.

    Returns:
        one row per (rate, value): ``rate, value, best (its name), step, staleness (its mean,
        versions), cost (the step priced for staleness), behind`` (how much dearer the plan made
        at ``rates`` is at this value than the best: 0 when it stays the best, ``inf`` when it
        no longer fits) ``and flips`` (``behind`` above :data:`FEWER_MARGIN`: another plan wins
        by more than the simulator's resolution; a closer winner is a tie). When the best plan
        offloads its optimizer and ``variations`` is the default, ``host_adam_params_per_second`` is moved too, and with
        speculative decoding ``draft_acceptance`` (:data:`DRAFT_ACCEPTANCE_RANGE`).

    Raises:
        ValueError: for an unknown rate or a value :class:`~rlm_course.cost.phases.Rates` refuses,
            or a ``base`` that is not a Plan of the same model, device and GPU count.
    """
    from dataclasses import fields, replace

    from tqdm.auto import tqdm

    _check_types(spec, config, workload, device, rates)
    rates = _rates_or_calibrated(rates, device)
    variations = SENSITIVITY if variations is None else variations
    if not isinstance(variations, dict):
        raise ValueError(f"sensitivity: variations={variations!r} must be {{rate: values to "
                         "try}, e.g. {'decode_step_latency': [0.0, 0.03]}, or None.")
    known = {f.name for f in fields(Rates)} | {"staleness_penalty"}
    for name, values in variations.items():
        if name not in known:
            raise ValueError(f"sensitivity: {name!r} is not a rate; choose among "
                             f"{', '.join(sorted(known))}.")
        if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
            raise ValueError(f"sensitivity: variations[{name!r}]={values!r} must be a list of "
                             f"values to try, e.g. [{values!r}].")
    if base is None:
        base = plan(spec, config, workload, device, gpus, rates=rates,
                    staleness_penalty=staleness_penalty, **options)
    elif not isinstance(base, Plan):
        raise ValueError(f"sensitivity: base={base!r} must be the Plan that plan(...) returned "
                         "for the same request, or None.")
    else:
        made = base.best.scenario
        if (made.spec.name, made.cluster.device.name, made.cluster.gpus) != (
                spec.name, device.name, gpus):
            raise ValueError(
                f"sensitivity: base is a plan of {made.spec.name} on {made.cluster.gpus} x "
                f"{made.cluster.device.name}, not of this request ({spec.name} on {gpus} x "
                f"{device.name}); pass the Plan made for it, or none.")
    base = base.best
    default = variations is SENSITIVITY
    if default and base.result and base.scenario.trainer_layout.offload:
        # an offloaded optimizer's CPU rate decides such a plan: the measured range and above
        rate = rates.host_adam_params_per_second
        variations = {**variations,
                      "host_adam_params_per_second": (HOST_ADAM_MEASURED[0], rate, 4 * rate)}
    if default and rates.speculative_tokens:
        # a drafted token's acceptance decides how much speculative decoding buys: lower than
        # fitted, as fitted on NeMo-RL v0.7's DeepSeek-V3 runs, the DeepSeek-V3 report's
        variations = {**variations, "draft_acceptance": DRAFT_ACCEPTANCE_RANGE}
    rows = []
    todo = [(name, value) for name, values in variations.items() for value in values]
    for name, value in tqdm(todo, desc="sensitivity: planning again", disable=not progress,
                            unit="plan"):
        moved = rates if name == "staleness_penalty" else Rates.from_dict({name: value}, rates)
        penalty = value if name == "staleness_penalty" else staleness_penalty
        result = plan(spec, config, workload, device, gpus, rates=moved,
                      staleness_penalty=penalty, **options)
        best = result.best
        # the plan above, priced at the moved rate: a new best within FEWER_MARGIN of it is a
        # tie at the simulator's resolution, not a flip (layouts behind one rollout pool tie);
        # simulated here when the search pruned it
        mine = next((c for c in result.candidates if c.name == base.name), None)
        if mine is None:
            s = replace(base.scenario, rates=moved)
            mine = Candidate(base.name, s, simulate(
                s, length_buckets=options.get("length_buckets", LENGTH_BUCKETS)),
                staleness_penalty=penalty)
        behind = max(0.0, mine.cost / best.cost - 1) if mine.result is not None else math.inf
        rows.append({"rate": name, "value": value, "best": best.name, "step": best.step,
                     "staleness": best.result.staleness if best.result else math.nan,
                     "cost": best.cost, "behind": behind, "flips": behind > FEWER_MARGIN})
    return rows
