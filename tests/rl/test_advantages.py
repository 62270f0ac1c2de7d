"""Advantage estimators (rlm_course.rl.advantages) against hand-computed examples and naive loops."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm_course.rl import advantages, masked


def test_group_advantages_hand_example():
    r = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.1, 0.1, 0.1, 0.1])
    a = advantages.group_advantages(r, 4)
    std = math.sqrt(0.75 / 3)  # unbiased std of [0, 1, 1, 1]
    assert torch.allclose(a[:4], torch.tensor([-0.75, 0.25, 0.25, 0.25]) / std, atol=1e-4)
    assert torch.equal(a[4:], torch.zeros(4))


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="at least 2"):
        advantages.group_advantages(torch.ones(4), 1)
    with pytest.raises(ValueError, match="do not split"):
        advantages.group_advantages(torch.ones(5), 2)
    # a NaN reward made its whole group's advantages NaN, and the run failed later as a
    # divergence; integer and per-token rewards failed inside torch
    with pytest.raises(ValueError, match="1 of 4 rewards are not finite"):
        advantages.group_advantages(torch.tensor([1.0, math.nan, 0.0, 1.0]), 2)
    with pytest.raises(ValueError, match="rloo_advantages: 1 of 2 rewards are not finite"):
        advantages.rloo_advantages(torch.tensor([1.0, math.inf]), 2)
    with pytest.raises(ValueError, match="dtype torch.int64; give floats"):
        advantages.group_advantages(torch.tensor([1, 0, 1, 1]), 2)
    with pytest.raises(ValueError, match=r"rewards of shape \(4, 3\); give one reward per"):
        advantages.group_advantages(torch.arange(12.0).view(4, 3), 2)


def test_rloo_hand_example_and_identity():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    # b_0 = (0 + 0 + 1)/3, so A_0 = 1 - 1/3
    assert torch.allclose(advantages.rloo_advantages(r, 4), torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))
    x = torch.rand(12, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(advantages.rloo_advantages(x, 3),
                          3 / 2 * advantages.group_advantages(x, 3, normalize_std=False), atol=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        advantages.rloo_advantages(r, 1)


def test_reinforce_pp_returns_to_go_normalised_over_the_batch_tokens():
    # two responses of 2 and 1 tokens; reward 1 on the last token of the first, KL -0.5 on token 0
    token_rewards = torch.tensor([[-0.5, 1.0], [0.0, 0.0]])
    mask = torch.tensor([[True, True], [True, False]])
    returns = torch.tensor([0.5, 1.0, 0.0])  # G_t = sum of rewards from t on, masked tokens only
    expected = (returns - returns.mean()) / (returns.var(unbiased=False).sqrt() + 1e-6)
    a = advantages.reinforce_pp_advantages(token_rewards, mask)
    assert torch.allclose(a[mask], expected, atol=1e-5)
    assert a[1, 1] == 0  # outside the mask


def test_reinforce_pp_discounts_with_gamma():
    token_rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    returns = torch.tensor([0.25, 0.5, 1.0, 0.5, 0.0])  # gamma 0.5: 1 * 0.5^2, 1 * 0.5, 1; 0.5, 0
    expected = (returns - returns.mean()) / (returns.var(unbiased=False).sqrt() + 1e-6)
    assert torch.allclose(advantages.reinforce_pp_advantages(token_rewards, mask, 0.5)[mask], expected,
                          atol=1e-5)


def test_masked_whiten_hand_example():
    x = torch.tensor([[1.0, 3.0], [5.0, 100.0]])
    mask = torch.tensor([[True, True], [True, False]])
    w = masked.masked_whiten(x, mask)  # over 1, 3, 5: mean 3, population std sqrt(8/3)
    assert torch.allclose(w[mask], torch.tensor([-2.0, 0.0, 2.0]) / math.sqrt(8 / 3), atol=1e-5)
    assert w[1, 1] == 0
    # a NaN at the padded position changes neither the values nor the gradient of the real
    # tokens (it gave NaN gradients everywhere: 0 x NaN through the mean's backward pass)
    grads = []
    for pad in (100.0, float("nan")):
        leaf = torch.tensor([[1.0, 3.0], [5.0, pad]], requires_grad=True)
        out = masked.masked_whiten(leaf, mask)
        assert torch.equal(out, w)
        (out * torch.tensor([[1.0, 2.0], [3.0, 4.0]])).sum().backward()
        grads.append(leaf.grad)
    assert torch.isfinite(grads[1]).all() and torch.equal(grads[0], grads[1])
    assert grads[1][1, 1] == 0
    # numpy arrays are refused by name (masked_mean raised AttributeError: no .bool())
    for fn in (masked.masked_mean, masked.masked_whiten):
        with pytest.raises(ValueError, match=r"values is a ndarray; give a torch tensor"):
            fn(x.numpy(), mask)
        with pytest.raises(ValueError, match=r"response_mask is a ndarray; give a torch tensor"):
            fn(x, mask.numpy())


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
    adv, ret = advantages.gae(rewards, values, mask, gamma, lam)
    expected = naive_gae(rewards, values, lengths, gamma, lam)
    assert torch.allclose(adv, expected, atol=1e-5)
    assert torch.allclose(ret, (expected + values) * mask, atol=1e-5)


def test_gae_hand_example():
    # one 2-token response, terminal reward 1, values 0.5 then 0.8, gamma 1, lambda 0.5
    adv, ret = advantages.gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.8]]),
                      torch.ones(1, 2, dtype=torch.bool), gamma=1.0, lam=0.5)
    # delta_1 = 1 - 0.8 = 0.2; delta_0 = 0 + 0.8 - 0.5 = 0.3; A_0 = 0.3 + 0.5 * 0.2 = 0.4
    assert torch.allclose(adv, torch.tensor([[0.4, 0.2]]))
    assert torch.allclose(ret, torch.tensor([[0.9, 1.0]]))
    with pytest.raises(ValueError, match="gamma"):
        advantages.gae(adv, adv, torch.ones(1, 2, dtype=torch.bool), gamma=1.5)
    # a NaN value at a padded position (the critic's output there is unused) stays out: it made
    # every advantage of the row NaN through next_value = value x 0
    padded = torch.tensor([[True, True, False]])
    adv, ret = advantages.gae(torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([[0.5, 0.8, math.nan]]),
                              padded, gamma=1.0, lam=0.5)
    assert torch.allclose(adv, torch.tensor([[0.4, 0.2, 0.0]]))
    assert torch.allclose(ret, torch.tensor([[0.9, 1.0, 0.0]]))
    with pytest.raises(ValueError, match=r"gae: values \(1, 2\) and response_mask \(1, 3\)"):
        advantages.gae(torch.zeros(1, 3), torch.zeros(1, 2), padded)


@settings(max_examples=100, deadline=None)
@given(st.floats(-10, 10, allow_nan=False, width=32), st.sampled_from([2, 3, 4, 8, 16]),
       st.integers(1, 4))
def test_groups_of_equal_rewards_get_exactly_zero(value, group_size, prompts):
    # a float mean of equal values can be one ulp off (0.1 x 8 averages to 0.1 + 7.5e-9 in
    # float32), which a near-zero std turned into -0.0074 for every response of the group
    rewards = torch.cat([torch.full((group_size,), value),
                         torch.arange(group_size * (prompts - 1), dtype=torch.float32)])
    for estimate in (advantages.group_advantages(rewards, group_size),
                     advantages.group_advantages(rewards, group_size, normalize_std=False),
                     advantages.rloo_advantages(rewards, group_size)):
        assert (estimate[:group_size] == 0).all()
        if prompts > 1:
            assert (estimate[group_size:] != 0).any()


def test_all_wrong_group_hand_example():
    assert advantages.group_advantages(torch.full((8,), 0.1), 8).tolist() == [0.0] * 8
    assert advantages.rloo_advantages(torch.full((8,), 0.7), 8).tolist() == [0.0] * 8


def test_a_batch_of_equal_returns_whitens_to_exactly_zero():
    """Every response earning the same reward (0.1, a well-formatted wrong answer, on the last
    token): each token's return is 0.1, which carries no signal; whitened as written, its float
    mean is one ulp off and the near-zero standard deviation gave every token -0.0074."""
    m = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]).bool()
    tr = torch.zeros(3, 4)
    tr[torch.arange(3), m.sum(1) - 1] = 0.1
    assert torch.equal(advantages.reinforce_pp_advantages(tr, m), torch.zeros(3, 4))
    assert torch.equal(masked.masked_whiten(torch.full((1, 7), 0.1), torch.ones(1, 7)),
                       torch.zeros(1, 7))
    # one reward apart: whitened as before, mean 0 and population std 1 over the real tokens
    tr[2, 3] = 0.7
    a = advantages.reinforce_pp_advantages(tr, m)
    assert masked.masked_mean(a, m).item() == pytest.approx(0.0, abs=1e-6)
    assert masked.masked_mean(a ** 2, m).item() == pytest.approx(1.0, rel=1e-4)


def test_reinforce_pp_keeps_padding_out_and_refuses_what_it_cannot_read():
    m = torch.tensor([[1, 1, 0], [1, 1, 0]])
    nan_pad = torch.tensor([[1.0, 0.0, float("nan")], [0.0, 1.0, 0.0]])
    zero_pad = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    # the returns [1, 0 | 1, 1] whitened: mean 0.75, population std sqrt(3)/4
    expected = torch.tensor([[1 / 3 ** 0.5, -3 ** 0.5, 0.0], [1 / 3 ** 0.5, 1 / 3 ** 0.5, 0.0]])
    for rewards in (nan_pad, zero_pad):
        assert torch.allclose(advantages.reinforce_pp_advantages(rewards, m), expected, atol=1e-5)
    for call, message in (
            (lambda: advantages.reinforce_pp_advantages(torch.rand(3, 4), torch.ones(3)),
             r"reinforce_pp_advantages: token_rewards \(3, 4\) and response_mask \(3,\)"),
            (lambda: advantages.reinforce_pp_advantages(torch.rand(2, 3), m, gamma=2.0),
             r"reinforce_pp_advantages: gamma=2.0 must be in \[0, 1\]"),
            (lambda: advantages.reinforce_pp_advantages(torch.ones(2, 3, dtype=torch.long), m),
             "token_rewards of dtype torch.int64; give floats"),
            # integer values truncated every advantage: (0, 0) for the hand recursion's (1.3 -
            # 0.95 x 0.4, -0.4) = (0.92, -0.4)
            (lambda: advantages.gae(torch.tensor([[0.3, 0.6]]), torch.tensor([[0, 1]]),
                                    torch.tensor([[1, 1]])), "values of dtype torch.int64"),
            (lambda: advantages.gae(torch.rand(1, 2, dtype=torch.float64), torch.rand(1, 2),
                                    torch.ones(1, 2)),
             "rewards torch.float64, values torch.float32; give them one float dtype"),
            (lambda: advantages.group_advantages(torch.tensor([1.0, 0, 0, 1]), 2,
                                                 normalize_std="False"),
             "normalize_std='False' must be True or False"),
            (lambda: advantages.group_advantages(torch.tensor([1.0, 1 + 1e-7]).double(), 2,
                                                 eps=-1e-6), "eps=-1e-06 must be a finite"),
            (lambda: advantages.group_advantages(torch.tensor([1.0, 0.0]), 2, eps=math.nan),
             "eps=nan"),
            (lambda: masked.masked_mean(torch.tensor([[2.0, 4.0]]), torch.tensor([[2, 2]])),
             "masked_mean: response_mask holds 2; a mask marks each position 1"),
            (lambda: masked.masked_whiten(torch.ones(1, 2), torch.tensor([[0.5, 0.5]])),
             "masked_whiten: response_mask holds 0.5")):
        with pytest.raises(ValueError, match=message):
            call()
    assert advantages.gae(torch.tensor([[0.3, 0.6]]), torch.tensor([[0.0, 1.0]]),
                          torch.tensor([[1, 1]]))[0][0].tolist() == pytest.approx([0.92, -0.4])


def test_group_baselines_take_numpy_group_sizes_and_refuse_arrays():
    import numpy as np

    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert torch.equal(advantages.group_advantages(r, np.int64(2)),
                       advantages.group_advantages(r, 2))
    assert advantages.rloo_advantages(r, np.int64(2)).tolist() == [1.0, -1.0, -1.0, 1.0]
    with pytest.raises(ValueError, match="group_size=2.0 must be an integer"):
        advantages.group_advantages(r, 2.0)
    with pytest.raises(ValueError, match=r"rewards is a ndarray; give a torch tensor"):
        advantages.group_advantages(np.array([1.0, 0.0]), 2)


def test_gae_and_reinforce_pp_refuse_masks_kinds_and_rates_they_would_misread():
    # a mask of 2s doubled GAE's advantages at gamma 1 (9.6 for 2.9); lists raised AttributeError
    x, m = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert torch.allclose(advantages.gae(x, torch.zeros(2, 3), m, 0.9, 1.0)[0],
                          torch.tensor([[2.8, 2.0, 0.0], [4.0, 0.0, 0.0]]))
    for call, message in (
            (lambda: advantages.gae(x, torch.zeros(2, 3), m * 2), "gae: response_mask holds 2"),
            (lambda: advantages.gae(x, torch.zeros(2, 3), m * 0.5),
             "gae: response_mask holds 0.5"),
            (lambda: advantages.gae(x.tolist(), torch.zeros(2, 3), m), "gae: rewards is a list"),
            (lambda: advantages.gae(x, torch.zeros(2, 3).numpy(), m),
             "gae: values is a ndarray"),
            (lambda: advantages.gae(x, torch.zeros(2, 3), m, gamma="0.9"),
             r"gae: gamma='0.9' and lam=0.95 must be numbers in \[0, 1\]"),
            (lambda: advantages.gae(x, torch.zeros(2, 3), m, lam=None), "lam=None"),
            (lambda: advantages.gae(x, torch.zeros(2, 3), m, gamma=True), "gamma=True"),
            (lambda: advantages.reinforce_pp_advantages(x.tolist(), m),
             "reinforce_pp_advantages: token_rewards is a list"),
            (lambda: advantages.reinforce_pp_advantages(x, m * 2),
             "reinforce_pp_advantages: response_mask holds 2")):
        with pytest.raises(ValueError, match=message):
            call()
