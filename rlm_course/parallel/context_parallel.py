"""Context parallelism: ring attention (Liu et al. 2023, arXiv:2310.01889) with the online-softmax
merge (Milakov & Gimelshein 2018, arXiv:1805.02867), causal, optionally load-balanced.

The sequence is split over ``p`` ranks. Each rank keeps its queries and passes its keys and values
around a ring: in ``p`` steps every rank sees every key/value block, attends its queries to it
and merges the partial result with what it has, using the log-sum-exp of each partial softmax:

    lse = logaddexp(lse_1, lse_2),   o = exp(lse_1 - lse) o_1 + exp(lse_2 - lse) o_2

which is exactly softmax over the union of the keys. With a causal mask the ranks holding early
positions would idle; the **load-balanced** layout (Megatron-Core CP) cuts the sequence into
``2p`` chunks and gives rank ``r`` chunks ``r`` and ``2p - 1 - r``, so that every rank computes
the same number of query-key pairs. Each rank sends ``p - 1`` key/value blocks per layer.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlm_course.parallel.world import World


def online_softmax_merge(o1: Tensor, lse1: Tensor, o2: Tensor, lse2: Tensor) -> tuple[Tensor, Tensor]:
    """Merge two partial attention results over disjoint key sets.

    Args:
        o1, o2: ``(..., seq, d)`` outputs, each normalised over its own keys.
        lse1, lse2: ``(..., seq)`` log-sum-exp of each part's scores (``-inf``: no keys).

    Returns:
        ``(o, lse)`` over the union of the keys.
    """
    # BEGIN SOLUTION: the new log-sum-exp combines the two; weight each output by exp(its lse minus the new one), treating rows with no keys at all (-inf) as weight 0
    lse = torch.logaddexp(lse1, lse2)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    w1 = torch.where(torch.isinf(lse1), torch.zeros_like(lse1), torch.exp(lse1 - safe))
    w2 = torch.where(torch.isinf(lse2), torch.zeros_like(lse2), torch.exp(lse2 - safe))
    return w1[..., None] * o1 + w2[..., None] * o2, lse
    # END SOLUTION


def block_attention(q: Tensor, k: Tensor, v: Tensor, q_pos: Tensor, k_pos: Tensor,
                    causal: bool = True) -> tuple[Tensor, Tensor, int]:
    """Attention of queries at positions ``q_pos`` to keys at ``k_pos`` (``(batch, heads, n, d)``
    tensors): returns the output, its log-sum-exp and the number of query-key pairs computed."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        allowed = k_pos[None, :] <= q_pos[:, None]
        scores = scores.masked_fill(~allowed, float("-inf"))
        pairs = int(allowed.sum()) * q.shape[0] * q.shape[1]
    else:
        pairs = scores.numel()
    lse = torch.logsumexp(scores, dim=-1)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    probs = torch.exp(scores - safe[..., None])
    return probs @ v, lse, pairs


def layout(seq_len: int, ranks: int, load_balanced: bool) -> list[Tensor]:
    """The positions each rank holds: ``ranks`` contiguous chunks, or (load-balanced) chunks
    ``r`` and ``2 ranks - 1 - r`` of ``2 ranks``.

    Raises:
        ValueError: for sizes that are not positive integers, or a degree that does not divide
            the sequence into equal chunks.
    """
    for name, value in (("seq_len", seq_len), ("ranks", ranks)):
        if isinstance(value, bool) or not (isinstance(value, int) and value >= 1):
            raise ValueError(f"context parallelism: {name}={value!r} must be a positive integer.")
    pieces = 2 * ranks if load_balanced else ranks
    if seq_len % pieces:
        raise ValueError(f"context parallelism: {pieces} chunks ({'2 x ' if load_balanced else ''}"
                         f"degree {ranks}) do not divide the sequence length {seq_len}; pad it.")
    chunk = seq_len // pieces
    ids = torch.arange(seq_len)
    if not load_balanced:
        return [ids[r * chunk:(r + 1) * chunk] for r in range(ranks)]
    return [torch.cat([ids[r * chunk:(r + 1) * chunk],
                       ids[(pieces - 1 - r) * chunk:(pieces - r) * chunk]]) for r in range(ranks)]


def ring_attention(world: World, q: Tensor, k: Tensor, v: Tensor, causal: bool = True,
                   load_balanced: bool = True) -> tuple[Tensor, list[int]]:
    """Full attention of ``q, k, v`` (``(batch, heads, seq, d)``) computed by ring attention on
    ``world.size`` ranks; returns the output (reassembled in sequence order) and the query-key
    pairs each rank computed (its work).

    Raises:
        ValueError: if the degree does not divide the sequence.
    """
    if not q.shape == k.shape == v.shape or q.dim() != 4:
        raise ValueError("ring_attention: q, k and v must have the same (batch, heads, seq, d) "
                         f"shape; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}.")
    p = world.size
    positions = layout(q.shape[2], p, load_balanced and causal)
    local_q = [q[:, :, pos] for pos in positions]
    blocks = [(k[:, :, pos], v[:, :, pos], pos) for pos in positions]  # what each rank holds now
    out = [torch.zeros_like(lq) for lq in local_q]
    lse = [lq.new_full(lq.shape[:-1], float("-inf")) for lq in local_q]
    work = [0] * p
    for step in range(p):
        for r in range(p):
            kb, vb, kpos = blocks[r]
            o, l, pairs = block_attention(local_q[r], kb, vb, positions[r], kpos, causal)
            out[r], lse[r] = online_softmax_merge(out[r], lse[r], o, l)
            work[r] += pairs
        if step < p - 1:  # pass the key/value blocks one rank along the ring, all at once
            world.ring_shift([torch.cat([kb.reshape(-1), vb.reshape(-1)]) for kb, vb, _ in blocks],
                             name="ring K/V")
            blocks = [blocks[(r - 1) % p] for r in range(p)]
    full = torch.empty_like(q)
    for r, pos in enumerate(positions):
        full[:, :, pos] = out[r]
    return full, work
