"""Data-parallel GRPO on real processes: the course's one RL loop
(:class:`~rlm_course.rl.trainer.RLTrainer`) on every rank, each with its share of the prompts.

``python -m rlm_course grpo --task addition --nproc 2`` (:func:`run_rl_distributed`):

* **prompts:** each step draws the prompts of the single-process step (same seed) and rank ``r``
  keeps the ``r``-th of ``p`` equal slices; a group (the ``group_size`` responses of one prompt)
  is never split, so rewards and group advantages are computed on the rank, with no
  communication;
* **samples:** each rank samples with its own seed (otherwise every rank would draw the same
  random numbers for different prompts);
* **gradients** are averaged by ``DistributedDataParallel`` in buckets during backward. The mean
  over ranks of each rank's loss is the single-process loss when every rank's loss is a mean over
  the same number of responses (``seq-mean-token-mean``, GRPO; ``seq-mean-token-sum-norm``,
  Dr. GRPO). ``token-mean`` (DAPO) divides by the number of response *tokens*, which differs from
  rank to rank: each training step all-reduces the token count of its mini-batch and weighs each
  rank's gradient by its share of the tokens (a DDP communication hook), so the update is again the
  single-process one;
* **refused,** with a message that says why: DAPO's dynamic sampling (each rank would keep a
  different number of groups), and advantages normalised over the whole batch (REINFORCE++,
  and PPO's GAE with its critic), which would need batch statistics from every rank;
* **time:** every rank records its stages (generation, reward, scoring, training) and its
  communication (each gradient bucket's all-reduce, from launch to completion, waiting for slower
  ranks included) on a shared clock: ``timeline.json`` and ``timeline.png`` in the run folder;
* **checkpoints** are written by rank 0 in the single-process format (the policy, the optimizer,
  the configuration of the whole run): ``python -m rlm_course eval --checkpoint ...`` or
  :func:`rlm_course.lm.checkpoint.load_checkpoint` read them in one process;
* **Ctrl-C:** the first one finishes the current step on every rank (the ranks agree on the step
  through the per-step gather of their metrics), rank 0 writes the checkpoint atomically, and the
  run stops; a second one stops at once, leaving the previous checkpoint. ``--resume`` (with the
  same ``--nproc``) continues from the checkpoint and repeats the uninterrupted run's numbers:
  every random draw comes from ``(seed, step, rank)``, and the policy, optimizer and reference
  are the same on every rank (also resumable in one process, without ``--nproc``, with other
  samples);
* **failures:** one line per rank, and every rank's traceback in ``failure.log`` in the run
  folder.

:func:`update_equivalence_worker` shows that one update from a fixed rollout batch equals the
single-process update (float64, within :func:`rlm_course.numerics.adam_tolerance`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from rlm_course.distributed.launch import RankContext, graceful_interrupt
from rlm_course.algorithms import RLConfig
from rlm_course.rl.batch import Batch
from rlm_course.rl.trainer import RLTrainer
from rlm_course.timeline import Event
from rlm_course.utils import StageTimer, derived_seed
from rlm_course.vocabulary import STAGES

#: What the timeline shows per rank: the trainer's stages, then the communication inside training.
PHASES = (*STAGES, "communication")


def check_data_parallel(config: RLConfig, world_size: int) -> None:
    """Refuse a configuration that data parallelism over ``world_size`` ranks cannot run as the
    single-process algorithm.

    Raises:
        ValueError: dynamic sampling; a critic or a batch-normalised advantage (REINFORCE++, GAE);
            prompts that do not split into equal per-rank shares; a per-rank batch that the
            mini-batches do not divide; a world size below 1.
    """
    if not (isinstance(world_size, int) and world_size >= 1):
        raise ValueError(f"--nproc {world_size!r}: give a positive number of processes.")
    if world_size == 1:
        return
    if config.dynamic_sampling:
        raise ValueError("dynamic sampling (DAPO) keeps a different number of groups on each rank "
                         "and samples more rounds on some, so the ranks' batches (and their "
                         "gradient steps) would differ: data-parallel runs do not support it; "
                         "pass --no-dynamic-sampling, or run with --nproc 1.")
    if config.use_critic or config.advantage not in ("group", "rloo"):
        raise ValueError(f"--variant {config.variant} (advantage={config.advantage!r}"
                         + (", with a critic" if config.use_critic else "")
                         + "): it normalises advantages over the whole batch, which would need "
                         "statistics from every rank; data-parallel runs support the group "
                         "advantages (group, rloo: grpo, dr_grpo, dapo, rloo, gspo). Use one of "
                         "them, or --nproc 1.")
    if config.prompts_per_step % world_size:
        raise ValueError(f"--prompts-per-step {config.prompts_per_step} does not split into "
                         f"{world_size} equal shares (a group is never split across ranks); use "
                         f"a multiple of {world_size}.")
    local = config.prompts_per_step // world_size * config.group_size
    if local % config.minibatches:
        raise ValueError(f"each rank trains on {local} responses, which --minibatches "
                         f"{config.minibatches} does not divide; change --minibatches or "
                         "--prompts-per-step.")


class ShardedTask:
    """``task`` seen by one rank: :meth:`problems` returns this rank's slice of the prompts the
    single-process step draws (``seed`` set per step by the trainer); everything else is
    ``task``'s."""

    def __init__(self, task, rank: int, world_size: int) -> None:
        self.task, self.rank, self.world_size = task, rank, world_size
        self.seed: int | None = None

    def problems(self, n: int, seed: int, exclude=None, distinct: bool = False):
        """Rank ``rank``'s ``n`` problems: slice ``rank`` of the ``n x world_size`` problems of
        the step's seed (the ``seed`` argument, per-rank, is replaced by the step's)."""
        everything = self.task.problems(n * self.world_size, self.seed if self.seed is not None
                                        else seed, exclude, distinct)
        return everything[self.rank * n:(self.rank + 1) * n]

    def __getattr__(self, name):
        if name == "task":
            raise AttributeError(name)
        return getattr(self.task, name)


