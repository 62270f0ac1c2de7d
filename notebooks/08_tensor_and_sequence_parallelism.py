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
#    `sbh (34 + 5as/h)`, all divided by `tp` instead of only the parts inside the split matmuls
#    (section 2's last cell derives it: `sbh (10 + 24/t)` with TP alone, `34 sbh / t` with SP, for
#    the paper's GPT layer; `sbh (8 + 25.5/t)` and `33.5 sbh / t` for Llama-3-70B's).

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
# **What sequence parallelism saves.** Chapter 05 counts the activations a layer keeps for the
# backward, in 16-bit bytes, as `sbh (34 + 5as/h)` (Korthikanti et al. 2022, arXiv:2205.05198,
# eq. 1; `s` tokens, `b` sequences, `h` the width, `a` heads); with a fused attention kernel
# (FlashAttention) the `5as/h` of scores, softmax and dropout mask is recomputed, not kept. Split
# the `34 sbh` by where it lives:
#
# * **inside TP's split matmuls, `24 sbh`**: attention's Q, K and V (`2 + 2 + 2`), the attention
#   output before the row-parallel projection (`2`), and the MLP's hidden tensor before and after
#   its activation (`8 + 8`, the paper's 4h MLP), which each rank holds for its heads or columns
#   only: divided by `t`;
# * **around them, `10 sbh`**: the two layer norms' inputs (`2 + 2`), the inputs of the
#   column-parallel QKV and first MLP matmuls (`2 + 2`), the dropout masks after the attention
#   and MLP blocks (`1 + 1`): with TP alone every rank holds all of them.
#
# So TP alone keeps `sbh (10 + 24/t)` per layer; sequence parallelism splits the second group
# along the sequence (the all-gather before a column-parallel matmul and the reduce-scatter after
# a row-parallel one replace TP's all-reduce, section 2) and keeps `34 sbh / t` (the paper's
# Table 2). Llama-3-70B's layer splits the same way with its own sizes
# (`layer_activation_values`): inside, Q and the attention output (`2 + 2` for its 64 heads of
# 128), K and V for its 8 key/value heads (`0.25 + 0.25`), the gated MLP's gate, up-projection
# and their product (`3 x 7` for its 28,672-wide MLP, `3.5h`): `25.5 sbh`; around, the norms'
# and the two blocks' inputs, `8 sbh` (no dropout masks in fine-tuning). Per layer with an
# 8,192-token micro-batch:

# %%
from rlm_course.cost.anatomy import layer_activation_values
from rlm_course.cost.architectures import get_spec

llama70 = get_spec("llama-3-70b")
sbh = 8192 * 1 * llama70.d_model
around, inside = (2 * v / llama70.d_model for v in layer_activation_values(llama70))
rows = [[t, f"{(around + inside) * sbh / 1e9:.2f}", f"{sbh * (around + inside / t) / 1e9:.2f}",
         f"{(around + inside) * sbh / t / 1e9:.2f}",
         f"{(around + inside / t) / ((around + inside) / t):.1f}x"] for t in (1, 2, 4, 8)]
print(f"Llama-3-70B: {around:g} s b h bytes around TP's matmuls, {inside:g} inside them")
print(format_table(rows, ["tp", "no TP GB", "TP alone GB", "TP + SP GB", "SP saves"]))
assert (around, inside) == (8, 25.5)  # 11.2 sbh at t = 8, against 33.5/8 = 4.2 sbh with SP

# %% [markdown]
# ## 3. Seconds at scale: TP stays inside a node, and TP in generation
#
# A TP layer's collectives sit *between* the matmuls that need their result, so they add to
# the step rather than hide behind it. Per token of a layer, the matmuls cost `2 x weights / tp`
# FLOPs (forward) and the all-reduces move `2 x 2 (tp-1)/tp x d_model x 2` bytes (bf16). Both
# grow with the tokens, so their ratio depends only on the shapes and the link: the
# **communication roofline of TP**. For an MLP block with `m` matrices of `d x d_ff`,
#
#     compute >= communication  <=>  d_ff / tp  >=  (tp-1)/tp x b x peak / (m beta)
#
# (`rlm_course.cost.comm.min_ffn_per_shard`): about 1,300 hidden units per shard over an
# H100's NVLink at `tp = 8`, but 11,500 over the network. Llama-3-70B's 28,672 units give 3,584
# per shard at `tp = 8`: comfortably above the threshold inside a node, below it across nodes.
# TP's collectives sit between the matmuls and cannot overlap them, so at the threshold they are
# still half of the step: "compute >= communication", not "communication hidden".

