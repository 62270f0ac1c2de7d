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
# # 11 · Real distributed runs
#
# Chapters 07-10 split TinyGPT over *simulated* ranks inside one process: every collective
# computed the right result, counted its bytes and advanced a clock by `alpha + bytes / beta`.
# Now the ranks are **real processes** joined by `torch.distributed`: gloo over TCP on this CPU,
# NCCL over NVLink and InfiniBand on GPUs. The same programs run from this notebook
# (`torch.multiprocessing`) and from a shell (`torchrun`, on one machine or several).
#
# Two claims carry over from the simulations and are checked here on real processes: every
# strategy gives **one device's results** (up to rounding), and it sends **the bytes the
# simulator's formulas predict**. What the simulator could only assume, the real runs measure:
# how long each collective takes, how much of a step is communication, and where a data-parallel
# GRPO step spends its time on each rank.
#
# **Learning objectives.** After this chapter you can:
#
# 1. launch a process group from a notebook and from a shell, and read what happens when a rank
#    fails;
# 2. measure collectives the way nccl-tests does (algorithm and bus bandwidth), fit chapter 07's
#    alpha-beta model to them and say where it holds;
# 3. run DDP, FSDP2, tensor parallelism (DTensor) and pipeline schedules on TinyGPT, check them
#    against one device, count the bytes they send and measure their communication share;
# 4. run data-parallel GRPO: shard the prompts by rank without splitting a group, keep
#    `token-mean` losses exact, and read a per-rank timeline;
# 5. say what changes on GPUs: NCCL, NVLink against the network, overlap and bucket sizes;
# 6. write a ring all-reduce from send/recv and DDP's gradient bucketing yourself.

# %%
# NBVAL_IGNORE_OUTPUT
import os
import tempfile
import time

import torch

from rlm_course.distributed.launch import cores
from rlm_course.utils import format_table, seed_everything

seed_everything(0)
print(torch.__version__, f"gloo: {torch.distributed.is_gloo_available()}, "
      f"CUDA: {torch.cuda.is_available()}, cores: {cores()}")

# %% [markdown]
# ## 1. Launching ranks
#
# `launch(worker, nprocs)` starts `nprocs` processes; each joins one process group (its rank, the
# world size, a rendezvous on a free local port), runs `worker(ctx, ...)` with one intra-op thread
# and hands back what it returns. Three rules:
#
# * **a worker lives in a module**: a new process imports it by name, so a function typed into a
#   notebook cell cannot be started (the launcher says so);
# * **the backend follows the device**: gloo for CPU tensors, NCCL for CUDA tensors (one GPU per
#   rank); NCCL on a machine without CUDA is an error before anything starts;
# * **one thread per rank**: 2 ranks on 2 cores use the machine; 4 ranks *oversubscribe* it (they
#   take turns on the cores, so every timing at 4 ranks here is slower than 4 real devices).
#
# `rlm_course.distributed.demo.hello` all-reduces `rank + 1`:

# %%
from rlm_course.distributed.demo import hello
from rlm_course.distributed.launch import launch

start = time.perf_counter()
results = launch(hello, 2)
print(format_table([[r["rank"], r["pid"], r["backend"], r["threads"], r["sum"]] for r in results],
                   ["rank", "pid", "backend", "threads", "all-reduce of rank + 1"]))
print(f"{time.perf_counter() - start:.1f} s, including the first start of the process server")
assert [r["sum"] for r in results] == [3.0, 3.0]


def typed_in_a_cell(ctx):
    return ctx.rank


try:
    launch(typed_in_a_cell, 2)
except ValueError as err:
    print("refused:", err)

# %% [markdown]
# ### When a rank fails
#
# A distributed program must never hang because one rank died. Each collective waits at most
# `timeout` seconds for its peers (`init_process_group(timeout=...)`); a rank that dies closes its
# sockets, so its peers fail at once. The launcher then gives the survivors `grace` seconds to
# stop on their own, stops the rest, and raises `DistributedError` naming the rank that failed
# first, with every rank's traceback.
#
# `demo.faulty` all-reduces in a loop; below, rank 1 raises, and then rank 1 is killed from
# outside by its process id while rank 0 waits in an all-reduce.

# %%
import signal

