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
# # 08 · Tensor and sequence parallelism
#
# Megatron-LM (Shoeybi et al. 2019, arXiv:1909.08053) splits each matmul pair of a block so that
# it needs one collective per direction. The first matmul is **column-parallel**: rank `r` holds
# some output features (some heads, some MLP hidden units) and computes them completely. The second
# is **row-parallel**: rank `r` holds the matching input features and produces a *partial sum* of
# the output; one all-reduce adds the partial sums. A block costs two all-reduces forward and two
# backward, of `batch x seq x d_model` activations.
#
# Sequence parallelism (Korthikanti et al. 2022) replaces each all-reduce by a reduce-scatter and
# each copy by an all-gather along the sequence: same bytes, but norms and residuals run on
# `1/tp` of the positions.
#
# **Learning objectives.** After this chapter you can:
#
# 1. split a linear layer by columns or by rows and say which collective each split needs;
# 2. run a transformer block with tensor parallelism, with and without sequence parallelism, and
#    check its forward and backward against one device;
# 3. count the collectives and bytes per layer, and say why TP stays inside a node;
# 4. say what sequence parallelism saves: the activations of chapter 05's per-layer count,
#    `sbh (34 + 5as/h)`, all divided by `tp` instead of only the parts inside the split matmuls.

# %%
# NBVAL_IGNORE_OUTPUT
import torch

from rlm_course.utils import seed_everything

seed_everything(0)
print(torch.__version__)

# %% [markdown]
# ## 1. A row-parallel linear layer

# %%
from rlm_course.numerics import relative_error, reorder_tolerance
from rlm_course.parallel.tensor_parallel import row_parallel_linear
from rlm_course.parallel.world import World

x, w, b = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)
world = World(4)
out = row_parallel_linear(world, list(x.chunk(4, dim=-1)), list(w.chunk(4, dim=-1)), b)
error = relative_error(out[0], x @ w.T + b)
print(f"relative |TP - one device|: {error:.1e} | bytes sent per rank: {world.sent}")
assert error <= reorder_tolerance(torch.float32, terms=8)

# %% [markdown]
# The four partial sums are added by the all-reduce, not inside one matmul: the same 8 products
# summed in another order, so the result agrees with one device up to float32 rounding (about
# 1e-7 relative), not bit for bit, and the exact last bits depend on the machine. The check allows
# the rounding bound of a sum of that length (`rlm_course.numerics.reorder_tolerance`), so any
# real mistake fails and no machine's rounding does.
#
# ## 2. A whole block, forward and backward

# %%
from rlm_course.lm.model import Block, ModelConfig
from rlm_course.parallel.tensor_parallel import (
    TensorParallelBlock,
    layer_bytes_per_rank,
    shard_sequence,
)
from rlm_course.utils import format_table

config = ModelConfig(vocab_size=10, n_layer=1, n_head=8, d_model=64, max_seq_len=64)
block = Block(config)
x = torch.randn(4, 32, 64, requires_grad=True)
reference = block(x, None)
reference.sum().backward()
rows, worlds = [], {}
for sp in (False, True):
    for tp in (2, 4, 8):
        world = World(tp)
        parallel = TensorParallelBlock(block, world, sequence_parallel=sp)
        xs = ([c.detach().clone().requires_grad_(True) for c in shard_sequence(x, tp)] if sp
              else [x.detach().clone().requires_grad_(True) for _ in range(tp)])
        outs = parallel(xs)
        sum(o.sum() for o in outs).backward()
        full = torch.cat(outs, 1) if sp else outs[0]
        error = relative_error(full, reference)
        grad = torch.cat([s.fc_w.grad for s in parallel.shards])
        grad_error = relative_error(grad, block.mlp.fc.weight.grad)
        # longest sum: the MLP's 256 hidden units (a weight gradient sums 128 rows), 6 chained
        assert max(error, grad_error) <= reorder_tolerance(torch.float32, terms=256, depth=6)
        assert world.sent[0] == layer_bytes_per_rank(4, 32, 64, tp)
        collectives = sorted({e.name for e in world.events})
        rows.append(["TP+SP" if sp else "TP", tp, f"{error:.1e}", f"{grad_error:.1e}",
                     world.sent[0], ", ".join(collectives)])
        worlds[(sp, tp)] = world
print(format_table(rows, ["strategy", "degree", "output rel. error", "grad rel. error", "bytes/rank",
                          "collectives"]))

# %%
from rlm_course.tools.plots import plot_rank_timeline

plot_rank_timeline(worlds[(True, 4)].events, title="TP+SP, degree 4: one block forward + backward");

# %% [markdown]
# ## Questions
#
# * The bytes per rank grow as `2(tp-1)/tp`: nearly flat in `tp`. Why, then, is tensor parallelism
#   kept inside one node (NVLink) in practice? (Hint: these collectives sit on the critical path of
#   every layer, twice per direction.)
# * With sequence parallelism the layer-norm weights' gradients are partial sums over each rank's
#   positions. What must happen to them before the optimizer step?
#
# <details><summary>Answers</summary>
#
# * Every layer waits for its collectives: two all-reduces (or reduce-scatter/all-gather pairs)
#   forward and two backward, each of `batch x seq x d_model` activations, between the matmuls
#   that need their result. Nothing else can run meanwhile, so the time is `alpha + bytes / beta`
#   per collective, four times per layer, on the critical path. The bytes per rank barely change
#   with `tp`, but the link does: inside a node GPUs talk over NVLink, many times faster than the
#   network between nodes (compare `intra_node_bandwidth` and `inter_node_bandwidth` in
#   `python -m rlm_course hardware`). Across nodes the same traffic would take far longer than the
#   matmuls it splits.
# * They must be summed over the ranks of the tensor-parallel group (an all-reduce of these small
#   gradients) before the optimizer step: each rank saw only its `1/tp` of the positions, and the
#   weights are replicated, so every rank must apply the same full gradient (Megatron-LM does this
#   for its sequence-parallel parameters).
#
# </details>
#
# > **Key numbers and takeaways**
# >
# > * Megatron TP: column-parallel then row-parallel, one all-reduce per pair: 2 per layer
# >   forward, 2 backward, each of `b s h` activations; every rank sends `2(tp-1)/tp` of them per
# >   all-reduce (the `bytes/rank` column equals `layer_bytes_per_rank`, asserted).
# > * Sequence parallelism: the same bytes as reduce-scatter + all-gather; norms, dropout and
# >   residuals on `1/tp` of the positions, so all of a layer's activations divide by `tp`.
# > * TP results equal one device's up to float32 rounding of sums in another order.
#
# ## Further reading
#
# * Shoeybi et al. 2019, Megatron-LM (arXiv:1909.08053); Korthikanti et al. 2022, "Reducing
#   Activation Recomputation in Large Transformer Models" (arXiv:2205.05198): sequence
#   parallelism and the activation count.
# * Ultra-Scale Playbook, tensor and sequence parallelism;
#   https://huggingface.co/spaces/nanotron/ultrascale-playbook
# * *How to Scale Your Model* (the JAX scaling book); https://jax-ml.github.io/scaling-book/
# * Stanford CS336, lectures and assignment on parallelism; https://github.com/stanford-cs336
