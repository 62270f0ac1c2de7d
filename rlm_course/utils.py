"""Small shared helpers: cores and ports, seeding, atomic file writes, stage timers. Imports
neither torch nor numpy at the top (the tasks and :mod:`rlm_course.arguments` use it)."""

from __future__ import annotations

import json
import math
import numbers
import os
import random
import socket
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path


class Note(UserWarning):
    """A warning about how a run will go, not about its results (e.g. more ranks than cores):
    the command line prints it as one ``Note:`` line."""


def cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def free_port() -> int:
    """A TCP port that no process listens on now (the OS picks it). Another process could take it
    before it is bound; the window is milliseconds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("", 0))
        return s.getsockname()[1]


def choose_threads(requested: int | None = None) -> tuple[int, str]:
    """How many CPU threads a job should use, and why.

    ``requested`` wins; then ``OMP_NUM_THREADS`` if set; otherwise the cores this process may run
    on, minus the load other work already puts on them (the 1-minute load average), at least 1.
    On an idle 2-core machine that is 2; with another job keeping a core busy it is 1: more
    threads than free cores make every thread wait for the slowest (OpenMP barriers), and a
    training step can take 10x longer.

    Raises:
        ValueError: for a requested count below 1, or above 4 threads per core (where every
            step would run many times slower, not faster).
    """
    available = cores()
    if requested is not None:
        if requested < 1:
            raise ValueError(f"--threads {requested}: give 1 or more.")
        if requested > 4 * available:
            raise ValueError(f"--threads {requested}: more than 4 threads per core on these "
                             f"{available} cores; the threads would wait for each other and every "
                             f"step would run many times slower; use at most --threads "
                             f"{available}.")
        if requested > available:
            return requested, (f"as requested, but more than the {available} cores: the threads wait "
                               "for each other and every step is slower; use at most "
                               f"--threads {available}")
        return requested, "as requested"
    if os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"]), "from OMP_NUM_THREADS"
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    threads = max(1, min(available, round(available - load)))
    return threads, f"{available} cores, load {load:.1f}"


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch so that CPU runs repeat exactly on the same machine with the
    same thread count (other kernels or threads round differently: :mod:`rlm_course.numerics`)."""
    import numpy as np  # here: the tasks and the command line's arguments import this module
    import torch  # and must not import torch (rlm_course.arguments)

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def derived_seed(*parts: int) -> int:
    """A deterministic seed from several integers (e.g. run seed and step)."""
    value = 0x9E3779B9
    for p in parts:
        value = (value * 1_000_003 + int(p)) % (2**63 - 1)
    return value


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash or Ctrl-C leaves either the old or the new file.

    The bytes go to a temporary file in the same folder, are flushed to disk, then renamed over
    ``path`` (``os.replace`` is atomic on POSIX and Windows).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def ensure_writable_folder(folder: str | Path, flag: str) -> None:
    """Create ``folder`` if needed and prove that a file can be written in it, so that a long job
    fails before its work, not when it saves.

    Raises:
        ValueError: naming the folder, the operating system's reason and the flag to change.
    """
    folder = Path(folder)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():  # the folder, or a parent, is a file
        what = "it is" if existing == folder else f"{existing} is"
        raise ValueError(f"cannot write to {folder}: {what} a file, not a folder; choose another "
                         f"{flag}.")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise ValueError(f"cannot write a file in {folder} ({err.strerror or err}); choose "
                         f"another {flag}.") from None


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")




