"""Verifiable tasks (chapters 00-04 train on them; chapter 01 builds them): one module per task
(:mod:`~rlm_course.tasks.addition`, :mod:`~rlm_course.tasks.countdown`, and
:mod:`~rlm_course.tasks.scratchpad`, whose column-by-column traces have the long-tailed lengths of
chapters 12-13), what they share
(:mod:`~rlm_course.tasks.base`: problems, verdicts, the reward) and their fixed held-out sets
(:mod:`~rlm_course.tasks.eval_sets`). This module is the registry: ``get_task("addition",
digits=3)``."""

from __future__ import annotations

from rlm_course.tasks.addition import Addition
from rlm_course.tasks.base import Task
from rlm_course.tasks.countdown import Countdown
from rlm_course.tasks.scratchpad import ScratchpadAddition

TASKS = {"addition": Addition, "countdown": Countdown, "scratchpad": ScratchpadAddition}


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
