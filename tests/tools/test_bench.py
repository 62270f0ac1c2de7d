"""The benchmarks' device options: bf16 autocast on the CPU's path, and clear refusals."""

import pytest

from rlm_course.tools import bench


def test_the_train_bench_runs_on_an_explicit_device_with_its_floors():
    # (bf16 autocast on a CPU without bf16 units takes about 40 s here: gpu-check runs it on GPUs)
    result = bench.bench_train(1, device="cpu", peak_sizes=(256,))
    assert result["bf16"] is False and result["device"] == "cpu"
    assert result["step_seconds"] > 0 and 0 < result["fraction_of_matmul_peak"]
    # the floors are reported beside the step and its ratios are theirs (how the step compares
    # with them is a measurement the benchmark prints, not a property a busy machine keeps)
    t, kernels = result["step_seconds"], result["kernel_floor_seconds"]
    assert kernels > 0 and result["step_over_kernel_floor"] == pytest.approx(t / kernels)
    assert result["flop_floor_seconds"] == pytest.approx(
        result["flops_per_step"] / result["matmul_peak_flops_per_s"])
    assert result["fraction_of_matmul_peak"] == pytest.approx(
        result["achieved_flops_per_s"] / result["matmul_peak_flops_per_s"])
    assert "mfu" not in result  # a CPU has no datasheet peak in the catalog


@pytest.mark.parametrize("what,kw,match", [
    ("family", {"device": "cpu"}, "bench family has no device option"),
    ("sampling", {"bf16": True}, "only bench train has it"),
    ("train", {"device": "tpu"}, "--device 'tpu': choose one of"),
])
def test_device_options_a_bench_does_not_take_are_refused(what, kw, match):
    with pytest.raises(ValueError, match=match):
        bench.main(what, 1, **kw)


def test_compiling_pays_back_after_compile_time_over_the_seconds_saved_per_call():
    assert bench.break_even_calls(30.0, 0.5, 0.2) == pytest.approx(100.0)  # 30 s / 0.3 s per call
    assert bench.break_even_calls(0.0, 0.5, 0.2) == 0.0
    assert bench.break_even_calls(30.0, 0.5, 0.5) is None  # nothing saved: it never pays
    assert bench.break_even_calls(30.0, 0.2, 1.2) is None  # slower once compiled
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="must be a finite time >= 0"):
            bench.break_even_calls(bad, 0.5, 0.2)


def test_a_compiler_that_cannot_run_is_a_clear_error_not_a_traceback():
    calls = []

    def broken():
        calls.append("compiled")
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore detail")

    with pytest.raises(ValueError, match=r"torch.compile could not run here \(RuntimeError: "
                                         r"InvalidCxxCompiler.*needs a C\+\+ compiler"):
        bench._compiled_against_eager(lambda: calls.append("eager"), broken, repeats=2)
    assert calls == ["eager", "compiled"]  # stopped at the first compiled call


def test_compiled_against_eager_alternates_and_counts_the_first_call_as_compilation(monkeypatch):
    clock, calls = [0.0], []  # a fake clock that each call advances by its own seconds
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])

    def eager():
        calls.append("e")
        clock[0] += 2.0

    def compiled():
        calls.append("c")
        clock[0] += 50.0 if calls.count("c") == 1 else 1.0  # the first call compiles

    r = bench._compiled_against_eager(eager, compiled, repeats=3)
    assert calls == ["e", "c"] + ["e", "c"] * 3
    assert (r["eager_seconds"], r["compiled_seconds"], r["speedup"]) == (2.0, 1.0, 2.0)
    assert r["compile_seconds"] == 48.0  # the first compiled call less an eager one
    assert r["break_even_calls"] == 48.0  # 48 s paid back at 1 s per call
