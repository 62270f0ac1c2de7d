"""The drivers of chapters 12-13's experiments: the single controller's control flow that runs
asynchronous RL and stage fusion on Ray workers.

**The RL pipeline** (:func:`run_pipeline`): a single controller
(:mod:`rlm_course.systems.controller`) drives one rollout worker and one trainer worker
(disaggregated), or a set of workers each hosting both (colocated, synchronous only: one device
cannot generate and train at once), gates the rollout by staleness
(:func:`rlm_course.systems.async_rl.rollout_capacity`), syncs the weights, and records every
worker's events (:mod:`rlm_course.timeline`).

**The link** (:func:`measure_link`): alpha and beta of a sync group, from timed broadcasts on its
workers (chapter 12).

**Stage fusion** (:func:`prepare_unfused`, :func:`prepare_fused`, :func:`fusion_experiment`):
experience preparation with and without migrating the long tail (the concepts are in
:mod:`rlm_course.systems.fusion`).

Every call to a worker names the worker's method itself (``controller.call(workers,
RLWorker.train, batch)``), so that a wrong name fails here, in Python, before anything runs.
"""

from __future__ import annotations

import json

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlm_course.algorithms import GROUP_ADVANTAGES
from rlm_course.cost.comm import Link
from rlm_course.distributed.collectives import fit_link
from rlm_course.systems.async_rl import PipelineConfig, rollout_capacity, staleness
from rlm_course.systems.controller import WorkerError
from rlm_course.systems.fusion import merge_experience, migration_point
from rlm_course.timeline import relative
from rlm_course.systems.weight_sync import LINK_SIZES, slowest_median
from rlm_course.systems.workers import RLWorker


# ---------------------------------------------------------------------------------- the link
def measure_link(controller, workers, group: str = "sync", sizes: Sequence[int] = LINK_SIZES,
                 repeats: int = 5) -> tuple[Link, dict[int, float]]:
    """Fit alpha and beta of the link between ``workers`` (the first one broadcasts) over the
    controller's named ``group``. Returns ``(link, {size: median seconds})``."""
    src = workers[0].rank
    results = controller.call(workers, RLWorker.time_broadcasts, list(sizes), repeats, group, src,
                              what="measuring the link")
    medians = slowest_median(results)
    return fit_link("broadcast", list(medians), list(medians.values()), len(workers)), medians


# ---------------------------------------------------------------------------------- asynchronous RL
@dataclass
class PipelineResult:
    """What a run measured.

    Attributes:
        steps: per iteration: ``step``, ``head_versions`` (min/max of the responses' starting
            versions), ``staleness`` (max, mean), ``tokens`` (response tokens trained), the
            trainer's metrics (reward, accuracy on the training samples, losses).
        events: every worker's :class:`~rlm_course.timeline.Event`, on one clock starting
            at the pipeline's start.
        seconds: wall time from the first generation to the last update; tokens_per_second:
            response tokens trained per second of it.
        accuracy: ``[{"seconds", "version", "accuracy"}, ...]``: held-out greedy accuracy of the
            weights after each snapshot's step, and when that step ended (seconds from the start).
        response_lengths: every trained response's length (tokens), in order.
        max_staleness: the largest staleness of any trained response (never above ``eta``).
    """

    placement: str
    config: dict
    steps: list[dict] = field(default_factory=list)
    events: list = field(default_factory=list)
    seconds: float = 0.0
    tokens_per_second: float = 0.0
    accuracy: list = field(default_factory=list)
    response_lengths: list[int] = field(default_factory=list)
    max_staleness: int = 0
    token_versions: dict = field(default_factory=dict)
    origin: float = 0.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out["events"] = [e.to_dict() for e in self.events]
        return out


def worker_spec(task, config, checkpoint: str | Path, pipe: PipelineConfig,
                run_dir: Path | None = None, dp_rank: int = 0, dp_size: int = 1) -> dict:
    """What :meth:`RLWorker.rl_setup <rlm_course.systems.workers.RLWorker.rl_setup>` needs to build
    a worker's roles: the task, the RL and pipeline settings as plain dicts, the warm start, the
    run folder and the worker's data-parallel share."""
    from rlm_course.rl.runs import sft_command

    settings = {k: v for k, v in asdict(task).items() if k not in ("name",)}
    return {"task": task.name, "task_settings": settings, "config": asdict(config),
            "checkpoint": str(checkpoint), "pipeline": asdict(pipe),
            "run_dir": str(run_dir) if run_dir else None, "dp_rank": dp_rank, "dp_size": dp_size,
            "sft_command": sft_command(task)}


