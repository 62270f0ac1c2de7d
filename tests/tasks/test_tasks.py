import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm_course.tasks import get_task
from rlm_course.tasks.base import Problem, well_formed_number
from rlm_course.tasks.countdown import ExpressionError, parse_expression
from rlm_course.tasks.eval_sets import EVAL_SIZE, eval_set_path, load_eval_set, make_eval_set

ADD = get_task("addition", digits=3)
CD = get_task("countdown")
P = Problem(prompt="3,5,2>16:", answer="(3+5)*2", numbers=(3, 5, 2), target=16)


@pytest.mark.parametrize("response,fmt,correct", [
    ("132", True, True), ("131", True, False), ("0132", False, False), ("", False, False),
    ("13 2", False, False), ("132+", False, False), ("12345", False, False), ("-132", False, False),
    ("１３２", False, False),  # full-width digits are not ASCII
])
def test_addition_verifier(response, fmt, correct):
    v = ADD.verify(Problem("47+85=", "132"), response)
    assert (v.format_ok, v.correct) == (fmt, correct)
    assert v.reward == pytest.approx(0.1 * fmt + 0.9 * correct)


@pytest.mark.parametrize("response,fmt,correct,reason", [
    ("(3+5)*2", True, True, ""),
    ("2*(5+3)", True, True, ""),
    ("(3+5)*2)", False, False, "trailing text"),
    ("(3+5)*2 ", False, False, "trailing text"),
    ("(3+5)*2=16", False, False, "trailing text"),
    ("3+5+2", True, False, "result 10 != target 16"),
    # one rule: only the given numbers, each at most as often as given, checked before any
    # evaluation; otherwise the response is not well-formed (no format credit)
    ("(3+5)*3", False, False, "used more often"),
    ("(3+5)*2*1", False, False, "not among the numbers"),
    ("(7+1)*2", False, False, "not among the numbers"),
    ("16", False, False, "not among"),
    ("3/0+6", False, False, "not among the numbers"),
    ("(3+5)/(2-2)", False, False, "used more often"),
    ("5/2", True, False, "non-integer"),
    ("03+5*2", False, False, "leading zero"),
    ("(3+5)*02", False, False, "leading zero"),
    ("99999*9", False, False, "more than 4 digits"),
    ("((3+5)*2", False, False, "expected ')'"),
    ("3++5", False, False, "expected a number"),
    ("", False, False, "empty"),
    ("-3+5", False, False, "expected a number"),
    # 12 characters is the budget's longest answer (max_response_len 13 with <eos>); 13 without
    # an <eos> can only be a response cut off at the length limit: right value, no reward
    ("((3+5))*(2)", True, True, ""),
    ("(((3+5)))*(2)", False, False, "cut off at the length limit"),
])
def test_countdown_verifier_edge_cases(response, fmt, correct, reason):
    v = CD.verify(P, response)
    assert (v.format_ok, v.correct) == (fmt, correct)
    assert reason in v.reason


def test_countdown_each_number_at_most_once_with_repeats():
    p = Problem(prompt="4,4,2>2:", answer="4/4*2", numbers=(4, 4, 2), target=2)
    assert CD.verify(p, "4/4*2").correct
    assert CD.verify(p, "2").correct  # not every number has to be used
    assert not CD.verify(p, "4/4*2/2*2").correct
    v = CD.verify(p, "2/(4-4)")  # given numbers, well-formed, but no value: wrong, format kept
    assert (v.format_ok, v.correct) == (True, False) and "division by zero" in v.reason


@pytest.mark.parametrize("text,ok", [("0", True), ("7", True), ("42", True), ("042", False),
                                     ("00", False), ("", False), ("4 2", False), ("-4", False),
                                     ("４２", False)])
def test_one_rule_for_numbers_in_both_tasks(text, ok):
    assert well_formed_number(text) == ok
    problem = Problem(prompt="20+22=", answer="42")
    assert ADD.verify(problem, text).format_ok == ok
    if text.isascii() and text.isdigit():  # countdown: the same rule for its literals
        n = int(text)
        given = Problem(prompt=f"{n},1>{n}:", answer=f"{n}*1", numbers=(n, 1), target=n)
        assert CD.verify(given, f"{text}*1").format_ok == ok


@pytest.mark.parametrize("task,message", [
    (get_task("addition", digits=1), "at most 100 distinct problems"),
    (get_task("countdown", n_numbers=2, max_number=2, max_target=1), "at most 4 distinct problems"),
])
def test_a_problem_space_smaller_than_the_held_out_set_is_a_clear_error(task, message):
    with pytest.raises(ValueError, match=message):
        make_eval_set(task)


def test_a_draw_that_can_find_nothing_new_stops_with_a_clear_error():
    task = get_task("addition", digits=1)
    everything = {f"{a}+{b}=" for a in range(10) for b in range(10)}
    with pytest.raises(ValueError, match="draws in a row found no new problem.*--digits"):
        task.problems(5, seed=0, exclude=everything)
    with pytest.raises(ValueError, match="distinct problems"):
        task.problems(101, seed=0, distinct=True)


