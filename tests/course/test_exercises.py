import inspect
from pathlib import Path

import pytest

from rlm_course.tools import exercisegen, grading
from rlm_course.tools.grading import grade, load_impl
from rlm_course.utils import repo_root

ROOT = repo_root()


def test_committed_exercises_and_solutions_are_generated_from_the_package():
    for path, text in exercisegen.expected_files().items():
        assert path.exists(), f"{path} missing: run python -m rlm_course exercises"
        assert path.read_text() == text, f"{path} is stale: run python -m rlm_course exercises"


def test_solutions_pass_the_autograder():
    reports = grade(impl="solutions")
    assert reports and all(r.all_passed for r in reports), "\n".join(map(str, reports))


def test_untouched_exercises_fail_only_with_not_implemented():
    reports = grade(impl="exercises")
    assert reports
    for r in reports:
        assert not r.all_passed
        assert r.not_implemented is not None and r.not_implemented.startswith("not implemented yet")
        assert str(r).startswith(f"{r.name}: not implemented yet")


@pytest.mark.parametrize("chapter", [c.number for c in exercisegen.EXERCISES])
def test_exercise_and_solution_share_signatures_and_docstrings(chapter):
    ex, sol = load_impl(chapter, "exercises"), load_impl(chapter, "solutions")
    for name in sol.__all__:
        a, b = getattr(ex, name), getattr(sol, name)
        assert inspect.signature(a) == inspect.signature(b)
        assert a.__doc__ == b.__doc__


@pytest.mark.parametrize("module,name", [f for c in exercisegen.EXERCISES for f in c.functions],
                         ids=lambda x: x)
def test_package_functions_pass_their_exercise_checks(module, name):
    import importlib

    from rlm_course.tools.checks import run_check

    report = run_check(name, getattr(importlib.import_module(module), name))
    assert report.all_passed, str(report)


def test_markers_are_checked():
    with pytest.raises(ValueError, match="without # END"):
        exercisegen.split_regions("def f():\n    # BEGIN SOLUTION\n    return 1\n", False)
    stub = exercisegen.split_regions(
        "def f():\n    # BEGIN SOLUTION: add one\n    return 1\n    # END SOLUTION\n", False)
    assert "raise NotImplementedError('not implemented yet: add one')" in stub
    assert "return 1" not in stub


def test_grade_cli_exit_codes(capsys):
    from rlm_course.cli import main

    assert main(["grade", "--impl", "solutions"]) == 0
    assert main(["grade", "02"]) == 1
    assert "0/3 exercises complete" in capsys.readouterr().out
    assert main(["grade", "99"]) == 2
    assert "no exercises for chapter" in capsys.readouterr().err
    assert [grading._chapter(k).number for k in ("2", "02", "ex02", "ex02_grpo", "EX02_grpo.py")] \
        == ["02"] * 5


def test_grading_a_broken_file_is_a_clear_error(tmp_path):
    (tmp_path / "exercises").mkdir()
    (tmp_path / "exercises" / "ex02_grpo.py").write_text("def group_advantages(:\n")
    with pytest.raises(ValueError, match=r"could not import .*ex02_grpo.py \(line 1: def "
                                         r"group_advantages\(:\): SyntaxError: ") as info:
        load_impl("02", "exercises", root=tmp_path)
    assert str(info.value).count("line 1") == 1  # the line once, with its text


def test_grading_a_file_that_exits_when_imported_is_a_clear_error(tmp_path):
    (tmp_path / "exercises").mkdir()
    (tmp_path / "exercises" / "ex02_grpo.py").write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(ValueError, match=r"could not import .*ex02_grpo.py: SystemExit: 3 \(the "
                                         r"file calls sys.exit\(\) or exit\(\) when imported"):
        load_impl("02", "exercises", root=tmp_path)


def test_learner_code_that_exits_is_reported_not_fatal():
    from rlm_course.tools.checks import run_check

    def rude(*args, **kwargs):
        raise SystemExit(3)

    report = run_check("kl_k3", rude)
    assert report.n_passed == 0 and "SystemExit" in str(report)


