"""Checks of chapter 08's exercise: A row-parallel linear layer."""

from __future__ import annotations


import torch

from rlm_course.tools.checks.common import close

#: The exercise's title.
TITLE = "A row-parallel linear layer"
#: The functions the learner writes: (module, name), in the order the exercise presents them.
FUNCTIONS = (
    ("rlm_course.parallel.tensor_parallel", "row_parallel_linear"),
)


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
                ok, msg = close(y, expected, atol=1e-5)
                if not ok:
                    return ok, msg
            m = 3 * 5 * 4
            want = 2 * (p - 1) * m // p
            return world.sent == [want] * p, f"each rank sent {world.sent}, expected {want} (one all-reduce)"
        return check

    yield "2 ranks: every rank gets x W^T + b, with one all-reduce", equals(2)
    yield "4 ranks", equals(4)
    yield "1 rank: a plain linear layer", equals(1)


#: The checks of each function: name -> a generator of ``(description, check)``.
CHECKS = {
    "row_parallel_linear": _checks_row_parallel_linear,
}