class StageTimer:
    """Accumulates wall-clock seconds per named stage: ``with timer("generation"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.current: str | None = None  # the stage running now (None outside any stage)

    @contextmanager
    def __call__(self, stage: str):
        start, outer = time.perf_counter(), self.current
        self.current = stage
        try:
            yield
        finally:
            self.seconds[stage] += time.perf_counter() - start
            self.current = outer

    def reset(self) -> dict[str, float]:
        out = dict(self.seconds)
        self.seconds = defaultdict(float)
        return out


def plain_ints(obj) -> None:
    """Replace each field of the dataclass ``obj`` that holds an integer of another type
    (numpy's ``int64`` from ``np.arange`` or an array) by the Python int, so that its checks and
    arithmetic see one kind of integer; bools and everything else are left as they are. Works on
    frozen dataclasses, from their ``__post_init__``."""
    import dataclasses

    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if as_int(value) is not value:
            object.__setattr__(obj, f.name, as_int(value))


def as_int(value):
    """``value`` as a Python int when it is an integer of another type (numpy's), else as it is
    (bools and non-integers are left for the caller's check to refuse)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
        return int(value)
    return value


def is_real(value) -> bool:
    """A real number (int, float, numpy's scalars), not a bool (``True`` is an ``int`` to Python;
    a bool where a rate or a count belongs is a mistake, not 1)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_integer(value) -> bool:
    """An integer (int, numpy's integers), not a bool (``True`` is an ``int`` to Python; a bool
    where a count or a token id belongs is a mistake, not 1)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def seconds_text(seconds: float, decimals: int = 1) -> str:
    """A duration for a reader: ``decimals`` decimals in seconds from 1 s (``1,234.5 s``), three
    significant digits in milliseconds below (``12.3 ms``, where ``0.0 s`` would hide it), and
    the hours beside from an hour (``96,475.7 s (26.8 h)``)."""
    if float(f"{seconds * 1e3:.3g}") < 1000:  # 0.9996 s would read 1e+03 ms
        return f"{seconds * 1e3:.3g} ms"
    text = f"{seconds:,.{decimals}f} s"
    return text + (f" ({seconds / 3600:,.1f} h)" if seconds >= 3600 else "")


def unknown_name(kind: str, name, known) -> str:
    """The start of the error for a ``name`` that is not one of ``known``: ``unknown {kind}
    'name'`` (cut to 60 characters), with the known name it most likely means when there is one
    (the same name in another case or with spaces around it, a name it begins, or a close
    spelling: ``Llama-3.1-70B``, ``h100``, ``qwen3-32``), then ``; choose one of ...``."""
    import difflib

    known = list(known)
    text = name if isinstance(name, str) else repr(name)
    shown = text if len(text) <= 60 else text[:57] + "..."
    lower = {k.lower(): k for k in known}
    query = text.strip().lower()
    guess = lower.get(query)
    if guess is None and query:
        starts = [k for k in known if k.lower().startswith(query)]
        guess = starts[0] if len(starts) == 1 else None
    if guess is None and query:
        close = difflib.get_close_matches(query, list(lower), n=1, cutoff=0.75)
        guess = lower[close[0]] if close else None
    hint = f" (did you mean {guess!r}?)" if guess else ""
    return f"unknown {kind} {shown!r}{hint}; choose one of {', '.join(known)}"


def check_amount(name: str, value, positive: bool = False) -> None:
    """Refuse a size that is not a finite real number ``>= 0`` (``> 0`` when ``positive``):
    tokens, sequences, parameters, bytes.

    Raises:
        ValueError: ``"{name}={value!r} must be a finite number >= 0"`` (or ``> 0``).
    """
    if not (is_real(value) and math.isfinite(value) and (value > 0 if positive else value >= 0)):
        raise ValueError(f"{name}={value!r} must be a finite number {'> 0' if positive else '>= 0'}.")


def check_kinds(checks, owner: str = "") -> None:
    """A clear error for an argument of the wrong kind (e.g. a model's name where its spec
    belongs): ``checks`` holds ``(name, value, kind, example)``, ``example`` the code that makes
    one.

    Raises:
        ValueError: ``"{owner}{name}={value!r} must be a {kind}; pass e.g. {example}."`` for the
            first value that is not an instance of its kind.
    """
    for name, value, kind, example in checks:
        if not isinstance(value, kind):
            raise ValueError(f"{owner}{name}={value!r} must be a {kind.__name__}; pass e.g. "
                             f"{example}.")


def format_table(rows: list[list], header: list[str]) -> str:
    """A plain-text table: columns padded to their widest cell, numbers right-aligned."""
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for k, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if k == 0 or not _numeric(c) else c.rjust(w)
                               for c, w in zip(row, widths)))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _numeric(text: str) -> bool:
    try:
        float(text.replace(",", "").rstrip("%x"))
        return True
    except ValueError:
        return False


def best_seconds(fn, repeats: int) -> float:
    """The fastest of ``repeats`` wall-clock timings of ``fn()`` (the least disturbed by noise)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def repo_root() -> Path:
    """The course's checkout: the folder that holds ``rlm_course/``, ``data/``, ``notebooks/``."""
    return Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """The course's ``data/`` folder (``RLM_COURSE_DATA`` overrides)."""
    return Path(os.environ.get("RLM_COURSE_DATA", repo_root() / "data"))


def result_path(stored: str | Path, store: bool, runs_dir: str | Path) -> Path:
    """Where a command that makes one of the course's stored results writes: the stored file
    itself (which the notebooks read) only when asked with ``--store``, otherwise a file of the
    same name in ``runs_dir``, so that a quick trial run never replaces a committed result."""
    stored = Path(stored)
    return stored if store else Path(runs_dir) / stored.name