def test_learner_code_that_never_returns_is_reported_within_the_limit():
    import time

    from rlm_course.tools.checks import run_check

    def endless(*args, **kwargs):
        while True:
            pass

    start = time.perf_counter()
    report = run_check("kl_k3", endless, seconds=0.2)
    assert time.perf_counter() - start < 5  # one check timed out, the others skipped
    assert report.n_passed == 0 and len(report.results) == 1
    assert "did not finish within 0.2 s (an endless loop" in str(report)


def test_a_retry_loop_that_catches_exception_does_not_swallow_the_time_limit():
    import time

    from rlm_course.tools.checks import run_check

    def retrying(*args, **kwargs):
        while True:
            try:
                time.sleep(0.01)
            except Exception:  # a learner's retry loop
                continue

    start = time.perf_counter()
    report = run_check("kl_k3", retrying, seconds=0.2)
    assert time.perf_counter() - start < 5
    assert "did not finish within 0.2 s" in str(report) and not report.all_passed
    assert "the later checks were not run" in str(report)


def _exercise_file(tmp_path, chapter_stem: str, edit) -> Path:
    (tmp_path / "exercises").mkdir(exist_ok=True)
    source = (ROOT / "solutions" / f"{chapter_stem}.py").read_text()
    path = tmp_path / "exercises" / f"{chapter_stem}.py"
    path.write_text(edit(source))
    return path


def test_a_renamed_function_fails_its_exercise_and_the_others_are_graded(tmp_path):
    _exercise_file(tmp_path, "ex02_grpo", lambda s: s.replace("def kl_k3(", "def kl_k3_mine("))
    reports = {r.name: r for r in grading.grade("02", root=tmp_path)}
    assert reports["group_advantages"].all_passed and reports["clipped_objective"].all_passed
    assert not reports["kl_k3"].all_passed
    assert "no function kl_k3 in exercises/ex02_grpo.py (deleted or renamed?" in str(
        reports["kl_k3"])


def test_an_error_is_located_in_the_learners_file_or_in_what_it_returned(tmp_path):
    from rlm_course.tools.checks import run_check

    path = _exercise_file(tmp_path, "ex02_grpo", lambda s: s + (
        "\n\ndef group_advantages(rewards, group_size, normalize_std=True, eps=1e-6):\n"
        "    return len(group_size)\n\n\ndef kl_k3(log_probs, ref_log_probs):\n"
        "    return None\n"))
    module = load_impl("02", "exercises", root=tmp_path)
    line = len(path.read_text().splitlines()) - 4  # the `return len(group_size)` line
    report = str(run_check("group_advantages", module.group_advantages))
    assert f"TypeError: object of type 'int' has no len() (at ex02_grpo.py:{line}: " \
           "return len(group_size))" in report
    report = str(run_check("kl_k3", module.kl_k3))
    assert "expected a tensor, got NoneType" in report
    assert "(in the check, on what the function returned: is it the right type?)" in report


def test_a_case_left_for_later_keeps_the_checks_that_passed():
    from rlm_course.rl.advantages import group_advantages
    from rlm_course.tools.checks import run_check

    def partial(rewards, group_size, normalize_std=True, eps=1e-6):
        if not normalize_std:
            raise NotImplementedError("Dr. GRPO later")
        return group_advantages(rewards, group_size, normalize_std, eps)

    report = run_check("group_advantages", partial)
    assert report.not_implemented is None and 0 < report.n_passed < len(report.results)
    assert "[FAIL] hand example without std (Dr. GRPO): NotImplementedError: Dr. GRPO later" in \
        str(report)


def test_a_file_that_loops_when_imported_is_reported_within_the_limit(tmp_path, monkeypatch):
    import time

    monkeypatch.setattr(grading, "CHECK_SECONDS", 0.3)
    _exercise_file(tmp_path, "ex02_grpo", lambda s: s + "\nwhile True:\n    pass\n")
    start = time.perf_counter()
    reports = grading.grade("02", root=tmp_path)
    assert time.perf_counter() - start < 5
    assert [r.all_passed for r in reports] == [False] * 3
    assert "did not finish within 0.3 s (code left at the top level" in str(reports[0])


