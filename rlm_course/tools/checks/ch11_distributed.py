"""Checks of chapter 11's exercise: A ring all-reduce from send/recv; DDP's gradient buckets."""

from __future__ import annotations

#: The exercise's title.
TITLE = "A ring all-reduce from send/recv; DDP's gradient buckets"
#: The functions the learner writes: (module, name), in the order the exercise presents them.
FUNCTIONS = (
    ("rlm_course.distributed.by_hand", "ring_all_reduce"),
    ("rlm_course.distributed.by_hand", "bucketed_all_reduce"),
)


def _on_ranks(fn, ranks: int) -> dict:
    """Run the checks of exercise ``fn.__name__`` on ``ranks`` real processes (the function is
    loaded there from its file). Never raises: ``{"results": [...]}``, ``{"not_implemented":
    message}`` or ``{"error": message}``."""
    import inspect
    import warnings

    from rlm_course.distributed.by_hand import exercise_worker
    from rlm_course.tools.checks import CHECK_SECONDS
    from rlm_course.distributed.launch import DistributedError, OversubscriptionWarning, launch

    try:
        path = inspect.getsourcefile(fn)
    except TypeError:
        path = None
    if path is None:
        return {"error": f"{getattr(fn, '__name__', fn)} is not defined in a file; write it in "
                         "the exercise file (processes load it from there)."}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OversubscriptionWarning)
            # the deadline bounds a busy loop that never reaches a collective (the collective
            # timeout only bounds a wait for a peer): the grader's per-check limit
            return launch(exercise_worker, ranks, args=(path, fn.__name__), timeout=20.0,
                          grace=5.0, deadline=CHECK_SECONDS)[0]
    except DistributedError as err:
        first = str(err).split("\nTracebacks:")[0]
        if "at the deadline" in first:
            return {"error": f"did not finish within {CHECK_SECONDS:g} s (an endless loop?): "
                             f"{first}"}
        return {"error": f"{first} (a deadlock? every send needs a receive posted on its peer)"
                if "Timed out" in first else first}


def _checks_on_ranks(fn, rank_counts):
    for ranks in rank_counts:
        outcome = _on_ranks(fn, ranks)
        if "not_implemented" in outcome:
            def not_implemented(message=outcome["not_implemented"]):
                raise NotImplementedError(message)
            yield f"{ranks} ranks", not_implemented
            return
        if "error" in outcome:
            yield f"{ranks} ranks: runs on real processes", lambda o=outcome: (False, o["error"])
            continue
        for description, passed, message in outcome["results"]:
            yield description, (lambda ok=passed, why=message: (ok, why))


def _checks_ring_all_reduce(fn):
    """Graded against ``dist.all_reduce`` on 2 and 3 real processes (3: chunks of unequal size)."""
    yield from _checks_on_ranks(fn, (2, 3))


def _checks_bucketed_all_reduce(fn):
    """Graded against ``dist.all_reduce`` on 2 real processes, bytes counted per call."""
    yield from _checks_on_ranks(fn, (2,))


#: The checks of each function: name -> a generator of ``(description, check)``.
CHECKS = {
    "ring_all_reduce": _checks_ring_all_reduce,
    "bucketed_all_reduce": _checks_bucketed_all_reduce,
}
