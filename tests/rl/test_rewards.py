"""DAPO's overlong penalty and dynamic-sampling filter (rlm_course.rl.rewards)."""

import pytest
import torch

from rlm_course.rl import advantages, rewards


def test_overlong_penalty():
    lengths = torch.tensor([10, 16, 18, 20, 25])
    # max 20, cache 4: free up to 16, then -(L-16)/4, -1 at 20 and beyond
    assert torch.allclose(rewards.overlong_penalty(lengths, 20, 4),
                          torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]))
    with pytest.raises(ValueError, match="cache_length"):
        rewards.overlong_penalty(lengths, 20, 0)


def test_dynamic_sampling_keeps_groups_with_signal():
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.1, 1.0])
    assert rewards.groups_with_signal(r, 2).tolist() == [False, True, False, True]
    kept = rewards.groups_with_signal(r, 2)
    adv = advantages.group_advantages(r, 2).view(4, 2)
    assert (adv[~kept] == 0).all()  # what dynamic sampling drops carried no gradient anyway
