"""Start real process groups: ``torch.multiprocessing`` from a notebook or a script, ``torchrun``
from a shell (and on several machines).

:func:`launch` runs ``worker(ctx, *args)`` on ``nprocs`` new processes, each with its own rank of
one ``torch.distributed`` process group, and returns what each rank's worker returned, in rank
order. ``ctx`` is a :class:`RankContext` (rank, world size, backend, device).

* **Workers live in a module.** A new process imports the worker by its module and name (Python's
  ``spawn`` and ``forkserver`` start methods pickle functions by reference), so a function defined
  in a notebook cell cannot be started: :func:`launch` refuses it and says where to put it.
* **Backend by device:** gloo on CPU, NCCL on CUDA GPUs (one GPU per process). NCCL without CUDA, a
  device this machine lacks, or a backend this build of torch lacks is an error before anything
  starts.
* **Ports:** a free port is picked unless ``port`` is given; a port already in use is an error
  that says so.
* **Threads:** each rank runs ``threads`` intra-op threads (1 by default), so ``nprocs`` ranks use
  ``nprocs`` cores; more ranks than cores is allowed (the ranks then share cores and every
  timing slows down) and warned about (:class:`OversubscriptionWarning`).
* **Faults:** every collective waits at most ``timeout`` seconds for its peers
  (``init_process_group(timeout=...)``); a peer that dies closes its sockets, so the others fail at
  once. When a rank fails, the launcher gives the other ranks ``grace`` seconds to stop on their
  own, then terminates them, and raises :class:`DistributedError`: one line per rank (the rank
  that failed first, then what each other rank raised or how it ended) and the path of a log file
  with every rank's full traceback (``RLM_COURSE_DEBUG=1``, or the CLI's ``--debug``, puts the
  tracebacks in the message too): never a hang.
* **Ctrl-C:** the first interrupt reaches every rank once (the launcher forwards it to ranks that
  the terminal did not signal, e.g. a notebook's interrupt). A worker that stops gracefully
  (:func:`graceful_interrupt`, as data-parallel GRPO does) finishes its step and returns; other
  workers raise ``KeyboardInterrupt``, and so does :func:`launch`. A second Ctrl-C stops every
  rank at once.
* **Clean exits:** a rank that the launcher terminates (SIGTERM) exits through Python's normal
  shutdown, and progress bars in ranks use a thread lock, so no rank leaves semaphores behind
  (which Python's resource tracker would report as "leaked semaphore objects").
* **Start method:** ``forkserver`` where the platform has it (a server process imports torch and
  the course's workers once; each rank is then forked from it in milliseconds), else ``spawn``.

Under ``torchrun`` the same workers run through ``python -m rlm_course.distributed <worker>``
(:mod:`rlm_course.distributed.__main__`), which reads the rank and world size from the environment
torchrun sets (:func:`init_from_env`).
"""

from __future__ import annotations

import datetime
import errno
import json
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as torch_mp

from rlm_course.devices import resolve_device  # noqa: F401 (part of this module's API)
from rlm_course.utils import Note, cores, free_port  # noqa: F401 (free_port: public here)

#: Seconds a collective (and the start-up rendezvous) waits for its peers before it fails.
DEFAULT_TIMEOUT = 300.0
#: Seconds the other ranks get to stop on their own after one rank failed.
DEFAULT_GRACE = 10.0
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}
#: Modules the forkserver imports once, so that every rank starts without importing them again.
PRELOAD = ["torch", "torch.distributed", "torch.distributed.tensor", "torch.distributed.fsdp",
           "torch.distributed.pipelining", "torch.nn.parallel", "rlm_course.distributed.launch",
           "rlm_course.distributed.demo", "rlm_course.distributed.comm",
           "rlm_course.distributed.collectives", "rlm_course.distributed.strategies",
           "rlm_course.distributed.grpo", "rlm_course.distributed.by_hand"]
#: Phrases of an error that a rank gets because a *peer* failed (the effect, not the cause).
PEER_ERRORS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
               "Timed out", "timed out", "Connection refused", "ECONNRESET", "EPIPE")


