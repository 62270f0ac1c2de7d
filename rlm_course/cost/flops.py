"""Measured FLOPs with ``torch.utils.flop_counter``, including attention on CPU.

``FlopCounterMode`` counts matmuls and the GPU attention kernels, but in torch 2.13 it has no
formula for ``aten._scaled_dot_product_flash_attention_for_cpu`` (the kernel SDPA uses on CPU) and
would count CPU attention as 0 FLOPs. Importing this module registers torch's own SDPA formulas
(``sdpa_flop_count``: ``4 * batch * heads * s_q * s_k * d_head`` forward, twice that plus the
recomputed scores backward) for the CPU kernel too.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import (
    FlopCounterMode,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

_aten = torch.ops.aten
_CPU_SDPA = getattr(_aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_CPU_SDPA_BACKWARD = getattr(_aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)

if _CPU_SDPA is not None:
    from torch.utils.flop_counter import flop_registry

    if _CPU_SDPA not in flop_registry:
        @register_flop_formula(_CPU_SDPA)
        def _cpu_sdpa_flop(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
            return sdpa_flop_count(query_shape, key_shape, value_shape)

    if _CPU_SDPA_BACKWARD is not None and _CPU_SDPA_BACKWARD not in flop_registry:
        @register_flop_formula(_CPU_SDPA_BACKWARD)
        def _cpu_sdpa_backward_flop(grad_out_shape, query_shape, key_shape, value_shape, *args,
                                    out_shape=None, **kwargs):
            return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def count_flops(fn, *args, **kwargs) -> tuple[int, object]:
    """Run ``fn(*args, **kwargs)`` under ``FlopCounterMode``; return ``(total FLOPs, result)``."""
    with FlopCounterMode(display=False) as counter:
        result = fn(*args, **kwargs)
    return counter.get_total_flops(), result