def run_pipeline(controller, task, config, pipe: PipelineConfig, checkpoint: str | Path,
                 run_dir: str | Path | None = None, evaluate: bool = True,
                 progress: bool = False) -> PipelineResult:
    """Run ``config.steps`` RL iterations of ``config`` (an :class:`~rlm_course.rl.algorithms.RLConfig`)
    on the controller's workers, starting from ``checkpoint`` (an SFT warm start).

    Disaggregated (``actor`` and ``rollout`` on different devices, one worker each): the
    event loop of the module docstring, gated by :func:`~rlm_course.systems.async_rl.rollout_capacity`, weights synced over
    the ``sync`` group in ``pipe.bucket_bytes`` buckets whenever the rollout is about to start
    (or, with partial rollouts, continue) with older weights than the trainer's. Colocated (every
    worker hosts both roles): synchronous only; each worker generates ``1/D`` of the prompts,
    the ``D`` workers train data-parallel (gradients averaged), and the weights pass to the
    rollout engine in process.

    Returns:
        a :class:`PipelineResult`.

    Raises:
        ValueError: for a mapping this pipeline cannot run (the message says which), or
            ``eta > 0`` with colocated roles.
        WorkerDiedError, WorkerError, WorkerTimeoutError: from the controller; the message adds
            where the last checkpoint is.
    """
    run_dir = Path(run_dir) if run_dir is not None else None
    placement = controller.mapping.placement("actor", "rollout")
    if placement == "colocated" and pipe.eta > 0:
        raise ValueError(f"eta={pipe.eta} with colocated actor and rollout: one device cannot "
                         "generate and train at the same time, so there is nothing to overlap; "
                         "use eta=0, or a disaggregated mapping (e.g. actor=[0], rollout=[1]).")
    result = PipelineResult(placement, {"rl": asdict(config), "pipeline": asdict(pipe),
                                        "mapping": repr(controller.mapping)})
    state = {"checkpoint": None}
    try:
        if placement == "colocated":
            _run_colocated(controller, task, config, pipe, checkpoint, run_dir, result, state,
                           progress)
        else:
            _run_disaggregated(controller, task, config, pipe, checkpoint, run_dir, result, state,
                               progress)
    except WorkerError as err:
        where = (f" The last checkpoint (step {state['checkpoint']}) is "
                 f"{run_dir / 'checkpoint.pt'}." if state["checkpoint"] else
                 " No checkpoint had been written yet.")
        raise type(err)(str(err) + where, err.worker, err.what) from err
    if evaluate:
        trainer = controller.role_workers("actor")[0]
        snapshots = controller.call([trainer], RLWorker.evaluate_snapshots,
                                    what="evaluating the snapshots")[0]
        result.accuracy = [{"seconds": max(0.0, s["time"] - trainer.clock_offset - result.origin),
                            "version": s["version"], "accuracy": s["accuracy"]}
                           for s in snapshots]
    return result


def _origin_events(controller, result: PipelineResult, origin: float) -> None:
    result.events = relative(controller.events(), origin)


def _record_step(result: PipelineResult, step: int, metrics: dict, eta: int,
                 run_dir: Path | None = None) -> None:
    """One trained step into the result and, with a ``run_dir``, one line of its
    ``metrics.jsonl`` (the trainer's metrics, with the behaviour KL and the staleness)."""
    heads = metrics.pop("head_versions")
    stale = [staleness(step, v) for v in heads if v >= 0]
    result.response_lengths += metrics.pop("response_lengths")
    versions = metrics.pop("token_version_counts", {})
    for v, count in versions.items():
        result.token_versions[str(v)] = result.token_versions.get(str(v), 0) + count
    row = {**metrics, "step": step, "head_version_min": min(heads),
           "head_version_max": max(heads), "staleness_max": max(stale) if stale else 0,
           "staleness_mean": sum(stale) / len(stale) if stale else 0.0}
    if row["staleness_max"] > eta:
        raise AssertionError(f"step {step} trained a sample {row['staleness_max']} versions old, "
                             f"more than eta={eta}: the staleness gate failed.")
    result.max_staleness = max(result.max_staleness, row["staleness_max"])
    result.steps.append(row)
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(run_dir / "metrics.jsonl", "w" if step == 1 else "a") as f:
            f.write(json.dumps(row) + "\n")


def _bar(progress: bool, steps: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=steps, desc=desc, disable=not progress)


