"""PPO for language models: a critic, token-level GAE, and the KL penalty inside the reward.

One iteration (Ouyang et al. 2022, InstructGPT, arXiv:2203.02155; Ziegler et al. 2019,
arXiv:1909.08593; the form of verl's ``compute_rewards`` and ``compute_gae_advantage_return``):

1. **generation** and **reward**: as in GRPO (:meth:`GRPOTrainer.rollout_and_reward`);
2. **scoring**: log-probs under the policy (``pi_old``) and the reference, and the critic's values
   ``V(s_t)``: three forward passes instead of GRPO's two;
3. per-token rewards ``r_t = -beta * (log pi_old - log pi_ref)_t + [t = last] R`` (k1 in the
   reward), GAE advantages (whitened over the batch) and returns;
4. **training**: the clipped policy loss (token mean) and the clipped value loss, one optimizer
   each.

Compared with GRPO, PPO holds one more trained model (the critic: its weights, gradients and
Adam state) and runs one more forward and one more forward+backward per sample, but needs no group
of samples per prompt.
"""

from __future__ import annotations

from .algorithms import RLConfig, preset
from .trainer import RLTrainer

__all__ = ["PPOConfig", "PPOTrainer"]


def PPOConfig(**overrides) -> RLConfig:  # noqa: N802 (reads as the constructor it stands for)
    """PPO's settings (the ``ppo`` preset: critic and GAE with gamma 1, lambda 0.95, whitened
    advantages, k1 KL in the per-token reward, token-mean clipped loss, one response per prompt,
    512 prompts per step) with ``overrides``.

    Raises:
        ValueError: see :class:`rlm_course.algorithms.RLConfig`.
    """
    return preset("ppo", **overrides)


PPOTrainer = RLTrainer
