"""Checks of chapter 01's exercise: One KV-cache decoding step."""

from __future__ import annotations


import torch
import torch.nn.functional as F

from rlm_course.tools.checks.common import close

#: The exercise's title.
TITLE = "One KV-cache decoding step"
#: The functions the learner writes: (module, name), in the order the exercise presents them.
FUNCTIONS = (
    ("rlm_course.lm.model", "attend_with_kv_cache"),
)


def _checks_attend_with_kv_cache(fn):
    g = torch.Generator().manual_seed(0)
    b, h, t, d, max_len = 2, 3, 5, 4, 8
    q, k, v = (torch.randn(b, h, t, d, generator=g) for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def decode_matches_full():
        kc, vc = torch.zeros(b, h, max_len, d), torch.zeros(b, h, max_len, d)
        kc[:, :, :t - 1], vc[:, :, :t - 1] = k[:, :, :t - 1], v[:, :, :t - 1]
        mask = torch.ones(b, 1, 1, t, dtype=torch.bool)
        out = fn(q[:, :, -1:], k[:, :, -1:], v[:, :, -1:], kc, vc, t - 1, mask)
        return close(out, full[:, :, -1:])

    def cache_written():
        kc, vc = torch.zeros(b, h, max_len, d), torch.zeros(b, h, max_len, d)
        mask = torch.ones(b, 1, 1, 3, dtype=torch.bool)
        fn(q[:, :, :1], k[:, :, :1], v[:, :, :1], kc, vc, 2, mask)
        ok_k, msg = close(kc[:, :, 2], k[:, :, 0])
        ok_v, msg_v = close(vc[:, :, 2], v[:, :, 0])
        return ok_k and ok_v, msg or msg_v or "new key/value not written at position start"

    def prefill_matches_full():
        kc, vc = torch.zeros(b, h, max_len, d), torch.zeros(b, h, max_len, d)
        causal = torch.ones(t, t, dtype=torch.bool).tril().expand(b, 1, t, t)
        return close(fn(q, k, v, kc, vc, 0, causal), full)

    def mask_respected():
        kc, vc = torch.zeros(b, h, max_len, d), torch.zeros(b, h, max_len, d)
        kc[:, :, :2], vc[:, :, :2] = k[:, :, :2], v[:, :, :2]
        mask = torch.tensor([True, False, True]).expand(b, 1, 1, 3)
        out = fn(q[:, :, 2:3], k[:, :, 2:3], v[:, :, 2:3], kc, vc, 2, mask)
        keep = [0, 2]
        expected = F.scaled_dot_product_attention(q[:, :, 2:3], k[:, :, keep], v[:, :, keep])
        return close(out, expected)

    yield "decoding the last token equals full causal attention", decode_matches_full
    yield "new key and value are written at position start", cache_written
    yield "prefill (seq > 1, start 0) equals full causal attention", prefill_matches_full
    yield "a masked (padding) key is ignored", mask_respected


#: The checks of each function: name -> a generator of ``(description, check)``.
CHECKS = {
    "attend_with_kv_cache": _checks_attend_with_kv_cache,
}
