"""Off-policy corrections (rlm_course.rl.off_policy): each correction's weights by hand, the
statistics of a mismatch, and the trainer sampling from a rounded engine."""

import math

import pytest
import torch

from rlm_course.algorithms import CORRECTIONS, preset
from rlm_course.rl.off_policy import behaviour_weights, mismatch_stats

# two responses: w = prox / behav per token is (0.5, 3, 1) and (4, 1.5, padding); the padding's
# 1/9 would pull the second response's product from 6 to 0.67, below the cap
PROX = torch.log(torch.tensor([[0.1, 0.6, 0.3], [0.8, 0.3, 0.1]]))
BEHAV = torch.log(torch.tensor([[0.2, 0.2, 0.3], [0.2, 0.2, 0.9]]))
MASK = torch.tensor([[True, True, True], [True, True, False]])


def weights(correction, cap=2.0):
    w, corrected = behaviour_weights(PROX, BEHAV, MASK, correction, cap)
    return [[round(x, 4) for x in row] for row in w.tolist()], corrected.tolist()


def test_each_correction_by_hand():
    assert weights("none") == ([[1, 1, 1], [1, 1, 0]], [[False] * 3, [False] * 3])
    assert weights("is")[0] == [[0.5, 3, 1], [4, 1.5, 0]]  # AReaL eq. 5: no cap
    assert weights("tis") == ([[0.5, 2, 1], [2, 1.5, 0]],  # truncated at 2
                              [[False, True, False], [True, False, False]])
    assert weights("mis") == ([[0.5, 0, 1], [0, 1.5, 0]],  # masked above 2 (AReaL's code)
                              [[False, True, False], [True, False, False]])
    # sequence weights: 0.5 x 3 x 1 = 1.5 and 4 x 1.5 = 6 (padding excluded)
    assert weights("seq-tis")[0] == [[1.5, 1.5, 1.5], [2, 2, 0]]
    assert weights("seq-mis")[0] == [[1.5, 1.5, 1.5], [0, 0, 0]]
    assert weights("seq-mis")[1] == [[False] * 3, [True, True, False]]
    assert weights("mis", cap=5.0)[0] == [[0.5, 3, 1], [4, 1.5, 0]]  # nothing above 5


def test_weights_carry_no_gradient_and_bad_settings_are_named():
    prox = PROX.clone().requires_grad_(True)
    for correction in CORRECTIONS:
        w, _ = behaviour_weights(prox, BEHAV, MASK, correction)
        assert not w.requires_grad
    with pytest.raises(ValueError, match="correction='vtrace'"):
        behaviour_weights(PROX, BEHAV, MASK, "vtrace")
    with pytest.raises(ValueError, match="cap=0.5"):
        behaviour_weights(PROX, BEHAV, MASK, "tis", 0.5)
    with pytest.raises(ValueError, match="correction_cap"):
        preset("grpo", correction="tis", correction_cap=float("nan"))
    with pytest.raises(ValueError, match=r"correction_cap=1000000000.0 must be a number from 1 to below"):
        preset("grpo", correction="tis", correction_cap=1e9)
    with pytest.raises(ValueError, match=r"cap=1000000000.0 must be a number from 1 to below exp\(20\)"):
        behaviour_weights(PROX, BEHAV, MASK, "mis", 1e9)
    with pytest.raises(ValueError, match="rollout_precision"):
        preset("grpo", rollout_precision="int3")


def test_mismatch_statistics_by_hand():
    s = mismatch_stats(PROX, BEHAV, MASK, cap=2.0)
    logs = [math.log(w) for w in (0.5, 3, 1, 4, 1.5)]
    assert s["behaviour_kl"] == pytest.approx(sum(math.expm1(x) - x for x in logs) / 5)
    k3 = [math.expm1(x) - x for x in logs]
    assert s["behaviour_kl_seq"] == pytest.approx((sum(k3[:3]) + sum(k3[3:])) / 2)
    assert s["weight_max"] == pytest.approx(4) and s["log_ratio_abs_max"] == pytest.approx(
        math.log(4))
    assert s["over_cap_tokens"] == pytest.approx(2 / 5)
    assert s["over_cap_responses"] == pytest.approx(1 / 2)
    same = mismatch_stats(PROX, PROX, MASK)
    assert same["behaviour_kl"] == 0 and same["weight_max"] == 1
    with pytest.raises(ValueError, match="one shape"):
        mismatch_stats(PROX, BEHAV[:1], MASK)


