"""Data parallelism and ZeRO stages 1-3 on simulated ranks, with a textbook Adam on flat vectors.

Every rank holds the same model and trains on its own slice of the batch; the ranks then agree on
the mean gradient. What each ZeRO stage shards (Rajbhandari et al. 2019, arXiv:1910.02054, section
5) and what it communicates per step, for ``P`` parameters of 4 bytes (fp32; 8 in float64, the
element size of the model's parameters is used throughout) on ``N`` ranks:

    stage  holds per rank                            communicates per step (each rank sends)
    0 (DP) params P, grads P, Adam states 2P         all-reduce of the grads: 2 (N-1)/N x 4P bytes
    1      params P, grads P, Adam states 2P/N       reduce-scatter grads + all-gather params: same
    2      params P, grads P/N, Adam states 2P/N     the same (the full gradient is freed after the
                                                     reduce-scatter)
    3      params P/N, grads P/N, Adam states 2P/N   all-gather params for the forward and again for
                                                     the backward, reduce-scatter grads:
                                                     3 (N-1)/N x 4P bytes (1.5x DP)

The flat parameter vector is padded with zeros to a multiple of ``N`` so that it shards evenly.
Stages 1 and 2 take their optimizer step with :func:`zero1_step` (chapter 07's exercise).
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from rlm_course.cost.anatomy import ZERO_STAGES
from rlm_course.parallel.world import World

FP32 = 4


def flat_params(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def set_flat_params(model: nn.Module, flat: Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def flat_grads(model: nn.Module) -> Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in model.parameters()])


def adam_update(params: Tensor, grads: Tensor, m: Tensor, v: Tensor, step: int, lr: float,
                betas=(0.9, 0.999), eps: float = 1e-8) -> Tensor:
    """Adam (Kingma & Ba 2015, Algorithm 1) on flat vectors; updates ``m``, ``v`` in place and
    returns the new parameters. ``step`` counts from 1 (the bias corrections divide by
    ``1 - beta ** step``).

    Raises:
        ValueError: for a ``step`` that is not a positive integer.
    """
    if isinstance(step, bool) or not (isinstance(step, int) and step >= 1):
        raise ValueError(f"adam_update: step={step!r} must be a positive integer: Adam counts its "
                         "steps from 1 (at 0 the bias correction divides by zero).")
    b1, b2 = betas
    m.mul_(b1).add_(grads, alpha=1 - b1)
    v.mul_(b2).addcmul_(grads, grads, value=1 - b2)
    m_hat = m / (1 - b1 ** step)
    v_hat = v / (1 - b2 ** step)
    return params - lr * m_hat / (v_hat.sqrt() + eps)


def zero1_step(world: World, grads: list[Tensor], param_shards: list[Tensor], m: list[Tensor],
               v: list[Tensor], step: int, lr: float) -> list[Tensor]:
    """The optimizer step of ZeRO-1 (and ZeRO-2) on ``p = world.size`` ranks (Rajbhandari et al.
    2019, arXiv:1910.02054, section 5.1): each rank keeps the Adam moments of one ``1/p`` shard of
    the parameters only.

    1. **reduce-scatter** the gradients: rank ``r`` receives the sum over ranks of shard ``r``;
    2. **shard update**: rank ``r`` runs Adam (:func:`adam_update`) on its parameter shard with that
       gradient shard and its own moments;
    3. **all-gather** the updated shards, so that every rank holds all the new parameters again.

    A reduce-scatter followed by an all-gather moves exactly the bytes of one ring all-reduce,
    ``2 (p - 1) / p x`` the parameter bytes per rank, so ZeRO-1 costs plain data parallelism's
    traffic while holding ``1/p`` of the optimizer states.

    Args:
        world: the ``p`` simulated ranks (their byte counters record the two collectives).
        grads: ``p`` flat gradients of ``n`` elements each (``n`` a multiple of ``p``; rank ``r``'s
            local gradient, already divided by ``p`` so that their sum is the mean gradient).
        param_shards: ``p`` tensors of ``n / p`` elements: rank ``r``'s shard of the current
            parameters (elements ``r n/p .. (r+1) n/p - 1``).
        m, v: ``p`` tensors of ``n / p`` elements: rank ``r``'s Adam moments, updated in place.
        step: Adam's step number (1-based); lr: learning rate.

    Returns:
        ``p`` tensors of ``n`` elements: the updated full parameter vector on every rank (the
        same values on all).

    Raises:
        ValueError: from the collectives, if the lists do not have one tensor per rank or ``n``
            does not split into ``p`` equal shards.
    """
    # BEGIN SOLUTION: reduce-scatter the gradients (world.reduce_scatter), update each rank's shard with adam_update and its own m[r], v[r], then all-gather the new shards (world.all_gather)
    shards = world.reduce_scatter(grads, name="reduce-scatter grads")
    updated = []
    for r in range(world.size):  # each rank, on its own shard only
        updated.append(adam_update(param_shards[r], shards[r], m[r], v[r], step, lr))
    return world.all_gather(updated, name="all-gather params")
    # END SOLUTION


class DataParallel:
    """``world.size`` replicas of ``model`` trained with ZeRO ``stage`` (0: plain DP).

    Args:
        loss_fn: ``loss_fn(model, batch) -> scalar``, the mean loss of a rank's slice.

    Raises:
        ValueError: for an unknown stage.
    """

    def __init__(self, world: World, model: nn.Module, stage: int = 0, lr: float = 1e-3) -> None:
        if isinstance(stage, bool) or stage not in ZERO_STAGES:
            raise ValueError(f"ZeRO stage={stage!r}: choose 0 (plain DP), 1, 2 or 3.")
        self.world, self.stage, self.lr, self.step_count = world, stage, lr, 0
        n = world.size
        self.replicas = [copy.deepcopy(model) for _ in range(n)]
        self.numel = flat_params(model).numel()
        self.padded = -(-self.numel // n) * n
        self.shard = self.padded // n
        full = self._pad(flat_params(model))
        self.bytes_per_element = full.element_size()
        sharded_states = stage >= 1
        size = self.shard if sharded_states else self.padded
        self.m = [full.new_zeros(size) for _ in range(n)]
        self.v = [full.new_zeros(size) for _ in range(n)]
        # stage 3 keeps only its parameter shard between steps
        self.param_shards = [full[r * self.shard:(r + 1) * self.shard].clone() for r in range(n)]

    def _pad(self, flat: Tensor) -> Tensor:
        return torch.cat([flat, flat.new_zeros(self.padded - self.numel)])

    def memory_per_rank(self) -> dict[str, int]:
        """Bytes of persistent model state one rank holds between steps (in the parameters' dtype,
        4 bytes per element in fp32): the parameters it
        keeps (stage 3: its shard; the simulation rebuilds full replicas only to compute), the
        Adam moments it holds (measured on its tensors), and the gradients its stage keeps after
        the step's reduce-scatter (the full vector for stages 0-1, a shard for 2-3)."""
        n, p = self.world.size, self.padded
        params = self.param_shards[0].numel() if self.stage == 3 else p
        grads = p if self.stage < 2 else p // n
        size = self.bytes_per_element
        return {"params": size * params, "grads": size * grads,
                "adam": size * (self.m[0].numel() + self.v[0].numel())}

    def step(self, batches: list, loss_fn) -> list[float]:
        """One training step; ``batches[r]`` is rank ``r``'s slice. Returns each rank's loss."""
        world, n = self.world, self.world.size
        if len(batches) != n:
            raise ValueError(f"{len(batches)} batch slices for {n} ranks; give one per rank.")
        sizes = {len(b[0]) if isinstance(b, (tuple, list)) else len(b) for b in batches}
        if len(sizes) != 1:
            raise ValueError(f"batch slices of sizes {sorted(sizes)}: the mean over ranks equals the "
                             "whole batch's mean gradient only for equal slices; split the batch "
                             "evenly (a multiple of the number of ranks).")
        self.step_count += 1
        if self.stage == 3:  # gather the parameters before the forward
            full = world.all_gather(self.param_shards, name="all-gather params (forward)")
            for model, flat in zip(self.replicas, full):
                set_flat_params(model, flat[:self.numel])
        losses, grads = [], []
        for model, batch in zip(self.replicas, batches):
            model.zero_grad(set_to_none=True)
            loss = loss_fn(model, batch)
            loss.backward()
            losses.append(loss.item())
            grads.append(self._pad(flat_grads(model)) / n)  # the mean over ranks
        if self.stage == 3:  # ZeRO-3 gathers the parameters again for the backward pass
            world.all_gather(self.param_shards, name="all-gather params (backward)")
        if self.stage == 0:
            mean = world.all_reduce(grads, name="all-reduce grads")
            for r, model in enumerate(self.replicas):
                params = self._pad(flat_params(model))
                new = adam_update(params, mean[r], self.m[r], self.v[r], self.step_count, self.lr)
                set_flat_params(model, new[:self.numel])
            return losses
        if self.stage < 3:  # stages 1-2: reduce-scatter, shard update, all-gather at once
            for r in range(n):
                full = self._pad(flat_params(self.replicas[r]))
                self.param_shards[r] = full[r * self.shard:(r + 1) * self.shard].clone()
            full = zero1_step(world, grads, self.param_shards, self.m, self.v, self.step_count,
                              self.lr)
            for r, (model, flat) in enumerate(zip(self.replicas, full)):
                self.param_shards[r] = flat[r * self.shard:(r + 1) * self.shard].clone()
                set_flat_params(model, flat[:self.numel])
            return losses
        shards = world.reduce_scatter(grads, name="reduce-scatter grads")
        for r in range(n):  # stage 3 keeps only its updated shard until the next forward
            self.param_shards[r] = adam_update(self.param_shards[r], shards[r], self.m[r],
                                               self.v[r], self.step_count, self.lr)
        return losses

    def parameters(self, rank: int = 0) -> Tensor:
        """Rank ``rank``'s current flat parameters (gathered from the shards for stage 3).

        Raises:
            ValueError: for a rank outside the world.
        """
        if isinstance(rank, bool) or not (isinstance(rank, int) and 0 <= rank < self.world.size):
            raise ValueError(f"rank={rank!r} is not in 0..{self.world.size - 1}.")
        if self.stage == 3:
            return torch.cat(self.param_shards)[:self.numel]
        return flat_params(self.replicas[rank])


def bytes_sent_per_step(stage: int, numel_padded: int, ranks: int,
                        bytes_per_element: int = FP32) -> int:
    """What the table of the module docstring says each rank sends in one step (fp32 by
    default).

    Raises:
        ValueError: for a stage other than 0-3 or a rank count that is not a positive integer.
    """
    if stage not in (0, 1, 2, 3) or isinstance(stage, bool):
        raise ValueError(f"stage={stage!r}: choose a ZeRO stage, 0 (plain DP), 1, 2 or 3.")
    if isinstance(ranks, bool) or not (isinstance(ranks, int) and ranks >= 1):
        raise ValueError(f"ranks={ranks!r} must be a positive integer.")
    m = bytes_per_element * numel_padded
    per_collective = (ranks - 1) * m // ranks
    return (3 if stage == 3 else 2) * per_collective
