"""Off-policy corrections: training on tokens that another policy sampled (chapter 13).

Two things make the sampling policy (the **behaviour** policy, ``pi_behav``) differ from the one
the trainer takes as the centre of PPO's trust region (the **proximal** policy, ``pi_prox``: the
trainer's weights before this update, its log-probs recomputed by the trainer):

* **staleness** (asynchronous RL): the tokens were sampled by older weights;
* **the rollout/trainer mismatch**: the inference engine (bf16 or fp8 weights, other kernels)
  and the trainer (fp32 master weights, its own kernels) give different log-probs *for the same
  weights*, so even a "synchronous, on-policy" run is off-policy.

Both are corrected with the same **behaviour importance weight** per token,
``w_t = pi_prox(y_t) / pi_behav(y_t) = exp(prox_log_probs - behaviour_log_probs)``, with no
gradient, multiplying PPO's clipped per-token objective of ``u_t = pi_theta / pi_prox``:

    L = - E_{y ~ pi_behav}[ w_t min(u_t A_t, clip(u_t, 1 - eps, 1 + eps) A_t) ]

This is AReaL's decoupled objective (Fu et al. 2025, arXiv:2505.24298, eq. 5), after Hilton et al.
(2022, arXiv:2110.00641): the trust region is centred on a policy the optimizer controls (the
proximal one), and the importance weight corrects for the distribution the tokens were sampled
from. Per token it corrects PPO's per-token surrogate (which, like PPO itself, ignores that the
prefixes were sampled by the behaviour policy too; the sequence weight is the full ratio), and
``w_t`` is unbounded: one token whose behaviour probability is tiny can carry the whole gradient.
The named corrections (:data:`CORRECTIONS`) bound that variance and pay for it in bias:

============  ===========================================================  =========================
name          per-token weight (``c`` = ``cap``)                           source
============  ===========================================================  =========================
``none``      1 (the mismatch or staleness is ignored)                     plain PPO/GRPO
``is``        ``w_t``                                                      AReaL eq. 5 (no cap)
``tis``       ``min(w_t, c)``: truncated                                   Yao et al. 2025 (TIS);
                                                                           verl, TRL token_truncate
``mis``       ``w_t`` if ``w_t <= c`` else 0: the token is masked          AReaL's code
                                                                           (behav_imp_weight_cap);
                                                                           TRL token_mask
``seq-tis``   ``min(W_i, c)``, ``W_i = prod_t w_t`` over response ``i``    TRL sequence_truncate;
                                                                           verl rollout_is sequence
``seq-mis``   ``W_i`` if ``W_i <= c`` else 0: the response is masked      TRL sequence_mask
============  ===========================================================  =========================

Truncation keeps every token but biases the weight of the rare ones down (a token above the cap
still contributes ``c`` times its objective); masking drops the tokens (or whole responses) the
behaviour policy was least likely to produce: their gradient is lost, a bias of another kind,
while each kept token keeps its exact weight. Sequence-level weights are the ratio of whole
responses, the one a sequence reward calls for, but their variance grows with length (a product
of many ``w_t``). A masked token still counts in the denominator of the aggregation, as in AReaL
(its loss is 0, not removed). verl's masking mode also has a lower threshold; here only the upper
one is kept, as in AReaL and TRL. Every log-weight is clamped to ``+-LOG_RATIO_CLAMP`` (20) before
``exp``, as the policy ratio is (:mod:`rlm_course.rl.losses`): an uncapped ``is`` weight of one
token whose behaviour probability underflowed would otherwise be infinite (``exp`` overflows
float32 past 88.7) and make the loss NaN.

Shapes: per-token tensors ``(batch, R)`` with a ``response_mask (batch, R)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlm_course.algorithms import CORRECTIONS, LOG_RATIO_CLAMP, check_correction_cap
from rlm_course.rl.kl import kl_k3
from rlm_course.rl.masked import masked_mean


def check_log_probs(prox_log_probs: Tensor, behaviour_log_probs: Tensor, response_mask: Tensor,
                    cap: float, where: str) -> None:
    """Refuse what the corrections cannot weigh: tensors that are not all ``(batch, R)`` of one
    shape, log-probs that are not finite on real tokens (NaN would pass every cap unseen), or a
    cap that is not a number from 1 to below ``exp(LOG_RATIO_CLAMP)``.

    Raises:
        ValueError: naming the function ``where``, the shapes or the count of bad log-probs.
    """
    shapes = [tuple(t.shape) for t in (prox_log_probs, behaviour_log_probs, response_mask)]
    if any(len(x) != 2 for x in shapes) or len(set(shapes)) != 1:
        raise ValueError(f"{where}: proximal, behaviour log-probs and response mask must all be "
                         f"(batch, R) of one shape; got {shapes[0]}, {shapes[1]} and {shapes[2]}.")
    check_correction_cap(cap, f"{where}: cap")
    mask = response_mask.bool()
    bad = int((~torch.isfinite(prox_log_probs[mask])).sum() +
              (~torch.isfinite(behaviour_log_probs[mask])).sum())
    if bad:
        raise ValueError(f"{where}: {bad} log-probs of real response tokens are not finite "
                         "(NaN or inf); the model that computed them has diverged or was fed "
                         "tokens it gives probability 0.")


def behaviour_weights(prox_log_probs: Tensor, behaviour_log_probs: Tensor,
                      response_mask: Tensor, correction: str = "mis",
                      cap: float = 2.0) -> tuple[Tensor, Tensor]:
    """The per-token weight of each correction (the table in the docstring of
    :mod:`rlm_course.rl.off_policy`).

    Args:
        prox_log_probs: ``(batch, R)`` log-probs of the sampled tokens under the proximal policy
            (the trainer's weights before the update, recomputed by the trainer).
        behaviour_log_probs: ``(batch, R)`` log-probs as the sampling engine computed them.
        response_mask: ``(batch, R)`` bool, True on real response tokens.
        correction: one of :data:`CORRECTIONS`.
        cap: ``c``, the truncation or masking threshold (``>= 1``; unused by ``none`` and ``is``).

    Returns:
        ``(weights, corrected)``: ``(batch, R)`` float weights without gradient, 0 on padding;
        and ``(batch, R)`` bool, True on the real tokens whose weight the cap changed (truncated
        or masked).

    Raises:
        ValueError: for an unknown correction, a cap below 1 or not finite, tensors that are not
            ``(batch, R)`` of one shape, or log-probs of real tokens that are not finite
            (:func:`check_log_probs`).
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"correction={correction!r} is not known; choose one of "
                         f"{', '.join(CORRECTIONS)}.")
    check_log_probs(prox_log_probs, behaviour_log_probs, response_mask, cap, "behaviour_weights")
    mask = response_mask.bool()
    # BEGIN SOLUTION: the log-weight is prox - behaviour on real tokens (0 on padding); for the sequence corrections sum it over each response and broadcast; 'none' gives ones, 'is' exp(log w) with log w clamped to +-LOG_RATIO_CLAMP, the truncations clamp at cap, the masks zero the weights above cap; 'corrected' marks the real tokens above cap (only for the capped corrections); no gradient anywhere
    log_w = torch.where(mask, prox_log_probs - behaviour_log_probs, 0.0).detach()
    if correction.startswith("seq-"):
        log_w = log_w.sum(1, keepdim=True).expand_as(log_w)
    if correction == "none":
        weights = torch.ones_like(log_w)
    else:
        weights = torch.exp(log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    above = (weights > cap) & mask if correction in ("tis", "mis", "seq-tis", "seq-mis") else \
        torch.zeros_like(mask)
    if correction in ("tis", "seq-tis"):
        weights = weights.clamp(max=cap)
    elif correction in ("mis", "seq-mis"):
        weights = torch.where(above, 0.0, weights)
    # END SOLUTION
    return torch.where(mask, weights, 0.0), above  # padding: 0 even where the weight overflowed


def mismatch_stats(prox_log_probs: Tensor, behaviour_log_probs: Tensor, response_mask: Tensor,
                   cap: float = 2.0) -> dict[str, float]:
    """How far the behaviour policy is from the proximal one on a batch, from the tokens the
    behaviour policy sampled (the columns of ``metrics.jsonl`` named in brackets):

    * ``behaviour_kl``: the mean per-token k3 estimate of KL(pi_behav || pi_prox) (Schulman's
      ``w - 1 - log w``, >= 0, unbiased on tokens sampled from pi_behav);
    * ``behaviour_kl_seq``: the mean over responses of the summed per-token k3 estimates
      ``sum_t (w_t - 1 - log w_t)``: the KL of whole responses (the chain rule makes the sum
      over a response's tokens an unbiased estimate of it, always >= 0), which grows with length;
    * ``log_ratio_abs_max``: the largest ``|log w_t|``;
    * ``weight_max``: the largest ``w_t``;
    * ``over_cap_tokens``: the share of tokens with ``w_t > cap`` (what ``tis`` truncates and
      ``mis`` masks); ``over_cap_responses``: the share of responses with ``W_i > cap``
      (what ``seq-mis`` masks).

    Args:
        prox_log_probs, behaviour_log_probs, response_mask: ``(batch, R)``.

    Raises:
        ValueError: for tensors that are not ``(batch, R)`` of one shape, log-probs of real
            tokens that are not finite, or a cap below 1 (:func:`check_log_probs`).
    """
    check_log_probs(prox_log_probs, behaviour_log_probs, response_mask, cap, "mismatch_stats")
    prox_log_probs, behaviour_log_probs = prox_log_probs.detach(), behaviour_log_probs.detach()
    mask = response_mask.bool()
    if not mask.any():
        return {"behaviour_kl": 0.0, "behaviour_kl_seq": 0.0, "log_ratio_abs_max": 0.0,
                "weight_max": 1.0, "over_cap_tokens": 0.0, "over_cap_responses": 0.0}
    log_w = torch.where(mask, prox_log_probs - behaviour_log_probs, 0.0).double()
    # k3 of KL(behav || prox) on behaviour samples: kl_k3 with the behaviour as the sampler
    k3 = torch.where(mask, kl_k3(torch.zeros_like(log_w), log_w), 0.0)
    seq_log_w = log_w.sum(1)
    rows = mask.any(1)
    return {
        "behaviour_kl": float(masked_mean(k3, mask)),
        "behaviour_kl_seq": float(k3.sum(1)[rows].mean()),
        "log_ratio_abs_max": float(log_w.abs().max()),
        "weight_max": float(torch.exp(log_w[mask]).max()),
        "over_cap_tokens": float(((torch.exp(log_w) > cap) & mask).sum() / mask.sum()),
        "over_cap_responses": float((torch.exp(seq_log_w[rows]) > cap).double().mean()),
    }
