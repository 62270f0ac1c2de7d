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
# # 07 · Data parallelism and ZeRO
#
# From here on we split one model over several devices. We do it on **simulated ranks**: a
# `World` of `p` ranks inside this process, each with its own tensors, and collectives
# (all-reduce, reduce-scatter, all-gather, ...) that compute the right result, count the bytes
# every rank sends and receives, and advance each rank's clock with the alpha-beta model
# `alpha + bytes / beta` per message. Everything is checked against one device.
#
# Data parallelism copies the model to every rank and splits the batch; the ranks then agree on
# the mean gradient. ZeRO (Rajbhandari et al. 2019, arXiv:1910.02054) notices that every rank
# also keeps a full copy of the optimizer states, gradients and parameters, and shards them:
# stage 1 the Adam states, stage 2 also the gradients, stage 3 (= FSDP) also the parameters.
#
# **Learning objectives.** After this chapter you can:
#
# 1. derive the bytes a ring all-reduce sends per rank, `2(p-1)/p` times the message, and compare
#    it with a tree;
# 2. run data parallelism and ZeRO-1/2/3 on simulated ranks and check them against one device;
# 3. say what each ZeRO stage holds per rank and sends per step, and derive ZeRO-3's 1.5x;
# 4. write ZeRO-1's optimizer step (reduce-scatter, shard update, all-gather) yourself.

# %%
# NBVAL_IGNORE_OUTPUT
import copy

import torch
from torch import nn

from rlm_course.utils import seed_everything

seed_everything(0)
print(torch.__version__)

# %% [markdown]
# ## 1. Collectives and their cost
#
# A ring all-reduce of `M` bytes over `p` ranks: a reduce-scatter then an all-gather, `2(p-1)`
# steps of `M/p` bytes. Every rank sends `2(p-1)/p x M`: almost twice the message, however many
# ranks. A tree all-reduce needs only `2 log2 p` steps but sends whole messages.
#
# **Deriving `2(p-1)/p`.** Cut each rank's message into `p` chunks of `M/p` bytes and arrange the
# ranks in a ring. *Reduce-scatter*: at each step every rank sends one chunk to its successor,
# which adds it to its own copy of that chunk and passes the sum on at the next step. After
# `p - 1` steps each chunk has visited every rank, so rank `r` holds the full sum of one chunk;
# each rank has sent `(p-1)` chunks, `(p-1)/p x M` bytes. *All-gather*: the same ring passes the
# finished chunks around, `p - 1` more steps and `(p-1)/p x M` more bytes. Together `2(p-1)/p x M`
# per rank, sent over every link at once. No algorithm sends less (Patarasuk & Yuan 2009,
# "Bandwidth optimal all-reduce algorithms"): split the result into the `p` parts each rank
# finishes; every part needs the other `p - 1` ranks' data, so each rank sends at least
# `(p-1)/p x M` towards the sums; and every rank needs the `p - 1` parts it did not finish, so
# at least `(p-1)/p x M` more must reach it. In-network reduction (NVLink SHARP, InfiniBand
# SHARP) beats the bound by letting the switches add.

# %%
from rlm_course.cost.comm import Link
from rlm_course.parallel.world import World
from rlm_course.utils import format_table

link = Link(alpha=5e-6, beta=25e9)  # 5 us latency, 25 GB/s
rows = []
for p in (2, 4, 8, 16):
    for algorithm in ("ring", "tree"):
        world = World(p, link, algorithm)
        tensors = [torch.ones(1 << 20) * r for r in range(p)]  # 4 MB each
        out = world.all_reduce(tensors)
        assert torch.equal(out[0], torch.full((1 << 20,), p * (p - 1) / 2))
        rows.append([p, algorithm, f"{world.sent[0] / 1e6:.2f}", f"{world.clock[0] * 1e3:.3f}"])
print(format_table(rows, ["ranks", "algorithm", "MB sent per rank", "ms"]))

