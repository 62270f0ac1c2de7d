"""Expert parallelism: a top-k routed mixture-of-experts layer with its experts spread over ranks,
all-to-all dispatch and combine, a capacity factor and dropped tokens (GShard, Lepikhin et al.
2020, arXiv:2006.16668; Switch Transformer, Fedus et al. 2021, arXiv:2101.03961).

Each of ``p`` ranks holds ``n_experts / p`` experts and its own slice of the tokens (a "group" in
GShard's terms). A linear router scores every token against every expert; each token goes to its
``k`` best experts, weighted by their renormalised softmax probabilities. Every expert takes at
most ``capacity = ceil(capacity_factor x group_tokens x k / n_experts)`` tokens from each group;
the rest are **dropped** (that expert contributes nothing for them; a residual connection outside
the layer carries them through). Then:

1. **dispatch**: an all-to-all sends each token's hidden vector to the ranks of its experts;
2. each rank runs its experts on what it received;
3. **combine**: a second all-to-all returns the outputs, which are summed with the gate weights.

The forward pass moves each kept (token, expert) pair's ``d_model`` floats twice (there and back)
unless the expert is on the token's own rank; the load per rank (tokens received) shows the
imbalance the router creates.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from rlm_course.parallel.world import World
from rlm_course.utils import as_int


def dispatch_indices(expert_ids: Tensor, n_experts: int, capacity: int) -> Tensor:
    """Slot of every (token, choice) in its expert's buffer, in token order; ``-1`` when the
    expert is already full (the pair is dropped).

    Priority is by token order, then choice order: a later token's first choice can be dropped
    while an earlier token's second choice is kept (GShard instead serves all first choices before
    any second choice).

    Args:
        expert_ids: ``(tokens, k)`` chosen experts; earlier tokens (then earlier choices) win.

    Returns:
        ``(tokens, k)`` int64 slots in ``[0, capacity)`` or ``-1``.
    """
    # BEGIN SOLUTION: walk the (token, choice) pairs in order, counting how many each expert has taken so far; a pair gets the current count as its slot while it is below capacity
    flat = expert_ids.reshape(-1)
    one_hot = torch.nn.functional.one_hot(flat, n_experts)
    slot = (one_hot.cumsum(0) - 1).gather(1, flat[:, None]).squeeze(1)
    slot = torch.where(slot < capacity, slot, torch.full_like(slot, -1))
    return slot.view_as(expert_ids)
    # END SOLUTION


class MoELayer(nn.Module):
    """A router and ``n_experts`` GELU MLPs of width ``d_ff`` (the single-device reference)."""

    def __init__(self, d_model: int, d_ff: int, n_experts: int, k: int = 2,
                 capacity_factor: float = 1.25) -> None:
        super().__init__()
        d_model, d_ff, n_experts, k = (as_int(v) for v in (d_model, d_ff, n_experts, k))
        for name, value in (("d_model", d_model), ("d_ff", d_ff), ("n_experts", n_experts)):
            if isinstance(value, bool) or not (isinstance(value, int) and value >= 1):
                raise ValueError(f"MoELayer: {name}={value!r} must be a positive integer.")
        if isinstance(k, bool) or not (isinstance(k, int) and 1 <= k <= n_experts):
            raise ValueError(f"k={k!r} experts per token must be an integer in 1..n_experts="
                             f"{n_experts}.")
        if not (math.isfinite(capacity_factor) and capacity_factor > 0):
            raise ValueError(f"capacity_factor={capacity_factor} must be a positive finite number.")
        self.k, self.n_experts, self.capacity_factor = k, n_experts, capacity_factor
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(),
                                                   nn.Linear(d_ff, d_model))
                                     for _ in range(n_experts))

    def capacity(self, tokens: int) -> int:
        """``ceil(capacity_factor x tokens x k / n_experts)`` slots per expert per group.

        Raises:
            ValueError: if ``capacity_factor`` (which may be changed after construction) is not a
                positive finite number.
        """
        if not (math.isfinite(self.capacity_factor) and self.capacity_factor > 0):
            raise ValueError(f"capacity_factor={self.capacity_factor} must be a positive finite "
                             "number.")
        return math.ceil(self.capacity_factor * tokens * self.k / self.n_experts)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``x (tokens, d)`` -> ``(expert_ids (tokens, k), gates (tokens, k), slots (tokens, k))``."""
        if x.dim() != 2:
            raise ValueError(f"MoE input must be (tokens, d_model), got shape {tuple(x.shape)}.")
        probs = torch.softmax(self.router(x), dim=-1)
        gates, expert_ids = probs.topk(self.k, dim=-1)
        if self.k > 1:  # top-k gates renormalised (GShard); top-1 keeps its probability (Switch),
            gates = gates / gates.sum(-1, keepdim=True)  # so that the router still gets gradient
        return expert_ids, gates, dispatch_indices(expert_ids, self.n_experts,
                                                   self.capacity(x.shape[0]))

    def forward(self, groups: list[Tensor]) -> list[Tensor]:
        """Single-device reference: each group ``(tokens, d)`` routed with its own capacity."""
        outs = []
        for x in groups:
            expert_ids, gates, slots = self.route(x)
            y = torch.zeros_like(x)
            for e, expert in enumerate(self.experts):
                token, choice = ((expert_ids == e) & (slots >= 0)).nonzero(as_tuple=True)
                if len(token):
                    y = y.index_add(0, token, gates[token, choice, None] * expert(x[token]))
            outs.append(y)
        return outs


