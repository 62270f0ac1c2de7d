"""The PPO critic: a transformer trunk with a scalar value head.

The critic estimates ``V(s_t)``, the expected final reward from the state "prompt plus the first
``t`` response tokens". It is as large as the policy (InstructGPT, arXiv:2203.02155, initialises it
from the reward model; here, from the SFT policy's trunk), so PPO holds and trains a second model:
twice the trained weights, gradients and optimizer state of GRPO.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn
from torch import Tensor

from rlm_course.lm.model import TinyGPT
from rlm_course.rl.masked import check_same_shape, masked_mean
from rlm_course.utils import is_real


class Critic(nn.Module):
    """``V(s_t)`` for every response position.

    Args:
        trunk: a :class:`TinyGPT` whose weights initialise the critic's trunk (deep-copied; the
            language-model head is not used).
    """

    def __init__(self, trunk: TinyGPT) -> None:
        super().__init__()
        self.trunk = copy.deepcopy(trunk)
        self.trunk.head.requires_grad_(False)  # unused: the value head replaces it
        weight = next(trunk.parameters())  # the head on the trunk's device and dtype
        self.value_head = nn.Linear(trunk.config.d_model, 1, device=weight.device,
                                    dtype=weight.dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, tokens: Tensor, attention_mask: Tensor, prompt_len: int) -> Tensor:
        """Values of the states before each response token.

        Args:
            tokens, attention_mask: ``(batch, P + R)`` as in :class:`rlm_course.lm.sampling.Rollout`.
            prompt_len: ``P``; the state before response token ``t`` ends at column ``P - 1 + t``.

        Returns:
            ``(batch, R)`` float values.
        """
        hidden = self.trunk.hidden_states(tokens, attention_mask)[:, prompt_len - 1:-1]
        return self.value_head(hidden).squeeze(-1)

    def trainable_parameters(self):
        return [p for p in self.parameters() if p.requires_grad]


def clipped_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, response_mask: Tensor,
                       clip_eps: float) -> Tensor:
    """PPO's clipped value loss, token mean (Schulman et al. 2017 implementation; the form of
    OpenAI baselines and verl ``compute_value_loss``):

    ``1/2 * max((V - R)^2, (clip(V, V_old - eps, V_old + eps) - R)^2)``.

    Inputs ``(batch, R)``; returns a scalar.

    Raises:
        ValueError: for a ``clip_eps`` that is not a finite number > 0 (a negative one would
            clamp with its bounds swapped), or tensors not of the mask's shape.
    """
    if not (is_real(clip_eps) and math.isfinite(clip_eps) and clip_eps > 0):
        raise ValueError(f"clipped_value_loss: clip_eps={clip_eps!r} must be a finite number > 0 "
                         "(0.2 is typical).")
    for name, t in (("values", values), ("old_values", old_values), ("returns", returns)):
        check_same_shape(t, response_mask, "clipped_value_loss", name)
    clipped = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)
    loss = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return masked_mean(loss, response_mask)
