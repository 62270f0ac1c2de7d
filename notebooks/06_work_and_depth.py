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
# # 06 · Work and depth
#
# Chapter 05 asked how many FLOPs and bytes each stage costs. This one asks **how much of it can
# run at the same time**. A computation is a DAG of operations:
#
# * its **work** `W` is the number of operations: the time on one processor;
# * its **depth** `D` is the longest chain of operations that wait on each other: the time on
#   infinitely many processors;
# * `W / D` is its **parallelism**, and **Brent's bound** says `p` processors need at most
#   `W/p + D` steps (and at least `max(W/p, D)`). Past `p ≈ W/D`, more processors barely help.
#
# The cost model (`rlm_course/cost/workdepth.py`): work in FLOPs (a matmul `(m,k)@(k,n)` is `2mkn`),
# elementwise operations have depth 1, a sum of `n` values is a tree of depth `ceil(log2 n)`;
# sequential parts add depth, independent parts take the maximum.
#
# **Learning objectives.** After this chapter you can:
#
# 1. compute the work, depth and parallelism of a layer, a forward pass, autoregressive decoding
#    and a whole GRPO or PPO iteration, and use Brent's bound;
# 2. explain why decode depth grows with the response length while a larger group adds only work;
# 3. turn work and depth into seconds with the roofline of chapter 05, and see why, for
#    memory-bound decode, the work term falls towards the depth term instead of below it;
# 4. see how a long tail of response lengths sets the depth by its longest response and lowers the
#    parallelism.

# %%
# NBVAL_IGNORE_OUTPUT
import matplotlib.pyplot as plt
import torch

from rlm_course.utils import seed_everything

seed_everything(0)
print(torch.__version__)

# %% [markdown]
# ## 1. The smallest example: a sum
#
# Summing `n` numbers as a balanced tree: `W = n`, `D = ceil(log2 n)`. With `p` processors Brent
# gives `n/p + log2 n`: linear speedup while `p` is well below `n / log n`, then a plateau.

# %%
from rlm_course.cost import workdepth as wd

total = wd.reduction(1, 1_000_000)
print(f"W = {total.work:,}, D = {total.depth}, W/D = {total.parallelism:,.0f}")
ps = [2 ** k for k in range(0, 24)]
plt.figure(figsize=(5, 3))
plt.loglog(ps, [total.speedup(p) for p in ps], "o-", ms=3, label="Brent: W / (W/p + D)")
plt.loglog(ps, ps, "k:", label="perfect")
plt.axhline(total.parallelism, color="red", lw=1, label="W / D")
plt.xlabel("processors p"); plt.ylabel("speedup"); plt.legend(fontsize=8);
assert total.speedup(10**9) <= total.parallelism

# %% [markdown]
# ## 2. A transformer layer
#
# Blocks compose: a layer is a norm, the fused QKV matmul, attention (all heads independent), the
# output projection, a residual add, a norm, the MLP and another add, one after the other. Its
# depth is about 150 operations for Llama-3.1-8B, the same for any batch, and growing only with the
# logarithm of the sequence length: all tokens are processed at once.

# %%
from rlm_course.cost.architectures import get_spec
from rlm_course.utils import format_table

llama = get_spec("llama-3.1-8b")
block = wd.layer(llama, batch=8, seq_len=512)
print(format_table([[name, f"{w:.3g}", d] for name, w, d in block.breakdown()],
                   ["part", "work (FLOP)", "depth"]))
print(f"layer: W = {block.work:.3g}, D = {block.depth}, W/D = {block.parallelism:.3g}")
assert wd.layer(llama, 64, 512).depth == block.depth  # more sequences: more work, same depth

# %% [markdown]
# ## 3. Forward pass vs autoregressive decode
#
# A forward pass (prefill, scoring, training) stacks the layers: `D ≈ L x D_layer`, independent of
# the number of sequences and logarithmic in their length. Decoding `T` tokens stacks `T` one-token forward passes, because token
# `t + 1` needs token `t`: **depth grows linearly with the response length**. Sampling more
# responses (a larger group) adds work, not depth.

