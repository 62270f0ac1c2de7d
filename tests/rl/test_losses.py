"""The clipped policy loss of the family (rlm_course.rl.losses): hand-computed examples, and GRPO's
objective written out as in the paper equal to the general loss with GRPO's options."""

import math

import pytest
import torch

from rlm_course.rl import kl, losses, masked


def test_masked_and_sequence_means():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
    m = torch.tensor([[True, True, True], [True, False, False]])
    assert masked.masked_mean(x, m).item() == pytest.approx(10 / 4)
    # GRPO: mean per sequence (2 and 4), then over sequences -> 3
    assert losses.sequence_mean(x, m).item() == pytest.approx(3.0)
    assert masked.masked_mean(x, torch.zeros_like(m), dim=1).tolist() == [0.0, 0.0]
    # a response without real tokens is left out of the mean over responses (verl's agg_loss),
    # not counted as a 0: (2 + 4) / 2, not (2 + 4 + 0) / 3
    x3, m3 = torch.cat([x, torch.full((1, 3), 7.0)]), torch.cat([m, torch.zeros(1, 3, dtype=bool)])
    assert losses.sequence_mean(x3, m3).item() == pytest.approx(3.0)
    empty = x.clone().requires_grad_(True)
    loss = losses.sequence_mean(empty, torch.zeros_like(m))
    loss.backward()
    assert loss.item() == 0.0 and empty.grad.abs().sum() == 0


def test_sequence_ratio_is_the_geometric_mean_of_token_ratios():
    lp = torch.log(torch.tensor([[0.5, 0.5, 0.9], [0.2, 0.4, 0.4]]))
    old = torch.log(torch.tensor([[0.25, 0.5, 0.1], [0.1, 0.1, 0.4]]))
    mask = torch.tensor([[True, True, False], [True, True, True]])
    expected = torch.tensor([math.sqrt(2 * 1), (2 * 4 * 1) ** (1 / 3)])
    assert torch.allclose(losses.sequence_ratio(lp, old, mask), expected, atol=1e-5)


def test_clipped_objective_hand_examples_and_decoupled_bounds():
    # symmetric (PPO/GRPO): ratio 2 with A = +1 is clipped to 1.2; with A = -1 it is not
    ratio = torch.tensor([[2.0, 1.0]])
    assert torch.allclose(losses.clipped_objective(ratio, torch.tensor([1.0]), 0.2),
                          torch.tensor([[-1.2, -1.0]]))
    assert torch.allclose(losses.clipped_objective(ratio, torch.tensor([-1.0]), 0.2),
                          torch.tensor([[2.0, 1.0]]))
    # decoupled (DAPO clip-higher): the upper bound moves to 1.28, the lower stays at 0.8
    ratio = torch.tensor([[0.7, 1.25, 1.3]])
    up = losses.clipped_objective(ratio, torch.tensor([1.0]), 0.2, 0.28)
    assert torch.allclose(up, torch.tensor([[-0.7, -1.25, -1.28]]))
    down = losses.clipped_objective(ratio, torch.tensor([-1.0]), 0.2, 0.28)
    assert torch.allclose(down, torch.tensor([[0.8, 1.25, 1.3]]))
    # a sequence-level ratio (GSPO) takes one advantage per sequence
    assert losses.clipped_objective(torch.tensor([1.5, 0.5]), torch.tensor([0.5, -2.0]),
                                    0.2).shape == (2,)
    with pytest.raises(ValueError, match="low <= high"):
        losses.clipped_objective(ratio, torch.tensor([1.0]), 0.28, 0.2)
    # a NaN bound gave NaN losses; a lower bound at or past 1 never clips a negative advantage
    for low, high in ((math.nan, 0.2), (0.2, math.nan), (0.2, math.inf)):
        with pytest.raises(ValueError, match="need 0 <= low <= high, finite"):
            losses.clipped_objective(ratio, torch.tensor([1.0]), low, high)
    with pytest.raises(ValueError, match="low=1.5: the lower bound 1 - low would not be positive"):
        losses.clipped_objective(ratio, torch.tensor([1.0]), 1.5, 2.0)
    # a float or integer mask: the clipped tokens are a bool tensor, as documented
    lp = torch.log(torch.tensor([[0.5, 0.5]]))
    for mask in (torch.ones(1, 2), torch.ones(1, 2, dtype=torch.int64)):
        _, clipped = losses.policy_loss(lp, lp - 1.0, torch.tensor([1.0]), mask)
        assert clipped.dtype == torch.bool and clipped.tolist() == [[True, True]]


