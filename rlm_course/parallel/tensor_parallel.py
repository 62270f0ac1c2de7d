"""Megatron tensor parallelism (Shoeybi et al. 2019, arXiv:1909.08053) and sequence parallelism
(Korthikanti et al. 2022, arXiv:2205.05198) of one transformer block, on simulated ranks.

A block's two matmul pairs are split so that each needs one collective per direction:

* MLP: ``fc`` is **column-parallel** (rank ``r`` holds the ``r``-th block of rows of its weight:
  a slice of the hidden units (output features), so GELU stays local), ``out`` is **row-parallel** (rank ``r`` holds the matching
  input columns and produces a partial sum);
* attention: the QKV projection is column-parallel by heads (rank ``r`` computes its own heads
  completely), the output projection row-parallel.

Megatron's two conjugate operators join them: ``f`` is the identity forward and an all-reduce of
the input gradient backward; ``g`` is an all-reduce forward and the identity backward. So each
block costs **two all-reduces forward and two backward** of ``batch x seq x d_model`` activations.
With sequence parallelism the norms and residuals work on sequence shards, ``f`` becomes an
all-gather (backward: reduce-scatter) and ``g`` a reduce-scatter (backward: all-gather): the same
bytes, but activations outside the matmuls are split ``tp`` ways.

Every parameter that is *replicated* on the ranks (not split) sees, under sequence parallelism,
only its rank's positions, so its gradient on each rank is a partial sum: the layer norms' weights
and biases and the biases of the two row-parallel layers (added after the reduction), the
parameters named in :data:`REPLICATED`. Megatron all-reduces them over the TP group once per step
before the optimizer (:meth:`TensorParallelBlock.reduce_replicated_grads`, counted here); without
sequence parallelism every rank sees every position and they are already equal.

The collectives are autograd functions that call :class:`~rlm_course.parallel.world.World`, so the
backward pass communicates (and is counted) too.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlm_course.lm.model import Block
from rlm_course.parallel.world import World


class _F(torch.autograd.Function):
    """Megatron's ``f``: the identity on each rank's input; backward all-reduces the gradients
    (each rank's column-parallel shard sees only part of the input's gradient)."""

    @staticmethod
    def forward(ctx, world, ranks, *xs):
        ctx.world, ctx.ranks = world, ranks
        return tuple(x.clone() for x in xs)

    @staticmethod
    def backward(ctx, *grads):
        total = ctx.world.all_reduce([g.contiguous() for g in grads], ctx.ranks,
                                     name="all-reduce (f, backward)")
        return (None, None, *total)


class _G(torch.autograd.Function):
    """Megatron's ``g``: all-reduce of the partial outputs; backward is the identity per rank."""

    @staticmethod
    def forward(ctx, world, ranks, *partials):
        ctx.n = len(partials)
        total = world.all_reduce([p.contiguous() for p in partials], ranks,
                                 name="all-reduce (g, forward)")
        return tuple(total)

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *grads)


class _AllGatherSeq(torch.autograd.Function):
    """Sequence parallelism's ``f``: all-gather sequence shards; backward reduce-scatters."""

    @staticmethod
    def forward(ctx, world, ranks, *shards):
        ctx.world, ctx.ranks, ctx.shape = world, ranks, shards[0].shape
        flat = world.all_gather([s.transpose(0, 1).contiguous().reshape(-1) for s in shards],
                                ranks, name="all-gather (SP f, forward)")
        b, s, d = shards[0].shape
        full = flat[0].view(len(ranks) * s, b, d).transpose(0, 1)
        return tuple(full.clone() for _ in ranks)

    @staticmethod
    def backward(ctx, *grads):
        b, s, d = ctx.shape
        parts = ctx.world.reduce_scatter([g.transpose(0, 1).contiguous().reshape(-1) for g in grads],
                                         ctx.ranks, name="reduce-scatter (SP f, backward)")
        return (None, None, *(p.view(s, b, d).transpose(0, 1) for p in parts))


class _ReduceScatterSeq(torch.autograd.Function):
    """Sequence parallelism's ``g``: sum the partial outputs and keep one sequence shard per
    rank; backward all-gathers."""

    @staticmethod
    def forward(ctx, world, ranks, *partials):
        ctx.world, ctx.ranks = world, ranks
        b, s, d = partials[0].shape
        ctx.shape = (b, s, d)
        parts = world.reduce_scatter([p.transpose(0, 1).contiguous().reshape(-1) for p in partials],
                                     ranks, name="reduce-scatter (SP g, forward)")
        shard = s // len(ranks)
        return tuple(p.view(shard, b, d).transpose(0, 1) for p in parts)

    @staticmethod
    def backward(ctx, *grads):
        b, s, d = ctx.shape
        flat = ctx.world.all_gather([g.transpose(0, 1).contiguous().reshape(-1) for g in grads],
                                    ctx.ranks, name="all-gather (SP g, backward)")
        full = flat[0].view(s, b, d).transpose(0, 1)
        return (None, None, *(full.clone() for _ in grads))