# %%
lengths = [64, 128, 256, 512, 1024]
decodes = {g: [wd.decode(llama, 16 * g, 256, t) for t in lengths] for g in (1, 4)}
depths = [d.depth for d in decodes[1]]
works = {g: [d.work for d in runs] for g, runs in decodes.items()}
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3))
ax1.plot(lengths, depths, "o-", label="decode")
ax1.axhline(wd.forward(llama, 16, 256 + 1024).depth, color="gray", ls="--",
            label="one forward over 1280 tokens")
ax1.set(xlabel="response tokens T", ylabel="depth D", title="depth grows with T"); ax1.legend(fontsize=8)
for g, w in works.items():
    ax2.plot(lengths, w, "o-", label=f"{16 * g} sequences")
ax2.set(xlabel="response tokens T", ylabel="work W (FLOP)", title="group size adds work");
ax2.legend(fontsize=8)
fig.tight_layout()
assert [d.depth for d in decodes[4]] == depths and works[4] == [4 * w for w in works[1]]
assert depths[-1] > 10 * depths[0]

# %% [markdown]
# ## 4. GAE: a sequential loop, or a parallel scan
#
# The reverse loop `A_t = delta_t + gamma lambda A_{t+1}` has depth proportional to the response
# length. The recurrence is linear, so the maps `x -> c x + delta` compose associatively and a
# prefix scan (Hillis & Steele 1986; Blelloch 1990 for the work-efficient form) computes every `A_t`
# in `ceil(log2 T)` rounds: more work, far less depth. `gae_parallel` runs that scan in PyTorch and agrees with the loop of chapter 03.

# %%
from rlm_course.numerics import relative_error, reorder_tolerance
from rlm_course.rl.advantages import gae

for t in (16, 1024, 32768):
    loop, scan = wd.gae_scan(512, t), wd.gae_prefix_scan(512, t)
    print(f"T = {t:>6}: loop W = {loop.work:>11,} D = {loop.depth:>6};   "
          f"scan W = {scan.work:>11,} D = {scan.depth:>3}")
g = torch.Generator().manual_seed(0)
rewards, values = torch.randn(8, 50, generator=g), torch.randn(8, 50, generator=g)
mask = torch.arange(50)[None] < torch.randint(1, 51, (8, 1), generator=g)
error = relative_error(wd.gae_parallel(rewards, values, mask, 1.0, 0.95)[0],
                       gae(rewards, values, mask, 1.0, 0.95)[0])
# the scan adds the same 50 discounted terms in a tree instead of right to left: equal up to
# float32 rounding of a 50-term sum (rlm_course.numerics.reorder_tolerance), on any machine
print(f"scan vs loop, relative error {error:.1e}")
assert error <= reorder_tolerance(torch.float32, terms=50, depth=2)

# %% [markdown]
# ## 5. Whole iterations
#
# GRPO: generation, then the scoring passes (independent: depth is the maximum), the group
# advantages, then the gradient steps one after the other. PPO adds the critic's forward to
# scoring and runs the critic's update beside the policy's (the critic ends in a scalar value
# head on the response positions, not the language-model head). For Llama-3.1-8B with 64 prompts x 16
# samples, 256-token prompts and 1,024-token responses:

# %%
n_params = llama.params()
grpo = wd.grpo_iteration(llama, prompts=64, group_size=16, prompt_len=256, response_len=1024,
                         n_params=n_params, minibatches=4)
ppo = wd.ppo_iteration(llama, prompts=1024, prompt_len=256, response_len=1024, n_params=n_params,
                       minibatches=4)
for name, it in (("GRPO", grpo), ("PPO", ppo)):
    rows = [[part, f"{w:.3g}", f"{w / it.work:.0%}", f"{d:,}", f"{d / it.depth:.0%}"]
            for part, w, d in it.breakdown()]
    print(f"{name}: W = {it.work:.3g} FLOP, D = {it.depth:,}, W/D = {it.parallelism:.3g}")
    print(format_table(rows, ["part", "work", "of W", "depth", "of D"]) + "\n")
