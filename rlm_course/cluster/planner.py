"""A planner for an RL run on a cluster: which placement, which layout for each role and which
execution mode give the shortest iteration, and why the others lose.

:func:`plan` searches, for a model, an algorithm, a workload and ``gpus`` devices of a catalog
type:

* **placements**: colocated (every role on every device) and disaggregated pools (the rollout
  gets 1/4, 3/8, 1/2, 5/8 or 3/4 of the devices, whole nodes where the pool is at least one);
* **generation layouts**: tensor-parallel replicas of 1-32 devices that fit the weights and at
  least one sequence's KV cache (:func:`~rlm_course.cost.layouts.kv_slots`);
* **trainer layouts**: TP x PP (x EP for MoE) with data parallelism over the rest, ZeRO-3/FSDP
  when there is no model parallelism and ZeRO-1 with it, activation recomputation, packed
  micro-batches (:class:`~rlm_course.cost.layouts.Layout`), kept when they fit memory
  (:func:`~rlm_course.cost.layouts.check_training`);
* **execution modes**: synchronous and stage-fused (colocated); synchronous, one step
  off-policy and streaming asynchronous with partial rollouts (disaggregated)
  (:data:`~rlm_course.cluster.simulator.MODES`).

To stay fast it prunes: the trainer layouts of each pool size are ranked by the trainer's own
seconds on the workload (:class:`~rlm_course.cost.phases.TrainerCost`), the generation layouts
by the decode-time estimate of :func:`~rlm_course.cost.layouts.choose_generation_tp`, and only
the best two of each are simulated whole (:func:`~rlm_course.cluster.simulator.simulate`, with
the response lengths rounded to 64 levels): colocated, crossed with its modes (offloading the
trainer when the rollout's KV cache would not fit beside it); disaggregated, first each split with
the best layouts in the streaming asynchronous mode, then every layout and mode at the best split.
Every candidate that does not fit memory is kept with its reason.

:func:`format_plan` prints the best few with their step time, throughput, memory per device and
where the time goes, then why the others lose. ``python -m rlm_course plan`` and
:class:`rlm_course.cluster.planner_widget.PlannerWidget` call these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rlm_course.cost.anatomy import Workload
from rlm_course.cost.architectures import TransformerSpec
from rlm_course.cost.hardware import Device
from rlm_course.rl.algorithms import RLConfig
from rlm_course.cost.layouts import (DoesNotFit, Layout, check_training, choose_generation_tp,
                                        training_memory)
from rlm_course.cost.phases import Cluster, Rates, TrainerCost
from rlm_course.cluster.simulator import MODES, Scenario, SimResult, memory_plan, simulate

GB = 1e9
ROLLOUT_SHARES = (1 / 4, 3 / 8, 1 / 2, 5 / 8, 3 / 4)
COLOCATED_MODES = ("sync", "fused")
DISAGGREGATED_MODES = ("sync", "one-step-off", "async")


@dataclass
class Candidate:
    """One evaluated plan: its scenario and simulation, or why it was refused."""

    name: str
    scenario: Scenario | None = None
    result: SimResult | None = None
    refused: str = ""

    @property
    def step(self) -> float:
        return self.result.step_seconds if self.result else math.inf


@dataclass
class Plan:
    """What :func:`plan` returns: every candidate, the feasible ones best first."""

    candidates: list[Candidate] = field(default_factory=list)

    @property
    def ranked(self) -> list[Candidate]:
        return sorted((c for c in self.candidates if c.result), key=lambda c: c.step)

    @property
    def refused(self) -> list[Candidate]:
        return [c for c in self.candidates if c.refused]

    @property
    def best(self) -> Candidate:
        return self.ranked[0]


def _divisors(n: int, options) -> list[int]:
    return [k for k in options if k <= n and n % k == 0]


def trainer_layouts(spec: TransformerSpec, config: RLConfig, device: Device, devices: int,
                    seq_len: int, micro_batch_tokens: int,
                    memory_fraction: float = 0.9) -> tuple[list[Layout], list[str]]:
    """The trainer layouts of ``devices`` devices that fit memory (with the critic and the
    reference ``config`` holds), and the reasons the others do not: TP in 1, 2, 4, 8 (within a
    node), PP in 1, 2, 4, 8, 16 (at most the layers), EP in powers of two dividing the experts
    (MoE), data parallelism over the rest; ZeRO-3 when there is no model parallelism, ZeRO-1 with
    it (Megatron's distributed optimizer); recomputation on; optimizer offload tried when nothing
    else fits."""
    if not (isinstance(devices, int) and devices >= 1):
        raise ValueError(f"devices={devices!r} must be a positive integer.")
    fits, refused = [], []
    tps = _divisors(devices, [t for t in (1, 2, 4, 8) if t <= device.devices_per_node
                              and spec.n_head % t == 0])
    pps = [p for p in (1, 2, 4, 8, 16) if p <= spec.n_layer]
    eps = [e for e in (1, 2, 4, 8, 16, 32, 64) if not spec.is_moe and e == 1
           or spec.is_moe and spec.n_experts % e == 0]
    for offload in (False, True):
        for tp in tps:
            for pp in pps:
                if devices % (tp * pp):
                    continue
                dp = devices // (tp * pp)
                for ep in eps:
                    if (tp * dp) % ep:
                        continue
                    lay = Layout(dp=dp, tp=tp, pp=pp, ep=ep, zero=3 if tp * pp == 1 else 1,
                                 recompute=True, micro_batch_tokens=micro_batch_tokens,
                                 offload=offload)
                    try:
                        check_training(spec, lay, device, seq_len, memory_fraction, "trainer",
                                       _extra(spec, config, lay, seq_len))
                        fits.append(lay)
                    except DoesNotFit as err:
                        refused.append(str(err))
        if fits:
            break
    return fits, refused


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
    seq = workload.prompt_len + workload.max_response_len
    fitting, refused = trainer_layouts(spec, config, device, devices, seq, 2 * seq,
                                       rates.memory_fraction)
    fabric = Cluster(device, devices).fabric(rates) if devices > 1 else None
    scored = []
    for lay in fitting:
        cost = TrainerCost(spec, config, lay, device, rates, fabric, workload.prompt_len)
        scored.append((sum(cost.seconds(workload.lengths).values()), lay))
    scored.sort(key=lambda x: x[0])
    return [lay for _, lay in scored[:keep]], refused


def _best_generation(spec, workload, device, devices, rates, keep=2):
    fabric = Cluster(device, max(devices, 2)).fabric(rates)
    candidates = [t for t in (1, 2, 4, 8, 16, 32) if devices % t == 0 and spec.n_head % t == 0]
    link = fabric.link(min(8, device.devices_per_node))
    tokens = workload.prompt_len + round(workload.mean_response_len)
    try:
        _, times = choose_generation_tp(spec, device, devices, workload.responses, tokens, link,
                                        candidates, rates.memory_fraction, rates.decode_bandwidth)
    except DoesNotFit as err:
        return [], [str(err)]
    return sorted(times, key=lambda t: (times[t], t))[:keep], []


def plan(spec: TransformerSpec, config: RLConfig, workload: Workload, device: Device, gpus: int,
         rates: Rates | None = None, placements=("colocated", "disaggregated"),
         modes=None, length_buckets: int = 64, keep: int = 2) -> Plan:
    """Search placements x layouts x execution modes for ``gpus`` devices (see the module
    docstring).

    Raises:
        DoesNotFit: if no candidate fits memory (the message gives the closest refusals and
            what to change: more devices, a larger device, shorter sequences).
        ValueError: for an unknown placement or mode, ``gpus < 1``, modes that none of the
            placements runs (fused needs colocated, streaming modes disaggregated), or a
            disaggregated-only search on one device.
    """
    rates = rates or Rates()
    if not (isinstance(gpus, int) and gpus >= 1):
        raise ValueError(f"gpus={gpus!r} must be a positive integer.")
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
    for m in modes or ():
        if m not in MODES:
            raise ValueError(f"unknown mode {m!r}; choose among {', '.join(MODES)}.")
    runnable = {"colocated": [m for m in (modes or COLOCATED_MODES) if not MODES[m].streaming],
                "disaggregated": [m for m in (modes or DISAGGREGATED_MODES)
                                  if not MODES[m].stage_fusion]}
    if not any(runnable[p] for p in placements):
        raise ValueError(f"modes {', '.join(modes)} do not run on the {' or '.join(placements)} "
                         "placement: stage fusion (fused) needs colocated devices, the streaming "
                         "modes (async, async-eta2) need disaggregated pools.")
    if placements == ("disaggregated",) and gpus < 2:
        raise ValueError(f"gpus={gpus}: a disaggregated placement needs at least 2 devices (one "
                         "per pool); use the colocated placement.")
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
        pool = "colocated" if rollout is None else f"disaggregated {rollout}:{gpus - rollout}"
        label = (f"{pool}, generation tp{tp}, trainer {lay.describe()}, {name}"
                 + (", offload" if offload else ""))
        for c in out.candidates:
            if c.name == label:
                return c
        try:
            s = Scenario(spec, config, workload, cluster,
                         placement="colocated" if rollout is None else "disaggregated",
                         rollout_gpus=rollout, generation_tp=tp, trainer=lay, mode=MODES[name],
                         rates=rates, offload_trainer=offload)
            memory_plan(s)
        except DoesNotFit as err:
            if rollout is None and not offload:  # a hybrid engine can offload the trainer
                return evaluate(rollout, tp, lay, name, True)
            c = Candidate(label, refused=str(err))
        else:
            c = Candidate(label, s, simulate(s, length_buckets=length_buckets))
        out.candidates.append(c)
        return c

    def search(rollout, names, first_only=False):
        (trainers, t_refused), (gens, g_refused) = layouts_for(rollout)
        pool = "colocated" if rollout is None else f"disaggregated {rollout}:{gpus - rollout}"
        if not trainers:
            out.candidates.append(Candidate(f"{pool}: trainer", refused=_closest(t_refused)))
            return []
        if not gens:
            out.candidates.append(Candidate(f"{pool}: generation", refused=_closest(g_refused)))
            return []
        if first_only:
            trainers, gens = trainers[:1], gens[:1]
        pool_devices = gpus if rollout is None else rollout
        return [evaluate(rollout, tp, lay, name) for tp in gens for lay in trainers for name in names
                if not (MODES[name].stage_fusion and pool_devices // tp < 2)]

    if "colocated" in placements:
        search(None, runnable["colocated"])
    if "disaggregated" in placements and gpus >= 2 and runnable["disaggregated"]:
        splits = []
        for share in ROLLOUT_SHARES:
            rollout = round(gpus * share)
            if gpus >= 2 * node:  # whole nodes for each pool
                rollout = max(node, min(gpus - node, round(gpus * share / node) * node))
            if 0 < rollout < gpus and rollout not in splits:
                splits.append(rollout)
        names = runnable["disaggregated"]
        probe = "async" if "async" in names else names[-1]
        tried = {r: min((c.step for c in search(r, [probe], first_only=True)), default=math.inf)
                 for r in splits}
        best = min(tried, key=tried.get)  # then every layout and mode at the best split
        if tried[best] < math.inf:
            search(best, names)
    if not out.ranked:
        closest = _closest([c.refused for c in out.candidates]).rstrip(".")
        raise DoesNotFit(f"no layout of {spec.name} fits {gpus} x {device.name} for this workload; "
                         f"the nearest miss: {closest}. Use more devices, a device with more "
                         "memory, or shorter sequences.")
    return out


def _closest(reasons: list[str]) -> str:
    """The refusal that asked for the least memory (the nearest miss), or the first."""
    if not reasons:
        return "nothing fits"

    def need(r: str) -> float:
        import re

        m = re.search(r"needs ([\d,.]+) GB", r)
        return float(m.group(1).replace(",", "")) if m else math.inf

    return min(reasons, key=need)


def where_time_goes(result: SimResult) -> str:
    """The step's largest parts, as shares."""
    parts = sorted(result.stages.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v / result.step_seconds:.0%}" for k, v in parts if v > 0.005 * result.step_seconds)


def why(candidate: Candidate, best: Candidate) -> str:
    """Why a candidate loses to ``best``: refused for memory, or slower, and by what."""
    if candidate.refused:
        return f"does not fit: {candidate.refused}"
    r, b = candidate.result, best.result
    slower = r.step_seconds / b.step_seconds
    top, seconds = max(r.stages.items(), key=lambda kv: kv[1])
    reason = {"generation": "waits for generation", "policy update": "training-bound",
              "critic update": "training-bound", "scoring": "scoring-bound",
              "weight sync": "weight sync", "offload": "offloading"}.get(top, top)
    return (f"{slower:.2f}x slower ({r.step_seconds:,.0f} s): {reason} "
            f"({seconds / r.step_seconds:.0%} of its step)")


def format_plan(result: Plan, top: int = 5) -> str:
    """The best ``top`` plans (step, throughput, MFU, memory per device, where the time goes),
    then why the others lose."""
    if not (isinstance(top, int) and top >= 1):
        raise ValueError(f"top={top!r}: give 1 or more plans to print.")
    lines = []
    ranked = result.ranked
    for i, c in enumerate(ranked[:top], 1):
        r = c.result
        trainer_mem = sum(r.memory["trainer"].values()) / GB
        rollout_mem = sum(r.memory["rollout"].values()) / GB
        lines.append(f"{i}. {c.name}")
        lines.append(f"   step {r.step_seconds:,.1f} s, {r.tokens_per_second:,.0f} tokens/s "
                     f"({r.tokens_per_second / c.scenario.cluster.gpus:,.1f} per GPU), MFU "
                     f"{r.mfu:.1%}, generation {r.generation_share:.0%} of the step")
        lines.append(f"   memory per device: trainer {trainer_mem:,.1f} GB, rollout "
                     f"{rollout_mem:,.1f} GB of {r.memory['usable'] / GB:,.1f} GB usable; "
                     f"{r.memory['slots']} sequences per replica")
        lines.append(f"   time: {where_time_goes(r)}")
    others = ranked[top:] + result.refused
    if others:
        lines.append("why the others lose:")
        best = ranked[0]
        for c in others:
            lines.append(f" - {c.name}: {why(c, best)}")
    return "\n".join(lines)
