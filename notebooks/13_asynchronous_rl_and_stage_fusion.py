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
# # 13 · Asynchronous RL and stage fusion
#
# Synchronous RL takes turns: generate a batch with the current weights, train on it, sync the
# weights, generate the next. With disaggregated pools (chapter 12) the rollout idles while the
# trainer trains and the other way round; with long-tailed responses every worker also waits for
# the longest one. Two families of fixes:
#
# * **asynchrony**: generate batch `k + 1` while training on batch `k` (one-step off-policy), or
#   run ahead by up to `eta` versions (bounded staleness), even interrupt generation when new
#   weights arrive (partial rollouts); the samples are then *off-policy*, which the **decoupled
#   PPO** objective and its importance weights correct;
# * the same correction for a fault every system has, synchronous or not: the **rollout/trainer
#   mismatch**, an inference engine whose log-probs differ from the trainer's for the same
#   weights;
# * **stage fusion**: score the responses that have finished while the long tail still decodes,
#   moving the stragglers onto fewer workers.
#
# We run both for real, on Ray workers, on a task whose reasoning traces have a long tail.
#
# **Learning objectives.** After this chapter you can:
#
# 1. state the staleness of a sample, derive the rollout gate that bounds it by `eta`, and check
#    it holds on real event orders;
# 2. run synchronous, one-step off-policy, `eta`-bounded and partial-rollout pipelines and read
#    their timelines: who waits for whom;
# 3. write the decoupled PPO loss, say what the behaviour, proximal and current policies are, and
#    choose between no cap, truncation (TIS) and masking (MIS, AReaL's code) knowing the bias
#    and variance of each;
# 4. measure the rollout/trainer mismatch of a bf16 or fp8 engine (log-ratios, KL per token and
#    per response, the share of tokens a cap touches) and what a correction changes in learning;
# 5. measure staleness in KL, not only in versions;
# 6. measure what stage fusion gains on a long tail, and say which published speed-ups a 2-core
#    machine can and cannot reproduce.

# %%
# NBVAL_IGNORE_OUTPUT
import statistics

import matplotlib.pyplot as plt
import torch

from rlm_course.systems.controller import Controller, DeviceMapping, start_ray
from rlm_course.tasks import get_task
from rlm_course.utils import format_table, seed_everything

seed_everything(0)
resources = start_ray()
task = get_task("scratchpad")
print(torch.__version__, resources["CPU"], "CPUs for Ray;", task.key)

# %% [markdown]
# ## 1. A reasoning task with a long tail
#
# Scratchpad addition: the response works the sum column by column, `x+y[+1]=s>p` per column,
# `p` the result so far; the last `p` is the answer. Problem sizes (digits per operand) follow
# `P(n) ~ 0.5^(n-1)`, so most problems are short and a few are long, and the trace grows faster
# than the digits. The verifier checks every step, not only the answer.

# %%
from rlm_course.tasks.base import Problem

problem = Problem("4706+3915=", "8621")
trace = task.demonstration(problem)
print(problem.prompt, "->", trace)
print(task.verify(problem, trace))
wrong_step = "6+5=11>1,0+1+1=3>31,7+9=16>631,4+3+1=8>8621"  # a wrong digit, the right answer
print(task.verify(problem, wrong_step))
assert task.verify(problem, trace).correct and not task.verify(problem, wrong_step).correct

# %% [markdown]
# The warm start (SFT, stopped at about 20% validation accuracy: weak but not hopeless) samples a
# batch: 16 prompts x 8 responses, as every run below.

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.lm.checkpoint import load_checkpoint
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.runs import default_sft_checkpoint
from rlm_course.rl.trainer import RLTrainer
from rlm_course.systems.experiments import async_config
from rlm_course.tasks.eval_sets import load_eval_set
from rlm_course.tasks.scratchpad import response_length_stats

checkpoint = default_sft_checkpoint(task)
sft = load_checkpoint(checkpoint)
print("warm start:", sft["command"], f"(validation accuracy {sft['validation_accuracy']:.0%})")
config = async_config(steps=8)
local = RLTrainer(sft["model"], task, CharTokenizer(), config, load_eval_set(task))
lengths = local.collect(1).lengths.tolist()
stats = response_length_stats(lengths)
print({k: round(v, 1) for k, v in stats.items()})
plt.figure(figsize=(6, 2.6))
plt.hist(lengths, bins=range(0, max(lengths) + 4, 3))
plt.xlabel("response length (tokens)"); plt.ylabel("responses")
plt.title(f"one batch: the longest is {stats['max_over_mean']:.1f}x the mean");

# %%
assert stats["max_over_mean"] > 2.0  # decoding runs as long as the longest response

