"""What every verifiable task is: a seeded problem generator, a demonstration for the SFT warm
start, and a verifier that scores a response with no learned model (RL with verifiable rewards,
RLVR; DeepSeek-R1, arXiv:2501.12948; Tulu 3, arXiv:2411.15124). Its reward has two parts:

    reward = format_weight * format_ok + (1 - format_weight) * correct,   in [0, 1]

``format_ok``: the response has the required shape (digits only; a well-formed expression).
``correct``: it is also the right answer. Accuracy, as reported everywhere in the course, is the
mean of ``correct``.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Problem:
    """One task instance. ``numbers``/``target`` are used by countdown only."""

    prompt: str
    answer: str
    numbers: tuple[int, ...] = ()
    target: int | None = None

    def to_json(self) -> str:
        d = asdict(self)
        d["numbers"] = list(self.numbers)
        return json.dumps(d)

    @staticmethod
    def from_dict(d: dict) -> "Problem":
        return Problem(prompt=d["prompt"], answer=d["answer"], numbers=tuple(d.get("numbers", ())),
                       target=d.get("target"))


@dataclass(frozen=True)
class Verdict:
    """Result of verifying one response: its two parts, the reward, and why."""

    format_ok: bool
    correct: bool
    reward: float
    reason: str = ""


@dataclass
class Task:
    """Base class: subclasses define ``key``, ``make_problem`` and ``check``."""

    format_weight: float = 0.1
    name: str = field(default="", init=False)

    @property
    def key(self) -> str:
        """Identifies the problem distribution (name plus size settings); names eval-set files."""
        return self.name

    @property
    def max_response_len(self) -> int:
        raise NotImplementedError

    def make_problem(self, rng: random.Random) -> Problem:
        raise NotImplementedError

    def check(self, problem: Problem, response: str) -> tuple[bool, bool, str]:
        """``(format_ok, correct, reason)`` of ``response``."""
        raise NotImplementedError

    def verify(self, problem: Problem, response: str) -> Verdict:
        """Score ``response`` (the generated text, without ``<eos>``) for ``problem``."""
        format_ok, correct, reason = self.check(problem, response)
        correct = correct and format_ok
        reward = self.format_weight * format_ok + (1.0 - self.format_weight) * correct
        return Verdict(format_ok, correct, float(reward), reason)

    def problems(self, n: int, seed: int, exclude: set[str] | None = None) -> list[Problem]:
        """``n`` problems from ``random.Random(seed)``, skipping prompts in ``exclude``."""
        if n < 0:
            raise ValueError(f"problems: n={n} must be non-negative.")
        rng, out, exclude = random.Random(seed), [], exclude or set()
        while len(out) < n:
            p = self.make_problem(rng)
            if p.prompt not in exclude:
                out.append(p)
        return out

    def demonstration(self, problem: Problem) -> str:
        """A correct response, used for supervised warm start (SFT)."""
        return problem.answer
