"""KL estimators (rlm_course.rl.kl) against hand-computed values."""

import math

import pytest
import torch

from rlm_course.rl import kl


def test_kl_estimators_hand_example():
    lp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))  # log rho = -ln 2
    ln2 = math.log(2)
    assert kl.kl_estimate(lp, ref, "k1").item() == pytest.approx(ln2)
    assert kl.kl_estimate(lp, ref, "k2").item() == pytest.approx(0.5 * ln2**2)
    assert kl.kl_estimate(lp, ref, "k3").item() == pytest.approx(0.5 + ln2 - 1)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl.kl_estimate(lp, ref, "k4")
