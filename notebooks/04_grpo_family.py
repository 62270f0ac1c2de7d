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
# # 04 · The GRPO family
#
# Since GRPO, a family of critic-free algorithms has appeared: Dr. GRPO, DAPO, RLOO, REINFORCE++,
# GSPO, ... Each one changes **one or two parts** of the same loop, and each change moves the
# cost: more generation (DAPO's dynamic sampling), one model and one forward pass fewer (no KL
# term, so no reference model), a critic more (PPO), a different response count per prompt.
#
# | part | options |
# |---|---|
# | advantage | group with std (GRPO), group without std (Dr. GRPO), leave-one-out (RLOO), per-token return normalised over the batch (REINFORCE++), GAE with a critic (PPO) |
# | ratio | per token (PPO, GRPO), per sequence, length-normalised (GSPO) |
# | clipping | symmetric `eps`, or decoupled `eps_low < eps_high` (DAPO clip-higher) |
# | aggregation | seq-mean-token-mean (GRPO), token-mean (DAPO), constant-normalised sum (Dr. GRPO) |
# | KL | none, as a loss, in the reward; estimators k1, k2, k3 |
# | sampling and shaping | dynamic sampling, overlong penalty (DAPO) |
#
# In `rlm_course` an algorithm is an `RLConfig`, one option per part, and one loop (`RLTrainer`)
# runs every combination. The presets are the published ones:
#
# **Learning objectives.** After this chapter you can:
#
# 1. name the part (advantage, ratio, clipping, aggregation, KL, sampling) that each member of the
#    family changes, and show its effect on a hand example;
# 2. predict what each change costs: models held, passes per response, responses generated;
# 3. read a small experiment for what it can and cannot say;
# 4. estimate generation's share of the FLOPs of each algorithm for a large model.

# %%
# NBVAL_IGNORE_OUTPUT
import json

import matplotlib.pyplot as plt
import torch

from rlm_course.utils import seed_everything

seed_everything(0)
print(torch.__version__)

# %%
from rlm_course.rl.algorithms import PRESETS, preset
from rlm_course.utils import format_table

rows = []
for name in PRESETS:
    c = preset(name)
    rows.append([name, c.advantage + ("" if c.normalize_std or c.advantage != "group" else ", no std"),
                 c.ratio_level, f"{c.clip_eps:g}/{c.clip_high:g}", c.loss_agg,
                 "-" if c.kl_mode == "none" else f"{c.kl_estimator} in {c.kl_mode}",
                 "yes" if c.dynamic_sampling else "-", c.overlong_buffer or "-", c.group_size])
print(format_table(rows, ["preset", "advantage", "ratio", "clip", "aggregation", "KL",
                          "dyn. sampling", "overlong", "G"]))

# %% [markdown]
# Each preset is a combination of parts inside the same loop, not a reimplementation of its paper.
# In particular the `rloo` preset is RLOO's leave-one-out **advantage** inside the clipped
# surrogate that every preset shares (ratio, clip, several gradient steps per batch); the paper's
# RLOO (Ahmadian et al. 2024, arXiv:2402.14740) is on-policy REINFORCE: one gradient step per
# batch, no ratio and no clipping.
#
# ## 1. Advantages: who gets credit
#
# Four groups of 4 responses with verifier rewards (1 = correct, 0.1 = right format only). GRPO
# divides by the group's std (DeepSeekMath, section 4.1.2): that **equalises the scale of every
# group**, not its advantages. Whatever the spread of a group's rewards, its squared advantages
# sum to `G - 1` (3 here), so a group that is *almost* all right (group 3) weighs as much in the
# gradient as a balanced one (group 1), its one wrong answer getting -1.5; without the division
# (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783) such a group weighs less, in proportion to its
# std. Dr. GRPO calls the equalising a question-difficulty bias and drops it. RLOO's leave-one-out
# advantages equal Dr. GRPO's up to a factor `G/(G-1)`. A group of equal rewards (group 4) gets
# zero advantage under all of them: it costs generation and teaches nothing; DAPO's dynamic
# sampling drops it.

