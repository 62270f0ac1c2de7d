"""Countdown: ``"3,5,2>16:"`` -> ``"(3+5)*2"``: reach the target with + - * / and parentheses,
each given number used at most once, every intermediate result an integer (the game of Countdown;
TinyZero's RL task, github.com/Jiayi-Pan/TinyZero). The verifier evaluates the expression exactly
with its own parser, never ``eval``."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from rlm_course.tasks.base import Problem, Task, well_formed_number


class ExpressionError(ValueError):
    """A countdown response that is not a well-formed expression (a syntax error, trailing text,
    a malformed or too long number)."""


class EvaluationError(ExpressionError):
    """A well-formed expression whose value cannot be computed exactly as the game requires:
    division by zero, a non-integer or too large intermediate result. ``numbers`` holds its
    literals in order (the verifier checks them against the given numbers first)."""

    def __init__(self, message: str, numbers: list[int]) -> None:
        super().__init__(message)
        self.numbers = numbers


MAX_LITERAL_DIGITS = 4
MAX_MAGNITUDE = 10**9


def parse_expression(text: str) -> tuple[Fraction, list[int]]:
    """Parse and evaluate an arithmetic expression exactly, without ``eval``.

    Grammar (recursive descent, usual precedence, left-associative)::

        expr   := term (('+' | '-') term)*
        term   := factor (('*' | '/') factor)*
        factor := NUMBER | '(' expr ')'

    A NUMBER follows :func:`rlm_course.tasks.base.well_formed_number` (no leading zero) and has at
    most ``MAX_LITERAL_DIGITS`` digits. The whole text is parsed before any evaluation failure is
    reported, so that the failure carries every literal.

    Returns:
        ``(value, numbers)``: the exact value and the integer literals in order of appearance.

    Raises:
        ExpressionError: on a syntax error, trailing text, a malformed or too long literal.
        EvaluationError: (a subclass) for a well-formed expression with a division by zero, a
            non-integer intermediate result, or a magnitude above ``MAX_MAGNITUDE``.
    """
    pos = 0
    numbers: list[int] = []
    failures: list[str] = []

    def peek() -> str:
        return text[pos] if pos < len(text) else ""

    def fail(message: str) -> Fraction:  # remember the first failure, parse on with a dummy
        failures.append(message)
        return Fraction(1)

    def checked(x: Fraction) -> Fraction:
        if x.denominator != 1:
            return fail(f"non-integer intermediate result {x}")
        if abs(x) > MAX_MAGNITUDE:
            return fail(f"intermediate result {x} is larger than {MAX_MAGNITUDE}")
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
        if not well_formed_number(literal):
            raise ExpressionError(f"number {literal} has a leading zero")
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
            elif rhs == 0:
                value = fail("division by zero")
            else:
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
    if failures:
        raise EvaluationError(failures[0], numbers)
    return value, numbers


@dataclass
class Countdown(Task):
    """Reach ``target`` from ``n_numbers`` numbers in ``1..max_number`` with + - * / ( )."""

    n_numbers: int = 3
    max_number: int = 10
    max_target: int = 100

    def __post_init__(self) -> None:
        super().__post_init__()
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

    @property
    def max_prompt_len(self) -> int:
        # "n1,n2,...>target:"
        width = len(str(self.max_number))
        return self.n_numbers * width + (self.n_numbers - 1) + 1 + len(str(self.max_target)) + 1

    def problem_space(self) -> int:
        # an upper bound: every tuple of given numbers with every target
        return self.max_number ** self.n_numbers * self.max_target

    def settings_hint(self) -> str:
        return "--n-numbers, --max-number, --max-target"

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
        """Well-formed (``format_ok``): a parsable expression of well-formed numbers, each one of
        the given numbers, none used more often than given (checked before any evaluation).
        Correct: its exact value, with every intermediate result an integer, is the target.
        A response of ``max_response_len`` characters or more is neither: only one cut off at
        the generation budget (or padded with redundant parentheses) is that long."""
        if not response:
            return False, False, "empty response"
        if len(response) >= self.max_response_len:
            # a valid expression and its <eos> fit in max_response_len tokens, so a longer one (e.g.
            # redundant parentheses) can only be a response cut off at the length limit, which is
            # never rewarded as if it were finished (TRL's mask_truncated_completions)
            return False, False, (f"{len(response)} characters, more than the "
                                  f"{self.max_response_len - 1} the task budgets for an answer: "
                                  "cut off at the length limit, or redundant parentheses")
        failure = None
        try:
            value, used = parse_expression(response)
        except EvaluationError as err:
            value, used, failure = None, err.numbers, str(err)
        except ExpressionError as err:
            return False, False, str(err)
        extra = Counter(used) - Counter(problem.numbers)
        if extra:
            n = next(iter(extra))
            why = "used more often than given" if n in problem.numbers else "not among the numbers"
            return False, False, f"number {n} {why} {list(problem.numbers)}"
        if failure is not None:
            return True, False, failure
        if value != problem.target:
            return True, False, f"result {value} != target {problem.target}"
        return True, True, ""
