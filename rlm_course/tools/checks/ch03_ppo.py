"""Checks of chapter 03's exercise: Generalized Advantage Estimation."""

from __future__ import annotations


import torch

from rlm_course.tools.checks.common import close

#: The exercise's title.
TITLE = "Generalized Advantage Estimation"
#: The functions the learner writes: (module, name), in the order the exercise presents them.
FUNCTIONS = (
    ("rlm_course.rl.advantages", "gae"),
)


def _checks_gae(fn):
    one = torch.ones(1, 2, dtype=torch.bool)

    def hand():
        adv, ret = fn(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.8]]), one, 1.0, 0.5)
        ok_a, msg_a = close(adv, torch.tensor([[0.4, 0.2]]))
        ok_r, msg_r = close(ret, torch.tensor([[0.9, 1.0]]))
        return ok_a and ok_r, msg_a or msg_r

    def monte_carlo():  # gamma = lambda = 1: A_t = (sum of rewards from t on) - V_t
        g = torch.Generator().manual_seed(0)
        r, v = torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)
        mask = torch.ones(2, 4, dtype=torch.bool)
        to_go = r.flip(1).cumsum(1).flip(1)
        return close(fn(r, v, mask, 1.0, 1.0)[0], to_go - v)

    def one_step():  # lambda = 0: A_t = delta_t
        r, v = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[0.5, 0.25, 1.0]])
        delta = torch.tensor([[1.0 + 0.9 * 0.25 - 0.5, 2.0 + 0.9 * 1.0 - 0.25, 3.0 - 1.0]])
        return close(fn(r, v, torch.ones(1, 3, dtype=torch.bool), 0.9, 0.0)[0], delta)

    def masked():  # a 2-token response in 4 columns: padding neither contributes nor gets a value
        r = torch.tensor([[0.0, 1.0, 99.0, 99.0]])
        v = torch.tensor([[0.5, 0.8, 99.0, 99.0]])
        mask = torch.tensor([[True, True, False, False]])
        return close(fn(r, v, mask, 1.0, 0.5)[0], torch.tensor([[0.4, 0.2, 0.0, 0.0]]))

    yield "hand example (2 tokens, gamma 1, lambda 0.5) with returns", hand
    yield "gamma = lambda = 1 gives reward-to-go minus value", monte_carlo
    yield "lambda = 0 gives the one-step TD error", one_step
    yield "positions after the response are ignored and zero", masked


#: The checks of each function: name -> a generator of ``(description, check)``.
CHECKS = {
    "gae": _checks_gae,
}
