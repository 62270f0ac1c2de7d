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
then the other layouts in the best mode (offloading the trainer when the rollout's KV cache
would not fit beside it); disaggregated, first the best layouts in the streaming
asynchronous mode at the two splits whose pools' estimates balance best, then, at the better
split, every mode with the best layouts and the other layouts in the best mode.
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
from rlm_course.algorithms import RLConfig
from rlm_course.cost.layouts import DoesNotFit, Layout, check_training, kv_slots, training_memory
from rlm_course.cost.phases import Cluster, DecodeCost, Rates, TrainerCost
from rlm_course.cluster.simulator import MODES, Scenario, SimResult, memory_plan, simulate

GB = 1e9
ROLLOUT_SHARES = (1 / 4, 3 / 8, 1 / 2, 5 / 8, 3 / 4)
COLOCATED_MODES = ("sync", "fused")
DISAGGREGATED_MODES = ("sync", "one-step-off", "async")


#: Extra training steps per version of mean staleness to reach the same accuracy: the planner's
#: default price of asynchrony (an assumption; chapter 13 measures the toy's cost, published runs
#: at staleness <= 1 report accuracy close to synchronous; ``plan(staleness_penalty=...)``).
STALENESS_PENALTY = 0.1


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


def trainer_layouts(spec: TransformerSpec, config: RLConfig, device: Device, devices: int,
                    seq_len: int, micro_batch_tokens: int,
                    memory_fraction: float = 0.9) -> tuple[list[Layout], list[str]]:
    """The trainer layouts of ``devices`` devices that fit memory (with the critic and the
    reference ``config`` holds), and the reasons the others do not: TP in 1, 2, 4, 8 (within a
    node), PP in 1, 2, 4, 8, 16 (at most the layers), EP in powers of two dividing the experts
    (MoE), data parallelism over the rest; ZeRO-3 when there is no model parallelism, ZeRO-1 with
    it (Megatron's distributed optimizer, with its fp32 main gradients: ``6 + 12 / d`` bytes per
    parameter); recomputation on; optimizer offload tried when nothing else fits."""
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
                    megatron = tp * pp > 1
                    lay = Layout(dp=dp, tp=tp, pp=pp, ep=ep, zero=1 if megatron else 3,
                                 recompute=True, micro_batch_tokens=micro_batch_tokens,
                                 offload=offload, main_grads_fp32=megatron)
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
    """
    fabric = Cluster(device, max(devices, 2)).fabric(rates)
    w = workload
    mean, longest = max(1, round(w.mean_response_len)), w.max_response_len
    slots = kv_slots(spec, tp, device, w.prompt_len + mean, rates.memory_fraction, 0.0,
                     rates.max_batch, w.weight_bytes, w.kv_bytes)
    per_replica = -(-w.responses // (devices // tp))
    batch, waves = min(per_replica, slots), -(-per_replica // slots)
    cost = DecodeCost(spec, device, tp, rates, fabric if tp > 1 else None, w)
    body = waves * cost.seconds(mean, batch, batch * (w.prompt_len + 1))
    return body + cost.seconds(max(0, longest - mean), 1, w.prompt_len + mean)


def _best_generation(spec, workload, device, devices, rates, keep=2):
    candidates = [t for t in (1, 2, 4, 8, 16, 32) if devices % t == 0 and spec.n_head % t == 0]
    times, refused = {}, []
    for tp in candidates:
        try:
            times[tp] = generation_estimate(spec, workload, device, devices, tp, rates)
        except DoesNotFit as err:
            refused.append(str(err))
    if not times:
        return [], refused or [f"no generation tp in {tuple(candidates)} divides {devices} devices "
                               f"and {spec.name}'s {spec.n_head} heads."], math.inf
    return sorted(times, key=lambda t: (times[t], t))[:keep], [], min(times.values())


def plan(spec: TransformerSpec, config: RLConfig, workload: Workload, device: Device, gpus: int,
         rates: Rates | None = None, placements=("colocated", "disaggregated"),
         modes=None, length_buckets: int = 64, keep: int = 2,
         staleness_penalty: float = STALENESS_PENALTY) -> Plan:
    """Search placements x layouts x execution modes for ``gpus`` devices (see the module
    docstring), with ``rates`` (default: the rates calibrated on published runs for ``device``,
    :func:`rlm_course.cluster.calibration.calibrated_rates`), ranking by the step priced for
    staleness (:attr:`Candidate.cost`, ``staleness_penalty`` per version).

    Raises:
        DoesNotFit: if no candidate fits memory (the message gives the closest refusals and
            what to change: more devices, a larger device, shorter sequences).
        ValueError: for an unknown placement or mode, ``gpus < 1``, modes that none of the
            placements runs (fused needs colocated, streaming modes disaggregated), or a
            disaggregated-only search on one device, or a negative staleness penalty.
    """
    if rates is None:
        from rlm_course.cluster.calibration import calibrated_rates

        rates = calibrated_rates(device)
    if not (staleness_penalty >= 0 and math.isfinite(staleness_penalty)):
        raise ValueError(f"staleness_penalty={staleness_penalty!r} must be a finite number >= 0 "
                         "(extra steps per version of staleness; 0 prices staleness at nothing).")
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
            c = Candidate(label, s, simulate(s, length_buckets=length_buckets),
                          staleness_penalty=staleness_penalty)
        out.candidates.append(c)
        return c

    def search(rollout, names, first_only=False):
        (trainers, t_refused, _), (gens, g_refused, _) = layouts_for(rollout)
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

        def runs(tp, name):
            return not (MODES[name].stage_fusion and pool_devices // tp < 2)

        # every mode with the best-ranked layouts, then the other layouts in the best mode
        first = [evaluate(rollout, gens[0], trainers[0], name) for name in names
                 if runs(gens[0], name)]
        simulated = [c for c in first if c.result]
        if not simulated:
            return first
        mode = min(simulated, key=lambda c: c.cost).scenario.mode
        name = next(n for n in names if MODES[n] == mode)
        rest = [evaluate(rollout, tp, lay, name) for tp in gens for lay in trainers
                if (tp, lay) != (gens[0], trainers[0]) and runs(tp, name)]
        return first + rest

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
        # rank the splits by the longer of the two pools' estimates (an overlapped step), then
        # simulate the two best in the probe mode, then every layout and mode at the better one
        estimate = {r: max(layouts_for(r)[0][2], layouts_for(r)[1][2]) for r in splits}
        shortlist = sorted(splits, key=lambda r: estimate[r])[:2]
        tried = {r: min((c.step for c in search(r, [probe], first_only=True)), default=math.inf)
                 for r in shortlist}
        best = min(tried, key=tried.get)
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
    r = candidate.result
    slower = candidate.cost / best.cost
    if candidate.step <= best.step:  # faster per step, but its staleness costs more steps
        return (f"{slower:.2f}x the cost: {r.step_seconds:,.0f} s per step at a mean staleness of "
                f"{r.staleness:.2f} versions (priced at {candidate.staleness_penalty:g} extra "
                "steps per version)")
    top, seconds = max(r.stages.items(), key=lambda kv: kv[1])
    reason = {"generation": "waits for generation", "policy update": "training-bound",
              "critic update": "training-bound", "scoring": "scoring-bound",
              "weight sync": "weight sync", "offload": "offloading"}.get(top, top)
    return (f"{slower:.2f}x slower ({r.step_seconds:,.0f} s): {reason} "
            f"({seconds / r.step_seconds:.0%} of its step)")


def format_plan(result: Plan, top: int = 5) -> str:
    """The best ``top`` plans (step, throughput, MFU and HFU, staleness and its price, memory
    per device, where the time goes), then why the others lose."""
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
                     f"{r.mfu:.1%} (training MFU {r.training_mfu:.1%}, HFU {r.training_hfu:.1%}), "
                     f"generation {r.generation_share:.0%} of the step")
        lines.append(f"   staleness {r.staleness:.2f} versions: {c.samples_per_second:,.2f} samples/s, "
                     f"{c.cost:,.1f} s per step priced at {c.staleness_penalty:g} extra steps per "
                     "version")
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


#: The rates (and the staleness price) whose plausible range decides most plans: decode latency
#: per step (0 for a roofline engine; tens of ms measured under vLLM), training HFU, the weight
#: sync's fixed seconds, and how much a version of staleness costs.
SENSITIVITY = {"decode_step_latency": (0.0, 0.01, 0.03), "train_hfu": (0.2, 0.3, 0.5),
               "sync_fixed_seconds": (0.0, 10.0, 60.0), "staleness_penalty": (0.0, 0.1, 0.3)}


def sensitivity(spec: TransformerSpec, config: RLConfig, workload: Workload, device: Device,
                gpus: int, rates: Rates | None = None, variations: dict | None = None,
                staleness_penalty: float = STALENESS_PENALTY, base: Plan | None = None,
                **options) -> list[dict]:
    """Plan again with one rate (or the staleness penalty) changed at a time, the others held at
    ``rates`` (default: the calibrated ones): which plan wins at each value, and whether that
    flips the ranking. ``variations``: ``{rate or "staleness_penalty": values}`` (default
    :data:`SENSITIVITY`); ``base``: the plan at ``rates`` when already made (else it is made);
    ``options`` go to :func:`plan`.

    Returns:
        one row per (rate, value): ``rate, value, best (its name), step, cost, flips`` (the best
        plan differs from the one at the calibrated rates).

    Raises:
        ValueError: for an unknown rate or a value :class:`~rlm_course.cost.phases.Rates` refuses.
    """
    from dataclasses import fields, replace

    if rates is None:
        from rlm_course.cluster.calibration import calibrated_rates

        rates = calibrated_rates(device)
    variations = SENSITIVITY if variations is None else variations
    known = {f.name for f in fields(Rates)} | {"staleness_penalty"}
    for name in variations:
        if name not in known:
            raise ValueError(f"sensitivity: {name!r} is not a rate; choose among "
                             f"{', '.join(sorted(known))}.")
    if base is None:
        base = plan(spec, config, workload, device, gpus, rates=rates,
                    staleness_penalty=staleness_penalty, **options)
    base = base.best
    rows = []
    for name, values in variations.items():
        for value in values:
            if name == "staleness_penalty":
                result = plan(spec, config, workload, device, gpus, rates=rates,
                              staleness_penalty=value, **options)
            else:
                result = plan(spec, config, workload, device, gpus,
                              rates=replace(rates, **{name: value}),
                              staleness_penalty=staleness_penalty, **options)
            best = result.best
            rows.append({"rate": name, "value": value, "best": best.name, "step": best.step,
                         "cost": best.cost, "flips": best.name != base.name})
    return rows
