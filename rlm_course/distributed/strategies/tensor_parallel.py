"""Tensor (and sequence) parallelism of TinyGPT with DTensor: QKV rows stored head by head,
Megatron's column/row split as a plan, the norms' partial gradients reduced."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlm_course.lm.model import ModelConfig, TinyGPT


def head_major_rows(n_head: int, d_head: int) -> Tensor:
    """Row order that stores a fused QKV weight ``(3 d, d)`` head by head: ``[q_0 k_0 v_0 q_1 ...]``
    (each ``d_head`` rows) instead of ``[q_0 .. q_h, k_0 .., v_0 ..]``, so that a contiguous
    column-wise shard of ``3 d / p`` rows holds whole heads. ``new = old[rows]``."""
    d = n_head * d_head
    return torch.cat([torch.arange(i * d + h * d_head, i * d + (h + 1) * d_head)
                      for h in range(n_head) for i in range(3)])


class HeadParallelAttention(nn.Module):
    """:class:`~rlm_course.lm.model.CausalSelfAttention` with its QKV rows stored head by head
    (:func:`head_major_rows`): the same function, but the number of heads is read from the QKV
    output's width, so the module runs unchanged on a column-parallel shard (``n_head / p`` heads
    per rank). Causal, without padding or KV cache (training on full sequences)."""

    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.d_head = attn.d_head
        rows = head_major_rows(attn.n_head, attn.d_head)
        self.qkv = copy.deepcopy(attn.qkv)
        self.proj = copy.deepcopy(attn.proj)
        with torch.no_grad():
            self.qkv.weight.copy_(attn.qkv.weight[rows])
            self.qkv.bias.copy_(attn.qkv.bias[rows])

    def forward(self, x: Tensor, attn_mask=None, cache=None) -> Tensor:
        if attn_mask is not None or cache is not None:
            raise ValueError("HeadParallelAttention trains on full causal sequences: no padding "
                             "mask or KV cache.")
        b, t, _ = x.shape
        qkv = self.qkv(x)
        heads = qkv.shape[-1] // (3 * self.d_head)
        q, k, v = qkv.view(b, t, heads, 3, self.d_head).permute(3, 0, 2, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, heads * self.d_head))


def tp_ready(model: TinyGPT) -> TinyGPT:
    """A copy of ``model`` whose attention modules store QKV head by head (same function)."""
    model = copy.deepcopy(model)
    for block in model.blocks:
        block.attn = HeadParallelAttention(block.attn)
    return model


def from_head_major(name: str, tensor: Tensor, config: ModelConfig) -> Tensor:
    """Undo :func:`head_major_rows` on a QKV weight or bias (by name); other tensors unchanged."""
    if name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
        rows = head_major_rows(config.n_head, config.d_head)
        out = torch.empty_like(tensor)
        out[rows] = tensor
        return out
    return tensor


def tensor_parallel_plan(sequence_parallel: bool) -> dict:
    """DTensor's plan for one block (Megatron's column/row split; with sequence parallelism the
    norms shard the sequence and the row-wise layers reduce-scatter it)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    if not sequence_parallel:
        return {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                "mlp.fc": ColwiseParallel(), "mlp.out": RowwiseParallel()}
    return {"ln1": SequenceParallel(), "ln2": SequenceParallel(),
            "attn.qkv": ColwiseParallel(input_layouts=Shard(1)),
            "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
            "mlp.fc": ColwiseParallel(input_layouts=Shard(1)),
            "mlp.out": RowwiseParallel(output_layouts=Shard(1))}


def parallelize_tinygpt(model: TinyGPT, mesh, sequence_parallel: bool = False) -> TinyGPT:
    """Apply :func:`tensor_parallel_plan` to every block of a :func:`tp_ready` model (in place);
    with sequence parallelism, the first block's input enters the sequence layout (its backward
    all-gathers the gradient) and the last block's output leaves it (an all-gather)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        PrepareModuleOutput,
        parallelize_module,
    )

    for block in model.blocks:
        parallelize_module(block, mesh, tensor_parallel_plan(sequence_parallel))
    if sequence_parallel:
        parallelize_module(model.blocks[0], mesh, PrepareModuleInput(
            input_layouts=(Replicate(), None, None), desired_input_layouts=(Shard(1), None, None),
            use_local_output=True))
        parallelize_module(model.blocks[-1], mesh, PrepareModuleOutput(
            output_layouts=Shard(1), desired_output_layouts=Replicate(), use_local_output=True))
    return model


def reduce_partial_grads(model: nn.Module) -> None:
    """All-reduce the gradients that DTensor left as partial sums (sequence parallelism: the
    replicated norms see only their rank's positions), so that every rank holds the whole
    gradient before the optimizer step, as Megatron does."""
    from torch.distributed.tensor import DTensor, Replicate

    for p in model.parameters():
        g = p.grad
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            p.grad = g.redistribute(g.device_mesh, [Replicate()] * len(g.placements))
