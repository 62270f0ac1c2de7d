"""One training loop for PPO and the whole GRPO family: rollout -> experience preparation ->
update, with every algorithm part chosen by an :class:`~rlm_course.rl.algorithms.RLConfig`.

One iteration (:meth:`RLTrainer.step`):

1. **generation** (rollout): ``prompts_per_step`` problems, ``group_size`` samples each, from the
   current policy with a KV cache; with DAPO's dynamic sampling, more rounds until enough groups
   carry signal;
2. experience preparation: **reward** (the task's verifier, plus DAPO's overlong penalty) and
   **scoring**: log-probs under the policy that sampled the batch (``pi_old``, when it is needed),
   under the frozen reference (when a KL term is on), the critic's values (PPO); then the
   advantages (group, leave-one-out, REINFORCE++ or GAE), with the KL in the reward if chosen;
3. **training**: ``ppo_epochs`` passes over the batch in ``minibatches`` gradient steps on the
   clipped objective (token or sequence ratio, symmetric or decoupled clip, one of three
   aggregations), plus the KL loss, the entropy bonus and the critic's clipped value loss if on.

The rollout engine and the trainer are the same module here (``rollout_precision='fp32'``); at
scale they are separate copies and step 4, weight sync, moves the new weights to the rollout engine
(chapter 12). With ``rollout_precision`` bf16 or fp8 the trainer samples from a rounded copy,
synced before every generation round, whose log-probs differ from its own (chapter 13's mismatch);
the scoring pass then measures the difference (``behaviour_kl``, ``weight_max``,
``over_cap_tokens`` in the metrics) and ``correction`` weighs the loss
(:mod:`rlm_course.rl.off_policy`). A batch sampled elsewhere brings its own behaviour log-probs
and token versions (asynchronous RL: chapter 13), and the metrics add its staleness.

Every step is a pure function of ``(seed, step, weights, optimizer state)``: problems and samples
are drawn from generators seeded by ``(seed, step, round)``, so a resumed run repeats an
uninterrupted one exactly on the same machine with the same thread count (another CPU or thread
count adds in another order and rounds differently; see :mod:`rlm_course.numerics`).
"""

from __future__ import annotations

import copy

import torch

from rlm_course.cost.accounting import ActivationMeter, PassCounter, kv_cache_allocated_bytes
from rlm_course.devices import generator_on, module_device
from rlm_course.lm.model import TinyGPT
from rlm_course.lm.precision import rollout_copy, sync_rollout_copy
from rlm_course.lm.sampling import (concat_rollouts, generate, log_prob_dtype, response_log_probs,
                                    select_rollouts)
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.advantages import gae, group_advantages, reinforce_pp_advantages, rloo_advantages
from rlm_course.rl.batch import Batch
from rlm_course.algorithms import GROUP_ADVANTAGES, RLConfig
from rlm_course.rl.critic import Critic, clipped_value_loss
from rlm_course.rl.evaluate import evaluate
from rlm_course.rl.kl import KL_CLAMP, kl_estimate
from rlm_course.rl.losses import aggregate_loss, policy_loss
from rlm_course.rl.masked import masked_mean, masked_whiten
from rlm_course.rl.off_policy import behaviour_weights, mismatch_stats
from rlm_course.rl.rewards import groups_with_signal, overlong_penalty
from rlm_course.tasks.base import Problem, Task
from rlm_course.utils import StageTimer, derived_seed
from rlm_course.vocabulary import STAGES


