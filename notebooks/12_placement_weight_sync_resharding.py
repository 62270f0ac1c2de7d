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
# # 12 · Placement, weight sync and hybrid engines
#
# An RL pipeline holds several models: the actor being trained, the rollout engine that
# generates with the actor's weights, a reference, a critic. Chapters 07-11 split *one* model
# over devices; this chapter places *several* on a cluster, with the pattern of verl, OpenRLHF,
# slime, ROLL and NeMo-RL: a **single controller** (one driver process with the algorithm's
# control flow) calling **worker groups** (one per role, each a set of processes talking with
# collectives). Not every system does: TRL's GRPOTrainer and DeepSpeed-Chat are *multi-controller*
# (SPMD: every process runs the whole loop), the contrast HybridFlow's paper (sections 2-4) is
# built on. We run a single controller for real: Ray starts the processes and places them,
# `torch.distributed` (gloo here, NCCL on GPUs) moves the tensors.
#
# Two placements: **colocated** (every role on every device, time-shared; veRL's hybrid engine)
# and **disaggregated** (a rollout pool and a training pool). Either way, after each update the
# new weights must reach the rollout engine: **weight sync**, stage 4 of an iteration. And a
# colocated actor trains in one layout and generates in another, so its weights are
# **resharded** between them, naively or as HybridFlow does.
#
# **Learning objectives.** After this chapter you can:
#
# 1. describe a placement with a device mapping and say which roles share a process;
# 2. measure a link's alpha and beta on real processes and predict a bucketed weight sync with
#    them, and explain why buckets matter; say when a delta sync (only the changed bf16
#    weights) pays;
# 3. cost stage 4 at any scale, colocated and disaggregated, with the terms real systems pay
#    (reshard, transfer, copies, software per tensor, fixed), in seconds and in the work-depth DAG;
# 4. reshard an actor from TP 4 to TP 2 x DP 2 naively and with HybridFlow's micro data-parallel
#    groups, count the bytes and the memory of each, and predict both for a 70B model.

# %%
# NBVAL_IGNORE_OUTPUT
import statistics

import torch

from rlm_course.systems.controller import Controller, DeviceMapping, start_ray
from rlm_course.utils import format_table, seed_everything

seed_everything(0)
resources = start_ray()  # a local Ray instance for this notebook (no dashboard, no token)
print(torch.__version__, resources["CPU"], "CPUs for Ray")

# %% [markdown]
# ## 1. A device mapping, a controller, worker groups
#
# A mapping names each role's devices. Identical lists: **colocated** (one process per device
# hosts both roles; the weights pass inside it). Disjoint lists: **disaggregated** (separate
# processes; the weights travel over a *sync group*). On this CPU machine a "device" is a Ray
# bundle of CPU; with GPUs it is one GPU, and nothing else changes.

# %%
for mapping in (DeviceMapping(actor=[0, 1], rollout=[0, 1]), DeviceMapping(actor=[0], rollout=[1])):
    groups = [(g.name, list(g.devices)) for g in mapping.groups()]
    print(f"{mapping!r}: {mapping.placement('actor', 'rollout')}; worker groups {groups}")
try:
    DeviceMapping(actor=[0, 1], rollout=[1, 2])
except ValueError as err:
    print("refused:", err)

# %%
# NBVAL_IGNORE_OUTPUT
controller = Controller(DeviceMapping(actor=[0], rollout=[1]))
print(controller.describe())
print("process groups:", controller.groups)

# %%
assert controller.groups["sync"] == [0, 1]  # the trainer's first rank and every rollout rank
actor, rollout = controller.role_workers("actor")[0], controller.role_workers("rollout")[0]
assert actor.pid != rollout.pid

# %% [markdown]
# ## 2. The link, measured: alpha and beta
#
# Chapter 07 timed every collective with Hockney's model: a message of `n` bytes takes
# `alpha + n / beta`. Here the two workers broadcast messages of 1 KiB to 16 MiB in bursts (the way
# a bucketed sync sends them) and we fit `alpha` and `beta` by least squares on the relative
# error. The machine is shared: the times move with its load, so everything below is measured
# side by side, in one go.

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.systems.pipelines import measure_link

