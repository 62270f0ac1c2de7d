"""Immediate feedback on exercise functions: hand-computed examples and properties.

One module per chapter with an exercise, ``chNN_<topic>.py``: its ``TITLE``, the ``FUNCTIONS``
the learner writes (module, name) and their ``CHECKS``. An exercise is the ``BEGIN SOLUTION`` /
``END SOLUTION`` markers in the package function the course runs plus that one file:
:mod:`rlm_course.tools.exercisegen` finds the chapters here.

``run_check(name, fn)`` runs every check of exercise ``name`` on ``fn`` and returns a
:class:`CheckReport` that prints as e.g. ``group_advantages: 3/4 checks pass`` followed by what
failed. A function that still raises ``NotImplementedError`` is reported as "not implemented
yet", never as a traceback.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import signal
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from rlm_course.tools.checks.common import CheckReport, CheckResult

#: A chapter's checks module: ``ch`` + two digits + ``_`` + the topic.
CHAPTER_MODULE = re.compile(r"^ch(\d\d)_(\w+)$")


def chapter_modules() -> list[ModuleType]:
    """The chapters' checks modules, in chapter order."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if CHAPTER_MODULE.match(m.name))
    return [importlib.import_module(f"{__name__}.{name}") for name in names]


def _all_checks() -> dict:
    checks = {}
    for module in chapter_modules():
        for name, checker in module.CHECKS.items():
            if name in checks:
                raise ValueError(f"exercise {name!r} has checks in two chapters; rename one.")
            checks[name] = checker
    return checks


#: Every exercise function's checks: name -> a generator of ``(description, check)``.
CHECKS = _all_checks()


#: Seconds one check may run (every check of the solutions takes under 3 s on 2 cores): past it,
#: an endless loop in a learner's function is reported instead of hanging the grader.
CHECK_SECONDS = 60


class CheckTimeout(BaseException):
    """A check ran past :data:`CHECK_SECONDS`. A ``BaseException``, so that a learner's
    ``except Exception:`` (a retry loop) does not swallow it; it is raised again every second
    until it leaves the learner's code."""


@contextmanager
def time_limit(seconds: float):
    """Raise :class:`CheckTimeout` in the main thread after ``seconds`` (SIGALRM); elsewhere (a
    thread, a platform without SIGALRM) no limit."""
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise CheckTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    start = time.monotonic()
    # (delay, interval): once past, again every second, should a bare except: catch it
    outer = signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)  # another timer's (delay, interval)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer[0] > 0:  # give back what was left of a timer set around the grader
            signal.setitimer(signal.ITIMER_REAL, max(outer[0] - (time.monotonic() - start), 1e-3),
                             outer[1])


def _describe_error(err: BaseException, fn) -> str:
    """One line for an exception a check raised: what it was and where, at the deepest line of the
    learner's file when the traceback passes through it (``ex02_grpo.py:45: return ...``)."""
    what = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    if isinstance(err, SystemExit):
        return f"{what} (the function calls sys.exit() or exit(); return a value instead)"
    if "does not require grad" in str(err):
        what += (" (the result has no gradient: was it detached, e.g. by .item(), .tolist(), "
                 ".detach() or torch.tensor(...) of a computed value?)")
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return what
    learner = getattr(getattr(fn, "__code__", None), "co_filename", None)
    mine = [f for f in frames if learner and f.filename == learner]
    if mine:
        at = mine[-1]
        return f"{what} (at {Path(at.filename).name}:{at.lineno}: {(at.line or '').strip()})"
    at = frames[-1]
    if Path(at.filename).parent == Path(__file__).parent:  # raised by the check itself
        return f"{what} (in the check, on what the function returned: is it the right type?)"
    return f"{what} (at {Path(at.filename).name}:{at.lineno}: {(at.line or '').strip()})"


def run_check(name: str, fn, seconds: float = CHECK_SECONDS) -> CheckReport:
    """Run every check of exercise ``name`` on ``fn``, each within ``seconds``; a check that
    runs past it fails, and the exercise's later checks are skipped (they would likely hang too).

    Raises:
        ValueError: for an unknown exercise name.
    """
    if name not in CHECKS:
        raise ValueError(f"no checks for {name!r}; known: {sorted(CHECKS)}.")
    report = CheckReport(name)
    for description, check in CHECKS[name](fn):
        try:
            with time_limit(seconds):
                passed, message = check()
        except NotImplementedError as err:
            if not report.results:  # the stub (or a first case left for later)
                report.not_implemented = str(err) or "raises NotImplementedError"
                return report
            # after checks that ran: a case left out (or an op torch does not have), not a stub
            passed, message = False, _describe_error(err, fn)
        except CheckTimeout:
            report.results.append(CheckResult(
                description, False, f"did not finish within {seconds:g} s (an endless loop, or a "
                "wait that never returns?); the exercise's other checks were skipped"))
            report.skipped = True
            return report
        except (Exception, SystemExit) as err:  # a learner's bug: report it, keep going
            passed, message = False, _describe_error(err, fn)
        report.results.append(CheckResult(description, passed, message))
    return report


__all__ = ["CHECKS", "CHECK_SECONDS", "CheckReport", "CheckResult", "CheckTimeout", "chapter_modules",
           "run_check", "time_limit"]
