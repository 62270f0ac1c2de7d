"""KL estimators (rlm_course.rl.kl) against hand-computed values."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm_course.rl import kl


def test_kl_estimators_hand_example():
    lp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))  # log rho = -ln 2
    ln2 = math.log(2)
    assert kl.kl_estimate(lp, ref, "k1").item() == pytest.approx(ln2)
    assert kl.kl_estimate(lp, ref, "k2").item() == pytest.approx(0.5 * ln2**2)
    assert kl.kl_estimate(lp, ref, "k3").item() == pytest.approx(0.5 + ln2 - 1)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl.kl_estimate(lp, ref, "k4")


@settings(max_examples=200, deadline=None)
@given(st.floats(-30, 30, allow_nan=False, width=32), st.floats(-30, 30, allow_nan=False, width=32))
def test_k3_is_non_negative_exactly_zero_when_equal_and_accurate(lp, ref):
    a, b = torch.tensor([lp]), torch.tensor([ref])
    value = kl.kl_k3(a, b).item()
    assert value >= 0.0
    assert kl.kl_k3(a, a).item() == 0.0
    # against float64 (exact enough: x is a float32 difference, and for small x the series)
    x = (b.double() - a.double()).item()
    exact = math.expm1(x) - x if abs(x) >= 1e-3 else x * x / 2 + x ** 3 / 6 + x ** 4 / 24
    assert value == pytest.approx(exact, rel=1e-5, abs=1e-30)


def test_k3_hand_example_for_nearly_equal_policies():
    # log rho = -1e-6: exp(x) - x - 1 = 5.0e-13 (written naively in float32 it was -5.96e-8)
    assert kl.kl_k3(torch.tensor([0.0]), torch.tensor([-1e-6])).item() == pytest.approx(5.0e-13,
                                                                                      rel=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_k3_is_exact_for_a_large_negative_log_ratio_and_keeps_its_gradient(dtype):
    # x = log rho = -100: k3 = e^-100 + 100 - 1 = 99 (the two-sided clamp made it 86.7, or 9.1
    # in float16, with gradient 0); d k3 / d log_probs = 1 - e^x = 1
    # x = -1e20 (float32; its square overflows): k3 = 1e20 - 1, the gradient still 1 (the series
    # branch, evaluated everywhere, made it NaN)
    cases = ((-100.0, 99.0), (-15.0, 14.0)) + (((-1e20, 1e20),) if dtype == torch.float32 else ())
    for x, want in cases:
        lp = torch.zeros(1, 1, dtype=dtype, requires_grad=True)
        value = kl.kl_k3(lp, torch.full((1, 1), x, dtype=dtype))
        assert value.item() == pytest.approx(want, rel=1e-2)
        value.sum().backward()
        assert lp.grad.item() == pytest.approx(1.0, rel=1e-3)
    # an impossible token under the reference: a finite estimate, never NaN
    inf = kl.kl_k3(torch.zeros(1), torch.tensor([-math.inf]))
    assert torch.isfinite(inf).all() and inf.item() > 1e37


def test_the_estimators_refuse_log_probs_they_would_broadcast_or_truncate():
    for call, message in (
            (lambda: kl.kl_estimate(torch.zeros(4, 1), torch.zeros(4), "k3"),
             r"kl_estimate: log_probs \(4, 1\) and ref_log_probs \(4,\) must have one shape"),
            (lambda: kl.kl_k3(torch.zeros(2, 3), torch.zeros(2, 1)),
             r"kl_k3: log_probs \(2, 3\) and ref_log_probs \(2, 1\)"),
            (lambda: kl.kl_k3(torch.tensor([[-1, -2]]), torch.tensor([[-2, -1]])),
             "kl_k3: log_probs of dtype torch.int64; give floats"),
            (lambda: kl.kl_estimate(torch.zeros(2), torch.zeros(2).double(), "k1"),
             "kl_estimate: log_probs torch.float32, ref_log_probs torch.float64")):
        with pytest.raises(ValueError, match=message):
            call()
