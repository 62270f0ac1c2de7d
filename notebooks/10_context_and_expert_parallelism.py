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
# reasoning traces (tens of thousands of tokens) make this the way to score and train on them.
#
# **Expert parallelism** spreads the experts of a mixture-of-experts layer over ranks: a router
# sends each token to its `k` best experts, an all-to-all carries the tokens to the experts' ranks
# and a second one brings the results back; experts take at most `capacity` tokens, the rest are
# dropped.
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
# ## Questions
#
# * Ring attention sends `p - 1` key/value blocks per rank per layer. How does that compare with
#   the attention FLOPs each rank does as the sequence grows? Why can the transfer hide behind the
#   compute?
# * A router that sends most tokens to a few experts: what happens to the load per rank, the
#   dropped tokens and the all-to-all time?
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
#
# </details>
#
# > **Key numbers and takeaways**
# >
# > * Ring attention: each rank sends `p - 1` key/value blocks per layer; the online-softmax merge
# >   gives full attention up to rounding; a causal mask needs a zigzag layout to balance the
# >   work (max / mean work in the table).
# > * Expert parallelism: two all-to-alls per MoE layer forward (dispatch and combine), two
# >   backward; the busiest rank sets their time.
# > * A lower capacity factor drops more (token, expert) pairs (the plot: monotone, asserted).
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