class RLTrainer:
    """Holds the policy, and the critic, reference and optimizers its configuration needs;
    :meth:`step` runs one iteration.

    Args:
        policy: the model to train (the SFT warm start), modified in place.
        config: the algorithm (see :mod:`rlm_course.rl.algorithms`).
        eval_problems: held-out problems, never sampled for training.
        reference: the frozen reference (default: a copy of ``policy``), held only with a KL term.
    """

    def __init__(self, policy: TinyGPT, task: Task, tokenizer: CharTokenizer, config: RLConfig,
                 eval_problems: list[Problem], reference: TinyGPT | None = None) -> None:
        self.policy, self.task, self.tokenizer, self.config = policy, task, tokenizer, config
        #: Where every tensor of a step is made: the policy's device (see rlm_course.devices).
        self.device = module_device(policy)
        self.reference = None
        if config.uses_reference:
            self.reference = reference if reference is not None else copy.deepcopy(policy)
            self.reference.requires_grad_(False).eval()
        self.critic = self.critic_optimizer = None
        if config.use_critic:
            self.critic = Critic(policy)
            self.critic_optimizer = torch.optim.AdamW(self.critic.trainable_parameters(),
                                                      lr=config.critic_lr, weight_decay=0.0)
        self.optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr, weight_decay=0.0)
        self.eval_problems = eval_problems
        self.exclude = {p.prompt for p in eval_problems}
        self.timer = StageTimer()
        self.step_count = 0
        self.passes = PassCounter({"policy": policy, "reference": self.reference,
                                   "critic": self.critic.trunk if self.critic else None},
                                  lambda: self.timer.current)
        self.activations = ActivationMeter()
        self.activations.exclude(policy, self.critic)
        self.responses = {"generated": 0, "trained": 0}
        self.peak_kv_cache_bytes = 0
        #: The rollout engine's copy of the policy (None: the policy itself samples).
        self.engine = None

    @property
    def max_new_tokens(self) -> int:
        """Generation budget: the task's longest valid response plus DAPO's overlong buffer."""
        return self.task.max_response_len + self.config.overlong_buffer

    def evaluate(self) -> float:
        return evaluate(self.policy, self.task, self.eval_problems, self.tokenizer).accuracy

    def state_dict(self) -> dict:
        state = {"optimizer": self.optimizer.state_dict(), "step": self.step_count,
                 "reference": self.reference.state_dict() if self.reference is not None else None,
                 "passes": self.passes.state_dict(), "responses": dict(self.responses),
                 "peak_activation_bytes": self.activations.peak_bytes,
                 "peak_kv_cache_bytes": self.peak_kv_cache_bytes}
        if self.critic is not None:
            state.update(critic=self.critic.state_dict(),
                         critic_optimizer=self.critic_optimizer.state_dict())
        return state

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.step_count = state["step"]
        if self.reference is not None and state.get("reference") is not None:
            self.reference.load_state_dict(state["reference"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        if "passes" in state:
            self.passes.load_state_dict(state["passes"])
            self.responses = dict(state["responses"])
            self.activations.peak_bytes = state["peak_activation_bytes"]
            self.peak_kv_cache_bytes = state["peak_kv_cache_bytes"]

    def lr_schedule(self, optimizer: torch.optim.Optimizer, step: int, base_lr: float) -> None:
        """Set ``optimizer``'s learning rate for ``step``: the schedule of
        :meth:`RLConfig.lr_at`, scaled to ``base_lr`` (e.g. the critic's)."""
        for param_group in optimizer.param_groups:
            param_group["lr"] = self.config.lr_at(step) * (base_lr / self.config.lr)

    # ------------------------------------------------------------------ rollout and reward
    def rollout_engine(self) -> TinyGPT:
        """The model that samples: the policy itself, or (``rollout_precision`` bf16 or fp8) the
        engine's rounded copy, loaded with the policy's current weights (its weight sync)."""
        precision = self.config.rollout_precision
        if precision == "fp32":
            return self.policy
        if self.engine is None:
            self.engine = rollout_copy(self.policy, precision)
        else:
            sync_rollout_copy(self.policy, self.engine, precision)
        return self.engine

    def rollout_and_reward(self, step: int, round_: int = 0):
        """Stages 1 and 2a of iteration ``step`` (generation round ``round_``): sample the group
        responses and score them with the verifier (and the overlong penalty).

        Returns:
            ``(problems, rollout, verdicts, rewards)``: the ``prompts_per_step * group_size``
            problems (groups contiguous), the :class:`Rollout`, the verifier's verdicts and the
            ``(batch,)`` reward tensor.
        """
        cfg, tok, timer = self.config, self.tokenizer, self.timer
        extra = (round_,) if round_ else ()  # round 0 keeps the seeds of a plain GRPO step
        problems = self.task.problems(cfg.prompts_per_step, derived_seed(cfg.seed, step, 1, *extra),
                                      self.exclude)
        group = [p for p in problems for _ in range(cfg.group_size)]  # groups contiguous
        with timer("generation"):
            tokens, mask = tok.encode_prompts([p.prompt for p in group], self.device)
            generator = generator_on(self.device, derived_seed(cfg.seed, step, 2, *extra))
            rollout = generate(self.rollout_engine(), tokens, mask, self.max_new_tokens, tok.eos_id,
                               tok.pad_id, temperature=cfg.temperature, generator=generator)
        self.peak_kv_cache_bytes = max(self.peak_kv_cache_bytes, kv_cache_allocated_bytes(
            self.policy.config, len(group), tokens.shape[1] + self.max_new_tokens))
        with timer("reward"):
            verdicts = [self.task.verify(p, tok.decode_response(r))
                        for p, r in zip(group, rollout.responses)]
            rewards = torch.tensor([v.reward for v in verdicts], device=self.device)
            if cfg.overlong_buffer:
                rewards = rewards + overlong_penalty(rollout.response_lengths(),
                                                     self.max_new_tokens, cfg.overlong_buffer)
        return group, rollout, verdicts, rewards

    def collect(self, step: int) -> Batch:
        """Rollout and reward of iteration ``step``, with DAPO's dynamic sampling when on: keep
        only groups with some correct and some wrong answers (DAPO, eq. 11; not every group whose
        shaped rewards differ) and sample further rounds (new prompts) until
        ``prompts_per_step`` groups are kept or ``max_sampling_rounds`` rounds have run; the
        batch is then cut to ``prompts_per_step`` groups (it may be smaller, even empty).

        Returns:
            a :class:`~rlm_course.rl.batch.Batch`: the responses to train on, and every generated
            response's verdict, reward and length (for the metrics).
        """
        cfg = self.config
        kept, seen = [], {"verdicts": [], "rewards": [], "lengths": []}
        n_groups, rounds = 0, 0
        for round_ in range(cfg.max_sampling_rounds if cfg.dynamic_sampling else 1):
            _, rollout, verdicts, rewards = self.rollout_and_reward(step, round_)
            rounds += 1
            seen["verdicts"] += verdicts
            seen["rewards"].append(rewards)
            seen["lengths"].append(rollout.response_lengths())
            if not cfg.dynamic_sampling:
                kept.append((rollout, verdicts, rewards))
                break
            # DAPO's filter (arXiv:2503.14476, eq. 11: 0 < #correct < G) is on the answers'
            # accuracy, not on the shaped reward: an all-wrong group whose lengths or formats
            # differ has unequal rewards, yet nothing right to learn from (verl's DAPO recipe
            # filters on "acc" for this reason)
            correct = torch.tensor([float(v.correct) for v in verdicts], device=rewards.device)
            signal = groups_with_signal(correct, cfg.group_size)
            take = signal.nonzero().squeeze(1)[:cfg.prompts_per_step - n_groups]
            rows = (take[:, None] * cfg.group_size
                    + torch.arange(cfg.group_size, device=take.device)).reshape(-1)
            if len(rows):
                kept.append((select_rollouts(rollout, rows), [verdicts[i] for i in rows.tolist()],
                             rewards[rows]))
                n_groups += len(take)
            if n_groups >= cfg.prompts_per_step:
                break
        self.responses["generated"] += sum(len(r) for r in seen["rewards"])
        all_rewards, lengths = torch.cat(seen["rewards"]), torch.cat(seen["lengths"])
        if not kept:
            return Batch.empty_of(all_rewards, seen["verdicts"], lengths, rounds)
        return Batch(concat_rollouts([k[0] for k in kept], self.tokenizer.pad_id),
                     torch.cat([k[2] for k in kept]), [v for k in kept for v in k[1]],
                     all_rewards, seen["verdicts"], lengths, rounds)

    # ------------------------------------------------------------------ advantages
    def advantages(self, rewards: torch.Tensor, response_mask: torch.Tensor,
                   kl: torch.Tensor | None, values: torch.Tensor | None):
        """Advantages of the batch, with the KL in the reward when ``kl_mode='reward'``.

        Args:
            rewards: ``(batch,)`` sequence rewards; response_mask: ``(batch, R)``.
            kl: ``(batch, R)`` per-token KL estimate of ``pi_old`` to ``pi_ref`` (None: no KL).
            values: ``(batch, R)`` critic values (GAE only).

        Returns:
            ``(advantages, returns)``: ``(batch,)`` for group/rloo or ``(batch, R)`` for
            reinforce_pp/gae; ``returns (batch, R)`` for the critic (None without one).
        """
        cfg = self.config
        penalty = kl is not None and cfg.kl_mode == "reward"
        if cfg.advantage in GROUP_ADVANTAGES:
            if penalty:  # KL folded into the sequence reward (RLOO, Ahmadian et al. 2024, eq. 3)
                rewards = rewards - cfg.kl_coef * (kl * response_mask).sum(1)
            if cfg.advantage == "group":
                return group_advantages(rewards, cfg.group_size, cfg.normalize_std), None
            return rloo_advantages(rewards, cfg.group_size), None
        # per-token rewards: -beta * KL on every token, the verifier's reward on the last one
        token_rewards = (-cfg.kl_coef * kl * response_mask if penalty else
                         torch.zeros(response_mask.shape, dtype=rewards.dtype,
                                     device=response_mask.device))
        last = response_mask.sum(1) - 1
        token_rewards[torch.arange(len(last), device=last.device), last] += rewards
        if cfg.advantage == "reinforce_pp":
            return reinforce_pp_advantages(token_rewards, response_mask, cfg.gamma), None
        advantages, returns = gae(token_rewards, values, response_mask, cfg.gamma, cfg.lam)
        return masked_whiten(advantages, response_mask), returns

    # ------------------------------------------------------------------ one iteration
    def step(self, batch: Batch | None = None) -> dict:
        """Run one iteration and return its metrics (see the module docstring).

        ``batch``: a batch in the format of :meth:`collect`, collected elsewhere (a rollout
        worker of another process: chapters 12-13); None collects it here."""
        cfg, timer = self.config, self.timer
        self.step_count += 1
        step = self.step_count
        if batch is None:
            batch = self.collect(step)
        else:
            self.responses["generated"] += batch.generated
        rollout, rewards = batch.rollout, batch.rewards
        stats = {"policy_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "entropy": 0.0,
                 "grad_norm": 0.0}
        if self.critic is not None:
            stats["value_loss"] = 0.0
        n_updates = 0
        kl_reward = None
        off_policy = {}
        if rollout is not None:
            self.responses["trained"] += len(rewards)
            tokens, attn, plen = rollout.tokens, rollout.attention_mask, rollout.prompt_len
            rmask = rollout.response_mask
            with timer("scoring"), torch.no_grad():
                old_log_probs = ref_log_probs = values = None
                passes = cfg.scoring_passes()
                if "policy" in passes:
                    old_log_probs = response_log_probs(self.policy, tokens, attn, plen,
                                                       temperature=cfg.temperature)
                if "reference" in passes:
                    ref_log_probs = response_log_probs(self.reference, tokens, attn, plen,
                                                       temperature=cfg.temperature)
                if "critic" in passes:
                    values = self.critic(tokens, attn, plen)
                if cfg.kl_mode == "reward" and ref_log_probs is not None:
                    kl_reward = kl_estimate(old_log_probs, ref_log_probs, cfg.kl_estimator)
                # in the log-probs' precision: a float64 run is float64 throughout (float32
                # advantages differ by a rounding between devices and orders of a group)
                rewards = rewards.to(log_prob_dtype(next(self.policy.parameters()).dtype))
                advantages, returns = self.advantages(rewards, rmask, kl_reward, values)
                weights = None
                if old_log_probs is not None:
                    behaviour = (batch.behaviour_log_probs if batch.behaviour_log_probs is not None
                                 else rollout.log_probs)
                    off_policy = mismatch_stats(old_log_probs, behaviour, rmask,
                                                cfg.correction_cap)
                    if cfg.correction != "none":
                        weights, corrected = behaviour_weights(old_log_probs, behaviour, rmask,
                                                               cfg.correction, cfg.correction_cap)
                        off_policy["corrected_tokens"] = masked_mean(corrected.float(),
                                                                     rmask).item()
                if batch.versions is not None:
                    off_policy.update(staleness_metrics(batch.versions, step))

            with timer("training"):
                n_updates = self._train(step, rollout, old_log_probs, ref_log_probs, values,
                                        advantages, returns, stats, weights)

        seconds = timer.reset()
        metrics = self.rollout_metrics(step, batch, seconds)
        metrics["lr"] = cfg.lr_at(step)  # the policy's learning rate of this step's updates
        metrics.update({k: v / max(n_updates, 1) for k, v in stats.items()})
        metrics.update(off_policy)
        if kl_reward is not None:
            metrics["kl"] = masked_mean(kl_reward, rollout.response_mask).item()
        if cfg.advantage in GROUP_ADVANTAGES:
            metrics["groups_with_signal"] = int(groups_with_signal(
                batch.all_rewards[:cfg.prompts_per_step * cfg.group_size],
                cfg.group_size).sum())
        if step % cfg.eval_every == 0:
            metrics["accuracy_eval"] = self.evaluate()
        return metrics

    def _train(self, step, rollout, old_log_probs, ref_log_probs, values, advantages, returns,
               stats, weights=None) -> int:
        """Stage 3: the gradient steps; adds each step's diagnostics to ``stats``. ``weights``:
        ``(batch, R)`` the off-policy correction's per-token weights (None: all ones)."""
        cfg = self.config
        tokens, attn, plen, rmask = (rollout.tokens, rollout.attention_mask, rollout.prompt_len,
                                     rollout.response_mask)
        budget = self.max_new_tokens  # Dr. GRPO's constant length
        self.policy.train()
        self.lr_schedule(self.optimizer, step, cfg.lr)
        if self.critic is not None:
            self.lr_schedule(self.critic_optimizer, step, cfg.critic_lr)
        n_updates = 0
        for epoch in range(cfg.ppo_epochs):
            # the mini-batch order is drawn on the CPU on every device (the same order as a
            # CPU run), then moved to the batch
            order = torch.randperm(len(tokens), generator=torch.Generator().manual_seed(
                derived_seed(cfg.seed, step, 3, epoch)), device="cpu").to(tokens.device)
            for idx in order.tensor_split(cfg.minibatches):
                if len(idx) == 0:
                    continue
                mask = rmask[idx]
                with self.activations.track():
                    log_probs, entropy = response_log_probs(self.policy, tokens[idx], attn[idx],
                                                            plen, with_entropy=True,
                                                            temperature=cfg.temperature)
                    old = old_log_probs[idx] if old_log_probs is not None else log_probs.detach()
                    loss, clipped = policy_loss(log_probs, old, advantages[idx], mask,
                                                cfg.ratio_level, cfg.clip_eps, cfg.clip_high,
                                                cfg.loss_agg, budget,
                                                None if weights is None else weights[idx],
                                                cfg.dual_clip)
                    stats["policy_loss"] += loss.item()
                    if cfg.kl_mode == "loss" and ref_log_probs is not None:
                        kl = aggregate_loss(kl_estimate(log_probs, ref_log_probs[idx],
                                                        cfg.kl_estimator).clamp(-KL_CLAMP, KL_CLAMP),
                                            mask, cfg.loss_agg, budget)
                        loss = loss + cfg.kl_coef * kl
                        stats["kl"] += kl.item()
                    if cfg.entropy_coef:
                        loss = loss - cfg.entropy_coef * aggregate_loss(entropy, mask, cfg.loss_agg,
                                                                        budget)
                    if self.critic is not None:
                        new_values = self.critic(tokens[idx], attn[idx], plen)
                        value_loss = clipped_value_loss(new_values, values[idx], returns[idx], mask,
                                                        cfg.value_clip)
                        loss = loss + cfg.value_coef * value_loss
                        stats["value_loss"] += value_loss.item()
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"{cfg.variant} loss is {loss.item()} at step {step}: training diverged; "
                        "lower --lr (the default is 3e-4) or raise --kl-coef.")
                self.optimizer.zero_grad(set_to_none=True)
                if self.critic is not None:
                    self.critic_optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(),
                                                           cfg.max_grad_norm)
                critic_norm = (torch.nn.utils.clip_grad_norm_(self.critic.trainable_parameters(),
                                                              cfg.max_grad_norm)
                               if self.critic is not None else None)
                if not (torch.isfinite(grad_norm)
                        and (critic_norm is None or torch.isfinite(critic_norm))):
                    # clipping an inf norm scales every gradient by 0 or NaN: refuse the update
                    terms = f"--kl-coef {cfg.kl_coef:g}, --entropy-coef {cfg.entropy_coef:g}" + (
                        f", --value-coef {cfg.value_coef:g}" if self.critic is not None else "")
                    raise FloatingPointError(
                        f"{cfg.variant} gradient norm is {float(grad_norm)}"
                        + (f" (critic {float(critic_norm)})" if self.critic is not None else "")
                        + f" at step {step} although the loss is finite: a "
                        f"loss term is too large for float32 ({terms}); the update was not "
                        "applied; lower the coefficient that is far above its usual value.")
                self.optimizer.step()
                if self.critic is not None:
                    self.critic_optimizer.step()
                stats["clip_fraction"] += masked_mean(clipped.float(), mask).item()
                stats["entropy"] += masked_mean(entropy.detach(), mask).item()
                stats["grad_norm"] += float(grad_norm)
                n_updates += 1
        self.policy.eval()
        return n_updates

    def rollout_metrics(self, step: int, batch: Batch, seconds: dict) -> dict:
        """Metrics over every generated response (one row of ``metrics.jsonl``)."""
        verdicts, rewards, lengths = batch.all_verdicts, batch.all_rewards, batch.lengths
        return {
            "step": step,
            "reward_mean": rewards.mean().item(),
            "accuracy_train": sum(v.correct for v in verdicts) / len(verdicts),
            "format_rate": sum(v.format_ok for v in verdicts) / len(verdicts),
            "response_length": lengths.float().mean().item(),
            "tokens_generated": int(lengths.sum()),
            "responses_generated": len(verdicts),
            "responses_trained": batch.trained,
            "sampling_rounds": batch.rounds,
            "prompt_columns": batch.rollout.prompt_len if batch.rollout is not None else 0,
            "response_columns": (batch.rollout.response_mask.shape[1]
                                 if batch.rollout is not None else 0),
            **{f"seconds_{s}": seconds.get(s, 0.0) for s in STAGES},
        }


def staleness_metrics(versions: torch.Tensor, step: int) -> dict:
    """How stale the responses of a batch trained at iteration ``step`` are (``(step - 1) - v``,
    ``v`` the version that sampled a token; see :mod:`rlm_course.systems.async_rl`), per response
    by the version that started it (its first token, the oldest; with partial rollouts its later
    tokens are newer): ``staleness_max`` and ``staleness_mean``; ``staleness_token_mean`` over
    every response token. ``versions``: ``(batch, R)``, -1 on padding."""
    real = versions >= 0
    rows = real.any(1)
    if not rows.any():
        return {"staleness_max": 0, "staleness_mean": 0.0, "staleness_token_mean": 0.0}
    head = (step - 1) - versions[rows, 0]
    tokens = (step - 1) - versions[real]
    return {"staleness_max": int(head.max()), "staleness_mean": head.float().mean().item(),
            "staleness_token_mean": tokens.float().mean().item()}
