"""``python -m rlm_course distributed <worker> --nproc N``: the ``torchrun`` command of one
machine, printed and run, with the command that runs the same worker on several machines."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from rlm_course.distributed.__main__ import WORKERS


def torchrun_command(worker: str, nproc: int, rest: list[str] | None = None,
                     nnodes: int = 1, endpoint: str | None = None) -> list[str]:
    """The ``torchrun`` command line that runs ``worker`` on ``nproc`` processes per machine:
    ``--standalone`` on one machine, or ``--nnodes`` machines meeting at ``endpoint``
    (``HOST:PORT``) through the c10d rendezvous.

    Raises:
        ValueError: for an unknown worker, a non-positive count, or several machines without an
            endpoint.
    """
    if worker not in WORKERS:
        raise ValueError(f"unknown worker {worker!r}; choose one of {', '.join(WORKERS)}.")
    if nproc < 1:
        raise ValueError(f"--nproc {nproc}: give 1 or more processes per machine.")
    if nnodes < 1:
        raise ValueError(f"nnodes={nnodes}: give 1 or more machines.")
    launcher = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1:
        launcher += ["--standalone"]
    else:
        if not endpoint:
            raise ValueError("several machines need a rendezvous endpoint HOST:PORT (one of them).")
        launcher += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                     f"--rdzv-id=rlm-course-{worker}"]
    return launcher + [f"--nproc-per-node={nproc}", "-m", "rlm_course.distributed", worker,
                       *(rest or [])]


def run_torchrun(worker: str, nproc: int, rest: list[str] | None = None) -> int:
    """Print and run :func:`torchrun_command` on this machine (one thread per process unless
    ``OMP_NUM_THREADS`` says otherwise); return its exit status. Also prints the same worker's
    command for several machines."""
    rest, nproc = _pop_nproc(list(rest or []), nproc)
    command = torchrun_command(worker, nproc, rest)
    multi = torchrun_command(worker, nproc, rest, nnodes=2, endpoint="HOST:29400")
    show = ["torchrun", *command[3:]]
    print("running: " + shlex.join(show), file=sys.stderr)
    print("on several machines, run on each: " + shlex.join(["torchrun", *multi[3:]]),
          file=sys.stderr, flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run(command, env=env).returncode


def _pop_nproc(rest: list[str], nproc: int) -> tuple[list[str], int]:
    """``--nproc N`` given after the worker's name (where the command line collects the worker's
    own options) still sets the process count."""
    out = []
    it = iter(rest)
    for arg in it:
        if arg == "--nproc":
            value = next(it, None)
            if value is None:
                raise ValueError("--nproc needs a number.")
            nproc = int(value)
        elif arg.startswith("--nproc="):
            nproc = int(arg.split("=", 1)[1])
        else:
            out.append(arg)
    return out, nproc