link, medians = measure_link(controller, [actor, rollout], repeats=5)
rows = [[f"{size:,}", f"{seconds * 1e3:.3f}", f"{link.seconds(size) * 1e3:.3f}"]
        for size, seconds in medians.items()]
print(format_table(rows, ["bytes", "measured ms", "alpha-beta ms"]))
print(f"alpha = {link.alpha * 1e6:.1f} us, beta = {link.beta / 1e9:.2f} GB/s "
      "(loopback TCP between two processes)")

# %%
assert link.alpha >= 0 and link.beta > 1e7

# %% [markdown]
# ## 3. Weight sync in buckets
#
# The trainer packs its state dict, in order, into flat buffers of at most `bucket_bytes` and
# broadcasts each; the rollout unpacks them into its own weights (`bucketed_broadcast`, the
# exercise of this chapter). With `B` buckets of `M` bytes in all, the wire costs
#
# $$T_\text{wire} = B\,\alpha + M / \beta ,$$
#
# and packing and unpacking add a memory copy on each side, a read and a write of every byte:
# `4 M / bandwidth` at this machine's copy bandwidth. One message per tensor pays `alpha` for every
# tensor; one huge bucket needs a buffer as large as the model. We sync the course's model
# (3.2 MB) at several bucket sizes.

# %%
# NBVAL_IGNORE_OUTPUT
from tqdm.auto import tqdm

from rlm_course.cost.hardware import copy_bandwidth
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.sft import default_model_config
from rlm_course.systems.weight_sync import predict_sync_seconds
from rlm_course.systems.workers import RLWorker  # the controller calls its methods by reference

memory = copy_bandwidth(64)  # this machine's copy bandwidth, bytes/s, measured now
config = default_model_config(CharTokenizer()).to_dict()
nbytes = controller.call([actor, rollout], RLWorker.make_model, config,
                         per_worker=[{"seed": 0}, {"seed": 1}])[0]
rows, sync_points = [], []
for i, bucket in enumerate(tqdm([None, 2**14, 2**16, 2**18, 2**20, 2**22], desc="buckets")):
    controller.call([actor], RLWorker.perturb_model, i)  # new weights to send
    out = controller.call([actor, rollout], RLWorker.timed_sync, bucket, "sync", actor.rank, 5)
    seconds = statistics.median(max(t) for t in zip(*(o["seconds"] for o in out)))
    sizes = out[0]["bucket_bytes"]
    wire = predict_sync_seconds(sum(sizes), len(sizes), link)
    predicted = predict_sync_seconds(sum(sizes), len(sizes), link, memory_bandwidth=memory)
    sent, received = controller.call([actor, rollout], RLWorker.model_state)
    assert all(torch.equal(sent[k], received[k]) for k in sent)  # bit for bit
    assert sum(sizes) == nbytes
    sync_points.append((len(sizes), seconds, predicted))
    rows.append(["per tensor" if bucket is None else f"{bucket:,}", len(sizes),
                 f"{seconds * 1e3:.2f}", f"{wire * 1e3:.2f}", f"{predicted * 1e3:.2f}",
                 f"{seconds / predicted:.2f}"])
print(f"{nbytes:,} bytes of weights, trainer -> rollout; copy bandwidth {memory / 1e9:.1f} GB/s")
print(format_table(rows, ["bucket bytes", "broadcasts", "measured ms", "wire ms",
                          "wire + copies ms", "measured / predicted"]))

# %%
hand = controller.call([actor], RLWorker.timed_handover, 5)[0]
assert hand["identical"]
print(f"colocated hand-over of the same {hand['bytes']:,} bytes in process: "
      f"{statistics.median(hand['seconds']) * 1e3:.2f} ms, no network")

# %% [markdown]
# The rollout's weights equal the trainer's bit for bit after every sync (asserted). Fewer
# broadcasts cost less latency, until the bytes dominate: with `alpha` of tens of microseconds
# and a model of a few megabytes, a per-tensor sync (one broadcast per tensor: the first row's
# count) pays that many `alpha`, the bucketed ones a few. Read the last column: the wire alone
# leaves out the packing and unpacking copies; with them the prediction is closer, and what
# remains is Python's per-call overhead and a shared machine's noise.
#
# A longer sweep over three model sizes is stored (`python -m rlm_course systems weight-sync
# --store` remakes it; without `--store` a run writes to `runs/systems/`):

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.systems.experiments import load_experiment
from rlm_course.tools.plots import plot_measured_vs_predicted

