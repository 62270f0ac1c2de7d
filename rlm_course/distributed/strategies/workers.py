"""The workers each rank runs: the equivalence check and the timing."""

from __future__ import annotations

import time
from dataclasses import asdict

import torch
import torch.distributed as dist

from rlm_course.distributed.comm import CommCounter, comm_seconds, profiled, wire_bytes
from rlm_course.distributed.launch import RankContext
from rlm_course.distributed.strategies.setup import (Setup, make_model, make_tokens, lm_loss,
                                                     make_optimizer)
from rlm_course.distributed.strategies.run import StrategyRun


def _progress(names, ctx: RankContext, desc: str, progress: bool):
    from tqdm.auto import tqdm

    return tqdm(names, desc=desc, disable=not (progress and ctx.is_main))


def equivalence_worker(ctx: RankContext, names: list[str], setup: Setup,
                       progress: bool = False) -> dict:
    """For each strategy: ``steps`` steps of training; the losses, the first step's gradients, the
    final parameters (full tensors by name), and what the last step sent (not the first ones:
    pipelining exchanges shapes in its first step, DDP settles its buckets in its second): the
    counted calls,
    the bytes this rank sent (ring/tree conventions) and, on Linux, the bytes written to its
    sockets (``wire``)."""
    out = {}
    for name in _progress(names, ctx, f"strategies on {ctx.world_size} ranks", progress):
        run = StrategyRun(name, ctx, setup)
        losses, grads = [], {}
        for step in range(setup.steps):
            dist.barrier()
            if step == setup.steps - 1:
                wire0 = wire_bytes()
                with CommCounter() as counter:
                    losses.append(run.step())
                wire1 = wire_bytes()
            else:
                losses.append(run.step(
                    (lambda: grads.update(run.grads())) if step == 0 else None))
        out[name] = {"losses": losses, "grads": grads, "params": run.params(),
                     "calls": [asdict(c) for c in counter.calls], "sent": counter.sent,
                     "received": counter.received,
                     "wire": None if wire0 is None or wire1 is None else wire1 - wire0}
        dist.barrier()
    return out


def _synchronize(ctx: RankContext) -> None:
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def timing_worker(ctx: RankContext, names: list[str], setup: Setup, steps: int = 3,
                  progress: bool = False) -> dict:
    """For each strategy: one warm-up step, ``steps`` timed steps (``"seconds"``, this rank's wall
    time, a barrier before each), then ``steps`` steps under ``torch.profiler`` (``"profiled"``
    wall seconds and ``"comm_seconds"``, the time this rank's backend spent communicating,
    :func:`~rlm_course.distributed.comm.comm_seconds`; the profiler slows the step a little, so
    the share is taken within the profiled steps). Rank 0 also times one process training on
    the whole batch (``"one_process"``, seconds per step) while the others wait. On CUDA the
    steps are timed to the GPU's completion, but the profiler's CPU records of NCCL calls time
    their launch, not the transfer: read the communication share from a CUDA trace there."""
    out = {}
    for name in _progress(names, ctx, f"timing on {ctx.world_size} ranks", progress):
        run = StrategyRun(name, ctx, setup)
        run.step()
        plain, profiled_seconds, comm = [], [], []
        for _ in range(steps):
            dist.barrier()
            start = time.perf_counter()
            run.step()
            _synchronize(ctx)
            plain.append(time.perf_counter() - start)
        for _ in range(steps):
            dist.barrier()
            with profiled() as prof:
                start = time.perf_counter()
                run.step()
                _synchronize(ctx)
                profiled_seconds.append(time.perf_counter() - start)
            comm.append(comm_seconds(prof))
        out[name] = {"seconds": plain, "profiled": profiled_seconds, "comm_seconds": comm}
        del run
        dist.barrier()
    if ctx.rank == 0:
        model, tokens = make_model(setup), make_tokens(setup)
        optimizer = make_optimizer(model.parameters(), setup)

        def one_step():
            optimizer.zero_grad(set_to_none=True)
            lm_loss(model(tokens[:, :-1]), tokens[:, 1:]).backward()
            optimizer.step()

        one_step()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            one_step()
            times.append(time.perf_counter() - start)
        out["one_process"] = times
    dist.barrier()
    return out
