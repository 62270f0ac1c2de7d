import math

import pytest
import torch

from rlm_course import rl
from rlm_course.checks import run_check


@pytest.mark.parametrize("name", ["group_advantages", "clipped_surrogate", "kl_k3"])
def test_package_functions_pass_their_exercise_checks(name):
    report = run_check(name, getattr(rl, name))
    assert report.all_passed, str(report)


def test_group_advantages_hand_example():
    r = torch.tensor([0.0, 1.0, 1.0, 1.0, 0.1, 0.1, 0.1, 0.1])
    a = rl.group_advantages(r, 4)
    std = math.sqrt(0.75 / 3)  # unbiased std of [0, 1, 1, 1]
    assert torch.allclose(a[:4], torch.tensor([-0.75, 0.25, 0.25, 0.25]) / std, atol=1e-4)
    assert torch.equal(a[4:], torch.zeros(4))


def test_group_advantages_errors():
    with pytest.raises(ValueError, match="at least 2"):
        rl.group_advantages(torch.ones(4), 1)
    with pytest.raises(ValueError, match="do not split"):
        rl.group_advantages(torch.ones(5), 2)


def test_masked_and_sequence_means():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
    m = torch.tensor([[True, True, True], [True, False, False]])
    assert rl.masked_mean(x, m).item() == pytest.approx(10 / 4)
    # GRPO: mean per sequence (2 and 4), then over sequences -> 3
    assert rl.sequence_mean(x, m).item() == pytest.approx(3.0)
    assert rl.masked_mean(x, torch.zeros_like(m), dim=1).tolist() == [0.0, 0.0]


def test_grpo_loss_on_policy_value_and_gradient():
    # On-policy (ratio 1) the loss value is -mean(A) = 0 for centred advantages, but its gradient
    # is the policy gradient: d loss / d logp_{i,t} = -A_i / (G |o_i|).
    logp = torch.log(torch.tensor([[0.5, 0.5], [0.25, 0.5]])).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[True, True], [True, False]])
    loss, stats = rl.grpo_loss(logp, logp.detach(), None, adv, mask, clip_eps=0.2, kl_coef=0.0)
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.25, -0.25], [0.5, 0.0]]))
    assert stats["clip_fraction"] == 0.0 and stats["kl"] == 0.0


def test_grpo_loss_adds_the_kl_term():
    logp = torch.log(torch.tensor([[0.5, 0.2]]))
    ref = torch.log(torch.tensor([[0.25, 0.2]]))
    mask = torch.ones(1, 2, dtype=torch.bool)
    k3 = (0.5 + math.log(2) - 1) / 2  # sequence mean of [k3, 0]
    loss, stats = rl.grpo_loss(logp, logp, ref, torch.zeros(1), mask, kl_coef=0.1)
    assert stats["kl"] == pytest.approx(k3)
    assert loss.item() == pytest.approx(0.1 * k3)
    with pytest.raises(ValueError, match="ref_log_probs"):
        rl.grpo_loss(logp, logp, None, torch.zeros(1), mask, kl_coef=0.1)


def test_clip_fraction_counts_only_clipped_tokens():
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    old = torch.log(torch.tensor([[0.25, 0.5, 0.9]]))  # ratios 2, 1, 0.56
    mask = torch.ones(1, 3, dtype=torch.bool)
    assert rl.clip_fraction(logp, old, torch.tensor([1.0]), 0.2, mask).item() == pytest.approx(1 / 3)
    assert rl.clip_fraction(logp, old, torch.tensor([-1.0]), 0.2, mask).item() == pytest.approx(1 / 3)
