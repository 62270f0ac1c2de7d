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
# # 09 · Pipeline parallelism
#
# Split the layers into `p` stages on `p` devices and the batch into `m` micro-batches. A
# micro-batch flows forward through the stages and its gradient flows back; a device idles
# until the first micro-batch reaches it and after the last one leaves: the **bubble**. A schedule
# says, for each device, in which order it runs the forwards (F) and backwards (B).
#
# **Learning objectives.** After this chapter you can:
#
# 1. derive the pipeline bubble of GPipe, 1F1B and interleaved 1F1B;
# 2. read a schedule as a table and as a timeline, and count the activations each device holds;
# 3. check that executing a schedule gives one device's gradients;
# 4. judge which stages of an RL iteration a pipeline suits.
#
# **One convention for the bubble.** Two ways of stating it are common: the **bubble fraction**,
# idle time over the total time of the devices, and the **ratio to the ideal time**, idle time over
# the time the work alone would take (what Narayanan et al. 2021 quote). With ratio `r`, the
# fraction is `r / (1 + r)`. This chapter uses the **fraction of the total time** everywhere: in
# the text, the table and the plots (`bubble_fraction`, `bubble_formula`).
#
# **Deriving it.** Let a forward of one micro-batch on one stage take `t_f` and a backward `t_b`.
# The ideal time of one device is `m (t_f + t_b)`: its share of the work. But the last stage
# cannot start before the first micro-batch has crossed the `p - 1` stages before it
# (`(p - 1) t_f`), and the first stage cannot finish before the last backward has come back
# through them (`(p - 1) t_b`). Every device waits those `(p - 1)(t_f + t_b)` in total, at the
# start and the end, so the step takes `(m + p - 1)(t_f + t_b)`: a ratio to the ideal time of
# `(p - 1) / m` and a **bubble fraction of `(p - 1) / (m + p - 1)`**.
#
# * GPipe: all forwards, then all backwards. Bubble fraction `(p-1)/(m+p-1)`; every
#   micro-batch's activations are alive at once.
# * 1F1B: after a short warm-up, alternate one forward and one backward. The same bubble, but at
#   most `p` micro-batches in flight.
# * Interleaved 1F1B: each device holds `v` chunks of layers, so a hop through one chunk takes
#   `1/v` of the time, and the fill and drain shrink to `(p - 1)(t_f + t_b) / v`: the ratio to the
#   ideal time becomes `(p-1)/(v m)` (halved by `v = 2`), a bubble fraction of
#   `(p-1)/(v m + p - 1)` (less than halved), for `v` times more point-to-point traffic.

# %%
# NBVAL_IGNORE_OUTPUT
import torch

from rlm_course.utils import seed_everything

seed_everything(0)
print(torch.__version__)

# %% [markdown]
# ## 1. Schedules as tables, run on a timeline

# %%
from rlm_course.parallel.pipeline import bubble_formula, schedule_table, simulate
from rlm_course.tools.plots import plot_pipeline
from rlm_course.utils import format_table

p, m = 4, 8
print("1F1B, device 0:", " ".join(f"{k}{mb}" for k, mb, _ in schedule_table("1f1b", p, m)[0]))
rows = []
for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 4)):
    timeline = simulate(schedule_table(name, p, m, v), t_forward=1.0, t_backward=2.0)
    formula = bubble_formula(name, p, m, v)
    assert abs(timeline.bubble_fraction - formula) < 1e-9
    rows.append([f"{name} v={v}", f"{timeline.bubble_fraction:.3f}", f"{formula:.3f}",
                 timeline.peak_in_flight(0), f"{timeline.makespan:.1f}"])
print(format_table(rows, ["schedule", "bubble fraction (timeline)", "bubble fraction (formula)",
                          "chunks in flight on device 0", "makespan"]))
# interleaving with v = 2 halves the bubble's ratio to the ideal time, not its fraction
f1, f2 = bubble_formula("1f1b", p, m), bubble_formula("interleaved", p, m, 2)
ratio = lambda f: f / (1 - f)  # noqa: E731  (fraction -> ratio to the ideal time)
print(f"ratio to the ideal time: 1F1B {ratio(f1):.3f}, interleaved v=2 {ratio(f2):.3f}; "
      f"fraction of the total: {f1:.3f} -> {f2:.3f}")
assert abs(ratio(f2) - ratio(f1) / 2) < 1e-12 and f2 > f1 / 2
# (an interleaved chunk is 1/v of a micro-batch's activations on that device)

