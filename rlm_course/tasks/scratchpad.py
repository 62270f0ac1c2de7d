"""Scratchpad addition: ``"347+285="`` -> ``"7+5=12>2,4+8+1=13>32,3+2+1=6>632"``: a sum of two
``n``-digit numbers worked column by column, the reasoning trace written out, with ``n`` drawn from
a skewed distribution so that response lengths have a long tail (chapters 12-13).

**The trace.** One step per column, least significant first, separated by ``,``::

    x+y[+1]=s>p

``x`` and ``y`` are the column's digits of the two operands, ``+1`` appears when the previous
column carried, ``s`` is the column sum (``x + y + carry``, one or two digits) and ``p`` the
result so far: the last digit of ``s`` written in front of the previous step's ``p`` (the whole of
``s`` at the last column, whose carry is the result's leading digit). The last step's ``p`` is the
final answer. Each step needs only the prompt and the step before it (a scratchpad in the sense of
Nye et al. 2021, "Show your work", arXiv:2112.00114).

**The long tail.** ``n`` is drawn with probability proportional to ``decay ** (n - 1)`` for
``n = 1 .. max_digits``: with the defaults (``decay`` 0.5, ``max_digits`` 6) half of the problems
have one digit and one in 60 has six. A step holds about ``8 + i`` characters at column ``i``, so a
response grows like ``8 n + n^2 / 2``: 8 tokens for one digit, about 60 for six. In a batch of 128
responses the longest is typically three to four times the mean (:func:`response_length_stats`
measures it) -- the shape of long chain-of-thought traces that makes the longest response bound
the decode time of a step (chapters 05-06, 13).

**The verifier.** ``format_ok``: the response parses as one step per column of the operands, with
well-formed numbers (:func:`rlm_course.tasks.base.well_formed_number`) for the column sums and the
final answer (an intermediate ``p`` holds the result's low digits and may start with 0, as
``082`` does in ``67767+25315``); ``correct``: every step is
the right arithmetic on the right digits (a trace that reaches the right answer by wrong steps is
not correct) and the final answer is the sum. The verifier parses with its own code, never
``eval``.
"""

from __future__ import annotations

import random
import re
import statistics
from dataclasses import dataclass

from rlm_course.tasks.base import Problem, Task, well_formed_number

STEP = re.compile(r"^(\d)\+(\d)(\+1)?=(\d+)>(\d+)$")


def column_steps(a: str, b: str) -> list[str]:
    """The trace steps of ``a + b`` for two decimal strings of equal length (see the module
    docstring).

    Raises:
        ValueError: if the operands are not digit strings of equal length.
    """
    if len(a) != len(b) or not (a.isascii() and a.isdigit() and b.isascii() and b.isdigit()):
        raise ValueError(f"column_steps: {a!r} and {b!r} must be digit strings of equal length.")
    steps, carry, partial = [], 0, ""
    n = len(a)
    for i in range(n):
        x, y = int(a[n - 1 - i]), int(b[n - 1 - i])
        s = x + y + carry
        partial = (str(s) if i == n - 1 else str(s % 10)) + partial
        steps.append(f"{x}+{y}{'+1' if carry else ''}={s}>{partial}")
        carry = s // 10
    return steps


