"""One strategy set up on one rank: its model, data and optimizer, one training step, the
gradients and parameters as full tensors."""

from __future__ import annotations

import torch
from torch import Tensor

from rlm_course.distributed.launch import RankContext
from rlm_course.lm.model import TinyGPT
from rlm_course.distributed.strategies.setup import (PIPELINES, Setup, make_model, make_tokens,
                                                     lm_loss, make_optimizer)
from rlm_course.distributed.strategies.tensor_parallel import (tp_ready, from_head_major,
                                                               parallelize_tinygpt,
                                                               reduce_partial_grads)
from rlm_course.distributed.strategies.pipeline import (PipelinePart, stage_ids)


class StrategyRun:
    """A strategy set up on this rank: :meth:`step` trains one step and returns this rank's loss
    (or None), :meth:`grads` / :meth:`params` give the full tensors by the model's parameter
    names (this rank's stages only, for pipelines)."""

    def __init__(self, name: str, ctx: RankContext, setup: Setup) -> None:
        self.name, self.ctx, self.setup = name, ctx, setup
        p, rank, device = ctx.world_size, ctx.rank, ctx.device
        setup.check(name, p)
        self.config = setup.config
        model = make_model(setup).to(device)
        tokens = make_tokens(setup).to(device)
        self.x, self.y = tokens[:, :-1], tokens[:, 1:]
        self.model = model
        if name in ("ddp", "fsdp2"):
            rows = slice(rank * setup.batch // p, (rank + 1) * setup.batch // p)
            self.x, self.y = self.x[rows], self.y[rows]
        if name == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.module = DDP(model)
            self.optimizer = make_optimizer(model.parameters(), setup)
        elif name == "fsdp2":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh(device.type, (p,))
            for block in model.blocks:
                fully_shard(block, mesh=mesh, reshard_after_forward=True)
            fully_shard(model, mesh=mesh, reshard_after_forward=True)
            self.module = model
            self.optimizer = make_optimizer(model.parameters(), setup)
        elif name in ("tp", "tp_sp"):
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh(device.type, (p,))
            self.model = model = parallelize_tinygpt(tp_ready(model), mesh, name == "tp_sp")
            self.module = model
            self.optimizer = make_optimizer(model.parameters(), setup, foreach=False)
        else:
            self._pipeline(model)

    def _pipeline(self, model: TinyGPT) -> None:
        from torch.distributed import pipelining as pp

        setup, p, rank = self.setup, self.ctx.world_size, self.ctx.rank
        per_rank = PIPELINES[self.name][1]
        n_stages = p * per_rank
        per = setup.n_layer // n_stages
        self.stages = []
        for j in stage_ids(self.name, rank, p):
            part = PipelinePart(model, j * per, (j + 1) * per, j == 0, j == n_stages - 1)
            self.stages.append(pp.PipelineStage(part, j, n_stages, self.ctx.device))
        cls = {"pp_gpipe": pp.ScheduleGPipe, "pp_1f1b": pp.Schedule1F1B,
               "pp_interleaved": pp.ScheduleInterleaved1F1B,
               "pp_zero_bubble": pp.ScheduleInterleavedZeroBubble}[self.name]
        self.schedule = cls(self.stages if per_rank > 1 else self.stages[0],
                            n_microbatches=setup.micro_batches, loss_fn=lm_loss)
        owned = {id(q) for s in self.stages for q in s.submod.parameters()}
        self.owned = {n for n, q in model.named_parameters() if id(q) in owned}
        self.optimizer = make_optimizer([q for s in self.stages for q in s.submod.parameters()],
                                    setup)

    def step(self, before_update=None) -> float | None:
        """One training step; ``before_update()`` runs between backward and the optimizer (e.g. to
        read the gradients). Returns this rank's loss (its shard's for DDP/FSDP2, the whole
        batch's for TP, the mean of the micro-batches' on the last pipeline stage, else None)."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.name in PIPELINES:
            losses: list[Tensor] = []
            first = any(s.is_first for s in self.stages)
            last = any(s.is_last for s in self.stages)
            kwargs = {"target": self.y, "losses": losses} if last else {}
            self.schedule.step(*((self.x,) if first else ()), **kwargs)
            loss = torch.stack(losses).mean().item() if last else None
        else:
            out = lm_loss(self.module(self.x), self.y)
            out.backward()
            loss = out.item()
            if self.name == "tp_sp":
                reduce_partial_grads(self.model)
        if before_update is not None:
            before_update()
        self.optimizer.step()
        return loss

    def _full(self, tensors: dict) -> dict:
        from torch.distributed.tensor import DTensor

        out = {}
        for n, t in tensors.items():
            t = t.full_tensor() if isinstance(t, DTensor) else t
            t = t.detach().cpu().clone()
            out[n] = from_head_major(n, t, self.config) if self.name.startswith("tp") else t
        return out

    def grads(self) -> dict:
        named = self.model.named_parameters()
        return self._full({n: q.grad for n, q in named
                           if q.grad is not None and self._mine(n)})

    def params(self) -> dict:
        return self._full({n: q for n, q in self.model.named_parameters() if self._mine(n)})

    def _mine(self, name: str) -> bool:
        return name in self.owned if self.name in PIPELINES else True
