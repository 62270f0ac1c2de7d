"""Advantage estimators: how much better each response (or token) was than a baseline.

* group-relative (GRPO; without the std, Dr. GRPO): the baseline is the mean reward of the
  ``G`` responses to the same prompt, the response's own included (DeepSeekMath, section 4.1.2);
* leave-one-out (RLOO): the baseline is the mean of the *other* ``G - 1`` rewards;
* REINFORCE++: the return of each token, normalised over the whole batch (no group);
* GAE (PPO): a critic's values and a discounted, lambda-weighted sum of TD errors.

Shapes: ``rewards (batch,)`` with the ``group_size`` responses of one prompt contiguous
(``batch = num_prompts * group_size``); per-token tensors ``(batch, R)`` with a
``response_mask (batch, R)``. Chapter 02 uses :func:`group_advantages`, chapter 03 :func:`gae`,
chapter 04 the rest.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from rlm_course.rl.masked import (check_floats, check_mask, check_same_shape, check_tensors,
                                  masked_whiten, zero_padding)
from rlm_course.utils import is_real


def check_groups(rewards: Tensor, group_size: int, who: str) -> None:
    """Raise ``ValueError`` unless ``rewards`` are one finite float per response, ``(batch,)``,
    that split into groups of ``group_size >= 2``: a NaN reward would make its whole group's
    advantages NaN, and the run would fail later as a divergence."""
    if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral):
        raise ValueError(f"{who}: group_size={group_size!r} must be an integer, the responses "
                         "per prompt.")
    if group_size < 2:
        raise ValueError(f"{who}: group_size={group_size!r}; a group baseline needs at least 2 "
                         "responses per prompt.")
    if not isinstance(rewards, Tensor):
        raise ValueError(f"{who}: rewards is a {type(rewards).__name__}; give a torch tensor "
                         "(torch.as_tensor(rewards, dtype=torch.float32)).")
    if rewards.dim() != 1:
        raise ValueError(f"{who}: rewards of shape {tuple(rewards.shape)}; give one reward per "
                         "response, (batch,) (a per-token tensor is summed or taken at the last "
                         "token first).")
    if not rewards.is_floating_point():
        raise ValueError(f"{who}: rewards of dtype {rewards.dtype}; give floats "
                         "(rewards.float()).")
    bad = int((~torch.isfinite(rewards)).sum())
    if bad:
        raise ValueError(f"{who}: {bad} of {rewards.numel()} rewards are not finite (NaN or "
                         "inf); the reward function must return a number for every response.")
    if rewards.numel() % group_size:
        raise ValueError(f"{who}: {rewards.numel()} rewards do not split into groups of "
                         f"{group_size}.")


def check_std_options(normalize_std: bool, eps: float, who: str) -> None:
    """Raise ``ValueError`` unless ``normalize_std`` is a bool (the string ``"False"`` is true) and
    ``eps`` a finite number >= 0 (a negative one would flip the sign of a group whose spread is
    below it)."""
    if not isinstance(normalize_std, bool):
        raise ValueError(f"{who}: normalize_std={normalize_std!r} must be True or False.")
    if not (is_real(eps) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{who}: eps={eps!r} must be a finite number >= 0 (1e-6 keeps a group "
                         "of nearly equal rewards from dividing by 0).")


def constant_groups(grouped: Tensor) -> Tensor:
    """``(num_prompts, 1)`` bool, True for each row of ``grouped (num_prompts, group_size)`` whose
    rewards are all equal. Such a group carries no learning signal, and every group baseline must
    give it advantage exactly 0: computed as written, a float mean of equal values can be one ulp
    off (``0.1`` eight times averages to ``0.1 + 7e-9`` in float32), and dividing that by a
    near-zero standard deviation pushes every response of the group (by -0.0074 for rewards 0.1,
    +0.056 for 0.7)."""
    return (grouped == grouped[:, :1]).all(dim=1, keepdim=True)


def group_advantages(rewards: Tensor, group_size: int, normalize_std: bool = True,
                     eps: float = 1e-6) -> Tensor:
    """Group-relative advantages of GRPO (Shao et al. 2024, section 4.1.2, outcome supervision).

    ``A_i = (R_i - mean(R_group)) / (std(R_group) + eps)``, or ``R_i - mean(R_group)`` when
    ``normalize_std`` is False (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783). ``std`` is the
    unbiased sample standard deviation (``torch.std``'s default, as in TRL). Every token of response
    ``i`` shares ``A_i``. A group whose rewards are all equal gets advantage exactly 0: it
    carries no signal (:func:`constant_groups`).

    Args:
        rewards: ``(num_prompts * group_size,)`` float; responses of one prompt are contiguous.
        group_size: ``G`` (>= 2).

    Returns:
        ``(num_prompts * group_size,)`` advantages.

    Raises:
        ValueError: if ``group_size < 2`` or does not divide the number of rewards,
            ``normalize_std`` is not a bool or ``eps`` not a finite number >= 0 (a negative one
            would flip the sign of a group whose spread is below it).
    """
    check_groups(rewards, group_size, "group_advantages")
    check_std_options(normalize_std, eps, "group_advantages")
    # BEGIN SOLUTION: reshape so that each row is one group, compare each reward with its group's statistics, give the groups of equal rewards exactly 0 (constant_groups), and return the same shape as rewards
    grouped = rewards.view(-1, group_size)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if normalize_std:
        centered = centered / (grouped.std(dim=1, keepdim=True) + eps)
    return centered.masked_fill(constant_groups(grouped), 0.0).reshape(-1)
    # END SOLUTION


def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024, arXiv:2402.14740, eq. 5).

    ``A_i = R_i - 1/(G-1) sum_{j != i} R_j``, which equals ``G/(G-1) (R_i - mean(R))``; exactly 0
    for a group of equal rewards (:func:`constant_groups`).
    Input and output ``(num_prompts * group_size,)``.

    Raises:
        ValueError: if ``group_size < 2`` or does not divide the number of rewards.
    """
    check_groups(rewards, group_size, "rloo_advantages")
    # BEGIN SOLUTION: one row per group; each response's baseline is the mean of the *other* G-1 rewards of its row; groups of equal rewards get exactly 0 (constant_groups)
    grouped = rewards.view(-1, group_size)
    baseline = (grouped.sum(1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - baseline).masked_fill(constant_groups(grouped), 0.0).reshape(-1)
    # END SOLUTION


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

    Raises:
        ValueError: if gamma is outside [0, 1], the rewards are not floats, or the two tensors
            are not of one ``(batch, R)`` shape.
    """
    if not (is_real(gamma) and 0.0 <= gamma <= 1.0):
        raise ValueError(f"reinforce_pp_advantages: gamma={gamma!r} must be in [0, 1].")
    check_floats("reinforce_pp_advantages", token_rewards=token_rewards)
    check_tensors("reinforce_pp_advantages", response_mask=response_mask)
    check_same_shape(token_rewards, response_mask, "reinforce_pp_advantages", "token_rewards")
    check_mask(response_mask, "reinforce_pp_advantages")
    mask = response_mask.to(token_rewards.dtype)
    if gamma == 1.0:  # a NaN or inf at a padded position stays out (inf x 0 would be NaN)
        returns = zero_padding(token_rewards, response_mask).flip(1).cumsum(1).flip(1) * mask
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
        ValueError: if gamma or lam is not a number in [0, 1], an argument is not a tensor, the
            rewards or values are not floats (integer values would truncate every advantage),
            the three tensors are not of one ``(batch, R)`` shape, or the mask holds values
            other than 0 and 1 (a mask of 2s scaled every advantage).
    """
    if not (is_real(gamma) and is_real(lam) and 0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gae: gamma={gamma!r} and lam={lam!r} must be numbers in [0, 1].")
    check_floats("gae", rewards=rewards, values=values)
    check_tensors("gae", response_mask=response_mask)
    if values.dim() != 2:
        raise ValueError(f"gae: values of shape {tuple(values.shape)}; give (batch, R).")
    check_same_shape(values, response_mask, "gae", "values")
    check_same_shape(rewards, response_mask, "gae", "rewards")
    check_mask(response_mask, "gae")
    # what padded positions hold (a critic's value there can be anything, even NaN) stays out
    values, rewards = zero_padding(values, response_mask), zero_padding(rewards, response_mask)
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