def test_clipped_tokens_are_those_without_gradient():
    ratio = torch.tensor([[2.0, 1.0, 0.56]])
    assert losses.clipped_tokens(ratio, torch.tensor([1.0]), 0.2).tolist() == [[True, False, False]]
    assert losses.clipped_tokens(ratio, torch.tensor([-1.0]), 0.2).tolist() == [[False, False, True]]
    x = ratio.clone().requires_grad_(True)
    losses.clipped_objective(x, torch.tensor([1.0]), 0.2).sum().backward()
    assert x.grad.tolist() == [[0.0, -1.0, -1.0]]


def test_dual_clip_bounds_the_loss_of_a_negative_advantage_hand_example():
    # A = -1: PPO's loss is max(r, 1 - eps) = 0.8, 1, 2, 5; the dual clip c = 3 caps it at 3
    ratio = torch.tensor([[0.5, 1.0, 2.0, 5.0]])
    adv = torch.tensor([-1.0])
    plain = losses.clipped_objective(ratio, adv, 0.2)
    dual = losses.clipped_objective(ratio, adv, 0.2, clip_c=3.0)
    assert plain.tolist() == [[pytest.approx(0.8), 1.0, 2.0, 5.0]]
    assert dual.tolist() == [[pytest.approx(0.8), 1.0, 2.0, 3.0]]
    # a positive advantage is untouched: -min(r, 1.2) A
    assert losses.clipped_objective(ratio, -adv, 0.2, clip_c=3.0).tolist() == [
        [-0.5, -1.0, pytest.approx(-1.2), pytest.approx(-1.2)]]
    x = ratio.clone().requires_grad_(True)
    losses.clipped_objective(x, adv, 0.2, clip_c=3.0).sum().backward()
    assert x.grad.tolist() == [[0.0, 1.0, 1.0, 0.0]]  # below 1 - eps and above c: no gradient
    assert losses.clipped_tokens(ratio, adv, 0.2, clip_c=3.0).tolist() == [[True, False, False,
                                                                            True]]
    lp = torch.log(ratio)
    loss, clipped = losses.policy_loss(lp, torch.zeros_like(lp), adv, torch.ones(1, 4, dtype=bool),
                                       loss_agg="token-mean", clip_c=3.0)
    assert loss.item() == pytest.approx((0.8 + 1 + 2 + 3) / 4)
    assert clipped.tolist() == [[True, False, False, True]]
    for bad in (1.0, 0.5, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="dual clip c=.* must be a finite number above 1"):
            losses.clipped_objective(ratio, adv, 0.2, clip_c=bad)
    from rlm_course.algorithms import preset
    assert preset("grpo").dual_clip is None and preset("grpo", dual_clip=3.0).dual_clip == 3.0
    with pytest.raises(ValueError, match="dual_clip=0.9 must be a finite number above 1"):
        preset("ppo", dual_clip=0.9)


