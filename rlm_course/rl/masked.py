"""Statistics over the response tokens of a batch: every per-token tensor of the RL code is
``(batch, R)`` over response positions, with a ``response_mask (batch, R)`` marking real tokens
(padding after ``<eos>`` is False). Used by the advantages, the losses and the critic."""

from __future__ import annotations

from torch import Tensor


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is True (over ``dim``, or over all).

    A row with no True entry gives 0 rather than NaN.
    """
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def masked_whiten(x: Tensor, response_mask: Tensor, eps: float = 1e-6) -> Tensor:
    """Normalise ``x (batch, R)`` to mean 0 and standard deviation 1 over the masked tokens of the
    whole batch (PPO's advantage whitening; verl ``masked_whiten``); 0 outside the mask."""
    mean = masked_mean(x, response_mask)
    std = masked_mean((x - mean) ** 2, response_mask).sqrt()
    return (x - mean) / (std + eps) * response_mask