def expert_parallel_forward(world: World, layer: MoELayer,
                            groups: list[Tensor]) -> tuple[list[Tensor], dict]:
    """The same layer with its experts spread over ``world.size`` ranks (rank ``r`` holds experts
    ``r * E/p ... (r+1) * E/p - 1``) and rank ``r``'s tokens in ``groups[r]``.

    Returns:
        ``(outputs per rank, stats)`` with ``stats``: ``received`` (token copies each rank's
        experts processed), ``dropped`` (pairs over capacity), ``imbalance`` (max / mean received).

    Raises:
        ValueError: if the degree does not divide the experts, or the groups are not one per rank.
    """
    p, n_experts = world.size, layer.n_experts
    if n_experts % p:
        raise ValueError(f"EP degree {p} does not divide the {n_experts} experts.")
    if len(groups) != p:
        raise ValueError(f"{len(groups)} token groups for {p} ranks; give one per rank.")
    per_rank = n_experts // p
    routes = [layer.route(x) for x in groups]
    # dispatch: rank i sends rank j the hidden vectors of its kept pairs whose expert lives on j
    send_x, send_meta = [], []
    for i, (x, (expert_ids, gates, slots)) in enumerate(zip(groups, routes)):
        row_x, row_meta = [], []
        for j in range(p):
            keep = (slots >= 0) & (expert_ids // per_rank == j)
            token, choice = keep.nonzero(as_tuple=True)
            row_x.append(x[token])
            row_meta.append((token, choice, expert_ids[token, choice]))
        send_x.append(row_x)
        send_meta.append(row_meta)
    received = world.all_to_all(send_x, name="all-to-all dispatch")
    # each rank runs its experts on every token copy it received
    results = []
    for j in range(p):
        row = []
        for i in range(p):
            xs, experts = received[j][i], send_meta[i][j][2]
            out = torch.zeros_like(xs)
            for e in experts.unique().tolist():
                sel = experts == e
                out[sel] = layer.experts[e](xs[sel])
            row.append(out)
        results.append(row)
    returned = world.all_to_all(results, name="all-to-all combine")
    outputs = []
    for i, (x, (expert_ids, gates, slots)) in enumerate(zip(groups, routes)):
        y = torch.zeros_like(x)
        for j in range(p):
            token, choice, _ = send_meta[i][j]
            if len(token):
                y = y.index_add(0, token, gates[token, choice, None] * returned[i][j])
        outputs.append(y)
    load = [sum(len(received[j][i]) for i in range(p)) for j in range(p)]
    mean = sum(load) / p
    stats = {"received": load, "dropped": sum(int((r[2] < 0).sum()) for r in routes),
             "imbalance": max(load) / mean if mean else 1.0}
    return outputs, stats
