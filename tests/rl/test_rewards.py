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
    # True was a cache of 1 token, an infinite budget no penalty at all, 16.5 a budget no
    # response has; a negative length is no response's
    for max_length, cache_length, said in ((20, True, r"cache_length \(True\)"),
                                           (float("inf"), 4, r"max_length \(inf\)"),
                                           (16.5, 4, r"max_length \(16.5\)")):
        with pytest.raises(ValueError, match="need integers 0 < .*" + said):
            rewards.overlong_penalty(lengths, max_length, cache_length)
    with pytest.raises(ValueError, match="a length of -1 tokens"):
        rewards.overlong_penalty(torch.tensor([-1, 2]), 20, 4)
    # float64 lengths keep their precision
    assert rewards.overlong_penalty(torch.tensor([18.0], dtype=torch.float64), 20, 4).dtype \
        == torch.float64


def test_dynamic_sampling_keeps_groups_with_signal():
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.1, 1.0])
    assert rewards.groups_with_signal(r, 2).tolist() == [False, True, False, True]
    kept = rewards.groups_with_signal(r, 2)
    adv = advantages.group_advantages(r, 2).view(4, 2)
    assert (adv[~kept] == 0).all()  # what dynamic sampling drops carried no gradient anyway
