"""The Ray worker of chapters 12-13: one process per device, hosting one or more roles.

:class:`RLWorker` is the actor class the controller (:mod:`rlm_course.systems.controller`) starts
on each device, built from one mixin per role: a worker hosting the ``actor`` role holds a trainer
(:class:`TrainerMixin`: an :class:`~rlm_course.rl.trainer.RLTrainer` with policy, reference and
optimizer); one hosting ``rollout`` holds a rollout engine (:class:`RolloutMixin`: its own copy of
the policy, generating with ``RLTrainer.collect`` or a
:class:`~rlm_course.systems.async_rl.PartialRollout`); a colocated worker holds both, and hands the
weights over in process. :class:`FusionMixin` serves stage fusion, :class:`WeightSyncMixin` and
:class:`ReshardMixin` the measurements of chapter 12, and :class:`WorkerBase` the plumbing every
worker needs (its process group, its events). Every method records what it did on the worker's
:class:`~rlm_course.timeline.Recorder`; the logic lives in the concept modules
(:mod:`~rlm_course.systems.weight_sync`, :mod:`~rlm_course.systems.resharding`,
:mod:`~rlm_course.systems.async_rl`, :mod:`~rlm_course.systems.fusion`), which these methods call.

The controller calls a method by reference (``controller.call(workers, RLWorker.train, batch)``):
a misspelt name is an ``AttributeError`` in the driver, before anything runs.

Workers run ``threads`` intra-op threads each and may run two methods at once (the controller
starts them with ``max_concurrency=2``), so that the trainer can send its last weights while it
trains on the next batch; the trainer's weights for sending are a copy made at the end of each
step (:meth:`TrainerMixin.train`), never the ones being updated.
"""

from __future__ import annotations

import copy
import datetime
import os
import socket
import threading
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.distributed as dist

from rlm_course.algorithms import RLConfig
from rlm_course.lm.checkpoint import load_checkpoint, save_checkpoint
from rlm_course.lm.model import ModelConfig, TinyGPT
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.batch import Batch
from rlm_course.rl.evaluate import evaluate
from rlm_course.rl.trainer import RLTrainer
from rlm_course.systems import resharding, weight_sync
from rlm_course.systems.async_rl import (PartialRollout, PipelineConfig, head_versions,
                                         tag_versions)
from rlm_course.systems.fusion import score_rows
from rlm_course.timeline import Recorder
from rlm_course.tasks import get_task
from rlm_course.tasks.eval_sets import load_eval_set
from rlm_course.utils import derived_seed, free_port


class WorkerBase:
    """What every worker does: describe itself, join the process group and its subgroups, keep
    its events.

    Args:
        name: e.g. ``"rollout/0"``; roles: the roles it hosts; threads: torch intra-op threads.
    """

    def __init__(self, name: str, roles: tuple[str, ...], threads: int = 1) -> None:
        torch.set_num_threads(threads)
        self.name, self.roles = name, tuple(roles)
        self.recorder = Recorder(name)
        self.lock = threading.Lock()
        self.groups: dict = {}
        self.group_ranks: dict[str, list[int]] = {}
        self.rank = -1
        self.device = "cpu"
        self.trainer = self.rollout_trainer = self.rollout_model = None
        self.version = self.rollout_version = 0
        self.inflight = None

    def describe(self) -> dict:
        return {"name": self.name, "roles": self.roles, "pid": os.getpid(),
                "node": socket.gethostname(), "threads": torch.get_num_threads()}

    def clock(self) -> float:
        return time.time()

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's address and a free port, for rank 0 of the process group."""
        try:
            import ray

            address = ray.util.get_node_ip_address()
        except Exception:
            address = "127.0.0.1"
        return address, free_port()

    def setup_distributed(self, address: str, port: int, world_size: int, rank: int,
                          groups: dict[str, list[int]], backend: str, timeout: float) -> int:
        """Join the process group as ``rank`` and create every named subgroup (all ranks create
        all of them, in the same order, as ``dist.new_group`` requires)."""
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address, str(port)
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        self.rank, self.group_ranks = rank, dict(groups)
        self.device = "cuda" if backend == "nccl" else "cpu"
        for name in sorted(groups):
            group = dist.new_group(groups[name])
            if rank in groups[name]:
                self.groups[name] = group
        return rank

    def take_events(self) -> list:
        return self.recorder.take()

    def _broadcast(self, buffer: torch.Tensor, src: int, group) -> None:
        """``dist.broadcast`` of a buffer: in place when it is on the backend's device, through
        the worker's GPU when it is a CPU buffer and the backend is NCCL (which moves only GPU
        tensors)."""
        if buffer.device.type == self.device:
            dist.broadcast(buffer, src, group=group)
        else:
            staged = buffer.to(self.device)
            dist.broadcast(staged, src, group=group)
            buffer.copy_(staged.cpu())


