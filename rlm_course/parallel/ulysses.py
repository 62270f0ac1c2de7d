"""DeepSpeed-Ulysses sequence parallelism (Jacobs et al. 2023, arXiv:2309.14509): attention over a
sequence split on ``p`` ranks, by trading the sequence split for a head split with all-to-alls.

Each rank starts with a contiguous shard of ``s / p`` positions of the queries, keys and values
(all heads), as the layers around attention leave them. Then:

1. **all-to-all** of ``q``, ``k`` and ``v``: rank ``r`` sends rank ``j`` the ``j``-th block of
   heads of its positions, so that afterwards rank ``j`` holds heads block ``j`` for **every**
   position;
2. each rank runs ordinary (causal) attention on its heads over the whole sequence: nothing else
   to merge, attention heads are independent;
3. **all-to-all** of the output back to sequence shards.

Four all-to-alls per layer forward (``q``, ``k``, ``v``, output; four more backward). Each moves
``(p - 1) / p`` of a rank's local tensor, so a rank sends
``(p - 1) / p x (s / p) x d_head x (2 H + 2 H_kv) x bytes`` per layer and sequence: **constant
when ``s`` and ``p`` grow together**, where ring attention (:mod:`~rlm_course.parallel.context_parallel`)
sends ``(p - 1) / p x 2 s d_kv`` per layer, growing with ``s`` whatever ``p``. The price: the
degree must divide the heads (with grouped-query attention, the key/value heads), so Ulysses
stops at ``p = H_kv`` where ring attention does not.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rlm_course.parallel.world import World


def _check(world: World, q: Tensor, k: Tensor, v: Tensor) -> tuple[int, int, int]:
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError("ulysses_attention: q must be (batch, heads, seq, d) and k, v "
                         f"(batch, kv_heads, seq, d) of one shape; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}.")
    b, h, s, d = q.shape
    if k.shape[0] != b or k.shape[2] != s or k.shape[3] != d or h % k.shape[1]:
        raise ValueError(f"ulysses_attention: k and v {tuple(k.shape)} must match q {tuple(q.shape)} "
                         "in batch, sequence and head width, with kv_heads dividing the heads.")
    p = world.size
    if k.shape[1] % p:
        raise ValueError(f"Ulysses degree {p} does not divide the {k.shape[1]} key/value heads "
                         f"(nor, then, all {h} heads' blocks evenly); choose a degree that divides "
                         "the KV heads, or use ring attention (context_parallel), which has no "
                         "such limit.")
    if s % p:
        raise ValueError(f"Ulysses degree {p} does not divide the sequence length {s}; pad it.")
    return p, h, k.shape[1]


def ulysses_attention(world: World, q: Tensor, k: Tensor, v: Tensor,
                      causal: bool = True) -> Tensor:
    """Full attention of ``q`` ``(batch, heads, seq, d)`` over ``k``, ``v``
    ``(batch, kv_heads, seq, d)`` computed by Ulysses on ``world.size`` ranks, each starting from
    a contiguous sequence shard; returns the output ``(batch, heads, seq, d)`` reassembled in
    sequence order. The four all-to-alls are counted on ``world``.

    Raises:
        ValueError: for mismatched shapes, or a degree that does not divide the key/value heads
            or the sequence.
    """
    p, h, h_kv = _check(world, q, k, v)
    gqa = h != h_kv
    shards = [(q.chunk(p, dim=2)[r], k.chunk(p, dim=2)[r], v.chunk(p, dim=2)[r]) for r in range(p)]

    def to_heads(tensors: list[Tensor], name: str) -> list[Tensor]:
        # rank i sends rank j the j-th block of heads of its positions; rank j concatenates what
        # it receives in rank order, i.e. in sequence order
        received = world.all_to_all([list(t.chunk(p, dim=1)) for t in tensors], name=name)
        return [torch.cat(row, dim=2) for row in received]

    q_heads = to_heads([s[0] for s in shards], "all-to-all q (seq -> heads)")
    k_heads = to_heads([s[1] for s in shards], "all-to-all k (seq -> heads)")
    v_heads = to_heads([s[2] for s in shards], "all-to-all v (seq -> heads)")
    outs = [F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal, enable_gqa=gqa)
            for qh, kh, vh in zip(q_heads, k_heads, v_heads)]
    back = world.all_to_all([list(o.chunk(p, dim=2)) for o in outs],
                            name="all-to-all out (heads -> seq)")
    return torch.cat([torch.cat(row, dim=1) for row in back], dim=2)


def ulysses_bytes_per_rank(batch: int, heads: int, seq: int, d_head: int, degree: int,
                           kv_heads: int | None = None, bytes_per_element: int = 4) -> int:
    """Bytes each rank sends in one layer's forward under Ulysses: the four all-to-alls, each
    ``(p - 1) / p`` of the rank's ``batch x (seq / p) x heads x d_head`` shard (``kv_heads`` for
    the keys and values): ``(p - 1) / p x batch x seq / p x d_head x (2 heads + 2 kv_heads)``
    elements (fp32 by default).

    Raises:
        ValueError: for a degree that is not a positive integer dividing the sequence and the
            heads (Ulysses gives each rank whole heads of the whole sequence).
    """
    kv = heads if kv_heads is None else kv_heads
    p = degree
    if isinstance(p, bool) or not (isinstance(p, int) and p >= 1) or seq % p or heads % p:
        raise ValueError(f"ulysses_bytes_per_rank: degree={p!r} must be a positive integer that "
                         f"divides seq={seq} and heads={heads}.")
    local = batch * (seq // p) * d_head * bytes_per_element
    return (p - 1) * local * (2 * heads + 2 * kv) // p