@dataclass
class ScratchpadAddition(Task):
    """``a+b=`` with ``a`` and ``b`` of ``n`` digits each (no leading zero unless ``n = 1``),
    ``n`` in ``1..max_digits`` with probability proportional to ``decay ** (n - 1)``; the response
    is the column-by-column trace of :func:`column_steps`.

    Raises:
        ValueError: for ``max_digits`` outside 1..8 or ``decay`` outside (0, 1].
    """

    max_digits: int = 6
    decay: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        self.name = "scratchpad"
        if not isinstance(self.max_digits, int) or not 1 <= self.max_digits <= 8:
            raise ValueError(f"ScratchpadAddition: max_digits={self.max_digits!r} must be an "
                             "integer in 1..8.")
        if not 0.0 < float(self.decay) <= 1.0:
            raise ValueError(f"ScratchpadAddition: decay={self.decay!r} must be in (0, 1] "
                             "(1 draws every size equally often; smaller values thin the tail).")

    @property
    def key(self) -> str:
        suffix = "" if self.decay == 0.5 else f"-d{self.decay:g}"
        return f"scratchpad-{self.max_digits}{suffix}"

    @property
    def max_prompt_len(self) -> int:
        return 2 * self.max_digits + 2  # "a+b="

    @property
    def max_response_len(self) -> int:
        # the longest trace: every column sums to two digits and carries (9...9 + 9...9)
        nines = "9" * self.max_digits
        return len(",".join(column_steps(nines, nines))) + 1  # and <eos>

    def model_overrides(self) -> dict:
        """The course's model with enough positions for the longest prompt and trace (and the
        other sizes unchanged): ``<bos>``, prompt and response, rounded up to a multiple of 16."""
        needed = 1 + self.max_prompt_len + self.max_response_len
        return {"max_seq_len": -(-needed // 16) * 16}

    def size_probabilities(self) -> list[float]:
        """``P(n)`` for ``n = 1 .. max_digits``."""
        weights = [self.decay ** (n - 1) for n in range(1, self.max_digits + 1)]
        total = sum(weights)
        return [w / total for w in weights]

    def problem_space(self) -> int:
        # 100 one-digit problems, then 81 * 10 ** (2n - 2) for each n >= 2
        return 100 + sum(81 * 10 ** (2 * n - 2) for n in range(2, self.max_digits + 1))

    def settings_hint(self) -> str:
        return "--max-digits"

    def make_problem(self, rng: random.Random) -> Problem:
        n = rng.choices(range(1, self.max_digits + 1), weights=self.size_probabilities())[0]
        low = 0 if n == 1 else 10 ** (n - 1)
        a, b = rng.randrange(low, 10**n), rng.randrange(low, 10**n)
        return Problem(prompt=f"{a}+{b}=", answer=str(a + b))

    def demonstration(self, problem: Problem) -> str:
        a, b = problem.prompt[:-1].split("+")
        return ",".join(column_steps(a, b))

    def check(self, problem: Problem, response: str) -> tuple[bool, bool, str]:
        """Format: one well-formed step per column (see the module docstring). Correct: every
        step equals the one :func:`column_steps` writes, so the last ``p`` is the sum."""
        a, b = problem.prompt[:-1].split("+")
        expected = column_steps(a, b)
        steps = response.split(",")
        if len(steps) != len(expected):
            return False, False, (f"{len(steps)} step(s) for {len(expected)} column(s)"
                                  if response else "empty response")
        for i, step in enumerate(steps):
            match = STEP.match(step) if step.isascii() else None
            if match is None:
                return False, False, f"step {i + 1} {step!r} is not x+y[+1]=s>p"
            s, p = match.group(4), match.group(5)
            # the column sum is a number; p is the result's low digits ("082" is fine) until
            # the last step, where it is the answer, a number
            last = i == len(steps) - 1
            if not well_formed_number(s) or (last and not well_formed_number(p)):
                return False, False, f"step {i + 1} {step!r} has a malformed number"
        for i, (step, want) in enumerate(zip(steps, expected)):
            if step != want:
                return True, False, f"step {i + 1} is {step!r}, expected {want!r}"
        return True, True, ""


def response_length_stats(lengths) -> dict:
    """Summary of a batch's response lengths (tokens): ``mean``, ``median``, ``p90``, ``max``
    and ``max_over_mean`` (how many times the mean the longest response is: the long tail).

    Raises:
        ValueError: for an empty batch.
    """
    lengths = [int(t) for t in lengths]
    if not lengths:
        raise ValueError("response_length_stats: no lengths.")
    ordered = sorted(lengths)
    mean = sum(lengths) / len(lengths)
    return {"mean": mean, "median": statistics.median(lengths),
            "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "max": ordered[-1], "max_over_mean": ordered[-1] / mean if mean else 0.0}
