"""The rollout engine's numerics: a copy of the policy that samples with cheaper arithmetic than
the trainer scores with (chapter 13's rollout/trainer mismatch).

An inference engine (vLLM, SGLang) holds the policy in bf16, often with fp8 weights, and runs its
own kernels; the trainer keeps fp32 master weights. The same weights then give two sets of
log-probs. Here, on a CPU, the cheaper path is one of (:data:`~rlm_course.algorithms.PRECISIONS`):

* ``bf16``: weights *and* activations in bfloat16 (8 significant bits), the engines' default;
  the log-softmax is taken in fp32 from bf16 logits, as engines return log-probs;
* ``fp8``: every matrix (2-D weight: linear layers, the embeddings and the output head) rounded
  to float8 e4m3 with one scale per row (``absmax / 448``, the largest e4m3 value), then computed
  in fp32: the kind of weight error fp8 serving adds, without its speed (a CPU has no fp8 units).
  Coarser than DeepSeek-V3's fp8 recipe, which keeps the embeddings and the output head in
  higher precision and scales blocks of 128 x 128.

Vectors (norms, biases) stay exact in both, as the engines keep them.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from rlm_course.algorithms import PRECISIONS

#: The largest finite float8 e4m3 value (OCP FP8 spec; ``torch.finfo(torch.float8_e4m3fn).max``).
E4M3_MAX = 448.0


def round_to_fp8(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (``(out, in)`` or any 2-D) rounded to float8 e4m3 with one scale per row
    (``absmax / 448``, taken in fp32) and returned dequantized in its own dtype: what an fp8
    engine computes with. An all-zero row stays zero.

    Raises:
        ValueError: for a weight that is not a non-empty 2-D tensor, or holds NaN or inf.
    """
    if weight.dim() != 2 or weight.numel() == 0:
        raise ValueError(f"round_to_fp8: a non-empty 2-D weight (rows scaled one by one), not "
                         f"shape {tuple(weight.shape)}.")
    w = weight.float()  # the scale in fp32: an fp16 absmax / 448 would fall into subnormals
    if not torch.isfinite(w).all():
        raise ValueError("round_to_fp8: the weight holds NaN or inf; an fp8 scale cannot be "
                         "taken from it (the model has diverged).")
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / E4M3_MAX
    return ((w / scale).to(torch.float8_e4m3fn).float() * scale).to(weight.dtype)


def rollout_copy(model: nn.Module, precision: str) -> nn.Module:
    """A copy of ``model`` in the rollout engine's ``precision``, for sampling only (no gradient,
    eval mode). ``fp32`` returns ``model`` itself (the trainer's own numerics: no copy).

    Raises:
        ValueError: for an unknown precision.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not known; choose one of "
                         f"{', '.join(PRECISIONS)}.")
    if precision == "fp32":
        return model
    engine = copy.deepcopy(model).requires_grad_(False).eval()
    if precision == "bf16":
        engine.to(torch.bfloat16)
    sync_rollout_copy(model, engine, precision)
    return engine


@torch.no_grad()
def sync_rollout_copy(model: nn.Module, engine: nn.Module, precision: str) -> None:
    """Load ``model``'s current weights into the rollout ``engine`` (made by
    :func:`rollout_copy`), rounded to ``precision``: the weight sync of a run whose engine
    computes in other numerics.

    Raises:
        ValueError: for an unknown precision or models whose state dicts differ.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not known; choose one of "
                         f"{', '.join(PRECISIONS)}.")
    src, dst = model.state_dict(), engine.state_dict()
    if list(src) != list(dst) or any(src[k].shape != dst[k].shape for k in src):
        raise ValueError("sync_rollout_copy: the engine's parameters differ from the model's; "
                         "make the engine with rollout_copy(model, precision).")
    bf16 = any(v.dtype == torch.bfloat16 for v in dst.values() if v.is_floating_point())
    if bf16 != (precision == "bf16"):
        raise ValueError(f"sync_rollout_copy: precision={precision!r} for an engine made "
                         f"{'in bf16' if bf16 else 'in fp32'}; sync it with the precision it was "
                         "made with (rollout_copy(model, precision)).")
    for name, value in src.items():
        if precision == "fp8" and value.dim() == 2 and value.is_floating_point():
            value = round_to_fp8(value)
        dst[name].copy_(value)  # into a bf16 engine, copy_ rounds to nearest bf16
