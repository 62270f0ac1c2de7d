"""The autograder: one switch chooses whose code is graded (``--impl exercises|solutions``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from rlm_course.tools.checks import (CHECK_SECONDS, CheckReport, CheckTimeout, run_check,
                                      time_limit)
from rlm_course.tools.checks.common import CheckResult
from rlm_course.tools.exercisegen import EXERCISES
from rlm_course.utils import repo_root

IMPLS = ("exercises", "solutions")


def _chapter(number: str):
    """The chapter named ``number``: ``"02"``, ``"2"``, or its file's stem (``"ex02"``,
    ``"ex02_grpo"``, ``"ex02_grpo.py"``)."""
    key = number.removesuffix(".py").lower()
    for chapter in EXERCISES:
        if chapter.number == key.zfill(2) or key in (f"ex{chapter.number}", chapter.stem):
            return chapter
    raise ValueError(f"no exercises for chapter {number!r}; chapters with exercises: "
                     f"{[c.number for c in EXERCISES]}.")


def load_impl(chapter: str, impl: str = "exercises", root: Path | None = None) -> ModuleType:
    """Import ``<impl>/exNN_<topic>.py`` afresh (edits are picked up on every call).

    Raises:
        ValueError: for an unknown chapter or impl, or a missing file.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}: choose 'exercises' (your code) or 'solutions'.")
    c = _chapter(chapter)
    path = (root or repo_root()) / impl / f"{c.stem}.py"
    if not path.exists():
        raise ValueError(f"{path} is missing; regenerate it with `python -m rlm_course exercises`.")
    name = f"_rlm_{impl}_{c.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as err:  # a syntax error, a bad import, a sys.exit() left
        # at the top level: say where, no traceback, and never end the grader silently
        where = f" (line {err.lineno})" if getattr(err, "lineno", None) else ""
        if isinstance(err, SyntaxError):  # its str repeats the file and line: the message and
            text = (err.text or "").strip()  # the offending line instead
            where = f" (line {err.lineno}: {text})" if err.lineno and text else where
            what = f"{type(err).__name__}: {err.msg}"
        else:
            what = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        if isinstance(err, SystemExit):
            what += " (the file calls sys.exit() or exit() when imported; remove that call)"
        raise ValueError(f"could not import {path}{where}: {what}; fix the file and grade "
                         "again.") from None
    return module


def grade(chapter: str | None = None, impl: str = "exercises",
          root: Path | None = None) -> list[CheckReport]:
    """Run the checks of every exercise of ``chapter`` (all chapters when None) on ``impl``. A
    file that cannot be imported, or that lacks one of its functions, fails that chapter's
    exercises with the reason and the other chapters are still graded.

    Raises:
        ValueError: for an unknown chapter or impl; for a file that cannot be imported when one
            chapter is graded.
    """
    chapters = EXERCISES if chapter is None else (_chapter(chapter),)
    reports = []
    for c in chapters:
        try:
            with time_limit(CHECK_SECONDS):
                module = load_impl(c.number, impl, root)
        except CheckTimeout:
            module = None
            why = (f"importing {impl}/{c.stem}.py did not finish within {CHECK_SECONDS:g} s (code "
                   "left at the top level of the file, e.g. a test loop?)")
        except ValueError as err:
            if chapter is not None or impl not in IMPLS:
                raise
            module, why = None, str(err)
        for _, name in c.functions:
            fn = getattr(module, name, None)  # None for a module that did not import
            if module is None:
                reports.append(CheckReport(name, [CheckResult("the file imports", False, why)]))
            elif not callable(fn):
                reports.append(CheckReport(name, [CheckResult(
                    "the function is in the file", False,
                    f"no function {name} in {impl}/{c.stem}.py (deleted or renamed? keep its name "
                    "and signature; `python -m rlm_course exercises --force` writes a fresh stub "
                    "but replaces every edited exercise: copy your work first)")]))
            else:
                reports.append(run_check(name, fn))
    return reports


def main(impl: str = "exercises", chapter: str | None = None) -> int:
    """Print a report per exercise; exit status 0 only if every check passes."""
    reports = grade(chapter, impl)
    for r in reports:
        print(r)
    done = sum(r.all_passed for r in reports)
    print(f"\n{done}/{len(reports)} exercises complete ({impl}).")
    return 0 if done == len(reports) else 1