class WeightSyncMixin:
    """Chapter 12's weight-sync measurements: a model to move, bucketed broadcasts of it timed over
    a named group, and the colocated hand-over in process."""

    def time_broadcasts(self, sizes, repeats: int, group: str, src: int) -> dict:
        return weight_sync.time_broadcasts(sizes, repeats, self.groups[group], src, self.device)

    def make_model(self, model_config: dict, seed: int = 0) -> int:
        """A model of ``model_config`` (a :class:`~rlm_course.lm.model.ModelConfig` as a dict),
        its weights drawn from ``seed``; returns its bytes."""
        torch.manual_seed(seed)
        self.model = TinyGPT(ModelConfig(**model_config)).to(self.device)
        return sum(t.numel() * t.element_size() for t in self.model.state_dict().values())

    def perturb_model(self, seed: int) -> None:
        """Change every weight (so that a sync has something to move)."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(torch.randn(p.shape, generator=generator).to(p.device))

    def timed_sync(self, bucket_bytes: int | None, group: str, src: int, repeats: int) -> dict:
        """``repeats`` bucketed broadcasts of this worker's model from global rank ``src``
        (``bucket_bytes=None``: one broadcast per tensor), each after a barrier; returns the
        seconds of each and the bucket sizes."""
        g = self.groups[group]
        tensors = weight_sync.state_tensors(self.model)
        biggest = max(t.numel() * t.element_size() for t in tensors)
        times, sizes = [], []
        for _ in range(repeats):
            dist.barrier(group=g)
            with self.recorder("sync") as detail:
                start = time.perf_counter()
                if bucket_bytes is None:  # one message per tensor
                    sizes = [weight_sync.bucketed_broadcast([t], biggest, lambda b: dist.broadcast(b, src, group=g))[0]
                             for t in tensors]
                else:
                    sizes = weight_sync.bucketed_broadcast(tensors, bucket_bytes,
                                               lambda b: dist.broadcast(b, src, group=g))
                times.append(time.perf_counter() - start)
                detail.update(bytes=sum(sizes), buckets=len(sizes))
        return {"seconds": times, "bucket_bytes": sizes}

    def model_state(self) -> dict:
        """The model's state dict (CPU copies), to check a sync bit for bit."""
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def timed_handover(self, repeats: int) -> dict:
        """Colocated hand-over: copy this worker's model into a second copy in process."""
        target = copy.deepcopy(self.model)
        times, copied = [], 0
        for _ in range(repeats):
            with self.recorder("sync") as detail:
                start = time.perf_counter()
                copied = weight_sync.handover(self.model, target)
                times.append(time.perf_counter() - start)
                detail.update(bytes=copied, in_process=True)
        same = all(torch.equal(a, b) for a, b in zip(self.model.state_dict().values(),
                                                     target.state_dict().values()))
        return {"seconds": times, "bytes": copied, "identical": same}


