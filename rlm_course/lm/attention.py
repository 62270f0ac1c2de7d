"""The model's attention: scaled dot-product attention, with the keys padded on the CPU to a
length its kernel is fast at.

PyTorch's CPU attention kernel runs its vector loop over the keys in chunks of the SIMD width
and finishes the remainder on a slower path whose cost grows with the remainder, so a short
sequence just past a multiple of the width can cost twice as much as one at it. :func:`attention`
pads the keys to the next multiple of :data:`KEY_PAD_MULTIPLE` when that is cheap, and masks the
padding out; :func:`attention_key_length` says how many keys the kernel then runs over (the cost
accounting counts them). The limits come from timings of the forward and backward passes: more
padding costs more in copies and padded arithmetic than the slow path saves, and on long
sequences an explicit mask stops the kernel from skipping the blocks above the causal diagonal.
Chapter 05 measures the effect on the learner's own CPU
(:func:`rlm_course.cost.profiling.attention_by_key_length`) and gives the figures the limits were
chosen from; on another CPU the rule is worth measuring again.
"""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F
from torch import Tensor


#: On the CPU, full-sequence attention pads its keys to a multiple of this many, when that takes at
#: most :data:`MAX_KEY_PAD` padding keys and gives at most :data:`MAX_PADDED_KEYS` keys (see
#: :func:`attention`).
KEY_PAD_MULTIPLE = 16
MAX_KEY_PAD = 6
MAX_PADDED_KEYS = 128


def attention_key_length(ctx: int, device_type: str = "cpu") -> int:
    """Keys that :func:`attention`'s kernel runs over for ``ctx`` real keys in a causal pass:
    ``ctx`` rounded up to a multiple of :data:`KEY_PAD_MULTIPLE` on the CPU when that adds at most
    :data:`MAX_KEY_PAD` keys and gives at most :data:`MAX_PADDED_KEYS`, else ``ctx`` (e.g.
    14 -> 16, 20 -> 20, 27 -> 32, 1019 -> 1019 on the CPU).

    Raises:
        ValueError: ``ctx`` is not a non-negative int, or ``device_type`` is not a torch device
            type such as ``"cpu"`` or ``"cuda"``.
    """
    if isinstance(ctx, bool) or not isinstance(ctx, numbers.Integral) or ctx < 0:
        raise ValueError(f"attention_key_length: ctx={ctx!r} must be a non-negative int "
                         "(the number of keys).")
    try:
        device_type = torch.device(device_type).type
    except (RuntimeError, TypeError):
        raise ValueError(f"attention_key_length: device_type={device_type!r} is not a torch "
                         "device type; use a lower-case name such as 'cpu' or 'cuda'.") from None
    ctx = int(ctx)
    padded = ctx + -ctx % KEY_PAD_MULTIPLE
    if device_type == "cpu" and padded - ctx <= MAX_KEY_PAD and padded <= MAX_PADDED_KEYS:
        return padded
    return ctx


def attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None) -> Tensor:
    """Scaled dot-product attention of ``q`` over ``k``/``v``: causal when ``attn_mask`` is None.

    Args:
        q: ``(batch, n_head, seq, d_head)``; k: ``(batch, n_head, ctx, d_head)``; v: ``(batch,
            n_head, ctx, d_v)`` (``ctx = seq`` when causal).
        attn_mask: broadcastable to ``(batch, n_head, seq, ctx)``: bool, True where a query may
            see a key, or float, added to the scores; None: causal.

    Returns:
        ``(batch, n_head, seq, d_v)``, ``softmax(q k^T / sqrt(d_head) + mask) v`` (Vaswani et al.
        2017, eq. 1), the same as ``F.scaled_dot_product_attention(q, k, v, attn_mask)``, or with
        ``is_causal=True`` when ``attn_mask`` is None.

    On the CPU, when the next multiple of :data:`KEY_PAD_MULTIPLE` is at most :data:`MAX_KEY_PAD`
    keys away and at most :data:`MAX_PADDED_KEYS` long, the keys and values are padded with zeros
    up to it and the padding is masked out (see the module docstring for why). A masked key gets
    ``exp(-inf) = 0`` weight, so the output is the same up to the rounding of a differently
    ordered sum (about 1e-6 in fp32); the padded keys' FLOPs are real work for the kernel, and
    ``torch.utils.flop_counter`` counts them (:func:`attention_key_length` gives the count of
    keys). Elsewhere, and for a mask whose last dimension broadcasts over the keys or a causal
    call with ``seq != ctx``, the call is plain SDPA.
    """
    ctx = k.shape[2]
    pad = attention_key_length(ctx, q.device.type) - ctx
    plain = (pad == 0 or k.dim() != 4 or v.dim() != 4
             or (attn_mask is None and q.shape[-2] != ctx)
             or (attn_mask is not None and (attn_mask.dim() == 0 or attn_mask.shape[-1] != ctx)))
    if plain:
        if attn_mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    k = torch.cat([k, k.new_zeros(*k.shape[:2], pad, k.shape[3])], 2)
    v = torch.cat([v, v.new_zeros(*v.shape[:2], pad, v.shape[3])], 2)
    if attn_mask is None:  # causal: query i sees keys 0..i, never the padding (keys >= ctx > i)
        attn_mask = torch.ones(ctx, ctx + pad, dtype=torch.bool, device=q.device).tril()
    elif attn_mask.dtype == torch.bool:
        attn_mask = F.pad(attn_mask, (0, pad), value=False)
    else:  # an additive mask: the padding gets -inf, weight exp(-inf) = 0
        attn_mask = F.pad(attn_mask, (0, pad), value=float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