# %% [markdown]
# ## 2. Staleness and the gate
#
# The weights after `k` updates are *version* `k`. Iteration `s` trains with version `s - 1`, so
# a sample generated by version `v` and trained at iteration `s` is `s - 1 - v` versions stale.
# AReaL bounds it by `eta`: samples are trained in the order they start, `B` per step, so sample
# `j` is trained by version `j // B`; started now, with the newest weights `v`, it is
# `j // B - v` stale. Requiring `<= eta` gives the gate: while the trainer is at version `v`, at
# most `(v + eta + 1) B` samples may have started (`rollout_capacity`, an exercise of this
# chapter). `eta = 0` is synchronous RL, `eta = 1` one-step off-policy.

# %%
from rlm_course.systems.async_rl import rollout_capacity

rows = [[eta] + [rollout_capacity(v, eta, 1, 0) for v in range(4)] for eta in (0, 1, 2, 4)]
print("batches the rollout may have started, by trainer version (B = 1 batch):")
print(format_table(rows, ["eta", "v=0", "v=1", "v=2", "v=3"]))
assert rows[0][1:] == [1, 2, 3, 4] and rows[1][1:] == [2, 3, 4, 5]

# %% [markdown]
# `tests/systems/test_async_rl.py` checks, over hundreds of random event orders, that no trained
# sample is ever more than `eta` versions stale and that the gate never deadlocks. That holds
# because this pipeline trains samples in the order they started. Systems that train whatever
# finished first (AReaL's buffer, streaming trainers) bound only the version a sample *starts*
# with: a long response admitted early can be trained later than `eta` allows, with or without
# partial rollouts, so their maximum staleness can exceed `eta`; report the maximum as well as
# the mean (chapter 14's simulator, which trains in completion order, reports both).
#
# ## 3. Real runs: synchronous, one-step off-policy, bounded staleness, partial rollouts
#
# One trainer worker and one rollout worker (disaggregated, one core each), eight GRPO steps
# each, from the same warm start and seed; and, for comparison, the colocated synchronous
# pipeline on the same two devices (both workers generate half the prompts, then train
# data-parallel, then hand the weights over in process). The trainer recomputes `pi_old` with its
# current weights (the proximal policy) and weighs each token by its behaviour importance weight
# truncated at 2 (`config.correction`, TIS: section 4). Each step also logs how far the behaviour
# policy was from the proximal one, in KL: staleness measured by what it does to the
# distribution, not only in versions.

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.systems.async_rl import PipelineConfig
from rlm_course.systems.pipelines import run_pipeline
from rlm_course.systems.workers import RLWorker

runs = {}
with Controller(DeviceMapping(actor=[0, 1], rollout=[0, 1])) as colocated:
    runs["colocated sync"] = run_pipeline(colocated, task, config, PipelineConfig(eta=0),
                                          checkpoint, evaluate=False, progress=True)
with Controller(DeviceMapping(actor=[0], rollout=[1])) as disaggregated:
    for name, pipe in (("sync (eta=0)", PipelineConfig(eta=0)),
                       ("one-step off (eta=1)", PipelineConfig(eta=1)),
                       ("eta=2", PipelineConfig(eta=2)),
                       ("eta=2 + partial rollouts", PipelineConfig(eta=2, partial_rollout=True))):
        runs[name] = run_pipeline(disaggregated, task, config, pipe, checkpoint, evaluate=False,
                                  progress=True)
    trained_weights = disaggregated.call(disaggregated.role_workers("actor"),
                                         RLWorker.policy_state)[0]

base = runs["sync (eta=0)"].tokens_per_second
print(f"correction: {config.correction} (cap {config.correction_cap})")
rows = [[name, f"{r.seconds:.1f}", f"{r.tokens_per_second:,.0f}", f"{r.tokens_per_second / base:.2f}x",
         r.max_staleness, f"{statistics.mean(s['staleness_mean'] for s in r.steps):.2f}",
         len(r.token_versions), f"{statistics.mean(s['behaviour_kl'] for s in r.steps):.1e}",
         f"{max(s['behaviour_kl'] for s in r.steps):.1e}",
         f"{statistics.mean(s['over_cap_tokens'] for s in r.steps):.2%}"]
        for name, r in runs.items()]
print(format_table(rows, ["pipeline", "seconds", "trained tokens/s", "vs sync", "max staleness",
                          "mean staleness", "versions in the tokens", "behaviour KL (mean)",
                          "(max)", "tokens w > 2"]))

# %%
for name, r in runs.items():
    eta = r.config["pipeline"]["eta"]
    assert r.max_staleness <= eta, name  # the gate held
    assert [s["step"] for s in r.steps] == list(range(1, config.steps + 1))