# %% [markdown]
# ## 2. Data parallelism and the three ZeRO stages, equal to one device
#
# A small MLP, a batch of 24 split over 4 ranks, three Adam steps. Each stage must end with the
# same parameters as one device training on the whole batch.
#
# *How equal?* Each rank sums the gradient over its 6 samples, then the collective adds the four
# partial sums: the same numbers added in another order than one device's sum over 24. Float
# addition is not associative, so the two differ in the last bits, and by how much depends on the
# machine (its SIMD kernels, its thread count). Adam then divides each gradient by the square root
# of its running square: for a parameter whose gradient is within rounding of zero, a difference
# of 1e-9 can move it by up to a whole learning rate. So we check the *algorithm* in float64,
# where rounding is 1e-16 and the bound of `rlm_course.numerics.adam_tolerance` is tiny, and we
# look at float32 (what the bytes below count) separately.

# %%
from rlm_course.numerics import adam_tolerance
from rlm_course.parallel.data_parallel import DataParallel, bytes_sent_per_step, flat_params

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 32))
x, y = torch.randn(24, 32), torch.randn(24, 32)
LR, STEPS, P = 1e-2, 3, 4


def loss_fn(m, batch):
    return ((m(batch[0]) - batch[1]) ** 2).mean()


def train(stage, dtype):
    """One device (stage None) or P simulated ranks; returns the parameters and the world."""
    m, xb, yb = copy.deepcopy(model).to(dtype), x.to(dtype), y.to(dtype)
    if stage is None:
        optimizer = torch.optim.Adam(m.parameters(), lr=LR)
        for _ in range(STEPS):
            optimizer.zero_grad()
            loss_fn(m, (xb, yb)).backward()
            optimizer.step()
        return flat_params(m), None, None
    world = World(P, link)
    dp = DataParallel(world, m, stage, lr=LR)
    for _ in range(STEPS):
        dp.step(list(zip(xb.chunk(P), yb.chunk(P))), loss_fn)
    return dp.parameters(), world, dp


one_device = {dtype: train(None, dtype)[0] for dtype in (torch.float64, torch.float32)}
# the longest sum is a weight gradient over the 24 samples, through 4 chained reductions
tolerance = adam_tolerance(torch.float64, terms=24, lr=LR, steps=STEPS, depth=4)
rows, memory, worlds = [], {}, {}
for stage in (0, 1, 2, 3):
    params64, _, _ = train(stage, torch.float64)
    error64 = (params64 - one_device[torch.float64]).abs().max().item()
    assert error64 <= tolerance, (stage, error64, tolerance)
    params, world, dp = train(stage, torch.float32)
    error32 = (params - one_device[torch.float32]).abs().max().item()
    assert world.sent[0] == STEPS * bytes_sent_per_step(stage, dp.padded, P)
    name = "DP" if stage == 0 else f"ZeRO-{stage}"
    memory[name] = dp.memory_per_rank()
    worlds[name] = world
    rows.append([name, f"{error64:.0e}", f"{error32:.0e}", world.sent[0] // STEPS,
                 sum(dp.memory_per_rank().values())])
print(f"float64 tolerance (rlm_course.numerics.adam_tolerance): {tolerance:.0e}")
print(format_table(rows, ["strategy", "max |param - one device| float64", "float32",
                          "bytes sent / rank / step (fp32)", "state bytes / rank (fp32)"]))

# %% [markdown]
# In float64 every stage lands within about 1e-13 of one device (Adam has already amplified the
# 1e-16 rounding a thousandfold): the strategies compute the same function. The float32 column is
# what a real run would see: differences above float32's own rounding (6e-8), amplified by Adam,
# and different on every machine (about 1e-6 on the machine this course was written on, 1.4e-5 on
# another Intel CPU). That is why frameworks compare distributed runs with loss curves and
# tolerances, not bit for bit.

# %%
from rlm_course.tools.plots import plot_memory_per_rank

plot_memory_per_rank(memory, title=f"model state per rank, {P} ranks");

