"""The clipped policy-gradient loss of PPO and the GRPO family, one option per part: the
importance ratio (per token or per sequence), the clipped objective (symmetric or DAPO's
decoupled bounds) and the aggregation over tokens and responses.

GRPO's objective (DeepSeekMath, Shao et al. 2024, arXiv:2402.03300, eq. 3), written as a loss:

    L = 1/G sum_i 1/|o_i| sum_t [ -min(r_{i,t} A_i, clip(r_{i,t}, 1-eps, 1+eps) A_i)
                                  + beta * KL_k3(pi_theta || pi_ref)_{i,t} ]

is :func:`policy_loss` with a token ratio, symmetric clip and ``seq-mean-token-mean``, plus
``beta`` times the same aggregation of :func:`rlm_course.rl.kl.kl_k3` (chapter 02 writes it out).
Shapes: per-token tensors ``(batch, R)`` with a ``response_mask (batch, R)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rlm_course.rl.masked import (check_floats, check_mask, check_same_shape, check_tensors,
                                  masked_mean, zero_padding)
from rlm_course.algorithms import AGGREGATIONS, LOG_RATIO_CLAMP, check_dual_clip
from rlm_course.utils import is_real



def sequence_ratio(log_probs: Tensor, old_log_probs: Tensor, response_mask: Tensor) -> Tensor:
    """GSPO's length-normalised sequence ratio (Zheng et al. 2025, arXiv:2507.18071, eq. 7).

    ``s_i = (pi_theta(o_i) / pi_old(o_i)) ** (1/|o_i|) = exp(mean_t (logp - old_logp))``, the
    mean clamped to ``+-LOG_RATIO_CLAMP`` before ``exp`` (:data:`rlm_course.rl.kl.LOG_RATIO_CLAMP`).
    Inputs ``(batch, R)``; returns ``(batch,)``.

    Raises:
        ValueError: for arguments that are not tensors, or log-probs of another shape than the
            mask.
    """
    check_tensors("sequence_ratio", log_probs=log_probs, old_log_probs=old_log_probs,
                  response_mask=response_mask)
    check_same_shape(log_probs, response_mask, "sequence_ratio", "log_probs")
    check_same_shape(old_log_probs, response_mask, "sequence_ratio", "old_log_probs")
    # BEGIN SOLUTION: average the per-token log-ratios over each response's real tokens, clamp the mean to +-LOG_RATIO_CLAMP, then exponentiate
    mean = masked_mean(log_probs - old_log_probs, response_mask, dim=1)
    return torch.exp(mean.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    # END SOLUTION


def check_clip(ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float | None,
               clip_c: float | None, where: str) -> float:
    """The upper clip bound (``clip_low`` when ``clip_high`` is None), after refusing what
    :func:`clipped_objective` and :func:`clipped_tokens` cannot read.

    Raises:
        ValueError: for bounds that are not numbers with ``0 <= clip_low <= clip_high``, finite,
            ``clip_low < 1``, a ``clip_c`` that is not a finite number above 1, or advantages
            neither of the ratio's shape nor ``(batch,)`` for its rows (another shape would
            broadcast one response's advantage over another's tokens).
    """
    check_tensors(where, ratio=ratio, advantages=advantages)
    clip_high = clip_low if clip_high is None else clip_high
    check_dual_clip(clip_c)
    if not (is_real(clip_low) and is_real(clip_high) and 0 <= clip_low <= clip_high < math.inf):
        raise ValueError(f"{where}: clip bounds low={clip_low!r}, high={clip_high!r}: need "
                         "0 <= low <= high, finite (DAPO raises only the upper bound).")
    if clip_low >= 1:
        raise ValueError(f"{where}: clip bound low={clip_low}: the lower bound 1 - low would not "
                         "be positive; use a value below 1 (0.2 is typical).")
    rows = tuple(ratio.shape[:1])
    if tuple(advantages.shape) not in (tuple(ratio.shape), rows):
        raise ValueError(f"{where}: advantages {tuple(advantages.shape)} must be the ratio's "
                         f"shape {tuple(ratio.shape)} or one per response, {rows}.")
    return clip_high


def clipped_objective(ratio: Tensor, advantages: Tensor, clip_low: float,
                      clip_high: float | None = None, clip_c: float | None = None) -> Tensor:
    """PPO's pessimistic clipped loss (Schulman et al. 2017, arXiv:1707.06347, eq. 7), with the
    decoupled bounds of DAPO's "clip-higher" (Yu et al. 2025, arXiv:2503.14476, eq. 8):
    ``-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)``.

    ``clip_c`` (> 1) adds dual-clip PPO's bound (Ye et al. 2020, arXiv:1912.09729; verl's
    ``clip_ratio_c``, 3 there): where ``A < 0`` the loss is at most ``-clip_c A``. PPO's clip is
    pessimistic, so for a negative advantage it never clips a *large* ratio: a token the policy
    now makes 50 times likelier would push with ``-50 A``, and stale or mismatched samples make
    such ratios common; past ``clip_c`` the token's loss is the constant ``-clip_c A`` and it
    gets no gradient.

    Chapter 02's GRPO uses it per token, with ``r = exp(log pi_theta - log pi_old)`` and one
    advantage per response; a token whose objective is clipped gets no gradient.

    ``ratio`` is ``(batch, R)`` (token level) or ``(batch,)`` (sequence level); ``advantages`` is
    ``(batch,)``, broadcast over tokens, or the same shape as ``ratio`` (e.g. GAE).
    ``clip_high`` defaults to ``clip_low`` (symmetric PPO).

    Raises:
        ValueError: if ``clip_high < clip_low``, a bound is negative or not finite, or
            ``clip_low >= 1`` (the lower bound ``1 - clip_low`` would not be positive, and a
            negative advantage would never be clipped), or ``clip_c`` is not a finite number
            above 1.
    """
    clip_high = check_clip(ratio, advantages, clip_low, clip_high, clip_c, "clipped_objective")
    if advantages.dim() < ratio.dim():
        advantages = advantages.view(*advantages.shape, *([1] * (ratio.dim() - advantages.dim())))
    # BEGIN SOLUTION: clamp the ratio to [1 - clip_low, 1 + clip_high]; take the pessimistic (smaller) of the unclipped and clipped objectives, and negate it into `loss` (the dual clip below then bounds it)
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = -torch.minimum(ratio * advantages, clipped * advantages)
    # END SOLUTION
    if clip_c is not None:  # dual clip: a negative advantage's loss is at most -c A
        loss = torch.where(advantages < 0, torch.minimum(loss, -clip_c * advantages), loss)
    return loss


def clipped_tokens(ratio: Tensor, advantages: Tensor, clip_low: float,
                   clip_high: float | None = None, clip_c: float | None = None) -> Tensor:
    """Where the clipped objective removed the gradient: the ratio above ``1 + clip_high`` with a
    positive advantage, or below ``1 - clip_low`` with a negative one (or, with a dual clip
    ``clip_c``, above it with a negative one). ``ratio (batch, R)``; ``advantages (batch,)``
    (broadcast over tokens) or ``(batch, R)``. Returns a bool tensor.

    Raises:
        ValueError: as :func:`clipped_objective` (:func:`check_clip`), so that the tokens it
            marks are the ones that loss clips."""
    clip_high = check_clip(ratio, advantages, clip_low, clip_high, clip_c, "clipped_tokens")
    adv = advantages[:, None] if advantages.dim() < ratio.dim() else advantages
    clipped = ((ratio > 1 + clip_high) & (adv > 0)) | ((ratio < 1 - clip_low) & (adv < 0))
    if clip_c is not None:
        clipped = clipped | ((ratio > clip_c) & (adv < 0))
    return clipped


def sequence_mean(per_token: Tensor, response_mask: Tensor) -> Tensor:
    """GRPO's aggregation: mean over each response's tokens, then mean over responses.

    ``1/G sum_i 1/|o_i| sum_t x_{i,t}`` (Shao et al. 2024, eq. 3). Inputs ``(batch, R)``. A
    response without any real token (``|o_i| = 0``) is left out of the mean over responses, as
    in verl's ``agg_loss``, instead of counting as a 0 that dilutes the others; with none at all
    the loss is 0.
    """
    per_response = masked_mean(per_token, response_mask, dim=1)
    return masked_mean(per_response, response_mask.bool().any(1))


def aggregate_loss(per_token: Tensor, response_mask: Tensor, mode: str,
                   constant_length: int | None = None) -> Tensor:
    """Reduce a ``(batch, R)`` per-token loss to a scalar (verl's ``loss_agg_mode``).

    * ``seq-mean-token-mean`` (GRPO): ``1/B sum_i 1/|o_i| sum_t x_it``;
    * ``token-mean`` (DAPO): ``sum_i sum_t x_it / sum_i |o_i|``: every token weighs the same, so
      long responses are not down-weighted;
    * ``seq-mean-token-sum-norm`` (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783):
      ``1/(B L) sum_i sum_t x_it`` with a constant ``L = constant_length`` (e.g. the maximum
      response length), which removes GRPO's length bias.

    Raises:
        ValueError: for an unknown mode, arguments that are not tensors, a mask of another
            shape than ``per_token`` or with values other than 0 and 1, a ``constant_length``
            that is neither None nor a finite number > 0, or the Dr. GRPO mode without a
            constant length: a finite
            number at least the longest response (the generation budget; a shorter one would
            weigh a response's tokens above 1, inf would give no gradient).
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {AGGREGATIONS}.")
    if mode != "seq-mean-token-sum-norm" and constant_length is not None and not (
            is_real(constant_length) and 0 < constant_length < math.inf):  # (that mode: below)
        raise ValueError(f"aggregate_loss: constant_length={constant_length!r} must be None or "
                         "a finite number of tokens > 0 (the generation budget).")
    check_tensors("aggregate_loss", per_token=per_token, response_mask=response_mask)
    check_same_shape(per_token, response_mask, "aggregate_loss", "per_token")
    check_mask(response_mask, "aggregate_loss")
    per_token = zero_padding(per_token, response_mask)  # NaN at padding never reaches the sum
    mask = response_mask.to(per_token.dtype)
    if mode == "seq-mean-token-mean":
        return sequence_mean(per_token, response_mask)
    if mode == "token-mean":
        # BEGIN SOLUTION: sum the loss over every real token of the batch and divide by the number of real tokens
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
        # END SOLUTION
    longest = int(mask.sum(1).max()) if mask.numel() else 0
    if not (is_real(constant_length) and math.isfinite(constant_length)
            and constant_length >= max(longest, 1)):
        raise ValueError(f"seq-mean-token-sum-norm needs constant_length={constant_length!r} to "
                         f"be a finite number at least the longest response ({longest} tokens "
                         "here): the generation budget, e.g. the maximum response length.")
    return (per_token * mask).sum() / (per_token.shape[0] * constant_length)


def policy_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor,
                response_mask: Tensor, ratio_level: str = "token", clip_low: float = 0.2,
                clip_high: float | None = None, loss_agg: str = "seq-mean-token-mean",
                constant_length: int | None = None,
                weights: Tensor | None = None,
                clip_c: float | None = None) -> tuple[Tensor, Tensor]:
    """The clipped policy-gradient loss of the whole family, one option per part.

    * ratio: per token, ``exp(logp - old_logp)`` (PPO, GRPO; the log-ratio clamped to
      ``+-LOG_RATIO_CLAMP`` first, so that an overflow cannot make a gradient NaN), or per sequence,
      :func:`sequence_ratio` (GSPO; every token of a response then shares its loss);
    * clipping: :func:`clipped_objective` with ``clip_low``/``clip_high`` (and dual-clip PPO's
      ``clip_c`` for negative advantages, None: off);
    * aggregation: :func:`aggregate_loss` with ``loss_agg``;
    * ``weights``: a per-token factor without gradient (the behaviour importance weight of an
      off-policy correction, :func:`rlm_course.rl.off_policy.behaviour_weights`; ``old_log_probs``
      are then the proximal policy's), applied before the aggregation.

    Args:
        log_probs, old_log_probs: ``(batch, R)``; advantages: ``(batch,)`` or ``(batch, R)``
            (a sequence ratio needs ``(batch,)``); response_mask: ``(batch, R)``;
            weights: ``(batch, R)`` or None (all ones). ``old_log_probs`` and ``weights`` get
            no gradient.

    Returns:
        ``(loss, clipped)``: the scalar loss and a ``(batch, R)`` bool tensor, True on the tokens
        whose objective was clipped (no gradient through them).

    Raises:
        ValueError: for an unknown ratio level, arguments that are not tensors, log-probs or
            advantages that are not floats (or log-probs of two precisions), tensors whose
            shapes do not match, a mask of values other than 0 and 1, a sequence ratio with
            per-token advantages, or the errors of :func:`clipped_objective` and
            :func:`aggregate_loss`. A NaN or inf at a padded position (of the log-probs, the
            advantages or the weights) changes neither the loss nor its gradient.
    """
    clip_high = clip_low if clip_high is None else clip_high
    # integer log-probs truncated the ratio; two precisions silently dropped one (each check
    # names an argument that is not a tensor too)
    check_floats("policy_loss", log_probs=log_probs, old_log_probs=old_log_probs)
    check_floats("policy_loss", advantages=advantages)
    check_tensors("policy_loss", response_mask=response_mask,
                  **({} if weights is None else {"weights": weights}))
    if log_probs.dim() != 2:
        raise ValueError(f"policy_loss: log_probs of shape {tuple(log_probs.shape)}; give "
                         "(batch, R) over the response tokens (one response is (1, R): "
                         "log_probs[None]).")
    check_same_shape(log_probs, response_mask, "policy_loss", "log_probs")
    check_same_shape(old_log_probs, response_mask, "policy_loss", "old_log_probs")
    if weights is not None:  # (batch,) would broadcast over the tokens, not the responses
        check_same_shape(weights, response_mask, "policy_loss", "weights")
    check_mask(response_mask, "policy_loss")
    # the old (or proximal) policy is the trust region's centre: no gradient through it
    old_log_probs = old_log_probs.detach()
    if tuple(advantages.shape) not in ((log_probs.shape[0],), tuple(log_probs.shape)):
        raise ValueError(f"policy_loss: advantages {tuple(advantages.shape)} must be (batch,) "
                         f"= ({log_probs.shape[0]},) or (batch, R) = {tuple(log_probs.shape)}.")
    if advantages.dim() == 2:  # a NaN at padding would make 0 x NaN gradients on every token
        advantages = zero_padding(advantages, response_mask)
    if ratio_level == "token":
        ratio = torch.exp((log_probs - old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        per_token = clipped_objective(ratio, advantages, clip_low, clip_high, clip_c)
    elif ratio_level == "sequence":
        if advantages.dim() != 1:
            raise ValueError("a sequence-level ratio needs one advantage per response (batch,), "
                             f"got shape {tuple(advantages.shape)}.")
        ratio = sequence_ratio(log_probs, old_log_probs, response_mask)
        per_token = clipped_objective(ratio, advantages, clip_low, clip_high, clip_c)[
            :, None].expand_as(log_probs)
        ratio = ratio[:, None].expand_as(log_probs)
    else:
        raise ValueError(f"unknown ratio level {ratio_level!r}; choose token or sequence.")
    if weights is not None:  # padding set to 0 first, as for the advantages
        per_token = per_token * zero_padding(weights.detach(), response_mask)
    clipped = clipped_tokens(ratio, advantages, clip_low, clip_high, clip_c)
    loss = aggregate_loss(per_token, response_mask, loss_agg, constant_length)
    return loss, clipped.detach() & response_mask.bool()