# %%
from rlm_course.rl.advantages import group_advantages, rloo_advantages
from rlm_course.rl.rewards import groups_with_signal

rewards = torch.tensor([1.0, 0.1, 1.0, 0.1,
                        1.0, 0.1, 0.1, 0.1,
                        1.0, 1.0, 1.0, 0.1,
                        0.1, 0.1, 0.1, 0.1])
estimators = {"GRPO": group_advantages(rewards, 4),
              "Dr. GRPO": group_advantages(rewards, 4, normalize_std=False),
              "RLOO": rloo_advantages(rewards, 4)}
for i in range(4):
    print(f"group {i + 1} rewards {rewards.view(4, 4)[i].tolist()}")
    for name, adv in estimators.items():
        print(f"    {name:<9}" + " ".join(f"{x + 0.0:6.2f}" for x in adv.view(4, 4)[i].tolist()))
print("groups with signal:", groups_with_signal(rewards, 4).tolist())
squares = {name: (adv.view(4, 4) ** 2).sum(1) for name, adv in estimators.items()}
print("sum of squared advantages per group:",
      {name: [round(x, 2) for x in sq.tolist()] for name, sq in squares.items()})
assert torch.allclose(estimators["RLOO"], 4 / 3 * estimators["Dr. GRPO"])
# std normalisation: every group with signal has the same scale, sum of A^2 = G - 1 (unbiased std)
assert torch.allclose(squares["GRPO"][:3], torch.full((3,), 3.0), atol=1e-4)

# %% [markdown]
# ## 2. Aggregation: how much each token weighs
#
# Two wrong responses, one of 2 tokens and one of 8, each token with the same loss. GRPO's
# seq-mean-token-mean averages within each response first, so each token of the long response
# weighs 4x less: long wrong answers are punished less per token, and responses drift longer.
# DAPO's token-mean gives every token the same weight; Dr. GRPO's sum over a constant length `L`
# does too, and keeps the scale independent of the batch's lengths.

# %%
from rlm_course.rl.losses import aggregate_loss

