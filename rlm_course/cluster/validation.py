"""Does the simulator tell the truth? Two checks.

**(a) Against measured runs.** :func:`check_real_run` takes the record of a run (its model,
workload, algorithm, cluster, the rates measured on it and the seconds each stage took),
simulates the same iteration and compares stage by stage. The course's own single-process GRPO
and PPO runs on this machine are such runs: :func:`course_run_record` runs a few iterations of
:class:`~rlm_course.rl.trainer.RLTrainer` and measures, with micro-benchmarks of the same passes
at the same shapes interleaved with them (:class:`TinyRateBench`), the rates they ran at: a decode step's fixed
latency and compute rate (from ``generate`` at two batch sizes), a scoring forward's and a
training step's fraction of the catalog's peak. The simulator then has to get the composition
right: how many decode steps, which scoring forwards the algorithm runs, how many gradient
steps, what a prefill costs. Multi-process runs (``torch.distributed``, Ray) produce the same
kind of record, with measured link alpha and beta, and go through the same function.

The course's sampler and trainer compute on padded rectangles (every row of a batch runs until
its longest response ends), so a course record's workload gives every response the batch's
response columns, and its rates say ``static_batching``.

**(b) Against published figures.** ``data/published/rl_systems.json`` holds figures from the RL
systems of the reference survey (verl's one-step-off and fully-async recipes, AReaL's synchronous
against asynchronous hours, NeMo-RL's on-policy against one-step-off step times, verl's
DeepSeek-V3 rollout and step seconds, generation shares of long chain-of-thought runs), each with
its source, the **inputs** the source gives (model, devices, batch, lengths, layouts, mode, and
where it publishes one, the per-stage seconds of its baseline run) and the **assumptions** for
what it leaves open (response-length distribution, batch where not given, efficiencies), and the
tolerance the comparison allows. :func:`reproduce` builds the baseline and target scenarios,
**calibrates** the rates on the baseline's published stage seconds when there are some
(:func:`calibrate`: the efficiency of generation, scoring and updates scaled until the simulated
baseline matches, the rest of the step a fixed overhead), simulates both, and reports predicted
against published. The tests check every figure's direction, and its size within the tolerance
for the figures recorded as reproduced; a figure recorded as not reproduced carries the reason.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import torch

from rlm_course.cost.anatomy import Workload
from rlm_course.cost.architectures import TransformerSpec, from_model_config, get_spec
from rlm_course.cost.hardware import Device, get_device
from rlm_course.cost.comm import Link
from rlm_course.rl.algorithms import preset
from rlm_course.cost.layouts import Layout
from rlm_course.cost.phases import Cluster, Rates
from rlm_course.cluster.simulator import MODES, Mode, Scenario, SimResult, algorithm, simulate
from rlm_course.utils import best_seconds, data_dir

#: Stages compared between a run's timers and the simulation (the trainer's ``training`` is the
#: simulator's policy and critic updates together).
COMPARED = ("generation", "scoring", "training")


# ---------------------------------------------------------------------- (a) measured runs
class TinyRateBench:
    """Micro-benchmarks of the passes of a course iteration at its shapes, to measure the rates
    the course's tiny model runs at on this machine (``prompts (batch, P)`` with ``mask``,
    ``response_len`` response columns, ``minibatch_rows`` rows per gradient step):

    * **decode**: :func:`~rlm_course.lm.sampling.generate` with an end token that never comes,
      for 1 and ``response_len`` new tokens, at batch 1 and at the full batch; the difference
      divided by the extra steps is one decode step (forward and sampling), ``t(b)``; with
      ``t(b) = latency + b F_1 / (peak x decode_mfu)`` the two batch sizes give both;
    * **scoring**: one :func:`~rlm_course.lm.sampling.response_log_probs` pass over the batch at
      ``P + response_len`` columns: ``forward_mfu = FLOPs / (peak x seconds)``;
    * **training**: one gradient step (log-probs with entropy, the clipped loss, backward,
      clipping, AdamW) on ``minibatch_rows`` rows: ``train_hfu = 3 x forward FLOPs / (peak x
      seconds)``.

    FLOPs by :func:`~rlm_course.cost.architectures.teacher_forced_flops` and
    :meth:`~rlm_course.cost.architectures.TransformerSpec.forward_flops_per_token`; ``peak`` is
    ``device.peak_flops`` (the catalog's measured peak of this machine). :meth:`run` times each
    benchmark once and keeps the fastest time so far, so that calls interleaved with the run
    being measured see the same machine.
    """

    def __init__(self, model, prompts: torch.Tensor, mask: torch.Tensor, response_len: int,
                 device: Device, config, minibatch_rows: int, tokenizer) -> None:
        from rlm_course.lm.sampling import generate

        self.model, self.prompts, self.mask = model, prompts, mask
        self.response_len, self.device, self.config = response_len, device, config
        self.tokenizer, self.rows = tokenizer, minibatch_rows
        self.spec = from_model_config(model.config)
        self.best: dict[str, float] = {}
        rollout = generate(model, prompts, mask, response_len, eos_id=-1, pad_id=tokenizer.pad_id,
                           generator=torch.Generator().manual_seed(0))
        self.rollout = rollout
        self.trained = copy.deepcopy(model).train()
        self.optimizer = torch.optim.AdamW(self.trained.parameters(), lr=0.0)
        self._train_step()  # AdamW allocates its state

    def _generate(self, rows: int, k: int) -> None:
        from rlm_course.lm.sampling import generate

        generate(self.model, self.prompts[:rows], self.mask[:rows], k, eos_id=-1,
                 pad_id=self.tokenizer.pad_id, generator=torch.Generator().manual_seed(0))

    def _train_step(self) -> None:
        from rlm_course.lm.sampling import response_log_probs
        from rlm_course.rl.losses import policy_loss

        r, c = self.rollout, self.config
        rows = slice(0, self.rows)
        log_probs, _ = response_log_probs(self.trained, r.tokens[rows], r.attention_mask[rows],
                                          r.prompt_len, with_entropy=True)
        loss, _ = policy_loss(log_probs, log_probs.detach(), torch.ones(self.rows) / 2,
                              r.response_mask[rows], c.ratio_level, c.clip_eps, c.clip_high,
                              c.loss_agg, self.response_len)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.trained.parameters(), 1.0)
        self.optimizer.step()

    def run(self) -> None:
        """Time every benchmark once; keep the fastest of all runs so far."""
        from rlm_course.lm.sampling import response_log_probs

        self.model.eval()
        batch, k = self.prompts.shape[0], max(2, self.response_len)
        r = self.rollout
        benches = {
            "decode 1 x 1": lambda: self._generate(1, 1),
            f"decode 1 x {k}": lambda: self._generate(1, k),
            "decode b x 1": lambda: self._generate(batch, 1),
            f"decode b x {k}": lambda: self._generate(batch, k),
            "scoring": lambda: response_log_probs(self.model, r.tokens, r.attention_mask, r.prompt_len),
            "training": self._train_step,
        }
        with torch.no_grad():
            for name, fn in benches.items():
                if name == "training":
                    continue
                self.best[name] = min(self.best.get(name, float("inf")), best_seconds(fn, 1))
        self.best["training"] = min(self.best.get("training", float("inf")),
                                    best_seconds(self._train_step, 1))

    def rates(self) -> Rates:
        """The rates of the fastest timings: :class:`~rlm_course.cost.phases.Rates` with
        ``static_batching`` (the course's sampler runs rows in lockstep) and the memory-bandwidth
        term left at 1 (the tiny model's decode is compute- and latency-bound)."""
        from rlm_course.cost.architectures import teacher_forced_flops

        b, k, peak = self.prompts.shape[0], max(2, self.response_len), self.device.peak_flops
        t1 = (self.best[f"decode 1 x {k}"] - self.best["decode 1 x 1"]) / (k - 1)
        tb = (self.best[f"decode b x {k}"] - self.best["decode b x 1"]) / (k - 1)
        f1 = self.spec.forward_flops_per_token(self.prompts.shape[1] + k // 2)
        per_flop = max(tb - t1, 1e-12) / (f1 * (b - 1))
        seq = self.rollout.tokens.shape[1]
        return Rates(
            train_hfu=min(1.0, 3 * teacher_forced_flops(self.spec, seq, self.rows)
                          / (peak * self.best["training"])),
            forward_mfu=min(1.0, teacher_forced_flops(self.spec, seq, b) / (peak * self.best["scoring"])),
            decode_mfu=min(1.0, 1 / (per_flop * peak)), decode_bandwidth=1.0,
            decode_step_latency=max(0.0, t1 - f1 * per_flop), static_batching=True)


def course_run_record(variant: str = "grpo", rounds: int = 4, task_name: str = "addition",
                      seed: int = 0) -> dict:
    """Run ``rounds`` iterations of the course's trainer (the warm-start policy of ``task_name``,
    preset ``variant``) on this machine, each followed by one round of :class:`TinyRateBench`
    at the shapes the iterations ran; return the record :func:`check_real_run` takes, with the
    fastest iteration's seconds per stage and the rates of the fastest benchmark times (the
    least disturbed by whatever else the machine runs).

    Raises:
        ValueError: for a preset with dynamic sampling (its rounds vary from step to step).
    """
    from rlm_course.lm.tokenizer import CharTokenizer
    from rlm_course.rl.runs import load_sft_policy
    from rlm_course.rl.trainer import RLTrainer
    from rlm_course.tasks import get_task

    config = preset(variant, eval_every=10**6, seed=seed)
    if config.dynamic_sampling:
        raise ValueError(f"{variant}: dynamic sampling runs a varying number of generation rounds; "
                         "validate a preset without it.")
    task, tokenizer = get_task(task_name), CharTokenizer()
    policy, _ = load_sft_policy(task, tokenizer, progress=False, log=lambda *a: None)
    trainer = RLTrainer(policy, task, tokenizer, config, [])
    device = get_device("this-machine")
    rows, bench = [], None
    problems = task.problems(config.prompts_per_step * config.group_size, seed)
    for _ in range(rounds):
        rows.append(trainer.step())
        if bench is None:
            prompt_len, response_len = rows[0]["prompt_columns"], rows[0]["response_columns"]
            prompts, mask = tokenizer.encode_prompts([pr.prompt for pr in problems])
            prompts, mask = _pad_left(prompts, mask, prompt_len, tokenizer.pad_id)
            bench = TinyRateBench(copy.deepcopy(trainer.policy), prompts, mask, response_len,
                                  device, config, -(-prompts.shape[0] // config.minibatches),
                                  tokenizer)
        bench.run()
    shapes = {(r["prompt_columns"], r["response_columns"]) for r in rows}
    if len(shapes) != 1:  # keep the iterations of the benchmarked shape
        rows = [r for r in rows if (r["prompt_columns"], r["response_columns"])
                == (prompt_len, response_len)]
    best = {s: min(r[f"seconds_{s}"] for r in rows) for s in COMPARED + ("reward",)}
    verifier = best_seconds(lambda: [task.verify(pr, "1") for pr in problems], 3) / len(problems)
    rates = dataclasses.replace(bench.rates(), reward_seconds=verifier)
    return {
        "model": {"model_config": policy.config.to_dict()},
        "device": "this-machine", "gpus": 1,
        "algorithm": {"preset": variant, "minibatches": config.minibatches,
                      "ppo_epochs": config.ppo_epochs},
        "workload": {"prompts": config.prompts_per_step, "group_size": config.group_size,
                     "prompt_len": prompt_len, "response_len": response_len,
                     "weight_bytes": 4, "kv_bytes": 4},
        "placement": "colocated", "mode": "sync",
        "rates": _rates_dict(rates),
        "measured": best,
    }


def _pad_left(prompts: torch.Tensor, mask: torch.Tensor, columns: int, pad_id: int):
    """Left-pad (or cut) a prompt batch to ``columns`` columns, as the trainer's batch had."""
    extra = columns - prompts.shape[1]
    if extra <= 0:
        return prompts[:, -columns:], mask[:, -columns:]
    pad = torch.full((prompts.shape[0], extra), pad_id, dtype=prompts.dtype)
    return torch.cat([pad, prompts], 1), torch.cat([torch.zeros_like(pad, dtype=torch.bool), mask], 1)


def _rates_dict(rates: Rates) -> dict:
    out = {}
    for f in dataclasses.fields(rates):
        value = getattr(rates, f.name)
        if isinstance(value, Link):
            value = [value.alpha, value.beta]
        out[f.name] = value
    return out


def _rates(values: dict | None, base: Rates | None = None) -> Rates:
    values = dict(values or {})
    for key in ("intra_link", "inter_link"):
        if isinstance(values.get(key), (list, tuple)):
            values[key] = Link(*values[key])
    return dataclasses.replace(base or Rates(), **values)


def _device(value) -> Device:
    if isinstance(value, str):
        return get_device(value)
    return Device(**{"name": "measured", "source": "a run's record", **value})


def _spec(model: dict | str) -> TransformerSpec:
    if isinstance(model, str):
        return get_spec(model)
    if "spec" in model:
        return get_spec(model["spec"])
    from rlm_course.lm.model import ModelConfig

    return from_model_config(ModelConfig(**model["model_config"]))


def scenario_from_record(record: dict) -> Scenario:
    """The :class:`~rlm_course.cluster.simulator.Scenario` of a run record (see
    :func:`check_real_run`).

    Raises:
        ValueError: for an unknown model, device, preset or mode, or inconsistent settings.
    """
    algo = dict(record["algorithm"])
    config = preset(algo.pop("preset"), **algo)
    w = dict(record["workload"])
    workload = Workload(**w)
    mode = record.get("mode", "sync")
    if isinstance(mode, str):
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}.")
        mode = MODES[mode]
    else:
        mode = Mode(**mode)
    trainer = record.get("trainer")
    return Scenario(_spec(record["model"]), config, workload,
                    Cluster(_device(record["device"]), record["gpus"]),
                    placement=record.get("placement", "colocated"),
                    rollout_gpus=record.get("rollout_gpus"),
                    generation_tp=record.get("generation_tp", 1),
                    trainer=Layout(**trainer) if trainer else None, mode=mode,
                    rates=_rates(record.get("rates")),
                    engine_log_probs=record.get("engine_log_probs", False))


def predicted_stages(result: SimResult) -> dict[str, float]:
    """A simulation's stage seconds under the names a run's timers use (``training`` = policy
    and critic updates)."""
    st = result.stages
    return {"generation": st.get("generation", 0.0), "scoring": st.get("scoring", 0.0),
            "training": st.get("policy update", 0.0) + st.get("critic update", 0.0),
            "reward": st.get("reward", 0.0), "step": result.step_seconds}


def compare_with_measured(predicted: dict[str, float], measured: dict[str, float],
                          tolerance: float = 0.2) -> list[dict]:
    """One row per stage both sides have: ``stage, predicted, measured, ratio`` (predicted over
    measured) and ``ok`` (``|ratio - 1| <= tolerance``)."""
    rows = []
    for stage in measured:
        if stage not in predicted or not measured[stage]:
            continue
        ratio = predicted[stage] / measured[stage]
        rows.append({"stage": stage, "predicted": predicted[stage], "measured": measured[stage],
                     "ratio": ratio, "ok": abs(ratio - 1) <= tolerance})
    return rows


def check_real_run(record: dict, tolerance: float = 0.2, stages=COMPARED) -> list[dict]:
    """Compare a measured run with the simulation of the same iteration: the hook for every real
    run, single-process or distributed.

    ``record`` holds: ``model`` (``{"spec": name}`` or ``{"model_config": {...}}``), ``device``
    (a catalog name, or its figures measured), ``gpus``, ``algorithm`` (``{"preset": name,
    ...overrides}``), ``workload`` (:class:`~rlm_course.cost.anatomy.Workload` fields),
    ``placement``, ``rollout_gpus``, ``generation_tp``, ``trainer`` (:class:`Layout` fields),
    ``mode`` (a name of :data:`~rlm_course.cluster.simulator.MODES` or :class:`Mode` fields),
    ``rates`` (:class:`~rlm_course.cost.phases.Rates` fields; links as ``[alpha, beta]``,
    e.g. fitted on the run's process groups) and ``measured`` (``{stage: seconds}``, stages
    ``generation``, ``scoring``, ``training``, ``reward``, ``step``).

    Returns:
        :func:`compare_with_measured`'s rows for ``stages``.

    Raises:
        ValueError: for a record the simulator cannot build (the message says what).
    """
    result = simulate(scenario_from_record(record), iterations=2, warmup=1)
    measured = {k: v for k, v in record["measured"].items() if k in stages}
    return compare_with_measured(predicted_stages(result), measured, tolerance)


# ---------------------------------------------------------------------- (b) published figures
def figures_path() -> Path:
    return data_dir() / "published" / "rl_systems.json"


def load_figures() -> list[dict]:
    """The published figures of ``data/published/rl_systems.json``.

    Raises:
        ValueError: if the file is missing or not valid JSON.
    """
    path = figures_path()
    try:
        return json.loads(path.read_text())["figures"]
    except (OSError, json.JSONDecodeError, KeyError) as err:
        raise ValueError(f"{path} is unreadable ({err}); restore it from git.") from None


def figure(figure_id: str) -> dict:
    """One figure by its ``id``.

    Raises:
        ValueError: for an unknown id (the message lists the known ones).
    """
    figures = load_figures()
    for f in figures:
        if f["id"] == figure_id:
            return f
    raise ValueError(f"unknown figure {figure_id!r}; known: {', '.join(f['id'] for f in figures)}.")


def _merge(base: dict, over: dict) -> dict:
    """``over`` on top of ``base``, dictionaries merged key by key, recursively."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _setting(fig: dict) -> dict:
    """The figure's inputs with its assumptions filling what the source leaves open."""
    return _merge(fig["assumptions"], fig["inputs"])


def infer_mean_response(cfg: dict, spec: TransformerSpec, config, device: Device,
                        layout: Layout, seconds: float, rates: Rates | None = None) -> float:
    """The mean response length (of the figure's log-normal shape) at which the trainer's
    policy update of one batch takes ``seconds`` at ``rates`` (default: the default rates): the
    batch's size in tokens, read off a published update time, when the source gives the time
    but not the lengths."""
    from rlm_course.cost.phases import TrainerCost

    rates = rates or Rates()
    fabric = Cluster(device, layout.devices).fabric(rates) if layout.devices > 1 else None
    cost = TrainerCost(spec, config, layout, device, rates, fabric, cfg["prompt_len"])

    def update(mean: float) -> float:
        w = Workload.long_tailed(cfg["prompts"], cfg["group_size"], cfg["prompt_len"], mean,
                                 cfg["sigma"], cfg["max_response"], seed=cfg.get("seed", 0))
        return cost.seconds(w.lengths)["policy update"]

    lo, hi = 1.0, cfg["max_response"] / 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if update(mid) < seconds else (lo, mid)
    return round((lo + hi) / 2, 1)


def build_scenarios(fig: dict) -> tuple[Scenario, Scenario, dict]:
    """The baseline and target scenarios of a figure, and its merged setting.

    Two assumptions may be resolved from the source's own numbers rather than given:
    ``mean_response: "from update"`` (:func:`infer_mean_response` on the baseline's published
    ``policy update`` seconds) and ``rollout_gpus: "balanced"`` (the target's split, among
    eighths of the devices, that gives the shortest step: the allocation of a system that
    balances its generation and training pools)."""
    cfg = _setting(fig)
    spec, device = get_spec(cfg["model"]), get_device(cfg["device"])
    config = algorithm(cfg["algorithm"], **cfg.get("algorithm_overrides", {}))
    rates = _rates(cfg.get("rates"))

    def layout(s: dict, pool: int) -> Layout:
        lay = dict(s.get("trainer", {}))
        per = lay.get("tp", 1) * lay.get("pp", 1) * lay.get("cp", 1)
        lay.setdefault("dp", pool // per)
        return Layout(**lay)

    if cfg.get("mean_response") == "from update":
        base = _merge(cfg.get("both", {}), cfg["baseline"])
        cfg["mean_response"] = infer_mean_response(
            cfg, spec, config, device, layout(base, cfg["gpus"]),
            cfg["baseline_stages"]["policy update"])
    workload = Workload.long_tailed(cfg["prompts"], cfg["group_size"], cfg["prompt_len"],
                                    cfg["mean_response"], cfg["sigma"], cfg["max_response"],
                                    seed=cfg.get("seed", 0))

    def side(name: str, rollout_gpus=None) -> Scenario:
        s = _merge(cfg.get("both", {}), cfg[name])
        gpus = s.get("gpus", cfg["gpus"])
        placement = s.get("placement", "colocated")
        rollout = rollout_gpus if rollout_gpus is not None else s.get("rollout_gpus")
        pool = gpus if placement == "colocated" else gpus - rollout
        mode = s.get("mode", "sync")
        mode = MODES[mode] if isinstance(mode, str) else Mode(**mode)
        return Scenario(spec, config, workload, Cluster(device, gpus), placement=placement,
                        rollout_gpus=rollout, generation_tp=s.get("generation_tp", 1),
                        trainer=layout(s, pool), mode=mode, rates=_rates(s.get("rates"), rates),
                        offload_trainer=s.get("offload_trainer", False),
                        engine_log_probs=s.get("engine_log_probs", False),
                        oversample=s.get("oversample", 1.0))

    baseline = side("baseline")
    if cfg["target"].get("rollout_gpus") == "balanced":
        candidates = [cfg["gpus"] * k // 8 for k in range(1, 8)]
        target = min((side("target", g) for g in candidates),
                     key=lambda sc: simulate(sc, length_buckets=256).step_seconds)
        cfg["target"]["rollout_gpus"] = target.rollout_gpus
    else:
        target = side("target")
    return baseline, target, cfg


#: the stages a published breakdown may give, and the rate each one calibrates
CALIBRATED = {"generation": ("decode_step_latency",), "scoring": ("forward_mfu",),
              "policy update": ("train_hfu",)}


def calibrate(scenario: Scenario, measured: dict[str, float], rounds: int = 8,
              length_buckets: int | None = 256) -> Rates:
    """Rates under which ``scenario`` reproduces a published breakdown ``measured``
    (``{"generation", "scoring", "policy update", "step"}`` seconds, any of them):

    * generation: the engine's fixed seconds per decode step (``decode_step_latency``: what a
      real engine spends on scheduling, sampling and kernel launches beyond the roofline), found
      by the secant method, since generation time grows linearly with it (by the number of decode
      steps on the slowest replica); if generation at the roofline rates is already slower than
      measured, the decode efficiencies are raised instead (at most to 1);
    * scoring and updates: ``forward_mfu`` and ``train_hfu`` scaled by simulated over measured
      seconds, ``rounds`` times (the stage is nearly inversely proportional to them), at most 1;
    * then the part of the measured ``step`` that no stage explains becomes
      ``iteration_overhead``.

    Raises:
        ValueError: if ``measured`` has no stage to calibrate.
    """
    keys = [k for k in CALIBRATED if measured.get(k)]
    if not keys:
        raise ValueError(f"nothing to calibrate in {sorted(measured)}; give seconds of "
                         f"{', '.join(CALIBRATED)}.")

    def run(rates: Rates) -> SimResult:  # as the prediction will simulate it
        return simulate(dataclasses.replace(scenario, rates=rates), length_buckets=length_buckets)

    rates = scenario.rates
    for _ in range(3):  # the prefill runs at forward_mfu: let the two fits settle together
        if "generation" in keys:
            rates = _fit_generation(run, rates, measured["generation"],
                                    scenario.workload.max_response_len, rounds)
        for _ in range(rounds):
            result = run(rates)
            factors = {s: result.stages.get(s, 0.0) / measured[s] for s in keys}
            if all(abs(f - 1) <= 1e-4 for f in factors.values()):
                break
            changes = {name: min(1.0, getattr(rates, name) * factors[stage])
                       for stage in keys if stage != "generation" for name in CALIBRATED[stage]}
            rates = dataclasses.replace(rates, **changes)
    if measured.get("step"):
        explained = sum(v for k, v in run(rates).stages.items() if k != "overhead")
        rates = dataclasses.replace(rates, iteration_overhead=max(0.0, measured["step"] - explained))
    return rates


def _fit_generation(run, rates: Rates, target: float, steps: int, rounds: int) -> Rates:
    """The decode latency (secant method) that makes generation last ``target`` seconds; or, if
    even none is too slow, decode efficiencies raised by the excess (at most to 1)."""
    rates = dataclasses.replace(rates, decode_step_latency=0.0)
    g0 = run(rates).stages.get("generation", 0.0)
    if g0 > target:
        factor = g0 / target
        return dataclasses.replace(rates, decode_bandwidth=min(1.0, rates.decode_bandwidth * factor),
                                   decode_mfu=min(1.0, rates.decode_mfu * factor))
    lo, g_lo, hi = 0.0, g0, (target - g0) / steps
    for _ in range(rounds):
        g_hi = run(dataclasses.replace(rates, decode_step_latency=hi)).stages["generation"]
        if abs(g_hi - target) <= 1e-4 * target or g_hi == g_lo:
            break
        lo, g_lo, hi = hi, g_hi, max(0.0, hi + (target - g_hi) * (hi - lo) / (g_hi - g_lo))
    return dataclasses.replace(rates, decode_step_latency=hi)


_CALIBRATIONS: dict[str, Rates] = {}  # figures that share a baseline share its calibration


def _measure(result: SimResult, what: str) -> float:
    if what == "step_seconds":
        return result.step_seconds
    if what == "generation_seconds":
        return result.stages.get("generation", 0.0)
    if what == "generation_share":
        return result.generation_share
    raise ValueError(f"unknown figure quantity {what!r}.")


def reproduce(fig: dict | str, length_buckets: int | None = 256) -> dict:
    """Simulate a published figure (a dict of :func:`load_figures`, or its id).

    ``fig["what"]`` says what is compared: ``speedup`` (the baseline's step over the target's),
    or ``step_seconds``, ``generation_seconds``, ``generation_share`` of the target. With
    ``inputs.baseline_stages``, the rates are first calibrated on the baseline
    (:func:`calibrate`).

    Returns:
        ``{"id", "what", "predicted", "published", "ratio" (predicted / published), "tolerance",
        "within" (|ratio - 1| <= tolerance), "direction" (for a speedup: both above 1, or both
        below), "baseline", "target" (the two SimResults), "rates"}``.
    """
    if isinstance(fig, str):
        fig = figure(fig)
    baseline, target, cfg = build_scenarios(fig)
    measured = cfg.get("baseline_stages")
    rates = baseline.rates
    if measured:  # the target runs at the rates the baseline was measured at
        key = json.dumps([{k: v for k, v in cfg.items() if k != "target"}, length_buckets],
                         sort_keys=True, default=str)
        if key not in _CALIBRATIONS:
            _CALIBRATIONS[key] = calibrate(baseline, measured, length_buckets=length_buckets)
        rates = _CALIBRATIONS[key]
        baseline = dataclasses.replace(baseline, rates=rates)
        target = dataclasses.replace(target, rates=_rates(cfg["target"].get("rates"), rates))
    base = simulate(baseline, length_buckets=length_buckets)
    tgt = simulate(target, length_buckets=length_buckets)
    if fig["what"] == "speedup":
        predicted = base.step_seconds / tgt.step_seconds
    else:
        predicted = _measure(tgt, fig["what"])
    published = fig["published"]
    ratio = predicted / published
    direction = (predicted > 1) == (published > 1) if fig["what"] == "speedup" else True
    return {"id": fig["id"], "what": fig["what"], "predicted": predicted, "published": published,
            "ratio": ratio, "tolerance": fig["tolerance"], "within": abs(ratio - 1) <= fig["tolerance"],
            "direction": direction, "baseline": base, "target": tgt, "rates": rates,
            "source": fig["source"], "status": fig.get("status", "reproduced")}


def validation_table(ids=None, length_buckets: int | None = 256) -> list[dict]:
    """:func:`reproduce` for every figure (or those in ``ids``), without the SimResults."""
    rows = []
    for fig in load_figures():
        if ids is not None and fig["id"] not in ids:
            continue
        row = reproduce(fig, length_buckets)
        rows.append({k: v for k, v in row.items() if k not in ("baseline", "target", "rates")})
    return rows