def _run_disaggregated(controller, task, config, pipe, checkpoint, run_dir, result, state,
                       progress) -> None:
    actors, rollouts = controller.role_workers("actor"), controller.role_workers("rollout")
    if len(actors) != 1 or len(rollouts) != 1:
        raise ValueError(f"the disaggregated pipeline runs one trainer and one rollout worker; the "
                         f"mapping has {len(actors)} and {len(rollouts)}. Give each role one "
                         "device (e.g. actor=[0], rollout=[1]).")
    trainer, rollout = actors[0], rollouts[0]
    spec = worker_spec(task, config, checkpoint, pipe, run_dir)
    controller.call([trainer, rollout], RLWorker.rl_setup, spec, what="loading the models")
    controller.events()  # drop set-up events
    origin = result.origin = time.time()
    start = time.perf_counter()
    version, rollout_version, next_gen, trained = 0, 0, 1, 0
    ready: dict[int, dict] = {}
    gen_future = train_future = None
    in_flight = False
    bar = _bar(progress, config.steps, f"eta={pipe.eta} {'partial ' if pipe.partial_rollout else ''}"
                                       "async RL")

    def sync() -> None:
        nonlocal rollout_version
        futures = [controller.submit(trainer, RLWorker.send_weights, pipe.bucket_bytes,
                                     what="sending weights"),
                   controller.submit(rollout, RLWorker.recv_weights, pipe.bucket_bytes,
                                     what="receiving weights")]
        _, received = controller.gather(futures)
        rollout_version = received

    while trained < config.steps:
        if gen_future is None:
            if in_flight:
                if version > rollout_version:  # partial rollout: continue with the new weights
                    sync()
                gen_future = controller.submit(rollout, RLWorker.advance, pipe.segment_tokens,
                                               what=f"generating step {next_gen}")
            elif next_gen <= config.steps and rollout_capacity(version, pipe.eta, 1,
                                                                next_gen - 1) >= 1:
                if version > rollout_version:
                    sync()
                if pipe.partial_rollout:
                    gen_future = controller.submit(rollout, RLWorker.start_and_advance, next_gen,
                                                   pipe.segment_tokens,
                                                   what=f"generating step {next_gen}")
                    in_flight = True
                else:
                    gen_future = controller.submit(rollout, RLWorker.generate, next_gen,
                                                   what=f"generating step {next_gen}")
        if train_future is None and trained + 1 in ready:
            train_future = controller.submit(trainer, RLWorker.train, ready.pop(trained + 1),
                                             what=f"training step {trained + 1}")
        futures = [f for f in (gen_future, train_future) if f is not None]
        done, _ = controller.wait(futures)
        for future in done:
            value = controller.value(future)
            if future is gen_future:
                gen_future = None
                if value is not None:  # a finished batch
                    ready[next_gen] = value
                    next_gen += 1
                    in_flight = False
            elif future is train_future:
                train_future = None
                trained += 1
                version = trained
                if value.pop("checkpoint", None):
                    state["checkpoint"] = trained
                _record_step(result, trained, value, pipe.eta, run_dir)
                bar.update(1)
    _finish(controller, result, origin, start, bar)


def _finish(controller, result, origin: float, start: float, bar) -> None:
    """Close a run: its seconds, trained tokens per second, and its workers' events."""
    result.seconds = time.perf_counter() - start
    bar.close()
    tokens = sum(row["tokens"] for row in result.steps)
    result.tokens_per_second = tokens / result.seconds if result.seconds else 0.0
    _origin_events(controller, result, origin)


def check_colocated_data_parallel(config, workers: int) -> None:
    """Refuse an algorithm that ``workers`` colocated data-parallel workers cannot run as the
    one-process algorithm. Each worker trains on its own ``1/workers`` of the prompts and the
    gradients are averaged with equal weights (``systems.workers._average_gradients``), which is
    the batch's gradient only when every worker's loss has the same normaliser: a group advantage
    (the group's statistics stay on one worker) and a loss averaged per response
    (``seq-mean-token-mean``) or over a constant (Dr. GRPO's ``seq-mean-token-sum-norm``). A
    token-mean loss (DAPO, PPO) would weight each worker's tokens by ``1 / its own count``: the
    equal-weight average of per-worker token means is not the batch's token mean (the fault of
    TRL PR #3231 and Megatron-LM #4590; ``distributed.grpo`` weights each rank by its token share
    instead).

    Raises:
        ValueError: for ``token-mean``, dynamic sampling, a batch-normalised advantage or a
            critic, with more than one worker.
    """
    if workers <= 1:
        return
    problems = []
    if config.loss_agg == "token-mean":
        problems.append("loss_agg='token-mean' (each worker would divide by its own token count)")
    if config.dynamic_sampling:
        problems.append("dynamic sampling (the workers would keep different numbers of groups)")
    if config.use_critic or config.advantage not in GROUP_ADVANTAGES:
        problems.append(f"advantage={config.advantage!r}"
                        + (" with a critic" if config.use_critic else "")
                        + " (it normalises over the whole batch)")
    if problems:
        raise ValueError(f"{workers} colocated data-parallel workers average their gradients with "
                         "equal weights, which differs from one process for "
                         + "; ".join(problems) + ". Use a per-response loss and a group "
                         "advantage (the grpo, dr_grpo, rloo or gspo presets), or one colocated "
                         "worker, or `python -m rlm_course grpo --nproc N`, whose data "
                         "parallelism weights each rank by its share of the tokens.")


