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
# # 10 · Context and expert parallelism
#
# **Context parallelism** splits one long sequence over ranks. Ring attention (Liu et al. 2023)
# keeps each rank's queries and passes the keys and values around a ring; the online-softmax merge
# combines partial results exactly (in exact arithmetic; in floats, up to rounding). Long
# reasoning traces (tens of thousands of tokens) make context parallelism how systems score and
# train on them: ring attention, or DeepSpeed-Ulysses's all-to-alls over the heads (section 3).
#
# **Expert parallelism** spreads the experts of a mixture-of-experts layer over ranks: a router
# sends each token to its `k` best experts, an all-to-all carries the tokens to the experts' ranks
# and a second one brings the results back. In GShard's and Switch Transformer's scheme, which
# this chapter runs, experts take at most `capacity` tokens and the rest are dropped; current
# MoEs such as DeepSeek-V3 and Qwen3 are *dropless* (every token reaches its experts; the load
# is balanced by a bias or an auxiliary loss instead, and the all-to-all sizes vary).
#
# **Learning objectives.** After this chapter you can:
#
# 1. run ring attention and check it against full causal attention, and balance its work across
#    ranks under a causal mask;
# 2. say what context parallelism sends per rank and why it can hide behind compute;
# 3. route tokens to experts on several ranks with two all-to-alls, and see capacity drop tokens;
# 4. connect load imbalance to dropped tokens and all-to-all time.

# %%
# NBVAL_IGNORE_OUTPUT
import torch
import torch.nn.functional as F

from rlm_course.utils import seed_everything

seed_everything(0)
print(torch.__version__)

# %% [markdown]
# ## 1. Ring attention equals full causal attention

# %%
from rlm_course.numerics import relative_error, reorder_tolerance
from rlm_course.parallel.context_parallel import ring_attention
from rlm_course.parallel.world import World
from rlm_course.utils import format_table

q, k, v = (torch.randn(2, 4, 64, 16) for _ in range(3))
reference = F.scaled_dot_product_attention(q, k, v, is_causal=True)
rows = []
for p in (2, 4, 8):
    for balanced in (False, True):
        world = World(p)
        out, work = ring_attention(world, q, k, v, causal=True, load_balanced=balanced)
        error = relative_error(out, reference)
        # the online softmax adds the 64 keys block by block: float32 rounding only
        assert error <= reorder_tolerance(torch.float32, terms=64, depth=4)
        rows.append([p, "zigzag" if balanced else "contiguous", f"{error:.1e}",
                     f"{max(work) / (sum(work) / p):.2f}", world.sent[0]])
print(format_table(rows, ["ranks", "layout", "rel. error", "max / mean work", "bytes sent / rank"]))

# %% [markdown]
# With the causal mask, the rank holding the last positions does most of the work in the
# contiguous layout; giving each rank one early and one late chunk evens it out.
#
# ## 2. A mixture of experts over ranks

# %%
from rlm_course.parallel.expert_parallel import MoELayer, expert_parallel_forward

torch.manual_seed(0)
layer = MoELayer(d_model=16, d_ff=32, n_experts=8, k=2, capacity_factor=1.25)
rows = []
for p in (1, 2, 4, 8):
    groups = [torch.randn(64, 16) for _ in range(p)]
    world = World(p)
    out, stats = expert_parallel_forward(world, layer, groups)
    reference = layer(groups)
    assert all(relative_error(a, b) <= reorder_tolerance(torch.float32, terms=32, depth=4)
               for a, b in zip(out, reference))
    rows.append([p, stats["dropped"], f"{stats['imbalance']:.2f}", max(world.sent)])
print(format_table(rows, ["EP degree", "dropped (token, expert) pairs", "max / mean load",
                          "max bytes sent"]))

# %%
import matplotlib.pyplot as plt

factors = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0]
dropped = []
groups = [torch.randn(64, 16) for _ in range(4)]
for cf in factors:
    layer.capacity_factor = cf
    dropped.append(expert_parallel_forward(World(4), layer, groups)[1]["dropped"] / (4 * 64 * 2))
plt.figure(figsize=(5, 3))
plt.plot(factors, dropped, "o-")
plt.xlabel("capacity factor"); plt.ylabel("share of pairs dropped");
assert dropped == sorted(dropped, reverse=True)

# %% [markdown]
# ## 3. DeepSpeed-Ulysses: trade the sequence split for a head split
#
# Ring attention moves keys and values around and keeps each rank's queries. DeepSpeed-Ulysses
# (Jacobs et al. 2023, arXiv:2309.14509) moves the *work* instead: an all-to-all turns each
# rank's sequence shard of `q, k, v` (all heads) into all positions of `H/p` heads; every rank
# runs ordinary attention on its heads, which need nothing from each other; a second all-to-all
# turns the output back into sequence shards. No merging, so the result is one device's up to
# rounding, like the others.