assert runs["sync (eta=0)"].max_staleness == 0
sync_kl = max(s["behaviour_kl"] for s in runs["sync (eta=0)"].steps)
stale_kl = statistics.mean(s["behaviour_kl"] for s in runs["eta=2"].steps)
assert sync_kl < 1e-6 and stale_kl > 100 * sync_kl  # synchronous: same weights and numerics

# %% [markdown]
# The timelines say why the numbers are what they are. Synchronous: the two workers take turns.
# One-step off: generation of batch `k + 1` runs beside training on batch `k` (labels: the policy
# version generating, or produced by training). With partial rollouts the rollout decodes in
# segments and takes new weights between them.

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.tools.plots import plot_timelines

plot_timelines({name: runs[name].events for name in
                ("colocated sync", "sync (eta=0)", "one-step off (eta=1)", "eta=2 + partial rollouts")});

# %% [markdown]
# **What two shared cores can and cannot show.** Overlap needs two free cores: the async gain is
# at most `(G + T) / max(G, T)` for generation time `G` and training time `T` per step, here
# between 1 and 2, and only when the machine's other work leaves both cores to the two workers.
# With `eta > 1` one rollout worker cannot run further ahead than its own speed allows: the gate
# stops binding once the rollout is the slower side, so `eta = 2` and `4` mostly smooth the
# long tail's step-to-step variance. The colocated pipeline splits each batch over both devices,
# but its generation still lasts as long as the longest response (depth, chapter 06), so
# splitting the batch halves less than half the time. What this machine cannot show: thousands
# of GPUs whose generation pool and training pool are sized against each other, memory-bound
# decoding, and networks where the sync costs seconds.
#
# Staleness in versions says how many updates behind a sample is; the behaviour KL says how far
# its distribution moved, which is what the loss has to correct. The synchronous pipelines show
# a KL of almost 0 (the rollout and the trainer compute with the same weights and the same fp32
# numerics: what is left is the KV cache against the full pass); the asynchronous ones show
# what one or two small updates of lr 1e-4 do to a 0.8M-parameter model.
#
# ## 4. The decoupled PPO objective, and three ways to cap it
#
# Three policies meet in an asynchronous update. The **behaviour** policy sampled each token
# (its log-probability comes from the rollout, as generated; with partial rollouts, several
# versions in one response). The **proximal** policy is the trust region's centre: the trainer's
# weights before this update, recomputed. The **current** policy is being trained. AReaL's
# objective (arXiv:2505.24298, eq. 5; after Hilton et al. 2022):
#
# $$L = -\mathbb{E}_{y \sim \pi_\text{behav}}\Big[w_t \min\big(u_t A_t,\ \mathrm{clip}(u_t, 1 - \epsilon, 1 + \epsilon) A_t\big)\Big],
# \quad u_t = \frac{\pi_\theta}{\pi_\text{prox}},\quad w_t = \frac{\pi_\text{prox}}{\pi_\text{behav}}$$
#
# with no gradient through `w`. **Why two ratios** (Hilton et al.'s argument): PPO's clip is a
# trust region, and its centre must be a policy the optimizer controls: the proximal one, the
# weights it had before this update. Centring it on the behaviour policy, as naive PPO on stale
# data does, makes the centre whatever old or differently-computed policy happened to sample,
# so the clip constrains the wrong thing. The sampling distribution is a separate question,
# answered by the importance weight `w`: it turns the expectation over behaviour samples into
# one over proximal samples.
#
# Eq. 5 has **no cap**: unbiased, but one token the behaviour policy sampled with a tiny
# probability can carry a huge `w` and the whole gradient. What systems run instead
# (`rlm_course.rl.off_policy`, `RLConfig.correction`):
#
# | correction | weight of a token | bias | variance | who |
# |---|---|---|---|---|
# | `is` | `w` | none | unbounded | AReaL eq. 5 |
# | `tis` | `min(w, c)` | rare tokens under-weighted (a token above `c` counts `c` times its objective) | bounded by `c` | TIS (Yao et al. 2025); verl, TRL `token_truncate` |
# | `mis` | `w` if `w <= c`, else 0 | the masked tokens' gradient is lost; the kept ones unbiased | bounded by `c` | AReaL's code (`behav_imp_weight_cap`); TRL `token_mask` |
# | `seq-tis`, `seq-mis` | the same on `W = prod_t w_t` per response | the right ratio for a sequence reward | grows with length | TRL `sequence_*`, verl `rollout_is` |
#
# A masked token still counts in the loss's denominator, as AReaL computes it. How off-policy is
# a stale batch? Score a batch sampled by the warm start (version 0) under the weights 8 updates
# later:

# %%
from rlm_course.lm.sampling import response_log_probs