# %% [markdown]
# ZeRO-1 and -2 send exactly what DP sends (a reduce-scatter plus an all-gather is an
# all-reduce) and hold less; ZeRO-3 gathers the parameters twice (forward and backward) and so
# sends 1.5x as much.
#
# **Deriving ZeRO-3's 1.5x** (Rajbhandari et al. 2019, section 7). Count in units of `Psi`, the
# model's bytes, and use the ring: a reduce-scatter or an all-gather of `Psi` sends about `Psi`
# per rank (`(p-1)/p x Psi`), an all-reduce twice that. Plain DP all-reduces the gradients:
# `2 Psi`. ZeRO-1 and -2 reduce-scatter the gradients (`Psi`), each rank updates its shard, then
# all-gather the new parameters (`Psi`): `2 Psi`, the same. ZeRO-3 keeps only a shard of the
# parameters, so it must all-gather them before the forward (`Psi`); it frees them after each
# layer to save memory, so it all-gathers them again for the backward (`Psi`); then it
# reduce-scatters the gradients (`Psi`) and updates its shard, which is all it keeps: `3 Psi`,
# 1.5x DP. The table's bytes say the same: 37,728 = 1.5 x 25,152 per rank and step.
#
# The timelines show when each rank talks:

# %%
from rlm_course.tools.plots import plot_rank_timeline

plot_rank_timeline([e for e in worlds["ZeRO-3"].events if e.end <= worlds["ZeRO-3"].clock[0] / 3],
                   title="ZeRO-3, one step: gather, gather, reduce-scatter");

# %% [markdown]
# ## 3. Seconds at scale: when does data parallelism stay compute-bound?
#
# The bytes above become seconds on real links. The hardware catalog
# (`python -m rlm_course hardware`) gives each accelerator's links **per direction**: an H100
# talks to the seven others of its node over NVLink at 450 GB/s and to other nodes through its
# own 400 Gb/s NIC, 50 GB/s, with NCCL's latencies of 3.4 and 9.6 us per ring step
# (`rlm_course.cost.comm.Fabric`; 9.6 us is an older NCCL's network figure: current releases'
# `src/graph/tuning.cc` has 14 us per network ring step plus a base latency of about 8 us per
# collective, which matters for small messages only). A data-parallel group that fits in a node
# uses the first. A larger group crosses the network, and a ring collective (all-reduce,
# reduce-scatter, all-gather) then runs on **all its ranks' cards on a node together**: NCCL runs
# one ring per card, each entering a node by one rank's card and leaving by another's after
# crossing the node over NVLink, so a full node of H100s moves 8 x 50 = 400 GB/s
# (`Fabric.ring_link`; NCCL's maintainers expect about 470 GB/s of all-reduce bus bandwidth from
# two nodes of 8 x 400 Gb/s, NVIDIA/nccl#2409). A group with one rank a node (data parallelism
# strided by TP 8, chapter 08) has one card: 50 GB/s.
#
# **Which RL stage uses data parallelism.** The updates (policy, critic) and the scoring forwards
# of an RL iteration run in a *training* layout: DP with ZeRO/FSDP, or DP on top of tensor and
# pipeline parallelism (chapters 08-09). Generation runs in independent *replicas* (chapter 08's
# section 3): many copies of the model decoding different prompts, with no gradients to
# synchronise at all.

# %%
import numpy as np

from rlm_course.cost.architectures import get_spec
from rlm_course.cost.hardware import get_device
from rlm_course.cost import comm

h100 = get_device("H100-SXM-80GB")
fabric = comm.Fabric.of(h100)
spec = get_spec("llama-3-8b")
rows = []
for dp, stride in ((8, 1), (64, 1), (1024, 1), (64, 8)):
    link = fabric.ring_link(dp, stride)
    cards = round(link.beta / fabric.inter.beta)
    where = "NVLink" if link is fabric.intra else f"network, {cards} card{'s' * (cards > 1)} a node"
    for stage in (0, 3):
        step = comm.data_parallel_comm(spec.params(), dp, link, stage)
        rows.append([spec.name, dp, "1" if stride == 1 else f"{stride} (one rank a node)", where,
                     "DP" if stage == 0 else "ZeRO-3", f"{step.bytes / 1e9:.1f}",
                     f"{step.seconds:.3f}"])