mask = torch.zeros(2, 8, dtype=torch.bool)
mask[0, :2] = True
mask[1, :] = True
fig, axes = plt.subplots(1, 3, figsize=(11, 2.6), sharey=True)
for ax, mode in zip(axes, ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm")):
    per_token = torch.ones(2, 8, requires_grad=True)
    aggregate_loss(per_token, mask, mode, constant_length=8).backward()
    weights = per_token.grad
    ax.bar(range(2), weights[0, :2], color="#d95f02", label="2-token response")
    ax.bar(range(2, 10), weights[1], color="#7570b3", label="8-token response")
    ax.set(title=mode, xlabel="token")
    print(f"{mode:<25} weight per token: short {weights[0, 0]:.4f}, long {weights[1, 0]:.4f}")
axes[0].set_ylabel("gradient weight"); axes[0].legend(fontsize=7);

# %% [markdown]
# ## 3. Clipping: clip-higher
#
# With a positive advantage the clipped objective stops rewarding a token once its ratio passes
# `1 + eps`. A token the policy gave probability 0.01 can then only grow to 0.012 per update,
# while a token at 0.9 could grow freely: symmetric clipping favours the tokens that are already
# likely and the entropy collapses. DAPO (Yu et al. 2025, arXiv:2503.14476) raises only the upper
# bound, `eps_high = 0.28`.

# %%
from rlm_course.rl.losses import clipped_objective

ratio = torch.linspace(0.6, 1.5, 181)
plt.figure(figsize=(5, 3))
for low, high in ((0.2, 0.2), (0.2, 0.28)):
    plt.plot(ratio, -clipped_objective(ratio, torch.ones(181), low, high),
             label=f"eps_low {low}, eps_high {high}")
plt.xlabel("ratio r"); plt.ylabel("objective for A = +1"); plt.legend(fontsize=8);

# %% [markdown]
# ## 4. Ratio: per token or per sequence
#
# The reward belongs to the whole response, yet GRPO weighs it by each token's ratio. GSPO (Zheng
# et al. 2025, arXiv:2507.18071) uses one ratio per response, the geometric mean of its token
# ratios `s_i = exp(mean_t log r_t)`, and clips that. One token that moved a lot (ratio 3) is
# clipped alone under the token ratio when its advantage is positive (with a negative advantage
# `min(r A, clip(r) A)` keeps `3 A`, unclipped: the case dual-clip PPO bounds); under the sequence ratio it moves the whole response's
# ratio by `3^(1/T)` and the response is kept or clipped as a unit. Because `s_i` is an average,
# it stays close to 1, and GSPO's clip range is tiny: 3e-4 / 4e-4.

# %%
from rlm_course.rl.losses import sequence_ratio

log_ratio = torch.zeros(1, 6)
log_ratio[0, 2] = torch.log(torch.tensor(3.0))
full = torch.ones(1, 6, dtype=torch.bool)
print("token ratios   ", [round(x, 3) for x in log_ratio.exp()[0].tolist()])
print("sequence ratio ", round(sequence_ratio(log_ratio, torch.zeros(1, 6), full).item(), 3),
      "= 3 ** (1/6) =", round(3 ** (1 / 6), 3))

# %% [markdown]
# ## 5. Dynamic sampling, live
#
# DAPO keeps only groups with some right and some wrong answers (its eq. 11: the filter is on
# accuracy, so an all-wrong group whose overlong penalties differ is dropped too) and samples new
# prompts until the batch is full again. The gradient gets only informative groups; the bill is
# paid in generation. Twenty steps of DAPO on addition (about half a minute):

# %%
from tqdm.auto import tqdm

from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.runs import load_sft_policy
from rlm_course.rl.trainer import RLTrainer
from rlm_course.tasks import get_task
from rlm_course.tasks.eval_sets import load_eval_set

tok, task = CharTokenizer(), get_task("addition", digits=3)
held_out = load_eval_set(task)
policy, _ = load_sft_policy(task, tok)
dapo = RLTrainer(policy, task, tok, preset("dapo", steps=20, eval_every=20), held_out)
dapo_rows = [dapo.step() for _ in tqdm(range(20), desc="DAPO")]
generated = sum(m["responses_generated"] for m in dapo_rows)
trained = sum(m["responses_trained"] for m in dapo_rows)
print(f"generated {generated} responses to train on {trained}: {generated / trained:.2f}x the "
      "generation of GRPO for the same batch")
print("rounds per step:", [m["sampling_rounds"] for m in dapo_rows])
assert generated >= trained and all(m["responses_trained"] <= 512 for m in dapo_rows)

# %% [markdown]
# ## 6. Every preset, three seeds: curves and costs
#
# The longer comparison is a CLI experiment: each preset for 150 steps, seeds 0-2, each run in its
# own process. Its results are stored in `data/experiments/family-addition-3.json`, together with
# the command that made them; rerun it (a little over an hour: the stored runs' processes took 68
# minutes in all, printed below) to reproduce or extend them.

# %%
from rlm_course.utils import data_dir

results = json.loads((data_dir() / "experiments" / "family-addition-3.json").read_text())
print("made by:", results["command"])
stored_minutes = sum(run["process_seconds"] for run in results["runs"]) / 60
print(f"the stored runs took {stored_minutes:.0f} minutes of process time")
assert 45 < stored_minutes < 70
curves = {}
for run in results["runs"]:
    curves.setdefault(run["variant"], []).append(
        [(0, run["accuracy_before"])] + [tuple(p) for p in run["eval_curve"]])

from rlm_course.tools.plots import plot_eval_curves

plot_eval_curves(curves, title=f"held-out greedy accuracy, {results['task']}, mean and range");

# %% [markdown]
# **What these curves can and cannot say.** They come from a 0.8M-parameter model on 3-digit
# addition, 150 steps and 3 seeds per preset. That shows that every preset learns, and what each
# one costs to run; it cannot rank the algorithms. Three seeds give a poor estimate of the spread
# between runs, the presets share hyperparameters tuned for none of them, and nothing here tells
# how an ordering would change with a real model, a hard task or long responses (the published
# comparisons tune each method and run far longer).
#
# The cost of each, from the same runs. `fwd`/`bwd` are passes per response (the generation
# prefill counts per generated response), `gen/train` the responses generated per response
# trained on, `model states` the bytes of weights, gradients and Adam moments, `peak RSS` the
# process's memory high-water mark.

# %%
from statistics import mean

from rlm_course.cost.accounting import cost_row, predict_passes

table = []
for variant in results["variants"]:
    runs = [r for r in results["runs"] if r["variant"] == variant]
    if not runs:  # an experiment stopped early stores the runs it finished
        print(f"{variant}: no stored runs")
        continue
    rows = [cost_row(r["cost"]) for r in runs]
    gains = [100 * (r["accuracy_after"] - r["accuracy_before"]) for r in runs]
    for r in runs:  # the stored measurement agrees with the predictor
        assert r["cost"]["passes_per_response"] == predict_passes(preset(variant)), variant
    table.append([variant, f"{mean(gains):+.1f} ({min(gains):+.0f}..{max(gains):+.0f})",
                  rows[0]["trained"], rows[0]["frozen"], rows[0]["forward"], rows[0]["backward"],
                  round(mean(r["generated_per_trained"] for r in rows), 2),
                  rows[0]["model_states_mb"], rows[0]["activations_mb"],
                  round(mean(r["cost"]["memory_bytes"]["process_peak_rss"] for r in runs) / 2**20),
                  round(mean(r["seconds_per_step"] for r in rows), 2)])
print(format_table(table, ["preset", "gain, points", "trained", "frozen", "fwd", "bwd",
                           "gen/train", "model states MB", "activations MB", "peak RSS MB",
                           "s/step"]))
assert all(r["accuracy_after"] > r["accuracy_before"] for r in results["runs"])

# %% [markdown]
# ## 7. The same bill for a large model
#
# The predictor needs only a model configuration and the workload. For a GPT-style model of
# about 6.6B parameters (32 layers, width 4096), 1,024 responses trained per step, 512-token
# prompts and 4,096-token responses, the FLOPs of one iteration per stage. DAPO generates more
# responses than it trains on: we use the ratio its stored runs measured.

# %%
from rlm_course.cost.accounting import predict_iteration_flops
from rlm_course.lm.model import ModelConfig

big = ModelConfig(vocab_size=32000, n_layer=32, n_head=32, d_model=4096, max_seq_len=8192)
table = []
dapo_ratio = mean(r["cost"]["responses_generated"] / r["cost"]["responses_trained"]
                 for r in results["runs"] if r["variant"] == "dapo")
for variant in PRESETS:
    config = preset(variant)
    generated = round(1024 * (dapo_ratio if config.dynamic_sampling else 1))
    flops = predict_iteration_flops(big, config, generated=generated, trained=1024, prompt_len=512,
                                    response_len=4096)
    table.append([variant] + [f"{flops[s] / 1e15:,.0f}" for s in ("generation", "scoring",
                                                                  "training", "total")]
                 + [f"{flops['generation'] / flops['total']:.0%}"])
print(format_table(table, ["preset", "generation PFLOP", "scoring PFLOP", "training PFLOP",
                           "total PFLOP", "generation share"]))
share = {row[0]: float(row[-1].rstrip("%")) for row in table}
print(f"generation's share of the FLOPs: {min(share.values()):.0f}% ({min(share, key=share.get)}) "
      f"to {max(share.values()):.0f}% ({max(share, key=share.get)})")
assert min(share, key=share.get) == "ppo" and max(share, key=share.get) == "dapo"

# %% [markdown]
# Generation is 9% (PPO, whose critic adds scoring and training FLOPs) to 37% (DAPO, whose
# dynamic sampling generates 2.5 responses per response trained in the stored runs) of the FLOPs
# in this example. Yet in runs that generate long chains of thought, open systems report it
# taking a much larger share of the wall time, up to 70-90% (OpenRLHF: about 80%, up to 90% for
# long CoT; verl's DAPO recipe on 32B: about 70%; but 30-43% in verl's 7B DAPO run on H20s;
# see chapter 05), because decoding reads all the weights for each token and
# cannot be parallelised along the response. That holds for long generations only: a PPO
# breakdown with 128-token prompts and 128-token responses (OpenRLHF, 34B actor and 7B critic on
# 32 GPUs, in github.com/openpsi-project/ReaLHF/issues/10) spent 5.25 s in generation and 51.0 s
# in training. Chapters 05 and 06 measure that and explain it (bytes per FLOP, and work vs depth).
#
# ## Questions
#
# * Dynamic sampling filled the batch with informative groups. How does its generation cost
#   change as the policy gets better at the task (more all-correct groups)?
# * Which presets hold a reference model, and why does dropping the KL remove a whole model from
#   memory and a forward pass from every step?
# * Try `python -m rlm_course grpo --task addition --variant grpo --loss-agg token-mean
#   --clip-eps-high 0.28`: which DAPO parts does it have, and which are missing (count the KL
#   term too)? Which of the missing ones changes the cost, and how?
#
# <details><summary>Answers</summary>
#
# * It grows. As the policy improves, more groups are all correct (and, on hard prompts, some stay
#   all wrong); those groups are dropped and replaced by new prompts, so DAPO generates at least
#   `1 / (1 - p_deg)` responses per response trained, `p_deg` the share of groups with equal
#   rewards (up to `max_sampling_rounds` rounds): at least, because the trainer, like verl's
#   DAPO, generates whole rounds of `prompts_per_step` groups and drops the overshoot
#   (`p_deg = 0.6` takes 3 rounds, a ratio of 3.0, not 2.5). The stored runs measured 2.5 on average over 150
#   steps, more than section 5 measured on its 20 early steps. Each extra round is a whole
#   generation pass, the most expensive stage per FLOP.
# * `ppo`, `grpo`, `rloo` and `reinforce_pp` (a KL term, in the loss or in the reward) hold a
#   frozen reference; `dr_grpo`, `dapo` and `gspo` do not (`-` in the KL column and the frozen
#   column). The KL needs `log pi_ref` of every sampled token, and only the reference model can
#   give it: dropping the KL removes its weights from memory (2 bytes per parameter in bf16) and
#   its forward over every response from each step's scoring (the `fwd` column: 4 against 3).
# * It has clip-higher and the token-mean loss. It misses dynamic sampling, the overlong shaping,
#   and the removal of the KL term (GRPO keeps `k3` in the loss). Dynamic sampling raises
#   generation (the most costly difference); keeping the KL keeps the reference model and its
#   forward pass; the overlong shaping only changes rewards (it lengthens the generation budget by
#   its buffer).
#
# </details>
#
# > **Key numbers and takeaways**
# >
# > * Every member changes one or two parts of the same loop; the costs follow from which models
# >   it holds and how many responses it generates.
# > * Std normalisation makes every group with signal sum to `sum A^2 = G - 1`; Dr. GRPO drops it.
# > * For a 6.6B model with 4,096-token responses, generation is 9% (PPO) to 37% (DAPO) of the
# >   FLOPs; dropping the KL term removes a model and a forward pass.
# > * Long chain-of-thought runs spend a large share of their time generating (30-90% reported,
# >   70-90% in several); short-generation runs can be dominated by training.
# > * A 0.8M model and 3 seeds show that each preset learns and what it costs, not which is best.
#
# ## Further reading
#
# * DeepSeekMath (GRPO, arXiv:2402.03300, section 4.1); Dr. GRPO (arXiv:2503.20783); DAPO
#   (arXiv:2503.14476); RLOO (arXiv:2402.14740); REINFORCE++ (arXiv:2501.03262); GSPO
#   (arXiv:2507.18071).
# * Stanford CS336, assignment 5 (alignment and GRPO): group-normalised rewards, clipped loss,
#   length normalisation; https://github.com/stanford-cs336
#
# ## Exercises
#
# Write the RLOO baseline, the GSPO sequence ratio and the DAPO token-mean in
# `exercises/ex04_grpo_family.py`; check them with `exercises/ex04_grpo_family.ipynb` or
# `python -m rlm_course grade 04`.
