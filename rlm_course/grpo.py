"""The GRPO training loop: rollout -> experience preparation -> policy update.

One iteration (``step``) of :class:`GRPOTrainer`:

1. **generation** (rollout): ``prompts_per_step`` problems, ``group_size`` samples each, from the
   current policy with a KV cache;
2. experience preparation: **reward** (the task's verifier scores each response; group-relative
   advantages) and **scoring** (log-probs of the sampled tokens under the policy before the
   update, ``pi_old``, and under the frozen reference, ``pi_ref``, only if ``kl_coef > 0``);
3. **training**: ``ppo_epochs`` passes over the batch in ``minibatches`` mini-batches, each a
   gradient step on the clipped surrogate plus the k3 KL penalty (:mod:`rlm_course.rl`).

GRPO is one preset of the family (:mod:`rlm_course.algorithms`); the loop that runs it, and every
other preset, is :class:`rlm_course.trainer.RLTrainer`.
"""

from __future__ import annotations

from .algorithms import RLConfig, preset
from .trainer import RLTrainer

__all__ = ["GRPOConfig", "GRPOTrainer"]


def GRPOConfig(**overrides) -> RLConfig:  # noqa: N802 (reads as the constructor it stands for)
    """GRPO's settings (the ``grpo`` preset: group advantages with std, token ratio, clip 0.2,
    seq-mean-token-mean, k3 KL as a loss with coefficient 0.005) with ``overrides``.

    Raises:
        ValueError: see :class:`rlm_course.algorithms.RLConfig`.
    """
    return preset("grpo", **overrides)


GRPOTrainer = RLTrainer