assert grpo.parts[0].depth > 0.9 * grpo.depth  # generation is nearly all of the critical path

# %% [markdown]
# Generation does a minority of the work but holds almost the whole critical path. Brent's bound
# makes the consequence concrete: however many processors we add, an iteration takes at least
# `D` steps, and generation's share of that floor is fixed by the longest response. Below, the
# guaranteed speedup of the whole GRPO iteration and of its generation stage alone:

# %%
ps = [10 ** k for k in range(0, 16)]
plt.figure(figsize=(5, 3))
for name, c in (("whole iteration", grpo), ("generation only", grpo.parts[0]),
                ("training only", grpo.parts[-1])):
    plt.loglog(ps, [c.speedup(p) for p in ps], "o-", ms=3, label=f"{name} (W/D = {c.parallelism:.2g})")
plt.xlabel("processors p (scalar operations at once)"); plt.ylabel("speedup bound")
plt.legend(fontsize=7);

# %% [markdown]
# ## 6. From operations to seconds
#
# The depth above is counted in scalar operations: about 5.3 million for the GRPO iteration. Timed
# at one operation per nanosecond it would be a few milliseconds, nothing next to the seconds an
# iteration takes; read that way, depth could never bound an iteration. The count assumes that an
# operation starts the moment its inputs exist, on processors that hold every weight at hand. A
# real decode step cannot: it must stream its replica's share of the weights from memory before
# it can produce the next token, so each of the `T_max - 1` dependent steps takes at least the
# roofline time of chapter 05,
#
# `t_step = max(FLOPs / (tp x peak), (weight bytes + KV bytes) / (tp x bandwidth)) + latency`,
#
# about `2N / (tp x bandwidth)` for the last sequence of a batch, plus a per-step latency (kernel
# launches, sampling, TP collectives). The depth in seconds is `D_s = (T_max - 1) x t_step`.
#
# The work in seconds needs the same care. Brent's theorem counts work and depth in the same
# unit-time operations; a decode step is memory-bound, so its work in seconds is its **bytes**,
# not its FLOPs at peak: the KV-cache reads, and the weights, which every one of the `p / tp`
# replicas streams again at every step. The work term is the roofline time of chapter 05 on `p`
# devices, `W_s(p) = max(FLOPs / (p peak), bytes(p) / (p bandwidth))` per stage, and the bound is
# `max(W_s(p), D_s) <= T <= W_s(p) + D_s` (`rlm_course.cost.anatomy.generation_time_bounds`;
# counting the FLOPs at peak instead would put the "upper" bound below the roofline time, about
# 25 s against 50 s on one GPU here). For the same GRPO generation on H100s in replicas of one
# GPU, with no per-step latency and with the latency chapter 14 calibrates on NeMo-RL's published
# runs (vLLM on H100s; chapter 05 measured this machine's):

# %%
from rlm_course.cluster.calibration import calibrated_rates
from rlm_course.cost.anatomy import Workload, generation_costs, generation_time_bounds
from rlm_course.cost.hardware import get_device

h100 = get_device("H100-SXM-80GB")
latency = calibrated_rates("nemo-rl").decode_step_latency
print(f"calibrated latency per decode step: {latency * 1e3:.1f} ms")
example = Workload(64, 16, 256, 1024)
devices = [2 ** k for k in range(0, 11)]
bounds = {lat: [generation_time_bounds(llama, example, h100, p, 1, lat) for p in devices]
          for lat in (0.0, latency)}
