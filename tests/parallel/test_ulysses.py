"""DeepSpeed-Ulysses equals one device's attention; its all-to-alls send what the formula says."""

import pytest
import torch
import torch.nn.functional as F

from rlm_course.numerics import relative_error, reorder_tolerance
from rlm_course.parallel.context_parallel import ring_attention
from rlm_course.parallel.ulysses import ulysses_attention, ulysses_bytes_per_rank
from rlm_course.parallel.world import World


@pytest.mark.parametrize("p", [1, 2, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_ulysses_equals_one_device(p, causal):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 8, 32, 16, dtype=torch.float64) for _ in range(3))
    world = World(p)
    out = ulysses_attention(world, q, k, v, causal=causal)
    reference = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    # each head's attention runs whole on one rank: the same sums, at most reordered
    assert relative_error(out, reference) <= reorder_tolerance(torch.float64, terms=32, depth=2)
    assert world.sent[0] == ulysses_bytes_per_rank(2, 8, 32, 16, p, bytes_per_element=8)
    assert len(world.events) == (4 * p if p > 1 else 0)  # four all-to-alls, one event per rank


def test_ulysses_with_grouped_query_attention():
    torch.manual_seed(1)
    q = torch.randn(1, 8, 16, 4, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 16, 4, dtype=torch.float64) for _ in range(2))
    world = World(2)
    out = ulysses_attention(world, q, k, v)
    reference = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert relative_error(out, reference) <= reorder_tolerance(torch.float64, terms=16, depth=2)
    # q and the output move 8 heads, k and v 2 heads each: (8 + 8 + 2 + 2) x 8 positions x 4
    # values x 8 bytes, half of it to the other rank
    assert world.sent[0] == (2 * 8 + 2 * 2) * 8 * 4 * 8 // 2
    assert world.sent[0] == ulysses_bytes_per_rank(1, 8, 16, 4, 2, kv_heads=2, bytes_per_element=8)


def test_ulysses_stops_at_the_kv_heads_where_ring_attention_does_not():
    q = torch.randn(1, 8, 16, 4)
    k = v = torch.randn(1, 2, 16, 4)
    with pytest.raises(ValueError, match="does not divide the 2 key/value heads"):
        ulysses_attention(World(4), q, k, v)
    with pytest.raises(ValueError, match="does not divide the sequence length 15"):
        ulysses_attention(World(2), q[:, :, :15], k[:, :, :15], v[:, :, :15])


def test_ulysses_bytes_stay_flat_when_sequence_and_degree_grow_together_ring_bytes_grow():
    # s = 16 p: Ulysses sends (p-1)/p x 16 positions' worth per rank, nearly constant; ring
    # attention sends (p-1)/p of the whole sequence's keys and values, growing with s
    ulysses, ring = [], []
    for p in (2, 4, 8):
        q = torch.randn(1, 8, 16 * p, 4)
        w1, w2 = World(p), World(p)
        ulysses_attention(w1, q, q, q)
        ring_attention(w2, q, q, q, causal=True, load_balanced=True)
        ulysses.append(w1.sent[0])
        ring.append(w2.sent[0])
    assert ulysses == [ulysses_bytes_per_rank(1, 8, 16 * p, 4, p) for p in (2, 4, 8)]
    assert ulysses[-1] < 2 * ulysses[0]  # 1/2 -> 7/8 of a constant shard
    assert ring[-1] > 6 * ring[0]  # (p-1)/p x 2 x 16 p x 8 x 4 x 4 bytes
