"""The GRPO family as composable parts: advantage estimators, ratio levels, clipping, loss
aggregation, KL estimators, and DAPO's sampling and reward shaping.

Each published algorithm is a choice of one option per part; the presets and their sources are
in :mod:`rlm_course.algorithms`, and :class:`rlm_course.trainer.RLTrainer` runs any choice.

Shapes: ``rewards (batch,)`` with the ``group_size`` responses of one prompt contiguous; per-token
tensors ``(batch, R)`` over response positions with a ``response_mask (batch, R)``.
The group-relative advantage, the symmetric clipped surrogate and k3 live in :mod:`rlm_course.rl`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .rl import check_groups, clipped_tokens, kl_k3, masked_mean, sequence_mean

KL_ESTIMATORS = ("k1", "k2", "k3")
AGGREGATIONS = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")


def kl_estimate(log_probs: Tensor, ref_log_probs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled from pi_theta.

    With ``log rho = log pi_ref - log pi_theta`` (Schulman 2020, "Approximating KL divergence"):
    ``k1 = -log rho`` (unbiased, can be negative), ``k2 = (log rho)^2 / 2`` (biased, low variance;
    its gradient is the KL's), ``k3 = rho - log rho - 1`` (unbiased, >= 0; GRPO's choice).

    Raises:
        ValueError: for an unknown estimator.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; choose one of {KL_ESTIMATORS}.")
    log_rho = ref_log_probs - log_probs
    if estimator == "k1":
        return -log_rho
    if estimator == "k2":
        return 0.5 * log_rho**2
    return kl_k3(log_probs, ref_log_probs)


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024, arXiv:2402.14740, eq. 5).

    ``A_i = R_i - 1/(G-1) sum_{j != i} R_j``, which equals ``G/(G-1) (R_i - mean(R))``.
    Input and output ``(num_prompts * group_size,)``.

    Raises:
        ValueError: if ``group_size < 2`` or does not divide the number of rewards.
    """
    check_groups(rewards, group_size, "rloo_advantages")
    # BEGIN SOLUTION: one row per group; each response's baseline is the mean of the *other* G-1 rewards of its row
    grouped = rewards.view(-1, group_size)
    baseline = (grouped.sum(1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - baseline).reshape(-1)
    # END SOLUTION


def masked_whiten(x: Tensor, response_mask: Tensor, eps: float = 1e-6) -> Tensor:
    """Normalise ``x (batch, R)`` to mean 0 and standard deviation 1 over the masked tokens of the
    whole batch (PPO's advantage whitening; verl ``masked_whiten``); 0 outside the mask."""
    mean = masked_mean(x, response_mask)
    std = masked_mean((x - mean) ** 2, response_mask).sqrt()
    return (x - mean) / (std + eps) * response_mask


def reinforce_pp_advantages(token_rewards: Tensor, response_mask: Tensor,
                            gamma: float = 1.0) -> Tensor:
    """REINFORCE++ (Hu et al. 2025, arXiv:2501.03262, section 3): the return of each token,
    ``G_t = sum_{s >= t} gamma^(s - t) r_s``, normalised over *every response token of the batch*
    instead of per prompt (verl ``compute_reinforce_plus_plus_outcome_advantage``).

    Args:
        token_rewards: ``(batch, R)``: e.g. the verifier's reward on the last token minus a
            per-token KL penalty.
        response_mask: ``(batch, R)``; each row's real tokens are a prefix.
        gamma: discount (1, the paper's choice, is a reversed cumulative sum).

    Returns:
        ``(batch, R)`` advantages, 0 outside the mask.
    """
    mask = response_mask.to(token_rewards.dtype)
    if gamma == 1.0:
        returns = (token_rewards * mask).flip(1).cumsum(1).flip(1) * mask
    else:  # GAE with V = 0 and lambda = 1 is exactly the discounted return
        returns = gae(token_rewards, torch.zeros_like(token_rewards), response_mask, gamma, 1.0)[0]
    return masked_whiten(returns, response_mask)


def gae(rewards: Tensor, values: Tensor, response_mask: Tensor, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation over response tokens (Schulman et al. 2016,
    arXiv:1506.02438, eqs. 11-16), as a reverse scan.

    ``delta_t = r_t + gamma V_{t+1} - V_t`` (``V`` after the last response token is 0: the
    episode ends at ``<eos>``), ``A_t = delta_t + gamma lam A_{t+1}``, returns ``A_t + V_t``.

    Args:
        rewards, values: ``(batch, R)`` per-token rewards (e.g. verifier score on the last token
            minus a KL penalty on every token) and critic values ``V(s_t)``.
        response_mask: ``(batch, R)``; each row's real tokens are a prefix.

    Returns:
        ``(advantages, returns)``, each ``(batch, R)``, 0 outside the mask.

    Raises:
        ValueError: if gamma or lam is outside [0, 1].
    """
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gae: gamma={gamma} and lam={lam} must be in [0, 1].")
    mask = response_mask.to(values.dtype)
    # BEGIN SOLUTION: scan t from the last position to the first, carrying V_{t+1} and A_{t+1} (both 0 past the end of a response); zero everything outside the mask
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = (delta + gamma * lam * next_advantage) * mask[:, t]
        advantages[:, t] = advantage
        next_value = values[:, t] * mask[:, t]
        next_advantage = advantage
    return advantages, (advantages + values) * mask
    # END SOLUTION


def sequence_ratio(log_probs: Tensor, old_log_probs: Tensor, response_mask: Tensor) -> Tensor:
    """GSPO's length-normalised sequence ratio (Zheng et al. 2025, arXiv:2507.18071, eq. 7).

    ``s_i = (pi_theta(o_i) / pi_old(o_i)) ** (1/|o_i|) = exp(mean_t (logp - old_logp))``.
    Inputs ``(batch, R)``; returns ``(batch,)``.
    """
    # BEGIN SOLUTION: average the per-token log-ratios over each response's real tokens, then exponentiate
    return torch.exp(masked_mean(log_probs - old_log_probs, response_mask, dim=1))
    # END SOLUTION


def clipped_objective(ratio: Tensor, advantages: Tensor, clip_low: float,
                      clip_high: float | None = None) -> Tensor:
    """PPO's pessimistic clipped loss with decoupled bounds (DAPO "clip-higher", Yu et al. 2025,
    arXiv:2503.14476, eq. 8): ``-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)``.

    ``ratio`` is ``(batch, R)`` (token level) or ``(batch,)`` (sequence level); ``advantages`` is
    ``(batch,)``, broadcast over tokens, or the same shape as ``ratio`` (e.g. GAE).
    ``clip_high`` defaults to ``clip_low`` (symmetric PPO).

    Raises:
        ValueError: if ``clip_high < clip_low`` or a bound is negative.
    """
    clip_high = clip_low if clip_high is None else clip_high
    if clip_low < 0 or clip_high < clip_low:
        raise ValueError(f"clip bounds low={clip_low}, high={clip_high}: need 0 <= low <= high "
                         "(DAPO raises only the upper bound).")
    if advantages.dim() < ratio.dim():
        advantages = advantages.view(*advantages.shape, *([1] * (ratio.dim() - advantages.dim())))
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return -torch.minimum(ratio * advantages, clipped * advantages)


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
        ValueError: for an unknown mode, or the Dr. GRPO mode without a positive constant length.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {AGGREGATIONS}.")
    mask = response_mask.to(per_token.dtype)
    if mode == "seq-mean-token-mean":
        return sequence_mean(per_token, response_mask)
    if mode == "token-mean":
        # BEGIN SOLUTION: sum the loss over every real token of the batch and divide by the number of real tokens
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
        # END SOLUTION
    if constant_length is None or constant_length <= 0:
        raise ValueError("seq-mean-token-sum-norm needs constant_length > 0 (e.g. the maximum "
                         "response length).")
    return (per_token * mask).sum() / (per_token.shape[0] * constant_length)


def policy_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor,
                response_mask: Tensor, ratio_level: str = "token", clip_low: float = 0.2,
                clip_high: float | None = None, loss_agg: str = "seq-mean-token-mean",
                constant_length: int | None = None) -> tuple[Tensor, Tensor]:
    """The clipped policy-gradient loss of the whole family, one option per part.

    * ratio: per token, ``exp(logp - old_logp)`` (PPO, GRPO), or per sequence,
      :func:`sequence_ratio` (GSPO; every token of a response then shares its loss);
    * clipping: :func:`clipped_objective` with ``clip_low``/``clip_high``;
    * aggregation: :func:`aggregate_loss` with ``loss_agg``.

    Args:
        log_probs, old_log_probs: ``(batch, R)``; advantages: ``(batch,)`` or ``(batch, R)``
            (a sequence ratio needs ``(batch,)``); response_mask: ``(batch, R)``.

    Returns:
        ``(loss, clipped)``: the scalar loss and a ``(batch, R)`` bool tensor, True on the tokens
        whose objective was clipped (no gradient through them).

    Raises:
        ValueError: for an unknown ratio level, a sequence ratio with per-token advantages, or
            the errors of :func:`clipped_objective` and :func:`aggregate_loss`.
    """
    clip_high = clip_low if clip_high is None else clip_high
    if ratio_level == "token":
        ratio = torch.exp(log_probs - old_log_probs)
        per_token = clipped_objective(ratio, advantages, clip_low, clip_high)
    elif ratio_level == "sequence":
        if advantages.dim() != 1:
            raise ValueError("a sequence-level ratio needs one advantage per response (batch,), "
                             f"got shape {tuple(advantages.shape)}.")
        ratio = sequence_ratio(log_probs, old_log_probs, response_mask)
        per_token = clipped_objective(ratio, advantages, clip_low, clip_high)[:, None].expand_as(
            log_probs)
        ratio = ratio[:, None].expand_as(log_probs)
    else:
        raise ValueError(f"unknown ratio level {ratio_level!r}; choose token or sequence.")
    clipped = clipped_tokens(ratio, advantages, clip_low, clip_high)
    loss = aggregate_loss(per_token, response_mask, loss_agg, constant_length)
    return loss, clipped.detach() & response_mask


def overlong_penalty(lengths: Tensor, max_length: int, cache_length: int) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13), added to the
    reward: 0 up to ``max_length - cache_length`` tokens, then falling linearly to -1 at
    ``max_length``, and -1 beyond. ``lengths (batch,)`` -> ``(batch,)``.

    Raises:
        ValueError: unless ``0 < cache_length <= max_length``.
    """
    if not 0 < cache_length <= max_length:
        raise ValueError(f"overlong_penalty: need 0 < cache_length ({cache_length}) <= max_length "
                         f"({max_length}).")
    lengths = lengths.to(torch.float32)
    soft = ((max_length - cache_length) - lengths) / cache_length
    return torch.clamp(soft, min=-1.0, max=0.0)


def groups_with_signal(rewards: Tensor, group_size: int) -> Tensor:
    """DAPO's dynamic-sampling filter: ``(num_prompts,)`` bool, True for groups whose rewards are
    not all equal. A group of equal rewards has zero group-relative advantage and no gradient;
    DAPO drops it and samples more prompts until the batch is full (the cost: extra generation)."""
    check_groups(rewards, group_size, "groups_with_signal")
    grouped = rewards.view(-1, group_size)
    return (grouped != grouped[:, :1]).any(dim=1)
