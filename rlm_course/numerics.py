"""How close two floating-point results must be when they differ only by rounding.

Every equivalence check of the course (a parallel strategy against one device, a KV cache against
recomputation, a resumed run against an uninterrupted one) compares two computations of the same
function that add the same numbers in another order. Floating-point addition is not associative,
so the two agree only up to rounding, and how far depends on the machine: another CPU runs other
SIMD kernels, another thread count splits sums into other chunks. A tolerance chosen by looking at
one machine's error is luck on the next one; the tolerances here are derived from the format.

* A sum of ``n`` terms computed in any order has an error of at most ``(n - 1) u sum_i |x_i|``
  (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed. 2002, eq. 4.4), where ``u``
  is the unit roundoff (``2**-24`` in float32, ``2**-53`` in float64). Two orders therefore differ
  by at most ``2 (n - 1) u sum_i |x_i|``: :func:`reorder_tolerance` gives that bound relative to
  the result's magnitude, and :func:`relative_error` measures it normwise (largest difference over
  the largest reference value, so an entry that cancels to nearly 0 is not judged on its own).
* Adam divides each gradient by the square root of its running second moment. For a parameter
  whose gradient is within rounding of 0, a rounding difference ``delta`` moves it by up to
  ``lr * delta / eps`` per step (``eps = 1e-8``), that is up to ``lr`` itself: in float32 two
  correct implementations may end Adam steps apart by a good fraction of ``lr``.
  :func:`adam_tolerance` gives the bound; in float64 it is tiny, which is why the course checks
  optimizer steps in float64.

Exact equality (``torch.equal``) is claimed only where the course controls the order of every
operation: the same code on the same machine with the same thread count (a resumed run, a seeded
sampler).
"""

from __future__ import annotations

import torch
from torch import Tensor


def unit_roundoff(dtype: torch.dtype) -> float:
    """``u``: half the distance from 1 to the next float (``2**-24`` for float32, ``2**-53`` for
    float64); a single rounded operation has a relative error of at most ``u``."""
    if not dtype.is_floating_point:
        raise ValueError(f"unit_roundoff: {dtype} is not a floating-point type.")
    return torch.finfo(dtype).eps / 2


def reorder_tolerance(dtype: torch.dtype, terms: int, depth: int = 1) -> float:
    """Relative tolerance for two results that add the same numbers in another order.

    ``2 (terms - 1) u`` per chained reduction (Higham 2002, eq. 4.4, for each of the two orders),
    times ``depth`` reductions in a row (e.g. the matmuls of a block, forward and backward), with
    a floor of ``16 u`` for results made by a few rounded operations.

    Args:
        dtype: the floating-point type of the computation.
        terms: the longest sum in the computation (e.g. the inner dimension of a matmul).
        depth: how many such reductions feed one another.

    Raises:
        ValueError: for ``terms < 1`` or ``depth < 1``.
    """
    if terms < 1 or depth < 1:
        raise ValueError(f"reorder_tolerance: terms={terms} and depth={depth} must be >= 1.")
    u = unit_roundoff(dtype)
    return max(2 * (terms - 1) * u * depth, 16 * u)


def adam_tolerance(dtype: torch.dtype, terms: int, lr: float, steps: int, eps: float = 1e-8,
                   depth: int = 1) -> float:
    """Absolute tolerance on parameters after ``steps`` Adam steps whose gradients (of magnitude
    about 1 or less) differ only by rounding.

    A gradient error ``delta`` (at most ``reorder_tolerance(dtype, terms, depth)`` on gradients of
    magnitude up to 1) changes Adam's update ``lr * m / (sqrt(v) + eps)`` by at most
    ``lr * delta / eps``, and never by more than ``2 lr`` (the update of one step is at most about
    ``lr``; Kingma & Ba 2015, section 2.1). Summed over the steps.
    """
    delta = reorder_tolerance(dtype, terms, depth)
    return steps * lr * min(delta / eps, 2.0)


def relative_error(actual: Tensor, expected: Tensor) -> float:
    """``max |actual - expected| / max |expected|`` (normwise; 0 when both are all 0).

    Raises:
        ValueError: if the shapes differ.
    """
    if actual.shape != expected.shape:
        raise ValueError(f"relative_error: shapes {tuple(actual.shape)} and "
                         f"{tuple(expected.shape)} differ.")
    scale = expected.detach().abs().max().item() if expected.numel() else 0.0
    diff = (actual.detach() - expected.detach()).abs().max().item() if expected.numel() else 0.0
    if scale == 0.0:
        return diff
    return diff / scale