stored = load_experiment("weight-sync")
print("made by:", stored["command"], "| machine:", stored["machine"])
points = {}
for bucket in (None, 2**20):
    rows_b = [r for r in stored["rows"] if r["bucket_bytes"] == bucket]
    points["per tensor" if bucket is None else "1 MiB buckets"] = (
        [r["bytes"] for r in rows_b], [r["seconds"] for r in rows_b],
        [r["predicted"] for r in rows_b])
plot_measured_vs_predicted(points, xlabel="bytes of weights", ylabel="seconds per sync",
                           title="weight sync: measured vs wire + copies");

# %%
bucketed = [r for r in stored["rows"] if r["bucket_bytes"] == 2**20]
assert all(r["identical"] for r in stored["rows"])
print("measured / predicted with 1 MiB buckets, wire only:   ",
      [f"{r['ratio_wire']:.2f}" for r in bucketed])
print("measured / predicted with 1 MiB buckets, wire + copies:",
      [f"{r['ratio']:.2f}" for r in bucketed])
assert all(r["ratio"] < r["ratio_wire"] for r in bucketed)  # the copies are real time

# %% [markdown]
# ### Delta sync: send only the weights that changed
#
# The engine holds bf16 weights, and one bf16 step of a weight `x` is `2^-7 |x|`. An update moves
# each weight by about the learning rate (Adam's step is about `lr` whatever the gradient), so
# when `lr` is far below `2^-8 |x|` the new weight rounds to the old bf16 value. With RL
# post-training's learning rates (about 1e-6, weights about 1e-2), some 99% of bf16 weights are
# bit-identical between consecutive versions. A **sparse delta** then sends a few percent of
# the bytes (proposed in 2026 for TRL and slime, in pull requests and a Hugging Face blog post;
# not yet a default of any system we know): per tensor of `n` weights of which `k` changed, 8 bytes of header and then either the positions
# (int32) and new values (bf16) or the dense tensor, whichever is smaller,
# `bytes = 8 + min(6 k, 2 n)` (`rlm_course.systems.delta_sync`). Measured on GRPO steps of the
# course's model from the scratchpad warm start, at chapter 13's learning rate and at a
# post-training one:

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.lm.checkpoint import load_checkpoint
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.runs import default_sft_checkpoint
from rlm_course.rl.trainer import RLTrainer
from rlm_course.systems.delta_sync import unchanged_per_step
from rlm_course.systems.experiments import async_config
from rlm_course.tasks import get_task
from rlm_course.tasks.eval_sets import load_eval_set

scratchpad = get_task("scratchpad")
delta_rows = {}
for lr in (1e-4, 1e-6):
    sft_model = load_checkpoint(default_sft_checkpoint(scratchpad))["model"]
    delta_trainer = RLTrainer(sft_model, scratchpad, CharTokenizer(),
                              async_config(steps=60, lr=lr, warmup_steps=0, prompts_per_step=8,
                                           correction="none"),
                              load_eval_set(scratchpad)[:8])
    delta_rows[lr] = unchanged_per_step(delta_trainer, 3)
print(format_table([[f"{lr:g}", r["step"], f"{r['unchanged']:.1%}",
                     f"{r['delta_bytes'] / 1e6:.2f}", f"{r['dense_bytes'] / 1e6:.2f}",
                     f"{r['delta_bytes'] / r['dense_bytes']:.0%}"]
                    for lr, rs in delta_rows.items() for r in rs],
                   ["lr", "step", "bf16 unchanged", "delta MB", "dense bf16 MB", "delta / dense"]))

# %%
assert min(r["unchanged"] for r in delta_rows[1e-6]) > 0.9  # post-training lr: >90% unchanged
assert max(r["unchanged"] for r in delta_rows[1e-4]) < 0.5  # the course's lr: most change
assert all(r["delta_bytes"] < 0.25 * r["dense_bytes"] for r in delta_rows[1e-6])