class ReshardMixin:
    """Chapter 12's resharding from the training layout to the generation layout."""

    def reshard(self, full_state: dict, tp: int, tp_gen: int, scheme: str, group: str) -> dict:
        """Cut this rank's training shards from ``full_state``, move them to the generation
        layout with ``scheme`` over the named ``group``, and check the result against the full
        weights. Returns the statistics of :func:`rlm_course.systems.resharding.reshard` and
        ``identical``."""
        local = {k: v.to(self.device) for k, v in resharding.training_shards(full_state, self.rank, tp).items()}
        full_state = {k: v.to(self.device) for k, v in full_state.items()}
        with self.recorder("reshard") as detail:
            generation, stats = resharding.reshard(local, self.rank, tp, tp_gen, scheme, self.groups[group])
            detail.update(bytes=stats["received_bytes"], scheme=scheme)
        stats["identical"] = resharding.check_identical(generation, full_state, self.rank, tp, tp_gen, scheme)
        return stats


class RolloutMixin:
    """The ``rollout`` role: generate batches with the rollout engine's weights (in one piece, or as
    a partial rollout that new weights can interrupt), and receive new weights."""

    def generate(self, step: int) -> Batch:
        """Generate and score (verifier) the batch of iteration ``step`` in one piece."""
        with self.recorder("generation", version=self.rollout_version, step=step) as detail:
            batch = tag_versions(self.rollout_trainer.collect(step), self.rollout_version)
            detail.update(tokens=int(batch.lengths.sum()), responses=batch.generated)
        return batch.to("cpu")  # through Ray's object store on the host, as verl's batches go

    def start_and_advance(self, step: int, max_tokens: int):
        """Start the batch of iteration ``step`` as a partial rollout and decode its first
        ``max_tokens`` tokens (see :meth:`advance`)."""
        self.inflight = PartialRollout(self.rollout_trainer, step)
        return self.advance(max_tokens)

    def advance(self, max_tokens: int):
        """Decode up to ``max_tokens`` more tokens of the batch in flight with the current
        weights; returns the finished batch, or None if sequences are left."""
        batch, step = None, self.inflight.step
        with self.recorder("generation", version=self.rollout_version, step=step) as detail:
            detail["tokens"] = self.inflight.advance(self.rollout_model, self.rollout_version,
                                                     max_tokens)
            if self.inflight.done:
                batch = self.inflight.batch().to("cpu")
                self.inflight = None
        return batch

    def recv_weights(self, bucket_bytes: int) -> int:
        """Receive the trainer's weights into the rollout engine; returns their version."""
        group, src = self.groups["sync"], self.group_ranks["sync"][0]
        start = self.recorder.clock()
        version = torch.zeros(1, dtype=torch.long, device=self.device)
        dist.broadcast(version, src, group=group)
        sizes = weight_sync.bucketed_broadcast(weight_sync.state_tensors(self.rollout_model), bucket_bytes,
                                   lambda b: self._broadcast(b, src, group))
        self.rollout_version = int(version)
        self.recorder.add("sync", start, self.recorder.clock(), version=self.rollout_version,
                          bytes=sum(sizes), buckets=len(sizes))
        return self.rollout_version


