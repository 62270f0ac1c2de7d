"""The kernel floor: a step's own matmul and attention calls, recorded and timed alone."""

import pytest
import torch

from rlm_course.cost.profiling import _KernelRecorder, kernel_floor
from rlm_course.lm.model import ModelConfig, TinyGPT


def test_each_call_is_counted_once_per_signature():
    a, b, c = torch.randn(64, 32), torch.randn(32, 16), torch.randn(16, 8)

    def fn():
        a @ b
        a @ b       # the same signature again
        (a @ b) @ c  # a second signature
        torch.relu(a)  # not a matmul: not counted
    floor = kernel_floor(fn, repeats=2, inner=3)
    assert floor["calls"] == 4 and floor["signatures"] == 2
    assert set(floor["by_op"]) == {"aten::mm"} and floor["seconds"] > 0


def test_a_forward_pass_records_one_matmul_per_linear_layer_and_one_attention_per_block():
    config = ModelConfig(vocab_size=20, n_layer=2, n_head=4, d_model=32, max_seq_len=16)
    model = TinyGPT(config).eval()
    tokens = torch.randint(0, 20, (4, 12))
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    with torch.no_grad():
        floor = kernel_floor(lambda: model(tokens, tokens >= 0), repeats=1, inner=1)
    assert any("scaled_dot_product" in op for op in floor["by_op"])
    assert floor["calls"] == linears + config.n_layer  # the attention: once per block
    # under inference mode each linear layer reaches the recorder whole (aten::linear, not t and
    # addmm): the same calls, none lost (generation samples in inference mode)
    with torch.inference_mode():
        inference = kernel_floor(lambda: model(tokens, tokens >= 0), repeats=1, inner=1)
    assert inference["calls"] == floor["calls"] and "aten::linear" in inference["by_op"]


def test_a_call_on_a_sliced_view_is_replayed_with_its_strides():
    # CUDA's memory-efficient attention pads its bias to an aligned row and slices it back; a
    # replay on a dense copy (row stride 14) is refused: "attn_bias is not correctly aligned"
    a, b = torch.randn(8, 16), torch.randn(16, 16)[:, :7]
    with _KernelRecorder() as recorder:
        a @ b
    (func, args, kwargs, count), = recorder.calls.values()
    assert args[1].stride() == (16, 1) and torch.equal(args[1], b) and count == 1
    assert args[1].data_ptr() != b.data_ptr()  # a copy, not the caller's tensor


def test_an_expanded_mask_is_kept_expanded_and_replayed():
    q = k = v = torch.randn(2, 4, 6, 8)
    causal = torch.full((6, 6), float("-inf")).triu(1)  # an additive mask (a bool one is made
    mask = causal.expand(2, 4, 6, 6)  # dense before dispatch); strides (0, 0, 6, 1)
    fn = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with _KernelRecorder() as recorder:
        fn()
    kept = [a for func, args, kwargs, n in recorder.calls.values()
            for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.shape[-1] == 6]
    assert [a.stride() for a in kept] == [(0, 0, 6, 1)] and torch.equal(kept[0], mask)
    assert kernel_floor(fn, repeats=1, inner=1)["calls"] == 1


def test_a_function_without_matmuls_is_refused():
    with pytest.raises(ValueError, match="no matmul or attention call"):
        kernel_floor(lambda: torch.zeros(3) + 1)
    with pytest.raises(ValueError, match="repeats=0"):
        kernel_floor(lambda: None, repeats=0)