from rlm_course.distributed.demo import faulty
from rlm_course.distributed.launch import DEFAULT_GRACE, DistributedError, start

try:
    launch(faulty, 2, kwargs=dict(how="raise"))
except DistributedError as err:
    print("\n".join(str(err).splitlines()[:3]))
    assert err.first_rank == 1

with tempfile.TemporaryDirectory() as folder:
    job = start(faulty, 2, kwargs=dict(how="none", ready_file=f"{folder}/ready"))
    while not all(os.path.exists(f"{folder}/ready.{r}") for r in range(2)):
        time.sleep(0.02)
    killed = time.perf_counter()
    os.kill(job.pids[1], signal.SIGKILL)
    try:
        job.join()
    except DistributedError as err:
        print("\n".join(str(err).splitlines()[:2]))
        print(f"-> stopped {time.perf_counter() - killed:.2f} s after the kill")
        # it ends: the peers see the dead rank, or the launcher stops them after its grace
        # period (a busy machine can need it); a hang would never get here
        assert err.first_rank == 1 and time.perf_counter() - killed < DEFAULT_GRACE + 20

# %% [markdown]
# ### The same workers under `torchrun`
#
# From a shell, `torchrun` starts the processes and sets `RANK`, `WORLD_SIZE` and the rendezvous
# address in their environment; `python -m rlm_course.distributed <worker>` reads them and runs
# the same worker. `python -m rlm_course distributed <worker> --nproc 2` prints and runs the
# single-machine command; the same worker runs on several machines with `--nnodes` and a
# rendezvous endpoint (the command is run on every machine):

# %%
import subprocess
import sys

from rlm_course.distributed.torchrun import torchrun_command

print(" ".join(["torchrun", *torchrun_command("grpo", 8, ["--task", "addition"], nnodes=2,
                                              endpoint="HOST:29400")[3:]]))