batch = local.collect(2)  # behaviour: the warm start
rollout = batch.rollout
newer = load_checkpoint(checkpoint)["model"]
newer.load_state_dict(trained_weights)
with torch.no_grad():
    prox = response_log_probs(newer, rollout.tokens, rollout.attention_mask, rollout.prompt_len,
                              temperature=config.temperature)
from rlm_course.rl.off_policy import mismatch_stats

w = torch.exp(prox - rollout.log_probs)[rollout.response_mask]
stale = mismatch_stats(prox, rollout.log_probs, rollout.response_mask, cap=2.0)
print(f"importance weights pi_prox / pi_behav over {w.numel()} tokens: median {w.median():.3f}, "
      f"{stale['over_cap_tokens']:.1%} above the cap 2 (TIS truncates them, MIS masks them), "
      f"{(w < 0.5).float().mean():.1%} below 0.5; KL(behav || prox) {stale['behaviour_kl']:.3f} "
      f"per token, {stale['behaviour_kl_seq']:.2f} per response; "
      f"{stale['over_cap_responses']:.0%} of responses have W > 2")
plt.figure(figsize=(6, 2.4))
plt.hist(w.clamp(max=4).numpy(), bins=40)
plt.xlabel("pi_prox / pi_behav (clamped at 4)"); plt.ylabel("tokens");

# %%
from rlm_course.rl.losses import policy_loss
from rlm_course.systems.async_rl import decoupled_ppo_loss

advantages = torch.randn(len(rollout.tokens))
same, _ = decoupled_ppo_loss(prox, prox, prox, advantages, rollout.response_mask)
assert torch.equal(same, policy_loss(prox, prox, advantages, rollout.response_mask)[0])
print("on-policy tokens (behaviour = proximal): the decoupled loss is PPO's clipped loss")
losses = {c: decoupled_ppo_loss(prox, prox, rollout.log_probs, advantages, rollout.response_mask,
                                correction=c)[0].item() for c in ("none", "is", "tis", "mis")}
print("the same stale batch, loss by correction:", {c: round(v, 4) for c, v in losses.items()})

# %% [markdown]
# Most tokens are close to on-policy after 8 small updates, but a tail of them is not: those
# are the tokens naive PPO on stale data weighs wrongly, and the ones a cap truncates or masks.
# AReaL measured naive PPO collapsing as staleness grows (AIME24 42.0 -> 23.3 at `eta = 4`) while
# the decoupled objective stays at about 42 up to `eta = 4`.
#
# ## 5. The rollout/trainer mismatch: off-policy without staleness
#
# At scale the rollout engine is not the trainer. vLLM or SGLang hold the policy in bf16 (often
# fp8), with their own kernels and batch-dependent reductions; the trainer (FSDP, Megatron) keeps
# fp32 master weights. For the *same* weights the two give different log-probs, so a
# "synchronous, on-policy" run trains on tokens another policy sampled, and the weight
# `pi_trainer / pi_engine` is not 1. Yao et al. (2025, "Your efficient RL framework secretly
# brings you off-policy RL training") showed the gap on vLLM against FSDP and proposed TIS; verl
# (rollout importance sampling), NeMo-RL, TRL (`vllm_importance_sampling_correction`) and
# prime-rl now offer a correction, with the weights of section 4. And the decoupled loss takes
# `pi_behav` from the engine, so its `w` mixes staleness with numerics. (A public Qwen3-0.6B run
# with rollouts up to 3 updates stale, one seed on a 128-question set, scored 2/128 without a
# correction and 98/128 with TIS, and the gap vanished with fresher rollouts:
# marin-community/marin issue 8955. Staleness and numerics together, one seed: an anecdote, not
# a measurement.)
#
# A laptop has no vLLM, but it has the cause: a cheaper numeric path. The engine here is a
# rounded copy of the policy (`rlm_course.lm.precision`): **bf16** weights and activations, or
# every weight matrix rounded to **fp8** (e4m3, one scale per row; embeddings and the output head
# too, where DeepSeek-V3's fp8 recipe keeps them in higher precision and scales 128 x 128
# blocks: this engine is coarser than theirs) and computed in fp32. It samples a batch;
# the fp32 trainer scores it:

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.systems.mismatch import measure_mismatch

mismatch = measure_mismatch(load_checkpoint(checkpoint)["model"], task, CharTokenizer())
rows = [[p, f"{m['stats']['behaviour_kl']:.1e}", f"{m['stats']['behaviour_kl_seq']:.1e}",
         f"{m['stats']['log_ratio_abs_max']:.3f}", f"{m['stats']['weight_max']:.3f}",
         f"{m['stats']['over_cap_tokens']:.3%}", f"{m['stats']['over_cap_responses']:.1%}",
         f"{m['tokens_per_second']:,.0f}", f"{m['speed_vs_fp32']:.2f}x"]
        for p, m in mismatch.items()]