def test_aggregations_hand_example():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[True, True, True], [True, False, False]])
    assert losses.aggregate_loss(x, m, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert losses.aggregate_loss(x, m, "token-mean").item() == pytest.approx(10 / 4)
    assert losses.aggregate_loss(x, m, "seq-mean-token-sum-norm", 5).item() == pytest.approx(10 / 10)
    assert losses.aggregate_loss(x, m, "seq-mean-token-mean") == losses.sequence_mean(x, m)
    with pytest.raises(ValueError, match="constant_length"):
        losses.aggregate_loss(x, m, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        losses.aggregate_loss(x, m, "mean")


def grpo_objective_as_written(lp, old, ref, adv, mask, eps, beta):
    """DeepSeekMath eq. 3 as a loss, term by term with loops (chapter 02's form)."""
    total = 0.0
    for i in range(len(lp)):
        terms = []
        for t in range(len(lp[i])):
            if not mask[i][t]:
                continue
            r = math.exp(lp[i][t] - old[i][t])
            surrogate = min(r * adv[i], min(max(r, 1 - eps), 1 + eps) * adv[i])
            log_rho = ref[i][t] - lp[i][t]
            k3 = min(math.exp(log_rho) - log_rho - 1, 10.0)  # the course caps k3 at 10 nats
            terms.append(-surrogate + beta * k3)
        total += sum(terms) / max(len(terms), 1)
    return total / len(lp)


def test_grpo_as_written_equals_the_general_loss_with_grpo_options():
    g = torch.Generator().manual_seed(0)
    lp, old, ref = (torch.randn(6, 5, generator=g, dtype=torch.float64) for _ in range(3))
    adv = torch.randn(6, generator=g, dtype=torch.float64)
    mask = torch.rand(6, 5, generator=g) > 0.3
    loss, _ = losses.policy_loss(lp, old, adv, mask, "token", 0.2, None, "seq-mean-token-mean")
    penalty = losses.aggregate_loss(kl.kl_estimate(lp, ref, "k3").clamp(-kl.KL_CLAMP, kl.KL_CLAMP),
                                    mask, "seq-mean-token-mean")
    expected = grpo_objective_as_written(lp.tolist(), old.tolist(), ref.tolist(), adv.tolist(),
                                         mask.tolist(), 0.2, 0.005)
    assert (loss + 0.005 * penalty).item() == pytest.approx(expected, rel=1e-12)


def test_on_policy_loss_is_zero_but_its_gradient_is_the_policy_gradient():
    # On-policy (ratio 1) the loss value is -mean(A) = 0 for centred advantages, but its gradient
    # is the policy gradient: d loss / d logp_{i,t} = -A_i / (G |o_i|).
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.25, 0.5]])).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[True, True], [True, False]])
    loss, clipped = losses.policy_loss(logp, logp.detach(), adv, mask)
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.25, -0.25], [0.5, 0.0]]))
    assert not clipped.any()


def test_policy_loss_refuses_per_response_weights_and_passes_no_gradient_to_the_old_policy():
    # weights of shape (batch,) with batch == R would broadcast over the tokens: refused
    logp = torch.zeros(3, 3, requires_grad=True)
    adv, mask = torch.tensor([1.0, 2.0, 3.0]), torch.ones(3, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="weights"):
        losses.policy_loss(logp, logp.detach(), adv, mask, weights=torch.tensor([0.0, 1.0, 2.0]))
    # per token, the same weights per response: -mean_i(w_i A_i) = -(0 + 2 + 6) / 3
    w = torch.tensor([0.0, 1.0, 2.0])[:, None].expand(3, 3)
    loss, _ = losses.policy_loss(logp, logp.detach(), adv, mask, weights=w)
    assert loss.item() == pytest.approx(-8 / 3)
    # a proximal policy still attached to a graph is the trust region's centre, not a parameter
    old = torch.zeros(3, 3, requires_grad=True)
    loss, _ = losses.policy_loss(logp, old, adv, mask)
    loss.backward()
    assert old.grad is None and logp.grad is not None


