"""The mathematics of GRPO: group-relative advantages, the clipped surrogate, the k3 KL estimator.

Notation (DeepSeekMath, Shao et al. 2024, arXiv:2402.03300, section 4.1): a prompt ``q`` gets a
group of ``G`` responses ``o_1..o_G`` with scalar rewards ``R_1..R_G``; ``pi_theta`` is the policy
being trained, ``pi_old`` the policy that sampled the batch, ``pi_ref`` the frozen reference (the
SFT model). Per token, ``r_{i,t} = pi_theta(o_{i,t}) / pi_old(o_{i,t})`` is the importance ratio.

The GRPO objective (their eq. 3), written as a loss to minimise:

    L = 1/G sum_i 1/|o_i| sum_t [ -min(r_{i,t} A_i, clip(r_{i,t}, 1-eps, 1+eps) A_i)
                                  + beta * KL_k3(pi_theta || pi_ref)_{i,t} ]

All per-token tensors here are ``(batch, R)`` over response positions, with a ``response_mask``
``(batch, R)`` marking real response tokens; ``batch = num_prompts * G``, each group contiguous.
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over positions where ``mask`` is True (over ``dim``, or over all).

    A row with no True entry gives 0 rather than NaN.
    """
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1.0)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def check_groups(rewards: Tensor, group_size: int, who: str) -> None:
    """Raise ``ValueError`` unless ``rewards`` split into groups of ``group_size >= 2``."""
    if group_size < 2:
        raise ValueError(f"{who}: group_size={group_size}; a group baseline needs at least 2 "
                         "responses per prompt.")
    if rewards.numel() % group_size:
        raise ValueError(f"{who}: {rewards.numel()} rewards do not split into groups of "
                         f"{group_size}.")


def group_advantages(rewards: Tensor, group_size: int, normalize_std: bool = True,
                     eps: float = 1e-6) -> Tensor:
    """Group-relative advantages of GRPO (Shao et al. 2024, section 4.1.2, outcome supervision).

    ``A_i = (R_i - mean(R_group)) / (std(R_group) + eps)``, or ``R_i - mean(R_group)`` when
    ``normalize_std`` is False (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783). ``std`` is the
    unbiased sample standard deviation (``torch.std``'s default, as in TRL). Every token of response
    ``i`` shares ``A_i``. A group whose rewards are all equal gets advantage 0: it carries no signal.

    Args:
        rewards: ``(num_prompts * group_size,)`` float; responses of one prompt are contiguous.
        group_size: ``G`` (>= 2).

    Returns:
        ``(num_prompts * group_size,)`` advantages.

    Raises:
        ValueError: if ``group_size < 2`` or does not divide the number of rewards.
    """
    check_groups(rewards, group_size, "group_advantages")
    # BEGIN SOLUTION: reshape so that each row is one group, compare each reward with its group's statistics, and return the same shape as rewards
    grouped = rewards.view(-1, group_size)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if normalize_std:
        centered = centered / (grouped.std(dim=1, keepdim=True) + eps)
    return centered.reshape(-1)
    # END SOLUTION


def clipped_surrogate(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor,
                      clip_eps: float) -> Tensor:
    """Per-token PPO clipped surrogate loss (Schulman et al. 2017, arXiv:1707.06347, eq. 7).

    ``loss_t = -min(r_t A, clip(r_t, 1 - eps, 1 + eps) A)`` with ``r_t = exp(logp_t - old_logp_t)``.

    Args:
        log_probs: ``(batch, R)`` log pi_theta of the sampled tokens (carries gradient).
        old_log_probs: ``(batch, R)`` log pi_old of the same tokens (no gradient).
        advantages: ``(batch,)`` one advantage per response, broadcast over its tokens.
        clip_eps: ``eps`` (e.g. 0.2).

    Returns:
        ``(batch, R)`` per-token loss (aggregate it with a mask, e.g. :func:`sequence_mean`).
    """
    # BEGIN SOLUTION: the ratio comes from the two log-probs; broadcast one advantage over a response's tokens; take the pessimistic (smaller) of the clipped and unclipped objectives
    ratio = torch.exp(log_probs - old_log_probs)
    adv = advantages[:, None]
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    return -torch.minimum(unclipped, clipped)
    # END SOLUTION