done = subprocess.run([sys.executable, "-m", "rlm_course", "distributed", "hello", "--nproc", "2"],
                      capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
print(done.stderr.splitlines()[0])
print("\n".join(done.stdout.splitlines()[:2]))
assert done.returncode == 0

# %% [markdown]
# ## 2. Collectives, measured
#
# nccl-tests' conventions: the **message size** `S` is the all-reduce buffer, the all-gather
# *output*, the reduce-scatter *input*, the broadcast buffer, each rank's all-to-all buffer, the
# send/recv message. Each size runs warm-up calls, then timed calls after a barrier; a call lasts
# until its slowest rank is done; we keep the median. **Algorithm bandwidth** is `S / t`; **bus
# bandwidth** multiplies it by the share of `S` a rank must move in the best algorithm
# (all-reduce `2(p-1)/p`, all-gather, reduce-scatter, all-to-all `(p-1)/p`, broadcast and
# send/recv 1), which makes collectives and rank counts comparable: it is the speed of the links.
#
# Then we fit chapter 07's model `t = a alpha + b S / beta` per collective, with `a` and `b` read
# off the simulated `World` itself (ring all-reduce, all-gather and reduce-scatter, tree
# broadcast, pairwise all-to-all), by least squares on *relative* errors (so 4 B and 64 MiB weigh
# alike). About half a minute: 4 B to 64 MiB, six collectives, 2 and 4 processes.

# %%
from rlm_course.distributed.collectives import bench_collectives, plot_fit

bench = bench_collectives(repeats=5, ranks=(2, 4), log=lambda *args: None)
rows = []
for p, fits in bench["fits"].items():
    for name, fit in fits.items():
        rows.append([p, name, f"{fit['alpha'] * 1e6:.0f}", f"{fit['beta'] / 1e9:.2f}",
                     f"{bench['peak_bus_bandwidth'][p][name] / 1e9:.2f}"])
print(format_table(rows, ["ranks", "collective", "fitted alpha us", "fitted beta GB/s",
                          "best bus bandwidth GB/s"]))
plot_fit(bench["rows"]);

# %%
import statistics

wire = {(r["ranks"], r["collective"]): r["wire_ratio"] for r in bench["rows"]
        if r["bytes"] >= 4 * 2**20 and r["wire_ratio"] is not None}
errors = [abs(r["predicted"] / r["seconds"] - 1) for r in bench["rows"]]
print(f"fitted World against measurement: median error {statistics.median(errors):.0%} over "
      f"{len(errors)} (collective, size, ranks) points")
if wire:  # Linux: bytes the process wrote to its sockets, over the World's bytes
    print(format_table([[p, n, f"{v:.2f}"] for (p, n), v in sorted(wire.items())][:12],
                       ["ranks", "collective (4 MiB and up)", "socket bytes / World bytes"]))
assert all(r["seconds"] > 0 and r["busbw"] > 0 for r in bench["rows"])

# %% [markdown]
# What the fit says. `alpha` is a few hundred microseconds here: a gloo call crosses Python, a
# TCP loopback and the operating system's scheduler (NCCL over NVLink: a few us per ring step,
# about 10-20 us for a small all-reduce over 8 GPUs). `beta` is a few GB/s at 2 processes and
# drops at 4: four processes share two cores, and on loopback every
# byte "sent" is a copy made by a CPU that is also busy reducing. A single `(alpha, beta)` per
# collective fits most sizes within tens of percent; the misses are small messages, where the
# time is noise around `alpha`, and the largest, where caches and the scheduler enter.
#
# The socket bytes expose the backend's algorithms: all-reduce, all-gather, broadcast and
# all-to-all write what the World's formulas say (plus ~0.5 KB of headers per call), but
# **gloo's reduce-scatter writes as much as a whole all-reduce**, twice the ring's `(p-1)/p`:
# its fitted `beta` is half of the others', an *effective* bandwidth that absorbs the algorithm.
# NCCL runs a true ring reduce-scatter, which is why FSDP and sequence parallelism are cheaper on
# GPUs than this machine suggests.

# %% [markdown]
# ## 3. Every strategy equals one device, and sends the formula's bytes
#
# `strategies.equivalence_worker` trains a 32-wide TinyGPT for three AdamW steps with each
# strategy, using torch's own implementations: `DistributedDataParallel`; FSDP2's `fully_shard`
# on every block and the root; DTensor's `parallelize_module` with Megatron's column/row split
# (and `SequenceParallel` norms for TP+SP); `torch.distributed.pipelining` with `ScheduleGPipe`,
# `Schedule1F1B`, `ScheduleInterleaved1F1B` and `ScheduleInterleavedZeroBubble`. In float64 (the
# point is the algorithm), the losses, the first step's gradients and the final parameters are
# compared with one process training on the whole batch, within tolerances derived from the
# format (`rlm_course.numerics`: Higham's bound for sums in another order, then Adam).
#
# During the last step, a `TorchDispatchMode` (the mechanism of torch's `CommDebugMode`) records
# every collective and send/recv that reaches the dispatcher, also those DDP's C++ reducer
# issues during backward. Each call's bytes per rank follow the World's ring conventions, and are
# compared with the chapters' formulas: chapter 07's `bytes_sent_per_step` (DDP: stage 0; FSDP2:
# stage 3 on FSDP's padded parameters), chapter 08's `layer_bytes_per_rank` per block (TP; TP+SP
# adds the model's entry into and exit from the sequence layout and the all-reduce of the norms'
# partial gradients), chapter 09's simulated pipeline on a `World` (PP).

# %%
from rlm_course.distributed import strategies as S

checks = {}
for p in (2, 4):
    setup = S.check_setup(p)
    per_rank = launch(S.equivalence_worker, p, args=(S.fitting(setup, p), setup),
                      kwargs=dict(progress=True))
    checks[p] = S.check_equivalence(per_rank, setup)
    print(f"\n{p} ranks, TinyGPT with {setup.n_layer} blocks of width {setup.d_model}, batch "
          f"{setup.batch} x {setup.seq_len}, float64")
    print(S.format_equivalence(checks[p]))
    assert all(r["ok"] and r["bytes_ok"] for r in checks[p])

# %% [markdown]
# Every row is equal to one device to about `1e-15` (the tolerance is `1e-12`; Adam's bound on
# parameters is larger because a gradient within rounding of zero can move a parameter by up to
# `lr`), and sends exactly the predicted bytes. Notice the counts: TP sends `4` all-reduces per
# block (two forward, two backward); TP+SP replaces each by an all-gather and a reduce-scatter of
# the same bytes, plus the norms' gradient all-reduces; pipelines send one activation forward and
# one gradient back per micro-batch and stage boundary, and the interleaved schedules have twice
# the boundaries. FSDP2 sends 1.5x DDP's bytes: ZeRO-3's price.
#
# The socket bytes (`wire`, Linux) tell the same story as the collectives benchmark: where a
# strategy reduce-scatters (FSDP2, TP+SP), gloo writes more than the ring would:

# %%
print(format_table([[r["label"], p, f"{r['sent'][0]:,}", f"{r['wire'][0]:,}",
                     f"{r['wire'][0] / r['sent'][0]:.2f}"]
                    for p in checks for r in checks[p] if r["wire"][0] is not None],
                   ["strategy", "ranks", "counted bytes (rank 0)", "socket bytes",
                    "socket / counted"]))

# %% [markdown]
# ### Step time and communication share
#
# Now the course's model width (128, 4 heads, 32 positions, 8 blocks) in float32, 16 sequences
# per step. For each strategy: the step time (the slowest rank, median of three steps), and the
# share of a step that each rank's backend spends communicating, read from `torch.profiler`'s
# `gloo:*` records (waiting for a slower peer counts: that is communication time too). "vs one
# process" compares with one process (one thread) training on the whole batch.

# %%
timings = {}
for p, names in ((2, None), (4, ["ddp", "fsdp2", "tp", "pp_1f1b"])):
    setup = S.learner_setup(p)
    per_rank = launch(S.timing_worker, p, args=(names or S.fitting(setup, p), setup),
                      kwargs=dict(progress=True))
    timings[p] = S.summarize_timing(per_rank)
rows = [[r["label"], r["ranks"], f"{r['seconds'] * 1e3:.0f}", f"{r['comm_share']:.0%}",
         f"{r['vs_one_process']:.2f}"] for p in timings for r in timings[p]]
print(format_table(rows, ["strategy", "ranks", "step ms", "communication share",
                          "step time vs one process"]))
assert all(0 <= r["comm_share"] <= 1 and r["seconds"] > 0 for p in timings for r in timings[p])

# %% [markdown]
# Read it with the machine in mind. Two ranks on two cores can at best halve one process's
# compute, and only if nothing else runs: when other programs share the cores, the ranks also
# wait for the CPU (compare "vs one process" with 0.5). DDP adds one all-reduce of the gradients
# per step. TP all-reduces every block's activations four times: with `alpha` in the hundreds of
# microseconds, many small messages cost more than their bytes. The pipelines' "communication"
# is mostly *waiting* for the neighbouring stage: the bubble made visible, larger with two
# stages per rank. At 4 ranks every process gets half a core at best: the step times grow, and
# so does the communication share (a peer that is not running cannot answer).

# %% [markdown]
# ## 4. Data-parallel GRPO on real processes
#
# `rlm_course.distributed.grpo.DistributedRLTrainer` is chapter 02's `RLTrainer` on one rank, not
# a second loop:
#
# * each step draws **the single-process step's prompts** (same seed) and rank `r` keeps the
#   `r`-th of `p` slices, so **a group is never split**: rewards and group advantages stay on
#   the rank, with no communication;
# * each rank samples with **its own seed** (the same seed on every rank would draw the same
#   random numbers for different prompts);
# * the policy is wrapped in **DDP**, so the gradients are averaged over ranks during backward.
#   For GRPO's `seq-mean-token-mean` the mean of the ranks' losses is the global loss (every rank
#   has as many responses). DAPO's **`token-mean` divides by the number of tokens**, which
#   differs per rank: each training step all-reduces its token count and weighs each rank by its
#   share (a DDP communication hook);
# * **refused with a reason**: DAPO's dynamic sampling (each rank would keep a different number
#   of groups) and advantages whitened over the whole batch (REINFORCE++, PPO's GAE).

# %%
from rlm_course.distributed.grpo import check_data_parallel, update_equivalence_worker
from rlm_course.rl.algorithms import preset

for name in ("dapo", "ppo"):
    try:
        check_data_parallel(preset(name), 2)
    except ValueError as err:
        print(f"{name}: {str(err)[:110]}...")

update = launch(update_equivalence_worker, 2, kwargs=dict(unweighted=("dapo",)))[0]
print(format_table([[v, r["loss_agg"], f"{r['grad_error']:.1e}", f"{r['param_error']:.1e}",
                     f"{r['tolerance']:.1e}", "yes" if r["param_error"] <= r["tolerance"] else "NO"]
                    for v, r in update.items()],
                   ["one update from a fixed batch", "loss aggregation",
                    "gradient error (relative)", "max |param - one process|",
                    "tolerance (float64)", "equal"]))
assert update["grpo"]["param_error"] <= update["grpo"]["tolerance"]
assert update["dapo"]["param_error"] <= update["dapo"]["tolerance"]
assert max(update[v]["grad_error"] for v in ("grpo", "dapo")) < 1e-12
assert update["dapo unweighted"]["param_error"] > update["dapo unweighted"]["tolerance"]

# %% [markdown]
# One update from the same rollout batch, on 2 processes and in one, uses the same gradient (to
# float64's rounding) and lands on the same parameters (within Adam's rounding bound), for GRPO
# and for DAPO's token-mean; without the token weighting, DAPO's gradient is off by almost 1% and
# its update is a different one. (The gradient is compared too because Adam's first step moves
# every weight by about the learning rate whatever the gradient's scale: a gradient averaged with
# the wrong scale would still land on the same parameters.)
#
# Now real runs: 30 steps of GRPO on addition (32 prompts x 8 responses per step), in one process
# and on 2 (16 prompts per rank), from the same warm start. The samples differ (each rank draws
# its own), so the curves are not equal, but they should rise alike. About a minute.

# %%
from rlm_course.distributed.grpo import run_rl_distributed
from rlm_course.rl.runs import run_rl
from rlm_course.tasks import get_task

task = get_task("addition")
config = preset("grpo", steps=30, prompts_per_step=32, group_size=8, warmup_steps=5,
                eval_every=10)
runs_dir = tempfile.mkdtemp()
torch.set_num_threads(1)  # one thread, like each rank
one = run_rl(task, config, name="one", out_dir=runs_dir, progress=True, log=lambda *a: None)
dp = run_rl_distributed(task, config, 2, name="dp2", out_dir=runs_dir, progress=True,
                        log=lambda *a: None)
print(format_table([[name, f"{s['accuracy_before']:.1%}", f"{s['accuracy_after']:.1%}",
                     f"{s['wall_seconds']:.1f}"] for name, s in (("1 process", one),
                                                                  ("2 processes", dp))],
                   ["run", "held-out accuracy before", "after 30 steps", "seconds"]))
assert one["accuracy_after"] > one["accuracy_before"] and dp["accuracy_after"] > dp["accuracy_before"]

# %%
import json

import matplotlib.pyplot as plt

curves = {name: [json.loads(line) for line in open(f"{runs_dir}/{name}/metrics.jsonl")]
          for name in ("one", "dp2")}
fig, ax = plt.subplots(figsize=(6, 3))
for name, label in (("one", "1 process"), ("dp2", "2 processes")):
    ax.plot([m["step"] for m in curves[name]], [m["reward_mean"] for m in curves[name]],
            label=label)
ax.set(xlabel="step", ylabel="mean reward (sampled)", title="GRPO on addition")
ax.legend();

# %% [markdown]
# ### Where a data-parallel step spends its time, per rank
#
# Every rank records its stages on a shared clock, and the launch and completion of each
# gradient all-reduce (the thin black bars; a rank that waits for a slower one waits *inside*
# them). The last three steps of the 2-process run:

# %%
from rlm_course.distributed.grpo import PHASES, plot_timeline
from rlm_course.timeline import Event

timeline = [[Event.from_dict(e) for e in events]
            for events in json.load(open(f"{runs_dir}/dp2/timeline.json"))["ranks"]]
last = [m["rank_seconds"] for m in curves["dp2"][-3:]]
print(format_table([[f"rank {r}"] + [f"{sum(step[r][ph] for step in last) / 3:.3f}"
                                     for ph in PHASES] for r in range(2)],
                   ["seconds per step", *PHASES]))
starts = sorted({e.start for e in timeline[0] if e.stage == "generation"})
plot_timeline([[e for e in events if e.start >= starts[-3]] for events in timeline]);

# %% [markdown]
# On this task (answers of about four tokens) scoring and training take more of a step than
# generation; with the long reasoning traces of chapter 05, generation dominates, and data
# parallelism cannot shorten it below one prompt: each rank runs as many sequential decode steps
# as its longest response. Training is the only stage that communicates: DDP's bucket
# all-reduces during backward (one or two buckets for this 0.8M-parameter model) and the token
# count of token-mean losses. A rank that finishes its generation first waits *inside* the first
# all-reduce: imbalance between ranks shows up as communication time.

# %% [markdown]
# ## 5. What changes on GPUs
#
# * **NCCL instead of gloo.** Collectives run as GPU kernels on their own CUDA streams, with
#   ring, tree and NVLS algorithms picked per size; a true ring reduce-scatter (so ZeRO-3 and
#   sequence parallelism cost what the formulas say); `alpha` of a few microseconds instead of
#   hundreds. `launch(..., device="cuda")` picks NCCL and one GPU per rank; the workers above
#   move their tensors to `ctx.device`.
# * **NVLink against the network.** Inside a node, NVLink gives an H100 450 GB/s per direction
#   (the catalog stores per-direction figures and NCCL's per-step latency); between nodes, one
#   400 Gb/s NIC per GPU gives 50 GB/s: 9x less. That is why tensor parallelism stays inside a
#   node and data parallelism spans nodes.
# * **Overlap and bucket sizes.** DDP all-reduces a bucket (25 MB by default) as soon as its
#   gradients exist, while backward continues; only what sticks out after backward costs time.
#   Bigger buckets pay `alpha` less often but start later.
#
# The World with the catalog's links: DDP's gradient all-reduce for an 8B-parameter model (bf16
# gradients, 16 GB; with Adam's states the model does not fit plain DDP on an 80 GB GPU, so in
# practice ZeRO-1/2, which moves the same bytes) on 8 GPUs in a node and on 8 nodes, against a
# backward pass of one 4k-token sequence per GPU at 40% of the H100's peak (`4 N` FLOPs per
# token), and on this machine's fitted gloo link:

# %%
from rlm_course.cost.hardware import get_device
from rlm_course.distributed.collectives import catalog_links, gradient_sync, predicted_seconds
from rlm_course.cost.comm import Link

h100 = get_device("H100-SXM-80GB")
n_params, tokens = 8e9, 4096
backward = 4 * n_params * tokens / (0.4 * h100.peak_flops)
links = {**catalog_links("H100-SXM-80GB"),
         "this machine (gloo, fitted)": Link(**bench["fits"][2]["all_reduce"])}
rows = []
for label, link in links.items():
    sync = gradient_sync(2 * n_params, 8, link, backward_seconds=backward)
    rows.append([label, f"{link.alpha * 1e6:.1f}", f"{link.beta / 1e9:.1f}", sync["buckets"],
                 f"{sync['seconds']:.2f}", f"{sync['exposed_seconds']:.2f}"])
print(f"backward pass: {backward:.2f} s")
print(format_table(rows, ["link", "alpha us", "beta GB/s", "buckets of 25 MB", "all-reduce s",
                          "exposed after backward s"]))
one_bucket = gradient_sync(25 * 2**20, 8, links["intra-node"])["seconds"]
assert abs(one_bucket / predicted_seconds("all_reduce", 25 * 2**20, 8, links["intra-node"]) - 1) < 1e-9

# %%
sizes = [2**k for k in range(16, 31, 2)]  # 64 KiB .. 1 GiB buckets
fig, ax = plt.subplots(figsize=(6, 3))
for label in ("intra-node", "inter-node"):
    ax.semilogx(sizes, [gradient_sync(2 * n_params, 8, links[label], b, backward)["exposed_seconds"]
                        for b in sizes], "o-", label=label)
ax.set(xlabel="bucket size (bytes)", ylabel="exposed all-reduce (s)",
       title="8B model, 8 ranks: bucket size and overlap");
ax.legend();

# %% [markdown]
# Inside a node the whole all-reduce hides behind backward; across nodes at one NIC per GPU it
# does not, and only the exposed remainder costs time. Tiny buckets pay thousands of `alpha`s;
# huge ones leave a large last bucket that cannot overlap (the curve's right end). Tensor
# parallelism cannot hide this way: its all-reduces sit *between* a block's matmuls, on the
# critical path, so it needs NVLink.

# %% [markdown]
# ## 6. Exercises
#
# `exercises/ex11_distributed.py`: write `ring_all_reduce` (a reduce-scatter then an all-gather,
# `2 (p-1)` send/recv steps of `1/p` of the tensor) and `bucketed_all_reduce` (DDP's buckets:
# flatten, all-reduce, unflatten). The checks run them on 2 and 3 real processes against
# `dist.all_reduce` and count their bytes; open `exercises/ex11_distributed.ipynb` or run
# `python -m rlm_course grade 11`.

# %% [markdown]
# ## Questions
#
# * DDP sent 423,424 bytes per rank per step at 2 ranks, FSDP2 635,136: why exactly 1.5x?
# * Why does gloo's reduce-scatter write twice the ring's bytes, and which strategies pay for it?
# * DAPO's token-mean loss on 2 ranks: what would a plain DDP average compute, and when would it
#   still be right?
# * Why can DDP hide its all-reduce behind backward, but tensor parallelism cannot?
#
# <details><summary>Answers</summary>
#
# * DDP all-reduces the gradients once: `2 (p-1)/p` of the parameter bytes. FSDP2 (ZeRO-3)
#   all-gathers the parameters for the forward and again for the backward, `(p-1)/p` each, and
#   reduce-scatters the gradients, `(p-1)/p`: `3 (p-1)/p`, 1.5x. (By default FSDP2 keeps the root
#   group's parameters between forward and backward and saves one of its all-gathers.)
# * Gloo implements it with an exchange as large as an all-reduce and keeps one shard, instead of
#   the ring's `p - 1` steps of `1/p`. FSDP2 (its gradient reduce-scatter) and sequence
#   parallelism (a reduce-scatter per row-parallel layer) pay it; DDP and plain TP do not.
# * The mean of the ranks' means, `1/p sum_r (sum_r loss / n_r)`, which weighs a token of a rank
#   with few tokens more than one of a rank with many. It is right only when every rank has the
#   same number of response tokens, which sampling never guarantees.
# * A bucket's gradients are final once backward has passed its layers, and nothing in the rest
#   of backward needs the all-reduced values until the optimizer step. A TP all-reduce produces the
#   activations the next layer consumes: nothing can start until it is done.
#
# </details>
#
# > **Key numbers and takeaways**
# >
# > * Launching: a worker lives in a module; gloo on CPU, NCCL on GPU; a failed or killed rank
# >   stops the run in under a second with its rank named; a hung rank after the timeout.
# > * gloo on this machine: `alpha` of a few hundred microseconds and bus bandwidths of a few
# >   GB/s at 2 processes, less at 4 (printed above); its reduce-scatter moves an all-reduce's
# >   bytes.
# > * DDP, FSDP2, TP, TP+SP and four pipeline schedules on TinyGPT: one device's losses,
# >   gradients and parameters to ~`1e-15` in float64, and exactly the formulas' bytes at 2 and 4
# >   ranks (asserted).
# > * Data-parallel GRPO: one update equals one process's (GRPO and DAPO token-mean, asserted);
# >   a run learns alike; each rank's stages and communication on one timeline.
# > * On GPUs: NVLink 450 GB/s vs 50 GB/s per GPU between nodes; DDP hides its all-reduce
# >   behind backward inside a node, not always across nodes.
#
# ## Further reading
#
# * Li et al. 2020, PyTorch Distributed: Experiences on Accelerating Data Parallel Training
#   (VLDB; arXiv:2006.15704); Zhao et al. 2023, PyTorch FSDP (arXiv:2304.11277).
# * PyTorch docs: `torch.distributed`, `torchrun`, DTensor and tensor parallelism,
#   `torch.distributed.pipelining`; NVIDIA nccl-tests, `doc/PERFORMANCE.md` (bus bandwidth).
# * Thakur, Rabenseifner & Gropp 2005, Optimization of collective communication operations in
#   MPICH; Patarasuk & Yuan 2009, bandwidth-optimal all-reduce.
# * Qi et al. 2023, Zero Bubble Pipeline Parallelism (arXiv:2401.10241).
