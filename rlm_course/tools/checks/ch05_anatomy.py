"""Checks of chapter 05's exercise: KV-cache size and decode arithmetic intensity."""

from __future__ import annotations


from rlm_course.tools.checks.common import value_close

#: The exercise's title.
TITLE = "KV-cache size and decode arithmetic intensity"
#: The functions the learner writes: (module, name), in the order the exercise presents them.
FUNCTIONS = (
    ("rlm_course.cost.architectures", "kv_cache_bytes"),
    ("rlm_course.cost.anatomy", "decode_intensity"),
)


def _checks_kv_cache_bytes(fn):
    yield "Llama-3-8B: 32 layers, 8 KV heads of 128, bf16: 128 KiB per token", lambda: \
        value_close(fn(32, 8, 128, 1, 2), 131072)
    yield "linear in the tokens: 4096 tokens of Qwen2.5-7B (28 layers, 4 KV heads)", lambda: \
        value_close(fn(28, 4, 128, 4096, 2), 57344 * 4096)
    yield "fp32 doubles it; MQA (1 KV head) divides it by the heads", lambda: value_close(
        fn(2, 1, 16, 10, 4), 2 * 2 * 1 * 16 * 10 * 4)


def _checks_decode_intensity(fn):
    from rlm_course.cost.architectures import TransformerSpec

    spec = TransformerSpec("check", n_layer=2, d_model=64, n_head=4, n_kv_head=2, d_ff=256,
                           vocab_size=100)
    params, kv = spec.params(), spec.kv_cache_bytes_per_token()

    def reference(batch, context):
        flops = batch * (2 * spec.matmul_params() + 4 * 2 * 4 * 16 * context)
        return flops / (2 * params + batch * context * kv)

    yield "one sequence at context 10 (hand formula)", lambda: value_close(fn(spec, 1, 10),
                                                                          reference(1, 10), 1e-6)
    yield "a batch of 64 at context 100", lambda: value_close(fn(spec, 64, 100),
                                                               reference(64, 100), 1e-6)

    def grows_with_batch():
        values = [fn(spec, b, 50) for b in (1, 2, 8, 32)]
        return values == sorted(values) and values[0] < values[-1], f"values {values}"

    yield "grows with the batch (the weights are shared)", grows_with_batch


#: The checks of each function: name -> a generator of ``(description, check)``.
CHECKS = {
    "kv_cache_bytes": _checks_kv_cache_bytes,
    "decode_intensity": _checks_decode_intensity,
}
