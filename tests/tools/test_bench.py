"""The benchmarks' device options: bf16 autocast on the CPU's path, and clear refusals."""

import pytest

from rlm_course.tools import bench


def test_the_train_bench_runs_on_an_explicit_device_with_its_floors():
    # (bf16 autocast on a CPU without bf16 units takes about 40 s here: gpu-check runs it on GPUs)
    result = bench.bench_train(1, device="cpu", peak_sizes=(256,))
    assert result["bf16"] is False and result["device"] == "cpu"
    assert result["step_seconds"] > 0 and 0 < result["fraction_of_matmul_peak"]
    # the step runs more than its own matmuls and attention, and more than its arithmetic
    assert result["step_over_kernel_floor"] > 1 and result["step_seconds"] > result["flop_floor_seconds"]
    assert "mfu" not in result  # a CPU has no datasheet peak in the catalog


@pytest.mark.parametrize("what,kw,match", [
    ("family", {"device": "cpu"}, "bench family has no device option"),
    ("sampling", {"bf16": True}, "only bench train has it"),
    ("train", {"device": "tpu"}, "--device 'tpu': choose one of"),
])
def test_device_options_a_bench_does_not_take_are_refused(what, kw, match):
    with pytest.raises(ValueError, match=match):
        bench.main(what, 1, **kw)
