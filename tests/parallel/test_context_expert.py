"""Ring attention equals full causal attention (values and gradients), load balancing evens the
work; expert parallelism equals the single-device MoE and moves the bytes its routing implies."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm_course.numerics import relative_error, reorder_tolerance
from rlm_course.parallel.context_parallel import layout, online_softmax_merge, ring_attention
from rlm_course.parallel.expert_parallel import MoELayer, dispatch_indices, expert_parallel_forward
from rlm_course.parallel.world import World


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.integers(1, 3), st.booleans(), st.booleans())
def test_ring_attention_equals_full_attention(p, chunks, causal, balanced):
    torch.manual_seed(p * 7 + chunks)
    seq = 2 * p * chunks
    # float64: the online softmax adds the keys' contributions block by block (rounding only)
    q, k, v = (torch.randn(2, 2, seq, 4, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    reference = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    world = World(p)
    out, work = ring_attention(world, q, k, v, causal, balanced)
    tol = reorder_tolerance(torch.float64, terms=seq, depth=4)
    assert relative_error(out, reference) <= tol
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    expected = torch.autograd.grad(reference.sum(), (q, k, v))
    assert all(relative_error(a, b) <= tol for a, b in zip(grads, expected))
    kv_block = 2 * 2 * (seq // p) * 4 * 2 * 8  # K and V of one rank's positions, 8-byte floats
    assert world.sent == [(p - 1) * kv_block] * p
    if causal and balanced:
        assert len(set(work)) == 1  # every rank computes the same number of query-key pairs


def test_causal_without_balancing_is_uneven():
    q = k = v = torch.randn(1, 1, 16, 4)
    _, work = ring_attention(World(4), q, k, v, causal=True, load_balanced=False)
    assert work == sorted(work) and work[-1] > 5 * work[0]
    assert [p.tolist() for p in layout(8, 2, True)] == [[0, 1, 6, 7], [2, 3, 4, 5]]


def test_online_softmax_merge_hand_example():
    # keys split in two halves: softmax over [0, ln 3] merged = weights 1/4, 3/4
    o1, l1 = torch.tensor([[2.0]]), torch.tensor([0.0])
    o2, l2 = torch.tensor([[6.0]]), torch.log(torch.tensor([3.0]))
    o, lse = online_softmax_merge(o1, l1, o2, l2)
    assert torch.allclose(o, torch.tensor([[0.25 * 2 + 0.75 * 6]]))
    assert torch.allclose(lse, torch.log(torch.tensor([4.0])))
    empty = torch.tensor([float("-inf")])
    o, lse = online_softmax_merge(torch.zeros(1, 1), empty, o2, l2)
    assert torch.allclose(o, o2) and not torch.isnan(o).any()


def test_dispatch_indices_hand_example():
    ids = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0]])
    assert dispatch_indices(ids, 3, 2).tolist() == [[0, 0], [1, 0], [-1, 1], [-1, -1]]


@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_expert_parallel_equals_the_single_device_layer(p):
    # float64: gradients of shared weights sum over the tokens in another order
    torch.manual_seed(p)
    layer = MoELayer(8, 16, 8, k=2, capacity_factor=1.0).double()
    groups = [torch.randn(12, 8, dtype=torch.float64) for _ in range(p)]
    world = World(p)
    out, stats = expert_parallel_forward(world, layer, groups)
    reference = layer(groups)
    tol = reorder_tolerance(torch.float64, terms=12 * p, depth=4)
    assert all(relative_error(a, b) <= tol for a, b in zip(out, reference))
    params = [layer.router.weight, layer.experts[0][0].weight, layer.experts[7][2].bias]
    grads = torch.autograd.grad(sum((o ** 2).sum() for o in out), params, allow_unused=True)
    expected = torch.autograd.grad(sum((o ** 2).sum() for o in reference), params,
                                   allow_unused=True)
    for a, b in zip(grads, expected):
        assert (a is None and b is None) or relative_error(a, b) <= tol
    # bytes: each kept (token, expert) pair whose expert lives on another rank crosses twice
    per_rank = 8 // p
    for i, x in enumerate(groups):
        ids, _, slots = layer.route(x)
        away = ((slots >= 0) & (ids // per_rank != i)).sum().item()
        back = sum(((layer.route(groups[j])[2] >= 0) & (layer.route(groups[j])[0] // per_rank == i))
                   .sum().item() for j in range(p) if j != i)
        assert world.sent[i] == 8 * 8 * (away + back)  # d_model 8, 8-byte floats
    assert stats["dropped"] == sum(int((layer.route(x)[2] < 0).sum()) for x in groups)
    assert stats["imbalance"] >= 1.0


def test_bad_expert_parallel_degree():
    with pytest.raises(ValueError, match="EP degree 3 does not divide the 8 experts"):
        expert_parallel_forward(World(3), MoELayer(4, 8, 8), [torch.zeros(2, 4)] * 3)
    with pytest.raises(ValueError, match="k=9"):
        MoELayer(4, 8, 8, k=9)
    with pytest.raises(ValueError, match="do not divide the sequence length 10"):
        ring_attention(World(4), *(torch.zeros(1, 1, 10, 2),) * 3)


def test_ring_steps_run_in_parallel_and_top1_routing_trains_the_router():
    from rlm_course.cost.comm import Link

    q = torch.randn(1, 1, 8, 4)
    world = World(4, Link(alpha=1e-3, beta=1e6))
    ring_attention(world, q, q, q, causal=True, load_balanced=True)
    block = 2 * 1 * 2 * 4 * 4  # K and V of 2 positions, 4 floats each
    assert world.clock == [pytest.approx(3 * (1e-3 + block / 1e6))] * 4  # p - 1 ring steps
    layer = MoELayer(8, 16, 4, k=1)
    out = layer([torch.randn(16, 8)])[0]
    (grad,) = torch.autograd.grad((out ** 2).sum(), [layer.router.weight])
    assert grad.abs().sum() > 1e-3  # top-1 keeps its probability as the gate (Switch)


def test_all_to_all_time_counts_what_the_busiest_rank_receives():
    from rlm_course.cost.comm import Link

    world = World(4, Link(alpha=0.0, beta=1.0))
    chunks = [[torch.zeros(0)] * 4 for _ in range(4)]
    for i in (1, 2, 3):
        chunks[i][0] = torch.zeros(100)  # three ranks send 400 bytes each to rank 0
    world.all_to_all(chunks)
    assert world.clock[0] == pytest.approx(1200.0)