# %%
plot_pipeline(simulate(schedule_table("gpipe", p, m)), title="GPipe, 4 devices, 8 micro-batches");
plot_pipeline(simulate(schedule_table("1f1b", p, m)), title="1F1B");
plot_pipeline(simulate(schedule_table("interleaved", p, m, 2)), title="interleaved 1F1B, v = 2");

# %% [markdown]
# ## 2. The bubble against the number of micro-batches

# %%
import matplotlib.pyplot as plt

ms = [4, 8, 16, 32, 64]
plt.figure(figsize=(5, 3))
for name, v in (("1f1b", 1), ("interleaved", 2), ("interleaved", 4)):
    plt.plot(ms, [simulate(schedule_table(name, 4, mm, v)).bubble_fraction for mm in ms], "o-",
             label=f"{name} v={v}")
plt.xlabel("micro-batches m"); plt.ylabel("bubble fraction of the total time")
plt.legend(fontsize=8);

# %% [markdown]
# **Beyond interleaving: zero-bubble schedules.** A backward is two computations with different
# dependencies: the gradient with respect to the layer's *input* (`B`), which the previous stage
# waits for, and the gradient with respect to its *weights* (`W`), which nothing downstream needs
# until the optimizer step. Qi et al. (2023, arXiv:2401.10241) split them and schedule the `W`
# passes into the slots where a device would otherwise idle, removing almost all of the bubble
# of 1F1B at the same activation memory (ZB-H1) or all of it with more memory (ZB-H2).
# DeepSeek-V3's DualPipe (arXiv:2412.19437, section 3.2.1) feeds micro-batches from both ends
# of the pipeline and overlaps each stage's computation with the all-to-all communication of
# expert parallelism. This chapter's simulator runs GPipe, 1F1B and interleaved 1F1B only.

# %% [markdown]
# ## 3. Executing a schedule gives one device's gradients

# %%
import copy

from torch import nn

from rlm_course.parallel.pipeline import run_pipeline

torch.manual_seed(0)
layers = [nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(8)]
reference = copy.deepcopy(layers)
x, y = torch.randn(16, 16), torch.randn(16, 16)
nn.functional.mse_loss(nn.Sequential(*reference)(x), y).backward()
run_pipeline(layers, schedule_table("interleaved", 2, 4, 2), list(zip(x.chunk(4), y.chunk(4))),
             nn.functional.mse_loss)
from rlm_course.numerics import relative_error, reorder_tolerance

error = max(relative_error(a.grad, b.grad)
            for la, lb in zip(layers, reference) for a, b in zip(la.parameters(), lb.parameters()))
print(f"largest relative gradient error, interleaved 1F1B on 2 devices x 2 chunks: {error:.1e}")
# each weight gradient adds 4 micro-batches' sums of 4 rows instead of one sum of 16: float32
# rounding only, through 8 layers forward and back
assert error <= reorder_tolerance(torch.float32, terms=16, depth=16)

# %% [markdown]
# ## 4. Three dimensions at once: DP x PP x TP on a mesh
#
# Large models combine the strategies: tensor parallelism inside a node, pipeline stages across
# nodes, data parallelism over whatever is left (Narayanan et al. 2021, arXiv:2104.04473). The
# ranks form a mesh with one axis per strategy (`rlm_course.parallel.world.Mesh`); every group
# along an axis is a world of its own (`SubWorld`), so the TP block of chapter 08 and the
# schedules of this chapter run on it unchanged. Here the tiny transformer trains on 8 ranks,
# `dp = 2, pp = 2, tp = 2`, in float64, and the gradients gathered from all the shards must be
# one device's.

# %%
import torch.nn.functional as F

from rlm_course.lm.model import ModelConfig, TinyGPT
from rlm_course.parallel.mesh_parallel import MeshParallelGPT, bytes_per_axis
from rlm_course.parallel.world import World

torch.manual_seed(0)
config = ModelConfig(vocab_size=16, n_layer=4, n_head=4, d_model=32, max_seq_len=16)
gpt = TinyGPT(config).double()
tokens = torch.randint(0, 16, (8, 13))
logits = gpt(tokens[:, :-1])
F.cross_entropy(logits.reshape(-1, 16), tokens[:, 1:].reshape(-1)).backward()
reference = {name: p.grad for name, p in gpt.named_parameters()}
world = World(8)
mesh_gpt = MeshParallelGPT(gpt, world, dp=2, pp=2, tp=2)
mesh_gpt.step(tokens, micro_batches=2)
grads = mesh_gpt.gathered_grads()
error = max(relative_error(grads[n], reference[n]) for n in reference)
print(f"largest relative gradient error over {len(reference)} parameters: {error:.1e}")
assert error <= reorder_tolerance(torch.float64, terms=96, depth=16)
measured = mesh_gpt.bytes_by_axis()
formula = bytes_per_axis(config, 2, 2, 2, batch=8, seq=12, micro_batches=2,
                         numel_per_rank=mesh_gpt.numel_per_rank(), bytes_per_element=8)