# %% [markdown]
# At the course's lr 1e-4 on a model this small, most bf16 weights change every step and the
# delta saves nothing (it falls back to dense tensors); at 1e-6 more than 90% are unchanged and
# the delta is a fraction of the dense bytes (the table; asserted). The payoff is a property of `lr / |w|` against the
# bf16 step, not of the system. `tests/systems/test_delta_sync.py` checks that the receiver's
# weights equal the sender's bit for bit after a chain of delta syncs and that the payload's
# bytes equal the formula.
#
# ## 4. Stage 4 at any scale
#
# The same model at cluster scale is `rlm_course.cost.weight_sync.sync_cost`, the one weight-sync
# model of the course: chapter 14's simulator calls it for every update, and
# `iteration_report(..., weight_sync=...)` for stage 4. What a real system pays is rarely the wire
# alone. Five terms:
#
# * **gather** (reshard): the training shards become what is sent. The trainers of the published
#   runs assemble every whole tensor on every rank, colocated or not (FSDP's `full_tensor()`;
#   Megatron-Bridge's export and verl's per-tensor generator: a pipeline broadcast and a TP or
#   EP all-gather per tensor: `whole_tensor_gather_seconds`); a colocated engine keeps its shard,
#   a rank-0 broadcast sends them whole. The least a colocated device must receive is the part
#   of its generation shard its training shard lacks (inside its micro data-parallel group,
#   section 5; a PP stage's layers are not a TP shard, so PP always moves bytes:
#   `reshard_received_bytes`): the colocated **ideal**;
# * **transfer**: none colocated; disaggregated, a pipelined broadcast of the whole model from one
#   rank (verl's one-step-off and fully-async recipes; across nodes NCCL's rings use all of a
#   node's network cards at once, `broadcast_link`), or shard to shard from every trainer
#   device (checkpoint-engine, NeMo-RL's reshard refit);
# * **copies**: packing, unpacking and loading into the engine, at the memory bandwidth;
# * **software**: a cost per tensor: the Python loop over the state dict, a collective launch and
#   a `load_weights` call per tensor (per level of a broadcast's tree). An MoE of 128 experts has
#   about 400 tensors per layer: this is why MoE syncs are slow;
# * **fixed**: pausing the engine, clearing and re-allocating its KV cache, resuming.
#
# The software rates are measured on published runs (chapter 14 calibrates them once,
# `data/published/rates.json`); with them at 0 the model is the wire and the copies, close to
# the **ideal** no system beats: the bytes over the links alone, the busiest device's over its
# own link and, across nodes, each rollout node's over all its network cards together (a node
# takes in a replica once; NVLink copies it on to its other devices).

# %%
from rlm_course.cluster.calibration import calibrated_rates
from rlm_course.cost.anatomy import Workload, iteration_report
from rlm_course.cost.architectures import SPECS
from rlm_course.cost.hardware import get_device
from rlm_course.cost.layouts import Layout
from rlm_course.cost.weight_sync import sync_cost
from rlm_course.rl.algorithms import preset

h100 = get_device("H100-SXM-80GB")
verl = calibrated_rates("verl")
rows = []
# a trainer of 64 devices: colocated, they are the engines' 64; disaggregated, 64 more
for name, trainer, tp in (("qwen2.5-7b", Layout(dp=64, zero=3), 2),
                          ("llama-3-70b", Layout(dp=4, tp=8, pp=2, zero=1), 8),
                          ("qwen3-30b-a3b", Layout(dp=32, tp=2, ep=8, zero=1), 4)):
    spec = SPECS[name]
    for placement in ("colocated", "disaggregated"):
        per_tensor = (verl.colocated_tensor_seconds if placement == "colocated"
                      else verl.sync_tensor_seconds)
        for label, tensor, fixed in (("wire + copies", 0.0, 0.0),
                                     ("verl's software", per_tensor, verl.sync_fixed_seconds)):
            c = sync_cost(spec, h100, placement, generation_tp=tp, replicas=64 // tp,
                          trainer=trainer, tensor_seconds=tensor, fixed_seconds=fixed)
            rows.append([name, placement, label, f"{c.bytes / 1e9:.0f}", c.tensors,
                         *(f"{v:.2f}" for v in c.terms().values()), f"{c.seconds:.2f}",
                         f"{c.ideal:.2f}"])
