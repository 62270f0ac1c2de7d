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
