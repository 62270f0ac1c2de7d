"""Checks of chapter 09's exercise: The 1F1B schedule table."""

from __future__ import annotations


#: The exercise's title.
TITLE = "The 1F1B schedule table"
#: The functions the learner writes: (module, name), in the order the exercise presents them.
FUNCTIONS = (
    ("rlm_course.parallel.pipeline", "one_f_one_b"),
)


_HAND_EXAMPLE = [[("F", 0, 0), ("F", 1, 0), ("B", 0, 0), ("F", 2, 0), ("B", 1, 0), ("B", 2, 0)],
                 [("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0), ("F", 2, 0), ("B", 2, 0)]]


def _hand_example(fn):
    got = fn(2, 3)
    if got == _HAND_EXAMPLE:
        return True, ""
    try:  # the right order with lists for tuples: say so, the printed values look the same
        as_tuples = [[tuple(entry) for entry in device] for device in got]
    except TypeError:
        as_tuples = None
    if as_tuples == _HAND_EXAMPLE:
        return False, ("the right order, but each entry must be a tuple (kind, micro_batch, 0), "
                       f"not a {type(got[0][0]).__name__}")
    return False, f"got {got}, expected {_HAND_EXAMPLE}"


def _checks_one_f_one_b(fn):
    yield "2 devices, 3 micro-batches (hand example)", lambda: _hand_example(fn)

    def bubble():
        from rlm_course.parallel.pipeline import bubble_formula, simulate

        timeline = simulate(fn(4, 8))
        want = bubble_formula("1f1b", 4, 8)
        return abs(timeline.bubble_fraction - want) < 1e-9, (
            f"bubble {timeline.bubble_fraction:.4f}, expected {want:.4f}")

    yield "4 devices, 8 micro-batches: runs without deadlock, bubble (p-1)/(m+p-1)", bubble

    def memory():
        from rlm_course.parallel.pipeline import simulate

        timeline = simulate(fn(4, 12))
        peaks = [timeline.peak_in_flight(d) for d in range(4)]
        return peaks == [4, 3, 2, 1], f"micro-batches in flight per device {peaks}, expected [4, 3, 2, 1]"

    yield "device d holds at most p - d micro-batches in flight", memory


#: The checks of each function: name -> a generator of ``(description, check)``.
CHECKS = {
    "one_f_one_b": _checks_one_f_one_b,
}
