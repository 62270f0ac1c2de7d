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
# depth is about 150 operations for Llama-3-8B, the same for any batch, and growing only with the
# logarithm of the sequence length: all tokens are processed at once.

# %%
from rlm_course.cost.architectures import get_spec
from rlm_course.utils import format_table

llama = get_spec("llama-3-8b")
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
# scoring and runs the critic's update beside the policy's. For Llama-3-8B with 64 prompts x 16
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
# Ways out, all in later chapters: shorten the depth (speculative decoding, partial rollouts that
# cap the response length per iteration), overlap it (asynchronous RL runs generation of the next
# batch beside training on this one), or fill the idle processors during the long tail (stream
# scoring and training as responses finish).
#
# ## 6. Explore
#
# The calculator of chapter 05 also reports `W`, `D` and `W/D` of the iteration and of its
# generation stage.

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.tools.widgets import RLStepCalculator

calc = RLStepCalculator()
calc.widget

# %%
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
# ## Exercises
#
# Compose the work and depth of a transformer layer and write Brent's bound in
# `exercises/ex06_workdepth.py`; check them with `exercises/ex06_workdepth.ipynb` or
# `python -m rlm_course grade 06`.
