"""Verifiable tasks: seeded problem generators, demonstrations and verifiers.

A verifier scores a response with no learned model (RL with verifiable rewards, RLVR; DeepSeek-R1,
arXiv:2501.12948; Tulu 3, arXiv:2411.15124). Its reward has two parts:

    reward = format_weight * format_ok + (1 - format_weight) * correct,   in [0, 1]

``format_ok``: the response has the required shape (digits only; a well-formed expression).
``correct``: it is also the right answer. Accuracy, as reported everywhere in the course, is the
mean of ``correct``.

Tasks:
    * ``addition``: ``"47+85="`` -> ``"132"``, operands with up to ``digits`` digits.
    * ``countdown``: ``"3,5,2>16:"`` -> ``"(3+5)*2"``: reach the target with + - * / and
      parentheses, each given number used at most once, every intermediate result an integer
      (the game of Countdown; TinyZero's RL task, github.com/Jiayi-Pan/TinyZero).
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path

EVAL_SEED = 1234
EVAL_SIZE = 200


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


@dataclass
class Addition(Task):
    """``a+b=`` with ``0 <= a, b < 10**digits``; the response is the sum in decimal."""

    digits: int = 3

    def __post_init__(self) -> None:
        self.name = "addition"
        if not isinstance(self.digits, int) or not 1 <= self.digits <= 9:
            raise ValueError(f"Addition: digits={self.digits!r} must be an integer in 1..9.")

    @property
    def key(self) -> str:
        return f"addition-{self.digits}"

    @property
    def max_response_len(self) -> int:
        return self.digits + 2  # digits of the sum (<= digits + 1) and <eos>

    def make_problem(self, rng: random.Random) -> Problem:
        a, b = rng.randrange(10**self.digits), rng.randrange(10**self.digits)
        return Problem(prompt=f"{a}+{b}=", answer=str(a + b))

    def check(self, problem: Problem, response: str) -> tuple[bool, bool, str]:
        if not response or not response.isdigit() or not response.isascii():
            return False, False, f"not a number: {response!r}"
        if len(response) > self.digits + 1 or (len(response) > 1 and response[0] == "0"):
            return False, False, f"malformed number: {response!r}"
        correct = response == problem.answer
        return True, correct, "" if correct else f"{response} != {problem.answer}"


class ExpressionError(ValueError):
    """A countdown expression that cannot be parsed or evaluated."""


MAX_LITERAL_DIGITS = 4
MAX_MAGNITUDE = 10**9


def parse_expression(text: str) -> tuple[Fraction, list[int]]:
    """Parse and evaluate an arithmetic expression exactly, without ``eval``.

    Grammar (recursive descent, usual precedence, left-associative)::

        expr   := term (('+' | '-') term)*
        term   := factor (('*' | '/') factor)*
        factor := NUMBER | '(' expr ')'

    Returns:
        ``(value, numbers)``: the exact value and the integer literals in order of appearance.

    Raises:
        ExpressionError: on a syntax error, trailing text, a literal of more than
            ``MAX_LITERAL_DIGITS`` digits, division by zero, a non-integer intermediate result,
            or a magnitude above ``MAX_MAGNITUDE``.
    """
    pos = 0
    numbers: list[int] = []

    def peek() -> str:
        return text[pos] if pos < len(text) else ""

    def checked(x: Fraction) -> Fraction:
        if x.denominator != 1:
            raise ExpressionError(f"non-integer intermediate result {x}")
        if abs(x) > MAX_MAGNITUDE:
            raise ExpressionError(f"intermediate result {x} is larger than {MAX_MAGNITUDE}")
        return x

    def factor() -> Fraction:
        nonlocal pos
        if peek() == "(":
            pos += 1
            value = expr()
            if peek() != ")":
                raise ExpressionError(f"expected ')' at position {pos}")
            pos += 1
            return value
        start = pos
        while peek().isdigit() and peek().isascii():
            pos += 1
        if start == pos:
            raise ExpressionError(f"expected a number or '(' at position {pos}")
        literal = text[start:pos]
        if len(literal) > MAX_LITERAL_DIGITS:
            raise ExpressionError(f"number {literal} has more than {MAX_LITERAL_DIGITS} digits")
        numbers.append(int(literal))
        return Fraction(int(literal))

    def term() -> Fraction:
        nonlocal pos
        value = factor()
        while peek() in ("*", "/") and peek():
            op = peek()
            pos += 1
            rhs = factor()
            if op == "*":
                value = checked(value * rhs)
            else:
                if rhs == 0:
                    raise ExpressionError("division by zero")
                value = checked(value / rhs)
        return value

    def expr() -> Fraction:
        nonlocal pos
        value = term()
        while peek() in ("+", "-") and peek():
            op = peek()
            pos += 1
            rhs = term()
            value = checked(value + rhs if op == "+" else value - rhs)
        return value

    if len(text) > 64:
        raise ExpressionError(f"expression of {len(text)} characters is longer than 64")
    value = expr()
    if pos != len(text):
        raise ExpressionError(f"trailing text {text[pos:]!r}")
    return value, numbers


@dataclass
class Countdown(Task):
    """Reach ``target`` from ``n_numbers`` numbers in ``1..max_number`` with + - * / ( )."""

    n_numbers: int = 3
    max_number: int = 10
    max_target: int = 100

    def __post_init__(self) -> None:
        self.name = "countdown"
        if not isinstance(self.n_numbers, int) or not 2 <= self.n_numbers <= 6:
            raise ValueError(f"Countdown: n_numbers={self.n_numbers!r} must be an integer in 2..6.")
        if not isinstance(self.max_number, int) or not 2 <= self.max_number <= 999:
            raise ValueError(f"Countdown: max_number={self.max_number!r} must be in 2..999.")
        if not isinstance(self.max_target, int) or self.max_target < 1:
            raise ValueError(f"Countdown: max_target={self.max_target!r} must be >= 1.")

    @property
    def key(self) -> str:
        return f"countdown-{self.n_numbers}x{self.max_number}-t{self.max_target}"

    @property
    def max_response_len(self) -> int:
        # numbers, n-1 operators, up to n-1 parenthesis pairs, and <eos>
        width = len(str(self.max_number))
        return self.n_numbers * width + (self.n_numbers - 1) * 3 + 1

    def make_problem(self, rng: random.Random) -> Problem:
        while True:
            numbers = [rng.randint(1, self.max_number) for _ in range(self.n_numbers)]
            order = numbers[:]
            rng.shuffle(order)
            expr, value, top_is_sum = str(order[0]), Fraction(order[0]), False
            for n in order[1:]:
                op = rng.choice("+-*/")
                if op == "/" and (value % n != 0):
                    op = rng.choice("+*")
                if op == "-" and value - n <= 0:
                    op = "+"
                left = f"({expr})" if op in "*/" and top_is_sum else expr
                expr = f"{left}{op}{n}"
                value = {"+": value + n, "-": value - n, "*": value * n, "/": value / n}[op]
                top_is_sum = op in "+-"
            if 1 <= value <= self.max_target:
                target = int(value)
                prompt = ",".join(map(str, numbers)) + f">{target}:"
                return Problem(prompt=prompt, answer=expr, numbers=tuple(numbers), target=target)

    def check(self, problem: Problem, response: str) -> tuple[bool, bool, str]:
        if not response:
            return False, False, "empty response"
        try:
            value, used = parse_expression(response)
        except ExpressionError as err:
            message = str(err)
            syntax_ok = message.startswith(("division by zero", "non-integer", "intermediate"))
            return syntax_ok, False, message
        extra = Counter(used) - Counter(problem.numbers)
        if extra:
            n = next(iter(extra))
            why = "used more often than given" if n in problem.numbers else "not among the numbers"
            return True, False, f"number {n} {why} {list(problem.numbers)}"
        if value != problem.target:
            return True, False, f"result {value} != target {problem.target}"
        return True, True, ""


TASKS = {"addition": Addition, "countdown": Countdown}


def get_task(name: str, **settings) -> Task:
    """The task called ``name`` with ``settings`` (e.g. ``digits=2``).

    Raises:
        ValueError: for an unknown name or setting.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)}.")
    try:
        return TASKS[name](**settings)
    except TypeError as err:
        raise ValueError(f"task {name!r}: bad settings {settings}: {err}") from None