print(format_table(rows, ["engine", "KL per token", "KL per response", "max |log w|", "max w",
                          "tokens w > 2", "responses W > 2", "decode tokens/s", "vs fp32"]))
fig, axes = plt.subplots(1, 2, figsize=(10, 3))
for p in ("bf16", "fp8"):
    h = mismatch[p]["histogram"]
    axes[0].stairs(h["counts"], range(len(h["counts"]) + 1), label=p)
    by_length = mismatch[p]["kl_by_length"]
    axes[1].plot([(b["lengths"][0] + b["lengths"][1]) / 2 for b in by_length],
                 [b["kl"] for b in by_length], "o-", label=p)
edges = mismatch["fp8"]["histogram"]["edges"]
axes[0].set_xticks(range(len(edges)), [f"{e:g}" for e in edges], rotation=90, fontsize=7)
axes[0].set(yscale="log", xlabel="log w = log pi_trainer - log pi_engine (bin edges)",
            ylabel="tokens", title="per-token log-ratio, same weights")
axes[1].set(xlabel="response length (tokens)", ylabel="KL(engine || trainer) per response",
            title="a response's KL grows with its length")
for ax in axes:
    ax.legend()

# %%
assert mismatch["fp32"]["stats"]["log_ratio_abs_max"] < 1e-4  # same numerics: float noise
assert mismatch["fp8"]["stats"]["behaviour_kl"] > mismatch["bf16"]["stats"]["behaviour_kl"] > 1e-6
assert 5e-4 < mismatch["fp8"]["stats"]["behaviour_kl"] < 5e-3  # about 1e-3 per token
bins = mismatch["fp8"]["kl_by_length"]
short = statistics.mean(b["kl"] for b in bins if b["lengths"][1] <= 24)
long = statistics.mean(b["kl"] for b in bins[-3:])
print(f"fp8: KL of a response of at most 24 tokens {short:.3f}, of the longest {long:.3f}")
assert long > 2 * short  # a response's KL grows with its length
one_step = statistics.mean(s["behaviour_kl"] for s in runs["one-step off (eta=1)"].steps)
ratio = one_step / mismatch["fp8"]["stats"]["behaviour_kl"]
print(f"one version of staleness (section 3) against the fp8 engine, KL per token: {ratio:.1f}x")
assert 0.1 < ratio < 10  # the same order: staleness and numerics are comparable here

# %% [markdown]
# With identical weights, the bf16 engine's per-token KL to the trainer is small and the fp8
# engine's larger (e4m3 keeps 3 mantissa bits to bf16's 7, so a weight's rounding error is up to
# `2^-4` of it against `2^-8`), with a tail of tokens whose `|log w|` is far above the median; the
# KL of a whole response grows with its length, which is why long reasoning traces (and
# sequence-level weights, a product over thousands of tokens) suffer most. And one version of
# staleness at this learning rate (section 3's one-step-off run) moves the distribution by about
# as much as the fp8 engine does with no staleness at all (printed and asserted above): a
# behaviour weight mixes both, and no version count tells them apart. The column "vs fp32"
# is this CPU's own speed of each path, which depends on its matrix units; the speed that makes
# engines take cheaper numerics is a GPU's.
#
# Does it hurt learning here, and does a correction help? GRPO on the scratchpad task with the
# fp8 engine and no correction, TIS and MIS (cap 2), beside the fp32 engine, two seeds each, 60
# steps, stored by `python -m rlm_course systems mismatch --store`:

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.systems.experiments import load_experiment

stored_mismatch = load_experiment("mismatch")
print("made by:", stored_mismatch["command"], "| each run:", stored_mismatch["runs"][0]["command"])
table = {}
for r in stored_mismatch["runs"]:
    table.setdefault((r["precision"], r["correction"]), []).append(r)
rows = [[precision, correction, " / ".join(f"{r['accuracy_after']:.1%}" for r in group),
         f"{statistics.mean(r['accuracy_after'] - r['accuracy_before'] for r in group) * 100:+.1f}",
         f"{statistics.mean(statistics.mean(r['behaviour_kl']) for r in group):.1e}",
         f"{max(max(r['weight_max']) for r in group):.2f}",
         f"{statistics.mean(statistics.mean(r['corrected_tokens']) for r in group):.3%}"]
        for (precision, correction), group in table.items()]
print(format_table(rows, ["engine", "correction", "accuracy after (per seed)", "gain (pts)",
                          "behaviour KL", "max w", "tokens truncated or masked"]))
fig, ax = plt.subplots(figsize=(7, 3.2))
for k, ((precision, correction), group) in enumerate(table.items()):
    for i, r in enumerate(group):
        ax.plot(*zip(*r["eval_curve"]), ["-", "--"][i % 2], color=f"C{k}",
                label=f"{precision} {correction}" if i == 0 else None)