assert measured == formula
print(format_table([[r, *(measured[a][r] for a in ("dp", "pp", "tp"))] for r in range(8)],
                   ["rank", "dp bytes sent", "pp bytes sent", "tp bytes sent"]))

# %% [markdown]
# Each axis sends what its closed form says (`bytes_per_axis`, asserted): TP four
# all-reduce-sized exchanges per block and micro-batch, PP one activation forward and one
# gradient back per micro-batch and boundary (stage 0 only forward, stage 1 only back), DP one
# all-reduce of the rank's own gradients. The kinds of traffic differ as much as the amounts: TP
# is on the critical path of every layer (NVLink), PP is point-to-point between neighbours (any
# link), DP is one large collective per step that can hide behind the backward (chapter 07).
#
# ## 5. Seconds and memory at scale
#
# What a layout costs per device for a real model (`rlm_course.cost.layouts`): the model
# states sharded by TP, PP and ZeRO, the activations of the micro-batches in flight (one
# micro-batch of all layers under 1F1B: chapter 05's count, `33.5 s h` per layer of Llama-3-70B,
# divided by `tp`, which assumes Megatron's **sequence parallelism** (chapter 08); without it TP
# divides only the `25.5 s h` inside its matmuls and every rank keeps the other `8 s h`,
# `s h (8 + 25.5 / t)` per layer), and the fp32 logits of a micro-batch. Llama-3-70B on 64
# H100s, 8,192-token micro-batches:

# %%
from rlm_course.cost.architectures import get_spec
from rlm_course.cost.hardware import get_device
from rlm_course.cost.layouts import Layout, training_memory
from rlm_course.tools.plots import plot_memory_per_rank

spec70, h100 = get_spec("llama-3-70b"), get_device("H100-SXM-80GB")
layouts = {"DP 64, ZeRO-1": Layout(dp=64, zero=1), "FSDP 64": Layout(dp=64, zero=3),
           "FSDP 64, recompute": Layout(dp=64, zero=3, recompute=True),
           "TP 8 x DP 8, ZeRO-1, no SP": Layout(dp=8, tp=8, zero=1, sequence_parallel=False),
           "TP 8 + SP x DP 8, ZeRO-1": Layout(dp=8, tp=8, zero=1),
           "TP 8 + SP x PP 4 x DP 2, ZeRO-1": Layout(dp=2, tp=8, pp=4, zero=1)}
memory = {name: training_memory(spec70, lay, 8192) for name, lay in layouts.items()}
plot_memory_per_rank(memory, title="Llama-3-70B on 64 H100s: bytes per device")
total = {name: sum(parts.values()) / 1e9 for name, parts in memory.items()}
for name, gb in total.items():
    print(f"{name:28s} {gb:7.1f} GB per device")
assert total["DP 64, ZeRO-1"] > total["FSDP 64"] > 80 > total["TP 8 + SP x DP 8, ZeRO-1"]
assert total["FSDP 64, recompute"] < total["TP 8 + SP x PP 4 x DP 2, ZeRO-1"] < 80
assert round(total["TP 8 x DP 8, ZeRO-1, no SP"]) == 109  # without SP it does not fit

# %% [markdown]
# Sharding the model states is not enough: an 8,192-token micro-batch keeps 180 GB of
# activations (`33.5 s h` bytes per layer, 80 layers) unless TP with sequence parallelism splits
# them or recomputation drops them; TP alone leaves `11.2 s h` per layer at `t = 8` on every
# rank, and the TP 8 x DP 8 layout then needs about 109 GB (asserted). The layouts that fit an 80 GB
# device differ in seconds too: FSDP moves 1.5x the gradient bytes over the network every step
# (chapter 07's roofline), TP keeps its traffic on NVLink but splits each matmul, PP adds its
# bubble. For a pipeline of `p` stages with `m` micro-batches per optimizer step, each optimizer
# step takes `compute / (1 - (p-1)/(m+p-1))`, plus the activations' hops. An RL trainer sets `m`
# through its batch sizes: `m` = the tokens of a *mini-batch* (one optimizer step) over the
# tokens of a *micro-batch*; cutting the rollout into more mini-batches lowers `m` and pays one
# more fill and drain per optimizer step, so an update of `n` mini-batches pays `n` bubbles.

# %%
from rlm_course.cost import comm

