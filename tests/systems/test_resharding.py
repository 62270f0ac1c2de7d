"""Resharding (rlm_course.systems.resharding): shards against the tensor-parallel block, the
generation layouts, and the transition predicted as in HybridFlow's table."""

import pytest
import torch

from rlm_course.cost.weight_sync import predict_transition
from rlm_course.lm.model import ModelConfig, TinyGPT
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.parallel.tensor_parallel import TensorParallelBlock
from rlm_course.cost.comm import Link
from rlm_course.parallel.world import World
from rlm_course.systems.resharding import (Split, generation_index, megatron_splits, merge,
                                           micro_dp_groups, shard, shard_major,
                                           training_shards)

TOK = CharTokenizer()


def test_shards_nest_and_match_the_tensor_parallel_block():
    torch.manual_seed(0)
    model = TinyGPT(ModelConfig(vocab_size=24, max_seq_len=32))
    state = model.state_dict()
    splits = megatron_splits(state)
    for name, tensor in state.items():
        if splits[name] is None:
            continue
        assert torch.equal(merge([shard(tensor, splits[name], i, 4) for i in range(4)],
                                 splits[name]), tensor)
        for j in range(2):  # a TP-2 shard is the union of two TP-4 shards
            pair = [shard(tensor, splits[name], 2 * j + k, 4) for k in range(2)]
            assert torch.equal(merge(pair, splits[name]), shard(tensor, splits[name], j, 2))
            assert torch.equal(shard_major(torch.cat(pair, splits[name].dim), splits[name], 2),
                               shard(tensor, splits[name], j, 2))
    block = TensorParallelBlock(model.blocks[0], World(4))
    local = training_shards(state, 2, 4)
    assert torch.equal(block.shards[2].qkv_w, local["blocks.0.attn.qkv.weight"])
    assert torch.equal(block.shards[2].out_w, local["blocks.0.mlp.out.weight"])
    with pytest.raises(ValueError, match="equal chunks"):
        shard(torch.zeros(6, 2), Split(0), 0, 4)


def test_generation_layouts():
    assert [generation_index(r, 4, 2, "naive") for r in range(4)] == [0, 1, 0, 1]
    assert [generation_index(r, 4, 2, "hybridflow") for r in range(4)] == [0, 0, 1, 1]
    assert micro_dp_groups(8, 2) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="divisor"):
        micro_dp_groups(4, 3)


def test_transition_predictions_are_hybridflows_table():
    m = 140e9  # 70B in bf16, TP 8 -> TP 2 (HybridFlow, arXiv:2409.19256, Table 2)
    out = predict_transition(m, 8, 2)
    assert out["naive"]["received_bytes"] == pytest.approx(7 / 8 * m)  # (tp - 1) / tp M
    assert out["hybridflow"]["received_bytes"] == pytest.approx((8 - 2) / (2 * 8) * m)
    assert out["hybridflow"]["peak_bytes"] == pytest.approx(m / 2)
    assert out["hybridflow"]["redundant_bytes"] == 0
    assert out["reduction"]["bytes"] == pytest.approx(1 - (3 / 8) / (7 / 8))
    with_pp = predict_transition(m, 4, 2, pp=2, pp_gen=1)
    assert with_pp["hybridflow"]["received_bytes"] == pytest.approx((8 - 2) / (2 * 8) * m)
    timed = predict_transition(m, 8, 2, link=Link(alpha=0.0, beta=450e9))
    assert timed["naive"]["seconds"] == pytest.approx(7 * m / 8 / 450e9)
    assert timed["hybridflow"]["seconds"] == pytest.approx(3 * m / 8 / 450e9)
    with pytest.raises(ValueError, match="divisor"):
        predict_transition(m, 8, 3)