# %%
from rlm_course.cost.architectures import get_spec
from rlm_course.cost.hardware import get_device
from rlm_course.cost import comm

h100 = get_device("H100-SXM-80GB")
fabric = comm.Fabric.of(h100)
spec70 = get_spec("llama-3-70b")
rows = []
for tp, where, link in ((8, "one node: NVLink", fabric.ring_link(8)),
                        (8, "8 nodes: network, 1 card each", fabric.ring_link(8, stride=8)),
                        (16, "2 nodes: network, 8 cards each", fabric.ring_link(16))):
    layer = comm.tensor_parallel_layer(spec70, h100, tp, 8192, link, mfu=0.5)
    rows.append([tp, where, f"{layer['compute'] * 1e3:.2f}", f"{layer['comm'] * 1e3:.2f}",
                 f"{layer['comm'] / layer['step']:.0%}"])
print(format_table(rows, ["tp", "group", "matmuls ms", "all-reduces ms", "communication share"]))
for name, beta in (("NVLink", 450e9), ("network", 50e9)):
    print(f"{name}: compute >= communication above d_ff / tp = "
          f"{comm.min_ffn_per_shard(h100.peak_flops, beta, 8):,.0f} (Llama-3-70B: "
          f"{spec70.d_ff // 8:,})")
assert comm.min_ffn_per_shard(h100.peak_flops, 450e9, 8) < spec70.d_ff / 8 < \
    comm.min_ffn_per_shard(h100.peak_flops, 50e9, 8)

# %% [markdown]
# (One layer's forward and backward on 8,192 tokens at half of peak; the table's "8 nodes" row
# puts each of the 8 TP ranks on its own node, as a mesh with TP as its slowest axis would, and
# its rings cross on one card a node. The "2 nodes" row holds 8 ranks on each node, whose rings
# run on the node's 8 cards together (chapter 07's `ring_link`): bandwidth near NVLink's, but
# each of an all-reduce's 30 ring steps pays the network's latency, and each rank has half a
# TP-8 rank's matmuls: 41% of the layer in collectives, against 18% inside one node.)
#
# **TP in generation.** An RL rollout splits the model into *replicas* of `tp` devices each.
# Every decode step of a replica reads its whole share of the weights (chapter 05) and, under
# TP, runs two all-reduces per layer on `batch x d_model` activations: 160 small collectives per
# token for Llama-3-70B. Inside a node, inference engines do not run NCCL's ring for these: vLLM's
# and SGLang's custom all-reduce let every rank read its peers' buffers over NVLink, one latency
# per call instead of one per ring step (`rlm_course.cost.comm.engine_all_reduce_seconds`, up to
# vLLM's 8 MiB limit); across nodes NCCL's tree pays the network's latency. Wider TP splits the
# weight reads, but pays more collectives and leaves fewer replicas.

# %%
from rlm_course.cost.layouts import choose_generation_tp, replica_decode_step_seconds

rows = []
for tp in (2, 4, 8):
    for batch in (1, 64):
        step = replica_decode_step_seconds(spec70, h100, tp, batch, 4096, fabric.link(tp), 0.7)
        collectives = comm.decode_tp_comm(spec70, tp, batch, fabric.link(tp),
                                          in_node=tp <= h100.devices_per_node).seconds
        rows.append([tp, batch, f"{step * 1e3:.2f}", f"{collectives * 1e3:.2f}",
                     f"{collectives / step:.0%}"])
print(format_table(rows, ["tp", "sequences", "decode step ms", "of which all-reduces ms",
                          "share"]))
best, estimates = choose_generation_tp(spec70, h100, 64, 1024, 4096, fabric.link(8))
print("rollout of 1,024 sequences of 4,096 tokens on 64 H100s, seconds by tp:",
      {tp: round(s) for tp, s in estimates.items()}, "-> tp", best)
