"""``python -m rlm_course distributed <worker> [launcher options] [-- worker options]``: the
``torchrun`` command of one machine, checked, printed and run, with the command that runs the same
worker on several machines.

Launcher options (before ``--``): ``--nproc N`` (processes), ``--port P`` (the rendezvous port on
127.0.0.1; default: a free one), ``--device``, ``--threads`` (per rank), ``--timeout`` (seconds a
collective waits), ``--debug`` (every failed rank's traceback on the screen, also
``RLM_COURSE_DEBUG=1``). Everything after ``--`` goes to the worker (``-- --help`` shows its
options); options before ``--`` that are not the launcher's go to the worker too. E.g.::

    python -m rlm_course distributed strategies --nproc 4 -- --strategies tp pp_1f1b
    python -m rlm_course distributed grpo --nproc 2 --port 29511 -- --task addition --steps 20

The worker's options are checked before torchrun starts (one line and exit code 2 when they
cannot run). Torchrun runs in this process, so that a failure reads as one line per rank (its
exception; the full tracebacks go to a log folder that the last line names) and one line from
the launcher, instead of every rank's traceback and torchrun's own; a Ctrl-C stops the ranks
(data-parallel GRPO saves a checkpoint first) and exits with code 130.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import tempfile

from rlm_course.distributed.__main__ import WORKERS


def torchrun_command(worker: str, nproc: int, rest: list[str] | None = None,
                     nnodes: int = 1, endpoint: str | None = None, port: int | None = None,
                     common: list[str] | None = None) -> list[str]:
    """The ``torchrun`` command line that runs ``worker`` on ``nproc`` processes per machine:
    ``--standalone`` on one machine (or, with ``port``, a rendezvous on ``127.0.0.1:port``), or
    ``--nnodes`` machines meeting at ``endpoint`` (``HOST:PORT``) through the c10d rendezvous.
    ``common``: options of ``rlm_course.distributed`` that come before the worker's name
    (``--device``, ``--threads``, ``--timeout``); ``rest``: the worker's own.

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
    if nnodes == 1 and port is None:
        launcher += ["--standalone"]
    elif nnodes == 1:
        launcher += ["--nnodes=1", "--master-addr=127.0.0.1", f"--master-port={port}"]
    else:
        if not endpoint:
            raise ValueError("several machines need a rendezvous endpoint HOST:PORT (one of them).")
        launcher += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                     f"--rdzv-id=rlm-course-{worker}"]
    return launcher + [f"--nproc-per-node={nproc}", "-m", "rlm_course.distributed",
                       *(common or []), worker, *(rest or [])]


