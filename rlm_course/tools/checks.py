"""Immediate feedback on exercise functions: hand-computed examples and properties.

``run_check(name, fn)`` runs every check of exercise ``name`` on ``fn`` and returns a
:class:`CheckReport` that prints as e.g. ``group_advantages: 3/4 checks pass`` followed by what
failed. A function that still raises ``NotImplementedError`` is reported as "not implemented
yet", never as a traceback.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class CheckResult:
    description: str
    passed: bool
    message: str = ""


@dataclass
class CheckReport:
    name: str
    results: list[CheckResult] = field(default_factory=list)
    not_implemented: str | None = None

    @property
    def n_passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def all_passed(self) -> bool:
        return self.not_implemented is None and all(r.passed for r in self.results)

    def __str__(self) -> str:
        if self.not_implemented is not None:
            why = self.not_implemented
            return f"{self.name}: " + (why if why.startswith("not implemented yet") else
                                       f"not implemented yet ({why})")
        lines = [f"{self.name}: {self.n_passed}/{len(self.results)} checks pass"]
        for r in self.results:
            mark = "ok  " if r.passed else "FAIL"
            lines.append(f"  [{mark}] {r.description}" + ("" if r.passed else f": {r.message}"))
        return "\n".join(lines)


def _close(actual, expected, atol=1e-5) -> tuple[bool, str]:
    """Whether a learner's tensor equals the reference up to float32 rounding.

    A correct implementation may add in another order than the reference, so it can differ in the
    last bits, by how much depending on the machine. The checks use inputs of order 1 and sums of
    at most a few dozen terms, whose float32 rounding stays below 1e-6 relative
    (:func:`rlm_course.numerics.reorder_tolerance`); ``rtol=1e-4`` and ``atol=1e-5`` are a hundred
    times that, far below the size of any wrong formula.
    """
    if not isinstance(actual, torch.Tensor):
        return False, f"expected a tensor, got {type(actual).__name__}"
    if not isinstance(expected, torch.Tensor):
        expected = torch.as_tensor(expected)
    if actual.shape != expected.shape:
        return False, f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if not torch.allclose(actual.float(), expected.float(), atol=atol, rtol=1e-4):
        got = [round(x, 4) for x in actual.detach().float().flatten()[:8].tolist()]
        want = [round(x, 4) for x in expected.float().flatten()[:8].tolist()]
        return False, f"got {got}, expected {want}"
    return True, ""


# ------------------------------------------------------------------ exercise checks
def _checks_group_advantages(fn):
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    s = 0.5 / math.sqrt(1 / 3)  # (1 - 0.5) / unbiased std of [1, 0, 0, 1]
    yield "hand example, G=4, std-normalised", lambda: _close(
        fn(r, 4), torch.tensor([s, -s, -s, s, 0, 0, 0, 0]), atol=1e-4)
    yield "hand example without std (Dr. GRPO)", lambda: _close(
        fn(r, 4, normalize_std=False), torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))
    rewards = torch.rand(6 * 5, generator=torch.Generator().manual_seed(0))
    def sums_to_zero():
        out = fn(rewards, 5)
        if not isinstance(out, torch.Tensor) or out.shape != (30,):
            return False, f"expected shape (30,), got {getattr(out, 'shape', type(out).__name__)}"
        return _close(out.view(6, 5).sum(1), torch.zeros(6), atol=1e-4)

    yield "each group's advantages sum to zero", sums_to_zero
    yield "groups are contiguous runs of group_size", lambda: _close(
        fn(torch.tensor([0.0, 2.0, 10.0, 14.0]), 2, normalize_std=False),
        torch.tensor([-1.0, 1.0, -2.0, 2.0]))
    yield from _equal_groups_get_zero(fn)


def _equal_groups_get_zero(fn, **kwargs):
    """Eight equal rewards of 0.1 (a well-formed wrong answer) or 0.7: the float mean is one ulp
    off, so only an explicit test for equal rewards gives exactly 0."""
    def check():
        for value in (0.1, 0.7):
            out = fn(torch.full((8,), value), 8, **kwargs)
            if not isinstance(out, torch.Tensor) or not bool((out == 0).all()):
                got = out.tolist()[:3] if isinstance(out, torch.Tensor) else out
                return False, (f"rewards all {value}: got {got}..., expected exactly 0 (a float "
                               "mean of equal values can be one ulp off; test for equal rewards)")
        return True, ""

    yield "a group of equal rewards gets exactly 0", check


def _checks_clipped_objective(fn):
    ones = torch.ones(2, 2)
    adv = torch.tensor([2.0, -1.0])
    yield "ratio 1 gives -A on every token", lambda: _close(
        fn(ones, adv, 0.2), torch.tensor([[-2.0, -2.0], [1.0, 1.0]]))
    ratio = torch.tensor([[2.0, 1.0], [2.0, 1.0]])
    yield "positive A: ratio 2 clipped to 1.2", lambda: _close(
        fn(ratio, torch.tensor([1.0, 1.0]), 0.2), torch.tensor([[-1.2, -1.0], [-1.2, -1.0]]))
    yield "negative A: ratio 2 not clipped (pessimistic bound)", lambda: _close(
        fn(ratio, torch.tensor([-1.0, -1.0]), 0.2), torch.tensor([[2.0, 1.0], [2.0, 1.0]]))
    yield "decoupled bounds (DAPO): ratio 1.3 clipped to 1.28, ratio 0.7 to 0.8", lambda: _close(
        fn(torch.tensor([[1.3, 0.7]]), torch.tensor([1.0]), 0.2, 0.28), torch.tensor([[-1.28, -0.7]]))

    def gradient_check():
        x = ratio.clone().requires_grad_(True)
        fn(x, torch.tensor([1.0, 1.0]), 0.2).sum().backward()
        expected = torch.tensor([[0.0, -1.0], [0.0, -1.0]])  # clipped tokens carry no gradient
        return _close(x.grad, expected)

    yield "clipped tokens have zero gradient", gradient_check


def _checks_kl_k3(fn):
    lp = torch.log(torch.tensor([[0.5, 0.2]]))
    ref = torch.log(torch.tensor([[0.25, 0.2]]))
    yield "hand example: p=0.5, p_ref=0.25 gives 0.5 + ln 2 - 1", lambda: _close(
        fn(lp, ref), torch.tensor([[0.5 + math.log(2) - 1, 0.0]]))
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 7, generator=g), torch.randn(4, 7, generator=g)
    yield "non-negative", lambda: (bool((fn(a, b) >= 0).all()), "found a negative value")

    def nearly_equal():  # x = log rho = -1e-6: exp(x) - x - 1 cancels; the true value is 5e-13
        got = fn(torch.tensor([0.0]), torch.tensor([-1e-6]))
        want = 0.5e-12
        ok = bool((got >= 0).all()) and abs(got.item() - want) <= 1e-3 * want
        return ok, (f"k3 for log rho = -1e-6 is {got.item():.3e}, expected {want:.3e} "
                    "(use torch.expm1, or the series for small log rho)")

    yield "accurate and non-negative when the policies nearly agree", nearly_equal
    yield "exactly 0 where the log-probs are equal", lambda: (
        bool((fn(a, a) == 0).all()), "k3(x, x) is not 0")

    def unbiased():
        p = torch.tensor([0.6, 0.3, 0.1])
        q = torch.tensor([0.3, 0.3, 0.4])
        exact = (p * (p / q).log()).sum()
        samples = torch.multinomial(p, 200_000, replacement=True,
                                    generator=torch.Generator().manual_seed(1))
        estimate = fn(p.log()[samples][None], q.log()[samples][None]).mean()
        ok = abs(estimate.item() - exact.item()) < 0.01
        return ok, f"Monte Carlo mean {estimate.item():.4f}, exact KL(p||q) {exact.item():.4f}"

    yield "unbiased: its mean over samples of pi_theta is KL(pi_theta || pi_ref)", unbiased


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
        return _close(out, full[:, :, -1:])

    def cache_written():
        kc, vc = torch.zeros(b, h, max_len, d), torch.zeros(b, h, max_len, d)
        mask = torch.ones(b, 1, 1, 3, dtype=torch.bool)
        fn(q[:, :, :1], k[:, :, :1], v[:, :, :1], kc, vc, 2, mask)
        ok_k, msg = _close(kc[:, :, 2], k[:, :, 0])
        ok_v, msg_v = _close(vc[:, :, 2], v[:, :, 0])
        return ok_k and ok_v, msg or msg_v or "new key/value not written at position start"

    def prefill_matches_full():
        kc, vc = torch.zeros(b, h, max_len, d), torch.zeros(b, h, max_len, d)
        causal = torch.ones(t, t, dtype=torch.bool).tril().expand(b, 1, t, t)
        return _close(fn(q, k, v, kc, vc, 0, causal), full)

    def mask_respected():
        kc, vc = torch.zeros(b, h, max_len, d), torch.zeros(b, h, max_len, d)
        kc[:, :, :2], vc[:, :, :2] = k[:, :, :2], v[:, :, :2]
        mask = torch.tensor([True, False, True]).expand(b, 1, 1, 3)
        out = fn(q[:, :, 2:3], k[:, :, 2:3], v[:, :, 2:3], kc, vc, 2, mask)
        keep = [0, 2]
        expected = F.scaled_dot_product_attention(q[:, :, 2:3], k[:, :, keep], v[:, :, keep])
        return _close(out, expected)

    yield "decoding the last token equals full causal attention", decode_matches_full
    yield "new key and value are written at position start", cache_written
    yield "prefill (seq > 1, start 0) equals full causal attention", prefill_matches_full
    yield "a masked (padding) key is ignored", mask_respected


def _checks_gae(fn):
    one = torch.ones(1, 2, dtype=torch.bool)

    def hand():
        adv, ret = fn(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.8]]), one, 1.0, 0.5)
        ok_a, msg_a = _close(adv, torch.tensor([[0.4, 0.2]]))
        ok_r, msg_r = _close(ret, torch.tensor([[0.9, 1.0]]))
        return ok_a and ok_r, msg_a or msg_r

    def monte_carlo():  # gamma = lambda = 1: A_t = (sum of rewards from t on) - V_t
        g = torch.Generator().manual_seed(0)
        r, v = torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)
        mask = torch.ones(2, 4, dtype=torch.bool)
        to_go = r.flip(1).cumsum(1).flip(1)
        return _close(fn(r, v, mask, 1.0, 1.0)[0], to_go - v)

    def one_step():  # lambda = 0: A_t = delta_t
        r, v = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[0.5, 0.25, 1.0]])
        delta = torch.tensor([[1.0 + 0.9 * 0.25 - 0.5, 2.0 + 0.9 * 1.0 - 0.25, 3.0 - 1.0]])
        return _close(fn(r, v, torch.ones(1, 3, dtype=torch.bool), 0.9, 0.0)[0], delta)

    def masked():  # a 2-token response in 4 columns: padding neither contributes nor gets a value
        r = torch.tensor([[0.0, 1.0, 99.0, 99.0]])
        v = torch.tensor([[0.5, 0.8, 99.0, 99.0]])
        mask = torch.tensor([[True, True, False, False]])
        return _close(fn(r, v, mask, 1.0, 0.5)[0], torch.tensor([[0.4, 0.2, 0.0, 0.0]]))

    yield "hand example (2 tokens, gamma 1, lambda 0.5) with returns", hand
    yield "gamma = lambda = 1 gives reward-to-go minus value", monte_carlo
    yield "lambda = 0 gives the one-step TD error", one_step
    yield "positions after the response are ignored and zero", masked


def _checks_rloo_advantages(fn):
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    yield "hand example: baseline of each is the mean of the other three", lambda: _close(
        fn(r, 4), torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))
    x = torch.rand(12, generator=torch.Generator().manual_seed(0))
    centred = (x.view(4, 3) - x.view(4, 3).mean(1, keepdim=True)).reshape(-1)
    yield "equals G/(G-1) times the centred reward", lambda: _close(fn(x, 3), 1.5 * centred)
    yield "groups are contiguous", lambda: _close(fn(torch.tensor([0.0, 2.0, 10.0, 14.0]), 2),
                                                  torch.tensor([-2.0, 2.0, -4.0, 4.0]))
    yield from _equal_groups_get_zero(fn)


def _checks_sequence_ratio(fn):
    lp = torch.log(torch.tensor([[0.5, 0.5, 0.9], [0.2, 0.4, 0.4]]))
    old = torch.log(torch.tensor([[0.25, 0.5, 0.1], [0.1, 0.1, 0.4]]))
    mask = torch.tensor([[True, True, False], [True, True, True]])
    yield "hand example: geometric mean of token ratios (sqrt(2*1), cbrt(2*4*1))", lambda: _close(
        fn(lp, old, mask), torch.tensor([math.sqrt(2.0), 2.0]))
    yield "ratio 1 when the policies agree", lambda: _close(fn(lp, lp, mask), torch.ones(2))
    yield "masked tokens do not count", lambda: _close(
        fn(lp[:1, :2], old[:1, :2], mask[:1, :2]), torch.tensor([math.sqrt(2.0)]))


def _checks_aggregate_loss(fn):
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
    m = torch.tensor([[True, True, True], [True, False, False]])
    yield "token-mean hand example: (1+2+3+4)/4", lambda: _close(
        fn(x, m, "token-mean"), torch.tensor(2.5))
    yield "token-mean weighs every token alike (not every sequence)", lambda: _close(
        fn(torch.tensor([[1.0] * 6, [0.0] * 6]), torch.tensor([[True] * 6, [True] + [False] * 5]),
           "token-mean"), torch.tensor(6 / 7))


def _value_close(actual, expected, rel=1e-9) -> tuple[bool, str]:
    if not isinstance(actual, (int, float)):
        return False, f"expected a number, got {type(actual).__name__}"
    ok = abs(actual - expected) <= rel * abs(expected)
    return ok, f"got {actual}, expected {expected}"


def _checks_kv_cache_bytes(fn):
    yield "Llama-3-8B: 32 layers, 8 KV heads of 128, bf16: 128 KiB per token", lambda: \
        _value_close(fn(32, 8, 128, 1, 2), 131072)
    yield "linear in the tokens: 4096 tokens of Qwen2.5-7B (28 layers, 4 KV heads)", lambda: \
        _value_close(fn(28, 4, 128, 4096, 2), 57344 * 4096)
    yield "fp32 doubles it; MQA (1 KV head) divides it by the heads", lambda: _value_close(
        fn(2, 1, 16, 10, 4), 2 * 2 * 1 * 16 * 10 * 4)


def _checks_decode_intensity(fn):
    from rlm_course.cost.architectures import TransformerSpec

    spec = TransformerSpec("check", n_layer=2, d_model=64, n_head=4, n_kv_head=2, d_ff=256,
                           vocab_size=100)
    params, kv = spec.params(), spec.kv_cache_bytes_per_token()

    def reference(batch, context):
        flops = batch * (2 * spec.matmul_params() + 4 * 2 * 4 * 16 * context)
        return flops / (2 * params + batch * context * kv)

    yield "one sequence at context 10 (hand formula)", lambda: _value_close(fn(spec, 1, 10),
                                                                          reference(1, 10), 1e-6)
    yield "a batch of 64 at context 100", lambda: _value_close(fn(spec, 64, 100),
                                                               reference(64, 100), 1e-6)

    def grows_with_batch():
        values = [fn(spec, b, 50) for b in (1, 2, 8, 32)]
        return values == sorted(values) and values[0] < values[-1], f"values {values}"

    yield "grows with the batch (the weights are shared)", grows_with_batch


def _checks_layer(fn):
    from rlm_course.cost.workdepth import Computation, forward_cost, layer_norm, matmul
    from rlm_course.lm.model import ModelConfig

    config = ModelConfig(vocab_size=24, n_layer=3, n_head=2, d_model=16, max_seq_len=64)

    def against_closed_form(batch, seq, ctx):
        def check():
            out = fn(config, batch, seq, ctx)
            if not isinstance(out, Computation):
                return False, f"expected a Computation, got {type(out).__name__}"
            work, depth = forward_cost(config, batch, seq, ctx)
            rows = batch * seq
            # forward = embed + L layers + final norm + head
            head = matmul(rows, config.d_model, config.vocab_size)
            norm = layer_norm(rows, config.d_model)
            w = (work - rows * config.d_model - norm.work - head.work) // config.n_layer
            d = (depth - 1 - norm.depth - head.depth) // config.n_layer
            return (out.work, out.depth) == (w, d), f"got W={out.work}, D={out.depth}; expected W={w}, D={d}"
        return check

    yield "W and D of a layer, 2 sequences of 5 tokens", against_closed_form(2, 5, None)
    yield "W and D of a decode step (1 token, context 12)", against_closed_form(3, 1, 12)

    def batch_adds_work_not_depth():
        a, b = fn(config, 1, 4, None), fn(config, 8, 4, None)
        return (b.depth == a.depth and b.work == 8 * a.work,
                f"batch 1: W={a.work}, D={a.depth}; batch 8: W={b.work}, D={b.depth}")

    yield "8x the sequences: 8x the work, the same depth", batch_adds_work_not_depth


def _checks_brent_bound(fn):
    yield "W=100, D=10 on 10 processors: 20", lambda: _value_close(fn(100, 10, 10), 20.0)
    yield "one processor: W + D", lambda: _value_close(fn(100, 10, 1), 110.0)
    yield "infinitely many processors: approaches D", lambda: _value_close(fn(100, 10, 10**9),
                                                                          10.0, 1e-6)

    def rejects_zero():
        try:
            fn(100, 10, 0)
        except ValueError:
            return True, ""
        return False, "processors=0 should raise ValueError"

    yield "no processors is an error", rejects_zero


def _checks_row_parallel_linear(fn):
    from rlm_course.parallel.world import World

    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(3, 8, generator=g), torch.randn(5, 8, generator=g), torch.randn(5, generator=g)
    expected = x @ w.T + b

    def equals(p):
        def check():
            world = World(p)
            out = fn(world, list(x.chunk(p, dim=-1)), list(w.chunk(p, dim=-1)), b)
            if not isinstance(out, list) or len(out) != p:
                return False, f"expected a list of {p} tensors, got {type(out).__name__}"
            for y in out:
                ok, msg = _close(y, expected, atol=1e-5)
                if not ok:
                    return ok, msg
            m = 3 * 5 * 4
            want = 2 * (p - 1) * m // p
            return world.sent == [want] * p, f"each rank sent {world.sent}, expected {want} (one all-reduce)"
        return check

    yield "2 ranks: every rank gets x W^T + b, with one all-reduce", equals(2)
    yield "4 ranks", equals(4)
    yield "1 rank: a plain linear layer", equals(1)


def _checks_one_f_one_b(fn):
    yield "2 devices, 3 micro-batches (hand example)", lambda: (
        fn(2, 3) == [[("F", 0, 0), ("F", 1, 0), ("B", 0, 0), ("F", 2, 0), ("B", 1, 0), ("B", 2, 0)],
                     [("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0), ("F", 2, 0), ("B", 2, 0)]],
        f"got {fn(2, 3)}")

    def bubble():
        from rlm_course.parallel.pipeline import bubble_formula, simulate

        timeline = simulate(fn(4, 8))
        want = bubble_formula("1f1b", 4, 8)
        return abs(timeline.bubble_fraction - want) < 1e-9, (
            f"bubble {timeline.bubble_fraction:.4f}, expected {want:.4f}")

    yield "4 devices, 8 micro-batches: runs without deadlock, bubble (p-1)/(m+p-1)", bubble

    def memory():
        from rlm_course.parallel.pipeline import simulate

        timeline = simulate(fn(4, 12))
        peaks = [timeline.peak_in_flight(d) for d in range(4)]
        return peaks == [4, 3, 2, 1], f"micro-batches in flight per device {peaks}, expected [4, 3, 2, 1]"

    yield "device d holds at most p - d micro-batches in flight", memory


def _checks_online_softmax_merge(fn):
    g = torch.Generator().manual_seed(0)
    scores, values = torch.randn(3, 6, generator=g), torch.randn(6, 2, generator=g)

    def part(cols):
        s = scores[:, cols]
        return torch.softmax(s, -1) @ values[cols], torch.logsumexp(s, -1)

    full = torch.softmax(scores, -1) @ values
    yield "merging two halves of the keys gives softmax over all of them", lambda: _close(
        fn(*part(slice(0, 3)), *part(slice(3, 6)))[0], full)
    yield "the merged log-sum-exp is that of all the scores", lambda: _close(
        fn(*part(slice(0, 2)), *part(slice(2, 6)))[1], torch.logsumexp(scores, -1))
    empty = torch.full((3,), float("-inf"))
    yield "a part with no keys (-inf) contributes nothing, and no NaN", lambda: _close(
        fn(torch.zeros(3, 2), empty, *part(slice(0, 6)))[0], full)


def _checks_dispatch_indices(fn):
    ids = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0]])
    yield "hand example: capacity 2, three experts", lambda: _close(
        fn(ids, 3, 2), torch.tensor([[0, 0], [1, 0], [-1, 1], [-1, -1]]))
    yield "large capacity: slots count each expert's pairs in order", lambda: _close(
        fn(ids, 3, 10), torch.tensor([[0, 0], [1, 0], [2, 1], [2, 3]]))
    yield "capacity 0 drops everything", lambda: _close(fn(ids, 3, 0), torch.full((4, 2), -1))


def _checks_zero1_step(fn):
    from rlm_course.parallel.data_parallel import adam_update, bytes_sent_per_step
    from rlm_course.parallel.world import World

    lr = 0.1

    def setup(p, grads):
        n = grads[0].numel()
        shard = n // p
        params = torch.zeros(n, dtype=grads[0].dtype)
        shards = [params[r * shard:(r + 1) * shard].clone() for r in range(p)]
        zeros = [torch.zeros(shard, dtype=grads[0].dtype) for _ in range(p)]
        return World(p), params, shards, zeros, [z.clone() for z in zeros]

    def first_step_is_sign():
        # Adam's first step moves each parameter by lr against the sign of its summed gradient:
        # m_hat = g, v_hat = g^2, so the update is lr g / (|g| + eps)
        grads = [torch.tensor([0.5, -1.0, 1.5, -2.0], dtype=torch.float64),
                 torch.tensor([0.5, -1.0, 1.5, -2.0], dtype=torch.float64)]
        world, _, shards, m, v = setup(2, grads)
        out = fn(world, grads, shards, m, v, 1, lr)
        if not isinstance(out, list) or len(out) != 2:
            return False, f"expected a list of 2 full parameter vectors, got {type(out).__name__}"
        return _close(out[0], torch.tensor([-lr, lr, -lr, lr], dtype=torch.float64), atol=1e-6)

    g = torch.Generator().manual_seed(0)
    grads4 = [torch.randn(8, generator=g, dtype=torch.float64) for _ in range(4)]

    def equals_one_device_adam():
        # two steps on 4 ranks against two steps of Adam on the summed gradient on one device
        world, params, shards, m, v = setup(4, grads4)
        m1, v1 = torch.zeros(8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64)
        reference = params.clone()
        out = None
        for step in (1, 2):
            out = fn(world, grads4, shards, m, v, step, lr)
            if not isinstance(out, list) or len(out) != 4:
                return False, f"expected a list of 4 full parameter vectors, got {type(out).__name__}"
            shards = [out[0][r * 2:(r + 1) * 2].clone() for r in range(4)]
            reference = adam_update(reference, sum(grads4), m1, v1, step, lr)
        return _close(out[0], reference)

    def every_rank_holds_the_same_parameters():
        world, _, shards, m, v = setup(4, grads4)
        out = fn(world, grads4, shards, m, v, 1, lr)
        same = all(torch.equal(o, out[0]) for o in out)
        return same and out[0].shape == (8,), "the ranks' parameter vectors differ (or are not full)"

    def moments_stay_sharded():
        world, _, shards, m, v = setup(4, grads4)
        fn(world, grads4, shards, m, v, 1, lr)
        total = sum(grads4)
        ok_m, msg_m = _close(m[1], 0.1 * total[2:4])  # (1 - beta1) g of rank 1's shard
        ok_v, msg_v = _close(v[1], 0.001 * total[2:4] ** 2)  # (1 - beta2) g^2
        return ok_m and ok_v, msg_m or msg_v or "m[r], v[r] must be rank r's moments, updated in place"

    def bytes_of_one_all_reduce():
        grads = [t.float() for t in grads4]
        world, _, shards, m, v = setup(4, grads)
        fn(world, grads, shards, m, v, 1, lr)
        want = bytes_sent_per_step(1, 8, 4)  # 2 (p - 1) / p x 4 bytes x 8 elements = 48
        if world.sent != [want] * 4:
            return False, (f"each rank sent {world.sent}, expected {want}: one reduce-scatter and "
                           "one all-gather")
        # an all-reduce moves the same bytes, but leaves every rank the whole gradient: ZeRO-1
        # needs two collectives, each rank keeping only its shard in between
        calls = [e.name for e in world.events if e.worker == 0 and e.stage == "comm"]
        return len(calls) == 2, (f"rank 0 took part in {len(calls)} collectives {calls}; expected "
                                 "two: a reduce-scatter, then an all-gather")

    yield "hand example: the first Adam step moves each parameter by lr against its gradient", \
        first_step_is_sign
    yield "two steps on 4 ranks equal two Adam steps of one device on the summed gradient", \
        equals_one_device_adam
    yield "every rank ends with the same full parameter vector", every_rank_holds_the_same_parameters
    yield "each rank updates only its own shard of the Adam moments, in place", moments_stay_sharded
    yield "two collectives (reduce-scatter, all-gather), 2 (p-1)/p x the parameter bytes per rank", \
        bytes_of_one_all_reduce


CHECKS = {
    "group_advantages": _checks_group_advantages,
    "clipped_objective": _checks_clipped_objective,
    "kl_k3": _checks_kl_k3,
    "attend_with_kv_cache": _checks_attend_with_kv_cache,
    "gae": _checks_gae,
    "rloo_advantages": _checks_rloo_advantages,
    "sequence_ratio": _checks_sequence_ratio,
    "aggregate_loss": _checks_aggregate_loss,
    "kv_cache_bytes": _checks_kv_cache_bytes,
    "decode_intensity": _checks_decode_intensity,
    "layer": _checks_layer,
    "brent_bound": _checks_brent_bound,
    "zero1_step": _checks_zero1_step,
    "row_parallel_linear": _checks_row_parallel_linear,
    "one_f_one_b": _checks_one_f_one_b,
    "online_softmax_merge": _checks_online_softmax_merge,
    "dispatch_indices": _checks_dispatch_indices,
}


# ---------------------------------------------------------------------------- chapter 11: real ranks
def _on_ranks(fn, ranks: int) -> dict:
    """Run the checks of exercise ``fn.__name__`` on ``ranks`` real processes (the function is
    loaded there from its file). Never raises: ``{"results": [...]}``, ``{"not_implemented":
    message}`` or ``{"error": message}``."""
    import inspect
    import warnings

    from rlm_course.distributed.by_hand import exercise_worker
    from rlm_course.distributed.launch import DistributedError, OversubscriptionWarning, launch

    try:
        path = inspect.getsourcefile(fn)
    except TypeError:
        path = None
    if path is None:
        return {"error": f"{getattr(fn, '__name__', fn)} is not defined in a file; write it in "
                         "the exercise file (processes load it from there)."}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OversubscriptionWarning)
            return launch(exercise_worker, ranks, args=(path, fn.__name__), timeout=20.0,
                          grace=5.0)[0]
    except DistributedError as err:
        first = str(err).split("\nTracebacks:")[0]
        return {"error": f"{first} (a deadlock? every send needs a receive posted on its peer)"
                if "Timed out" in first else first}


def _checks_on_ranks(fn, rank_counts):
    for ranks in rank_counts:
        outcome = _on_ranks(fn, ranks)
        if "not_implemented" in outcome:
            def not_implemented(message=outcome["not_implemented"]):
                raise NotImplementedError(message)
            yield f"{ranks} ranks", not_implemented
            return
        if "error" in outcome:
            yield f"{ranks} ranks: runs on real processes", lambda o=outcome: (False, o["error"])
            continue
        for description, passed, message in outcome["results"]:
            yield description, (lambda ok=passed, why=message: (ok, why))


def _checks_ring_all_reduce(fn):
    """Graded against ``dist.all_reduce`` on 2 and 3 real processes (3: chunks of unequal size)."""
    yield from _checks_on_ranks(fn, (2, 3))


def _checks_bucketed_all_reduce(fn):
    """Graded against ``dist.all_reduce`` on 2 real processes, bytes counted per call."""
    yield from _checks_on_ranks(fn, (2,))


CHECKS.update({"ring_all_reduce": _checks_ring_all_reduce,
               "bucketed_all_reduce": _checks_bucketed_all_reduce})


# ---------------------------------------------------------------------------- chapters 12-13: systems
def _checks_bucketed_broadcast(fn):
    """A broadcast inside one process: the source's call records each buffer it sends, a
    receiver's call gets the recorded buffers back in order (what ``dist.broadcast`` does across
    processes)."""
    from rlm_course.systems.weight_sync import bucket_plan

    def state(seed, dtype_last=torch.float32):
        g = torch.Generator().manual_seed(seed)
        return [torch.randn(4, 3, generator=g), torch.randn(5, generator=g),
                torch.randn(2, 2, 2, generator=g), torch.randn(7, generator=g).to(dtype_last)]

    def run(bucket_bytes, dtype_last=torch.float32):
        source, receiver = state(0, dtype_last), [torch.zeros_like(t) for t in state(0, dtype_last)]
        sent = []

        def send(buffer):
            sent.append(buffer.clone())

        def receive(buffer):
            if not sent:
                raise AssertionError("the receiver broadcast more buckets than the source")
            buffer.copy_(sent.pop(0))

        sizes = fn(source, bucket_bytes, send)
        n_sent = len(sent)
        fn(receiver, bucket_bytes, receive)
        return source, receiver, sizes, n_sent, sent

    def receiver_gets_the_source_weights():
        source, receiver, *_ = run(40)
        same = all(torch.equal(a, b) for a, b in zip(source, receiver))
        return same, "the receiver's tensors differ from the source's after the broadcast"

    def one_broadcast_per_bucket():
        sizes_bytes = [t.numel() * 4 for t in state(0)]
        _, _, sizes, n_sent, _ = run(40)
        want = len(bucket_plan(sizes_bytes, 40))
        ok = n_sent == want and isinstance(sizes, list) and len(sizes) == want
        return ok, f"{n_sent} broadcasts and {sizes!r} returned; expected {want} buckets of <= 40 bytes"

    def sizes_add_up():
        _, _, sizes, _, _ = run(64)
        total = sum(t.numel() * 4 for t in state(0))
        ok = sum(sizes) == total and all(s <= 64 or s == max(sizes) for s in sizes)
        return ok, f"bucket sizes {sizes} should add up to the {total} bytes of the tensors"

    def whole_state_in_one_bucket():
        source, receiver, sizes, n_sent, _ = run(10**6)
        ok = n_sent == 1 and all(torch.equal(a, b) for a, b in zip(source, receiver))
        return ok, f"a bucket bigger than the state dict should give one broadcast, got {n_sent}"

    def dtypes_are_not_mixed():
        source, receiver, sizes, n_sent, sent = run(10**6, torch.float64)
        ok = (n_sent == 2 and {b.dtype for b in sent} <= {torch.float32, torch.float64}
              and all(torch.equal(a, b) for a, b in zip(source, receiver)))
        return ok, ("a float64 tensor after float32 ones must start a new bucket (use the plan's "
                    f"buckets); got {n_sent} broadcasts")

    yield "the receiver ends with exactly the source's weights", receiver_gets_the_source_weights
    yield "one broadcast per bucket of bucket_plan", one_broadcast_per_bucket
    yield "the returned bucket sizes add up to the state's bytes", sizes_add_up
    yield "a large bucket sends the whole state at once", whole_state_in_one_bucket
    yield "a flat buffer holds one dtype", dtypes_are_not_mixed


def _checks_rollout_capacity(fn):
    def hand_examples():
        cases = [((0, 0, 4, 0), 4), ((0, 0, 4, 4), 0), ((1, 0, 4, 4), 4), ((0, 1, 4, 0), 8),
                 ((0, 1, 4, 6), 2), ((3, 2, 1, 5), 1), ((0, 0, 4, 9), 0)]
        for args, want in cases:
            got = fn(*args)
            if got != want:
                return False, f"rollout_capacity{args} = {got}, expected {want}"
        return True, ""

    def never_more_than_eta_stale():
        import random

        rng = random.Random(0)
        for eta in (0, 1, 2, 4):
            for _ in range(50):  # random interleavings of "start a sample" and "finish a step"
                batch, version, started, start_version = 3, 0, 0, []
                while version < 6:
                    if rng.random() < 0.6 and fn(version, eta, batch, started) > 0:
                        start_version.append(version)
                        started += 1
                    elif started >= (version + 1) * batch:  # the next batch is complete
                        version += 1
                    elif fn(version, eta, batch, started) == 0:
                        return False, (f"eta={eta}: capacity 0 with batch {version + 1} not yet "
                                       "started in full: the pipeline would stop")
                for j, v in enumerate(start_version):
                    if j // batch - v > eta:
                        return False, (f"eta={eta}: sample {j} started at version {v} is trained "
                                       f"at version {j // batch}, {j // batch - v} stale")
        return True, ""

    def eta_zero_is_synchronous():
        ok = fn(5, 0, 8, 40) == 8 and fn(5, 0, 8, 48) == 0
        return ok, "with eta=0 the rollout may only start the batch the current version trains next"

    def never_negative():
        return fn(0, 0, 4, 100) == 0, "capacity must not go below 0"

    yield "hand examples", hand_examples
    yield "eta = 0: one batch at a time", eta_zero_is_synchronous
    yield "never negative", never_negative
    yield "no sample is trained more than eta versions stale (random event orders)", \
        never_more_than_eta_stale


def _checks_decoupled_ppo_loss(fn):
    from rlm_course.rl.losses import policy_loss

    g = torch.Generator().manual_seed(0)
    logp = (torch.randn(3, 4, generator=g) * 0.1 - 1.0)
    prox = logp + torch.randn(3, 4, generator=g) * 0.05
    behav = prox + torch.randn(3, 4, generator=g) * 0.3
    adv = torch.tensor([1.0, -0.5, 2.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)

    def on_policy_is_ppo():
        loss, _ = fn(logp, prox, prox, adv, mask)
        want, _ = policy_loss(logp, prox, adv, mask)
        return _close(loss, want)

    def hand_example():
        lp, px, bh = torch.tensor([[0.0]]), torch.tensor([[0.0]]), torch.tensor([[-0.5]])
        loss, _ = fn(lp, px, bh, torch.tensor([2.0]), torch.tensor([[True]]), weight_cap=10.0)
        return _close(loss, torch.tensor(-2.0 * math.exp(0.5)))  # w = e^0.5, u = 1, A = 2

    def weight_is_truncated():
        lp, px, bh = torch.tensor([[0.0]]), torch.tensor([[0.0]]), torch.tensor([[-3.0]])
        loss, _ = fn(lp, px, bh, torch.tensor([1.0]), torch.tensor([[True]]), weight_cap=2.0)
        return _close(loss, torch.tensor(-2.0))  # w = min(e^3, 2)

    def weight_has_no_gradient():
        x = logp.clone().requires_grad_(True)
        loss, _ = fn(x, prox, behav, adv, mask, weight_cap=100.0)
        loss.backward()
        y = logp.clone().requires_grad_(True)
        w = torch.exp(prox - behav)  # PPO's per-token objective, times the constant weight
        per = -torch.minimum(torch.exp(y - prox) * adv[:, None],
                             torch.exp(y - prox).clamp(0.8, 1.2) * adv[:, None]) * w
        ref = (per * mask).sum(1) / mask.sum(1)
        ref.mean().backward()
        return _close(x.grad, y.grad)

    def padding_is_ignored():
        b2 = behav.clone()
        b2[~mask] = 50.0
        return _close(fn(logp, prox, b2, adv, mask)[0], fn(logp, prox, behav, adv, mask)[0])

    yield "behaviour = proximal: PPO's clipped loss", on_policy_is_ppo
    yield "hand example: w = exp(prox - behaviour) scales the objective", hand_example
    yield "the weight is truncated at weight_cap", weight_is_truncated
    yield "the weight is a constant: the gradient is w times PPO's", weight_has_no_gradient
    yield "padding tokens change nothing", padding_is_ignored


CHECKS.update({"bucketed_broadcast": _checks_bucketed_broadcast,
               "rollout_capacity": _checks_rollout_capacity,
               "decoupled_ppo_loss": _checks_decoupled_ppo_loss})


# ---------------------------------------------------------------------------- chapter 14: planning
def _checks_min_tokens_per_device(fn):
    peak, beta = 989.4e12, 50e9  # H100 dense bf16; one 400 Gb/s NIC per direction

    yield "H100s across nodes, plain DP over 1,024 devices: 2 x 2 x (1023/1024) x peak / (6 beta)", \
        lambda: _value_close(fn(peak, beta, 1024), 2 * 2 * 1023 / 1024 * peak / (6 * beta))

    def zero_stages():
        dp, z1, z3 = fn(peak, beta, 64, 0), fn(peak, beta, 64, 1), fn(peak, beta, 64, 3)
        return (abs(z1 - dp) <= 1e-9 * dp and abs(z3 - 1.5 * dp) <= 1e-9 * dp,
                f"DP {dp:.0f}, ZeRO-1 {z1:.0f}, ZeRO-3 {z3:.0f}: expected ZeRO-1 = DP, ZeRO-3 = 1.5 DP")

    yield "ZeRO-1 sends what DP sends; ZeRO-3 one more all-gather, 1.5x", zero_stages
    yield "a slower compute (lower MFU) hides the same traffic with fewer tokens", lambda: \
        _value_close(fn(peak, beta, 64, mfu=0.4), 0.4 * fn(peak, beta, 64))
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


CHECKS.update({"min_tokens_per_device": _checks_min_tokens_per_device,
               "choose_generation_tp": _checks_choose_generation_tp})


def run_check(name: str, fn) -> CheckReport:
    """Run every check of exercise ``name`` on ``fn``.

    Raises:
        ValueError: for an unknown exercise name.
    """
    if name not in CHECKS:
        raise ValueError(f"no checks for {name!r}; known: {sorted(CHECKS)}.")
    report = CheckReport(name)
    for description, check in CHECKS[name](fn):
        try:
            passed, message = check()
        except NotImplementedError as err:
            report.not_implemented = str(err) or "raises NotImplementedError"
            return report
        except (Exception, SystemExit) as err:  # a learner's bug: report it, keep going
            passed = False
            message = f"{type(err).__name__}: {err} ({traceback.extract_tb(err.__traceback__)[-1].line})"
        report.results.append(CheckResult(description, passed, message))
    return report