def test_a_correction_adds_the_proximal_scoring_pass():
    assert preset("grpo", minibatches=1).scoring_passes() == ("reference",)
    assert preset("grpo", minibatches=1, correction="tis").scoring_passes() == (
        "policy", "reference")
    assert "correction_cap" in preset("grpo").unused(["correction_cap"])


def test_an_overflowing_sequence_weight_is_masked_not_nan():
    # 30 tokens of log w = 4: W = e^120 overflows float32; seq-mis must mask the response, and
    # the padding column must stay 0, not inf * 0 = nan
    prox = torch.full((1, 31), 4.0)
    behaviour = torch.zeros(1, 31)
    mask = torch.ones(1, 31, dtype=torch.bool)
    mask[0, -1] = False
    weights, corrected = behaviour_weights(prox, behaviour, mask, "seq-mis")
    assert torch.equal(weights, torch.zeros(1, 31)) and corrected[0, :30].all()
    truncated, _ = behaviour_weights(prox, behaviour, mask, "seq-tis")
    assert truncated[0, :30].eq(2.0).all() and truncated[0, 30] == 0


def test_a_sequence_ratio_takes_only_sequence_corrections():
    with pytest.raises(ValueError, match="seq-tis or seq-mis"):
        preset("gspo", correction="mis")
    assert preset("gspo", correction="seq-mis").correction == "seq-mis"


def test_a_rounded_engine_adds_the_proximal_scoring_pass():
    assert "policy" in preset("grpo", minibatches=1, rollout_precision="bf16").scoring_passes()


def test_bad_shapes_and_non_finite_log_probs_are_refused():
    for args in ((PROX, BEHAV[:1], MASK), (PROX[None], BEHAV[None], MASK[None]),
                 (PROX[0], BEHAV[0], MASK[0])):  # broadcast, 3-D, 1-D: each would be wrong
        with pytest.raises(ValueError, match="one shape"):
            behaviour_weights(*args, "seq-tis")
        with pytest.raises(ValueError, match="one shape"):
            mismatch_stats(*args)
    nan = PROX.clone()
    nan[0, 0] = float("nan")
    for correction in ("mis", "tis", "seq-tis"):  # NaN > cap is False: MIS would keep it unseen
        with pytest.raises(ValueError, match="1 log-probs of real response tokens"):
            behaviour_weights(nan, BEHAV, MASK, correction)
    padded = PROX.clone()
    padded[1, 2] = float("nan")  # on padding: ignored
    assert behaviour_weights(padded, BEHAV, MASK, "tis")[0][1, 2] == 0
    with pytest.raises(ValueError, match="cap=-1"):
        mismatch_stats(PROX, BEHAV, MASK, cap=-1)


def test_an_underflowed_behaviour_probability_gives_a_finite_weight():
    # a token the engine gave probability e^-100 and the trainer e^-1: log w = 99, past float32's
    # exp range; the weight is clamped at exp(20) as the policy ratio is, never inf
    prox, behav = torch.tensor([[-1.0, -0.5]]), torch.tensor([[-100.0, -0.5]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    for correction in ("is", "seq-tis", "seq-mis", "tis", "mis"):
        w, above = behaviour_weights(prox, behav, mask, correction, cap=2.0)
        assert torch.isfinite(w).all(), correction
    w, _ = behaviour_weights(prox, behav, mask, "is")
    assert w.tolist() == [[pytest.approx(math.exp(20.0), rel=1e-6), 1.0]]
    w, above = behaviour_weights(prox, behav, mask, "mis", cap=2.0)
    assert w.tolist() == [[0.0, 1.0]] and above.tolist() == [[True, False]]
    w, _ = behaviour_weights(prox, behav, mask, "seq-tis", cap=3.0)
    assert w.tolist() == [[3.0, 3.0]]