at_64 = generation_time_bounds(llama, example, h100, 64, 1)
stages = generation_costs(llama, example)
roofline = [sum(c.seconds(h100, p, 1) for c in stages.values()) for p in devices]
flops_at_peak = [sum(c.flops for c in stages.values()) / (p * h100.peak_flops) for p in devices]
print(f"one decode step of Llama-3.1-8B on one H100: {at_64['step_seconds'] * 1e3:.1f} ms; "
      f"depth {at_64['depth_seconds']:.2f} s for {example.max_response_len - 1} steps; work "
      f"{bounds[0.0][0]['work_seconds']:.1f} s on 1 GPU, {bounds[0.0][3]['work_seconds']:.2f} s on "
      f"8, {at_64['work_seconds']:.2f} s on 64 (FLOPs at peak would say "
      f"{flops_at_peak[6]:.3f} s); the depth term reaches the work term at "
      f"{at_64['crossover_devices']:,} GPUs")
plt.figure(figsize=(5.5, 3.2))
plt.loglog(devices, [b["work_seconds"] for b in bounds[0.0]], "o-", ms=3,
           label="work: roofline time W_s(p)")
plt.loglog(devices, flops_at_peak, "x:", ms=3, alpha=0.5, label="FLOPs at peak (not the work)")
for lat, style in ((0.0, "k--"), (latency, "k:")):
    plt.loglog(devices, [b["depth_seconds"] for b in bounds[lat]], style,
               label=f"depth, {lat * 1e3:.1f} ms latency per step")
plt.loglog(devices, [b["upper"] for b in bounds[latency]], "s-", ms=3, alpha=0.6,
           label=f"Brent: work + depth ({latency * 1e3:.1f} ms)")
plt.xlabel("H100s p"); plt.ylabel("seconds of generation"); plt.legend(fontsize=7);
for b, t in zip(bounds[0.0], roofline):  # the work term is the roofline time; upper is above it
    assert abs(b["work_seconds"] - t) <= 1e-9 * t and b["upper"] >= t
assert 20 < flops_at_peak[0] + at_64["depth_seconds"] < 30  # FLOPs at peak: an "upper" of ~25 s
assert 45 < roofline[0] < 55 and 1.5 < bounds[0.0][3]["work_seconds"] / at_64["depth_seconds"] < 2.5
assert at_64["work_seconds"] > at_64["depth_seconds"] and at_64["crossover_devices"] > 512

# %% [markdown]
# The work term falls fast at first (the KV reads and the FLOPs spread over more GPUs) and then
# flattens onto the depth term: on 8 GPUs it is already within 2x of it (asserted), and it meets
# it only past a thousand GPUs. Both end up measuring the same thing, a replica streaming its
# weights once per decode step, `T_max - 1` times: the work of a memory-bound decode is mostly
# that stream, which every replica pays whatever its share of the batch, and the depth is that
# stream for one sequence. So past a few GPUs adding GPUs buys little, and the generation cannot
# take less than `(T_max - 1) x t_step` however many there are. Chapter 05's roofline times and
# this chapter's depth are the same critical path, counted once in operations and once in
# seconds.
#
# ## 7. Long tails: depth follows the longest response
#
# With responses of different lengths, the decode of a batch runs until its longest response
# ends: its depth is that of `T_max`, while its work is the sum over the responses. Below, 64
# prompts with `G` samples each, lengths from a log-normal with mean 1,024 and `sigma` = 1 (an
# assumption, as in chapter 05) capped at 16k tokens, averaged over 10 draws: the parallelism
# `W / D` of generation against the same batch with every response 1,024 tokens long, and the
# depth in seconds.

# %%
from statistics import mean