def _run_colocated(controller, task, config, pipe, checkpoint, run_dir, result, state,
                   progress) -> None:
    workers = controller.role_workers("actor")
    d = len(workers)
    if config.prompts_per_step % d:
        raise ValueError(f"prompts_per_step={config.prompts_per_step} does not split over {d} "
                         "colocated workers; choose a multiple of the device count.")
    check_colocated_data_parallel(config, d)
    specs = [worker_spec(task, config, checkpoint, pipe, run_dir, dp_rank=k, dp_size=d)
             for k in range(d)]
    controller.call(workers, RLWorker.rl_setup, per_worker=[{"spec": s} for s in specs],
                    what="loading the models")
    controller.events()
    origin = result.origin = time.time()
    start = time.perf_counter()
    bar = _bar(progress, config.steps, "colocated sync RL")
    for step in range(1, config.steps + 1):
        began = time.perf_counter()
        batches = controller.call(workers, RLWorker.generate, step, what=f"generating step {step}")
        generation = time.perf_counter() - began
        outs = controller.call(workers, RLWorker.train, per_worker=[{"batch": b} for b in batches],
                               what=f"training step {step}")
        controller.call(workers, RLWorker.handover, what="handing the weights over")
        merged = _merge_metrics(outs)
        # the trainers got their batches from the generate call: its seconds are the stage's
        merged["seconds_generation"] = generation
        if merged.pop("checkpoint", None):
            state["checkpoint"] = step
        _record_step(result, step, merged, pipe.eta, run_dir)
        bar.update(1)
    _finish(controller, result, origin, start, bar)


#: Metrics that count what each data-parallel worker did: the whole step's is their sum.
SUMMED_METRICS = ("tokens", "tokens_generated", "responses_generated", "responses_trained",
                  "groups_with_signal")


def _merge_metrics(outs: list[dict]) -> dict:
    """One row from the data-parallel workers' rows: lists joined; counts
    (:data:`SUMMED_METRICS`) summed; maxima, the batch's columns and the seconds of a stage
    (the workers run it side by side: it lasts as long as the slowest) the largest; minima the
    smallest; other numbers (means, rates, losses) averaged."""
    merged = {}
    for key in outs[0]:
        values = [o[key] for o in outs]
        if key in ("head_versions", "response_lengths"):
            merged[key] = [x for v in values for x in v]
        elif key == "token_version_counts":
            merged[key] = {}
            for v in values:
                for k, c in v.items():
                    merged[key][k] = merged[key].get(k, 0) + c
        elif key == "checkpoint":
            merged[key] = any(values)
        elif all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in values):
            if key in SUMMED_METRICS:
                merged[key] = sum(values)
            elif key.endswith(("_max", "_columns")) or key.startswith("seconds_"):
                merged[key] = max(values)
            elif key.endswith("_min"):
                merged[key] = min(values)
            else:
                merged[key] = sum(values) / len(values)
        else:
            merged[key] = values[0]
    return merged


def tokens_per_second_gain(sync: PipelineResult, other: PipelineResult) -> float:
    """Throughput of ``other`` over that of ``sync`` (trained tokens per second)."""
    return other.tokens_per_second / sync.tokens_per_second if sync.tokens_per_second else math.nan


# ---------------------------------------------------------------------------------- stage fusion
def _start_shares(controller, workers, step: int) -> None:
    controller.call(workers, RLWorker.fusion_start, step, per_worker=[
        {"share": k, "shares": len(workers)} for k in range(len(workers))], what="starting")


def prepare_unfused(controller, step: int, budget: int) -> tuple[float, dict]:
    """Generation on every worker until its last response ends, then scoring on every worker:
    returns ``(seconds, experience)`` (experience as :func:`~rlm_course.systems.fusion.score_rows`, all rows, in order)."""
    workers = controller.role_workers("rollout")
    _start_shares(controller, workers, step)
    start = time.perf_counter()
    controller.call(workers, RLWorker.fusion_generate, budget, what=f"generating step {step}")
    finished = controller.call(workers, RLWorker.fusion_take_finished, what="collecting responses")
    parts = controller.call(workers, RLWorker.fusion_score, per_worker=[{"rows": f} for f in finished],
                            what=f"scoring step {step}")
    return time.perf_counter() - start, merge_experience(parts)


