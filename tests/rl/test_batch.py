"""The batch that crosses the stages (rlm_course.rl.batch): a rank's share by hand."""

import pytest
import torch

from rlm_course.lm.sampling import Rollout
from rlm_course.rl.batch import Batch


def _batch() -> Batch:
    # 4 responses, prompts of 2 columns, responses of 3 columns; lengths 3, 1, 2, 0
    response_mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    attention = torch.cat([torch.ones(4, 2, dtype=torch.bool), response_mask], 1)
    tokens = torch.arange(20).reshape(4, 5)
    log_probs = -torch.arange(12, dtype=torch.float).reshape(4, 3)
    rollout = Rollout(tokens, attention, response_mask, log_probs, 2)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0])
    versions = torch.where(response_mask, 3, -1)
    return Batch(rollout, rewards, list("abcd"), rewards, list("abcd"),
                 rollout.response_lengths(), 1, versions=versions, behaviour_log_probs=log_probs)


def test_a_ranks_share_takes_every_field_of_its_rows():
    part = _batch().rows(torch.tensor([2, 3]))
    assert part.rewards.tolist() == [0.5, 0.0] and part.verdicts == ["c", "d"]
    assert part.all_rewards.tolist() == [0.5, 0.0] and part.all_verdicts == ["c", "d"]
    assert part.lengths.tolist() == [2, 0] and (part.trained, part.generated) == (2, 2)
    assert part.rollout.tokens.tolist() == [list(range(10, 15)), list(range(15, 20))]
    assert part.versions.tolist() == [[3, 3, -1], [-1, -1, -1]]
    assert part.behaviour_log_probs.tolist() == [[-6.0, -7.0, -8.0], [-9.0, -10.0, -11.0]]


def test_an_empty_batch_has_no_rows_to_take():
    empty = Batch.empty_of(torch.zeros(8), ["x"] * 8, torch.ones(8), rounds=4)
    assert (empty.trained, empty.generated, empty.rounds) == (0, 8, 4)
    with pytest.raises(ValueError, match="no responses to train on"):
        empty.rows(torch.tensor([0]))