print(format_table(rows, ["model", "placement", "rates", "GB", "tensors", "gather", "transfer",
                          "copies", "software", "fixed", "seconds", "ideal"]))

# %%
moe = sync_cost(SPECS["qwen3-30b-a3b"], h100, generation_tp=4, replicas=16,
                trainer=Layout(dp=4, tp=2, ep=8, zero=1), tensor_seconds=verl.sync_tensor_seconds)
assert moe.software > moe.transfer  # for an MoE, the per-tensor work outweighs the wire
workload = Workload.long_tailed(prompts=64, group_size=16, prompt_len=512, mean_len=4000,
                                sigma=1.0, max_len=16384, seed=0)
report = iteration_report(SPECS["llama-3.1-70b"], preset("grpo"), workload, h100, devices=64,
                          generation_tp=8, weight_sync="disaggregated")
shares = {k: f"{v:.1%}" for k, v in report["time_shares"].items()}
print("time shares of a 70B GRPO iteration on 64 H100s (roofline, long-tailed lengths):", shares)
assert "weight sync" in report["time_shares"] and report["time_shares"]["weight sync"] < 0.2

# %% [markdown]
# On the roofline, stage 4 is a few percent of an iteration at this scale: decoding dominates.
# Published systems measure more than the ideal, because their software does more than move
# bytes: verl's per-tensor NCCL path takes 15.8 s for Qwen3-30B-A3B on 16 + 16 H20s and 58.6 s
# for Qwen3-235B on 64 + 64, its checkpoint engine (bucketed, overlapped) 4.4 s and 23.7 s for
# the same (`docs/advance/fully_async.md`); NeMo-RL's shard-to-shard refit takes 2.4-2.8 s for
# DeepSeek-V3 on H100s. slime's blog on *colocated* sync (CUDA IPC handles after gathers over
# PP/TP/EP) describes a series of changes, buckets among them, that took Qwen3-30B-A3B's
# update from about 60 s to 7 s. How systems do it:
#
# | system | colocated | disaggregated |
# |---|---|---|
# | verl | in-process `load_weights` (hybrid engine), CUDA IPC for SGLang | per-tensor NCCL broadcast from actor rank 0; a checkpoint engine |
# | slime | CUDA IPC handles after gathering PP/TP/EP shards, in buckets | `update_weights_from_distributed` (NCCL) |
# | NeMo-RL | CUDA IPC over a ZMQ stream | NCCL broadcast, or shard-to-shard reshard (NIXL/NCCL); in-flight updates |
# | AReaL | - | first a shared file system, later NCCL |
# | Kimi's checkpoint-engine | - | bucketed, pipelined broadcast (1T parameters in about 20 s on H20s) |
#
# Chapter 14 calibrates the per-tensor seconds on some of these published syncs and predicts the
# others with them. A sync the rollout waits for is depth on the critical path, every iteration.
#
# ## 5. Hybrid-engine resharding
#
# A colocated actor trains with Megatron TP over `t = 4` ranks and generates with TP `t_g = 2`,
# two replicas (DP 2). Each rank holds one training shard (its heads, its MLP slice); it must end
# with a generation shard twice as large.
#
# * **Naive** (HybridFlow's "HybridFlow-V" row of its Table 2, a gather within the TP x PP
#   group; DeepSpeed-Chat's row is worse, it gathers over *every* GPU): generation replicas are consecutive
#   ranks, so rank 1 needs shard 1 of TP 2 = training shards 2 and 3, none of which it holds:
#   every rank all-gathers the whole model and slices its part.
# * **HybridFlow**: rank `r` takes generation shard `r // 2`, which *contains* its own training
#   shard; the two ranks of a *micro data-parallel group* all-gather only each other's shard, and
#   the training shard becomes part of the generation shard (zero redundancy).
#
# Four workers, real collectives, the course's model:

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.systems.experiments import reshard_controller_groups, reshard_experiment

controller.close()  # free its CPUs for four workers
with Controller(DeviceMapping(actor=[0, 1, 2, 3]), groups=reshard_controller_groups(4, 2)) as four:
    reshard = reshard_experiment(four, repeats=3)
    reshard_events = four.events()
