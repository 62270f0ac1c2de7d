"""The GRPO training loop: rollout -> experience preparation -> policy update.

One iteration (``step``) of :class:`GRPOTrainer`:

1. **generation** (rollout): ``prompts_per_step`` problems, ``group_size`` samples each, from the
   current policy with a KV cache;
2. experience preparation: **reward** (the task's verifier scores each response; group-relative
   advantages) and **scoring** (log-probs of the sampled tokens under the policy before the
   update, ``pi_old``, and under the frozen reference, ``pi_ref``, only if ``kl_coef > 0``);
3. **training**: ``ppo_epochs`` passes over the batch in ``minibatches`` mini-batches, each a
   gradient step on the clipped surrogate plus the k3 KL penalty (:mod:`rlm_course.rl`).

The rollout engine and the trainer are the same module here; at scale they are separate copies
and step 4, weight sync, moves the new weights to the rollout engine (chapter 12).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from .evaluate import evaluate
from .model import TinyGPT
from .objectives import groups_with_signal
from .rl import group_advantages, grpo_loss, masked_mean
from .sampling import generate, response_log_probs
from .tasks import Problem, Task
from .tokenizer import CharTokenizer
from .utils import StageTimer, derived_seed


MAX_BATCH = 16384  # responses per step; more does not fit a laptop's memory comfortably


@dataclass
class GRPOConfig:
    """Hyper-parameters of GRPO; the defaults are the course's addition run.

    Raises:
        ValueError: for a group size below 2, non-positive steps/sizes, a mini-batch count that
            does not divide the batch, or a negative coefficient.
    """

    steps: int = 300
    prompts_per_step: int = 64
    group_size: int = 8
    ppo_epochs: int = 1
    minibatches: int = 2
    lr: float = 3e-4
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    clip_eps: float = 0.2
    kl_coef: float = 0.005
    normalize_std: bool = True
    temperature: float = 1.0
    max_grad_norm: float = 1.0
    eval_every: int = 25
    seed: int = 0

    min_group_size = 2  # class constants, not fields: GRPO's baseline needs a group
    algorithm = "grpo"

    def __post_init__(self) -> None:
        if self.group_size < self.min_group_size:
            raise ValueError(f"group_size={self.group_size}: GRPO's group baseline needs at least "
                             "2 samples per prompt; use --group-size 2 or more (8 is typical).")
        for name in ("steps", "prompts_per_step", "ppo_epochs", "minibatches", "eval_every"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer.")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps={self.warmup_steps} must be >= 0.")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio={self.min_lr_ratio} must be in [0, 1].")
        batch = self.prompts_per_step * self.group_size
        if batch > MAX_BATCH:
            raise ValueError(f"prompts_per_step x group_size = {batch} responses per step is more "
                             f"than {MAX_BATCH}; lower --prompts-per-step or --group-size.")
        if batch % self.minibatches:
            raise ValueError(f"minibatches={self.minibatches} does not divide the batch of "
                             f"{batch} responses (prompts_per_step x group_size); change "
                             "--minibatches or --prompts-per-step.")
        for name in ("lr", "clip_eps", "temperature", "max_grad_norm"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value} must be a positive finite number.")
        if self.lr > 1.0:
            raise ValueError(f"lr={self.lr} is far too large for Adam (use 1e-4 to 1e-3).")
        if not (math.isfinite(self.kl_coef) and self.kl_coef >= 0):
            raise ValueError(f"kl_coef={self.kl_coef} must be a finite number >= 0 (0 drops the "
                             "reference model).")
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed={self.seed} must be in [0, 2**63).")


    def lr_at(self, step: int) -> float:
        """Learning rate of ``step`` (1-based): linear warm-up over ``warmup_steps`` (Adam's first
        updates move every weight by about ``lr`` whatever its gradient), then a cosine decay to
        ``min_lr_ratio * lr`` at ``steps`` (Loshchilov & Hutter 2017, arXiv:1608.03983), so the
        final policy is not the noisiest one."""
        if step <= self.warmup_steps:
            return self.lr * step / max(self.warmup_steps, 1)
        progress = min(1.0, (step - self.warmup_steps) / max(self.steps - self.warmup_steps, 1))
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.lr * (self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine)


class GRPOTrainer:
    """Holds the policy, the frozen reference and the optimizer; :meth:`step` runs one iteration.

    Every step is a pure function of ``(seed, step, weights, optimizer state)``: problems and
    samples are drawn from generators seeded by ``(seed, step)``, so a resumed run repeats an
    uninterrupted one exactly on CPU.
    """

    def __init__(self, policy: TinyGPT, task: Task, tokenizer: CharTokenizer, config: GRPOConfig,
                 eval_problems: list[Problem], reference: TinyGPT | None = None) -> None:
        self.policy, self.task, self.tokenizer, self.config = policy, task, tokenizer, config
        self.reference = None
        if config.kl_coef > 0:
            self.reference = reference if reference is not None else copy.deepcopy(policy)
            self.reference.requires_grad_(False).eval()
        self.optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr, weight_decay=0.0)
        self.eval_problems = eval_problems
        self.exclude = {p.prompt for p in eval_problems}
        self.timer = StageTimer()
        self.step_count = 0

    def evaluate(self) -> float:
        return evaluate(self.policy, self.task, self.eval_problems, self.tokenizer).accuracy

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "step": self.step_count,
                "reference": self.reference.state_dict() if self.reference is not None else None}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.step_count = state["step"]
        if self.reference is not None and state.get("reference") is not None:
            self.reference.load_state_dict(state["reference"])

    def rollout_and_reward(self, step: int):
        """Stages 1 and 2a of iteration ``step``: sample the group responses, score them.

        Returns:
            ``(problems, rollout, verdicts, rewards)``: the ``prompts_per_step * group_size``
            problems (groups contiguous), the :class:`Rollout`, the verifier's verdicts and the
            ``(batch,)`` reward tensor.
        """
        cfg, tok, timer = self.config, self.tokenizer, self.timer
        problems = self.task.problems(cfg.prompts_per_step, derived_seed(cfg.seed, step, 1),
                                      self.exclude)
        group = [p for p in problems for _ in range(cfg.group_size)]  # groups contiguous
        with timer("generation"):
            tokens, mask = tok.encode_prompts([p.prompt for p in group])
            generator = torch.Generator().manual_seed(derived_seed(cfg.seed, step, 2))
            rollout = generate(self.policy, tokens, mask, self.task.max_response_len, tok.eos_id,
                               tok.pad_id, temperature=cfg.temperature, generator=generator)
        with timer("reward"):
            verdicts = [self.task.verify(p, tok.decode(r)) for p, r in zip(group, rollout.responses)]
            rewards = torch.tensor([v.reward for v in verdicts])
        return group, rollout, verdicts, rewards

    def lr_schedule(self, optimizer: torch.optim.Optimizer, step: int, base_lr: float) -> None:
        """Set ``optimizer``'s learning rate for ``step``: the schedule of
        :meth:`GRPOConfig.lr_at`, scaled to ``base_lr`` (e.g. the critic's)."""
        for param_group in optimizer.param_groups:
            param_group["lr"] = self.config.lr_at(step) * (base_lr / self.config.lr)

    def rollout_metrics(self, step: int, rollout, verdicts, rewards, seconds: dict) -> dict:
        """Metrics shared by every algorithm (one row of ``metrics.jsonl``)."""
        return {
            "step": step,
            "reward_mean": rewards.mean().item(),
            "accuracy_train": sum(v.correct for v in verdicts) / len(verdicts),
            "format_rate": sum(v.format_ok for v in verdicts) / len(verdicts),
            "response_length": rollout.response_lengths().float().mean().item(),
            "tokens_generated": int(rollout.response_mask.sum()),
            **{f"seconds_{s}": seconds.get(s, 0.0) for s in ("generation", "reward", "scoring",
                                                              "training")},
        }

    def step(self) -> dict:
        """Run one GRPO iteration and return its metrics (see module docstring)."""
        cfg, timer = self.config, self.timer
        self.step_count += 1
        step = self.step_count
        group, rollout, verdicts, rewards = self.rollout_and_reward(step)
        advantages = group_advantages(rewards, cfg.group_size, cfg.normalize_std)

        with timer("scoring"):
            with torch.no_grad():
                old_log_probs = response_log_probs(self.policy, rollout.tokens,
                                                   rollout.attention_mask, rollout.prompt_len)
                ref_log_probs = None
                if self.reference is not None:
                    ref_log_probs = response_log_probs(self.reference, rollout.tokens,
                                                       rollout.attention_mask, rollout.prompt_len)

        stats = {"policy_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "entropy": 0.0,
                 "grad_norm": 0.0}
        n_updates = 0
        with timer("training"):
            self.policy.train()
            self.lr_schedule(self.optimizer, step, cfg.lr)
            batch = rollout.tokens.shape[0]
            size = batch // cfg.minibatches
            for epoch in range(cfg.ppo_epochs):
                order = torch.randperm(batch, generator=torch.Generator().manual_seed(
                    derived_seed(cfg.seed, step, 3, epoch)))
                for k in range(cfg.minibatches):
                    idx = order[k * size:(k + 1) * size]
                    log_probs, entropy = response_log_probs(
                        self.policy, rollout.tokens[idx], rollout.attention_mask[idx],
                        rollout.prompt_len, with_entropy=True)
                    rmask = rollout.response_mask[idx]
                    loss, s = grpo_loss(log_probs, old_log_probs[idx],
                                        None if ref_log_probs is None else ref_log_probs[idx],
                                        advantages[idx], rmask, cfg.clip_eps, cfg.kl_coef)
                    if not torch.isfinite(loss):
                        raise FloatingPointError(
                            f"GRPO loss is {loss.item()} at step {step}: training diverged; lower "
                            "--lr (the default is 3e-4) or raise --kl-coef.")
                    self.optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(),
                                                               cfg.max_grad_norm)
                    self.optimizer.step()
                    s["entropy"] = masked_mean(entropy.detach(), rmask).item()
                    s["grad_norm"] = float(grad_norm)
                    for key in stats:
                        stats[key] += s[key]
                    n_updates += 1
            self.policy.eval()

        seconds = timer.reset()
        metrics = self.rollout_metrics(step, rollout, verdicts, rewards, seconds)
        metrics.update({k: v / n_updates for k, v in stats.items()})
        metrics["groups_with_signal"] = int(groups_with_signal(rewards, cfg.group_size).sum())
        if step % cfg.eval_every == 0:
            metrics["accuracy_eval"] = self.evaluate()
        return metrics
