"""The fixed held-out problems of each task (``data/eval/<task key>.jsonl``): generated once from
a fixed seed, committed, and never sampled for training."""

from __future__ import annotations

import json
from pathlib import Path

from rlm_course.tasks.base import Problem, Task
from rlm_course.utils import data_dir

EVAL_SEED = 1234


EVAL_SIZE = 200


def eval_set_path(task: Task) -> Path:
    return data_dir() / "eval" / f"{task.key}.jsonl"


def make_eval_set(task: Task, n: int = EVAL_SIZE, seed: int = EVAL_SEED) -> list[Problem]:
    """The fixed held-out problems of ``task``: ``n`` distinct prompts from ``seed``.

    Raises:
        ValueError: at once if the task's problem space has fewer than ``n`` prompts (e.g.
            1-digit addition has 100), naming the settings to change.
    """
    task.check_problem_space(n, "its held-out set")
    return task.problems(n, seed, distinct=True)


def write_eval_set(task: Task) -> Path:
    path = eval_set_path(task)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(p.to_json() + "\n" for p in make_eval_set(task)))
    return path


def load_eval_set(task: Task) -> list[Problem]:
    """The committed held-out set of ``task`` (``data/eval/<key>.jsonl``), or, for settings
    that have none, the same problems generated from ``EVAL_SEED``.

    Raises:
        ValueError: if the file exists but is not valid JSONL of problems of ``task`` (each
            line's prompt and answer strings, and its own answer verified correct: a countdown
            line without its numbers would score every response 0), or holds another count
            than :data:`EVAL_SIZE` (a cut file).
    """
    path = eval_set_path(task)
    if not path.exists():
        return make_eval_set(task)
    problems = []
    fix = "regenerate the file with `python -m rlm_course make-eval-sets`."
    for i, line in enumerate(path.read_text().splitlines(), 1):
        try:
            problem = Problem.from_dict(json.loads(line))
            if not (isinstance(problem.prompt, str) and isinstance(problem.answer, str)):
                raise TypeError("prompt and answer must be strings")
            verdict = task.verify(problem, task.demonstration(problem))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"{path}:{i}: not a problem of {task.key} ({err}); {fix}") from None
        if not verdict.correct:
            raise ValueError(f"{path}:{i}: its own answer does not verify for {task.key} "
                             f"({verdict.reason}); {fix}")
        problems.append(problem)
    if len(problems) != EVAL_SIZE:
        raise ValueError(f"{path}: {len(problems)} problems, not the {EVAL_SIZE} of a held-out "
                         f"set; {fix}")
    return problems