# %%
from rlm_course.parallel.ulysses import ulysses_attention, ulysses_bytes_per_rank

q, k, v = (torch.randn(2, 8, 64, 16) for _ in range(3))
reference = F.scaled_dot_product_attention(q, k, v, is_causal=True)
rows = []
for p in (2, 4, 8):
    world = World(p)
    out = ulysses_attention(world, q, k, v)
    error = relative_error(out, reference)
    assert error <= reorder_tolerance(torch.float32, terms=64, depth=2)
    assert world.sent[0] == ulysses_bytes_per_rank(2, 8, 64, 16, p)
    rows.append([p, f"{error:.1e}", world.sent[0]])
print(format_table(rows, ["degree", "rel. error", "bytes sent / rank"]))

# %% [markdown]
# What each sends per layer, as the sequence and the degree grow together (`s = 16 p`): ring
# attention sends `(p-1)/p` of the whole sequence's keys and values, which grows with `s`;
# Ulysses sends `(p-1)/p` of each rank's own shard, four times (`q, k, v` and the output), which
# stays flat. The catch: the degree must divide the heads, and with grouped-query attention the
# *key/value* heads (8 for Llama-3): Ulysses stops there, ring attention does not, and the two
# combine (Ulysses inside a node, a ring across nodes).

# %%
import matplotlib.pyplot as plt

degrees = [2, 4, 8]
ring_bytes, ulysses_bytes = [], []
for p in degrees:
    x = torch.randn(1, 8, 16 * p, 4)
    w1, w2 = World(p), World(p)
    ring_attention(w1, x, x, x, causal=True, load_balanced=True)
    ulysses_attention(w2, x, x, x)
    ring_bytes.append(w1.sent[0])
    ulysses_bytes.append(w2.sent[0])
plt.figure(figsize=(5, 3))
plt.plot(degrees, ring_bytes, "o-", label="ring attention (K/V around the ring)")
plt.plot(degrees, ulysses_bytes, "s-", label="Ulysses (4 all-to-alls)")
plt.xlabel("degree p (sequence 16 p)"); plt.ylabel("bytes sent per rank"); plt.legend(fontsize=7);
assert ring_bytes[-1] > 6 * ring_bytes[0] and ulysses_bytes[-1] < 2 * ulysses_bytes[0]

# %% [markdown]
# ## 4. Seconds at scale
#
# The same closed forms over the catalog's links (`rlm_course.cost.comm`): a 128k-token
# sequence of Llama-3.1-8B (Llama 3's 8B architecture with a 131,072-token window) scored or
# trained with context parallelism over 8 H100s of a node, and the expert all-to-alls of an MoE
# layer (DeepSeek-V3's 256 experts, 8 per token) inside a node and across nodes.

# %%
from rlm_course.cost.architectures import get_spec
from rlm_course.cost.hardware import get_device
from rlm_course.cost import comm

h100 = get_device("H100-SXM-80GB")
fabric = comm.Fabric.of(h100)
spec8, moe = get_spec("llama-3.1-8b"), get_spec("deepseek-v3")
rows = []
for name, cost in (("ring attention, cp 8", comm.context_parallel_comm(spec8, 8, 131072,
                                                                         fabric.link(8))),
                   ("Ulysses, sp 8", comm.ulysses_comm(spec8, 8, 131072, fabric.link(8)))):
    rows.append([name, "llama-3.1-8b, 128k tokens", f"{cost.bytes / 1e9:.2f}",
                 f"{cost.seconds * 1e3:.1f}"])
for ep, link in ((8, fabric.link(8)), (64, fabric.link(64))):
    cost = comm.expert_parallel_comm(moe, ep, 8192, link)
    rows.append([f"expert all-to-alls, ep {ep}", "deepseek-v3, 8k tokens / device",
                 f"{cost.bytes / 1e9:.2f}", f"{cost.seconds * 1e3:.1f}"])
print(format_table(rows, ["strategy", "workload (forward + backward, all layers)",
                          "GB sent / device", "ms"]))
flops = 3 * 2 * spec8.matmul_params() * 131072 / 8  # the matmuls alone, per device
print(f"for scale: the matmuls of that 128k sequence take {flops / (0.5 * h100.peak_flops) * 1e3:.0f} "
      "ms per device at half of peak, before attention's s^2 term")

