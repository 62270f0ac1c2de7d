"""The rollout/trainer mismatch lab (rlm_course.systems.mismatch): the KL by length by hand, a
measurement on a small model, and bad input."""

import math

import pytest
import torch

from rlm_course.lm.model import TinyGPT
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.sft import default_model_config
from rlm_course.systems.mismatch import kl_by_length, learning_runs, measure_mismatch
from rlm_course.tasks import get_task


def test_kl_by_length_by_hand():
    log_ratio = torch.tensor([[-0.1, -0.1, 0.0, 0.0], [-0.2, 0.0, 0.0, 0.0], [0.1, -0.3, -0.2, 0.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    got = kl_by_length(log_ratio, mask, (0, 2, 4))
    k3 = lambda x: math.exp(x) - 1 - x  # noqa: E731 (per token, summed over a response)
    # lengths 2, 1, 3: bin [0, 2) holds the second response, bin [2, 4) the first and third
    first, second, third = 2 * k3(-0.1), k3(-0.2), k3(0.1) + k3(-0.3) + k3(-0.2)
    assert [b["lengths"] for b in got] == [[0, 2], [2, 4]]
    assert got[0]["responses"] == 1 and got[0]["kl"] == pytest.approx(second)
    assert got[1]["kl"] == pytest.approx((first + third) / 2)
    assert got[1]["kl_per_token"] == pytest.approx((first + third) / 5)


def test_a_measurement_on_a_small_model():
    task, tok = get_task("addition", digits=2), CharTokenizer()
    torch.manual_seed(0)
    model = TinyGPT(default_model_config(tok, task))
    out = measure_mismatch(model, task, tok, prompts=4, group_size=2, repeats=1)
    assert list(out) == ["fp32", "bf16", "fp8"]
    assert out["fp32"]["stats"]["log_ratio_abs_max"] < 1e-4
    assert out["fp8"]["stats"]["behaviour_kl"] > 0 and out["bf16"]["stats"]["behaviour_kl"] > 0
    for m in out.values():
        assert sum(m["histogram"]["counts"]) == m["tokens"]
        assert sum(b["responses"] for b in m["kl_by_length"]) == 8
    assert out["fp32"]["speed_vs_fp32"] == 1.0
    with pytest.raises(ValueError, match="fp4"):
        measure_mismatch(model, task, tok, precisions=("fp4",))
    with pytest.raises(ValueError, match="prompts=0"):
        measure_mismatch(model, task, tok, prompts=0)


def test_learning_runs_refuse_bad_settings_before_running():
    with pytest.raises(ValueError, match="'fp4'"):
        learning_runs([0], 1, runs=(("fp4", "none"),))
    with pytest.raises(ValueError, match="'vtrace'"):
        learning_runs([0], 1, runs=(("fp8", "vtrace"),))
    with pytest.raises(ValueError, match="seed"):
        learning_runs([], 1)