m = reshard["split_bytes"]
rows = []
for scheme, r in reshard["measured"].items():
    p = reshard["predicted"][scheme]
    rows.append([scheme, f"{r['received_bytes'][0]:,}", f"{p['received_bytes']:,.0f}",
                 f"{max(r['peak_bytes']):,}", f"{max(r['redundant_bytes']):,}",
                 f"{r['seconds'] * 1e3:.1f}", r["identical"]])
print(f"M = {m:,} bytes of TP-split weights (+ {reshard['replicated_bytes']:,} replicated), TP 4 -> TP 2 x DP 2")
print(format_table(rows, ["scheme", "received / rank", "formula", "peak bytes / rank",
                          "redundant after", "ms", "identical"]))

# %%
naive, hybrid = reshard["measured"]["naive"], reshard["measured"]["hybridflow"]
assert naive["identical"] and hybrid["identical"]  # every rank holds exactly its generation shard
assert naive["received_bytes"][0] == 3 * m // 4 and hybrid["received_bytes"][0] == m // 4
assert max(hybrid["redundant_bytes"]) == 0 and min(naive["redundant_bytes"]) == m // 4

# %%
from rlm_course.systems.controller import stop_ray

stop_ray()  # the last Ray workers of this chapter: Ray stops now, not when the kernel shuts down

# %% [markdown]
# Measured bytes equal the formulas exactly (HybridFlow, arXiv:2409.19256, Table 2: the naive
# scheme receives `(t - 1)/t M`, HybridFlow `(t - t_g)/(t_g t) M`). HybridFlow's row in two
# lines: a micro data-parallel group of `t / t_g` ranks all-gathers one `M / t_g` generation
# shard, of which each rank already holds `M / t`, so each receives
# `(t / t_g - 1) M / t = (t - t_g) / (t_g t) M`. HybridFlow's peak is its generation shard, the
# naive one the whole model plus the training shard. At scale, 70B from TP 8 to TP 2 on H100
# NVLink:

# %%
big = reshard["at_scale"]
rows = [[scheme, f"{big[scheme]['received_bytes'] / 1e9:.1f}", f"{big[scheme]['peak_bytes'] / 1e9:.1f}",
         f"{big[scheme]['redundant_bytes'] / 1e9:.1f}", f"{big[scheme]['seconds']:.3f}"]
        for scheme in ("naive", "hybridflow")]
print(f"{big['model']} ({big['params'] / 1e9:.1f}B params, bf16), TP {big['tp']} -> TP {big['tp_gen']}"
      f" x DP {big['tp'] // big['tp_gen']} on {big['device']}")
print(format_table(rows, ["scheme", "received GB / rank", "peak GB / rank", "redundant GB",
                          "all-gather s"]))
print(f"HybridFlow moves {big['reduction']['bytes']:.0%} fewer bytes "
      f"({big['reduction']['seconds']:.0%} less time on the same links)")

# %%
assert 0.5 < big["reduction"]["bytes"] < 0.6

# %% [markdown]
# The paper reports transition time cut by up to **89.1%**, its largest reduction against
# DeepSpeed-Chat, OpenRLHF and NeMo-Aligner together (section 8). Our prediction (printed above)
# is against the naive HybridFlow-V gather on the same link on both sides; DeepSpeed-Chat
# gathers over *every* GPU of the job, across nodes (`(tpd - 1)/(tpd) M` over inter-node links,
# Table 2), so its transitions also pay the slower network, and HybridFlow's stay inside a
# node. Peak memory
# falls from more than the whole model per GPU (141 GB for 70B, which no 80 GB GPU holds at
# once: real naive engines gather layer by layer) to its generation shard.
#
# The timeline of the four workers (both schemes, three repeats each):

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.systems.timeline import relative
from rlm_course.tools.plots import plot_timelines

plot_timelines({"resharding TP 4 -> TP 2 x DP 2: naive (first three bars), then HybridFlow":
                relative(reshard_events)}, show_versions=False);

