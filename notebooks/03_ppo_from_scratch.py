# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · PPO from scratch
#
# GRPO (chapter 02) judges a response against the other responses to the same prompt. PPO, as
# used for InstructGPT (Ouyang et al. 2022, arXiv:2203.02155), judges **every token** against a
# learned critic `V(s_t)`: the expected return from "prompt plus the first t response tokens"
# (the final reward, minus the KL penalties still to come when the KL is in the reward). One iteration:
#
# 1. **generation**: one response per prompt (no group needed);
# 2. **scoring**: three forward passes: the policy (`log pi_old`), the frozen reference
#    (`log pi_ref`) and the critic (`V(s_t)`);
# 3. **per-token reward** with the KL inside it, then **GAE** advantages:
#
# $$
# r_t = -\beta \log\frac{\pi_{\mathrm{old}}(o_t)}{\pi_{\mathrm{ref}}(o_t)} + [t = T]\,R,\qquad
# \delta_t = r_t + \gamma V(s_{t+1}) - V(s_t),\qquad
# A_t = \sum_{l \ge 0} (\gamma\lambda)^l\,\delta_{t+l}
# $$
#
# 4. **training**: the clipped policy loss *and* the clipped value loss
#    `1/2 max((V - R_t)^2, (clip(V, V_old ± eps) - R_t)^2)`, with one optimizer per model.
#
# The price: a second trained model (weights, gradients, Adam state) and three more passes per
# sample (a critic forward when scoring, a critic forward and backward when training). This notebook builds the pieces, trains PPO next to GRPO, and measures what each costs.
#
# **Learning objectives.** After this chapter you can:
#
# 1. build a critic from the policy and put the KL to the reference into a per-token reward;
# 2. compute GAE advantages and say what `lambda` trades between bias and variance;
# 3. train PPO and GRPO side by side on the same number of responses;
# 4. count the models held and the passes per response of each, predicted and measured.

# %%
# NBVAL_IGNORE_OUTPUT
import matplotlib.pyplot as plt
import torch

from rlm_course.utils import seed_everything

seed_everything(0)
print(torch.__version__)

# %% [markdown]
# ## 1. The critic
#
# A transformer as large as the policy with a scalar head instead of the language-model head
# (`rlm_course/rl/critic.py`). We copy the SFT policy's trunk and start the value head at zero, so
# the first values are all 0: the first advantages come from the rewards alone
# (`A_t = (gamma lambda)^(T-t) R` for a terminal reward `R`, then whitened over the batch).

# %%
from rlm_course.lm.sampling import generate, response_log_probs
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.critic import Critic
from rlm_course.rl.runs import load_sft_policy
from rlm_course.tasks import get_task

tok, task = CharTokenizer(), get_task("addition", digits=3)
policy, _ = load_sft_policy(task, tok)
critic = Critic(policy)
print(f"policy parameters {policy.num_parameters():,}; "
      f"critic trainable parameters {sum(p.numel() for p in critic.trainable_parameters()):,}")

