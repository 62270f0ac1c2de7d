"""Statistics over the response tokens of a batch: every per-token tensor of the RL code is
``(batch, R)`` over response positions, with a ``response_mask (batch, R)`` marking real tokens
(padding after ``<eos>`` is False). Used by the advantages, the losses and the critic."""

from __future__ import annotations

import torch
from torch import Tensor


def check_same_shape(x: Tensor, mask: Tensor, where: str, x_name: str = "values",
                     mask_name: str = "response_mask") -> None:
    """Refuse a mask whose shape is not its values' (a ``(batch,)`` or ``(batch, 1)`` mask would
    broadcast over the wrong axis and count rows as tokens).

    Raises:
        ValueError: naming ``where``, both tensors and their shapes.
    """
    if tuple(x.shape) != tuple(mask.shape):
        raise ValueError(f"{where}: {x_name} {tuple(x.shape)} and {mask_name} "
                         f"{tuple(mask.shape)} must have one shape, (batch, R) over the response "
                         "tokens.")


def check_tensors(where: str, **tensors: Tensor) -> None:
    """Refuse what is not a torch tensor (a numpy array or a list has no ``.bool()``, and its
    arithmetic with a tensor gives numpy's or torch's rules by the order of the operands).

    Raises:
        ValueError: naming ``where``, the argument and its type.
    """
    for name, t in tensors.items():
        if not isinstance(t, Tensor):
            raise ValueError(f"{where}: {name} is a {type(t).__name__}; give a torch tensor "
                             f"(torch.as_tensor({name})).")


def check_floats(where: str, **tensors: Tensor) -> None:
    """Refuse a tensor of integers or bools where floats belong (integer values or log-probs
    would truncate every result), and floats of different precisions (the result would take one
    and silently drop the other's).

    Raises:
        ValueError: naming ``where``, the tensor and its dtype.
    """
    check_tensors(where, **tensors)
    dtypes = {}
    for name, t in tensors.items():
        if not t.is_floating_point():
            raise ValueError(f"{where}: {name} of dtype {t.dtype}; give floats ({name}.float()).")
        dtypes[name] = t.dtype
    if len(set(dtypes.values())) > 1:
        raise ValueError(f"{where}: " + ", ".join(f"{n} {d}" for n, d in dtypes.items())
                         + "; give them one float dtype.")


def check_mask(mask: Tensor, where: str, mask_name: str = "response_mask") -> None:
    """Refuse a mask that is not of 0s and 1s (a sum of two masks, a weight): positions are
    selected by ``mask != 0`` but counted by its values, so a 2 or a 0.5 would change each
    reduction differently.

    Raises:
        ValueError: naming ``where``, the mask and a value it holds.
    """
    if mask.dtype != torch.bool:
        bad = (mask != 0) & (mask != 1)
        if bool(bad.any()):
            raise ValueError(f"{where}: {mask_name} holds {mask[bad].flatten()[0].item()!r}; a "
                             "mask marks each position 1 (counted) or 0 (not): give a bool or "
                             "0/1 tensor (e.g. mask > 0).")


def zero_padding(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` where ``mask`` is True, 0 elsewhere: a NaN or inf at a padded position stays out
    (multiplying by the mask would give NaN, since ``inf x 0`` is NaN)."""
    return torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is True (over ``dim``, or over all); values
    at the other positions, even NaN, do not count.

    A row with no True entry gives 0 rather than NaN.

    Raises:
        ValueError: for ``x`` or ``mask`` that is not a tensor, a mask of another shape than
            ``x``, or with values other than 0 and 1.
    """
    check_tensors("masked_mean", values=x, response_mask=mask)
    check_same_shape(x, mask, "masked_mean")
    check_mask(mask, "masked_mean")
    kept, mask = zero_padding(x, mask), mask.to(x.dtype)
    if dim is None:
        return kept.sum() / mask.sum().clamp(min=1.0)
    return kept.sum(dim) / mask.sum(dim).clamp(min=1.0)


def masked_whiten(x: Tensor, response_mask: Tensor, eps: float = 1e-6) -> Tensor:
    """Normalise ``x (batch, R)`` to mean 0 and standard deviation 1 over the masked tokens of the
    whole batch (PPO's advantage whitening); 0 outside the mask. The standard deviation is the
    population one (divided by the ``n`` masked tokens) plus ``eps``; verl's ``masked_whiten``
    divides the variance by ``n - 1`` and adds 1e-8 to it, a relative difference of ``1 / (2n)``
    (0.2% at 256 tokens), and refuses a single token, which here whitens to 0.

    Equal values (a batch whose every response earned the same reward, each token's return that
    reward) whiten to exactly 0: they carry no signal, and their float mean can be one ulp off
    (seven 0.1s average to ``0.1 + 7e-9`` in float32), which the near-zero standard deviation
    would blow up to -0.0074 on every token, as
    :func:`rlm_course.rl.advantages.constant_groups` says of group baselines.

    A NaN or inf at a padded position stays out of the result and of its gradient (the padding
    is replaced by 0 before any arithmetic: ``0 x NaN`` in the backward pass of a later mask
    would be NaN).

    Raises:
        ValueError: for ``x`` or ``response_mask`` that is not a tensor, a mask of another shape
            than ``x``, or with values other than 0 and 1.
    """
    check_tensors("masked_whiten", values=x, response_mask=response_mask)
    check_same_shape(x, response_mask, "masked_whiten")
    check_mask(response_mask, "masked_whiten")
    kept = x[response_mask != 0]
    if kept.numel() and bool((kept == kept[0]).all()):
        return torch.zeros_like(x)
    x = zero_padding(x, response_mask)
    mean = masked_mean(x, response_mask)
    std = masked_mean((x - mean) ** 2, response_mask).sqrt()
    return zero_padding((x - mean) / (std + eps), response_mask)
