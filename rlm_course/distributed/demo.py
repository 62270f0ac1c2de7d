"""Small workers that show what a process group is and what happens when a rank fails (chapter
11's first section, and the launcher's tests)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from rlm_course.distributed.launch import RankContext


def hello(ctx: RankContext) -> dict:
    """Each rank contributes ``rank + 1``; one all-reduce sums them on every rank.

    Returns:
        ``{"rank", "world_size", "pid", "backend", "threads", "sum"}``; ``sum`` is
        ``world_size (world_size + 1) / 2`` on every rank.
    """
    x = torch.tensor([float(ctx.rank + 1)], device=ctx.device)
    dist.all_reduce(x)
    return {"rank": ctx.rank, "world_size": ctx.world_size, "pid": os.getpid(),
            "backend": ctx.backend, "threads": torch.get_num_threads(), "sum": x.item()}


FAULTS = ("raise", "exit", "hang", "none")


def faulty(ctx: RankContext, failing_rank: int = 1, how: str = "raise", steps: int = 10**6,
           ready_file: str | None = None) -> int:
    """All ranks all-reduce in a loop; rank ``failing_rank`` fails after its first all-reduce:
    ``"raise"`` raises a ``ValueError``, ``"exit"`` ends its process with exit code 3 (no
    traceback), ``"hang"`` sleeps forever outside any collective, ``"none"`` keeps going (to be
    killed from outside, e.g. by PID). With ``ready_file``, every rank touches
    ``<ready_file>.<rank>`` once its first all-reduce has run. Returns the number of all-reduces
    (only if nothing fails within ``steps``).

    Raises:
        ValueError: for an unknown ``how``; on purpose on the failing rank with ``"raise"``.
    """
    if how not in FAULTS:
        raise ValueError(f"how={how!r}: choose one of {FAULTS}.")
    x = torch.ones(1024, device=ctx.device)
    for step in range(steps):
        dist.all_reduce(x)
        x.fill_(1.0)
        if step == 0 and ready_file:
            open(f"{ready_file}.{ctx.rank}", "w").close()
        if ctx.rank == failing_rank and step == 0:
            if how == "raise":
                raise ValueError(f"rank {ctx.rank} fails on purpose")
            if how == "exit":
                os._exit(3)
            if how == "hang":
                time.sleep(3600)
    return steps