print(format_table(rows, ["model", "devices", "stride", "link", "strategy",
                          "GB sent / device / step", "seconds / step"]))
dp64 = comm.data_parallel_comm(spec.params(), 64, fabric.ring_link(64), 0)
zero3_64 = comm.data_parallel_comm(spec.params(), 64, fabric.ring_link(64), 3)
strided = comm.data_parallel_comm(spec.params(), 64, fabric.ring_link(64, 8), 0)
assert zero3_64.bytes == 1.5 * dp64.bytes
assert 0.078 < dp64.seconds < 0.082 and 0.117 < zero3_64.seconds < 0.123  # the text's numbers
assert 0.6 < strided.seconds < 0.66

# %% [markdown]
# Sixteen gigabytes of bf16 gradients take about 0.08 s to all-reduce over 64 H100s, eight to a
# node (0.12 s with ZeRO-3: the table), and 0.63 s when each node holds one rank of the group and
# its one card carries it all, on every optimizer step, whatever the batch. The compute of
# the step grows with the batch: `6 N` FLOPs per token. **The communication roofline** is where
# the two meet. With `B` tokens per
# device, `k (p-1)/p x b N` bytes to move (`k = 2` for DP and ZeRO-1/2, 3 for ZeRO-3; `b = 2`
# bytes per bf16 gradient) and a link of `beta` bytes/s:
#
#     6 N B / peak = k (p-1)/p x b N / beta    =>    B* = k (p-1)/p x b x peak / (6 beta)
#
# The model size cancels: `B* ~ 1,650` tokens per device for a group filling H100 nodes (`beta`
# the 400 GB/s of a node's 8 cards), whatever the model: the ratio `peak / beta`, about 2,470 FLOP
# per byte of network, does all the work. A group with one rank a node has one card, `B* ~
# 13,200` tokens per rank; with TP 8 inside the node (chapter 08) a rank is eight GPUs, each
# sending an eighth of the gradients over its own card: 1,650 tokens per GPU again.
# Below `B*` a step is communication-bound. Above it, the communication *can* hide behind the
# compute, if the compute it overlaps is long enough: DDP all-reduces gradient *buckets* as soon
# as their layers' backward is done, so it can hide only behind the backward, `4N` of the `6N`
# FLOPs per token, and needs about `1.5 B*` tokens to hide it all (the last bucket stays exposed);
# FSDP *prefetches* the next layer's parameters during the current layer's compute, forward
# included, so its factor is smaller.

# %%
import matplotlib.pyplot as plt

net = fabric.ring_link(64)
b_star = comm.min_tokens_per_device(h100.peak_flops, net.beta, 64)
tokens = np.logspace(2.5, 5.5, 40)
steps = {overlap: [comm.data_parallel_step(spec, h100, 64, b, net, overlap=overlap)
                   for b in tokens] for overlap in (False, True)}
plt.figure(figsize=(6, 3.4))
plt.loglog(tokens, [s["compute"] for s in steps[True]], "--", label="compute (6N per token)")
plt.loglog(tokens, [s["comm"] for s in steps[True]], ":", label="gradient all-reduce")
plt.loglog(tokens, [s["step"] for s in steps[False]], label="step, no overlap")
plt.loglog(tokens, [s["step"] for s in steps[True]], label="step, buckets overlapped")
plt.axvline(b_star * spec.params() / spec.matmul_params(), color="grey", lw=0.8)
plt.xlabel("tokens per device per step"); plt.ylabel("seconds")
plt.title(f"{spec.name}, DP over 64 H100s, 8 a node"); plt.legend(fontsize=7);
print(f"B* = {b_star:,.0f} tokens per device (plain DP, 64 devices, {net.beta / 1e9:.0f} GB/s)")
at = comm.data_parallel_step(spec, h100, 64, b_star * spec.params() / spec.matmul_params(), net,
                             overlap=False)
