"""DAPO's reward shaping and batch filter (Yu et al. 2025, arXiv:2503.14476): the soft overlong
penalty added to a response's reward, and dynamic sampling's test of which groups carry a
learning signal. Chapter 04."""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from rlm_course.rl.advantages import check_groups, constant_groups


def overlong_penalty(lengths: Tensor, max_length: int, cache_length: int) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13), added to the
    reward: 0 up to ``max_length - cache_length`` tokens, then falling linearly to -1 at
    ``max_length``, and -1 beyond. ``lengths (batch,)`` -> ``(batch,)``.

    Raises:
        ValueError: unless ``cache_length`` and ``max_length`` are integers with ``0 <
            cache_length <= max_length`` (a bool, a float or an infinite length is refused), and
            the lengths are ``>= 0``.
    """
    if not (all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                for v in (cache_length, max_length)) and 0 < cache_length <= max_length):
        raise ValueError(f"overlong_penalty: need integers 0 < cache_length ({cache_length!r}) <= "
                         f"max_length ({max_length!r}).")
    if lengths.numel() and bool((lengths < 0).any()):
        raise ValueError(f"overlong_penalty: a length of {lengths.min().item()} tokens; lengths "
                         "count the tokens of each response, >= 0.")
    lengths = lengths.to(torch.float32 if not lengths.is_floating_point() else lengths.dtype)
    soft = ((max_length - cache_length) - lengths) / cache_length
    return torch.clamp(soft, min=-1.0, max=0.0)


def groups_with_signal(rewards: Tensor, group_size: int) -> Tensor:
    """DAPO's dynamic-sampling filter: ``(num_prompts,)`` bool, True for groups whose values
    (``(num_prompts * group_size,)``, groups contiguous) are not all equal. On rewards: a group of
    equal rewards has zero group-relative advantage and no gradient. DAPO applies it to the
    answers' accuracy (arXiv:2503.14476, eq. 11: keep a group when ``0 < #correct < G``), as the
    trainer does, so that an all-wrong group whose shaped rewards differ (an overlong penalty, a
    format bonus) is dropped too; it samples more prompts until the batch is full (the cost:
    extra generation)."""
    check_groups(rewards, group_size, "groups_with_signal")
    return ~constant_groups(rewards.view(-1, group_size)).squeeze(1)