#: Parameters of a block that every TP rank holds whole (not split); under sequence parallelism
#: their gradients are partial sums over each rank's positions.
REPLICATED = ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "proj_b", "out_b")


class TensorParallelBlock(nn.Module):
    """A :class:`~rlm_course.lm.model.Block` split over ``world.size`` ranks (all of them form the
    TP group). Rank ``r`` owns ``shards[r]``: its heads' QKV rows and output-projection columns,
    its slice of the MLP, and a copy of the layer norms.

    Raises:
        ValueError: if the degree does not divide the heads or the MLP width.
    """

    def __init__(self, block: Block, world: World, sequence_parallel: bool = False) -> None:
        super().__init__()
        tp, attn = world.size, block.attn
        heads, d = attn.n_head, attn.qkv.in_features
        hidden = block.mlp.fc.out_features
        if heads % tp:
            raise ValueError(f"TP degree {tp} does not divide the {heads} attention heads; choose "
                             "a divisor of n_head.")
        if hidden % tp:
            raise ValueError(f"TP degree {tp} does not divide the MLP width {hidden}.")
        self.world, self.tp, self.sp = world, tp, sequence_parallel
        self.heads_per_rank, self.d_head = heads // tp, attn.d_head
        width = self.heads_per_rank * self.d_head
        self.ranks = list(range(tp))
        self.shards = nn.ModuleList()
        for r in range(tp):
            rows = slice(r * width, (r + 1) * width)
            qkv_w = torch.cat([attn.qkv.weight[i * d:(i + 1) * d][rows] for i in range(3)])
            qkv_b = torch.cat([attn.qkv.bias[i * d:(i + 1) * d][rows] for i in range(3)])
            h = slice(r * hidden // tp, (r + 1) * hidden // tp)
            shard = nn.Module()
            shard.ln1 = _copy_norm(block.ln1)
            shard.ln2 = _copy_norm(block.ln2)
            shard.qkv_w = nn.Parameter(qkv_w.detach().clone())
            shard.qkv_b = nn.Parameter(qkv_b.detach().clone())
            shard.proj_w = nn.Parameter(attn.proj.weight[:, rows].detach().clone())
            shard.fc_w = nn.Parameter(block.mlp.fc.weight[h].detach().clone())
            shard.fc_b = nn.Parameter(block.mlp.fc.bias[h].detach().clone())
            shard.out_w = nn.Parameter(block.mlp.out.weight[:, h].detach().clone())
            # row-parallel biases are replicated and added once, after the reduction
            shard.proj_b = nn.Parameter(attn.proj.bias.detach().clone())
            shard.out_b = nn.Parameter(block.mlp.out.bias.detach().clone())
            self.shards.append(shard)

    def _attention(self, shard, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        q, k, v = F.linear(x, shard.qkv_w, shard.qkv_b).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads_per_rank, self.d_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.linear(y.transpose(1, 2).reshape(b, t, -1), shard.proj_w)  # partial sum

    def _mlp(self, shard, x: Tensor) -> Tensor:
        return F.linear(F.gelu(F.linear(x, shard.fc_w, shard.fc_b)), shard.out_w)  # partial sum

    def forward(self, xs: list[Tensor]) -> list[Tensor]:
        """Each rank's input and output, ``(batch, seq, d_model)``: the same full activations on
        every rank (TP), or each rank's sequence shard of ``seq / tp`` positions (TP + SP). Layer
        norms, residuals and the replicated biases run on every rank; only the matmuls are split.

        Raises:
            ValueError: for a wrong number of inputs, or inputs that are not ``(batch, seq,
                d_model)`` tensors of the block's dtype.
        """
        world, ranks, shards = self.world, self.ranks, self.shards
        if len(xs) != self.tp:
            raise ValueError(f"{len(xs)} inputs for TP degree {self.tp}; give one per rank.")
        norm = shards[0].ln1
        width, dtype = norm.normalized_shape[-1], norm.weight.dtype
        for x in xs:
            if not (isinstance(x, Tensor) and x.dim() == 3 and x.shape[-1] == width
                    and x.dtype == dtype):
                raise ValueError(f"each rank's input must be (batch, seq, d_model={width}) of "
                                 f"{dtype}, the block's; got "
                                 f"{getattr(x, 'dtype', type(x).__name__)} "
                                 f"{tuple(getattr(x, 'shape', ()))} (x.to(dtype), or "
                                 "x.unsqueeze(0) for one sequence).")
        if len({tuple(x.shape) for x in xs}) != 1:
            raise ValueError(f"inputs of different shapes {[tuple(x.shape) for x in xs]}: every "
                             "rank holds the same activations (TP) or an equal sequence shard (SP; "
                             "use shard_sequence).")
        enter, leave = (_AllGatherSeq, _ReduceScatterSeq) if self.sp else (_F, _G)
        h = enter.apply(world, ranks, *(s.ln1(x) for s, x in zip(shards, xs)))
        attn = leave.apply(world, ranks, *(self._attention(s, hr) for s, hr in zip(shards, h)))
        x1 = [x + a + s.proj_b for s, x, a in zip(shards, xs, attn)]
        h2 = enter.apply(world, ranks, *(s.ln2(x) for s, x in zip(shards, x1)))
        mlp = leave.apply(world, ranks, *(self._mlp(s, hr) for s, hr in zip(shards, h2)))
        return [x + m + s.out_b for s, x, m in zip(shards, x1, mlp)]

    def reduce_replicated_grads(self) -> None:
        """After the backward pass: all-reduce the gradients of the :data:`REPLICATED`
        parameters over the TP group when sequence parallelism is on (each rank's gradient is then
        a partial sum over its positions), so that every rank holds the whole gradient, as
        Megatron does before the optimizer step; one all-reduce of ``6 d_model`` values. Without
        sequence parallelism it does nothing (the gradients are already whole and equal).

        Raises:
            ValueError: if a replicated parameter has no gradient (call it after ``backward``).
        """
        if not self.sp:
            return
        params = [[s.get_parameter(name) for name in REPLICATED] for s in self.shards]
        if any(p.grad is None for ps in params for p in ps):
            raise ValueError("reduce_replicated_grads: a replicated parameter has no gradient; "
                             "call it after the backward pass.")
        flat = [torch.cat([p.grad.reshape(-1) for p in ps]) for ps in params]
        total = self.world.all_reduce(flat, self.ranks, name="all-reduce (SP replicated grads)")
        for ps, t in zip(params, total):
            offset = 0
            for p in ps:
                p.grad = t[offset:offset + p.numel()].view_as(p).clone()
                offset += p.numel()


def shard_sequence(x: Tensor, tp: int) -> list[Tensor]:
    """Split ``x (batch, seq, d)`` into ``tp`` sequence shards (sequence parallelism's layout).

    Raises:
        ValueError: for ``x`` that is not ``(batch, seq, d)``, or a ``tp`` that is not a positive
            integer dividing the sequence length.
    """
    if not (isinstance(x, Tensor) and x.dim() == 3):
        raise ValueError(f"shard_sequence: x must be (batch, seq, d); got "
                         f"{tuple(getattr(x, 'shape', ()))}.")
    if isinstance(tp, bool) or not (isinstance(tp, int) and tp >= 1):
        raise ValueError(f"shard_sequence: tp={tp!r} must be a positive integer.")
    if x.shape[1] % tp:
        raise ValueError(f"sequence parallelism: degree {tp} does not divide the sequence length "
                         f"{x.shape[1]}; pad the sequence.")
    return list(x.chunk(tp, dim=1))


def row_parallel_linear(world: World, x_shards: list[Tensor], weight_shards: list[Tensor],
                        bias: Tensor | None = None) -> list[Tensor]:
    """A row-parallel linear layer: ``y = x W^T + b`` with ``W (out, in)`` split by columns (its
    input features) over the ranks, and ``x`` split the same way along its last dimension (the
    output of a column-parallel layer). Each rank multiplies its slices, giving a partial sum of
    ``y``; one all-reduce adds them up, then the bias is added once.

    Args:
        x_shards: per rank ``(..., in / p)``; weight_shards: per rank ``(out, in / p)``.

    Returns:
        Every rank's copy of ``y (..., out)``.
    """
    if not len(x_shards) == len(weight_shards) == world.size:
        raise ValueError(f"row_parallel_linear: {len(x_shards)} input and {len(weight_shards)} "
                         f"weight shards for {world.size} ranks; give one of each per rank.")
    # BEGIN SOLUTION: each rank computes its partial product x_r W_r^T; all-reduce the partials; add the bias after the reduction (adding it on every rank would count it p times)
    partials = [x @ w.T for x, w in zip(x_shards, weight_shards)]
    total = world.all_reduce(partials, name="all-reduce (row-parallel)")
    return [y + bias if bias is not None else y for y in total]
    # END SOLUTION


def _copy_norm(norm: nn.LayerNorm) -> nn.LayerNorm:
    return copy.deepcopy(norm)  # same weights, dtype and device


def layer_bytes_per_rank(batch: int, seq: int, d_model: int, tp: int,
                         bytes_per_element: int = 4) -> int:
    """Bytes each rank sends for one block's forward and backward under TP (with or without SP):
    four all-reduce-sized exchanges of the ``batch x seq x d_model`` activations (fp32 by
    default), each ``2 (tp - 1) / tp`` of them (Korthikanti et al. 2022, section 4.2.2)."""
    m = bytes_per_element * batch * seq * d_model
    return 4 * (2 * (tp - 1) * m // tp)