ax.set(xlabel="step", ylabel="held-out accuracy", title="fp8 rollouts: no correction, TIS, MIS")
ax.legend(fontsize=7);

# %%
assert len(stored_mismatch["runs"]) == 8 and len(stored_mismatch["seeds"]) == 2
fp32_spread = abs(table["fp32", "none"][0]["accuracy_after"] - table["fp32", "none"][1]["accuracy_after"])
print(f"the two fp32 seeds end {fp32_spread * 100:.1f} points apart")
assert fp32_spread > 0.03  # seed noise: larger than a few points
for r in stored_mismatch["runs"]:
    assert statistics.mean(r["corrected_tokens"]) < 1e-3  # a cap touches < 0.1% of tokens
    assert r["accuracy_after"] > r["accuracy_before"], r["command"]  # every run learns
    if r["precision"] == "fp8":
        assert statistics.mean(r["behaviour_kl"]) > 1e-5  # the mismatch is there every step

# %% [markdown]
# **What the CPU shows, and what it cannot.** The mismatch is there in every step (the
# behaviour KL column: about 1e-3 per token with the fp8 engine, 1e-13 with the fp32 one), but
# it is small and short: responses of about 20 tokens, a weight above 2 on about one token in
# ten thousand (the last column: what TIS truncated and MIS masked). The accuracies differ more
# between the two seeds of one setting than between settings: the two fp32 runs alone are
# several points apart. So on this machine the mismatch neither measurably hurt learning nor did
# a correction measurably help; two seeds cannot rank TIS against MIS or against no correction.
# That is the honest reading. What the CPU cannot show is the regime where the published
# failures happen: responses of thousands of tokens (the response KL grows with length, the
# plot above), MoE routers that pick other experts under other numerics, engines whose kernels
# change with the batch, thousands of steps for small biases to compound. There the same
# weights, with the same caps, are what verl, TRL and NeMo-RL apply.
#
#
# ## 6. Longer runs: throughput and accuracy per wall-second
#
# Sixty steps of each pipeline, one seed, held-out accuracy of snapshots every ten steps, stored
# by `python -m rlm_course systems async --store` (the decoupled loss with TIS at cap 2, as above):

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.systems.experiments import load_experiment

stored = load_experiment("async")
print("made by:", stored["command"], "| machine:", stored["machine"])
long_runs = stored["runs"]
base = long_runs["disaggregated sync (eta=0)"]["tokens_per_second"]
rows = []
for name, r in long_runs.items():
    acc = r["accuracy"]
    lengths = response_length_stats(r["response_lengths"])
    rows.append([name, f"{r['seconds']:.0f}", f"{r['tokens_per_second']:,.0f}",
                 f"{r['tokens_per_second'] / base:.2f}x", f"{acc[0]['accuracy']:.0%}",
                 f"{acc[-1]['accuracy']:.0%}",
                 f"{(acc[-1]['accuracy'] - acc[0]['accuracy']) * 100 / (r['seconds'] / 60):.1f}",
                 r["max_staleness"], f"{lengths['mean']:.0f} / {lengths['max']}"])
print(format_table(rows, ["pipeline", "seconds", "tokens/s", "vs sync", "acc before", "acc after",
                          "gain pts / min", "max stale", "length mean / max"]))
fig, ax = plt.subplots(figsize=(7, 3.4))
for name, r in long_runs.items():
    ax.plot([a["seconds"] for a in r["accuracy"]], [a["accuracy"] for a in r["accuracy"]], "o-",
            ms=3, label=name)
ax.set(xlabel="wall-clock seconds", ylabel="held-out accuracy", title="accuracy per wall-second")
ax.legend(fontsize=7);

# %%
for name, r in long_runs.items():
    assert r["max_staleness"] <= r["config"]["pipeline"]["eta"]
    assert r["accuracy"][-1]["accuracy"] > r["accuracy"][0]["accuracy"], name  # GRPO learns

