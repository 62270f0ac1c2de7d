"""Megatron tensor (and sequence) parallelism equals one device, forward and backward, and
communicates four all-reduce volumes of activations per block."""

import pytest
import torch

from rlm_course.lm.model import Block, ModelConfig
from rlm_course.numerics import relative_error, reorder_tolerance
from rlm_course.parallel.tensor_parallel import (
    REPLICATED,
    TensorParallelBlock,
    layer_bytes_per_rank,
    shard_sequence,
)
from rlm_course.parallel.world import World

CONFIG = ModelConfig(vocab_size=10, n_layer=1, n_head=4, d_model=16, max_seq_len=16)
# float64, so that reordered sums differ by 1e-16-level rounding only: the longest sum is the
# MLP's 64 inputs (or a weight gradient's batch x seq <= 16 rows), six reductions chained
TOL = reorder_tolerance(torch.float64, terms=64, depth=6)


def close(a, b):
    return relative_error(a, b) <= TOL


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("batch,seq", [(2, 8), (1, 4)])
def test_tensor_parallel_block_equals_one_device(sp, tp, batch, seq):
    torch.manual_seed(tp + 10 * batch)
    block = Block(CONFIG).double()
    x = torch.randn(batch, seq, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(batch, seq, 16, dtype=torch.float64)
    reference = block(x, None)
    (reference * w).sum().backward()

    world = World(tp)
    parallel = TensorParallelBlock(block, world, sequence_parallel=sp)
    if sp:
        xs = [c.detach().clone().requires_grad_(True) for c in shard_sequence(x, tp)]
        ws = shard_sequence(w, tp)
    else:
        xs = [x.detach().clone().requires_grad_(True) for _ in range(tp)]
        ws = [w] * tp
    outs = parallel(xs)
    sum((o * wr).sum() for o, wr in zip(outs, ws)).backward()

    full = torch.cat(outs, 1) if sp else outs[0]
    assert close(full, reference)
    if sp:
        assert close(torch.cat([a.grad for a in xs], 1), x.grad)
    else:  # every rank ends with the full input gradient
        assert all(close(a.grad, x.grad) for a in xs)
    shards = parallel.shards
    assert close(torch.cat([s.fc_w.grad for s in shards]), block.mlp.fc.weight.grad)
    assert close(torch.cat([s.out_w.grad for s in shards], 1), block.mlp.out.weight.grad)
    assert close(torch.cat([s.proj_w.grad for s in shards], 1), block.attn.proj.weight.grad)
    # two all-reduce volumes forward, two backward, per rank
    assert world.sent == [layer_bytes_per_rank(batch, seq, 16, tp, bytes_per_element=8)] * tp
    whole = {"ln1.weight": block.ln1.weight, "ln1.bias": block.ln1.bias,
             "ln2.weight": block.ln2.weight, "ln2.bias": block.ln2.bias,
             "proj_b": block.attn.proj.bias, "out_b": block.mlp.out.bias}
    assert set(whole) == set(REPLICATED)
    for name, reference_param in whole.items():
        grads = [s.get_parameter(name).grad for s in shards]
        if sp and tp > 1:  # partial sums over each rank's positions: only their sum is right
            assert close(sum(grads), reference_param.grad)
            assert not close(grads[0], reference_param.grad)
        else:
            assert all(close(g, reference_param.grad) for g in grads)
    before = list(world.sent)
    parallel.reduce_replicated_grads()
    for name, reference_param in whole.items():
        assert all(close(s.get_parameter(name).grad, reference_param.grad) for s in shards), name
    # one all-reduce of the 6 d_model replicated values (8-byte floats) under SP, nothing without
    extra = 2 * (tp - 1) * (6 * 16 * 8) // tp if sp else 0
    assert [a - b for a, b in zip(world.sent, before)] == [extra] * tp


def test_bad_degrees():
    block = Block(CONFIG)
    with pytest.raises(ValueError, match="TP degree 3 does not divide the 4 attention heads"):
        TensorParallelBlock(block, World(3))
    with pytest.raises(ValueError, match="does not divide the sequence length 6"):
        shard_sequence(torch.zeros(1, 6, 16), 4)
    with pytest.raises(ValueError, match="3 inputs for TP degree 2"):
        TensorParallelBlock(block, World(2))([torch.zeros(1, 4, 16)] * 3)
    # inputs the block cannot read: named, not layer_norm's or an unpacking error
    two = TensorParallelBlock(block, World(2))
    for xs, said in (([torch.zeros(1, 4, 8)] * 2, "(batch, seq, d_model=16)"),
                     ([torch.zeros(4, 16)] * 2, "got torch.float32 (4, 16)"),
                     ([torch.zeros(1, 4, 16, dtype=torch.float64)] * 2, "torch.float64")):
        with pytest.raises(ValueError) as caught:
            two(xs)
        assert said in str(caught.value), str(caught.value)
    for tp, said in ((0, "tp=0 must be a positive integer"), (2.0, "tp=2.0 must be")):
        with pytest.raises(ValueError, match=said):
            shard_sequence(torch.zeros(1, 4, 16), tp)
    with pytest.raises(ValueError, match=r"x must be \(batch, seq, d\); got \(4,\)"):
        shard_sequence(torch.zeros(4), 2)