class RecordingTimer(StageTimer):
    """A :class:`~rlm_course.utils.StageTimer` that also keeps every stage's interval as an
    :class:`~rlm_course.timeline.Event` of rank ``rank``, in seconds since ``origin`` (a
    ``time.perf_counter()`` value taken after a barrier, so that ranks share the clock)."""

    def __init__(self, origin: float, rank: int = 0) -> None:
        super().__init__()
        self.origin, self.rank = origin, rank
        self.events: list[Event] = []

    @contextmanager
    def __call__(self, stage: str):
        start = time.perf_counter()
        try:
            with StageTimer.__call__(self, stage):
                yield
        finally:
            self.events.append(Event(self.rank, stage, start - self.origin,
                                     time.perf_counter() - self.origin))


class _CommState:
    """What the communication hook needs: the scale of this rank's gradient (``1 / p``, or its
    share of the mini-batch's response tokens for ``token-mean``) and the intervals it records."""

    def __init__(self, world_size: int, origin: float, rank: int = 0) -> None:
        self.world_size, self.origin, self.rank = world_size, origin, rank
        self.scale = 1.0 / world_size
        self.events: list[Event] = []

    def record(self, start: float) -> None:
        """A communication interval from ``start`` (``time.perf_counter()``) to now."""
        self.events.append(Event(self.rank, "communication", start - self.origin,
                                 time.perf_counter() - self.origin))


def _scaled_all_reduce(state: _CommState, bucket):
    """DDP communication hook: scale the bucket by ``state.scale``, sum it over the ranks, and
    record the interval from launch to completion."""
    start = time.perf_counter()
    buffer = bucket.buffer().mul_(state.scale)
    future = dist.all_reduce(buffer, async_op=True).get_future()

    def done(fut):
        state.record(start)
        return fut.value()[0]

    return future.then(done)