link = comm.Fabric.of(h100).link(4, stride=16)  # stages on different nodes
hop = comm.pipeline_comm(spec70, 8192, link, backward=False)
print(f"one micro-batch of 8,192 tokens crosses a stage boundary in {hop.seconds * 1e3:.1f} ms "
      f"({hop.bytes / 1e6:.0f} MB of bf16 activations)")
for m in (4, 16, 64):
    print(f"p = 4, m = {m:2d}: bubble {bubble_formula('1f1b', 4, m):.1%} of the step")

# %% [markdown]
# ## Questions
#
# * In an RL step, the policy update runs many micro-batches; the rollout decodes token by token.
#   Which of the two suffers more from a pipeline's bubble, and why?
# * Interleaving with `v = 2` halves the bubble's ratio to the ideal time. What does it cost?
#
# * In the mesh of section 4, which axis would you put inside a node, and which across nodes,
#   if each node had 2 devices? Why?
#
# <details><summary>Answers</summary>
#
# * The rollout. The policy update pushes `m` micro-batches through once per gradient step, and
#   with `m` much larger than `p` its bubble fraction `(p-1)/(m+p-1)` is small. Decoding is `T`
#   dependent steps: a sequence's token `t + 1` cannot enter stage 1 before token `t` has left
#   stage `p`, so each step of each sequence crosses the whole pipeline, and only *other*
#   sequences can fill the stages meanwhile. The pipeline stays full only while at least `p`
#   groups of sequences are still decoding; in the long tail of the rollout only a few are left,
#   and most stages idle. (Generation engines therefore favour tensor parallelism, or more
#   replicas, over pipeline stages.)
# * `v` times more point-to-point messages (a micro-batch crosses every device `v` times, so the
#   activations are sent `v` times as often), more activations in flight on the first devices
#   (the table's last column: 11 chunks of half a micro-batch on device 0, 5.5 micro-batches'
#   worth, against 4 for 1F1B), and a more intricate schedule. The table shows the gain: the
#   fraction falls from 0.273 to 0.158 at `p = 4, m = 8`.
# * TP inside the node: its collectives run between the matmuls of every layer, forward and
#   backward, and cannot hide, so they need the fastest link (chapter 08). PP next: its traffic
#   is a point-to-point hop per micro-batch and boundary, small and overlappable. DP across
#   nodes: one all-reduce per optimizer step, which overlap hides above the communication
#   roofline (chapter 07). That is the order of section 4's mesh, `dp, pp, tp` from slowest to
#   fastest. Megatron-Core orders its ranks `tp-cp-ep-dp-pp` (`initialize_model_parallel`): TP
#   fastest, then DP, and PP slowest, pipeline stages across nodes, as Narayanan et al. 2021
#   (section 3) place them. Both keep TP inside the node; they differ in which of DP's one large
#   collective per step and PP's small hops per micro-batch gets the slower links: Megatron
#   gives PP the slowest, since its point-to-point traffic is the smallest; putting DP outermost
#   keeps its all-reduce on the network when PP fits in a node.
#
# </details>
#
# > **Key numbers and takeaways**
# >
# > * Bubble fraction of the total time: `(p-1)/(m+p-1)` for GPipe and 1F1B (0.273 at `p = 4,
# >   m = 8`), `(p-1)/(v m + p - 1)` interleaved (0.158 at `v = 2`, 0.086 at `v = 4`); the ratio
# >   to the ideal time is `(p-1)/m` and `(p-1)/(v m)`.
# > * 1F1B keeps the bubble of GPipe but at most `p` micro-batches' activations per device
# >   instead of `m`.
# > * More micro-batches shrink the bubble; in RL the policy update has them, the token-by-token
# >   rollout does not.
# > * DP x PP x TP on 8 simulated ranks gives one device's gradients (float64, asserted) and each
# >   axis sends its closed form; at scale only the sharded layouts fit Llama-3-70B on 80 GB
# >   devices.
#
# ## Further reading
#
# * Huang et al. 2019, GPipe (arXiv:1811.06965); Narayanan et al. 2021, Megatron-LM with 1F1B and
#   the interleaved schedule (arXiv:2104.04473, section 2.2).
# * Ultra-Scale Playbook, pipeline parallelism (AFAB, 1F1B, interleaved, zero-bubble);
#   https://huggingface.co/spaces/nanotron/ultrascale-playbook
# * *How to Scale Your Model* (the JAX scaling book); https://jax-ml.github.io/scaling-book/
# * Stanford CS336, systems assignment and lectures on parallelism; https://github.com/stanford-cs336
#
# ## Exercise
#
# `exercises/ex09_pipeline.py`: write `one_f_one_b`, the 1F1B schedule table of section 2, and
# check it with `python -m rlm_course grade 09` (or the checks in `exercises/ex09_pipeline.ipynb`).