# %% [markdown]
# Context parallelism's traffic for a 128k-token sequence is about a tenth of a second of NVLink
# (half that with Ulysses), next to 1.5 s of matmuls and more of attention: it hides behind the
# compute it splits. Expert parallelism's all-to-alls, by contrast, sit between the router and
# the experts of every MoE layer, and across nodes they slow to the network's 50 GB/s, ten times
# the in-node time here. (An upper estimate: the model sends the all-to-alls of DeepSeek-V3's 58
# MoE layers, its first 3 being dense, and puts all of the ep-64 traffic on the network, where
# DeepSeek-V3 sends each token to at most 4 nodes and forwards within a node over NVLink, its
# report's section 3.2.2.) That is why MoE systems keep EP inside a node
# (or a fast domain) where they can, and why RL frameworks for MoE models lean on fast all-to-all
# kernels (DeepEP in slime).

# %% [markdown]
# ## Questions
#
# * Ring attention sends `p - 1` key/value blocks per rank per layer. How does that compare with
#   the attention FLOPs each rank does as the sequence grows? Why can the transfer hide behind the
#   compute?
# * A router that sends most tokens to a few experts: what happens to the load per rank, the
#   dropped tokens and the all-to-all time?
#
# * Llama-3-8B has 32 query heads and 8 key/value heads. Up to which degree can Ulysses split
#   its attention, and what do you use beyond it?
#
# <details><summary>Answers</summary>
#
# * With `s` tokens on `p` ranks, each rank holds a block of `s/p` queries and, in turn, each of
#   the `p` blocks of keys and values: it sends `p - 1` blocks of `2 (s/p) d_kv` values per layer,
#   `2 (p-1)/p x s d_kv` in all, linear in `s`. Its attention FLOPs are `4 (s/p) s d` per layer
#   (its queries against all keys), quadratic in `s`. Per block, a rank computes `4 (s/p)^2 d`
#   FLOPs while the next block, `2 (s/p) d_kv` values, travels: the ratio grows with the block
#   length `s/p`, so for long sequences sending the next block takes less time than computing on
#   the current one, and the transfer hides behind the compute (ring attention sends the next
#   block while it computes).
# * The ranks holding the popular experts get most of the tokens: the max / mean load grows. Each
#   expert takes at most `capacity` tokens, so the excess is dropped (those tokens skip the
#   expert, only the residual carries them), which hurts the model. The all-to-all takes as long
#   as its busiest rank's transfer, so its time grows with the imbalance while the other ranks
#   wait. Hence the auxiliary load-balancing losses of GShard and Switch Transformer, and capacity
#   factors above 1.
# * Up to 8: each rank must hold whole key/value heads after the all-to-all (the degree divides
#   the 8 KV heads; replicating KV heads would lift that at the cost of memory and bytes).
#   Beyond it, ring attention, which splits the sequence of any number of heads; in practice
#   both together, Ulysses over the fast link inside a node and a ring across nodes (the
#   "hybrid" or 2-D context parallelism of Megatron-Core and others).
#
# </details>
#
# > **Key numbers and takeaways**
# >
# > * Ring attention: each rank sends `p - 1` key/value blocks per layer; the online-softmax merge
# >   gives full attention up to rounding; a causal mask needs a zigzag layout to balance the
# >   work (max / mean work in the table).
# > * Expert parallelism: two all-to-alls per MoE layer forward (dispatch and combine), two
# >   backward, two more when full recomputation runs the forward again; the busiest rank sets
# >   their time. Beside tensor parallelism (which then needs sequence parallelism), each rank
# >   dispatches only its `1/tp` slice of the sequence (Megatron-Core's all-to-all dispatcher).
# > * A lower capacity factor drops more (token, expert) pairs (the plot: monotone, asserted).
# > * Ulysses: two all-to-alls per attention (four tensors), one device's result; its bytes per
# >   rank stay flat when sequence and degree grow together, ring attention's grow; it stops at
# >   the key/value heads.
# > * At scale, EP's all-to-alls are on the critical path of every MoE layer; across nodes they
# >   take about ten times longer than inside one (DeepSeek-V3, 8k tokens per device: 0.43 s
# >   against 4.4 s per forward and backward).
#
# ## Further reading
#
# * Liu et al. 2023, Ring Attention (arXiv:2310.01889); Jacobs et al. 2023, DeepSpeed-Ulysses
#   (arXiv:2309.14509).
# * Lepikhin et al. 2020, GShard (arXiv:2006.16668); Fedus et al. 2021, Switch Transformers
#   (arXiv:2101.03961).
# * Ultra-Scale Playbook, context and expert parallelism;
#   https://huggingface.co/spaces/nanotron/ultrascale-playbook
# * *How to Scale Your Model* (the JAX scaling book); https://jax-ml.github.io/scaling-book/
#
# ## Exercise
#
# `exercises/ex10_context_expert.py`: write `online_softmax_merge` (how ring attention combines
# the partial softmaxes of each key block) and `dispatch_indices` (the all-to-all's send slots
# of expert parallelism), and check them with `python -m rlm_course grade 10` (or the checks in
# `exercises/ex10_context_expert.ipynb`).
