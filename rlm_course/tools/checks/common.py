"""What every chapter's checks share: a check's result, a report of an exercise's checks, and the
comparisons that tell a learner's value from the reference's."""

from __future__ import annotations

import inspect
import numbers
from dataclasses import dataclass, field

import torch


@dataclass
class CheckResult:
    description: str
    passed: bool
    message: str = ""


@dataclass
class CheckReport:
    name: str
    results: list[CheckResult] = field(default_factory=list)
    not_implemented: str | None = None
    skipped: bool = False  # checks left out after one that ran past the time limit

    @property
    def n_passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def all_passed(self) -> bool:
        return (self.not_implemented is None and not self.skipped
                and all(r.passed for r in self.results))

    def __str__(self) -> str:
        if self.not_implemented is not None:
            why = self.not_implemented
            return f"{self.name}: " + (why if why.startswith("not implemented yet") else
                                       f"not implemented yet ({why})")
        lines = [f"{self.name}: {self.n_passed}/{len(self.results)} checks pass"
                 + (" (the later checks were not run)" if self.skipped else "")]
        for r in self.results:
            mark = "ok  " if r.passed else "FAIL"
            lines.append(f"  [{mark}] {r.description}" + ("" if r.passed else f": {r.message}"))
        return "\n".join(lines)


def close(actual, expected, atol=1e-5) -> tuple[bool, str]:
    """Whether a learner's tensor equals the reference up to float32 rounding.

    A correct implementation may add in another order than the reference, so it can differ in the
    last bits, by how much depending on the machine. The checks use inputs of order 1 and sums of
    at most a few dozen terms, whose float32 rounding stays below 1e-6 relative
    (:func:`rlm_course.numerics.reorder_tolerance`); ``rtol=1e-4`` and ``atol=1e-5`` are a hundred
    times that, far below the size of any wrong formula.
    """
    if not isinstance(actual, torch.Tensor):
        return False, f"expected a tensor, got {type(actual).__name__}"
    if not isinstance(expected, torch.Tensor):
        expected = torch.as_tensor(expected)
    if actual.shape != expected.shape:
        return False, f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if not torch.allclose(actual.float(), expected.float(), atol=atol, rtol=1e-4):
        got = [round(x, 4) for x in actual.detach().float().flatten()[:8].tolist()]
        want = [round(x, 4) for x in expected.float().flatten()[:8].tolist()]
        return False, f"got {got}, expected {want}"
    return True, ""


def value_close(actual, expected, rel=1e-9) -> tuple[bool, str]:
    if isinstance(actual, torch.Tensor) and actual.numel() == 1:
        return False, (f"expected a Python number, got a one-element tensor ({actual.item()}): "
                       "return .item() of it")
    if not isinstance(actual, numbers.Real) or isinstance(actual, bool):  # numpy scalars are
        return False, f"expected a number, got {type(actual).__name__}"  # Real too
    ok = abs(actual - expected) <= rel * abs(expected)
    return ok, f"got {actual}, expected {expected}"


def equal_groups_get_zero(fn, **kwargs):
    """Eight equal rewards of 0.1 (a well-formed wrong answer) or 0.7: the float mean is one ulp
    off, so only an explicit test for equal rewards gives exactly 0."""
    def check():
        for value in (0.1, 0.7):
            out = fn(torch.full((8,), value), 8, **kwargs)
            if not isinstance(out, torch.Tensor):
                return False, f"expected a tensor, got {type(out).__name__}"
            if out.shape != (8,):
                return False, f"shape {tuple(out.shape)}, expected (8,) (one value per reward)"
            if not bool((out == 0).all()):
                got = out.tolist()[:3]
                return False, (f"rewards all {value}: got {got}..., expected exactly 0 (a float "
                               "mean of equal values can be one ulp off; test for equal rewards)")
        return True, ""

    yield "a group of equal rewards gets exactly 0", check


def leaves_inputs_unchanged(fn, *args, **kwargs):
    """A check that ``fn(*args, **kwargs)`` does not modify its tensor arguments in place: the
    caller still needs them (the trainer logs the rewards after computing advantages, and the
    other checks reuse their inputs). Each argument is passed as a copy and compared after."""
    def check():
        copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        fn(*copies, **kwargs)
        changed = [i for i, (a, c) in enumerate(zip(args, copies))
                   if isinstance(a, torch.Tensor) and not torch.equal(a, c)]
        try:
            names = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            names = []
        which = ", ".join(names[i] if i < len(names) else f"argument {i + 1}" for i in changed)
        return not changed, (f"it changed {which} in place (e.g. `x -= ...`, `x.sub_(...)` or a "
                             "view of x written to): compute a new tensor instead")
    return check
