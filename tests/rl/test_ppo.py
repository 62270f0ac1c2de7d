"""PPO: the critic, the clipped value loss, configuration errors, and a short learning run."""

import pytest
import torch

from rlm_course.lm.checkpoint import load_checkpoint
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.algorithms import PPOConfig
from rlm_course.rl.critic import Critic, clipped_value_loss
from rlm_course.rl.runs import default_sft_checkpoint, run_rl
from rlm_course.tasks import get_task

TASK = get_task("addition", digits=3)


def test_clipped_value_loss_hand_example():
    values = torch.tensor([[1.0, 0.5]])
    old = torch.tensor([[0.5, 0.5]])
    returns = torch.tensor([[0.0, 1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    # token 0: unclipped (1-0)^2 = 1, clipped V = 0.7 -> 0.49, max 1; token 1: both (0.5-1)^2
    expected = 0.5 * (1.0 + 0.25) / 2
    assert clipped_value_loss(values, old, returns, mask, 0.2).item() == pytest.approx(expected)


def test_critic_starts_from_the_policy_trunk_with_zero_values():
    tok = CharTokenizer()
    policy = load_checkpoint(default_sft_checkpoint(TASK))["model"]
    critic = Critic(policy)
    for (name, p), q in zip(critic.trunk.named_parameters(), policy.parameters()):
        assert torch.equal(p, q), name
    tokens, mask = tok.encode_prompts(["12+34=46", "1+1=2"])
    values = critic(tokens, mask, prompt_len=5)
    assert values.shape == (2, tokens.shape[1] - 5) and (values == 0).all()
    assert all(not p.requires_grad for p in critic.trunk.head.parameters())


@pytest.mark.parametrize("kw,match", [({"group_size": 0}, "group_size=0"),
                                      ({"gamma": 1.5}, "gamma=1.5"),
                                      ({"critic_lr": 0.0}, "critic_lr=0.0")])
def test_bad_ppo_config(kw, match):
    with pytest.raises(ValueError, match=match):
        PPOConfig(**kw)
    assert PPOConfig(group_size=1).group_size == 1  # PPO needs no group


@pytest.mark.slow
def test_short_ppo_run_raises_held_out_accuracy(tmp_path):
    # 30 steps: PPO gains about 25 points here (0.23 -> 0.48), well above the 5 asked
    summary = run_rl(TASK, PPOConfig(steps=30, eval_every=15), out_dir=tmp_path, progress=False,
                     log=lambda *a: None)
    assert summary["algorithm"] == "ppo"
    assert summary["accuracy_after"] >= summary["accuracy_before"] + 0.05
    state = load_checkpoint(tmp_path / "ppo-addition-3-seed0" / "checkpoint.pt")
    assert state["algorithm"] == "ppo" and "critic" in state["trainer"]