class DataParallelPolicy(DistributedDataParallel):
    """The policy under DDP, still usable wherever the trainer uses a :class:`TinyGPT`:
    attributes (``config``, ``ln_f``, ...) come from the wrapped model, and forwards without
    gradient (generation, scoring, evaluation) skip DDP. A training forward with
    ``token_mean`` all-reduces the mini-batch's response-token count and sets this rank's
    gradient scale to its share (``prompt_len`` tells where responses start)."""

    def __init__(self, module, state: _CommState, token_mean: bool, **kwargs) -> None:
        super().__init__(module, **kwargs)
        self.comm_state, self.token_mean, self.prompt_len = state, token_mean, None
        self.register_comm_hook(state, _scaled_all_reduce)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":
                raise
            return getattr(self.module, name)

    def forward(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            return self.module(*args, **kwargs)
        if self.token_mean:
            if self.prompt_len is None:
                raise ValueError("DataParallelPolicy: set prompt_len before a training forward "
                                 "with token-mean aggregation.")
            mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
            mine = mask[:, self.prompt_len:].sum().to(torch.float64).reshape(1)
            total = mine.clone()
            start = time.perf_counter()
            dist.all_reduce(total)
            self.comm_state.record(start)
            self.comm_state.scale = (mine / total.clamp(min=1.0)).item()
        return super().forward(*args, **kwargs)


class DistributedRLTrainer(RLTrainer):
    """:class:`~rlm_course.rl.trainer.RLTrainer` on one rank of a data-parallel group (the default
    process group): ``config`` describes the whole run; this rank trains on
    ``config.prompts_per_step / world_size`` of its prompts (see the module docstring).

    Args:
        policy, task, tokenizer, config, eval_problems: as for :class:`RLTrainer`.
        origin: ``time.perf_counter()`` at a barrier, the zero of the timeline.
        bucket_cap_mb: DDP's gradient bucket size (None: DDP's default, 25 MB).
        weigh_tokens: weigh each rank's gradient by its share of the response tokens under
            ``token-mean`` (False shows what goes wrong without: a plain mean over ranks).

    Raises:
        ValueError: see :func:`check_data_parallel`.
    """

    def __init__(self, policy, task, tokenizer, config: RLConfig, eval_problems, origin: float,
                 bucket_cap_mb: float | None = None, weigh_tokens: bool = True) -> None:
        world, rank = dist.get_world_size(), dist.get_rank()
        check_data_parallel(config, world)
        self.global_config, self.rank, self.world_size = config, rank, world
        local = config if world == 1 else dataclasses.replace(
            config, prompts_per_step=config.prompts_per_step // world,
            seed=derived_seed(config.seed, 7919, rank))  # the rank's samples and mini-batch order
        reference = copy.deepcopy(policy) if config.uses_reference else None
        super().__init__(policy, ShardedTask(task, rank, world), tokenizer, local, eval_problems,
                         reference)
        self.timer = RecordingTimer(origin, rank)
        self.comm = _CommState(world, origin, rank)
        kwargs = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
        if self.device.type == "cuda":  # one GPU per rank (NCCL)
            kwargs["device_ids"] = [self.device]
        self.policy = DataParallelPolicy(policy, self.comm,
                                         weigh_tokens and config.loss_agg == "token-mean", **kwargs)

    @property
    def model(self):
        """The plain policy (what checkpoints hold)."""
        return self.policy.module

    def rollout_and_reward(self, step: int, round_: int = 0):
        extra = (round_,) if round_ else ()
        # the single-process step's prompts; the rank's own seed for sampling
        self.task.seed = derived_seed(self.global_config.seed, step, 1, *extra)
        return super().rollout_and_reward(step, round_)

    def _train(self, step, rollout, *args, **kwargs):
        self.policy.prompt_len = rollout.prompt_len
        return super()._train(step, rollout, *args, **kwargs)

    def evaluate(self) -> float:
        """Held-out greedy accuracy, each rank decoding its share of the problems."""
        from rlm_course.rl.evaluate import evaluate

        mine = self.eval_problems[self.rank::self.world_size]
        result = evaluate(self.model, self.task.task, mine, self.tokenizer)
        correct = torch.tensor([round(result.accuracy * len(mine))], dtype=torch.float64,
                               device=self.device)  # NCCL reduces GPU tensors only
        dist.all_reduce(correct)
        return correct.item() / max(len(self.eval_problems), 1)

    def take_events(self) -> list[Event]:
        """This rank's stage and communication intervals since the last call, by start."""
        events = self.timer.events + self.comm.events
        self.timer.events, self.comm.events = [], []
        return sorted(events, key=lambda e: e.start)


# ---------------------------------------------------------------------------- metrics and timeline
SUMMED = ("tokens_generated", "responses_generated", "responses_trained", "groups_with_signal")


def combine_metrics(rows: list[dict]) -> dict:
    """One metrics row for the whole step from every rank's: counts summed, rates and losses
    averaged over ranks (equal shares; the step and its learning rate as every rank has them),
    stage seconds of the slowest rank (each rank's are kept in ``rank_seconds``)."""
    out = {}
    for key, value in rows[0].items():
        values = [r[key] for r in rows if key in r]
        if key in ("step", "lr") or not isinstance(value, (int, float)) or isinstance(value, bool):
            out[key] = value
        elif key in SUMMED:
            out[key] = sum(values)
        elif key.startswith("seconds_"):
            out[key] = max(values)
        elif key in ("prompt_columns", "response_columns", "sampling_rounds") or \
                key.endswith("_max"):
            out[key] = max(values)
        else:
            out[key] = sum(values) / len(values)
    return out


def phase_seconds(events: list[Event]) -> dict[str, float]:
    """Seconds per phase of one rank's events; overlapping communication intervals count once."""
    from rlm_course.distributed.comm import union_seconds

    out = {phase: 0.0 for phase in PHASES}
    for e in events:
        if e.stage != "communication":
            out[e.stage] += e.end - e.start
    out["communication"] = union_seconds([(e.start, e.end) for e in events
                                          if e.stage == "communication"])
    return out


def plot_timeline(ranks: list[list], path=None, title: str = "data-parallel GRPO: time per rank"):
    """Gantt chart of each rank's stages (a full bar) and its communication (a thin black bar on
    top: gradient all-reduces and token counts, waiting for slower ranks included).

    Args:
        ranks: per rank, its :class:`~rlm_course.timeline.Event` s (seconds on the shared clock).
    """
    from rlm_course.tools.plots import STAGE_COLORS, finish_figure, plt

    fig, ax = plt.subplots(figsize=(10, 0.7 * len(ranks) + 1.3))
    seen = set()
    for r, events in enumerate(ranks):
        for e in events:
            if e.stage == "communication":
                ax.barh(r - 0.3, e.end - e.start, left=e.start, height=0.18, color="black",
                        label=None if e.stage in seen else "communication")
            else:
                ax.barh(r, e.end - e.start, left=e.start, height=0.5, color=STAGE_COLORS[e.stage],
                        edgecolor="white", label=None if e.stage in seen else e.stage)
            seen.add(e.stage)
    ax.set(yticks=range(len(ranks)), yticklabels=[f"rank {r}" for r in range(len(ranks))],
           xlabel="seconds", title=title)
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return finish_figure(fig, path)


# ---------------------------------------------------------------------------- the job
#: What rank 0 prints on the first Ctrl-C.
INTERRUPT_MESSAGE = ("Interrupt: every rank finishes this step, then rank 0 saves a checkpoint "
                     "(Ctrl-C again, after a second, to stop now).")


def grpo_job_worker(ctx: RankContext, task, config: RLConfig, run_dir: str, sft_checkpoint: str,
                    checkpoint_every: int = 10, progress: bool = True,
                    bucket_cap_mb: float | None = None, resume: bool = False) -> dict | None:
    """One rank of :func:`run_rl_distributed`: load the warm start (or, with ``resume``, the run's
    ``checkpoint.pt``), train up to ``config.steps`` steps, and (rank 0) write ``metrics.jsonl``,
    ``timeline.json``, checkpoints and the summary. The first Ctrl-C stops every rank after the
    same step, with a checkpoint (see the module docstring).

    Returns:
        The summary dict on rank 0 (``{"interrupted": True, "step", "run_dir"}`` after a Ctrl-C),
        None on the others.
    """
    with graceful_interrupt(INTERRUPT_MESSAGE if ctx.is_main else None) as stop:
        return _grpo_job(ctx, task, config, Path(run_dir), sft_checkpoint, checkpoint_every,
                         progress, bucket_cap_mb, resume, stop)


def _grpo_job(ctx: RankContext, task, config: RLConfig, run_dir: Path, sft_checkpoint: str,
              checkpoint_every: int, progress: bool, bucket_cap_mb: float | None, resume: bool,
              stop: graceful_interrupt) -> dict | None:
    from tqdm.auto import tqdm

    from rlm_course.devices import device_description
    from rlm_course.lm.checkpoint import load_checkpoint, save_checkpoint
    from rlm_course.lm.tokenizer import CharTokenizer
    from rlm_course.rl.runs import load_trainer_state, read_metrics
    from rlm_course.tasks.eval_sets import load_eval_set
    from rlm_course.utils import atomic_write_json, atomic_write_text, seed_everything

    tokenizer = CharTokenizer()
    eval_problems = load_eval_set(task)
    state = load_checkpoint(run_dir / "checkpoint.pt") if resume else None
    # on the rank's device: the CPU with gloo, its own GPU with NCCL
    policy = (state if resume else load_checkpoint(sft_checkpoint))["model"].to(ctx.device)
    seed_everything(config.seed)
    dist.barrier()
    origin = time.perf_counter()
    trainer = DistributedRLTrainer(policy, task, tokenizer, config, eval_problems, origin,
                                   bucket_cap_mb)
    metrics_path, timeline_path = run_dir / "metrics.jsonl", run_dir / "timeline.json"
    totals = {"wall_seconds": 0.0, **{s: 0.0 for s in PHASES}}
    if resume:
        load_trainer_state(trainer, state["trainer"], run_dir / "checkpoint.pt")
        totals.update({k: v for k, v in state["totals"].items() if k in totals})
        accuracy_before, sft_info = state["accuracy_before"], state["sft"]
    else:
        accuracy_before = trainer.evaluate()
        sft_info = {"checkpoint": str(sft_checkpoint)}
    note = (lambda text: print(text, file=sys.stderr)) if ctx.is_main else None
    rows = read_metrics(metrics_path, trainer.step_count, note) if resume else []
    if ctx.is_main:
        atomic_write_text(metrics_path, "".join(json.dumps(m) + "\n" for m in rows))
    timeline: list[list] = [[] for _ in range(ctx.world_size)]
    first_step, interrupted = trainer.step_count, False

    def save() -> None:
        if ctx.is_main:
            save_checkpoint(run_dir / "checkpoint.pt", trainer.model, task=task.key,
                            algorithm=config.algorithm, config=dataclasses.asdict(config),
                            trainer=trainer.state_dict(), totals=dict(totals), sft=sft_info,
                            accuracy_before=accuracy_before, world_size=ctx.world_size,
                            threads=ctx.threads, device=ctx.device.type)
        dist.barrier()

    bar = tqdm(total=config.steps, initial=trainer.step_count,
               desc=f"{config.algorithm.upper()} {task.key} x{ctx.world_size}",
               disable=not (progress and ctx.is_main))
    while trainer.step_count < config.steps:
        start = time.perf_counter()
        row = trainer.step()
        wall = time.perf_counter() - start
        events = trainer.take_events()
        gathered: list = [None] * ctx.world_size
        # every rank gets every rank's stop request: they all stop after the same step
        dist.all_gather_object(gathered, (row, events, wall, stop.requested))
        stopping = any(g[3] for g in gathered)
        if ctx.is_main:
            combined = combine_metrics([g[0] for g in gathered])
            combined["rank_seconds"] = [phase_seconds(g[1]) for g in gathered]
            rows.append(combined)
            totals["wall_seconds"] += max(g[2] for g in gathered)
            for phase in PHASES:
                totals[phase] += max(s[phase] for s in combined["rank_seconds"])
            with open(metrics_path, "a") as f:
                f.write(json.dumps(combined) + "\n")
            for r, g in enumerate(gathered):
                timeline[r].extend(g[1])
            bar.set_postfix({"reward": f"{combined['reward_mean']:.2f}"})
            bar.update(1)
        done = trainer.step_count == config.steps
        if done or trainer.step_count % checkpoint_every == 0 or stopping:
            save()
        if stopping and not done:
            interrupted = True
            break
    bar.close()
    if interrupted:
        return ({"interrupted": True, "step": trainer.step_count, "run_dir": str(run_dir)}
                if ctx.is_main else None)
    accuracy_after = trainer.evaluate()
    if not ctx.is_main:
        return None
    atomic_write_json(timeline_path, {"phases": list(PHASES), "first_step": first_step + 1,
                                      "ranks": [[e.to_dict() for e in events]
                                                for events in timeline]})
    summary = {
        "task": task.key, "algorithm": config.algorithm, "seed": config.seed,
        "steps": config.steps, "world_size": ctx.world_size,
        "device": device_description(ctx.device), "backend": ctx.backend,
        "accuracy_before": accuracy_before, "accuracy_after": accuracy_after,
        "accuracy_gain_points": round(100 * (accuracy_after - accuracy_before), 1),
        "wall_seconds": round(totals["wall_seconds"], 2),
        "stage_seconds": {s: round(totals[s], 2) for s in PHASES},
        "config": dataclasses.asdict(config), "sft": sft_info,
        "model_parameters": trainer.model.num_parameters(),
    }
    if resume:
        summary["resumed_from_step"] = first_step
    atomic_write_json(run_dir / "summary.json", summary)
    from rlm_course.tools.plots import plot_learning_curve

    plot_learning_curve(rows, run_dir / "learning_curve.png", accuracy_before=accuracy_before,
                        title=f"{config.algorithm.upper()} on {task.key}, {ctx.world_size} ranks")
    session = config.steps - first_step  # the steps this process ran (the timeline's)
    last = min(3, session)
    t0 = _step_start(timeline, session - last)
    plot_timeline([[e for e in events if e.start >= t0] for events in timeline],
                  run_dir / "timeline.png", title=f"data-parallel {config.algorithm.upper()}: "
                  f"the last {last} steps on {ctx.world_size} ranks")
    return summary


def _step_start(timeline: list[list], step_index: int) -> float:
    """Start of step ``step_index`` (0-based) on the shared clock: its first generation interval
    on any rank."""
    starts = []
    for events in timeline:
        generation = [e.start for e in events if e.stage == "generation"]
        if len(generation) > step_index:
            starts.append(generation[step_index])
    return min(starts) if starts else 0.0


def check_resume(state: dict, config: RLConfig, task, nproc: int, path: Path, log=print) -> None:
    """Refuse to resume a checkpoint with another algorithm, task or options (only ``steps`` may
    change, and not below the steps done); note a different number of processes (the run then
    continues with other samples than the uninterrupted run's).

    Raises:
        ValueError: naming what differs and how to resume.
    """
    from rlm_course.rl.runs import check_resumable, process_count_note

    check_resumable(state, config, task, path)
    note = process_count_note(state.get("world_size", 1), nproc, state["trainer"]["step"])
    if note:
        log(note)


def prepare_run(task, config: RLConfig, nproc: int, name: str | None = None,
                out_dir: str | Path = "runs", overwrite: bool = False,
                sft_checkpoint: str | Path | None = None, progress: bool = True,
                log=print, resume: bool = False) -> tuple[str, str]:
    """Everything a data-parallel run checks and makes before its ranks start: the configuration
    (:func:`check_data_parallel`), the run folder (:func:`rlm_course.rl.runs.check_run_folder`), the task's
    held-out set and problem space, the warm start (made if the default checkpoint is missing)
    and its fit to the task; with ``resume``, the run's checkpoint and its options
    (:func:`check_resume`).

    Returns:
        ``(run_dir, checkpoint_path)`` as strings: the warm start, or the run's checkpoint.

    Raises:
        ValueError: naming what does not fit and how to fix it.
    """

    from rlm_course.lm.checkpoint import load_checkpoint
    from rlm_course.lm.tokenizer import CharTokenizer
    from rlm_course.rl.runs import (check_model_for_task, check_run_folder, default_sft_checkpoint,
                                    load_sft_policy, run_folder, start_notes)
    from rlm_course.tasks.eval_sets import load_eval_set
    from rlm_course.utils import ensure_writable_folder

    check_data_parallel(config, nproc)
    run_dir = run_folder(out_dir, name if name is not None
                         else f"{config.algorithm}-{task.key}-seed{config.seed}-dp{nproc}")
    check_run_folder(run_dir, resume, overwrite, sft_checkpoint)
    eval_problems = load_eval_set(task)
    task.check_problem_space(len(eval_problems) + config.prompts_per_step,
                             "the held-out set plus one step's prompts")
    tokenizer = CharTokenizer()
    if resume:
        path = run_dir / "checkpoint.pt"
        state = load_checkpoint(path)
        check_resume(state, config, task, nproc, path, log)
        model_config = state["model"].config
        log(f"Resuming {run_dir} from step {state['trainer']['step']}.")
    else:
        for note in start_notes(config):
            log(note)
        policy, _ = load_sft_policy(task, tokenizer, sft_checkpoint, progress, log)  # made if missing
        path = Path(sft_checkpoint) if sft_checkpoint else default_sft_checkpoint(task)
        model_config = policy.config
    check_model_for_task(model_config, tokenizer, task,
                         task.max_response_len + config.overlong_buffer, f"checkpoint {path}",
                         config.overlong_buffer)
    ensure_writable_folder(run_dir, "--out")  # an old run goes aside in run_rl_distributed
    return str(run_dir), str(path)


def run_rl_distributed(task, config: RLConfig, nproc: int, name: str | None = None,
                       out_dir: str | Path = "runs", overwrite: bool = False,
                       sft_checkpoint: str | Path | None = None, checkpoint_every: int = 10,
                       progress: bool = True, log=print, resume: bool = False,
                       **launch_options) -> dict:
    """The main job (``run_rl``) on ``nproc`` data-parallel processes: the same warm start and
    run files in ``runs/<name>/`` (default ``<variant>-<task>-seed<seed>-dp<nproc>``), plus
    ``timeline.json`` / ``timeline.png``; ``resume`` continues the run from its checkpoint.
    ``launch_options`` go to :func:`rlm_course.distributed.launch.launch` (e.g. ``timeout``).

    Returns:
        The summary; after a Ctrl-C, ``{"interrupted": True, "step", "run_dir"}`` (the
        checkpoint holds that step).

    Raises:
        ValueError: see :func:`prepare_run`.
        DistributedError: a rank failed (one line per rank; the tracebacks are in the run
            folder's ``failure.log``).
    """
    from rlm_course.devices import resolve_device
    from rlm_course.distributed.launch import launch

    # the launch's own options first: a refused one leaves no run folder behind
    device = resolve_device(launch_options.setdefault("device", "cpu"))
    threads = launch_options.get("threads", 1)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"--threads {threads}: give 1 or more threads per rank.")
    from rlm_course.rl.runs import SetAside

    run_dir, path = prepare_run(task, config, nproc, name, out_dir, overwrite, sft_checkpoint,
                                progress, log, resume)
    old_run = overwrite and not resume and any(Path(run_dir).iterdir())
    each = ("one GPU each, NCCL" if device == "cuda" else
            f"{threads} thread{'s' if threads != 1 else ''} each, gloo")
    share = config.prompts_per_step // nproc
    log(f"{config.algorithm.upper()} on {nproc} data-parallel processes ({each}); "
        f"{share} prompt{'s' if share != 1 else ''} x {config.group_size} responses per rank "
        "per step.")
    launch_options.setdefault("log_file", Path(run_dir) / "failure.log")
    # --overwrite: the old run stays aside until the new one has a checkpoint, and comes back
    # if it fails before (as run_rl keeps it); a failure after keeps the new run's checkpoint
    with SetAside(Path(run_dir), active=old_run) as aside:
        try:
            summary = launch(grpo_job_worker, nproc, kwargs=dict(
                task=task, config=config, run_dir=run_dir, sft_checkpoint=path,
                checkpoint_every=checkpoint_every, progress=progress, resume=resume),
                **launch_options)[0]
        finally:
            if (Path(run_dir) / "checkpoint.pt").exists():
                aside.commit()
    if summary.get("interrupted"):
        log(f"Stopped at step {summary['step']}; checkpoint and metrics are in {run_dir}. "
            "Continue by running the same command with --resume (and without --overwrite).")
        return summary
    s = summary["stage_seconds"]
    log(f"Held-out greedy accuracy: {summary['accuracy_before']:.1%} -> "
        f"{summary['accuracy_after']:.1%} ({summary['accuracy_gain_points']:+.1f} points) in "
        f"{summary['wall_seconds']:.1f} s on {nproc} processes (slowest rank per step: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in s.items()) + f"). Run files: {run_dir}/")
    return summary


