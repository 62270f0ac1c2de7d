"""The benchmarks' device options: bf16 autocast on the CPU's path, and clear refusals."""

import pytest

from rlm_course.tools import bench


def test_the_train_bench_runs_under_bf16_autocast_on_an_explicit_device():
    # small peak matmuls: a CPU without bf16 units takes minutes for bf16 at 2048
    result = bench.bench_train(1, device="cpu", bf16=True, peak_sizes=(128,))
    assert result["bf16"] is True and result["device"] == "cpu"
    assert result["step_seconds"] > 0 and 0 < result["fraction_of_matmul_peak"]
    assert "mfu" not in result  # a CPU has no datasheet peak in the catalog


@pytest.mark.parametrize("what,kw,match", [
    ("family", {"device": "cpu"}, "bench family has no device option"),
    ("sampling", {"bf16": True}, "only bench train has it"),
    ("train", {"device": "tpu"}, "--device 'tpu': choose one of"),
])
def test_device_options_a_bench_does_not_take_are_refused(what, kw, match):
    with pytest.raises(ValueError, match=match):
        bench.main(what, 1, **kw)