def test_parser_precedence_and_huge_values():
    assert parse_expression("2+3*4")[0] == 14
    assert parse_expression("(2+3)*4")[0] == 20
    assert parse_expression("8-3-2")[0] == 3  # left-associative
    assert parse_expression("12/4/3") == (1, [12, 4, 3])
    with pytest.raises(ExpressionError, match="larger than"):
        parse_expression("9999*9999*9999")
    with pytest.raises(ExpressionError, match="longer than 64"):
        parse_expression("1+" * 40 + "1")


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10_000))
def test_demonstrations_are_correct(seed):
    for task in (ADD, CD, get_task("countdown", n_numbers=4, max_number=20),
                 get_task("addition", digits=5)):
        (p,) = task.problems(1, seed)
        assert task.verify(p, task.demonstration(p)).correct
        assert len(task.demonstration(p)) + 1 <= task.max_response_len


def test_generators_are_seeded_and_exclude():
    a = ADD.problems(20, seed=7)
    assert a == ADD.problems(20, seed=7) and a != ADD.problems(20, seed=8)
    b = ADD.problems(20, seed=7, exclude={a[0].prompt})
    assert a[0].prompt not in {p.prompt for p in b}


@pytest.mark.parametrize("task", [ADD, CD])
def test_committed_eval_sets_are_the_fixed_ones(task):
    path = eval_set_path(task)
    assert path.exists(), f"missing {path}; run python -m rlm_course make-eval-sets"
    committed = load_eval_set(task)
    assert committed == make_eval_set(task)
    assert len(committed) == EVAL_SIZE == len({p.prompt for p in committed})
    assert all(task.verify(p, p.answer).correct for p in committed)


def test_corrupt_eval_set_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("RLM_COURSE_DATA", str(tmp_path))
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / f"{ADD.key}.jsonl").write_text(json.dumps({"oops": 1}) + "\n")
    with pytest.raises(ValueError, match="make-eval-sets"):
        load_eval_set(ADD)


def test_an_eval_set_of_wrong_or_missing_problems_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("RLM_COURSE_DATA", str(tmp_path))
    (tmp_path / "eval").mkdir()
    countdown = get_task("countdown")
    good = make_eval_set(countdown)
    path = eval_set_path(countdown)
    # a line without its numbers loaded, and every response, the right one too, scored 0
    lines = [json.dumps({"prompt": good[0].prompt, "answer": good[0].answer})]
    lines += [p.to_json() for p in good[1:]]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r":1: its own answer does not verify for countdown"):
        load_eval_set(countdown)
    path.write_text(json.dumps({"prompt": 5, "answer": 7}) + "\n")
    with pytest.raises(ValueError, match=r":1: not a problem of countdown"):
        load_eval_set(countdown)
    path.write_text("".join(p.to_json() + "\n" for p in good[:150]))  # a cut file
    with pytest.raises(ValueError, match=f"150 problems, not the {EVAL_SIZE} of a held-out set"):
        load_eval_set(countdown)
    path.write_text("".join(p.to_json() + "\n" for p in good))
    assert load_eval_set(countdown) == good


def test_task_settings_and_exclusions_are_checked():
    import numpy as np

    right = Problem("1+1=", "2")
    assert get_task("addition", format_weight=0.2).verify(right, "3").reward == 0.2
    # a reward outside [0, 1]: 2.0 paid a wrong answer 2, NaN a right one NaN
    for weight in (2.0, -1, float("nan")):
        with pytest.raises(ValueError, match=f"format_weight={weight!r} must be in \\[0, 1\\]"):
            get_task("addition", format_weight=weight)
    for kw in ({"format_weight": True}, {"format_weight": "0.1"}, {"digits": True}):
        with pytest.raises(ValueError, match=f"{next(iter(kw))}={next(iter(kw.values()))!r} "
                                             "must be a number"):
            get_task("addition", **kw)
    with pytest.raises(ValueError, match="decay='0.5' must be a number"):
        get_task("scratchpad", decay="0.5")
    assert get_task("addition", digits=np.int64(2)).key == "addition-2"
    task = get_task("addition", digits=1)
    held_out = task.problems(50, 5, distinct=True)
    # a list of Problems, or one prompt string, excluded nothing (49 of 50 held-out prompts
    # came back in 500 draws)
    for exclude in (held_out, "1+1="):
        with pytest.raises(ValueError, match="exclude must be a collection of prompt strings"):
            task.problems(10, 0, exclude=exclude)
    prompts = {p.prompt for p in held_out}
    assert not prompts & {p.prompt for p in task.problems(200, 0, exclude=prompts)}


@pytest.mark.parametrize("name,kw,match", [("chess", {}, "unknown task"),
                                           ("addition", {"digits": 0}, "digits"),
                                           ("addition", {"colour": 1}, "bad settings"),
                                           ("countdown", {"n_numbers": 9}, "n_numbers")])
def test_bad_task_raises(name, kw, match):
    with pytest.raises(ValueError, match=match):
        get_task(name, **kw)