# ---------------------------------------------------------------------------- one update, checked
class _FixedBatchTrainer(RLTrainer):
    """A trainer whose step trains on a given batch instead of generating one."""

    fixed: Batch

    def collect(self, step: int) -> Batch:
        return self.fixed


class _FixedBatchDistributed(DistributedRLTrainer):
    fixed: Batch

    def collect(self, step: int) -> Batch:
        return self.fixed


def _gradient(parameters) -> torch.Tensor:
    """Every parameter's ``.grad`` (zeros where None), flattened into one vector."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1)
                      for p in parameters])


def shard_batch(batch: Batch, rank: int, world_size: int, group_size: int) -> Batch:
    """Rank ``rank``'s groups of a collected batch (the whole groups of its slice of prompts).

    Raises:
        ValueError: if the batch does not split into ``world_size`` shares of whole groups.
    """
    n = batch.trained
    per = n // world_size
    if n % world_size or per % group_size:
        raise ValueError(f"a batch of {n} responses does not split into {world_size} shares of "
                         f"whole groups of {group_size}.")
    return batch.rows(torch.arange(rank * per, (rank + 1) * per))


def update_equivalence_worker(ctx: RankContext, variants=("grpo", "dapo"), prompts_per_step: int = 8,
                              group_size: int = 4, seed: int = 0,
                              unweighted: tuple = ()) -> dict:
    """For each preset of ``variants``: one update (one epoch, one mini-batch) from a fixed
    rollout batch, data-parallel on every rank of the group and, on rank 0, in one process on the
    whole batch, both in float64 from the addition warm start (DAPO without dynamic sampling:
    its ``token-mean`` loss exercises the token weighting). The presets of ``unweighted`` run
    once more without the token weighting (a plain mean over ranks), reported as
    ``"<variant> unweighted"``: what goes wrong without it.

    With several mini-batches per step each rank shuffles its own rows, so the ranks' k-th
    mini-batches together form a random mini-batch of the whole batch: another draw than the
    single process's, as valid, but not the same numbers; hence one mini-batch here.

    Returns (rank 0; ``{}`` elsewhere) ``{variant: {"param_error", "grad_error", "ranks_differ",
    "tolerance", "loss_agg", "updates"}}``: the largest absolute difference of a parameter from
    the single-process update, the largest difference of the gradient the update used relative
    to the largest single-process gradient (Adam's first step is nearly blind to the gradient's
    scale), the largest difference between ranks, and the bound of
    :func:`rlm_course.numerics.adam_tolerance` for the parameters.
    """
    from rlm_course.lm.tokenizer import CharTokenizer
    from rlm_course.numerics import adam_tolerance
    from rlm_course.algorithms import preset
    from rlm_course.rl.runs import load_sft_policy
    from rlm_course.tasks import get_task

    task, tokenizer = get_task("addition"), CharTokenizer()
    for turn in (0, 1):  # rank 0 first: it makes the warm start if it is missing
        if (ctx.rank == 0) == (turn == 0):
            base, _ = load_sft_policy(task, tokenizer, progress=False, log=lambda *a: None)
        dist.barrier()
    base = base.double()
    out = {}
    runs = [(v, True) for v in variants] + [(v, False) for v in unweighted]
    for variant, weigh_tokens in runs:
        overrides = dict(prompts_per_step=prompts_per_step, group_size=group_size,
                         minibatches=1, ppo_epochs=1, seed=seed, eval_every=10**6)
        if variant == "dapo":
            overrides["dynamic_sampling"] = False
        config = preset(variant, **overrides)
        # the fixed batch: the same on every rank (one process's generation, seeded)
        generator = RLTrainer(copy.deepcopy(base), task, tokenizer, config, [])
        batch = generator.collect(1)
        dist.barrier()
        trainer = _FixedBatchDistributed(copy.deepcopy(base), task, tokenizer, config, [],
                                         time.perf_counter(), weigh_tokens=weigh_tokens)
        trainer.fixed = shard_batch(batch, ctx.rank, ctx.world_size, group_size)
        trainer.step()
        params = torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])
        # the gradient the step used (zeroed before each backward, so still there): Adam's first
        # step moves every weight by about lr whatever the gradient's scale, so the parameters
        # alone cannot tell a gradient averaged with the wrong scale
        grads = _gradient(trainer.model.parameters())
        gathered = [torch.empty_like(params) for _ in range(ctx.world_size)]
        dist.all_gather(gathered, params)
        if ctx.is_main:
            single = _FixedBatchTrainer(copy.deepcopy(base), task, tokenizer, config, [])
            single.fixed = batch
            single.step()
            ref = torch.cat([p.detach().reshape(-1) for p in single.policy.parameters()])
            ref_grads = _gradient(single.policy.parameters())
            seq = batch.rollout.tokens.shape[1]
            updates = config.ppo_epochs * config.minibatches
            depth = 2 * (6 * base.config.n_layer + 1)
            tolerance = adam_tolerance(torch.float64, batch.trained * seq,
                                       config.lr_at(1), updates, depth=depth)
            out[variant if weigh_tokens else f"{variant} unweighted"] = {"param_error": (params - ref).abs().max().item(),
                            "grad_error": ((grads - ref_grads).abs().max()
                                           / ref_grads.abs().max()).item(),
                            "ranks_differ": max((g - params).abs().max().item() for g in gathered),
                            "tolerance": tolerance, "loss_agg": config.loss_agg,
                            "updates": updates}
        dist.barrier()
    return out if ctx.is_main else {}