class TrainerMixin:
    """The ``actor`` role: train on a batch, stage and send the new weights (or hand them over in
    process when colocated), checkpoint, and evaluate the snapshots after the run."""

    def train(self, batch: Batch) -> dict:
        """One iteration of the trainer on ``batch`` (scoring, then the update); stages the new
        weights for sending, writes a checkpoint and keeps an evaluation snapshot when due.

        Returns:
            the trainer's metrics, plus ``tokens`` (response tokens trained), ``head_versions``,
            ``response_lengths``, ``token_version_counts`` and ``checkpoint`` (whether one was
            written).
        """
        trainer, pipe = self.trainer, self.pipe
        step = trainer.step_count + 1
        start = self.recorder.clock()
        batch = batch.to(trainer.device)
        metrics = trainer.step(batch)
        end = self.recorder.clock()
        scoring = metrics.get("seconds_scoring", 0.0)
        self.recorder.add("scoring", start, start + scoring, version=step - 1, step=step)
        self.recorder.add("training", start + scoring, end, version=step, step=step)
        self.version = step
        staged = [t.detach().clone() for t in weight_sync.state_tensors(trainer.policy)]
        with self.lock:
            self.staged, self.staged_version = staged, step
        saved = False
        if self.spec.get("run_dir") and self.spec.get("dp_rank", 0) == 0 and (
                step % pipe.checkpoint_every == 0 or step == self.config.steps):
            self._checkpoint(step)
            saved = True
        if step % pipe.eval_every == 0 or step == self.config.steps:
            self.snapshots.append((step, time.time(), self._weights()))
        rollout = batch.rollout
        versions = batch.versions[rollout.response_mask]
        out = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        out.update(tokens=int(rollout.response_mask.sum()),
                   head_versions=head_versions(batch.versions),
                   response_lengths=[int(x) for x in rollout.response_lengths()],
                   token_version_counts=dict(Counter(int(v) for v in versions)),
                   checkpoint=saved)
        return out

    def _checkpoint(self, step: int) -> None:
        path = Path(self.spec["run_dir"]) / "checkpoint.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        save_checkpoint(path, self.trainer.policy, task=self.task.key,
                        algorithm=self.config.algorithm, config=asdict(self.config),
                        trainer=self.trainer.state_dict(), step=step,
                        pipeline=self.spec["pipeline"],
                        sft={"checkpoint": self.spec["checkpoint"],
                             "command": self.spec.get("sft_command")})

    def send_weights(self, bucket_bytes: int) -> int:
        """Broadcast the staged weights (the last finished step's) to the rollout workers over
        the ``sync`` group; returns their version."""
        with self.lock:
            tensors, version = self.staged, self.staged_version
        group = self.groups["sync"]
        start = self.recorder.clock()
        dist.broadcast(torch.tensor([version], device=self.device), self.rank, group=group)
        sizes = weight_sync.bucketed_broadcast(tensors, bucket_bytes,
                                   lambda b: self._broadcast(b, self.rank, group))
        self.recorder.add("sync", start, self.recorder.clock(), version=version,
                          bytes=sum(sizes), buckets=len(sizes))
        return version

    def handover(self) -> int:
        """Colocated: load the trainer's weights into the rollout engine in process."""
        start = self.recorder.clock()
        copied = weight_sync.handover(self.trainer.policy, self.rollout_model)
        self.rollout_version = self.version
        self.recorder.add("sync", start, self.recorder.clock(), version=self.version,
                          bytes=copied, in_process=True)
        return copied

    def policy_state(self) -> dict:
        """The trainer's current weights (CPU copies)."""
        return {k: v.detach().cpu().clone() for k, v in self.trainer.policy.state_dict().items()}

    def evaluate_snapshots(self) -> list[dict]:
        """Held-out greedy accuracy of every snapshot: ``[{"version", "time", "accuracy"}]``
        (``time``: this worker's clock when the snapshot's step ended)."""
        model = copy.deepcopy(self.trainer.policy)
        out = []
        for version, when, state in self.snapshots:
            model.load_state_dict(state)
            with self.recorder("evaluation", version=version):
                accuracy = evaluate(model, self.task, self.eval_problems, self.tokenizer).accuracy
            out.append({"version": version, "time": when, "accuracy": accuracy})
        return out

    def _weights(self) -> dict:
        return {k: v.detach().clone() for k, v in self.trainer.policy.state_dict().items()}


