"""Does the simulator agree with a run measured on this machine? The course's own single-process
GRPO and PPO runs are measured runs: :func:`course_run_record` runs a few iterations of
:class:`~rlm_course.rl.trainer.RLTrainer` and measures, with micro-benchmarks of the same passes
at the same shapes interleaved with them (:class:`TinyRateBench`), the rates they ran at: a decode
step's fixed latency and compute rate (from ``generate`` at two batch sizes), a scoring forward's
and a training step's fraction of the catalog's peak. :func:`check_real_run` then simulates the
same iteration and compares stage by stage: the simulator has to get the composition right (how
many decode steps, which scoring forwards the algorithm runs, how many gradient steps, what a
prefill costs). Multi-process runs (``torch.distributed``, Ray) produce the same kind of record,
with measured link alpha and beta, and go through the same function.

The course's sampler and trainer compute on padded rectangles (every row of a batch runs until
its longest response ends), so a course record's workload gives every response the batch's
response columns, and its rates say ``static_batching``.

The comparison of *seconds* is a benchmark (``python -m rlm_course bench realrun``): a busy
machine slows the run and its micro-benchmarks unequally. Published figures at scale are
:mod:`rlm_course.cluster.validation`'s.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from rlm_course.cluster.simulator import MODES, Mode, Scenario, SimResult, simulate
from rlm_course.cost.anatomy import Workload
from rlm_course.cost.architectures import TransformerSpec, from_model_config, get_spec
from rlm_course.cost.hardware import Device, get_device
from rlm_course.cost.layouts import Layout
from rlm_course.cost.phases import Cluster, Rates
from rlm_course.algorithms import preset
from rlm_course.utils import best_seconds

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
        ``static_batching`` (the course's sampler runs rows in lockstep), no prefix caching (it
        prefills every row's prompt) and the memory-bandwidth term left at 1 (the tiny model's
        decode is compute- and latency-bound)."""
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
            decode_step_latency=max(0.0, t1 - f1 * per_flop), static_batching=True,
            prefix_caching=False)


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
        "rates": rates.to_dict(),
        "measured": best,
    }


def _pad_left(prompts: torch.Tensor, mask: torch.Tensor, columns: int, pad_id: int):
    """Left-pad (or cut) a prompt batch to ``columns`` columns, as the trainer's batch had."""
    extra = columns - prompts.shape[1]
    if extra <= 0:
        return prompts[:, -columns:], mask[:, -columns:]
    pad = torch.full((prompts.shape[0], extra), pad_id, dtype=prompts.dtype)
    return torch.cat([pad, prompts], 1), torch.cat([torch.zeros_like(pad, dtype=torch.bool), mask], 1)


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
                    rates=Rates.from_dict(record.get("rates")),
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