def test_policy_loss_sequence_ratio_hand_example():
    # one response of 2 tokens with log-ratios ln 2 and 0: sequence ratio sqrt(2) = 1.414
    lp = torch.log(torch.tensor([[0.5, 0.5, 0.3]]))
    old = torch.log(torch.tensor([[0.25, 0.5, 0.9]]))
    mask = torch.tensor([[True, True, False]])
    loss, clipped = losses.policy_loss(lp, old, torch.tensor([1.0]), mask, "sequence", 0.2, 0.28)
    assert loss.item() == pytest.approx(-1.28)  # clipped at 1 + 0.28 for a positive advantage
    assert clipped.tolist() == [[True, True, False]]
    loss, _ = losses.policy_loss(lp, old, torch.tensor([-1.0]), mask, "sequence", 0.2, 0.28)
    assert loss.item() == pytest.approx(2 ** 0.5, rel=1e-5)  # negative advantage: not clipped
    with pytest.raises(ValueError, match="one advantage per response"):
        losses.policy_loss(lp, old, torch.ones(1, 3), mask, "sequence")


def test_log_ratios_past_what_exp_holds_give_finite_gradients():
    # a padding position (masked) and a real token whose log-ratio overflows float32's exp
    # (e^88.7): the loss was finite but its backward wrote NaN (0 x inf) into the gradient
    mask = torch.tensor([[True, True, False]])
    lp = torch.tensor([[-0.5, -1.0, -95.0]], requires_grad=True)
    ref = torch.tensor([[-0.6, -0.9, -5.0]])
    value = losses.aggregate_loss(kl.kl_estimate(lp, ref, "k3").clamp(-kl.KL_CLAMP, kl.KL_CLAMP),
                                  mask, "seq-mean-token-mean")
    value.backward()
    assert torch.isfinite(lp.grad).all() and lp.grad[0, 2] == 0
    # on real tokens the gradient is k3's own, d/dlogp (e^x - x - 1) = 1 - e^x, over B |o| = 2
    x = ref[0, :2] - lp.detach()[0, :2]
    assert lp.grad[0, :2].tolist() == pytest.approx(((1 - torch.exp(x)) / 2).tolist(), rel=1e-5)
    for level in ("token", "sequence"):
        lp = torch.tensor([[-0.5, -1.0, -0.2]], requires_grad=True)
        old = torch.tensor([[-0.5, -95.0, -0.2]])  # a ratio of e^94 on token 2
        loss, clipped = losses.policy_loss(lp, old, torch.tensor([1.0]), mask, level)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(lp.grad).all(), level
        # a positive advantage clips a ratio above 1 + eps: those tokens get no gradient
        assert clipped[0, 1] and lp.grad[0, 1] == 0, level
    # k3 is exact wherever float32 holds it, and stops at e^87.7 instead of inf
    assert kl.exp_safe_limit(torch.float32) == pytest.approx(math.log(3.4028234663852886e38) - 1)
    assert kl.kl_k3(torch.tensor([0.0]), torch.tensor([60.0])).item() == pytest.approx(
        math.expm1(60.0) - 60.0, rel=1e-6)
    top = kl.exp_safe_limit(torch.float32)
    assert kl.kl_k3(torch.tensor([0.0]), torch.tensor([95.0])).item() == pytest.approx(
        math.expm1(top) - top, rel=1e-5)
    # the policy ratio stops at e^20, as veRL's does
    # (a negative advantage does not clip a large ratio: the loss is -r A on that token)
    loss, _ = losses.policy_loss(torch.zeros(1, 3), torch.tensor([[0.0, -95.0, 0.0]]),
                                 torch.tensor([-1.0]), torch.tensor([[False, True, False]]),
                                 loss_agg="token-mean")
    assert loss.item() == pytest.approx(math.exp(kl.LOG_RATIO_CLAMP), rel=1e-6)


