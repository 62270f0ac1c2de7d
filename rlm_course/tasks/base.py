"""What every verifiable task is: a seeded problem generator, a demonstration for the SFT warm
start, and a verifier that scores a response with no learned model (RL with verifiable rewards,
RLVR; DeepSeek-R1, arXiv:2501.12948; Tulu 3, arXiv:2411.15124). Its reward has two parts:

    reward = format_weight * format_ok + (1 - format_weight) * correct,   in [0, 1]

``format_ok``: the response has the required shape (digits only; a well-formed expression).
``correct``: it is also the right answer. Accuracy, as reported everywhere in the course, is the
mean of ``correct``.

One rule for numbers in every task (:func:`well_formed_number`): ASCII digits, no sign, no
leading zero unless the number is ``0`` itself ("042" and "01" are malformed).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field, fields

from rlm_course.utils import is_real, plain_ints


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


#: Consecutive draws that bring nothing new before a generator gives up (see Task.problems): a
#: distribution whose allowed part is 1% of its draws fails this often with probability 1e-44.
MAX_FAILED_DRAWS = 10_000


def well_formed_number(text: str) -> bool:
    """The course's one rule for a number in a response: ASCII digits only, and no leading zero
    unless the number is ``0`` (so every value has exactly one spelling)."""
    return bool(text) and text.isascii() and text.isdigit() and (text == "0" or text[0] != "0")


@dataclass
class Task:
    """Base class: subclasses define ``key``, ``make_problem``, ``check``, ``max_prompt_len``,
    ``max_response_len`` and ``problem_space``."""

    format_weight: float = 0.1
    name: str = field(default="", init=False)

    def __post_init__(self) -> None:
        """Check the settings every task has; subclasses call it first, then check their own.

        Raises:
            ValueError: for a setting that is not a number (a bool, a string), or a
                ``format_weight`` outside [0, 1] (the reward would leave [0, 1]: 2.0 paid a wrong
                answer 2, NaN a right one NaN).
        """
        plain_ints(self)  # numpy's integers
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "name" and not is_real(value):
                raise ValueError(f"{type(self).__name__}: {f.name}={value!r} must be a number.")
        if not 0.0 <= self.format_weight <= 1.0:  # NaN fails too
            raise ValueError(f"{type(self).__name__}: format_weight={self.format_weight!r} must "
                             "be in [0, 1], the share of the reward a well-formed answer earns.")

    @property
    def key(self) -> str:
        """Identifies the problem distribution (name plus size settings); names eval-set files."""
        return self.name

    @property
    def max_response_len(self) -> int:
        """Tokens of the longest valid response, ``<eos>`` included."""
        raise NotImplementedError

    @property
    def max_prompt_len(self) -> int:
        """Characters of the longest prompt (without ``<bos>``)."""
        raise NotImplementedError

    def problem_space(self) -> int:
        """How many distinct prompts the generator can produce at most (an upper bound where the
        exact count is not known)."""
        raise NotImplementedError

    def check_problem_space(self, needed: int, what: str) -> None:
        """Raise ``ValueError`` at once if ``needed`` distinct prompts cannot exist.

        Raises:
            ValueError: naming the task's settings, the size of its problem space and the need.
        """
        space = self.problem_space()
        if space < needed:
            raise ValueError(f"task {self.key} has at most {space:,} distinct problems, but "
                             f"{what} needs {needed:,}; choose larger settings "
                             f"({self.settings_hint()}).")

    def settings_hint(self) -> str:
        """Which command-line flags change the problem space (for error messages)."""
        return "the task's size flags"

    def model_overrides(self) -> dict:
        """Changes to the course's default model (:func:`rlm_course.rl.sft.default_model_config`)
        that this task needs, e.g. more positions for long reasoning traces; ``{}`` for a task
        that fits the default model."""
        return {}

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

    def problems(self, n: int, seed: int, exclude: set[str] | None = None,
                 distinct: bool = False) -> list[Problem]:
        """``n`` problems from ``random.Random(seed)``, skipping prompts in ``exclude`` (and,
        with ``distinct``, repeated prompts).

        Raises:
            ValueError: for a negative ``n``, or when :data:`MAX_FAILED_DRAWS` draws in a row
                bring nothing new: the problem space (minus ``exclude``) is too small for the
                request; the message names the task's settings.
        """
        if n < 0:
            raise ValueError(f"problems: n={n} must be non-negative.")
        excluded = set() if exclude is None or isinstance(exclude, str) else set(exclude)
        if isinstance(exclude, str) or not all(isinstance(p, str) for p in excluded):
            raise ValueError("problems: exclude must be a collection of prompt strings (e.g. "
                             "{p.prompt for p in held_out}); a Problem or a single string "
                             "excluded nothing.")
        rng, out, seen, failed = random.Random(seed), [], set(excluded), 0
        while len(out) < n:
            p = self.make_problem(rng)
            if p.prompt in seen:
                failed += 1
                if failed >= MAX_FAILED_DRAWS:
                    kind = "distinct " if distinct else ""
                    raise ValueError(
                        f"task {self.key}: {MAX_FAILED_DRAWS:,} draws in a row found no new "
                        f"problem after {len(out)} of the {n} {kind}problems asked for "
                        f"({len(excluded)} excluded, e.g. the held-out set); its problem "
                        f"space (at most {self.problem_space():,}) is too small: choose larger "
                        f"settings ({self.settings_hint()}).")
                continue
            failed = 0
            out.append(p)
            if distinct:
                seen.add(p.prompt)
        return out

    def demonstration(self, problem: Problem) -> str:
        """A correct response, used for supervised warm start (SFT)."""
        return problem.answer
