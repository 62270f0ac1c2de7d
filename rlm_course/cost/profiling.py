"""Measure a real RL step stage by stage: seconds (timers), FLOPs (``torch.utils.flop_counter``),
and prefill/decode throughput for the roofline, to set against :mod:`rlm_course.cost.accounting` and
:mod:`rlm_course.cost.anatomy`.
"""

from __future__ import annotations

import numbers
import os
import sys
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import FlopCounterMode

from rlm_course.cost import flops as _flops  # noqa: F401  (registers the CPU attention FLOP formulas)
from rlm_course.cost.accounting import predict_iteration_flops
from rlm_course.lm.attention import attention
from rlm_course.lm.model import KVCache, TinyGPT, forward_flops
from rlm_course.utils import StageTimer, best_seconds


class MeasuringTimer(StageTimer):
    """A :class:`StageTimer` that also reads a running ``FlopCounterMode`` at each stage's start
    and end, so that ``flops[stage]`` holds the FLOPs the stage ran."""

    def __init__(self, counter: FlopCounterMode) -> None:
        super().__init__()
        self.counter = counter
        self.flops: dict[str, int] = {}

    @contextmanager
    def __call__(self, stage: str):
        start = self.counter.get_total_flops()
        with super().__call__(stage):
            yield
        self.flops[stage] = self.flops.get(stage, 0) + self.counter.get_total_flops() - start


@contextmanager
def native_stderr_silenced():
    """Send file descriptor 2 to /dev/null for the duration: PyTorch's profiler (kineto) writes
    ``USDT ... profiler_start`` / ``profiler_stop`` lines there from C++, which a notebook shows
    in red as if something had failed."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _profiled(fn):
    """Run ``fn()`` once under ``torch.profiler`` (CPU activities), without the profiler's
    start/stop chatter; return the profile."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU])
    with native_stderr_silenced():
        prof.__enter__()
    try:
        fn()
    finally:
        with native_stderr_silenced():
            prof.__exit__(None, None, None)
    return prof


def profile_ops(fn, row_limit: int = 8, sort_by: str = "self_cpu_time_total") -> str:
    """Run ``fn()`` under ``torch.profiler`` (CPU activities) and return the table of its
    ``row_limit`` most expensive operators, without the profiler's start/stop chatter."""
    return _profiled(fn).key_averages().table(sort_by=sort_by, row_limit=row_limit)


MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
ATTENTION_MARK = "scaled_dot_product"
# what a dispatch mode sees of a matmul: under torch.inference_mode ``aten::linear`` reaches it
# whole (under autograd or no_grad it arrives decomposed into ``t`` and ``addmm``)
RECORDED_MATMULS = MATMUL_OPS + ("aten::linear",)


def dispatch_floor(calls: int = 2000) -> float:
    """Seconds PyTorch needs to launch one operator from Python on this machine: the best
    per-call time of an in-place add on a one-element tensor (its arithmetic is nothing)."""
    x = torch.zeros(1)
    with torch.no_grad():
        def run():
            for _ in range(calls):
                x.add_(1.0)
        run()
        return best_seconds(run, 3) / calls


def where_time_goes(fn, flops: float, peak_flops: float | None = None, repeats: int = 5) -> dict:
    """Split the wall time of ``fn()`` (e.g. one decode step, one training step) by where it goes.

    Returns seconds (and counts) under these keys:

    * ``wall``: the best of ``repeats`` runs, without the profiler;
    * ``matmul``, ``attention``: the matmul kernels' (mm, addmm, bmm, baddbmm) and the SDPA
      kernels' own CPU time, from one run under ``torch.profiler``;
    * ``rest``: ``wall - matmul - attention`` (floored at 0): the small kernels (normalisation,
      activations, copies, indexing, element-wise optimizer updates) and the framework between
      kernels (Python, the dispatcher). The profiler's own bookkeeping would inflate these if they
      were taken from it, so they are what the arithmetic kernels leave of the wall time;
    * ``operators``: how many ATen operator calls one run makes, and ``launch_floor``: that count
      times :func:`dispatch_floor`, the time the calls alone need however small their data;
    * ``flop_floor``: ``flops / peak_flops``, the time the arithmetic needs at the measured matmul
      peak (:func:`rlm_course.cost.hardware.matmul_peak` unless given), and ``flops``,
      ``peak_flops``.

    At large sizes the matmuls dominate and the wall time approaches the FLOP floor (compute
    bound); at the course's tiny sizes the launches and the small kernels take a large share: the
    overhead-bound end of the roofline (chapter 05).

    Raises:
        ValueError: for non-positive ``flops`` or ``repeats``.
    """
    from rlm_course.cost.hardware import matmul_peak

    if flops <= 0 or repeats <= 0:
        raise ValueError(f"where_time_goes: flops={flops} and repeats={repeats} must be positive.")
    fn()  # warm-up
    wall = best_seconds(fn, repeats)
    prof = _profiled(fn)
    matmul = attention = 0.0
    calls = 0
    for event in prof.key_averages():
        if not event.key.startswith("aten::"):
            continue
        calls += event.count
        if event.key in MATMUL_OPS:
            matmul += event.self_cpu_time_total / 1e6
        elif ATTENTION_MARK in event.key:
            attention += event.self_cpu_time_total / 1e6
    peak = peak_flops if peak_flops is not None else matmul_peak()[0]
    return {"wall": wall, "matmul": matmul, "attention": attention,
            "rest": max(0.0, wall - matmul - attention), "operators": calls,
            "launch_floor": calls * dispatch_floor(), "flop_floor": flops / peak, "flops": flops,
            "peak_flops": peak}


