"""The kernel floor: a step's own matmul and attention calls, recorded and timed alone."""

import pytest
import torch

from rlm_course.cost.profiling import kernel_floor
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


def test_a_function_without_matmuls_is_refused():
    with pytest.raises(ValueError, match="no matmul or attention call"):
        kernel_floor(lambda: torch.zeros(3) + 1)
    with pytest.raises(ValueError, match="repeats=0"):
        kernel_floor(lambda: None, repeats=0)