# %% [markdown]
# Read the stored table critically: it is **one seed** per pipeline. Throughput: the
# asynchronous pipelines trained about 1.3x the tokens per second of the *disaggregated*
# synchronous one, as the overlap bound predicts; but the **colocated** synchronous pipeline was
# faster still (about 1.45x): on two devices, a disaggregated pool that idles while the other
# works costs more than asynchrony wins back. Accuracy after 60 steps, all six runs: colocated
# synchronous 41%, disaggregated synchronous 46%, `eta = 1` 36%, `eta = 2` 34%, `eta = 4` 30%,
# `eta = 2` with partial rollouts 40% (200 problems: about +-3.5 points of sampling noise on
# each). The two *synchronous* runs, which differ only in how the batch is split over devices
# (and so in the order floating-point sums are taken), already differ by 5 points: as much as
# half the gap between synchronous and `eta = 4`. One seed therefore cannot say that staleness
# cost accuracy here; it is consistent with it, and the trend across `eta` points that way, no
# more. If it is real, a likelier cause than the number of versions is how far each version
# moves a 0.8M-parameter model at lr 1e-4: the behaviour KL of section 3, which a rerun logs in
# every step's `metrics.jsonl` (`behaviour_kl`, `over_cap_tokens`, `staleness_max`). Per
# wall-second, asynchrony did not pay on this machine; it pays where generation dominates and
# each pool can be sized for its stage (chapter 14's simulator). `python -m rlm_course systems
# async --seed 1` runs the six pipelines on another seed (about 16 minutes; it replaces the
# stored file).
#
# ## 7. Stage fusion
#
# Experience preparation on two colocated workers: each generates half the prompts, then scores
# them (reward, `pi_old`, reference). **Fused** (RLHFuse, arXiv:2409.13221): after the decode step
# by which most responses usually end (the 80th percentile of the previous batch's lengths), the
# unfinished sequences migrate to worker 0, which finishes the tail while worker 1 scores
# everything that has finished; the stragglers are scored at the end.

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.systems.fusion import window_events
from rlm_course.systems.pipelines import fusion_experiment

with Controller(DeviceMapping(actor=[0, 1], rollout=[0, 1])) as colocated:
    fusion = fusion_experiment(colocated, task, config, checkpoint, steps=2, progress=True)
print(f"migration after {fusion['first_tokens']} tokens; step seconds unfused "
      f"{[round(x, 2) for x in fusion['unfused_seconds']]}, fused "
      f"{[round(x, 2) for x in fusion['fused_seconds']]}: gain {fusion['gain']:.2f}x")
plot_timelines({"unfused": window_events(fusion["events"], fusion["windows"], "unfused", 2),
                "fused": window_events(fusion["events"], fusion["windows"], "fused", 2)},
               show_versions=False);

# %%
from rlm_course.systems.controller import stop_ray

assert fusion["same_early_rows"]  # responses that ended before the migration are the same tokens
stop_ray()  # the last Ray workers of this chapter: Ray stops now, not when the kernel shuts down

# %%
# NBVAL_IGNORE_OUTPUT
stored_fusion = load_experiment("fusion")
print("stored:", stored_fusion["command"], f"-> gain {stored_fusion['gain']:.2f}x over "
      f"{len(stored_fusion['unfused_seconds'])} iterations (median step "
      f"{statistics.median(stored_fusion['unfused_seconds']):.2f} s unfused, "
      f"{statistics.median(stored_fusion['fused_seconds']):.2f} s fused)")

# %% [markdown]
# Fusion overlaps the tail's decoding with scoring; its price is re-prefilling the migrated
# sequences on worker 0. On two cores the gain is bounded by the scoring that can hide behind the
# tail. RLHFuse's headline "up to 3.7x" is not this gain: it is end-to-end throughput against
# *other systems*, with inter- and intra-stage fusion and its other optimizations together, on
# RLHF with a critic and a reward model on 13B-65B models (arXiv:2409.13221), where the tail is
# thousands of tokens of memory-bound decoding.
#
# ## 8. The published figures, and this machine
#
# | system | speed-up against synchronous | what it compares |
# |---|---|---|
# | veRL one-step off (vLLM + FSDP2 / + Megatron) | +23% / +40% end to end | Qwen2.5-Math-7B DAPO, 16 H20: 4 for rollout, 12 for training (its step times give 1.44x / 1.24x) |
# | veRL fully async (staleness + partial rollout) | 2.35x-2.67x | 128 H20, streaming alone about 1.6x |
# | AReaL (eta-bounded, interruptible, decoupled PPO) | 2.77x | R1-Distill-Qwen-1.5B, 16 nodes: 41.0 h -> 14.8 h, same accuracy |
#
# Each compares against a colocated synchronous baseline of its own setup; a disaggregated split
# lets each pool be sized for its stage, and the speed-up grows with the tail and the cluster.
# Two cores can show the mechanism (the overlap on the timeline, the staleness bound, the
# correction, the fusion), and a gain bounded by `(G + T) / max(G, T)`; they cannot show the
# scaling with devices, nor the memory-bound decode that makes the tail so long on GPUs.

# %%
from rlm_course.systems.async_rl import PUBLISHED

print(format_table([[p["system"], f"{p['speedup']:.2f}x", p["source"]] for p in PUBLISHED],
                   ["system", "speed-up", "source"]))