# the ridge: compute = communication, up to the latency term 2 (p - 1) alpha (1.2 ms here, 1.6%
# of it) that the bandwidth formula leaves out
assert abs(at["compute"] / at["comm"] - 1) < 0.02
assert round(comm.min_tokens_per_device(h100.peak_flops, net.beta, 10**6)) == 1649
assert round(comm.min_tokens_per_device(h100.peak_flops, fabric.inter.beta, 10**6)) == 13192
ridge = b_star * spec.params() / spec.matmul_params()
rows = []
for factor in (1.0, 1.2, 1.5, 2.0):
    one = comm.data_parallel_step(spec, h100, 64, factor * ridge, net, overlap=True)
    rows.append([f"{factor:g} B*", f"{factor * ridge:,.0f}", f"{one['exposed']:.3f}",
                 f"{one['step']:.3f}", f"{one['exposed'] / one['step']:.0%}"])
print(format_table(rows, ["tokens per device", "", "exposed comm s", "step s", "exposed share"]))
at_ridge = comm.data_parallel_step(spec, h100, 64, ridge, net, overlap=True)
at_1_5 = comm.data_parallel_step(spec, h100, 64, 1.5 * ridge, net, overlap=True)
assert 0.2 < at_ridge["exposed"] / at_ridge["step"] < 0.3  # at B*, DDP still exposes a quarter
assert at_1_5["exposed"] / at_1_5["step"] < 0.05  # at 1.5 B*, only the last bucket is left

# %% [markdown]
# (The vertical line sits at `B*` scaled by `params / matmul params`: the gradients are all of
# the 8.0B parameters, embeddings included, while the `6N` compute counts only the matmul
# weights.) An RL update of 512 prompts x 16 responses of 4,000 tokens has 33M tokens, 512,000 per
# device on 64 GPUs, a sixteenth of it in each of 16 mini-batches: ~32,000 tokens per device
# per optimizer step, far above `1.5 B*` (about 2,500), so the gradient traffic of an RL update
# hides, if the framework overlaps it. Cut the batch into 64 mini-batches and spread it over 1,024
# GPUs (500 tokens per device a step) and it no longer does.

# %% [markdown]
# ## Questions
#
# * A 7.5B-parameter model with mixed-precision Adam on 64 GPUs: how many GB per GPU does each
#   stage hold? (`rlm_course.cost.anatomy.zero_model_state_bytes`; the ZeRO paper's Figure 1 says 120,
#   31.4, 16.6 and 1.9.)
# * Why does the ring all-reduce's time per rank stop growing with `p` for large messages, while
#   the tree's keeps growing?
# * A 70B model is trained with ZeRO-3 over 512 H100s, eight to a node, 16 optimizer steps per
#   RL iteration of 8,192 responses of 2,000 tokens. Is each step compute-bound? What if the
#   same batch were spread over 4,096 GPUs?
#
# <details><summary>Answers</summary>
#
# * With `P` = 7.5e9 parameters and `N_d` = 64: plain DP holds `(2 + 2 + 12) P = 120 GB`;
#   ZeRO-1 `4P + 12P/64 = 31.4 GB`; ZeRO-2 `2P + 14P/64 = 16.6 GB`; ZeRO-3 `16P/64 = 1.9 GB`:
#   the paper's figures (the next cell computes them with `zero_model_state_bytes`).
# * The ring sends `2(p-1)` messages of `M/p` bytes: its time is `2(p-1) alpha + 2(p-1)/p x M/beta`.
#   The bandwidth part tends to `2M/beta` and stops growing with `p` (in the table above: 0.17 ms
#   of it at `p = 2`, 0.31 ms at `p = 16`, for 4 MB at 25 GB/s); only the latency part
#   `2(p-1) alpha` keeps growing, linearly, which matters for small messages. The tree sends the
#   whole message `2 log2 p` times in a row: `2 log2 p (alpha + M/beta)`, growing with `log p` in
#   both parts. For large messages the ring wins; for small ones (latency-bound) trees or
#   hierarchical algorithms do.
# * Tokens per device per step: `8,192 x 2,000 / 16 / 512 = 2,000`. ZeRO-3's roofline on a
#   node's 8 cards is `B* = 3 x (511/512) x 2 x 989.4e12 / (6 x 400e9) ~ 2,500` tokens (the next
#   cell): the steps are communication-bound, by a quarter, whatever the overlap. On 4,096 GPUs
#   it is 250 tokens per device, ten times too few. The fixes: fewer, larger optimizer steps
#   (fewer mini-batches), ZeRO-1/2 or tensor/pipeline parallelism inside nodes (chapters
#   08-09), which shrink the data-parallel group and put model parallelism on NVLink.
#
# </details>