group_sizes = [2, 4, 8, 16, 32, 64]
rows, curves = [], {"tail": [], "equal": [], "seconds": [], "t_max": []}
for G in group_sizes:
    draws = []
    for seed in range(10):
        tail = Workload.long_tailed(64, G, 256, 1024, 1.0, 16384, seed=seed)
        gen = wd.decode(llama, tail.responses, 256, 16384, tail.response_lengths)
        equal = wd.decode(llama, tail.responses, 256, round(tail.mean_response_len))
        draws.append((gen.parallelism, equal.parallelism,
                      generation_time_bounds(llama, tail, h100, 64, 1)["depth_seconds"],
                      tail.max_response_len))
    for key, values in zip(curves, zip(*draws)):
        curves[key].append(mean(values))
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
ax1.loglog(group_sizes, curves["equal"], "k:", base=2, label="every response E[T] long")
ax1.loglog(group_sizes, curves["tail"], "o-", base=2, label="long-tailed lengths")
ax1.set(xlabel="group size G", ylabel="W / D of generation"); ax1.legend(fontsize=7)
ax2.semilogx(group_sizes, curves["seconds"], "s-", base=2)
ax2.set(xlabel="group size G", ylabel="depth in seconds (H100, tp 1)")
fig.tight_layout()
print(format_table([[G, f"{t:.0f}", f"{e:.3g}", f"{w:.3g}", f"{d:.0f}"] for G, t, e, w, d in
                    zip(group_sizes, curves["t_max"], curves["equal"], curves["tail"],
                        curves["seconds"])],
                   ["G", "T_max", "W/D, equal lengths", "W/D, long tail", "depth s"]))
assert all(w < e / 3 for w, e in zip(curves["tail"], curves["equal"]))
assert curves["seconds"] == sorted(curves["seconds"])

# %% [markdown]
# A larger group still adds work, but with a long tail it also reaches further into the tail:
# `T_max`, and with it the depth, creeps up with `G`, and the parallelism stays far below that of
# equal lengths. This is the straggler effect in work-depth terms; the whole iteration with such
# lengths (scoring and training count each sequence at its own length, packed):

# %%
tail = Workload.long_tailed(64, 16, 256, 1024, 1.0, 16384, seed=0)
grpo_tail = wd.grpo_iteration(llama, 64, 16, 256, 16384, n_params, minibatches=4,
                              response_lengths=tail.response_lengths)
print(f"E[T] = {tail.mean_response_len:.0f}, T_max = {tail.max_response_len}: W = "
      f"{grpo_tail.work:.3g} FLOP, D = {grpo_tail.depth:,}, W/D = {grpo_tail.parallelism:.3g}")
print(format_table([[part, f"{w:.3g}", f"{w / grpo_tail.work:.0%}", f"{d:,}", f"{d / grpo_tail.depth:.0%}"]
                    for part, w, d in grpo_tail.breakdown()], ["part", "work", "of W", "depth", "of D"]))
assert grpo_tail.parts[0].depth > 0.99 * grpo_tail.depth

# %% [markdown]
# Ways out, all in later chapters: shorten the depth (speculative decoding, partial rollouts that
# cap the response length per iteration), overlap it (asynchronous RL runs generation of the next
# batch beside training on this one), or fill the idle processors during the long tail (stream
# scoring and training as responses finish).
#
# ## 8. Explore
#
# The calculator of chapter 05 also reports `W`, `D` and `W/D` of the iteration and of its
# generation stage.

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.tools.widgets import RLStepCalculator

calc = RLStepCalculator()
calc.widget

# %%
calc.controls["model"].value = "llama-3.1-8b"  # Llama 3's architecture, a 131,072-token window
calc.controls["response_len"].value = 8192
deep, work = calc.result["generation_depth"], calc.result["generation_work"]
calc.controls["group_size"].value = 64
assert calc.result["generation_depth"] == deep  # 4x the samples: the same generation depth ...
assert calc.result["generation_work"] == 4 * work  # ... and 4x its work
print(f"generation depth {deep:,} for 8k-token responses; the whole iteration's "
      f"{calc.result['depth']:,} (only logarithms grow with the batch)")