class FusionMixin:
    """Stage fusion: a share of the prompts generated as a partial rollout, its stragglers
    exported to (or adopted from) other workers, and finished rows scored while others decode."""

    def fusion_start(self, step: int, share: int, shares: int) -> int:
        """Start this worker's share of iteration ``step``'s prompts (no tokens yet)."""
        self.inflight = PartialRollout(self.rollout_trainer, step, share, shares)
        return len(self.inflight.rows)

    def fusion_generate(self, max_tokens: int, adopt: list | None = None) -> int:
        """Adopt ``adopt`` (sequences of other workers), then decode up to ``max_tokens`` tokens
        of every unfinished sequence; returns how many are still unfinished."""
        if adopt:
            self.inflight.adopt(adopt)
        with self.recorder("generation", version=self.rollout_version,
                           step=self.inflight.step) as detail:
            detail["tokens"] = self.inflight.advance(self.rollout_model, self.rollout_version,
                                                     max_tokens)
            detail["sequences"] = len(self.inflight.rows)
        return self.inflight.unfinished()

    def fusion_export(self) -> list:
        return self.inflight.export_unfinished()

    def fusion_take_finished(self) -> list:
        return self.inflight.take_finished()

    def fusion_score(self, rows: list) -> dict:
        """Experience preparation of finished sequences: reward, and the log-probabilities under
        the policy and the reference (:func:`rlm_course.systems.fusion.score_rows`)."""
        if not rows:
            return {"index": [], "reward": [], "old_log_probs": [], "ref_log_probs": []}
        with self.recorder("scoring", step=self.inflight.step if self.inflight else 0) as detail:
            out = score_rows(self.trainer, rows)
            detail["sequences"] = len(rows)
        return out


class RLWorker(RolloutMixin, TrainerMixin, FusionMixin, WeightSyncMixin, ReshardMixin, WorkerBase):
    """One process of a worker group (see the module docstring): every role's methods, and
    :meth:`rl_setup`, which builds the objects of the roles the worker hosts."""

    def rl_setup(self, spec: dict) -> dict:
        """Load the warm start and build the roles' objects (see the module docstring).

        ``spec``: ``task``, ``task_settings``, ``config`` (an RLConfig as a dict), ``checkpoint``,
        ``pipeline`` (a PipelineConfig as a dict), ``run_dir``, ``dp_rank``, ``dp_size``."""
        self.spec = spec
        self.pipe = PipelineConfig(**spec["pipeline"])
        task = get_task(spec["task"], **spec["task_settings"])
        config = RLConfig(**spec["config"])
        dp_rank, dp_size = spec.get("dp_rank", 0), spec.get("dp_size", 1)
        if dp_size > 1:  # each data-parallel worker samples its own share of the prompts
            config = replace(config, prompts_per_step=config.prompts_per_step // dp_size,
                             seed=derived_seed(config.seed, 7, dp_rank))
        self.task, self.config, self.tokenizer = task, config, CharTokenizer()
        self.eval_problems = load_eval_set(task)
        # on the worker's device: its GPU when the group runs NCCL (one GPU per Ray bundle)
        policy = load_checkpoint(spec["checkpoint"])["model"].to(self.device)
        if "actor" in self.roles:
            self.trainer = RLTrainer(policy, task, self.tokenizer, config, self.eval_problems)
            if dp_size > 1:
                group = next(self.groups[n] for n in self.groups if "actor" in n.split("+"))
                _average_gradients(self.trainer.policy, group, dp_size)
            self.staged = [t.detach().clone() for t in weight_sync.state_tensors(policy)]
            self.staged_version = 0
            self.snapshots = [(0, time.time(), self._weights())]
        if "rollout" in self.roles:
            self.rollout_model = copy.deepcopy(policy)
            self.rollout_trainer = RLTrainer(self.rollout_model, task, self.tokenizer, config,
                                             self.eval_problems)
        self.version = self.rollout_version = 0
        return {"parameters": policy.num_parameters(), "max_new_tokens": task.max_response_len}


def _average_gradients(model: torch.nn.Module, group, world: int) -> None:
    """Data parallelism without a wrapper: as each parameter's gradient is complete in the
    backward pass, all-reduce it over ``group`` and divide by ``world`` (what DDP does, per
    parameter instead of per bucket), so every worker takes the same optimizer step."""
    def hook(p: torch.Tensor) -> None:
        dist.all_reduce(p.grad, group=group)
        p.grad.div_(world)

    for p in model.parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)
