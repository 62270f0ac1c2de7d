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

from dataclasses import dataclass

import torch

from .critic import Critic, clipped_value_loss
from .grpo import GRPOConfig, GRPOTrainer
from .model import TinyGPT
from .objectives import aggregate_loss, clipped_objective, gae
from .rl import clip_fraction, masked_mean
from .sampling import response_log_probs
from .tasks import Problem, Task
from .tokenizer import CharTokenizer
from .utils import derived_seed


@dataclass
class PPOConfig(GRPOConfig):
    """GRPOConfig's fields (``group_size`` may be 1 here) plus the critic's.

    Raises:
        ValueError: as GRPOConfig, and for gamma/lam outside [0, 1] or a non-positive critic lr
            or value clip.
    """

    group_size: int = 1
    prompts_per_step: int = 512
    gamma: float = 1.0
    lam: float = 0.95
    critic_lr: float = 1e-3
    value_clip: float = 0.2
    value_coef: float = 1.0

    min_group_size = 1
    algorithm = "ppo"

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (0.0 <= self.gamma <= 1.0 and 0.0 <= self.lam <= 1.0):
            raise ValueError(f"gamma={self.gamma} and lam={self.lam} must be in [0, 1].")
        for name in ("critic_lr", "value_clip", "value_coef"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)} must be positive.")


class PPOTrainer(GRPOTrainer):
    """Policy, critic (initialised from the policy's trunk), frozen reference, two optimizers."""

    def __init__(self, policy: TinyGPT, task: Task, tokenizer: CharTokenizer, config: PPOConfig,
                 eval_problems: list[Problem], reference: TinyGPT | None = None) -> None:
        super().__init__(policy, task, tokenizer, config, eval_problems, reference)
        self.critic = Critic(policy)
        self.critic_optimizer = torch.optim.AdamW(self.critic.trainable_parameters(),
                                                  lr=config.critic_lr, weight_decay=0.0)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "critic": self.critic.state_dict(),
                "critic_optimizer": self.critic_optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.critic.load_state_dict(state["critic"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])

    def step(self) -> dict:
        """Run one PPO iteration and return its metrics (see module docstring)."""
        cfg, timer = self.config, self.timer
        self.step_count += 1
        step = self.step_count
        _, rollout, verdicts, rewards = self.rollout_and_reward(step)
        tokens, attn, plen, rmask = (rollout.tokens, rollout.attention_mask, rollout.prompt_len,
                                     rollout.response_mask)

        with timer("scoring"), torch.no_grad():
            old_log_probs = response_log_probs(self.policy, tokens, attn, plen)
            old_values = self.critic(tokens, attn, plen)
            kl = torch.zeros_like(old_log_probs)
            if self.reference is not None:
                kl = old_log_probs - response_log_probs(self.reference, tokens, attn, plen)  # k1
            token_rewards = -cfg.kl_coef * kl * rmask
            last = rmask.sum(1) - 1  # index of each response's last token
            token_rewards[torch.arange(len(last)), last] += rewards
            advantages, returns = gae(token_rewards, old_values, rmask, cfg.gamma, cfg.lam)
            mean = masked_mean(advantages, rmask)
            std = masked_mean((advantages - mean) ** 2, rmask).sqrt()
            advantages = (advantages - mean) / (std + 1e-6) * rmask  # whitened over the batch

        stats = {"policy_loss": 0.0, "value_loss": 0.0, "clip_fraction": 0.0, "entropy": 0.0,
                 "grad_norm": 0.0}
        n_updates = 0
        with timer("training"):
            self.policy.train()
            self.lr_schedule(self.optimizer, step, cfg.lr)
            self.lr_schedule(self.critic_optimizer, step, cfg.critic_lr)
            batch = tokens.shape[0]
            size = batch // cfg.minibatches
            for epoch in range(cfg.ppo_epochs):
                order = torch.randperm(batch, generator=torch.Generator().manual_seed(
                    derived_seed(cfg.seed, step, 3, epoch)))
                for k in range(cfg.minibatches):
                    idx = order[k * size:(k + 1) * size]
                    mask = rmask[idx]
                    log_probs, entropy = response_log_probs(self.policy, tokens[idx], attn[idx],
                                                            plen, with_entropy=True)
                    ratio = torch.exp(log_probs - old_log_probs[idx])
                    policy_loss = aggregate_loss(clipped_objective(ratio, advantages[idx],
                                                                   cfg.clip_eps), mask, "token-mean")
                    values = self.critic(tokens[idx], attn[idx], plen)
                    value_loss = clipped_value_loss(values, old_values[idx], returns[idx], mask,
                                                    cfg.value_clip)
                    loss = policy_loss + cfg.value_coef * value_loss
                    if not torch.isfinite(loss):
                        raise FloatingPointError(
                            f"PPO loss is {loss.item()} at step {step}: training diverged; lower "
                            "--lr.")
                    self.optimizer.zero_grad(set_to_none=True)
                    self.critic_optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(),
                                                               cfg.max_grad_norm)
                    torch.nn.utils.clip_grad_norm_(self.critic.trainable_parameters(),
                                                   cfg.max_grad_norm)
                    self.optimizer.step()
                    self.critic_optimizer.step()
                    stats["policy_loss"] += policy_loss.item()
                    stats["value_loss"] += value_loss.item()
                    stats["clip_fraction"] += clip_fraction(
                        log_probs.detach(), old_log_probs[idx], advantages[idx], cfg.clip_eps,
                        mask).item()
                    stats["entropy"] += masked_mean(entropy.detach(), mask).item()
                    stats["grad_norm"] += float(grad_norm)
                    n_updates += 1
            self.policy.eval()

        metrics = self.rollout_metrics(step, rollout, verdicts, rewards, timer.reset())
        metrics.update({k: v / n_updates for k, v in stats.items()})
        metrics["kl"] = masked_mean(kl, rmask).item()
        if step % cfg.eval_every == 0:
            metrics["accuracy_eval"] = self.evaluate()
        return metrics