# %%
per_device = 8192 * 2000 / 16 / 512
roofline = comm.min_tokens_per_device(h100.peak_flops, fabric.ring_link(512).beta, 512,
                                      zero_stage=3)
print(f"{per_device:,.0f} tokens per device per step; ZeRO-3 roofline {roofline:,.0f}")
assert round(roofline, -2) == 2500 and roofline / 1.3 < per_device < roofline
assert roofline / (8192 * 2000 / 16 / 4096) > 9.5  # on 4,096 GPUs: ten times too few

# %%
from rlm_course.cost.anatomy import zero_model_state_bytes

gb = [zero_model_state_bytes(7_500_000_000, 64, stage) / 1e9 for stage in (0, 1, 2, 3)]
print("GB per GPU, stages 0-3:", [round(x, 1) for x in gb])
assert [round(x, 1) for x in gb] == [120.0, 31.4, 16.6, 1.9]

# %% [markdown]
# > **Key numbers and takeaways**
# >
# > * A ring all-reduce sends `2(p-1)/p` times the message per rank: 1.5x at `p = 4`, tending to
# >   2x; it is bandwidth-optimal.
# > * ZeRO-1 and -2 send what DP sends (reduce-scatter + all-gather = all-reduce); ZeRO-3 sends
# >   1.5x (one more all-gather of the parameters).
# > * Model state per GPU for 7.5B parameters on 64 GPUs: 120 / 31.4 / 16.6 / 1.9 GB for DP and
# >   ZeRO-1/2/3.
# > * Distributed and single-device results agree up to rounding: exactly the same function in
# >   float64 (1e-13 here), machine-dependent differences in float32.
# > * The communication roofline: data parallelism stays compute-bound above
# >   `B* = k (p-1)/p x b x peak / (6 beta)` tokens per device and optimizer step, about 1,650
# >   for a group filling H100 nodes (a ring collective runs on a node's 8 cards together: 400
# >   GB/s; 2,500 with ZeRO-3), independent of the model; 13,200 per rank with one rank a node
# >   (one card). Overlap hides the
# >   communication only behind the compute it overlaps: DDP's buckets overlap the backward
# >   (4N of 6N), so they need about 1.5 B* (at B* a quarter of the step is still exposed);
# >   below B* nothing can.
#
# ## Further reading
#
# * Rajbhandari et al. 2019, ZeRO (arXiv:1910.02054); Patarasuk & Yuan 2009, "Bandwidth optimal
#   all-reduce algorithms"; Thakur, Rabenseifner & Gropp 2005, collectives in MPICH.
# * Ultra-Scale Playbook, data parallelism and ZeRO; its appendix on collectives;
#   https://huggingface.co/spaces/nanotron/ultrascale-playbook
# * *How to Scale Your Model* (the JAX scaling book), the training-parallelism chapter;
#   https://jax-ml.github.io/scaling-book/
# * Stanford CS336, assignment 2 (DDP, sharded optimizer, FSDP); https://github.com/stanford-cs336
#
# ## Exercise
#
# Write ZeRO-1's optimizer step, `zero1_step` (reduce-scatter the gradients, Adam on your shard,
# all-gather the parameters), in `exercises/ex07_zero.py`; check it with
# `exercises/ex07_zero.ipynb` or `python -m rlm_course grade 07`. `DataParallel` runs the worked
# version for stages 1 and 2 above.
#
# Chapter 14's exercise file (`exercises/ex14_plan_a_cluster.py`, `python -m rlm_course grade
# 14`) has this chapter's roofline as its first exercise: write `min_tokens_per_device`.
