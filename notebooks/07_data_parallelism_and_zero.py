# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
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

# %%
from rlm_course.parallel.world import Link, World
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

# %%
from rlm_course.parallel.data_parallel import DataParallel, bytes_sent_per_step, flat_params

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 32))
x, y = torch.randn(24, 32), torch.randn(24, 32)


def loss_fn(m, batch):
    return ((m(batch[0]) - batch[1]) ** 2).mean()


reference = copy.deepcopy(model)
optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2)
for _ in range(3):
    optimizer.zero_grad()
    loss_fn(reference, (x, y)).backward()
    optimizer.step()

P = 4
rows, memory, worlds = [], {}, {}
for stage in (0, 1, 2, 3):
    world = World(P, link)
    dp = DataParallel(world, model, stage, lr=1e-2)
    for _ in range(3):
        dp.step(list(zip(x.chunk(P), y.chunk(P))), loss_fn)
    error = (dp.parameters() - flat_params(reference)).abs().max().item()
    assert error < 1e-5 and world.sent[0] == 3 * bytes_sent_per_step(stage, dp.padded, P)
    name = "DP" if stage == 0 else f"ZeRO-{stage}"
    memory[name] = dp.memory_per_rank()
    worlds[name] = world
    rows.append([name, f"{error:.1e}", world.sent[0] // 3, sum(dp.memory_per_rank().values())])
print(format_table(rows, ["strategy", "max |param - one device|", "bytes sent / rank / step",
                          "state bytes / rank"]))

# %%
from rlm_course.plots import plot_memory_per_rank

plot_memory_per_rank(memory, title=f"model state per rank, {P} ranks");

# %% [markdown]
# ZeRO-1 and -2 send exactly what DP sends (a reduce-scatter plus an all-gather is an
# all-reduce) and hold less; ZeRO-3 gathers the parameters twice (forward and backward) and so
# sends 1.5x as much. The timelines show when each rank talks:

# %%
from rlm_course.plots import plot_rank_timeline

plot_rank_timeline([e for e in worlds["ZeRO-3"].events if e.end <= worlds["ZeRO-3"].clock[0] / 3],
                   title="ZeRO-3, one step: gather, gather, reduce-scatter");

# %% [markdown]
# ## Questions
#
# * A 7.5B-parameter model with mixed-precision Adam on 64 GPUs: how many GB per GPU does each
#   stage hold? (`rlm_course.anatomy.zero_model_state_bytes`; the ZeRO paper's Figure 1 says 120,
#   31.4, 16.6 and 1.9.)
# * Why does the ring all-reduce's time per rank stop growing with `p` for large messages, while
#   the tree's keeps growing?