def test_grading_every_chapter_goes_on_past_a_broken_file(tmp_path):
    _exercise_file(tmp_path, "ex02_grpo", lambda s: s.replace("def kl_k3(", "def kl_k3(:", 1))
    reports = grading.grade(None, root=tmp_path)
    names = [name for c in exercisegen.EXERCISES for _, name in c.functions]
    assert [r.name for r in reports] == names  # every exercise has its line
    by_name = {r.name: str(r) for r in reports}
    assert "could not import" in by_name["kl_k3"] and "SyntaxError" in by_name["kl_k3"]
    assert "is missing" in by_name["ring_all_reduce"]  # the other files are not in tmp_path


@pytest.mark.multiprocess
def test_an_endless_loop_on_real_processes_is_stopped_at_the_limit(tmp_path, monkeypatch):
    import time

    from rlm_course.tools import checks
    from rlm_course.tools.checks import run_check

    monkeypatch.setattr(checks, "CHECK_SECONDS", 3)
    path = _exercise_file(tmp_path, "ex11_distributed", lambda s: s.replace(
        "def ring_all_reduce(", "def ring_all_reduce(*args, **kwargs):\n    while True:\n"
        "        pass\n\n\ndef _unused(", 1))
    module = grading.load_impl("11", "exercises", root=tmp_path)
    assert module.__file__ == str(path)
    start = time.perf_counter()
    report = run_check("ring_all_reduce", module.ring_all_reduce)
    assert time.perf_counter() - start < 40  # two launches, each stopped at 3 s
    assert not report.all_passed and "did not finish within 3 s (an endless loop?)" in str(report)


def test_regenerating_keeps_edited_exercises_unless_forced(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(exercisegen, "repo_root", lambda: tmp_path)
    assert exercisegen.main() == 0
    mine = tmp_path / "exercises" / "ex02_grpo.py"
    mine.write_text(mine.read_text() + "\n# my work\n")
    assert exercisegen.main(check=True) == 1
    assert "grade your work" in capsys.readouterr().err
    assert exercisegen.main() == 1
    assert "# my work" in mine.read_text()
    assert "may hold your work" in capsys.readouterr().err
    assert exercisegen.main(force=True) == 0
    assert "# my work" not in mine.read_text()
    assert "# my work" in (tmp_path / "exercises" / "ex02_grpo.py.bak").read_text()
    assert "saved your version of exercises/ex02_grpo.py as exercises/ex02_grpo.py.bak" in \
        capsys.readouterr().out
    # a second --force keeps the first copy (it was overwritten by the second edit)
    mine.write_text(mine.read_text() + "\n# my second try\n")
    assert exercisegen.main(force=True) == 0
    assert "# my work" in (tmp_path / "exercises" / "ex02_grpo.py.bak").read_text()
    assert "# my second try" in (tmp_path / "exercises" / "ex02_grpo.py.bak2").read_text()
    assert "as exercises/ex02_grpo.py.bak2" in capsys.readouterr().out
    notebook = tmp_path / "exercises" / "ex04_grpo_family.ipynb"  # a run's outputs, notes
    notebook.write_text(notebook.read_text().replace('"outputs": []', '"outputs": ["mine"]', 1))
    assert exercisegen.main() == 1
    assert '"mine"' in notebook.read_text()
    assert "kept exercises/ex04_grpo_family.ipynb" in capsys.readouterr().err


def test_the_check_says_when_everything_is_up_to_date(capsys):
    assert exercisegen.main(check=True) == 0
    count = len(exercisegen.expected_files())
    assert capsys.readouterr().out == (f"exercises and solutions up to date: {count} generated "
                                       "files match the package.\n")


def test_equal_rewards_must_get_zeros_of_the_rewards_shape():
    import torch

    from rlm_course.tools.checks import run_check

    report = run_check("group_advantages", lambda rewards, group_size, **kw: torch.zeros(
        len(rewards) // group_size, group_size))
    assert "[FAIL] a group of equal rewards gets exactly 0: shape (1, 8), expected (8,)" in \
        str(report)