assert 1 not in estimates  # 141 GB of weights do not fit one 80 GB device

# %% [markdown]
# The table's last column is the price of splitting the weights: the all-reduces' share of a
# step. Which TP is best for a rollout depends on the batch per device and on where the replica
# sits: with few sequences per device, decode is memory-bound and splitting the weight reads
# wins; with many, the KV caches and the compute dominate, and a wide TP helps only by the KV
# room its split weights free (fewer waves), as long as its all-reduces stay inside a node (the
# estimate `choose_generation_tp` makes, chapter 14's second exercise). RL frameworks' advice,
# "the smallest TP that fits, and more replicas" (verl's performance guide), comes from engines
# whose per-step costs beyond this roofline (scheduling, sampling; chapter 14 calibrates them)
# grow with each replica's batch.

# %% [markdown]
# ## Questions
#
# * The bytes per rank grow as `2(tp-1)/tp`: nearly flat in `tp`. Why, then, is tensor parallelism
#   kept inside one node (NVLink) in practice? (Hint: these collectives sit on the critical path of
#   every layer, twice per direction.)
# * With sequence parallelism the layer-norm weights' gradients are partial sums over each rank's
#   positions. What must happen to them before the optimizer step?
#
# * A rollout of 64 sequences of 4,096 tokens runs on 64 H100s. Which TP degree does
#   `choose_generation_tp` pick for Llama-3-8B, and which for 65,536 sequences? Why do they
#   differ?
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
# * 64 sequences: tp 8. With one sequence per device, a decode step is memory-bound: the time is
#   the weight reads, and eight devices read an eighth each. 65,536 sequences: tp 8 again, by a
#   smaller margin (the next cell prints both). With a thousand sequences per device the KV
#   caches and the compute dominate and do not shrink with TP, but the engine's one-shot
#   all-reduce keeps a wide TP's collectives cheap inside a node, and the weights it splits leave
#   more room for KV caches: fewer waves of sequences. Priced with NCCL's ring instead (one
#   latency per ring step), the extra collectives would tip the choice to a narrower TP; across
#   nodes they would too.
#
# </details>

# %%
spec8 = get_spec("llama-3-8b")
few = choose_generation_tp(spec8, h100, 64, 64, 4096, fabric.link(8))[0]
many = choose_generation_tp(spec8, h100, 64, 65536, 4096, fabric.link(8))[0]
print(f"llama-3-8b: 64 sequences -> tp {few}; 65,536 sequences -> tp {many}")
assert (few, many) == (8, 8)
#
# > **Key numbers and takeaways**
# >
# > * Megatron TP: column-parallel then row-parallel, one all-reduce per pair: 2 per layer
# >   forward, 2 backward, each of `b s h` activations; every rank sends `2(tp-1)/tp` of them per
# >   all-reduce (the `bytes/rank` column equals `layer_bytes_per_rank`, asserted).
# > * Sequence parallelism: the same bytes as reduce-scatter + all-gather; norms, dropout and
# >   residuals on `1/tp` of the positions, so all of a layer's activations divide by `tp`:
# >   `34 sbh / t` per layer against `sbh (10 + 24/t)` with TP alone (13 sbh at `t = 8`).
# > * TP results equal one device's up to float32 rounding of sums in another order.
# > * TP's compute is at least its communication when `d_ff / tp >= (tp-1)/tp x b x peak /
# >   (m beta)`: about 1,300 hidden units per shard on H100 NVLink at `tp = 8`, 11,500 across
# >   nodes; its collectives cannot overlap, so keep TP in a node.
# > * In generation, TP costs two all-reduces per layer per token, cheap inside a node with an
# >   engine's one-shot all-reduce, dear across nodes: the right TP depends on the sequences per
# >   device and on where the replica sits.
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
#
# ## Exercise
#
# `exercises/ex08_tensor_parallel.py`: write `row_parallel_linear` (section 1's split, its
# all-reduce, equal to one device) and check it with `python -m rlm_course grade 08` (or the
# checks in `exercises/ex08_tensor_parallel.ipynb`). Chapter 14's exercise file has this
# chapter's generation trade-off as its second exercise: `choose_generation_tp` in
# `exercises/ex14_plan_a_cluster.py`, `python -m rlm_course grade 14`.
