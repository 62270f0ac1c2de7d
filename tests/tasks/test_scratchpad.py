"""The long-tailed reasoning task of chapters 12-13: its traces, its verifier on adversarial
responses, its held-out set, its length distribution and the model it needs."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.sft import default_model_config
from rlm_course.tasks import get_task
from rlm_course.tasks.base import Problem
from rlm_course.tasks.eval_sets import EVAL_SIZE, eval_set_path, load_eval_set, make_eval_set
from rlm_course.tasks.scratchpad import column_steps, response_length_stats

TASK = get_task("scratchpad")
P = Problem(prompt="347+285=", answer="632")
GOOD = "7+5=12>2,4+8+1=13>32,3+2+1=6>632"


def test_trace_of_a_hand_example():
    assert ",".join(column_steps("347", "285")) == GOOD
    assert column_steps("67767", "25315")[2] == "7+3=10>082"  # low digits may start with 0
    assert TASK.verify(Problem("67767+25315=", "93082"),
                       ",".join(column_steps("67767", "25315"))).correct
    assert ",".join(column_steps("99", "99")) == "9+9=18>8,9+9+1=19>198"  # last carry leads
    assert column_steps("0", "0") == ["0+0=0>0"]
    with pytest.raises(ValueError, match="equal length"):
        column_steps("12", "3")


@pytest.mark.parametrize("response,fmt,correct,reason", [
    (GOOD, True, True, ""),
    ("632", False, False, "1 step(s) for 3"),                      # the answer without the work
    ("7+5=12>2,4+8+1=13>32", False, False, "2 step(s) for 3"),      # a column missing
    (GOOD + ",0+0=0>0632", False, False, "4 step(s) for 3"),        # an extra column
    ("7+5=12>2,4+8+1=13>32,3+2+1=6>631", True, False, "step 3"),    # wrong final answer
    ("7+5=12>2,4+8=12>22,3+2+1=6>622", True, False, "step 2"),      # a dropped carry
    ("5+7=12>2,8+4+1=13>32,2+3+1=6>632", True, False, "step 1"),    # right sums, wrong digits
    ("7+5=11>1,4+8+1=13>31,3+2+1=6>632", True, False, "step 1"),    # wrong steps, right answer
    ("7+5=12>2,4+8+1=13>32,3+2+1=6>0632", False, False, "malformed"),  # a leading zero
    ("7+5=012>2,4+8+1=13>32,3+2+1=6>632", False, False, "malformed"),
    ("7+5=12>2, 4+8+1=13>32,3+2+1=6>632", False, False, "not x+y"),  # a space
    ("7+5=12>2,4+8+1=13>32,3+2+1=6>632,", False, False, "4 step(s)"),  # trailing comma
    ("7+5=12>2,4+8+1=13>32,3+2+1=6>632=632", False, False, "not x+y"),
    ("7+5+0=12>2,4+8+1=13>32,3+2+1=6>632", False, False, "not x+y"),  # "+0" is not a carry
    ("7+5=12>2,4+8+1=13>32,3+2+1=6>６３２", False, False, "not x+y"),  # non-ASCII digits
    ("7+5=12>2,4+8+1=13>32,3+2+1=6><pad>632", False, False, "not x+y"),  # a sampled special
    ("", False, False, "empty"),
])
def test_verifier_on_adversarial_traces(response, fmt, correct, reason):
    v = TASK.verify(P, response)
    assert (v.format_ok, v.correct) == (fmt, correct), v.reason
    assert reason in v.reason
    assert v.reward == pytest.approx(0.1 * fmt + 0.9 * correct)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 10_000))
def test_demonstrations_are_correct_and_fit_the_budget(seed):
    (p,) = TASK.problems(1, seed)
    demo = TASK.demonstration(p)
    assert TASK.verify(p, demo).correct
    assert demo.split(">")[-1] == p.answer
    assert len(demo) + 1 <= TASK.max_response_len
    CharTokenizer().encode(p.prompt + demo)  # every character is in the vocabulary


def test_sizes_are_skewed_and_lengths_long_tailed():
    probs = TASK.size_probabilities()
    assert probs == sorted(probs, reverse=True) and sum(probs) == pytest.approx(1.0)
    assert probs[0] / probs[-1] == pytest.approx(2**5)
    problems = TASK.problems(16 * 50, seed=3)
    lengths = [len(TASK.demonstration(p)) + 1 for p in problems]
    ratios = []
    for i in range(0, len(lengths), 128 // 8):  # batches of 16 prompts (x 8 identical lengths)
        stats = response_length_stats(lengths[i:i + 16])
        ratios.append(stats["max_over_mean"])
    ratios.sort()
    assert ratios[len(ratios) // 2] > 2.5  # the longest is typically ~3x the mean
    assert max(lengths) > 5 * min(lengths)


def test_committed_held_out_set_is_the_fixed_one():
    path = eval_set_path(TASK)
    assert path.exists(), f"missing {path}; run python -m rlm_course make-eval-sets"
    committed = load_eval_set(TASK)
    assert committed == make_eval_set(TASK)
    assert len(committed) == EVAL_SIZE == len({p.prompt for p in committed})
    assert all(TASK.verify(p, TASK.demonstration(p)).correct for p in committed)


def test_the_task_gets_a_longer_context_and_other_tasks_keep_theirs():
    tok = CharTokenizer()
    assert default_model_config(tok, TASK).max_seq_len == 96
    assert default_model_config(tok, get_task("addition")) == default_model_config(tok)
    assert default_model_config(tok).max_seq_len == 32
    assert 1 + TASK.max_prompt_len + TASK.max_response_len <= 96


def test_committed_warm_start_is_weak_but_not_hopeless_and_reproducible():
    from rlm_course.rl.runs import default_sft_checkpoint

    note = json.loads(default_sft_checkpoint(TASK).with_suffix(".json").read_text())
    assert note["task"] == TASK.key
    assert note["command"].startswith("python -m rlm_course sft --task scratchpad --max-digits 6")
    assert 0.2 <= note["validation_accuracy"] < 0.5


@pytest.mark.parametrize("kw,match", [({"max_digits": 0}, "max_digits"),
                                      ({"max_digits": 9}, "max_digits"),
                                      ({"decay": 0}, "decay"), ({"decay": 1.5}, "decay")])
def test_bad_settings_are_clear_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        get_task("scratchpad", **kw)


def test_cli_names_the_task_settings():
    from rlm_course.arguments import task_from_args
    from rlm_course.cli import build_parser

    args = build_parser().parse_args(["sft", "--task", "scratchpad", "--max-digits", "4"])
    assert task_from_args(args).key == "scratchpad-4"
