"""The GRPO family's parts against hand-computed examples and naive reference loops."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm_course import objectives as ob
from rlm_course.rl import clipped_surrogate, group_advantages, sequence_mean


def test_kl_estimators_hand_example():
    lp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))  # log rho = -ln 2
    ln2 = math.log(2)
    assert ob.kl_estimate(lp, ref, "k1").item() == pytest.approx(ln2)
    assert ob.kl_estimate(lp, ref, "k2").item() == pytest.approx(0.5 * ln2**2)
    assert ob.kl_estimate(lp, ref, "k3").item() == pytest.approx(0.5 + ln2 - 1)
    with pytest.raises(ValueError, match="unknown KL estimator"):
        ob.kl_estimate(lp, ref, "k4")


def test_rloo_hand_example_and_identity():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    # b_0 = (0 + 0 + 1)/3, so A_0 = 1 - 1/3
    assert torch.allclose(ob.rloo_advantages(r, 4), torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))
    x = torch.rand(12, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(ob.rloo_advantages(x, 3),
                          3 / 2 * group_advantages(x, 3, normalize_std=False), atol=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        ob.rloo_advantages(r, 1)


def test_reinforce_pp_returns_to_go_normalised_over_the_batch_tokens():
    # two responses of 2 and 1 tokens; reward 1 on the last token of the first, KL -0.5 on token 0
    token_rewards = torch.tensor([[-0.5, 1.0], [0.0, 0.0]])
    mask = torch.tensor([[True, True], [True, False]])
    returns = torch.tensor([0.5, 1.0, 0.0])  # G_t = sum of rewards from t on, masked tokens only
    expected = (returns - returns.mean()) / (returns.var(unbiased=False).sqrt() + 1e-6)
    a = ob.reinforce_pp_advantages(token_rewards, mask)
    assert torch.allclose(a[mask], expected, atol=1e-5)
    assert a[1, 1] == 0  # outside the mask


def test_reinforce_pp_discounts_with_gamma():
    token_rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    returns = torch.tensor([0.25, 0.5, 1.0, 0.5, 0.0])  # gamma 0.5: 1 * 0.5^2, 1 * 0.5, 1; 0.5, 0
    expected = (returns - returns.mean()) / (returns.var(unbiased=False).sqrt() + 1e-6)
    assert torch.allclose(ob.reinforce_pp_advantages(token_rewards, mask, 0.5)[mask], expected,
                          atol=1e-5)


def test_masked_whiten_hand_example():
    x = torch.tensor([[1.0, 3.0], [5.0, 100.0]])
    mask = torch.tensor([[True, True], [True, False]])
    w = ob.masked_whiten(x, mask)  # over 1, 3, 5: mean 3, population std sqrt(8/3)
    assert torch.allclose(w[mask], torch.tensor([-2.0, 0.0, 2.0]) / math.sqrt(8 / 3), atol=1e-5)
    assert w[1, 1] == 0


def naive_gae(rewards, values, lengths, gamma, lam):
    out = torch.zeros_like(values)
    for i, n in enumerate(lengths):
        for t in range(n):
            total = 0.0
            for k in range(t, n):
                v_next = values[i, k + 1] if k + 1 < n else 0.0
                delta = rewards[i, k] + gamma * v_next - values[i, k]
                total += (gamma * lam) ** (k - t) * delta
            out[i, t] = total
    return out


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 1000), st.floats(0, 1), st.floats(0, 1))
def test_gae_equals_the_naive_sum(seed, gamma, lam):
    g = torch.Generator().manual_seed(seed)
    rewards, values = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    lengths = [5, 3, 1]
    mask = torch.tensor([[t < n for t in range(5)] for n in lengths])
    adv, ret = ob.gae(rewards, values, mask, gamma, lam)
    expected = naive_gae(rewards, values, lengths, gamma, lam)
    assert torch.allclose(adv, expected, atol=1e-5)
    assert torch.allclose(ret, (expected + values) * mask, atol=1e-5)


def test_gae_hand_example():
    # one 2-token response, terminal reward 1, values 0.5 then 0.8, gamma 1, lambda 0.5
    adv, ret = ob.gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.8]]),
                      torch.ones(1, 2, dtype=torch.bool), gamma=1.0, lam=0.5)
    # delta_1 = 1 - 0.8 = 0.2; delta_0 = 0 + 0.8 - 0.5 = 0.3; A_0 = 0.3 + 0.5 * 0.2 = 0.4
    assert torch.allclose(adv, torch.tensor([[0.4, 0.2]]))
    assert torch.allclose(ret, torch.tensor([[0.9, 1.0]]))
    with pytest.raises(ValueError, match="gamma"):
        ob.gae(adv, adv, torch.ones(1, 2, dtype=torch.bool), gamma=1.5)


def test_sequence_ratio_is_the_geometric_mean_of_token_ratios():
    lp = torch.log(torch.tensor([[0.5, 0.5, 0.9], [0.2, 0.4, 0.4]]))
    old = torch.log(torch.tensor([[0.25, 0.5, 0.1], [0.1, 0.1, 0.4]]))
    mask = torch.tensor([[True, True, False], [True, True, True]])
    expected = torch.tensor([math.sqrt(2 * 1), (2 * 4 * 1) ** (1 / 3)])
    assert torch.allclose(ob.sequence_ratio(lp, old, mask), expected, atol=1e-5)


def test_clipped_objective_decoupled_bounds():
    ratio = torch.tensor([[0.7, 1.25, 1.3]])
    up = ob.clipped_objective(ratio, torch.tensor([1.0]), 0.2, 0.28)
    assert torch.allclose(up, torch.tensor([[-0.7, -1.25, -1.28]]))
    down = ob.clipped_objective(ratio, torch.tensor([-1.0]), 0.2, 0.28)
    assert torch.allclose(down, torch.tensor([[0.8, 1.25, 1.3]]))
    # symmetric bounds on a token ratio reproduce rl.clipped_surrogate
    lp, old = torch.randn(2, 4), torch.randn(2, 4)
    adv = torch.tensor([0.5, -2.0])
    assert torch.allclose(ob.clipped_objective(torch.exp(lp - old), adv, 0.2),
                          clipped_surrogate(lp, old, adv, 0.2))
    # a sequence-level ratio (GSPO) takes one advantage per sequence
    assert ob.clipped_objective(torch.tensor([1.5, 0.5]), adv, 0.2).shape == (2,)
    with pytest.raises(ValueError, match="low <= high"):
        ob.clipped_objective(ratio, torch.tensor([1.0]), 0.28, 0.2)


def test_aggregations_hand_example():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[True, True, True], [True, False, False]])
    assert ob.aggregate_loss(x, m, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert ob.aggregate_loss(x, m, "token-mean").item() == pytest.approx(10 / 4)
    assert ob.aggregate_loss(x, m, "seq-mean-token-sum-norm", 5).item() == pytest.approx(10 / 10)
    assert ob.aggregate_loss(x, m, "seq-mean-token-mean") == sequence_mean(x, m)
    with pytest.raises(ValueError, match="constant_length"):
        ob.aggregate_loss(x, m, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        ob.aggregate_loss(x, m, "mean")


def test_overlong_penalty():
    lengths = torch.tensor([10, 16, 18, 20, 25])
    # max 20, cache 4: free up to 16, then -(L-16)/4, -1 at 20 and beyond
    assert torch.allclose(ob.overlong_penalty(lengths, 20, 4),
                          torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    with pytest.raises(ValueError, match="cache_length"):
        ob.overlong_penalty(lengths, 20, 0)


def test_dynamic_sampling_keeps_groups_with_signal():
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.1, 1.0])
    assert ob.groups_with_signal(r, 2).tolist() == [False, True, False, True]
    kept = ob.groups_with_signal(r, 2)
    adv = group_advantages(r, 2).view(4, 2)
    assert (adv[~kept] == 0).all()  # what dynamic sampling drops carried no gradient anyway


@pytest.mark.parametrize("name", ["gae", "rloo_advantages", "sequence_ratio", "aggregate_loss"])
def test_package_functions_pass_their_exercise_checks(name):
    from rlm_course.checks import run_check

    report = run_check(name, getattr(ob, name))
    assert report.all_passed, str(report)