def test_masks_of_another_shape_are_refused_and_padding_never_leaks():
    """A (batch,) or (batch, 1) mask broadcast over the wrong axis and counted rows as tokens;
    a NaN or inf at a padded position made the whole loss NaN (inf x 0)."""
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    for bad in (torch.tensor([[True], [True]]), torch.tensor([True, False])):
        with pytest.raises(ValueError, match=r"aggregate_loss: per_token \(2, 3\) and "
                                             r"response_mask \(\d,( \d)?\) must have one shape"):
            losses.aggregate_loss(per_token, bad, "token-mean")
        with pytest.raises(ValueError, match="masked_mean"):
            masked.masked_mean(per_token, bad)
    leaky = torch.tensor([[1.0, 2.0, 3.0], [4.0, math.nan, math.inf]])
    assert losses.aggregate_loss(leaky, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert losses.aggregate_loss(leaky, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)
    assert losses.aggregate_loss(leaky, mask, "seq-mean-token-sum-norm", 3).item() == \
        pytest.approx(10 / 6)
    whitened = masked.masked_whiten(leaky, mask)
    assert torch.isfinite(whitened).all() and (whitened[~mask] == 0).all()
    lp = torch.log(torch.full((3, 3), 0.5))
    with pytest.raises(ValueError, match=r"old_log_probs \(3,\) and response_mask \(3, 3\)"):
        losses.policy_loss(lp, torch.log(torch.tensor([0.25, 0.5, 1.0])), torch.ones(3),
                           torch.ones(3, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"advantages \(3, 1\) must be \(batch,\)"):
        losses.policy_loss(lp, lp, torch.ones(3, 1), torch.ones(3, 3, dtype=torch.bool))


def test_losses_refuse_masks_bounds_and_shapes_they_would_misread():
    x, ones = torch.tensor([[2.0, 4.0]]), torch.ones(2, 3)
    for call, message in (
            # a mask of 2s was counted twice (1.5 for the mean of 2 and 4), of 0.5s half (6.0)
            (lambda: losses.aggregate_loss(x, torch.tensor([[2, 2]]), "token-mean"),
             "aggregate_loss: response_mask holds 2"),
            (lambda: losses.aggregate_loss(ones, ones, "seq-mean-token-sum-norm", math.nan),
             r"constant_length=nan to be a finite number at least the longest response \(3 "),
            (lambda: losses.aggregate_loss(ones, ones, "seq-mean-token-sum-norm", math.inf),
             "constant_length=inf"),
            (lambda: losses.aggregate_loss(ones, ones, "seq-mean-token-sum-norm", 1),
             "constant_length=1"),
            (lambda: losses.aggregate_loss(ones, ones, "seq-mean-token-sum-norm", True),
             "constant_length=True"),
            # a sequence ratio per response against a (3, 3) advantage: column j took ratio j
            (lambda: losses.clipped_objective(torch.tensor([1.5, 0.5, 1.0]), torch.ones(3, 3),
                                              0.2),
             r"clipped_objective: advantages \(3, 3\) must be the ratio's shape \(3,\)"),
            (lambda: losses.clipped_tokens(torch.ones(2, 2), torch.ones(3), 0.2),
             r"clipped_tokens: advantages \(3,\)"),
            (lambda: losses.clipped_tokens(torch.tensor([[1.1]]), torch.tensor([-1.0]), -0.2),
             "clipped_tokens: clip bounds low=-0.2"),
            (lambda: critic_loss(-0.2), "clipped_value_loss: clip_eps=-0.2 must be a finite"),
            (lambda: critic_loss(math.nan), "clip_eps=nan"),
            # one response as (R,): its 3 tokens were read as a batch of 3
            (lambda: losses.policy_loss(torch.tensor([-1.0, -2, -3]),
                                        torch.tensor([-1.1, -2.1, -3.1]), torch.ones(1),
                                        torch.ones(3).bool()),
             r"policy_loss: log_probs of shape \(3,\); give \(batch, R\)")):
        with pytest.raises(ValueError, match=message):
            call()
    # what they take: Dr. GRPO divides by the budget, 4 here: (2 + 4) / (1 x 4)
    assert losses.aggregate_loss(x, torch.ones(1, 2), "seq-mean-token-sum-norm", 4).item() == 1.5
    assert losses.clipped_tokens(torch.tensor([[1.5, 0.5]]), torch.tensor([1.0]), 0.2).tolist() \
        == [[True, False]]


def critic_loss(clip_eps):
    from rlm_course.rl.critic import clipped_value_loss

    values, old, returns = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.5, 0.5]]), \
        torch.tensor([[2.0, 0.0]])
    return clipped_value_loss(values, old, returns, torch.ones(1, 2), clip_eps)