def data_dir() -> Path:
    """The course's ``data/`` folder (``RLM_COURSE_DATA`` overrides)."""
    return Path(os.environ.get("RLM_COURSE_DATA", Path(__file__).resolve().parent.parent / "data"))


def eval_set_path(task: Task) -> Path:
    return data_dir() / "eval" / f"{task.key}.jsonl"


def make_eval_set(task: Task, n: int = EVAL_SIZE, seed: int = EVAL_SEED) -> list[Problem]:
    """The fixed held-out problems of ``task``: ``n`` distinct prompts from ``seed``."""
    rng, seen, out = random.Random(seed), set(), []
    while len(out) < n:
        p = task.make_problem(rng)
        if p.prompt not in seen:
            seen.add(p.prompt)
            out.append(p)
    return out


def write_eval_set(task: Task) -> Path:
    path = eval_set_path(task)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(p.to_json() + "\n" for p in make_eval_set(task)))
    return path


def load_eval_set(task: Task) -> list[Problem]:
    """The committed held-out set of ``task`` (``data/eval/<key>.jsonl``), or, for settings
    that have none, the same problems generated from ``EVAL_SEED``.

    Raises:
        ValueError: if the file exists but is not valid JSONL of problems.
    """
    path = eval_set_path(task)
    if not path.exists():
        return make_eval_set(task)
    problems = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        try:
            problems.append(Problem.from_dict(json.loads(line)))
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{path}:{i}: not a problem ({err}); regenerate the file with "
                             "`python -m rlm_course make-eval-sets`.") from None
    return problems
