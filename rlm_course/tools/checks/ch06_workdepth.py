"""Checks of chapter 06's exercise: Work and depth of a layer; Brent's bound."""

from __future__ import annotations


from rlm_course.tools.checks.common import value_close

#: The exercise's title.
TITLE = "Work and depth of a layer; Brent's bound"
#: The functions the learner writes: (module, name), in the order the exercise presents them.
FUNCTIONS = (
    ("rlm_course.cost.workdepth", "layer"),
    ("rlm_course.cost.workdepth", "brent_bound"),
)


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
    yield "W=100, D=10 on 10 processors: 20", lambda: value_close(fn(100, 10, 10), 20.0)
    yield "one processor: W + D", lambda: value_close(fn(100, 10, 1), 110.0)
    yield "infinitely many processors: approaches D", lambda: value_close(fn(100, 10, 10**9),
                                                                          10.0, 1e-6)

    def rejects_zero():
        try:
            fn(100, 10, 0)
        except ValueError:
            return True, ""
        return False, "processors=0 should raise ValueError"

    yield "no processors is an error", rejects_zero


#: The checks of each function: name -> a generator of ``(description, check)``.
CHECKS = {
    "layer": _checks_layer,
    "brent_bound": _checks_brent_bound,
}