# %% [markdown]
# ## Questions
#
# 1. Generation takes `G = 3 s` and training `T = 1 s` per step. What throughput gain does
#    one-step off-policy give? And `eta = 4`? What would change the answer?
# 2. With partial rollouts, a response has tokens of versions 3, 4 and 5 and is trained at
#    iteration 7. What is its staleness under AReaL's definition, and why that definition?
# 3. Why does the decoupled objective clip `u` but weigh by `w`? What goes wrong with `w`
#    uncapped (eq. 5), and what do truncation (TIS) and masking (MIS) each give up?
# 4. A synchronous run with a bf16 engine logs a behaviour KL of 1e-3 per token. Why is it not
#    on-policy, and why does the problem grow with the response length?
#
# <details><summary>Answers</summary>
#
# 1. Synchronous: `G + T = 4 s` per step; overlapped, the slower side sets the pace:
#    `max(G, T) = 3 s`, a 1.33x gain. `eta = 4` gives nothing more in steady state: the trainer
#    waits for the rollout anyway. More rollout devices (a larger generation pool, sized until
#    `G` about equals `T`), partial rollouts that cut the tail, or a shorter tail would change it:
#    that is how the published systems reach 2-3x.
# 2. Its *head* version is 3, so `7 - 1 - 3 = 3` versions stale: the gate bounds the version that
#    *started* a sample, because that is the one chosen when it was admitted; its later tokens are
#    fresher. (AReaL's `max_head_offpolicyness` says so in its name.)
# 3. `u = pi_theta / pi_prox` is the trust region, centred on a policy the optimizer controls;
#    `w = pi_prox / pi_behav` corrects the sampling distribution and is a constant of the update.
#    Uncapped, a token the behaviour policy sampled with a tiny probability can carry a huge `w`,
#    so a few tokens dominate the gradient (unbiased, high variance). Truncation keeps every
#    token but under-weights those rare ones (biased, variance bounded by `c`); masking drops
#    them entirely (their gradient is lost, the kept tokens stay unbiased, variance bounded).
# 4. The engine sampled from its own distribution (bf16 weights, other kernels), not the
#    trainer's, so `pi_trainer / pi_engine` differs from 1 even with identical weights: the
#    batch is off-policy by numerics alone. A response's log-ratio is the sum over its tokens, so
#    its KL grows about linearly with length, and a sequence-level weight (a product of
#    thousands of `w_t`) can explode or vanish; hence per-token corrections for long traces.
#
# </details>
#
# **Exercises.** `exercises/ex13_async_rl.py`: the staleness gate (`rollout_capacity`), the
# off-policy corrections (`behaviour_weights`: none, eq. 5, TIS, MIS, per token and per
# sequence) and the decoupled PPO loss; `python -m rlm_course grade 13`.
#
# > **Key numbers and takeaways**
# >
# > * Staleness of a sample trained at iteration `s`: `s - 1 - v`; AReaL's gate admits at most
# >   `(v + eta + 1) B` samples; it held in every run here (`max staleness <= eta`).
# > * Asynchrony removes the edge `train_k -> generate_{k+1}`: the gain is at most
# >   `(G + T) / max(G, T)`; measured here (tables above) on two shared cores.
# > * The decoupled objective weighs each token by `w = pi_prox / pi_behav` (AReaL eq. 5, no
# >   cap); systems cap it: truncate (TIS, `min(w, c)`) or mask (AReaL's code, MIS: 0 above `c`).
# > * The rollout/trainer mismatch makes every run with a separate engine off-policy: with the
# >   same weights, an fp8 engine's KL to the fp32 trainer is about 1e-3 per token here, growing
# >   with the response's length; the same weights correct it.
# > * Staleness is measured in KL too (`behaviour_kl` per step): about 0 synchronous, above it
# >   asynchronous.
# > * Fusion overlaps scoring with the long tail (gain above); published: veRL one-step off +23% /
# >   +40%, fully async 2.35-2.67x, AReaL 2.77x (each against its own synchronous baseline);
# >   RLHFuse up to 3.7x against other systems, all its optimizations together.
#
# ## Further reading
#
# * Fu et al. 2025, AReaL, arXiv:2505.24298 (staleness, interruptible rollouts, decoupled PPO).
# * Hilton et al. 2022, Batch size-invariance for policy optimization, arXiv:2110.00641.
# * Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"
#   (TIS), and the masked variants in verl's rollout importance sampling and TRL's
#   `vllm_importance_sampling_mode`.
# * veRL's recipes: `docs/advance/one_step_off.md`, `docs/advance/fully_async.md`.
# * Kimi k1.5, arXiv:2501.12599 (partial rollouts); Zhong et al., RLHFuse, arXiv:2409.13221;
#   Zhong et al., StreamRL, arXiv:2504.15930.