def prepare_fused(controller, step: int, budget: int, first_tokens: int) -> tuple[float, dict]:
    """Generation for ``first_tokens`` tokens on every worker; then the unfinished sequences
    migrate to the first worker, which decodes them to the end while the others score every
    finished response; then the stragglers are scored, split over the workers. Returns
    ``(seconds, experience)`` like :func:`prepare_unfused`.

    Raises:
        ValueError: for fewer than two workers (nothing to migrate to), or ``first_tokens < 1``.
    """
    workers = controller.role_workers("rollout")
    if len(workers) < 2:
        raise ValueError("stage fusion needs at least two workers: one to finish the tail, one "
                         "to score meanwhile.")
    if first_tokens < 1:
        raise ValueError(f"first_tokens={first_tokens} must be at least 1.")
    _start_shares(controller, workers, step)
    start = time.perf_counter()
    controller.call(workers, RLWorker.fusion_generate, first_tokens, what=f"generating step {step}")
    finished = controller.call(workers, RLWorker.fusion_take_finished, what="collecting responses")
    stragglers = [row for rows in controller.call(workers[1:], RLWorker.fusion_export,
                                                  what="migrating stragglers") for row in rows]
    tail = controller.submit(workers[0], RLWorker.fusion_generate, budget, adopt=stragglers,
                             what=f"finishing the tail of step {step}")
    done_rows = [row for rows in finished for row in rows]
    scorers = workers[1:]
    shares = [done_rows[k::len(scorers)] for k in range(len(scorers))]
    scoring = [controller.submit(w, RLWorker.fusion_score, rows=s, what=f"scoring step {step}")
               for w, s in zip(scorers, shares)]
    parts = controller.gather(scoring)
    controller.gather([tail])
    last = controller.call(workers[:1], RLWorker.fusion_take_finished, what="collecting the tail")[0]
    split = [last[k::len(workers)] for k in range(len(workers))]
    parts += controller.call(workers, RLWorker.fusion_score, per_worker=[{"rows": s} for s in split],
                             what=f"scoring the tail of step {step}")
    return time.perf_counter() - start, merge_experience(parts)


def fusion_experiment(controller, task, config, checkpoint, steps: int = 3,
                      quantile: float = 0.8, progress: bool = False) -> dict:
    """Step time of experience preparation, unfused against fused, on the same iterations
    (alternating, so that machine noise hits both alike), after one unfused warm-up iteration
    whose lengths give the migration point.

    Returns:
        ``{"unfused_seconds": [...], "fused_seconds": [...], "gain": median unfused / median
        fused, "first_tokens", "lengths": the warm-up's lengths, "same_early_rows": whether the
        responses that finished before the migration point are identical in both pipelines,
        "windows": [(pipeline, step, start, end)], "events": the timeline}`` (times in seconds
        from the first measured iteration; :func:`~rlm_course.systems.fusion.window_events` cuts one window out).
    """
    from tqdm.auto import tqdm

    workers = controller.role_workers("rollout")
    controller.call(workers, RLWorker.rl_setup, per_worker=[
        {"spec": worker_spec(task, config, checkpoint, PipelineConfig())} for _ in workers],
        what="loading the models")
    budget = task.max_response_len + config.overlong_buffer
    _, warm = prepare_unfused(controller, 1, budget)
    lengths = [len(t) for t in warm["tokens"]]
    first = migration_point(lengths, quantile)
    controller.events()
    origin = time.time()
    unfused, fused, same, windows = [], [], True, []
    for step in tqdm(range(2, steps + 2), desc="unfused vs fused", disable=not progress):
        begin = time.time() - origin
        t_u, exp_u = prepare_unfused(controller, step, budget)
        middle = time.time() - origin
        t_f, exp_f = prepare_fused(controller, step, budget, first)
        windows += [("unfused", step, begin, middle), ("fused", step, middle, time.time() - origin)]
        unfused.append(t_u)
        fused.append(t_f)
        for tok_u, tok_f in zip(exp_u["tokens"], exp_f["tokens"]):
            if len(tok_u) <= first and tok_u != tok_f:
                same = False
    return {"unfused_seconds": unfused, "fused_seconds": fused,
            "gain": statistics.median(unfused) / statistics.median(fused),
            "first_tokens": first, "lengths": lengths, "same_early_rows": same,
            "windows": windows, "events": relative(controller.events(), origin)}
