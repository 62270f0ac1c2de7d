"""The bytes each rank should send, from the simulators' formulas of chapters 07-09."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlm_course.lm.model import TinyGPT
from rlm_course.distributed.strategies.setup import (PIPELINES, Setup, make_model)


def fsdp_numel(model: nn.Module, p: int) -> int:
    """Elements FSDP2 gathers for ``model`` on ``p`` ranks: every parameter padded along its first
    dimension to a multiple of ``p`` (FSDP2 shards each parameter on dim 0)."""
    total = 0
    for q in model.parameters():
        rows = q.shape[0] if q.dim() else 1
        total += math.ceil(rows / p) * p * (q.numel() // max(rows, 1))
    return total


def predicted_sent(name: str, setup: Setup, p: int) -> list[int]:
    """Bytes each rank sends in one training step, from the course's formulas and simulators
    (see the module docstring), in the setup's dtype.

    Raises:
        ValueError: if the strategy does not fit (see :meth:`Setup.check`).
    """
    from rlm_course.parallel.data_parallel import bytes_sent_per_step
    from rlm_course.parallel.tensor_parallel import layer_bytes_per_rank

    setup.check(name, p)
    e = torch.empty(0, dtype=setup.torch_dtype).element_size()
    model = make_model(setup)
    if name == "ddp":
        return [bytes_sent_per_step(0, model.num_parameters(), p, e)] * p
    if name == "fsdp2":
        return [bytes_sent_per_step(3, fsdp_numel(model, p), p, e)] * p
    b, t, d = setup.batch, setup.seq_len, setup.d_model
    if name in ("tp", "tp_sp"):
        per_block = layer_bytes_per_rank(b, t, d, p, e)
        if name == "tp" or p == 1:
            return [setup.n_layer * per_block] * p
        norms = 2 * (p - 1) * (4 * d * e) // p  # all-reduce of ln1/ln2 weight and bias gradients
        boundary = 2 * ((p - 1) * (b * t * d * e) // p)  # enter (backward) and leave (forward)
        return [setup.n_layer * (per_block + norms) + boundary] * p
    return _simulated_pipeline_sent(name, setup, p, model)


def _simulated_pipeline_sent(name: str, setup: Setup, p: int, model: TinyGPT) -> list[int]:
    """Chapter 09's simulator on the same blocks: activations forward and gradients back between
    consecutive virtual stages on different ranks, counted by a :class:`World`."""
    from rlm_course.parallel.pipeline import run_pipeline, schedule_table
    from rlm_course.parallel.world import World

    kind, chunks = PIPELINES[name]
    layers = [_BlockLayer(block) for block in model.blocks]
    m = setup.micro_batches
    g = torch.Generator().manual_seed(0)
    x = torch.randn(setup.batch, setup.seq_len, setup.d_model, generator=g,
                    dtype=setup.torch_dtype)
    micro = [(xb, xb) for xb in x.chunk(m)]
    world = World(p)
    run_pipeline(layers, schedule_table(kind, p, m, chunks), micro, F.mse_loss, world)
    return list(world.sent)


class _BlockLayer(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x, None)
