"""Checks of chapter 14's exercise: The communication roofline's minimum batch; choosing TP for generation."""

from __future__ import annotations


from rlm_course.tools.checks.common import value_close

#: The exercise's title.
TITLE = "The communication roofline's minimum batch; choosing TP for generation"
#: The functions the learner writes: (module, name), in the order the exercise presents them.
FUNCTIONS = (
    ("rlm_course.cost.comm", "min_tokens_per_device"),
    ("rlm_course.cost.layouts", "choose_generation_tp"),
)


def _checks_min_tokens_per_device(fn):
    peak, beta = 989.4e12, 50e9  # H100 dense bf16; one 400 Gb/s NIC per direction

    yield "H100s across nodes, plain DP over 1,024 devices: 2 x 2 x (1023/1024) x peak / (6 beta)", \
        lambda: value_close(fn(peak, beta, 1024), 2 * 2 * 1023 / 1024 * peak / (6 * beta))

    def zero_stages():
        dp, z1, z3 = fn(peak, beta, 64, 0), fn(peak, beta, 64, 1), fn(peak, beta, 64, 3)
        return (abs(z1 - dp) <= 1e-9 * dp and abs(z3 - 1.5 * dp) <= 1e-9 * dp,
                f"DP {dp:.0f}, ZeRO-1 {z1:.0f}, ZeRO-3 {z3:.0f}: expected ZeRO-1 = DP, ZeRO-3 = 1.5 DP")

    yield "ZeRO-1 sends what DP sends; ZeRO-3 one more all-gather, 1.5x", zero_stages
    yield "a slower compute (lower MFU) hides the same traffic with fewer tokens", lambda: \
        value_close(fn(peak, beta, 64, mfu=0.4), 0.4 * fn(peak, beta, 64))
    yield "fp32 gradients double it; one device sends nothing", lambda: (
        abs(fn(peak, beta, 8, grad_bytes=4) - 2 * fn(peak, beta, 8)) <= 1e-6 * fn(peak, beta, 8)
        and fn(peak, beta, 1) == 0, "expected 2x for fp32 and 0 for dp=1")

    def rejects():
        try:
            fn(0.0, beta, 8)
        except ValueError:
            return True, ""
        return False, "peak_flops=0 should raise ValueError"

    yield "a non-positive peak is an error", rejects


def _checks_choose_generation_tp(fn):
    from rlm_course.cost.architectures import get_spec
    from rlm_course.cost.hardware import get_device
    from rlm_course.cost import comm
    from rlm_course.cost.layouts import DoesNotFit, kv_slots, replica_decode_step_seconds

    h100 = get_device("H100-SXM-80GB")
    link = comm.Fabric.of(h100).link(8)
    spec70, spec8 = get_spec("llama-3-70b"), get_spec("llama-3-8b")

    def hand(spec, gpus, sequences, tokens, tp):
        slots = kv_slots(spec, tp, h100, tokens)
        per = -(-sequences // (gpus // tp))
        step = replica_decode_step_seconds(spec, h100, tp, min(per, slots), tokens // 2, link, 0.7)
        return -(-per // slots) * tokens * step

    def estimates():
        best, times = fn(spec70, h100, 64, 1024, 4096, link)
        want = {tp: hand(spec70, 64, 1024, 4096, tp) for tp in (2, 4, 8)}
        ok = set(times) == set(want) and all(abs(times[t] - want[t]) <= 1e-9 * want[t] for t in want)
        return ok and best == min(want, key=want.get), f"got {best}, {times}; expected {want}"

    yield "llama-3-70b on 64 H100s: tp 1 does not fit, the others estimated by hand", estimates
    yield "a few sequences per device: memory-bound decode, the widest TP wins (llama-3-8b)", \
        lambda: (fn(spec8, h100, 64, 64, 4096, link)[0] == 8, "expected tp 8")
    def many():
        want = {tp: hand(spec8, 64, 65536, 4096, tp) for tp in (1, 2, 4, 8)}
        best, times = fn(spec8, h100, 64, 65536, 4096, link)
        return best == min(want, key=want.get) == 8, f"got {best}, {times}; expected {want}"

    yield ("many sequences per device: the engine's all-reduce keeps a wide TP cheap in a node, "
           "its split weights free KV room (llama-3-8b)"), many

    def refuses():
        try:
            fn(spec70, h100, 8, 64, 4096, link, candidates=(1,))
        except DoesNotFit:
            return True, ""
        return False, "a 70B model on one H100 per replica should raise DoesNotFit"

    yield "nothing fits: DoesNotFit", refuses


#: The checks of each function: name -> a generator of ``(description, check)``.
CHECKS = {
    "min_tokens_per_device": _checks_min_tokens_per_device,
    "choose_generation_tp": _checks_choose_generation_tp,
}
