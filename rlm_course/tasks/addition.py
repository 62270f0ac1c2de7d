"""Addition: ``"47+85="`` -> ``"132"``, operands with up to ``digits`` digits."""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlm_course.tasks.base import Problem, Task, well_formed_number


@dataclass
class Addition(Task):
    """``a+b=`` with ``0 <= a, b < 10**digits``; the response is the sum in decimal."""

    digits: int = 3

    def __post_init__(self) -> None:
        super().__post_init__()
        self.name = "addition"
        if not isinstance(self.digits, int) or not 1 <= self.digits <= 9:
            raise ValueError(f"Addition: digits={self.digits!r} must be an integer in 1..9.")

    @property
    def key(self) -> str:
        return f"addition-{self.digits}"

    @property
    def max_response_len(self) -> int:
        return self.digits + 2  # digits of the sum (<= digits + 1) and <eos>

    @property
    def max_prompt_len(self) -> int:
        return 2 * self.digits + 2  # "a+b="

    def problem_space(self) -> int:
        return 10 ** (2 * self.digits)

    def settings_hint(self) -> str:
        return "--digits"

    def make_problem(self, rng: random.Random) -> Problem:
        a, b = rng.randrange(10**self.digits), rng.randrange(10**self.digits)
        return Problem(prompt=f"{a}+{b}=", answer=str(a + b))

    def check(self, problem: Problem, response: str) -> tuple[bool, bool, str]:
        if not well_formed_number(response):
            return False, False, f"not a well-formed number: {response!r}"
        if len(response) > self.digits + 1:
            return False, False, f"longer than any sum of {self.digits}-digit numbers: {response!r}"
        correct = response == problem.answer
        return True, correct, "" if correct else f"{response} != {problem.answer}"