#: Environment variable that puts every rank's full traceback into error messages.
DEBUG_ENV = "RLM_COURSE_DEBUG"


def debug_enabled() -> bool:
    """``RLM_COURSE_DEBUG`` is set (the CLI's ``--debug`` sets it): show full tracebacks."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


class DistributedError(RuntimeError):
    """A distributed run failed. ``first_rank``: the rank that failed first (None if none did
    and the run was stopped from outside); ``failures``: ``{rank: what happened to it}``, a
    traceback or a fate such as "killed by signal SIGKILL"; ``summary``: one line per rank;
    ``log_path``: the file holding every rank's traceback (None if it could not be written).

    ``str(err)`` is the summary and the log's path; with ``RLM_COURSE_DEBUG=1`` it also holds the
    tracebacks (:attr:`details`)."""

    def __init__(self, summary: str, first_rank: int | None, failures: dict[int, str],
                 log_path: str | None = None) -> None:
        self.summary, self.first_rank, self.failures = summary, first_rank, failures
        self.log_path = log_path
        text = summary
        if log_path:
            text += f"\nFull tracebacks: {log_path} (or set {DEBUG_ENV}=1 to show them here)."
        if debug_enabled() or not log_path:
            text += "\n" + self.details
        super().__init__(text)

    @property
    def details(self) -> str:
        """Every rank's traceback or fate."""
        return "Tracebacks:\n" + "\n".join(f"--- rank {i} ---\n{f}"
                                           for i, f in sorted(self.failures.items()))


class OversubscriptionWarning(Note):
    """More rank threads than cores: the ranks share cores and run slower than they would alone."""


#: Resident bytes one CPU rank takes: a Python process with torch and gloo (about 150 MB measured
#: with ``ps`` for the hello worker), plus room for the course's tiny models and their states.
RANK_BYTES = 0.25e9


