"""Checks of chapter 04's exercise: Parts of the GRPO family."""

from __future__ import annotations

import math

import torch

from rlm_course.tools.checks.common import close, equal_groups_get_zero

#: The exercise's title.
TITLE = "Parts of the GRPO family"
#: The functions the learner writes: (module, name), in the order the exercise presents them.
FUNCTIONS = (
    ("rlm_course.rl.advantages", "rloo_advantages"),
    ("rlm_course.rl.losses", "sequence_ratio"),
    ("rlm_course.rl.losses", "aggregate_loss"),
)


def _checks_rloo_advantages(fn):
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    yield "hand example: baseline of each is the mean of the other three", lambda: close(
        fn(r, 4), torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]))
    x = torch.rand(12, generator=torch.Generator().manual_seed(0))
    centred = (x.view(4, 3) - x.view(4, 3).mean(1, keepdim=True)).reshape(-1)
    yield "equals G/(G-1) times the centred reward", lambda: close(fn(x, 3), 1.5 * centred)
    yield "groups are contiguous", lambda: close(fn(torch.tensor([0.0, 2.0, 10.0, 14.0]), 2),
                                                  torch.tensor([-2.0, 2.0, -4.0, 4.0]))
    yield from equal_groups_get_zero(fn)


def _checks_sequence_ratio(fn):
    lp = torch.log(torch.tensor([[0.5, 0.5, 0.9], [0.2, 0.4, 0.4]]))
    old = torch.log(torch.tensor([[0.25, 0.5, 0.1], [0.1, 0.1, 0.4]]))
    mask = torch.tensor([[True, True, False], [True, True, True]])
    yield "hand example: geometric mean of token ratios (sqrt(2*1), cbrt(2*4*1))", lambda: close(
        fn(lp, old, mask), torch.tensor([math.sqrt(2.0), 2.0]))
    yield "ratio 1 when the policies agree", lambda: close(fn(lp, lp, mask), torch.ones(2))
    yield "masked tokens do not count", lambda: close(
        fn(lp[:1, :2], old[:1, :2], mask[:1, :2]), torch.tensor([math.sqrt(2.0)]))


def _checks_aggregate_loss(fn):
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
    m = torch.tensor([[True, True, True], [True, False, False]])
    yield "token-mean hand example: (1+2+3+4)/4", lambda: close(
        fn(x, m, "token-mean"), torch.tensor(2.5))
    yield "token-mean weighs every token alike (not every sequence)", lambda: close(
        fn(torch.tensor([[1.0] * 6, [0.0] * 6]), torch.tensor([[True] * 6, [True] + [False] * 5]),
           "token-mean"), torch.tensor(6 / 7))


#: The checks of each function: name -> a generator of ``(description, check)``.
CHECKS = {
    "rloo_advantages": _checks_rloo_advantages,
    "sequence_ratio": _checks_sequence_ratio,
    "aggregate_loss": _checks_aggregate_loss,
}