def _copy_with_strides(x):
    """A copy of tensor ``x`` with its strides (anything else as it is): the span of storage it
    views is copied and viewed the same way. ``clone()`` would make a sliced view dense and an
    expanded one full, and a kernel replayed on such a copy is not the step's kernel (CUDA's
    memory-efficient attention refuses a bias whose row stride is not a multiple of 4, which it
    gets by padding the bias and slicing it back)."""
    if not isinstance(x, torch.Tensor):
        return x
    x = x.detach()
    if x.numel() == 0:
        return x.clone()
    span = 1 + sum((n - 1) * s for n, s in zip(x.shape, x.stride()))
    return x.as_strided((span,), (1,)).clone().as_strided(x.shape, x.stride())


class _KernelRecorder(TorchDispatchMode):
    """Records every matmul and attention call that reaches the dispatcher (forward and
    backward), keeping a copy of the inputs of the first call of each signature and the count."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[tuple, list] = {}  # signature -> [func, args, kwargs, count]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = f"aten::{func.__name__.split('.')[0]}"
        if name in RECORDED_MATMULS or ATTENTION_MARK in name:
            signature = (str(func),) + tuple(
                (tuple(a.shape), a.dtype, a.stride()) if isinstance(a, torch.Tensor) else repr(a)
                for a in (*args, *kwargs.values()))
            if signature in self.calls:
                self.calls[signature][3] += 1
            else:
                self.calls[signature] = [func, tree_map(_copy_with_strides, args),
                                         tree_map(_copy_with_strides, kwargs), 1]
        return func(*args, **kwargs)


def kernel_floor(fn, repeats: int = 5, inner: int = 10, device: str = "cpu") -> dict:
    """The **kernel floor** of ``fn()`` (a decode step, a train step): the time its own matmul and
    attention kernels need when each is timed alone at its shapes, in this process, summed over
    the calls. What the step spends above it goes to the small kernels and the framework.

    One run of ``fn`` under a ``TorchDispatchMode`` records every matmul (mm, addmm, bmm, baddbmm;
    linear, which reaches the mode whole under ``torch.inference_mode``) and
    scaled-dot-product-attention call that reaches the dispatcher, forward and backward, with
    a copy of its inputs (one per distinct signature: op, shapes, dtypes, strides, arguments);
    each signature is then replayed ``inner`` times in a row, best of ``repeats``, times its count
    (on a GPU, waiting for the kernels: ``device``).

    Returns:
        ``{"seconds", "calls", "signatures", "by_op": {op: seconds}}``.

    Raises:
        ValueError: for non-positive ``repeats`` or ``inner``, or an ``fn`` that makes no matmul.
    """
    from rlm_course.cost.hardware import synchronized

    if repeats <= 0 or inner <= 0:
        raise ValueError(f"kernel_floor: repeats={repeats} and inner={inner} must be positive.")
    recorder = _KernelRecorder()
    with recorder:
        fn()
    if not recorder.calls:
        raise ValueError("kernel_floor: fn() made no matmul or attention call; pass the step "
                         "itself (a model forward, or a train step).")
    total, calls, by_op = 0.0, 0, {}
    with torch.no_grad():
        for func, args, kwargs, count in recorder.calls.values():
            def run(func=func, args=args, kwargs=kwargs):
                for _ in range(inner):
                    func(*args, **kwargs)
            run = synchronized(run, device)
            run()  # warm-up
            seconds = best_seconds(run, repeats) / inner * count
            op = f"aten::{func.__name__.split('.')[0]}"
            by_op[op] = by_op.get(op, 0.0) + seconds
            total += seconds
            calls += count
    return {"seconds": total, "calls": calls, "signatures": len(recorder.calls), "by_op": by_op}


def measure_step(trainer) -> dict:
    """Run one step of ``trainer`` (an :class:`rlm_course.rl.trainer.RLTrainer`) under the FLOP
    counter; return its metrics row plus ``measured_flops`` and ``predicted_flops`` per stage
    (``generation``, ``scoring``, ``training``), the prediction by
    :func:`rlm_course.cost.accounting.predict_iteration_flops` from the step's own shapes (with the
    attention keys the model pads to on the CPU, which the counter sees).

    Evaluation steps are measured too, but their FLOPs fall outside the stages."""
    counter = FlopCounterMode(display=False)
    original = trainer.timer
    trainer.timer = timer = MeasuringTimer(counter)
    try:
        with counter:
            row = trainer.step()
    finally:
        trainer.timer = original
    predicted = predict_iteration_flops(
        trainer.policy.config, trainer.config, generated=row["responses_generated"],
        trained=row["responses_trained"], prompt_len=row["prompt_columns"],
        response_len=row["response_columns"], padded_keys=True)
    row["measured_flops"] = {s: timer.flops.get(s, 0) for s in ("generation", "scoring", "training")}
    row["predicted_flops"] = {s: predicted[s] for s in ("generation", "scoring", "training")}
    return row


@torch.no_grad()
def roofline_points(model: TinyGPT, batches=(1, 4, 16, 64, 256), prompt_len: int = 12,
                    context: int = 16, repeats: int = 5) -> list[dict]:
    """Measured prefill and decode throughput of ``model`` for several batch sizes.

    * prefill: a forward over ``batch x prompt_len`` tokens;
    * decode: one cached step of ``batch`` tokens at ``context`` keys.

    For each: analytic FLOPs (:func:`rlm_course.lm.model.forward_flops`), bytes (fp32 weights read
    once, plus the KV cache read by decode and written by both), arithmetic intensity, and the
    achieved FLOP/s (best of ``repeats``).

    Returns:
        One dict per (kind, batch): ``kind, batch, flops, bytes, intensity, seconds, flops_per_s``.
    """
    config = model.config
    model.eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_per_token = 2 * config.n_layer * config.d_model * 4
    points = []
    for batch in batches:
        tokens = torch.randint(0, config.vocab_size, (batch, prompt_len))
        seconds = best_seconds(lambda: model(tokens), repeats)
        flops = forward_flops(config, prompt_len, batch=batch)
        bytes_ = weight_bytes + batch * prompt_len * kv_per_token
        points.append({"kind": "prefill", "batch": batch, "flops": flops, "bytes": bytes_,
                       "intensity": flops / bytes_, "seconds": seconds,
                       "flops_per_s": flops / seconds})

        cache = KVCache(config, batch, context + 1)
        model(torch.randint(0, config.vocab_size, (batch, context)), None, cache)
        step = torch.randint(0, config.vocab_size, (batch, 1))

        def decode_step():
            cache.length = context
            model(step, None, cache)

        seconds = best_seconds(decode_step, repeats)
        flops = forward_flops(config, 1, context + 1, batch)
        bytes_ = weight_bytes + batch * (context + 1) * kv_per_token
        points.append({"kind": "decode", "batch": batch, "flops": flops, "bytes": bytes_,
                       "intensity": flops / bytes_, "seconds": seconds,
                       "flops_per_s": flops / seconds})
    return points


@torch.no_grad()
def attention_by_key_length(lengths=range(8, 41), batch: int = 256, n_head: int = 4,
                            d_head: int = 32, repeats: int = 11, seed: int = 0) -> list[dict]:
    """Seconds of one causal self-attention over ``length`` tokens, for each length: PyTorch's
    SDPA as it is, and the course's :func:`rlm_course.lm.attention.attention`, which pads the keys to a
    multiple of 16 when at most 6 are missing (up to 128 keys). Best of ``repeats``, no gradient, the current
    thread count.

    Inputs: ``q, k, v`` of shape ``(batch, n_head, length, d_head)``, fp32, random (seeded). The
    attention FLOPs grow with ``length**2``, so a time that jumps at some lengths and falls at the
    next is a kernel's slow path, not arithmetic.

    Returns:
        One dict per length: ``length``, ``sdpa_seconds``, ``padded_seconds``.

    Raises:
        ValueError: naming the parameter, for an empty ``lengths``, or a length, ``batch``,
            ``n_head``, ``d_head`` or ``repeats`` that is not an int of at least 1.
    """
    def positive_int(name, value):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"attention_by_key_length: {name}={value!r} must be an int of at "
                             "least 1.")
        return int(value)

    try:
        lengths = [positive_int("length", n) for n in lengths]
    except TypeError:
        raise ValueError(f"attention_by_key_length: lengths={lengths!r} must be an iterable of "
                         "ints, e.g. range(8, 41).") from None
    if not lengths:
        raise ValueError("attention_by_key_length: lengths is empty; give at least one length, "
                         "e.g. range(8, 41).")
    for name, value in (("batch", batch), ("n_head", n_head), ("d_head", d_head),
                        ("repeats", repeats)):
        positive_int(name, value)
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for length in lengths:
        q, k, v = (torch.randn(batch, n_head, length, d_head, generator=generator)
                   for _ in range(3))
        sdpa = best_seconds(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True), repeats)
        padded = best_seconds(lambda q=q, k=k, v=v: attention(q, k, v), repeats)
        rows.append({"length": length, "sdpa_seconds": sdpa, "padded_seconds": padded})
    return rows