def launcher_parser() -> argparse.ArgumentParser:
    """The launcher options of ``python -m rlm_course distributed <worker>`` (see the module
    docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m rlm_course distributed <worker>", allow_abbrev=False, add_help=False,
        description="Run a worker of rlm_course.distributed under torchrun on this machine: "
                    "launcher options, then -- and the worker's options (-- --help lists them).")
    parser.add_argument("--nproc", type=int, default=None, help="processes (default 2)")
    parser.add_argument("--port", type=int, default=None,
                        help="rendezvous port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None)
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads per rank")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds a collective waits for its peers")
    parser.add_argument("--debug", action="store_true",
                        help="show every failed rank's traceback (also RLM_COURSE_DEBUG=1)")
    parser.add_argument("-h", "--help", action="store_true", help="this help, and the worker's")

    def error(message: str):
        raise ValueError(f"distributed: {message}; see `python -m rlm_course distributed "
                         "<worker> --help`.")

    parser.error = error
    return parser


def split_options(rest: list[str], nproc: int = 2) -> tuple[argparse.Namespace, list[str]]:
    """``rest`` (what follows the worker's name) as the launcher's options and the worker's:
    everything after ``--`` is the worker's; before it, the launcher's options are taken out and
    the others go to the worker. ``nproc``: the count given before the worker's name.

    Raises:
        ValueError: a launcher option with a bad value (one line).
    """
    rest = list(rest or [])
    cut = rest.index("--") if "--" in rest else len(rest)
    launcher, extra = launcher_parser().parse_known_args(rest[:cut])
    if launcher.nproc is None:
        launcher.nproc = nproc
    return launcher, extra + rest[cut + 1:]


def run_torchrun(worker: str, nproc: int, rest: list[str] | None = None) -> int:
    """Check the worker's options (:func:`rlm_course.distributed.__main__.check_worker_options`),
    print and run :func:`torchrun_command` on this machine (one thread per process unless
    ``OMP_NUM_THREADS`` says otherwise), and return its exit status: 0, 1 when a rank failed (one
    line per rank), 130 when interrupted. Also prints the same worker's command for several
    machines.

    Raises:
        ValueError: an unknown worker, a bad launcher option, worker options that do not parse or
            cannot run on ``nproc`` ranks, a port in use: one line, before anything starts.
    """
    from rlm_course.distributed.__main__ import check_worker_options
    from rlm_course.distributed.launch import (DEBUG_ENV, check_port, check_rank_memory,
                                               debug_enabled, oversubscription, resolve_device)

    if worker in ("-h", "--help"):
        launcher_parser().print_help()
        return 0
    if worker not in WORKERS:
        raise ValueError(f"unknown worker {worker!r}; choose one of {', '.join(WORKERS)}.")
    launcher, options = split_options(rest, nproc)
    if launcher.help:
        launcher_parser().print_help()
        print(f"\nThe options of the {worker} worker (after --):")
        options = ["--help"]
    nproc = launcher.nproc
    if nproc < 1:
        raise ValueError(f"--nproc {nproc}: give 1 or more processes.")
    common = []
    for name in ("device", "threads", "timeout"):
        value = getattr(launcher, name)
        if value is not None:
            common += [f"--{name}", str(value)]
    if worker == "grpo" and "--threads" in options:  # grpo's --threads: threads per rank
        i = options.index("--threads")
        common += options[i:i + 2]
        del options[i:i + 2]
    check_worker_options(worker, options, nproc, common)  # exits after printing --help
    if launcher.device is not None:
        resolve_device(launcher.device)
    if launcher.port is not None:
        try:
            check_port(launcher.port)
        except ValueError as err:
            text = str(err).replace(f"port={launcher.port!r}: ", "")
            text = text.replace("or None to let the launcher pick a free one",
                                "or leave out --port for a free one")
            raise ValueError(f"--port {launcher.port}: " + text.replace(
                "pass port=None to pick a free port", "leave out --port for a free one")
                .replace(f"port {launcher.port} is ", "")) from None
    threads = int(common[common.index("--threads") + 1]) if "--threads" in common else 1
    on_cpu = resolve_device(launcher.device or "auto") == "cpu"
    if on_cpu:
        check_rank_memory(nproc, "--nproc")
    note = oversubscription(nproc, threads)
    if note and on_cpu:
        print(f"Note: {note}", file=sys.stderr)
    command = torchrun_command(worker, nproc, options, port=launcher.port, common=common)
    multi = torchrun_command(worker, nproc, options, nnodes=2, endpoint="HOST:29400",
                             common=common)
    print("running: " + shlex.join(["torchrun", *command[3:]]), file=sys.stderr)
    print("on several machines, run on each: " + shlex.join(["torchrun", *multi[3:]]),
          file=sys.stderr, flush=True)
    log_dir = tempfile.mkdtemp(prefix="rlm_course-torchrun-")
    env = {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "RLM_COURSE_LOG_DIR": log_dir}
    if launcher.debug:
        env[DEBUG_ENV] = "1"
    return _run_in_process(command[3:], env, nproc, log_dir, debug_enabled() or launcher.debug)


def _run_in_process(torchrun_args: list[str], env: dict, nproc: int, log_dir: str,
                    debug: bool) -> int:
    """Run torchrun's launcher (``torch.distributed.run``) in this process with ``env`` added to
    the environment; turn its failures into one line."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    # torch's elastic loggers each carry their own level (a parent's does not reach them)
    elastic = [logging.getLogger(name) for name in
               ["torch.distributed.elastic", *(n for n in logging.root.manager.loggerDict
                                               if n.startswith("torch.distributed.elastic."))]]
    levels = [logger.level for logger in elastic]
    if not debug:  # the ranks say what failed; the agent's own lines repeat it
        for logger in elastic:
            logger.setLevel(logging.CRITICAL)
    try:
        run(parse_args(torchrun_args))
        return 0
    except ChildFailedError as err:
        failed = []
        for rank, failure in sorted(err.failures.items()):
            how = (f"signal {failure.signal_name()}" if failure.exitcode < 0
                   else f"exit code {failure.exitcode}")
            failed.append(f"rank {rank} ({how})")
        print(f"error: torchrun: {len(failed)} of {nproc} rank(s) failed: {', '.join(failed)}; "
              f"each rank's line is above, their tracebacks in {log_dir}/", file=sys.stderr)
        return 1
    except (SignalException, KeyboardInterrupt):
        print("torchrun: interrupted; the ranks have stopped.", file=sys.stderr)
        return 130
    finally:
        for logger, level in zip(elastic, levels):
            logger.setLevel(level)
        try:  # a run that logged nothing leaves no folder behind
            os.rmdir(log_dir)
        except OSError:
            pass
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
