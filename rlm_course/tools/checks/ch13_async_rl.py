"""Checks of chapter 13's exercise: The staleness gate; off-policy corrections; the decoupled
PPO loss."""

from __future__ import annotations

import math

import torch

from rlm_course.tools.checks.common import close

#: The exercise's title.
TITLE = "The staleness gate; off-policy corrections; the decoupled PPO loss"
#: The functions the learner writes: (module, name), in the order the exercise presents them.
FUNCTIONS = (
    ("rlm_course.systems.async_rl", "rollout_capacity"),
    ("rlm_course.rl.off_policy", "behaviour_weights"),
    ("rlm_course.systems.async_rl", "decoupled_ppo_loss"),
)


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


def _checks_behaviour_weights(fn):
    # two responses: w = prox / behaviour per token is (0.5, 3, 1) and (4, 1.5, padding); the
    # padding's 1/9 would pull the second response's product from 6 to 0.67, below the cap
    prox = torch.log(torch.tensor([[0.1, 0.6, 0.3], [0.8, 0.3, 0.1]]))
    behav = torch.log(torch.tensor([[0.2, 0.2, 0.3], [0.2, 0.2, 0.9]]))
    mask = torch.tensor([[True, True, True], [True, True, False]])
    want = {"none": [[1, 1, 1], [1, 1, 0]], "is": [[0.5, 3, 1], [4, 1.5, 0]],
            "tis": [[0.5, 2, 1], [2, 1.5, 0]], "mis": [[0.5, 0, 1], [0, 1.5, 0]],
            "seq-tis": [[1.5, 1.5, 1.5], [2, 2, 0]], "seq-mis": [[1.5, 1.5, 1.5], [0, 0, 0]]}

    def hand_examples():
        for correction, expected in want.items():
            weights, _ = fn(prox, behav, mask, correction, 2.0)
            if not torch.allclose(weights, torch.tensor(expected, dtype=weights.dtype),
                                  atol=1e-5):
                return False, (f"{correction}: weights {weights.tolist()}, expected {expected} "
                               "(cap 2; sequence weights are the product over the response's "
                               "real tokens; padding weighs 0)")
        return True, ""

    def corrected_tokens():
        _, tis = fn(prox, behav, mask, "tis", 2.0)
        _, none = fn(prox, behav, mask, "none", 2.0)
        ok = tis.tolist() == [[False, True, False], [True, False, False]] and not none.any()
        return ok, "'corrected' marks the real tokens whose weight is above the cap (tis, mis)"

    def no_gradient():
        weights, _ = fn(prox.clone().requires_grad_(True), behav, mask, "is", 2.0)
        return not weights.requires_grad, "the weights must carry no gradient (detach them)"

    yield "each correction by hand (cap 2)", hand_examples
    yield "the tokens the cap changed", corrected_tokens
    yield "no gradient through the weights", no_gradient


def _checks_decoupled_ppo_loss(fn):
    from rlm_course.rl.losses import policy_loss

    g = torch.Generator().manual_seed(0)
    logp = (torch.randn(3, 4, generator=g) * 0.1 - 1.0)
    prox = logp + torch.randn(3, 4, generator=g) * 0.05
    behav = prox + torch.randn(3, 4, generator=g) * 0.3
    adv = torch.tensor([1.0, -0.5, 2.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    one = (torch.tensor([[0.0]]), torch.tensor([[0.0]]))  # u = 1: the objective is A

    def on_policy_is_ppo():
        loss, _ = fn(logp, prox, prox, adv, mask)
        want, _ = policy_loss(logp, prox, adv, mask)
        return close(loss, want)

    def hand_example():
        loss, _ = fn(*one, torch.tensor([[-0.5]]), torch.tensor([2.0]), torch.tensor([[True]]),
                     correction="is")
        return close(loss, torch.tensor(-2.0 * math.exp(0.5)))  # w = e^0.5, u = 1, A = 2

    def masked_token_contributes_nothing():
        loss, _ = fn(*one, torch.tensor([[-3.0]]), torch.tensor([1.0]), torch.tensor([[True]]),
                     correction="mis", cap=2.0)
        return close(loss, torch.tensor(0.0))  # w = e^3 > 2: masked (AReaL's code)

    def truncated_token_contributes_the_cap():
        loss, _ = fn(*one, torch.tensor([[-3.0]]), torch.tensor([1.0]), torch.tensor([[True]]),
                     correction="tis", cap=2.0)
        return close(loss, torch.tensor(-2.0))  # min(e^3, 2) x A

    def weight_has_no_gradient():
        x = logp.clone().requires_grad_(True)
        loss, _ = fn(x, prox, behav, adv, mask, correction="is")
        loss.backward()
        y = logp.clone().requires_grad_(True)
        w = torch.exp(prox - behav)  # PPO's per-token objective, times the constant weight
        per = -torch.minimum(torch.exp(y - prox) * adv[:, None],
                             torch.exp(y - prox).clamp(0.8, 1.2) * adv[:, None]) * w
        ref = (per * mask).sum(1) / mask.sum(1)
        ref.mean().backward()
        return close(x.grad, y.grad)

    def padding_is_ignored():
        b2 = behav.clone()
        b2[~mask] = 50.0
        return close(fn(logp, prox, b2, adv, mask)[0], fn(logp, prox, behav, adv, mask)[0])

    yield "behaviour = proximal: PPO's clipped loss", on_policy_is_ppo
    yield "hand example (eq. 5, no cap): w = exp(prox - behaviour) scales the objective", \
        hand_example
    yield "AReaL's masking: a token above the cap contributes 0", masked_token_contributes_nothing
    yield "TIS: a token above the cap contributes cap x its advantage", \
        truncated_token_contributes_the_cap
    yield "the weight is a constant: the gradient is w times PPO's", weight_has_no_gradient
    yield "padding tokens change nothing", padding_is_ignored


#: The checks of each function: name -> a generator of ``(description, check)``.
CHECKS = {
    "rollout_capacity": _checks_rollout_capacity,
    "behaviour_weights": _checks_behaviour_weights,
    "decoupled_ppo_loss": _checks_decoupled_ppo_loss,
}
