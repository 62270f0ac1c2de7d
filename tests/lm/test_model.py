"""The tiny model: shapes, the KV cache, FLOPs."""

import pytest
import torch

from rlm_course.cost.flops import count_flops
from rlm_course.lm.model import KVCache, ModelConfig, TinyGPT, forward_flops, matmul_parameters
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.numerics import relative_error, reorder_tolerance

TOK = CharTokenizer()
# Equivalence checks run in float64: the two computations add in other orders, and float64's
# rounding (1e-16) keeps that far below any real difference. Longest sum: the MLP's 4 d = 512
# terms; chained through 2 reductions per layer of 4 layers.
TOL64 = reorder_tolerance(torch.float64, terms=512, depth=8)


def make_model(seed=0, **kw):
    torch.manual_seed(seed)
    return TinyGPT(ModelConfig(TOK.vocab_size, max_seq_len=32, **kw)).eval()


def test_kv_cache_decoding_equals_full_sequence_logits():
    model = make_model().double()
    tokens, mask = TOK.encode_prompts(["12+345=", "9+9=", "100+1="])
    extra = torch.randint(3, TOK.vocab_size, (3, 6), generator=torch.Generator().manual_seed(1))
    full_tokens = torch.cat([tokens, extra], 1)
    full_mask = torch.cat([mask, torch.ones_like(extra, dtype=torch.bool)], 1)
    with torch.no_grad():
        reference = model(full_tokens, full_mask)
        cache = KVCache(model.config, 3, full_tokens.shape[1], dtype=torch.float64)
        steps = [model(tokens, mask, cache)]
        for t in range(extra.shape[1]):
            end = tokens.shape[1] + t + 1
            steps.append(model(full_tokens[:, end - 1:end], full_mask[:, :end], cache))
    incremental = torch.cat(steps, 1)
    real = full_mask  # padding positions carry no meaning
    assert relative_error(incremental[real], reference[real]) <= TOL64
    assert cache.length == full_tokens.shape[1]


def test_left_padding_does_not_change_logits():
    model = make_model().double()
    alone, alone_mask = TOK.encode_prompts(["7+8="])
    batch, batch_mask = TOK.encode_prompts(["7+8=", "123+456="])
    with torch.no_grad():
        a = model(alone, alone_mask)[0, -1]
        b = model(batch, batch_mask)[0, -1]
    assert relative_error(a, b) <= TOL64


def test_parameter_count_matches_formula():
    cfg = ModelConfig(TOK.vocab_size, n_layer=3, n_head=2, d_model=32, max_seq_len=16)
    d, v, L, t = 32, TOK.vocab_size, 3, 16
    per_layer = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    expected = v * d + t * d + L * per_layer + 2 * d + d * v
    assert TinyGPT(cfg).num_parameters() == expected
    assert matmul_parameters(cfg) == L * 12 * d * d + d * v


@pytest.mark.parametrize("seq,batch,padded", [(8, 2, False), (20, 4, True), (32, 3, True)])
def test_analytic_forward_flops_match_flop_counter(seq, batch, padded):
    model = make_model()
    tokens = torch.randint(3, TOK.vocab_size, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.bool)
    if padded:
        mask[:, :2] = False
    measured, _ = count_flops(model, tokens, mask if padded else None)
    predicted = forward_flops(model.config, seq, batch=batch)
    assert abs(measured - predicted) / predicted < 0.02


def test_forward_and_backward_flops_are_three_forwards():
    model = make_model()
    tokens = torch.randint(3, TOK.vocab_size, (4, 16))
    measured, _ = count_flops(lambda: model(tokens).sum().backward())
    predicted = 3 * forward_flops(model.config, 16, batch=4)
    assert abs(measured - predicted) / predicted < 0.03


def test_decode_step_flops_match_formula():
    model = make_model()
    tokens, mask = TOK.encode_prompts(["12+34="] * 2)
    cache = KVCache(model.config, 2, 16)
    with torch.no_grad():
        model(tokens, mask, cache)
        p = tokens.shape[1]
        step_mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.bool)], 1)
        measured, _ = count_flops(model, tokens[:, -1:], step_mask, cache)
    assert measured == forward_flops(model.config, 1, context_len=p + 1, batch=2)


@pytest.mark.parametrize("kw,match", [({"n_head": 3}, "does not divide d_model"),
                                      ({"n_layer": 0}, "positive integer"),
                                      ({"d_model": -8}, "positive integer"),
                                      ({"n_layer": True}, r"n_layer=True: must be a positive")])
def test_bad_config_raises_clear_error(kw, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(TOK.vocab_size, **kw)


def test_too_long_sequence_raises():
    model = make_model()
    with pytest.raises(ValueError, match="exceeds"):
        model(torch.zeros(1, 33, dtype=torch.long))