# %% [markdown]
# ## Questions
#
# * Why does the depth of a forward pass grow only logarithmically with the sequence length,
#   while the depth of generation grows linearly with it?
# * A GRPO iteration with `G = 16` and responses of up to 16k tokens runs on 64 GPUs. Which part
#   of Brent's bound, `W/p` or `D`, does adding GPUs shrink? Which does a partial rollout of 4k
#   tokens per iteration shrink?
# * PPO's GAE as a loop has depth `~2T`; as a scan `~2 log2 T`. Why does this matter less than
#   the decode depth?
#
# <details><summary>Answers</summary>
#
# * In a forward pass every token of the sequence is known in advance (the prompt, or a finished
#   response being scored), so all positions are processed at once; along the sequence the only
#   dependencies are sums (the softmax's denominator, the weighted sum over keys), trees of depth
#   `log2 S`. In generation token `t + 1` does not exist until step `t` has produced it: each step
#   is a whole forward that waits for the previous one, `T` of them in a chain.
# * Adding GPUs shrinks `W/p` only. `D` is set by the longest response: about 16k decode steps,
#   each at least `t_step` (section 6), whatever the number of GPUs. A partial rollout of 4k tokens
#   per iteration caps the decode steps of an iteration at 4k: it shrinks `D` (up to 4x here); the
#   unfinished responses continue in later iterations, so some of their tokens were sampled by an
#   older policy, and the objective must correct for it (chapter 13).
# * GAE's loop is `2T` dependent scalar operations per sequence, vectorised over the batch. Decode
#   is `T` dependent *forward passes*: in section 5's table, 5.3 million operations of depth for
#   1,024 tokens, about 5,000 per step against GAE's 2; and in seconds each decode step streams the
#   weights (milliseconds, section 6) while a GAE step is a few arithmetic operations. A GAE loop
#   is slow only when written as a Python loop over tokens, which the scan, or a vectorised
#   loop, fixes. (verl issue #336 reports an unexplained 10,751 s advantage step on >10k-token
#   outputs; that timer covers the reward and KL handling too, and the issue names no cause.)
#
# </details>
#
# > **Key numbers and takeaways**
# >
# > * Brent: `max(W/p, D) <= T_p <= W/p + D`; past `p ~ W/D` more processors barely help. In
# >   seconds the work term must be a roofline time (bytes for memory-bound decode), or the
# >   "upper" bound falls below what the hardware can do.
# > * A Llama-3.1-8B layer has depth about 156 operations whatever the batch; a forward pass's depth
# >   grows only with the logarithm of the sequence length.
# > * Decode depth grows linearly with the response length; a larger group adds work, not depth
# >   (for equal lengths).
# > * In the GRPO example generation is about a sixth of the work and 99% of the depth.
# > * In seconds, one decode step of Llama-3.1-8B on an H100 takes at least 4.8 ms (its 16 GB of
# >   weights at 3.35 TB/s); 1,023 of them take about 5 s. The generation's work at the roofline
# >   takes about 50 s on one GPU, 9 s on 8 and 5.5 s on 64: it flattens onto the depth, because
# >   every replica streams its weights at every step.
# > * With long-tailed lengths the depth follows `T_max`, which grows with `G`; the parallelism
# >   of generation is about ten times lower than with equal lengths of the same mean (section 7).
#
# ## Further reading
#
# * Blelloch, "Programming Parallel Algorithms", CACM 39(3), 1996 (work, depth, Brent's bound);
#   Blelloch 1990, "Prefix sums and their applications" (the scan).
# * Ben-Nun & Hoefler, "Demystifying Parallel and Distributed Deep Learning", ACM CSUR 2019,
#   arXiv:1802.09941 (work-depth analysis of deep learning).
# * *How to Scale Your Model* (the JAX scaling book), inference chapter: the per-step time of
#   decoding; https://jax-ml.github.io/scaling-book/
# * Ultra-Scale Playbook: https://huggingface.co/spaces/nanotron/ultrascale-playbook
# * ROLL Flash (arXiv:2510.11345): bounds on generation and end-to-end time under long-tailed
#   response lengths.
#
# ## Exercises
#
# Compose the work and depth of a transformer layer and write Brent's bound in
# `exercises/ex06_workdepth.py`; check them with `exercises/ex06_workdepth.ipynb` or
# `python -m rlm_course grade 06`.