def available_memory_bytes() -> float | None:
    """Bytes the kernel says new processes can take without swapping (``MemAvailable`` of
    ``/proc/meminfo``); None where that is not known (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_rank_memory(nprocs: int, where: str) -> None:
    """Refuse more CPU ranks than this machine's memory holds at :data:`RANK_BYTES` each: started
    anyway, hundreds of ranks fill the memory before the first one reports (a machine of 24 GB
    held 166 ranks of ``hello --nproc 1000``) and every other program on it stalls.

    Raises:
        ValueError: naming ``where``'s count, the memory it needs and the most that fit.
    """
    available = available_memory_bytes()
    if available is not None and nprocs * RANK_BYTES > available:
        most = max(1, int(available // RANK_BYTES))
        raise ValueError(f"{where} {nprocs}: {nprocs:,} CPU ranks take about "
                         f"{nprocs * RANK_BYTES / 1e9:,.0f} GB ({RANK_BYTES / 1e9:.2f} GB each: a "
                         f"Python process with torch), and this machine has "
                         f"{available / 1e9:,.1f} GB available; give at most {most:,}.")


def oversubscription(nprocs: int, threads: int) -> str | None:
    """What running ``nprocs`` CPU ranks of ``threads`` threads each on this machine costs, when
    they need more cores than it has (None when they fit)."""
    if nprocs * threads <= cores():
        return None
    return (f"{nprocs} ranks x {threads} thread(s) on {cores()} CPU cores: the ranks "
            "oversubscribe the CPU and share cores, so every timing is slower than on "
            f"{nprocs * threads} cores (the results are the same).")


@dataclass(frozen=True)
class RankContext:
    """What a worker knows about its place in the run.

    Attributes:
        rank: this process's rank in ``0 .. world_size - 1``; local_rank: its index on this
            machine (the GPU it uses with NCCL); backend: ``"gloo"`` or ``"nccl"``; device: where
            its tensors live (``cpu`` or ``cuda:<local_rank>``); threads: its intra-op threads.
    """

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    threads: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def check_backend(backend: str, device: str, nprocs: int) -> None:
    """Refuse a backend that cannot run ``nprocs`` ranks on ``device`` here.

    Raises:
        ValueError: NCCL without CUDA GPUs (or with fewer GPUs than ranks), NCCL for CPU tensors,
            or a backend this build of torch does not have.
    """
    if not dist.is_available():
        raise ValueError("this build of torch has no torch.distributed; install the regular "
                         "torch wheel.")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ValueError("backend='nccl' needs CUDA GPUs, and torch sees none "
                             f"(torch.cuda.is_available() is False; torch {torch.__version__}); use "
                             "backend='gloo' (the default on CPU), or run on a GPU machine with a "
                             "CUDA build of torch.")
        if device != "cuda":
            raise ValueError("backend='nccl' moves CUDA tensors only; use device='cuda' with it, or "
                             "backend='gloo' for CPU tensors.")
        if not dist.is_nccl_available():
            raise ValueError("this build of torch has no NCCL; install a CUDA build of torch.")
        if nprocs > torch.cuda.device_count():
            raise ValueError(f"{nprocs} NCCL ranks need {nprocs} GPUs (one each); this machine has "
                             f"{torch.cuda.device_count()}. Lower nprocs, or use several machines "
                             "with torchrun --nnodes.")
    elif backend == "gloo":
        if not dist.is_gloo_available():
            raise ValueError("this build of torch has no gloo backend; install the regular torch "
                             "wheel.")
    else:
        raise ValueError(f"backend={backend!r}: the course uses 'gloo' (CPU) or 'nccl' (CUDA).")


def check_port(port: int) -> None:
    """Refuse a port that is out of range or that another process listens on.

    Raises:
        ValueError: naming the port and the fix.
    """
    if not (isinstance(port, int) and 1024 <= port <= 65535):
        raise ValueError(f"port={port!r}: give a port number in 1024..65535, or None to let the "
                         "launcher pick a free one.")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise ValueError(f"port {port} is already in use (another run, or another program, "
                                 "listens on it); pass port=None to pick a free port, or choose "
                                 "another one.") from None
            raise


def _importable(worker) -> None:
    module = getattr(worker, "__module__", None)
    name = getattr(worker, "__qualname__", getattr(worker, "__name__", None))
    where = ("put it in a .py file (a module next to the notebook works, or "
             "rlm_course/distributed/) and import it from there")
    if not callable(worker):
        raise ValueError(f"worker={worker!r} is not a function.")
    if module in (None, "__main__", "__mp_main__"):
        raise ValueError(f"worker {name!r} is defined in the notebook or script itself (module "
                         f"{module!r}); a new process cannot import it from there: {where}.")
    owner = sys.modules.get(module)
    if (owner is None or not name or "<locals>" in name or "<lambda>" in name
            or getattr(owner, name.split(".")[0], None) is None):
        label = f"{module}.{name}" if name else repr(worker)
        raise ValueError(f"worker {label} is not a plain module-level function (a lambda, "
                         "a nested function or a functools.partial cannot be imported by name in a "
                         "new process): define it with a top-level `def` in a .py file and pass "
                         "its arguments through launch(..., args=...).")


def _start_method(requested: str | None) -> str:
    methods = multiprocessing.get_all_start_methods()
    if requested is None:
        return "forkserver" if "forkserver" in methods else "spawn"
    if requested not in methods:
        raise ValueError(f"start_method={requested!r} is not available here; choose one of "
                         f"{methods}.")
    return requested


def _init(rank: int, world_size: int, local_rank: int, backend: str, device: str,
          threads: int, timeout: float) -> RankContext:
    torch.set_num_threads(threads)
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout))
    return RankContext(rank, world_size, local_rank, backend, dev, threads)


def init_from_env(device: str = "auto", threads: int = 1,
                  timeout: float = DEFAULT_TIMEOUT) -> RankContext:
    """Join the process group that ``torchrun`` set up (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``/``MASTER_PORT`` in the environment), with the backend of ``device``.

    Raises:
        ValueError: if the environment lacks torchrun's variables, or the backend cannot run here.
    """
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
               if k not in os.environ]
    if missing:
        raise ValueError(f"{', '.join(missing)} not set: start this under torchrun (e.g. torchrun "
                         "--standalone --nproc-per-node 2 -m rlm_course.distributed hello), or "
                         "use rlm_course.distributed.launch from Python.")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    device = resolve_device(device)
    backend = BACKENDS[device]
    check_backend(backend, device, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    return _init(rank, world, local_rank, backend, device, threads, timeout)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def prepare_rank_process() -> None:
    """What every rank does first (under :func:`launch` and under ``torchrun``) so that it never
    leaves semaphores behind when it is stopped:

    * SIGTERM (how :class:`Job` and torchrun stop a rank) raises ``SystemExit``: the rank exits
      through Python's normal shutdown, which releases its multiprocessing semaphores; killed by
      the default action instead, it would leave them to the resource tracker, which reports them
      as "leaked semaphore objects" when the run ends;
    * tqdm's bars use a thread lock: by default tqdm creates a multiprocessing lock (a named
      semaphore) in every process that makes a bar, even a disabled one; a rank's bars are its
      own (only rank 0 draws), so no other process needs that lock.
    """
    import threading

    from tqdm import tqdm as tqdm_base

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    tqdm_base.set_lock(threading.RLock())


class graceful_interrupt:
    """Within a rank: the first Ctrl-C (SIGINT) sets :attr:`requested` instead of raising, so the
    worker can finish its step, agree with the other ranks and save; repeats within
    ``window`` seconds are the same interrupt (the terminal signals every process of the run, and
    the launcher forwards it too) and are ignored; a later one raises ``KeyboardInterrupt``
    (stop now). ``message``, if given, is printed on the first interrupt (rank 0's).

    Use as ``with graceful_interrupt(msg) as stop: ... if stop.requested: ...``; outside the main
    thread it does nothing (Ctrl-C keeps its default).
    """

    def __init__(self, message: str | None = None, window: float = 2.0) -> None:
        self.message, self.window = message, window
        self.requested, self._first, self._previous = False, None, None

    def __enter__(self) -> "graceful_interrupt":
        try:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread
            self._previous = None
        return self

    def _handle(self, signum, frame) -> None:
        now = time.monotonic()
        if self._first is None:
            self.requested, self._first = True, now
            if self.message:
                print("\n" + self.message, file=sys.stderr, flush=True)
        elif now - self._first > self.window:
            raise KeyboardInterrupt

    def __exit__(self, *exc) -> bool:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False


def failure_log_path(folder: str | Path | None = None) -> Path:
    """Where a failed run's tracebacks go: ``folder/failure.log``, or a new file in the temporary
    folder."""
    if folder is not None:
        return Path(folder) / "failure.log"
    handle, name = tempfile.mkstemp(prefix="rlm_course-failure-", suffix=".log")
    os.close(handle)
    return Path(name)


def _entry(index: int, worker, args: tuple, kwargs: dict, spec: dict, result_dir: str) -> None:
    """What each new process runs: join the group, run the worker, store its result or its
    traceback (with the time it failed) for the launcher."""
    folder = Path(result_dir)
    os.environ.update(MASTER_ADDR=spec["addr"], MASTER_PORT=str(spec["port"]), RANK=str(index),
                      WORLD_SIZE=str(spec["world_size"]), LOCAL_RANK=str(index),
                      LOCAL_WORLD_SIZE=str(spec["world_size"]),
                      OMP_NUM_THREADS=str(spec["threads"]))
    prepare_rank_process()
    try:
        ctx = _init(index, spec["world_size"], index, spec["backend"], spec["device"],
                    spec["threads"], spec["timeout"])
        result = worker(ctx, *args, **kwargs)
        tmp = folder / f".rank{index}.pt"
        torch.save(result, tmp)
        os.replace(tmp, folder / f"rank{index}.pt")
        # Only a rank that succeeded tears the group down: destroy_process_group with a dead or
        # failed peer can block (PyTorch's torchtitan destroys only on success for this reason);
        # a failed rank's sockets close when its process exits, which is what its peers need.
        # (multiprocessing ends a rank with os._exit, so the group's C++ destructor never runs;
        # under torchrun, whose agent stops the other ranks itself, the worker always destroys
        # it: a gloo group left to the interpreter's exit aborts the process.)
        if dist.is_initialized():  # (unless the worker destroyed it itself)
            dist.destroy_process_group()
    except BaseException as err:
        if isinstance(err, SystemExit) and err.code == 128 + signal.SIGTERM:
            raise  # stopped from outside (SIGTERM): the launcher knows why
        record = {"rank": index, "time": time.time(), "type": type(err).__name__,
                  "message": str(err), "traceback": traceback.format_exc()}
        tmp = folder / f".rank{index}.error.json"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, folder / f"rank{index}.error.json")
        if isinstance(err, Exception):
            raise
        sys.exit(1)  # KeyboardInterrupt / SystemExit: still a failure for the launcher


class Job:
    """A running group of ranks (see :func:`launch`): ``pids`` of its processes, :meth:`join` to
    wait for their results. Build it with :func:`start`."""

    def __init__(self, context, result_dir: tempfile.TemporaryDirectory, nprocs: int,
                 grace: float, deadline: float | None, describe: str,
                 log_file: str | Path | None = None) -> None:
        self._context, self._dir, self.nprocs = context, result_dir, nprocs
        self.grace, self.deadline, self.describe = grace, deadline, describe
        self.log_file = log_file

    @property
    def pids(self) -> list[int]:
        """Process ids of the ranks, in rank order."""
        return self._context.pids()

    def join(self) -> list:
        """Wait for every rank; return their results in rank order.

        Raises:
            DistributedError: if a rank raised, was killed or exited with an error, or the run
                passed its deadline; the message names the rank that failed first and what
                happened to every rank, one line each, and where their tracebacks are.
            KeyboardInterrupt: Ctrl-C, once the ranks have stopped. The first Ctrl-C is
                forwarded to every rank (a graceful worker finishes its step; then its results
                are returned as usual); a second one stops every rank at once.
        """
        procs = self._context.processes
        sentinels = {p.sentinel: i for i, p in enumerate(procs)}
        exited: dict[int, float] = {}
        stopped: dict[int, str] = {}
        self._first_failure = None
        interrupted = False
        while True:
            try:
                self._wait(procs, sentinels, exited, stopped)
                break
            except KeyboardInterrupt:
                if interrupted:  # the second Ctrl-C: stop now
                    self._stop([p for p in procs if p.is_alive()])
                    self._cleanup()
                    raise
                interrupted = True
                for p in procs:  # ranks the terminal did not signal (e.g. a notebook's kernel)
                    if p.is_alive():
                        try:
                            os.kill(p.pid, signal.SIGINT)
                        except ProcessLookupError:
                            pass
        try:
            if interrupted and any(p.exitcode for p in procs):
                raise KeyboardInterrupt
            return self._collect(procs, exited, stopped)
        finally:
            self._cleanup()

    def _cleanup(self) -> None:
        self._dir.cleanup()
        for path in self._context.error_files:  # torch's own copies of the tracebacks
            if path and os.path.exists(path):
                os.unlink(path)
        for queue in getattr(self._context, "error_queues", ()):
            queue.close()  # release the queues' pipes now rather than at interpreter exit

    def _wait(self, procs, sentinels, exited, stopped) -> None:
        """Wait until every rank has exited (stopping the rest ``grace`` seconds after a
        failure, or at the deadline); ``exited``, ``stopped`` and ``self._first_failure`` are
        kept up to date, so that the wait can resume after a Ctrl-C."""
        first_failure = self._first_failure
        while len(exited) < self.nprocs:
            now = time.time()
            waits = [0.5]
            if first_failure is not None:
                waits.append(first_failure + self.grace - now)
            if self.deadline is not None:
                waits.append(self.deadline - now)
            pending = [s for s, i in sentinels.items() if i not in exited]
            ready = multiprocessing.connection.wait(pending, timeout=max(0.0, min(waits)))
            now = time.time()
            for s in ready:
                i = sentinels[s]
                procs[i].join()
                exited[i] = now
                if procs[i].exitcode != 0 and first_failure is None:
                    first_failure = self._first_failure = now
            late = first_failure is not None and now >= first_failure + self.grace
            overdue = self.deadline is not None and now >= self.deadline
            if late or overdue:
                why = (f"still running {self.grace:g} s after another rank failed: stopped by "
                       "the launcher" if late else "still running at the deadline: stopped by "
                       "the launcher")
                for i, p in enumerate(procs):
                    if i not in exited:
                        stopped[i] = why
                self._stop([p for i, p in enumerate(procs) if i not in exited])
                for i, p in enumerate(procs):
                    if i not in exited:
                        exited[i] = time.time()

    @staticmethod
    def _stop(procs) -> None:
        for p in procs:
            if p.is_alive():
                p.terminate()
        end = time.time() + 3.0
        for p in procs:
            p.join(max(0.0, end - time.time()))
            if p.is_alive():
                p.kill()
                p.join()

    def _collect(self, procs, exited: dict[int, float], stopped: dict[int, str]) -> list:
        folder = Path(self._dir.name)
        failures, times, causes = {}, {}, {}
        for i, p in enumerate(procs):
            record_path = folder / f"rank{i}.error.json"
            if record_path.exists():
                record = json.loads(record_path.read_text())
                failures[i] = record["traceback"].rstrip()
                times[i] = record["time"]
                causes[i] = f"{record['type']}: {first_line(record['message'])}"
            elif i in stopped:
                failures[i] = stopped[i]
                times[i] = exited[i]
                causes[i] = stopped[i]
            elif p.exitcode == 128 + signal.SIGTERM:
                failures[i] = causes[i] = "stopped by SIGTERM (from outside the run)"
                times[i] = exited[i]
            elif p.exitcode and p.exitcode < 0:
                name = signal.Signals(-p.exitcode).name
                failures[i] = f"killed by signal {name} (no traceback: the process was killed)"
                times[i] = exited[i]
                causes[i] = f"killed by signal {name}"
            elif p.exitcode:
                failures[i] = (f"exited with code {p.exitcode} before or outside the worker (its "
                               "stderr shows why; a script that starts ranks needs the "
                               "`if __name__ == '__main__':` guard)")
                times[i] = exited[i]
                causes[i] = failures[i]
        if not failures:
            results = []
            for i in range(self.nprocs):
                path = folder / f"rank{i}.pt"
                results.append(torch.load(path, weights_only=False) if path.exists() else None)
            return results
        real = {i: t for i, t in times.items() if i not in stopped}
        own = {i: t for i, t in real.items() if not any(e in failures[i] for e in PEER_ERRORS)}
        pool = own or real or times
        first = min(pool, key=pool.get)
        lines = [f"{self.describe}: rank {first} of {self.nprocs} failed first: {causes[first]}."]
        if stopped and not own:
            lines.append(f"Rank(s) {sorted(stopped)} never reached the collective the others "
                         "waited in (hung, or far slower): the likely cause.")
        for i in range(self.nprocs):
            if i != first:
                lines.append(f"rank {i}: {causes.get(i, 'finished')}")
        every = {i: failures.get(i, "finished without error") for i in range(self.nprocs)}
        try:
            path = failure_log_path() if self.log_file is None else Path(self.log_file)
            path.write_text("\n".join(lines) + "\n" + DistributedError("", first, every).details
                            + "\n")
        except OSError:
            raise DistributedError("\n".join(lines), first, failures) from None
        raise DistributedError("\n".join(lines), first, failures, str(path))


def first_line(text: str) -> str:
    """An error message's first line, without gloo's generic advice."""
    text = text.strip()
    line = text.splitlines()[0] if text else ""
    return line.split(" This is typically caused by")[0]


def start(worker, nprocs: int = 2, args: tuple = (), kwargs: dict | None = None, *,
          device: str = "cpu", backend: str | None = None, port: int | None = None,
          threads: int = 1, timeout: float = DEFAULT_TIMEOUT, grace: float = DEFAULT_GRACE,
          deadline: float | None = None, start_method: str | None = None,
          log_file: str | Path | None = None) -> Job:
    """Start ``nprocs`` ranks running ``worker(ctx, *args, **kwargs)`` and return the
    :class:`Job` at once (see :func:`launch` for the arguments); :meth:`Job.join` waits."""
    if not (isinstance(nprocs, int) and not isinstance(nprocs, bool) and nprocs >= 1):
        raise ValueError(f"nprocs={nprocs!r}: give a positive number of processes.")
    if not (isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1):
        raise ValueError(f"threads={threads!r}: give a positive number of threads per rank.")
    for label, value in (("timeout", timeout), ("grace", grace)) + (
            (("deadline", deadline),) if deadline is not None else ()):
        if not 0 < value < math.inf:
            raise ValueError(f"{label}={value!r} seconds must be positive and finite.")
    _importable(worker)
    device = resolve_device(device)
    backend = backend or BACKENDS[device]
    check_backend(backend, device, nprocs)
    if port is None:
        port = free_port()
    else:
        check_port(port)
    if device == "cpu":
        check_rank_memory(nprocs, "nprocs")
    note = oversubscription(nprocs, threads) if device == "cpu" else None
    if note:
        warnings.warn(note, OversubscriptionWarning, stacklevel=3)
    method = _start_method(start_method)
    if method == "forkserver":
        # preloaded once per session: later calls reuse the running server
        multiprocessing.get_context("forkserver").set_forkserver_preload(
            PRELOAD + [worker.__module__])
    spec = {"addr": "127.0.0.1", "port": port, "world_size": nprocs, "backend": backend,
            "device": device, "threads": threads, "timeout": float(timeout)}
    result_dir = tempfile.TemporaryDirectory(prefix="rlm_course-ranks-")
    context = torch_mp.start_processes(_entry, args=(worker, tuple(args), dict(kwargs or {}), spec,
                                                     result_dir.name),
                                       nprocs=nprocs, join=False, start_method=method)
    describe = f"{worker.__module__}.{worker.__qualname__} on {nprocs} process(es) ({backend})"
    return Job(context, result_dir, nprocs, grace,
               None if deadline is None else time.time() + deadline, describe, log_file)


def launch(worker, nprocs: int = 2, args: tuple = (), kwargs: dict | None = None, *,
           device: str = "cpu", backend: str | None = None, port: int | None = None,
           threads: int = 1, timeout: float = DEFAULT_TIMEOUT, grace: float = DEFAULT_GRACE,
           deadline: float | None = None, start_method: str | None = None,
           log_file: str | Path | None = None) -> list:
    """Run ``worker(ctx, *args, **kwargs)`` on ``nprocs`` new processes that form one process
    group; return each rank's result (anything ``torch.save`` can store), in rank order.

    Args:
        worker: a module-level function (not one defined in a notebook cell) taking a
            :class:`RankContext` first.
        device: ``"cpu"`` (gloo), ``"cuda"`` (NCCL, one GPU per rank) or ``"auto"``.
        backend: overrides the device's backend (e.g. gloo with CUDA tensors).
        port: the rendezvous port on 127.0.0.1 (None: a free one).
        threads: intra-op threads per rank (``torch.set_num_threads``).
        timeout: seconds every collective waits for its peers before it raises.
        grace: seconds the other ranks get to stop on their own after one failed.
        deadline: seconds after which the whole run is stopped (None: no limit).
        start_method: ``"forkserver"`` (default where available), ``"spawn"`` or ``"fork"``.
        log_file: where a failed run writes every rank's traceback (None: a new file in the
            temporary folder; the error message names it).

    Raises:
        ValueError: a worker defined in ``__main__`` (a notebook cell), a bad count, a port in use,
            a backend or device this machine cannot run (NCCL without CUDA).
        DistributedError: a rank failed (see :class:`Job.join`).
        KeyboardInterrupt: Ctrl-C (see :class:`Job.join`).

    Warns:
        OversubscriptionWarning: more rank threads than CPU cores.
    """
    return start(worker, nprocs, args, kwargs, device=device, backend=backend, port=port,
                 threads=threads, timeout=timeout, grace=grace, deadline=deadline,
                 start_method=start_method, log_file=log_file).join()
