"""The model's attention (rlm_course.lm.attention): equal to SDPA for every input SDPA takes, keys
padded only when few are missing."""

import pytest
import torch

from rlm_course.cost.flops import count_flops
from rlm_course.lm.attention import (KEY_PAD_MULTIPLE, MAX_KEY_PAD, MAX_PADDED_KEYS, attention,
                                      attention_key_length)
from rlm_course.numerics import relative_error, reorder_tolerance

# Equivalence checks run in float64: the two computations add in other orders, and float64's
# rounding (1e-16) keeps that far below any real difference. Longest sum: the MLP's 4 d = 512
# terms; chained through 2 reductions per layer of 4 layers.
TOL64 = reorder_tolerance(torch.float64, terms=512, depth=8)


@pytest.mark.parametrize("length", [5, 14, 16, 20, 27])
def test_attention_with_padded_keys_equals_sdpa(length):
    """The model's attention pads the keys on the CPU (14 -> 16, 27 -> 32); outputs and gradients
    equal plain SDPA's, causal and with a padding mask."""
    gen = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(3, 4, length, 8, dtype=torch.float64, generator=gen, requires_grad=True)
               for _ in range(3))
    mask = torch.rand(3, 1, length, length, generator=gen) > 0.3
    mask[..., 0] = True  # every query sees at least one key
    for m in (None, mask):
        ours = attention(q, k, v, m)
        reference = (torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                     if m is None else
                     torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m))
        assert relative_error(ours, reference) <= TOL64
        grads = torch.autograd.grad(ours.square().sum(), (q, k, v))
        expected = torch.autograd.grad(reference.square().sum(), (q, k, v))
        for g, e in zip(grads, expected):
            assert relative_error(g, e) <= TOL64


def sdpa(q, k, v, mask):
    if mask is None:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_attention_equals_sdpa_for_every_input_sdpa_takes():
    """Additive float masks (padded with -inf, not 0), masks that broadcast over heads, queries
    or keys, values wider than the keys, a causal call with fewer queries than keys: whatever
    SDPA accepts, the model's attention gives the same result, padded or not."""
    gen = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=gen)

    q, k, v = randn(3, 4, 14, 8), randn(3, 4, 14, 8), randn(3, 4, 14, 8)
    allowed = torch.rand(3, 1, 14, 14, generator=gen) > 0.3
    allowed[..., 0] = True
    additive = torch.zeros(3, 1, 14, 14, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
    cases = [
        (q, k, v, additive),                                       # float mask, padded with -inf
        (q, k, v, randn(3, 4, 14, 14)),                            # a float bias, not only -inf
        (q, k, v, allowed[:, :, :1]),                              # broadcast over queries
        (q, k, v, allowed[..., :1].expand(3, 1, 14, 1).clone()),  # broadcast over keys: plain
        (q, k, v, allowed[0, 0]),                                  # a 2-D (seq, ctx) mask
        (q, k, randn(3, 4, 14, 5), None),                          # d_v != d_head, causal
        (q, k, randn(3, 4, 14, 5), allowed),                       # d_v != d_head, masked
        (q[:, :, :9], k, v, None),                                 # causal with seq < ctx: plain
    ]
    for q_, k_, v_, m in cases:
        assert relative_error(attention(q_, k_, v_, m), sdpa(q_, k_, v_, m)) <= TOL64


@pytest.mark.parametrize("length", [14, 20, 32, 123, 251, 1019])
def test_attention_pads_keys_only_when_few_are_needed(length):
    """The kernel's FLOPs (counted by torch.utils.flop_counter) show how many keys it ran over:
    14 -> 16 and 123 -> 128, but not 20 (12 missing), nor 251 or 1019 (long: an explicit causal
    mask would cost the kernel its skipping of the blocks above the diagonal)."""
    q = k = v = torch.randn(1, 1, length, 8)
    pad = -length % KEY_PAD_MULTIPLE
    keys = length + pad if pad <= MAX_KEY_PAD and length + pad <= MAX_PADDED_KEYS else length
    measured, _ = count_flops(lambda: attention(q, k, v))
    assert measured == 4 * length * keys * 8  # q k^T and p v: 2 FLOPs per multiply-add
    assert keys == {14: 16, 20: 20, 32: 32, 123: 128, 251: 251, 1019: 1019}[length]
    assert attention_key_length(length) == keys
    assert attention_key_length(length, "cuda") == length  # only the CPU kernel is padded for


@pytest.mark.parametrize("ctx,device_type", [(-1, "cpu"), (14.0, "cpu"), (True, "cpu"),
                                             ("14", "cpu"), (14, "CPU"), (14, "gpu"), (14, None)])
def test_attention_key_length_refuses_bad_input(ctx, device_type):
    with pytest.raises(ValueError, match="attention_key_length"):
        attention_key_length(ctx, device_type)
