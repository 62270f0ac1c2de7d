"""Checks of chapter 02's exercise: The pieces of the GRPO loss."""

from __future__ import annotations

import math

import torch

from rlm_course.tools.checks.common import close, equal_groups_get_zero, leaves_inputs_unchanged

#: The exercise's title.
TITLE = "The pieces of the GRPO loss"
#: The functions the learner writes: (module, name), in the order the exercise presents them.
FUNCTIONS = (
    ("rlm_course.rl.advantages", "group_advantages"),
    ("rlm_course.rl.losses", "clipped_objective"),
    ("rlm_course.rl.kl", "kl_k3"),
)


def _checks_group_advantages(fn):
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    s = 0.5 / math.sqrt(1 / 3)  # (1 - 0.5) / unbiased std of [1, 0, 0, 1]
    # each check gets its own copy: a function that writes into its input fails only the check
    # that says so, not the next one that would see changed rewards
    yield "hand example, G=4, std-normalised", lambda: close(
        fn(r.clone(), 4), torch.tensor([s, -s, -s, s, 0, 0, 0, 0]), atol=1e-4)
    yield "hand example without std (Dr. GRPO)", lambda: close(
        fn(r.clone(), 4, normalize_std=False), torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))
    yield "leaves the rewards unchanged", leaves_inputs_unchanged(fn, r, 4)
    rewards = torch.rand(6 * 5, generator=torch.Generator().manual_seed(0))
    def sums_to_zero():
        out = fn(rewards, 5)
        if not isinstance(out, torch.Tensor):
            return False, f"expected a tensor, got {type(out).__name__}"
        if out.shape != (30,):
            return False, f"expected shape (30,), got {tuple(out.shape)}"
        return close(out.view(6, 5).sum(1), torch.zeros(6), atol=1e-4)

    yield "each group's advantages sum to zero", sums_to_zero
    yield "groups are contiguous runs of group_size", lambda: close(
        fn(torch.tensor([0.0, 2.0, 10.0, 14.0]), 2, normalize_std=False),
        torch.tensor([-1.0, 1.0, -2.0, 2.0]))
    yield from equal_groups_get_zero(fn)


def _checks_clipped_objective(fn):
    ones = torch.ones(2, 2)
    adv = torch.tensor([2.0, -1.0])
    yield "ratio 1 gives -A on every token", lambda: close(
        fn(ones, adv, 0.2), torch.tensor([[-2.0, -2.0], [1.0, 1.0]]))
    ratio = torch.tensor([[2.0, 1.0], [2.0, 1.0]])
    yield "positive A: ratio 2 clipped to 1.2", lambda: close(
        fn(ratio, torch.tensor([1.0, 1.0]), 0.2), torch.tensor([[-1.2, -1.0], [-1.2, -1.0]]))
    yield "negative A: ratio 2 not clipped (pessimistic bound)", lambda: close(
        fn(ratio, torch.tensor([-1.0, -1.0]), 0.2), torch.tensor([[2.0, 1.0], [2.0, 1.0]]))
    yield "decoupled bounds (DAPO): ratio 1.3 clipped to 1.28, ratio 0.7 to 0.8", lambda: close(
        fn(torch.tensor([[1.3, 0.7]]), torch.tensor([1.0]), 0.2, 0.28), torch.tensor([[-1.28, -0.7]]))
    yield "leaves the ratio and the advantages unchanged", leaves_inputs_unchanged(
        fn, ratio, torch.tensor([1.0, -1.0]), 0.2)

    def gradient_check():
        x = ratio.clone().requires_grad_(True)
        fn(x, torch.tensor([1.0, 1.0]), 0.2).sum().backward()
        expected = torch.tensor([[0.0, -1.0], [0.0, -1.0]])  # clipped tokens carry no gradient
        return close(x.grad, expected)

    yield "clipped tokens have zero gradient", gradient_check


def _checks_kl_k3(fn):
    lp = torch.log(torch.tensor([[0.5, 0.2]]))
    ref = torch.log(torch.tensor([[0.25, 0.2]]))
    yield "hand example: p=0.5, p_ref=0.25 gives 0.5 + ln 2 - 1", lambda: close(
        fn(lp, ref), torch.tensor([[0.5 + math.log(2) - 1, 0.0]]))
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 7, generator=g), torch.randn(4, 7, generator=g)
    yield "non-negative", lambda: (bool((fn(a, b) >= 0).all()), "found a negative value")
    yield "leaves the log-probs unchanged", leaves_inputs_unchanged(fn, a, b)

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


#: The checks of each function: name -> a generator of ``(description, check)``.
CHECKS = {
    "group_advantages": _checks_group_advantages,
    "clipped_objective": _checks_clipped_objective,
    "kl_k3": _checks_kl_k3,
}
