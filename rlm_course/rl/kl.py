"""Estimators of KL(pi_theta || pi_ref) from tokens sampled from pi_theta (Schulman 2020,
"Approximating KL divergence", joschu.net/blog/kl-approx.html).

With ``log rho = log pi_ref - log pi_theta`` per sampled token: ``k1 = -log rho``,
``k2 = (log rho)^2 / 2``, ``k3 = rho - log rho - 1`` (GRPO's choice, DeepSeekMath eq. 4).
Inputs and outputs ``(batch, R)``. Chapter 02 uses k3 as a loss; chapter 04 compares the three, as a
loss or inside the reward.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlm_course.algorithms import KL_ESTIMATORS, LOG_RATIO_CLAMP  # noqa: F401 (its old home)
from rlm_course.rl.masked import check_floats, check_same_shape


KL_CLAMP = 10.0


def exp_safe_limit(dtype: torch.dtype) -> float:
    """The largest ``x`` whose ``exp(x)`` (and its derivative) ``dtype`` holds with room to spare:
    ``log(finfo(dtype).max) - 1``, 87.7 for float32 and bfloat16, 708.8 for float64, 10.1 for
    float16. :func:`kl_k3` clamps its log-ratio there from above (below, ``exp(x)`` only rounds
    to 0 and the estimate ``-x - 1`` stays exact): exact wherever the estimate is representable,
    and never inf, whose gradient times a zero would be NaN."""
    return math.log(torch.finfo(dtype).max) - 1.0


def check_log_ratio_inputs(log_probs: Tensor, ref_log_probs: Tensor, where: str) -> None:
    """Refuse two log-prob tensors that are not of one shape (a ``(batch, 1)`` reference would
    broadcast over every token) or not of one float dtype.

    Raises:
        ValueError: naming ``where``, the shapes or dtypes.
    """
    check_floats(where, log_probs=log_probs, ref_log_probs=ref_log_probs)
    check_same_shape(log_probs, ref_log_probs, where, "log_probs", "ref_log_probs")


def kl_k3(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi_theta || pi_ref) (Schulman 2020, "Approximating KL
    divergence", joschu.net/blog/kl-approx.html; GRPO eq. 4).

    With ``x = log rho = log pi_ref - log pi_theta`` on tokens sampled from pi_theta:
    ``k3 = exp(x) - x - 1``: unbiased, always >= 0, and 0 where the two agree.

    Computed so that it stays >= 0 and accurate when the policies nearly agree (the usual case):
    ``exp(x) - 1 - x`` written as is subtracts numbers that agree in almost every bit, and in
    float32 ``x = -1e-6`` gives -6e-8 instead of 5e-13. ``expm1(x) - x`` has no such cancellation
    in ``exp(x) - 1``; for ``|x| < 0.1`` the Taylor series ``x^2/2 + x^3/6 + x^4/24 + x^5/120``
    (relative error below 3e-7) replaces the remaining subtraction. ``x`` is clamped above at
    ``exp_safe_limit(dtype)`` first (:func:`exp_safe_limit`), so that where ``exp`` would
    overflow the estimate stays finite and its gradient is not NaN; below, only at half the
    dtype's largest value (``x = -100`` gives 99, its gradient 1, as it should; so does
    ``x = -1e20``, whose square would overflow in float32: the series is evaluated only where it
    is used; an infinite ``x`` a finite estimate).

    Args:
        log_probs, ref_log_probs: ``(batch, R)``.

    Returns:
        ``(batch, R)`` non-negative estimates, exactly 0 where the log-probs are equal.

    Raises:
        ValueError: for log-probs of two shapes (one would broadcast over the other) or not of
            one float dtype.
    """
    check_log_ratio_inputs(log_probs, ref_log_probs, "kl_k3")
    # BEGIN SOLUTION: x = log rho is a difference of log-probs, clamped above at exp_safe_limit(its dtype) (and below at -finfo(dtype).max / 2, where -x - 1 is still finite); exp(x) - x - 1 cancels badly when x is near 0 (it can even come out negative): use torch.expm1(x) - x, and for |x| < 0.1 the series x^2/2 + x^3/6 + x^4/24 + x^5/120
    x = ref_log_probs - log_probs
    x = x.clamp(-torch.finfo(x.dtype).max / 2, exp_safe_limit(x.dtype))
    small = x.abs() < 0.1
    xs = torch.where(small, x, 0.0)  # the series where it is used: elsewhere x^2 can overflow
    series = xs * xs * (0.5 + xs * (1.0 / 6 + xs * (1.0 / 24 + xs / 120)))
    return torch.where(small, series, (torch.expm1(x) - x).clamp(min=0.0))
    # END SOLUTION


def kl_estimate(log_probs: Tensor, ref_log_probs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled from pi_theta.

    With ``log rho = log pi_ref - log pi_theta`` (Schulman 2020, "Approximating KL divergence"):
    ``k1 = -log rho`` (unbiased, can be negative), ``k2 = (log rho)^2 / 2`` (biased, low variance;
    its gradient is the KL's), ``k3 = rho - log rho - 1`` (unbiased, >= 0; GRPO's choice).

    Raises:
        ValueError: for an unknown estimator, or log-probs of two shapes or not of one float
            dtype.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}.")
    check_log_ratio_inputs(log_probs, ref_log_probs, "kl_estimate")
    log_rho = ref_log_probs - log_probs
    if estimator == "k1":
        return -log_rho
    if estimator == "k2":
        return 0.5 * log_rho**2
    return kl_k3(log_probs, ref_log_probs)