# %% [markdown]
# ## Questions
#
# 1. With `alpha = 50 us` and `beta = 5 GB/s`, what bucket size makes the latency term a tenth of
#    the bandwidth term for a 3 MB model? For a 141 GB model with `alpha = 10 us`,
#    `beta = 50 GB/s`?
# 2. A rollout pool of 8 replicas receives 70B weights from one trainer rank on a binomial tree.
#    How many rounds, and how long? What changes if each trainer rank sends its own shard to the
#    matching rollout ranks instead (NeMo-RL's shard-to-shard refit)?
# 3. Why can HybridFlow's scheme not help when the generation layout is *larger* than the
#    training one (e.g. TP 2 training, TP 4 generation)?
#
# <details><summary>Answers</summary>
#
# 1. The latency term is `B alpha = (M / b) alpha`, the bandwidth term `M / beta`; their ratio
#    `alpha beta / b` is a tenth when `b = 10 alpha beta`: `10 x 50e-6 x 5e9` = 2.5 MB, so for a
#    3 MB model one or two buckets; for the large model `10 x 10e-6 x 50e9` = 5 MB, so any bucket of
#    tens of MB or more makes the latency negligible (slime's 512 MB), and the 141 GB take about
#    2.8 s at 50 GB/s whatever the bucket.
# 2. `ceil(log2(8 + 1))` = 4 rounds of `M / beta` = 4 x 2.8 s = 11.3 s (plus latency), since every
#    round sends the whole model; pipelining the chunks down the tree brings it close to one
#    `M / beta` (NCCL's broadcast does this). Shard-to-shard: each of `t` trainer ranks sends only
#    `M / t` to its peers, in parallel, so the time falls by about `t` and no rank ever holds the
#    whole model.
# 3. The generation shard must contain the training shard for no bytes to be moved needlessly;
#    with a larger generation TP each generation shard is a *part* of a training shard, so every
#    rank already holds more than it needs: it just slices (no communication at all), keeping the
#    rest as redundant memory unless it frees it. HybridFlow's grouping is about the common case,
#    generation TP smaller than training TP.
#
# </details>
#
# **Exercise.** `exercises/ex12_weight_sync.py`: write `bucketed_broadcast` (pack, broadcast,
# unpack), then run `python -m rlm_course grade 12`.
#
# > **Key numbers and takeaways**
# >
# > * A device mapping decides placement: identical pools share a process (colocated), disjoint
# >   pools talk over a sync group (disaggregated); one controller drives both.
# > * Weight sync is a bucketed broadcast, `T = B alpha + M / beta` on the wire, plus the copies
# >   of packing and unpacking (`4 M / bandwidth`), which the measured syncs need (tables above);
# >   bit for bit exact; in process it is a memory copy. A delta sync sends
# >   `8 + min(6 k, 2 n)` bytes per tensor; it pays when `lr` is small against the bf16 step of
# >   the weights (over 90% unchanged at lr 1e-6 here, under half at 1e-4).
# > * Stage 4 at scale has five terms (reshard, transfer, copies, software per tensor, fixed);
# >   for 70B the wire is about 2.8 s over one 50 GB/s NIC, but published syncs of MoE models
# >   take tens of seconds: the per-tensor software dominates (chapter 14 calibrates it).
# > * Resharding TP 4 -> TP 2 x DP 2: naive moves 3/4 of the split weights per rank and peaks above
# >   the whole model; HybridFlow moves 1/4, peaks at its generation shard, keeps no copy (measured
# >   = formula); for 70B TP 8 -> TP 2, over half fewer bytes (the paper: up to 89.1% less time
# >   against a cross-node baseline).
#
# ## Further reading
#
# * Sheng et al. 2024, HybridFlow (veRL), arXiv:2409.19256: sections 4 (hybrid programming model)
#   and 5.4 (3D-HybridEngine), Table 2.
# * Hu et al. 2024, OpenRLHF, arXiv:2405.11143 (Ray placement groups, vLLM weight broadcast).
# * Ray placement groups: https://docs.ray.io/en/latest/ray-core/scheduling/placement-group.html
# * slime's colocated weight sync (CUDA IPC handles in buckets, a series of changes that took
#   Qwen3-30B-A3B from about 60 s to 7 s): https://hebiao064.github.io/rl-weight-sync
# * NeMo-RL's refit designs (`docs/design-docs/generation.md`, `nccl-reshard-refit.md`).