def kl_k3(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi_theta || pi_ref) (Schulman 2020, "Approximating KL
    divergence", joschu.net/blog/kl-approx.html; GRPO eq. 4).

    With ``log rho = log pi_ref - log pi_theta`` on tokens sampled from pi_theta:
    ``k3 = exp(log rho) - log rho - 1``: unbiased, always >= 0, and 0 where the two agree.

    Args:
        log_probs, ref_log_probs: ``(batch, R)``.

    Returns:
        ``(batch, R)`` non-negative estimates.
    """
    # BEGIN SOLUTION: work with log rho (a difference of log-probs) and follow the formula in the docstring
    log_rho = ref_log_probs - log_probs
    return torch.exp(log_rho) - log_rho - 1.0
    # END SOLUTION


def sequence_mean(per_token: Tensor, response_mask: Tensor) -> Tensor:
    """GRPO's aggregation: mean over each response's tokens, then mean over responses.

    ``1/G sum_i 1/|o_i| sum_t x_{i,t}`` (Shao et al. 2024, eq. 3). Inputs ``(batch, R)``.
    """
    return masked_mean(per_token, response_mask, dim=1).mean()


def clipped_tokens(ratio: Tensor, advantages: Tensor, clip_low: float,
                   clip_high: float | None = None) -> Tensor:
    """Where the clipped objective removed the gradient: the ratio above ``1 + clip_high`` with a
    positive advantage, or below ``1 - clip_low`` with a negative one. ``ratio (batch, R)``;
    ``advantages (batch,)`` (broadcast over tokens) or ``(batch, R)``. Returns a bool tensor."""
    clip_high = clip_low if clip_high is None else clip_high
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    return ((ratio > 1 + clip_high) & (adv > 0)) | ((ratio < 1 - clip_low) & (adv < 0))


def clip_fraction(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, clip_eps: float,
                  response_mask: Tensor) -> Tensor:
    """Share of response tokens whose ratio was clipped (where clipping removed the gradient).

    ``advantages`` is ``(batch,)`` (one per response) or ``(batch, R)`` (per token, e.g. GAE)."""
    ratio = torch.exp(log_probs - old_log_probs)
    return masked_mean(clipped_tokens(ratio, advantages, clip_eps).float(), response_mask)


KL_CLAMP = 10.0


def grpo_loss(log_probs: Tensor, old_log_probs: Tensor, ref_log_probs: Tensor | None,
              advantages: Tensor, response_mask: Tensor, clip_eps: float = 0.2,
              kl_coef: float = 0.0, kl_clamp: float = KL_CLAMP) -> tuple[Tensor, dict[str, float]]:
    """The GRPO loss of a (mini-)batch and its diagnostics.

    Args:
        log_probs, old_log_probs, ref_log_probs: ``(batch, R)``; ``ref_log_probs`` may be None
            when ``kl_coef == 0`` (then no reference model is needed at all).
        advantages: ``(batch,)``; response_mask: ``(batch, R)`` bool.
        kl_clamp: per-token k3 values are capped at this (nats). k3 grows like ``exp(log rho)``:
            one sampled token that the policy now finds very unlikely but the reference does not
            can dominate a whole batch's KL and gradient. verl caps it the same way (``kl_penalty``,
            "low_var_kl", in ``verl/trainer/ppo/core_algos.py``); a capped token gets no KL gradient.

    Returns:
        ``(loss, stats)`` with stats ``policy_loss``, ``kl`` (mean capped k3 per token),
        ``clip_fraction``.

    Raises:
        ValueError: if ``kl_coef > 0`` and no reference log-probs are given.
    """
    policy = sequence_mean(clipped_surrogate(log_probs, old_log_probs, advantages, clip_eps),
                           response_mask)
    loss = policy
    kl_value = 0.0
    if ref_log_probs is not None:
        kl = sequence_mean(kl_k3(log_probs, ref_log_probs).clamp(max=kl_clamp), response_mask)
        loss = loss + kl_coef * kl
        kl_value = kl.item()
    elif kl_coef > 0:
        raise ValueError("grpo_loss: kl_coef > 0 needs ref_log_probs from the reference model.")
    stats = {
        "policy_loss": policy.item(),
        "kl": kl_value,
        "clip_fraction": clip_fraction(log_probs.detach(), old_log_probs, advantages, clip_eps,
                                       response_mask).item(),
    }
    return loss, stats