problems = task.problems(4, seed=3)
tokens, mask = tok.encode_prompts([p.prompt for p in problems])
rollout = generate(policy, tokens, mask, task.max_response_len, tok.eos_id,
                   generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    values = critic(rollout.tokens, rollout.attention_mask, rollout.prompt_len)
print("values:", values.shape, "all zero:", bool((values == 0).all()))

# %% [markdown]
# ## 2. The per-token reward
#
# The verifier scores the whole response, so its reward sits on the **last** token; every token
# also pays `-beta * k1`, the log-ratio of the policy that sampled it to the reference. (Here the
# policy *is* the reference, so the KL part is 0; it grows as training moves the policy.)

# %%
from rlm_course.rl.kl import kl_estimate

beta = 0.005
rewards = torch.tensor([task.verify(p, tok.decode_response(r)).reward
                        for p, r in zip(problems, rollout.responses)])
with torch.no_grad():
    logp_old = response_log_probs(policy, rollout.tokens, rollout.attention_mask, rollout.prompt_len)
    logp_ref = response_log_probs(policy, rollout.tokens, rollout.attention_mask, rollout.prompt_len)
rmask = rollout.response_mask
token_rewards = -beta * kl_estimate(logp_old, logp_ref, "k1") * rmask
last = rmask.sum(1) - 1
token_rewards[torch.arange(len(last)), last] += rewards
for p, r, row, m in zip(problems, rollout.responses, token_rewards, rmask):
    print(f"{p.prompt:<9} {tok.decode(r):<6} per-token rewards {[round(x, 2) for x in row[m].tolist()]}")

# %% [markdown]
# ## 3. GAE: one knob between bias and variance
#
# `lambda = 0` gives the one-step TD error `r_t + gamma V(s_{t+1}) - V(s_t)`: low variance, but
# only as right as the critic. `lambda = 1` gives the Monte Carlo return minus `V(s_t)`: unbiased,
# but noisy. LLM practice takes `gamma = 1, lambda = 0.95`. `gae` runs the reverse scan
# `A_t = delta_t + gamma lambda A_{t+1}` (an exercise, `ex03`); below, a 6-token response with
# reward 1 at the end and a critic that has learned a ramp of values.

# %%
from rlm_course.rl.advantages import gae

T = 6
reward_row = torch.zeros(1, T); reward_row[0, -1] = 1.0
value_row = torch.linspace(0.3, 0.8, T)[None]
full = torch.ones(1, T, dtype=torch.bool)
plt.figure(figsize=(6, 3))
for lam in (0.0, 0.5, 0.95, 1.0):
    adv, _ = gae(reward_row, value_row, full, gamma=1.0, lam=lam)
    plt.plot(range(T), adv[0], "o-", label=f"lambda = {lam}")
plt.xlabel("response token t"); plt.ylabel("advantage A_t"); plt.legend(fontsize=8)
plt.title("GAE of one response (gamma = 1)");

adv_mc, _ = gae(reward_row, value_row, full, gamma=1.0, lam=1.0)
assert torch.allclose(adv_mc, 1.0 - value_row)  # lambda = 1: return (1) minus V(s_t)

# %% [markdown]
# ## 4. Train PPO and GRPO side by side
#
# Both see 512 responses per step: PPO as 512 prompts x 1 sample, GRPO as 64 prompts x 8. Both
# use the same loop, `RLTrainer`; the configuration picks the parts (`PPOConfig` is the `ppo`
# preset of chapter 04). 60 steps each take about two minutes here; the full jobs are
# `python -m rlm_course ppo --task addition` and `python -m rlm_course grpo --task addition`.

# %%
import time

from tqdm.auto import tqdm

from rlm_course.rl.algorithms import GRPOConfig, PPOConfig
from rlm_course.rl.evaluate import evaluate
from rlm_course.rl.trainer import RLTrainer
from rlm_course.tasks.eval_sets import load_eval_set
from rlm_course.tools.plots import plot_eval_curves

held_out = load_eval_set(task)
STEPS = 60
trainers, curves, walls, history = {}, {}, {}, {}
for name, config in (("PPO", PPOConfig(steps=STEPS, eval_every=20)),
                     ("GRPO", GRPOConfig(steps=STEPS, eval_every=20))):
    model, _ = load_sft_policy(task, tok)  # a fresh copy of the warm start for each
    before = evaluate(model, task, held_out, tok).accuracy
    trainer = RLTrainer(model, task, tok, config, held_out)
    start = time.perf_counter()
    history[name] = [trainer.step() for _ in tqdm(range(STEPS), desc=name)]
    walls[name] = time.perf_counter() - start
    trainers[name] = trainer
    curves[name] = [[(0, before)] + [(m["step"], m["accuracy_eval"]) for m in history[name]
                                     if "accuracy_eval" in m]]
    print(f"{name}: held-out accuracy {before:.1%} -> {curves[name][0][-1][1]:.1%} "
          f"in {walls[name]:.0f} s")
plot_eval_curves(curves, title="held-out greedy accuracy, addition-3");
assert curves["PPO"][0][-1][1] > curves["PPO"][0][0][1] + 0.05, "PPO should improve accuracy"

# %% [markdown]
# ## 5. What each one cost
#
# Every trainer counts, with hooks on its models, the sequences each forward and backward pass
# processed, and measures the bytes of its model states and of the activations autograd saved.
# `predict_passes` derives the same counts from the configuration alone; the two must agree.

# %%
from rlm_course.cost.accounting import cost_row, predict_passes
from rlm_course.rl.runs import cost_summary
from rlm_course.tools.plots import plot_stage_seconds
from rlm_course.utils import format_table

table = []
for name, trainer in trainers.items():
    cost = cost_summary(trainer, walls[name])
    assert cost["passes_per_response"] == predict_passes(trainer.config), name
    row = cost_row(cost)
    table.append([name, row["trained"], row["frozen"], row["forward"], row["backward"],
                 row["model_states_mb"], row["activations_mb"], row["seconds_per_step"]])
    print(f"{name} models: {cost['models']}")
print(format_table(table, ["algorithm", "trained", "frozen", "fwd/resp", "bwd/resp",
                          "model states MB", "activations MB", "s/step"]))

# %% [markdown]
# Where the seconds went, per step: PPO's scoring runs three forwards instead of two, and its
# training runs two forward+backward passes (policy and critic) instead of one.

# %%
# NBVAL_IGNORE_OUTPUT
per_step = {name: {stage: sum(m[f"seconds_{stage}"] for m in rows) / len(rows)
                   for stage in ("generation", "reward", "scoring", "training")}
            for name, rows in history.items()}
plot_stage_seconds(per_step, title="seconds per step, by stage (this machine)");
for name, seconds in per_step.items():
    print(name, {k: round(v, 3) for k, v in seconds.items()})

# %% [markdown]
# ## Questions
#
# * PPO needs no group: it could train on 1 sample per prompt. What does it pay instead, in
#   models held and passes per sample? Which of those costs grows with the model size, and which
#   with the response length?
# * Set `lam=1.0` (Monte Carlo returns) or `lam=0.0` (one-step TD) in `PPOConfig` and compare the
#   curves. Why does a freshly initialised critic make `lam=0` a bad start?
# * The critic here is a copy of the policy. InstructGPT initialises it from the reward model;
#   VAPO (arXiv:2504.05118) pre-trains it on Monte Carlo returns before RL. What would each change?
#
# <details><summary>Answers</summary>
#
# * PPO holds a second trained model, the critic: its weights, gradients and Adam moments (the
#   `model states MB` column: the critic's add about as much again as the policy's), and it runs
#   one more forward per response in scoring (the critic's values) and one more forward and
#   backward in training (the `fwd/resp` and `bwd/resp` columns). Model states grow with the model size (16 bytes per parameter in
#   mixed precision); the passes' FLOPs and the activations grow with the number of tokens, so
#   with the response length. GRPO pays instead in generation: `G` responses per prompt.
# * With `lambda = 1` the advantage is the return minus `V(s_t)`: unbiased whatever the critic,
#   but noisy. With `lambda = 0` it is the one-step TD error `r_t + gamma V(s_{t+1}) - V(s_t)`,
#   only as good as the critic: a fresh critic's values are all 0 here, so every token but the
#   last gets just its KL penalty as advantage, and the verifier's reward reaches only the last
#   token. Credit flows back one token per update of the critic, so learning starts slowly.
# * Initialising the critic from the reward model gives it, from the first step, a head that
#   already scores responses (it predicts the reward of a finished response, a good start for the
#   value of a partial one); pre-training it on Monte Carlo returns of the SFT policy, as VAPO
#   does, gives values fitted to the very quantity GAE needs before RL starts, so the first
#   advantages are less biased. Both cost compute before or outside RL (a reward model to train,
#   or a pre-training phase); neither changes the per-iteration cost.
#
# </details>
#
# > **Key numbers and takeaways**
# >
# > * PPO holds policy, critic (both trained) and reference (frozen); GRPO holds policy and
# >   reference, and drops the reference with `kl_coef = 0`.
# > * Per response, PPO's scoring runs three forwards (old policy, reference, critic) and its
# >   training two forward-backward pairs; measured passes equal `predict_passes` (asserted).
# > * GAE with `gamma = 1, lambda = 1` is the return minus the value (asserted above); `lambda`
# >   trades the critic's bias against the return's variance.
#
# ## Further reading
#
# * Schulman et al. 2017, PPO (arXiv:1707.06347); Schulman et al. 2016, GAE (arXiv:1506.02438);
#   Ouyang et al. 2022, InstructGPT (arXiv:2203.02155).
# * OpenAI Spinning Up, PPO; https://spinningup.openai.com/en/latest/algorithms/ppo.html
# * Stanford CS336, assignment 5 (alignment); https://github.com/stanford-cs336
#
# ## Exercise
#
# Write `gae` in `exercises/ex03_ppo.py` and check it with `exercises/ex03_ppo.ipynb` or
# `python -m rlm_course grade 03`.
