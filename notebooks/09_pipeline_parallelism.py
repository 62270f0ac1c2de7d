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
# says, for each device, in which order it runs the forwards (F) and backwards (B):
#
# * GPipe: all forwards, then all backwards. Bubble `(p-1)/(m+p-1)` of the time; every
#   micro-batch's activations are alive at once.
# * 1F1B: after a short warm-up, alternate one forward and one backward. Same bubble, but at most
#   `p` micro-batches in flight.
# * Interleaved 1F1B: each device holds `v` chunks of layers; the bubble shrinks to `(p-1)/(v m)`
#   of the ideal time, for `v` times more point-to-point traffic.

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
print(format_table(rows, ["schedule", "bubble (timeline)", "bubble (formula)",
                          "chunks in flight on device 0", "makespan"]))
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
plt.xlabel("micro-batches m"); plt.ylabel("bubble fraction"); plt.legend(fontsize=8);

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
# ## Questions
#
# * In an RL step, the policy update runs many micro-batches; the rollout decodes token by token.
#   Which of the two suffers more from a pipeline's bubble, and why?
# * Interleaving halves the bubble with `v = 2`. What does it cost?