def test_the_clipped_value_loss_is_verls():
    # 1/2 max((V - R)^2, (clip(V, V_old -+ 0.2) - R)^2): token 1 max(1, 1.69) = 1.69, token 2
    # max(0, 0.09) = 0.09; the mean of the halves 0.445
    assert critic_loss(0.2).item() == pytest.approx(0.445)


def test_padding_never_reaches_the_policy_gradient_and_bad_kinds_are_named():
    """A NaN at a padded position of the weights or of per-token advantages gave the right loss
    and NaN gradients (0 x NaN through the mask's backward pass), at sequence level on the real
    tokens too; integer or mixed-precision log-probs were taken; numpy arrays and lists raised
    AttributeError."""
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    nan_pad = torch.tensor([[1.0, 1.0, float("nan")]])
    clean_pad = torch.tensor([[1.0, 1.0, 0.0]])
    for level, kwargs in (("token", lambda pad: {"weights": pad}),
                          ("token", lambda pad: {"advantages": pad}),
                          ("sequence", lambda pad: {"weights": pad})):
        grads, values = [], []
        for pad in (clean_pad, nan_pad):
            lp = torch.full((1, 3), -1.0, requires_grad=True)
            args = {"advantages": torch.tensor([1.0]), **kwargs(pad)}
            loss, _ = losses.policy_loss(lp, lp.detach() - 0.1, args.pop("advantages"), mask,
                                         ratio_level=level, **args)
            loss.backward()
            grads.append(lp.grad)
            values.append(loss.item())
        assert values[0] == values[1] and torch.equal(grads[0], grads[1]), (level, grads)
        assert torch.isfinite(grads[1]).all() and grads[1][0, 2] == 0
    lp, m = torch.full((2, 3), -1.0), torch.ones(2, 3)
    adv = torch.ones(2)
    for call, message in (
            (lambda: losses.policy_loss(lp.numpy(), lp, adv, m), "log_probs is a ndarray"),
            (lambda: losses.policy_loss(lp, lp.tolist(), adv, m), "old_log_probs is a list"),
            (lambda: losses.policy_loss(lp.long(), lp.long(), adv, m),
             r"log_probs of dtype torch.int64; give floats"),
            (lambda: losses.policy_loss(lp.double(), lp, adv, m),
             "log_probs torch.float64, old_log_probs torch.float32; give them one float dtype"),
            (lambda: losses.policy_loss(lp, lp, adv, m * 2), "policy_loss: response_mask holds 2"),
            (lambda: losses.clipped_objective(lp.numpy(), adv, 0.2),
             "clipped_objective: ratio is a ndarray"),
            (lambda: losses.aggregate_loss(lp.numpy(), m.numpy(), "token-mean"),
             "aggregate_loss: per_token is a ndarray"),
            (lambda: losses.aggregate_loss(lp, m, "token-mean", -5),
             r"constant_length=-5 must be None or a finite number of tokens > 0"),
            (lambda: losses.sequence_ratio(lp, lp[:, :2], m),
             r"sequence_ratio: old_log_probs \(2, 2\) and response_mask \(2, 3\)")):
        with pytest.raises(ValueError, match=message):
            call()
