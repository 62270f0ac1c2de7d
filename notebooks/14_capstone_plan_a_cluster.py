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
# # 14 · Capstone: plan a cluster
#
# Every chapter so far measured one piece: the FLOPs and bytes of a stage (05), its depth (06),
# what each parallelism sends and holds (07-10), how real processes and Ray workers move weights
# and run asynchronously (11-13). This chapter puts the pieces together at cluster scale: a
# **discrete-event simulator** of whole RL iterations on up to ten thousand GPUs
# (`rlm_course.cluster.simulator`, on SimPy), checked against a real run on this machine and
# against the figures published by verl, AReaL and NeMo-RL, and a **planner** that searches
# placements, per-role layouts and execution modes. Then we plan R1-style runs of a 70B dense
# model and a 671B-class mixture of experts on H100 clusters of several sizes, and ask which
# choice matters most as the cluster grows.
#
# **Learning objectives.** After this chapter you can:
#
# 1. describe what the simulator models (worker groups as processes, continuous batching, the
#    staleness gate, drain or pause at weight updates) and what it leaves out;
# 2. read a simulated timeline and say where an iteration's time goes, and why asynchrony
#    helps only when generation and training are comparable;
# 3. judge a simulator by its validation: which published figures it reproduces, with which
#    inputs and assumptions, and why some it does not;
# 4. plan an RL run with `python -m rlm_course plan` and defend the plan with numbers.

# %%
# NBVAL_IGNORE_OUTPUT
import math

import matplotlib.pyplot as plt
import torch

from rlm_course.utils import format_table, seed_everything

seed_everything(0)
print(torch.__version__)

# %% [markdown]
# ## 1. One RL iteration, simulated
#
# A GRPO iteration of Llama-3.1-70B on 256 H100s (32 nodes): 256 prompts x 16 responses, whose
# lengths follow a long-tailed log-normal (mean 4,000 tokens, sigma 0.8, at most 16,384; chapter
# 05's `Workload.long_tailed`). Llama 3.1 is Llama 3's architecture with a 131,072-token context
# window; Llama 3's own 8,192 tokens cannot hold these responses, and the simulator and planner
# refuse a budget past a model's window (`TransformerSpec.check_context`). Colocated, as verl's hybrid engine runs by default: every device
# generates (replicas of `tp = 8`), then every device scores and trains (TP 8 x PP 2 x DP 16,
# ZeRO-1), then the weights are resharded for the next rollout.
#
# The simulator does not step through tokens or GPUs. Each **replica** is a SimPy process that
# decodes its sequences with continuous batching: between two events (a sequence finishing, a
# new one admitted) every decode step costs the closed form of chapter 05's roofline plus the TP
# all-reduces of chapter 08, so one long-tailed rollout is a few events per replica. Prompts
# reach the replicas in turn, a whole group to one (an offline `generate` split in contiguous
# shards), or one sample to each when the engine is served request by request (NeMo-RL's
# asynchronous engine, verl's agent loop): `Rates.routing`, which each published figure of
# section 3 states from its recipe. The
# **trainer** is another process whose stages take the seconds of chapters 07-09's
# communication and the busiest data-parallel replica's compute; the weight sync is chapter 12's
# one model. The **rates** turn FLOPs and bytes into seconds (fractions of peak FLOP/s and
# bandwidth, seconds per decode step, per synced tensor): here those calibrated once on NeMo-RL's
# published runs (section 3 shows how, and how well they predict the rest).

# %%
from rlm_course.cluster.calibration import calibrated_rates
from rlm_course.cluster.planner import pool_label
from rlm_course.cluster.simulator import MODES, Scenario, algorithm, simulate
from rlm_course.cost.anatomy import Workload
from rlm_course.cost.architectures import get_spec
from rlm_course.cost.hardware import get_device
from rlm_course.cost.layouts import Layout
from rlm_course.cost.phases import Cluster
from rlm_course.tools.plots import plot_timelines

h100 = get_device("H100-SXM-80GB")
rates = calibrated_rates(h100)  # NeMo-RL's family: vLLM and Megatron-Core
spec70 = get_spec("llama-3.1-70b")
workload = Workload.long_tailed(256, 16, 512, 4000, 0.8, 16384, seed=0, group_share=0.5)
grpo = algorithm("grpo", minibatches=16)
trainer = Layout(dp=16, tp=8, pp=2, zero=1, recompute=True, micro_batch_tokens=32768,
                 main_grads_fp32=True)
colocated = Scenario(spec70, grpo, workload, Cluster(h100, 256), generation_tp=8, trainer=trainer,
                     rates=rates)
sync = simulate(colocated)
print(sync.summary())
print(f"training: MFU {sync.training_mfu:.1%} (model FLOPs), HFU {sync.training_hfu:.1%} "
      "(with the recomputed forward); weight sync:",
      {k: round(v, 2) for k, v in sync.sync.terms().items()}, "s")
assert abs(sync.training_hfu / sync.training_mfu - 4 / 3) < 1e-6
print("memory per device (GB):", {role: round(sum(parts.values()) / 1e9, 1)
                                  for role, parts in sync.memory.items() if isinstance(parts, dict)})
# a synchronous step is the sum of its stages, on the devices they share
assert abs(sync.step_seconds - sum(sync.stages.values())) < 1e-6 * sync.step_seconds

# %%
plot_timelines({"Llama-3.1-70B, 256 H100s, colocated, synchronous": sync.events()},
               title="trainer, rollout pool and four of its 32 replicas", show_versions=False);

# %% [markdown]
# The replicas start together and finish one after the other: each decodes until *its* longest
# response ends, and the rollout pool waits for the last one. That tail is chapter 06's depth in
# seconds. Generation's share of the step (printed above) is far larger than its share of the
# FLOPs. The MFU counts the model's FLOPs only; the HFU also counts the forward that activation
# recomputation runs again, 4/3 of it (PaLM's appendix B draws this line): a reported
# "MFU" that includes recomputation is an HFU.
#
# **What a drafted token buys.** That tail decodes one token per step per sequence, each step
# reading the weights. Speculative decoding shortens it: a small draft (DeepSeek-V3's own
# multi-token-prediction layer, or an EAGLE head of one layer) proposes `k` tokens, and one
# forward of the model verifies all `1 + k`, keeping them up to the first it rejects:
# `(1 - p^(k+1)) / (1 - p)` tokens a step at acceptance `p` (Leviathan et al. 2023, eq. 1). The
# step costs a little more (the draft's layer and output head, the experts more tokens touch, the
# all-reduces of `1 + k` tokens), so the gain is less than the yield. NeMo-RL v0.7 runs its
# DeepSeek-V3 recipes with one drafted token; fitted on them, a token is accepted about 0.6 of the
# time (sampling at temperature 1 accepts fewer than the DeepSeek-V3 report's 0.85-0.9).

# %%
from dataclasses import replace

from rlm_course.cost.phases import speculative_yield

drafted = {p: simulate(replace(colocated, rates=replace(rates, speculative_tokens=1,
                                                        draft_acceptance=p)))
           for p in (0.6, 0.85)}
for p, r in drafted.items():
    gain = sync.stages["generation"] / r.stages["generation"]
    print(f"one drafted token accepted at {p}: {speculative_yield(1, p):.2f} tokens a step; "
          f"generation {r.stages['generation']:,.0f} s against {sync.stages['generation']:,.0f} s "
          f"({gain:.2f}x), step {r.step_seconds:,.0f} s against {sync.step_seconds:,.0f} s")
    assert 1 < gain < speculative_yield(1, p)

# %% [markdown]
# ## 2. Execution modes: what asynchrony buys
#
# The same run on the same 256 devices, five ways. Each mode has one name, the one the planner, its
# output and `python -m rlm_course plan --modes` use (`rlm_course.cluster.simulator.MODES`):
# colocated `sync` (above); colocated `fused`, **stage fusion** (RLHFuse's inter-stage fusion: once
# 90% of the samples are done, the unfinished ones migrate to an eighth of the replicas,
# re-prefilling their contexts there, and the freed devices score the finished samples); and
# **disaggregated** pools, 96 rollout GPUs + 160 training GPUs, in `sync`, `one-step-off`
# (generation of batch `k + 1` overlaps training on batch `k`; verl's recipe, NeMo-RL's
# `max_trajectory_age_steps = 1`) and `async`, fully asynchronous: streaming mini-batches to the
# trainer and partial rollouts (a weight update pauses in-flight samples instead of waiting for
# them; AReaL, verl's fully-async recipe). The staleness gate is chapter 13's `rollout_capacity`.

# %%
disaggregated = dict(placement="disaggregated", rollout_gpus=96, generation_tp=8,
                     trainer=Layout(dp=10, tp=8, pp=2, zero=1, recompute=True,
                                    micro_batch_tokens=32768, main_grads_fp32=True))
modes = {("colocated", "sync"): sync,
         ("colocated", "fused"): simulate(Scenario(spec70, grpo, workload, Cluster(h100, 256),
                                                   generation_tp=8, trainer=trainer,
                                                   mode=MODES["fused"], rates=rates))}
for name in ("sync", "one-step-off", "async"):
    modes[("disaggregated", name)] = simulate(
        Scenario(spec70, grpo, workload, Cluster(h100, 256), mode=MODES[name], rates=rates,
                 **disaggregated))
rows = [[placement, "96 + 160" if placement == "disaggregated" else "all 256", name,
         f"{r.step_seconds:,.0f}", f"{r.generation_share:.0%}", f"{r.mfu:.1%}",
         f"{r.staleness:.2f}", f"{sync.step_seconds / r.step_seconds:.2f}x"]
        for (placement, name), r in modes.items()]
print(format_table(rows, ["placement", "rollout + training", "mode", "step s", "gen wait", "MFU",
                          "staleness", "speedup"]))
assert modes[("disaggregated", "async")].step_seconds < modes[("disaggregated", "sync")].step_seconds
assert modes[("disaggregated", "one-step-off")].staleness > 0.99

# %%
plot_timelines({f"{pool_label(256, 96)}, {name}": modes[("disaggregated", name)].events(replicas=2)
                for name in ("sync", "async")},
               title="separate pools: sync, then async", show_versions=False);

# %% [markdown]
# Synchronous disaggregation is the worst of both worlds: each pool idles while the other works.
# Overlapping them hides the shorter side behind the longer one; the step becomes the longer of
# generation and training (plus the weight transfer), a closed form the tests check on uniform
# workloads. The price is staleness: samples one update behind the weights that train on them,
# which the decoupled PPO loss of chapter 13 mitigates but does not remove (chapter 13 measured
# an accuracy cost). Stage fusion is no free lunch: it gains the scoring it overlaps with the tail
# but pays for the migration, a re-prefill of every unfinished context and an eighth of the
# replicas holding the whole tail (in waves when their KV caches cannot hold it at once); read
# its row to see which side wins for this workload.
#
# ## 3. Does the simulator tell the truth?
#
# **(a) Against a real run.** The course's own GRPO iteration on this machine (chapter 02's
# trainer, the tiny model, 64 prompts x 8): `course_run_record` runs it a few times and, between
# the runs, micro-benchmarks its passes at the same shapes (a decode step at two batch sizes, a
# scoring forward, a training step) to measure the rates it runs at. The simulator then predicts
# each stage from those rates: it must count the decode steps, the scoring forwards of the
# algorithm and the gradient steps right. Chapters 11-13's multi-process runs produce the same
# kind of record (`check_real_run` takes them). A shared machine slows the run and its
# micro-benchmarks unequally, so the seconds are compared in a benchmark, run alone
# (`python -m rlm_course bench realrun`: every stage within 20% on an idle machine); here we
# look at them.

# %%
from rlm_course.cluster.realrun import check_real_run, course_run_record

torch.set_num_threads(1)  # the run and its micro-benchmarks on the same single thread
record = course_run_record("grpo", rounds=3)
rows = check_real_run(record, tolerance=0.2)
print(format_table([[r["stage"], f"{r['predicted']:.3f}", f"{r['measured']:.3f}",
                     f"{r['ratio']:.2f}"] for r in rows],
                   ["stage", "simulated s", "measured s", "ratio"]))
print("every stage within 20%:", "yes" if all(r["ok"] for r in rows) else
      "no (a busy machine slows the run and its micro-benchmarks unequally: run it again)")
assert {r["stage"] for r in rows} == {"generation", "scoring", "training"}
assert all(0 < r["ratio"] < 10 for r in rows), rows

# %% [markdown]
# **(b) Against published figures, out of sample.** A simulator that is fitted to every figure it
# shows proves nothing. `data/published/rl_systems.json` holds the figures published by open RL
# systems, each with its source, the verbatim row, the setup the source and its recipe give and
# the assumptions for what they leave open: the rows of NeMo-RL's performance tables from v0.3 to
# v0.7 (H100 and GB200, BF16 and FP8; v0.7's DeepSeek-V3 runs decode with speculative tokens,
# which the model prices; the few rows it cannot express, hybrid Mamba models, are listed with
# the reason), verl's one-step-off and fully-async tables at 16 to 128 GPUs with their
# ablations, its weight-sync and DeepSeek-V3 figures, NeMo-RL's refit times. Each figure belongs
# to a **family** of rates (a system's software; NeMo-RL on GB200 is a family built on NeMo-RL's,
# one rate apart, and NeMo-RL v0.7, a new vLLM and Megatron underneath, one built on it, three
# rates apart) and is either one of the family's few declared **calibration** figures or a
# **prediction**. The rates were fitted
# once, on the calibration figures only (`python -m rlm_course validate --calibrate` wrote
# `data/published/rates.json`); every other figure is predicted with them, without refitting.
# A rate that belongs to the engine or to NCCL rather than to the RL framework, and that none of
# a family's calibration figures exercises, is **borrowed** from the family that fits it rather
# than left at 0 (verl's engines never span nodes, NeMo-RL's always capture CUDA graphs); the
# calibration checks that the borrower's own figures cannot feel it.

# %%
from rlm_course.cluster.calibration import describe, load_calibration
from rlm_course.cluster.validation import format_validation, summary, validation_table

print(describe())
table = validation_table()
result = summary(table)
print(format_validation([r for r in table if r["sample"] == "calibration"]))

# %% [markdown]
# Above, the calibration figures (in sample: how well the model's structure can describe them
# at all; where one is off, the family's few rates cannot match all its calibration figures at
# once). Below, the predictions: a seconds figure is within tolerance at 30% of
# its published value, a speed-up when its gain (`speedup - 1`) is within 25%. Beside each, a
# **null model**: what arithmetic without a simulator says (a step: the family's first calibration
# step scaled by the model FLOPs per device; a speed-up: perfect overlap of the baseline's
# published generation and training, `(G + T) / max(G, T)`, or the ratio of devices; a sync: the
# bytes over the NIC).

# %%
predictions = [r for r in table if r["sample"] == "prediction"]
print(format_validation(predictions))
print(f"out of sample: {result['out_of_sample_hits']} of {result['out_of_sample_total']} within "
      f"tolerance; the null model {result['null_hits']} of {result['null_total']} where it applies "
      f"(the simulator {result['simulator_hits_where_null_applies']} of the same); "
      f"{result['direction_errors']} direction errors; {result['free_parameters']} free "
      "parameters fitted")
assert result["out_of_sample_total"] >= 24 and result["figures"] >= 24
assert result["simulator_hits_where_null_applies"] > result["null_hits"]

# %%
fig, ax = plt.subplots(figsize=(9, 3.8), layout="constrained")
for i, r in enumerate(predictions):
    published = r["published"] - 1 if r["what"] == "speedup" else r["published"]
    value = (r["predicted"] - 1) / published if r["what"] == "speedup" else r["predicted"] / published
    null = None
    if r["null"] is not None:
        null = (r["null"] - 1) / published if r["what"] == "speedup" else r["null"] / published
    limit = 0.25 if r["what"] == "speedup" else 0.30
    ax.errorbar(i, 1, yerr=limit, color="#cccccc", capsize=2)
    ax.plot(i, value, "o", ms=4, color="#1b9e77" if r["within"] else "#d95f02")
    if null is not None:
        ax.plot(i, null, "x", ms=3, color="#7570b3")
ax.axhline(1, color="grey", lw=0.8)
ax.set(yscale="log", ylim=(0.1, 10), xlabel="predicted figures (verl, NeMo-RL)",
       ylabel="predicted / published\n(gain for a speed-up)",
       title="out of sample: simulator (o, green within tolerance) and null model (x)")
ax.set_xticks([]);

# %% [markdown]
# Read the misses with their reasons (the data file keeps each one, and the next cell prints two).
# Two kinds dominate. The first is what the figures do not publish or the model cannot see: verl's
# asynchronous trainers update on 16 GPUs in about the time its colocated trainer takes on 32, a
# per-device rate twice the colocated one. A FLOP count says why no rate can fix that (below,
# under "Check a published figure"): at the response length fitted for that page's runs, the 16-
# and 32-GPU asynchronous updates would run above the H20's dense peak, which no trainer can, so
# those runs must have trained on shorter responses than the colocated ones (verl's text says
# streaming changes the response length), and no length is published. (Response lengths are a
# property of a run, not of a model: verl's one-step-off page, with an 8,192-token cap and 12
# responses per prompt, has its own fitted mean length.) NeMo-RL's FP8 refit spends seconds
# quantizing that a BF16 refit does not. The second is the move to another device. NeMo-RL's GB200
# steps barely beat its H100 ones, because software that does not speed up with the GPU
# (schedulers, per-tensor Python, kernel launches) is a large part of them; its H100 rates carry
# that over and price the dense GB200 rows well, but made every mixture-of-experts row on GB200 too
# fast. So NeMo-RL on GB200 is a family of its own: the H100 rates plus one, the share of the
# decode bandwidth an MoE model reaches (`moe_decode_efficiency`), fitted on the two GB200 runs
# that repeat an H100 calibration figure. One known cause: vLLM's fused-MoE kernels take their tile
# sizes from tables tuned per device and expert shape, and fall back to a default where a device
# has none (Blackwell's came late: a Qwen3-MoE table for B200 in December 2025); the fitted share
# is lower than that alone explains, so read it as everything that slows an MoE decode there. The
# cell after the speed-ups prints what it fixed. A simulator is as good as its rates: these are the
# rates that decide, measured once; the planner below uses them, and section 4's sensitivity table
# shows how its answer moves when they are off.
#
# **verl's one-step-off speed-ups, read two ways.** The table above holds them as 1.44x (vLLM +
# FSDP2) and 1.24x (vLLM + Megatron): the ratios of the published *step* times, 749 s over 520 s
# and 699 s over 566 s, which is what a simulator of steps can be checked against. Chapter 13
# quotes the same page's headline, +23% and +40%: those compare the runs' total *hours* (19h18m
# against 15h34m, 18h21m against 13h06m), which also depend on how many steps each run took and
# on what ran between the steps (validation, checkpoints), so the two pairs need not agree, and
# here they even swap order. The simulator predicts all four steps within tolerance (the cell
# prints the errors) but misses both speed-ups: a speed-up's gain is the small difference of two
# steps, so two step errors of opposite sign, each within 30%, can take most of FSDP2's 0.44 gain
# away, and even errors of one sign (Megatron's two steps both long, by different amounts) move
# a 0.24 gain by a third. That is why the tolerance on a speed-up is set on its gain, not on the
# ratio: a 1.26x published speed-up predicted as 1.0x-1.7x would be no check at all.

# %%
from rlm_course.cluster.published import load_figures

rows_by_id = {r["id"]: r for r in table}
figure_by_id = {f["id"]: f for f in load_figures()}
for fid in ("verl-oso-fsdp2-speedup", "verl-oso-megatron-speedup"):
    r, fig = rows_by_id[fid], figure_by_id[fid]
    base, target = rows_by_id[fig["baseline"]], rows_by_id[fig["target"]]
    print(f"{fid}: published {r['published']:.2f}x, predicted {r['predicted']:.2f}x (gain "
          f"{r['error']:+.0%}); its steps: colocated {base['error']:+.0%}, one-step-off "
          f"{target['error']:+.0%}")
    assert base["within"] and target["within"]
assert not rows_by_id["verl-oso-fsdp2-speedup"]["within"]
assert not rows_by_id["verl-oso-megatron-speedup"]["within"]
megatron = [rows_by_id[figure_by_id["verl-oso-megatron-speedup"][k]]["error"]
            for k in ("baseline", "target")]
assert min(megatron) > 0  # both Megatron steps long: errors of one sign
published = [rows_by_id[k]["published"] for k in ("verl-oso-fsdp2-speedup",
                                                   "verl-oso-megatron-speedup")]
assert [round(p, 2) for p in published] == [1.44, 1.24]

# %%
gb200 = [r for r in predictions if r["family"] == "nemo-rl-gb200"]
share = load_calibration()["families"]["nemo-rl-gb200"]["rates"]["moe_decode_efficiency"]
print(f"NeMo-RL on GB200: an MoE model decodes at {share:.2f} of the dense bandwidth share; "
      f"{sum(r['within'] for r in gb200)} of {len(gb200)} GB200 predictions within tolerance")
assert share < 1 and sum(r["within"] for r in gb200) > len(gb200) / 2

# %% [markdown]
# **Check a published figure before you fit it.** `implied_update_hfu` needs no rate: the
# update's hardware FLOPs at the workload the setup describes, over the published update seconds
# times the trainer's devices times the device's peak. Figures that share a workload should imply
# similar efficiencies for similar trainers, and none can imply more than 1.

# %%
from rlm_course.cluster.calibration import fitted_workload
from rlm_course.cluster.validation import implied_update_hfu

checks = []
for fid in ("verl-fa-7b-colocate-32", "verl-fa-7b-colocate-64", "verl-fa-7b-colocate-128",
            "verl-fa-7b-fullyasync-16-16", "verl-fa-7b-fullyasync-32-32",
            "verl-fa-7b-fullyasync-64-64-stale0.5-partial"):
    f = figure_by_id[fid]
    pool = f["setup"]["gpus"] - f["setup"].get("rollout_gpus", 0)
    checks.append([fid, pool, f["published_stages"]["update"],
                   f"{implied_update_hfu(f, fitted_workload()):.2f}"])
print(format_table(checks, ["figure", "trainer GPUs", "published update s", "implied HFU"]))
hfu = {row[0]: float(row[3]) for row in checks}
assert hfu["verl-fa-7b-fullyasync-16-16"] > 1 and hfu["verl-fa-7b-fullyasync-32-32"] > 1
assert hfu["verl-fa-7b-fullyasync-16-16"] > 1.5 * hfu["verl-fa-7b-colocate-32"]

# %% [markdown]
# ## 4. Plan R1-style runs
#
# DeepSeek-R1's recipe in short: GRPO, a group of 16 responses per prompt, long chains of thought
# (here a mean of 4,000 tokens, a tail to 16,384). The planner (`rlm_course.cluster.planner`)
# searches, for each cluster size: colocated or disaggregated (five splits), generation TP 1 to
# 32 (each replica priced on the link it spans: NVLink inside a node, the network across nodes),
# trainer layouts TP x PP (x EP) x DP that fit memory (Megatron's distributed optimizer keeps
# fp32 main gradients: `6 + 12/d` bytes per parameter), colocated plans with the trainer's
# states kept on the devices or offloaded to host memory while they generate (more room for the
# KV cache, for a copy each way over PCIe, as veRL's and NeMo-RL's hybrid engines do), the
# optimizer offloaded to the hosts when nothing else fits (`cpu-optimizer` in a layout: ZeRO-Offload,
# Adam stepped on the CPUs at `host_adam_params_per_second`, measured 1.1-2.8B parameters a
# second for an 8-GPU host, often the longest part of such a step), and the
# execution modes; it simulates the promising ones and explains the rest. It plans with the **calibrated** rates (NeMo-RL's family
# by default: vLLM and Megatron-Core) and prices **staleness**: an asynchronous plan's step counts
# `1 + penalty x staleness` times (by default 0.1 extra steps per version of staleness, an
# assumption you can change; chapter 13 measured what staleness costs the toy). The same search
# runs from a shell: `python -m rlm_course plan --model llama-3.1-70b --gpus 256 --prompts 512
# --length-buckets 32` (the cells here round the response lengths to 32 levels to plan faster; the
# command's default, 64, is finer and can rank two plans within 1% of each other the other way:
# such plans tie at the simulator's resolution, and the command says so).
# The first table shows each plan's choices (a disaggregated plan's rollout + training GPUs;
# every trainer layout recomputes activations, and those with tensor or pipeline parallelism keep
# fp32 main gradients, so the table leaves both words out), the second its numbers.

# %%
from rlm_course.cluster.calibration import calibrated_rates
from rlm_course.cluster.planner import format_plan, mode_key, plan

rates = calibrated_rates(h100)
r1_workload = Workload.long_tailed(512, 16, 512, 4000, 0.8, 16384, seed=0)
runs = {("llama-3.1-70b", g): None for g in (64, 256)}
runs.update({("deepseek-v3", g): None for g in (256, 1024)})
for model, gpus in runs:
    runs[(model, gpus)] = plan(get_spec(model), grpo, r1_workload, h100, gpus, rates=rates,
                               length_buckets=32)
choice, numbers = [], []
for (model, gpus), result in runs.items():
    s, r = result.best.scenario, result.best.result
    trainer_text = s.trainer_layout.describe().replace(" recompute", "").replace(" fp32-grads", "")
    pools = "colocated" if s.placement == "colocated" else f"{s.rollout_gpus} + {s.trainer_pool}"
    choice.append([model, f"{gpus:,}", pools, s.generation_tp, trainer_text, mode_key(s.mode)])
    numbers.append([model, f"{gpus:,}", f"{r.step_seconds:,.0f}", f"{r.staleness:.2f}",
                    f"{r.tokens_per_second / gpus:,.0f}", f"{r.generation_share:.0%}"])
tables = [format_table(choice, ["model", "GPUs", "rollout + train", "gen tp", "trainer",
                                "mode"]),
          format_table(numbers, ["model", "GPUs", "step s", "staleness", "tokens/s/GPU",
                                 "gen wait"])]
print(tables[0], tables[1], sep="\n\n")
assert max(len(line) for t in tables for line in t.splitlines()) <= 100

# %%
text = format_plan(runs[("deepseek-v3", 1024)], top=2)
print(text)
assert max(len(line) for line in text.splitlines()) <= 100  # wrapped at spaces, never mid-number

# %% [markdown]
# **Against published configurations.** NeMo-RL runs DeepSeek-V3 on 256-512 H100s with
# generation TP 32 and training EP 16 x PP 16 (its performance summary); verl on 96 H20s with
# generation TP 32 and training TP 8 x PP 12 x EP 8. Compare the planner's choices printed above:
# the generation TP it picks for the 671B model (its 1.3 TB of bf16 weights need many 80 GB
# devices per replica, and its latent KV cache is held whole by every TP rank, so wide TP buys no
# KV room), and the trainer layouts with pipeline depth and expert parallelism. For the 70B model
# compare its trainer with the Megatron TP 8 layouts NeMo-RL and verl use: where the planner
# prefers FSDP, it is because the calibrated rates price Megatron's tensor and pipeline
# parallelism dearer than FSDP's gathers (a rate you can move in the sensitivity table below).
# The cell below states what the table shows, so that the text cannot drift from it.

# %%
best_dsv3 = runs[("deepseek-v3", 1024)].best.scenario
best_70b = runs[("llama-3.1-70b", 256)].best.scenario
print(f"DeepSeek-V3 on 1,024 H100s: generation TP {best_dsv3.generation_tp}, trainer "
      f"{best_dsv3.trainer_layout.describe()}\nLlama-3.1-70B on 256: generation TP "
      f"{best_70b.generation_tp}, trainer {best_70b.trainer_layout.describe()}")
assert best_dsv3.generation_tp >= 16  # 1.3 TB of bf16 weights: many devices per replica
assert best_dsv3.trainer_layout.pp * best_dsv3.trainer_layout.ep > 1

# %% [markdown]
# **Which rates decide the plan?** The plan above rests on measured rates; if yours differ, does
# the answer change? `sensitivity` plans again with one rate moved at a time (70B on 256 H100s):
# the per-step decode latency (0: a roofline engine; 30 ms: an engine without CUDA graphs), a
# lower training HFU, a minute of fixed weight-sync seconds, and a dearer price of staleness.
# (`python -m rlm_course plan ... --sensitivity` runs the full default sweep.)

# %%
from rlm_course.cluster.planner import sensitivity

rows_s = sensitivity(spec70, grpo, r1_workload, h100, 256, rates=rates, length_buckets=32,
                     base=runs[("llama-3.1-70b", 256)], progress=True,
                     variations={"decode_step_latency": (0.0, 0.03), "train_hfu": (0.3,),
                                 "sync_fixed_seconds": (60.0,), "staleness_penalty": (0.5,)})
base_name = runs[("llama-3.1-70b", 256)].best.name
print(format_table([[r["rate"], f"{r['value']:g}", r["best"], f"{r['step']:,.0f}",
                     f"{r['cost']:,.0f}",
                     "" if r["best"] == base_name else
                     f"{'yes' if r['flips'] else 'tie'} (+{r['behind']:.1%})"] for r in rows_s],
                   ["rate", "value", "best plan", "step s", "priced s", "flips"]))
flips = sorted({r["rate"] for r in rows_s if r["flips"]})
print("rates whose plausible range changes the best plan:", ", ".join(flips) or "none")

# %% [markdown]
# Where a row flips, the plan depends on that rate: measure it on your engine before you commit
# devices (chapter 05 shows how to time a decode step; a short run gives the HFU). Where nothing
# flips, the choice is robust to what you do not know. A *tie* is a row whose best plan beats the
# one above by 1% or less of the priced step (the `+` column: how much dearer the plan above is
# there): within the simulator's resolution (its length buckets alone move a step by about that
# much), so the rate does not decide between the two.
#
# ## 5. Which choice matters most as the cluster grows?
#
# For each plan, how much slower the best candidate is when one choice is held at its simple
# default: colocated placement, the synchronous mode, or any generation TP but the one the best
# plan uses. (Each is the best of the candidates the search simulated under that restriction; the
# search's pruning picks splits with the `async` mode, so these slowdowns are upper bounds.) A
# restriction no plan satisfies is drawn as a cross at the top of the panel, "none fits": for
# DeepSeek-V3 no generation TP below 32 holds its 1.3 TB of bf16 weights in 76 GB per device, so
# there is no "other generation tp" to compare with. Where the best colocated plan is also the best
# synchronous one, the two restrictions give the same slowdown and their lines coincide (the
# dashed line on the solid one).

# %%
def restricted(result, keep) -> float:
    steps = [c.step for c in result.ranked if keep(c.scenario)]
    return min(steps) / result.best.step if steps else math.nan


choices = {"colocated only": lambda s: s.placement == "colocated",
           "synchronous only": lambda s: s.mode.staleness == 0 and not s.mode.stage_fusion,
           "other generation tp": None}
def slowdown(result, keep) -> float:
    if keep is None:  # the best plan with any generation tp but the winner's
        tp = result.best.scenario.generation_tp
        return restricted(result, lambda s: s.generation_tp != tp)
    return restricted(result, keep)


fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True, layout="constrained")
y_none = 1.05 * max(v for r in runs.values() for keep in choices.values()
                 if not math.isnan(v := slowdown(r, keep)))
missing = []
for ax, model in zip(axes, ("llama-3.1-70b", "deepseek-v3")):
    sizes = [g for m, g in runs if m == model]
    for color, style, (label, keep) in zip(("C0", "C1", "C2"), ("o-", "s--", "^:"),
                                           choices.items()):
        values = [slowdown(runs[(model, g)], keep) for g in sizes]
        ax.plot(sizes, values, style, color=color, label=label, ms=7 if style == "o-" else 4)
        gaps = [g for g, v in zip(sizes, values) if math.isnan(v)]
        if gaps:  # no plan under this restriction: say so instead of leaving the line out
            ax.plot(gaps, [y_none] * len(gaps), "x", color=color, ms=8, label=f"{label}: none fits")
            missing.append((model, label, gaps))
    ax.set(xscale="log", xlabel="H100s", title=model)
    ax.set_xticks(sizes, [f"{g:,}" for g in sizes])
    ax.minorticks_off()
    ax.legend(fontsize=7)
axes[0].set_ylabel("slowdown vs the best plan");
assert all(restricted(r, lambda s: True) == 1 for r in runs.values())
print("restrictions no plan satisfies:", missing)
assert missing == [("deepseek-v3", "other generation tp", [256, 1024])]

# %%
slowdowns = {(model, g, label): (restricted(runs[(model, g)], keep) if keep else math.nan)
             for (model, g) in runs for label, keep in choices.items()}
for model in ("llama-3.1-70b", "deepseek-v3"):
    worst = max(((v, g, label) for (m, g, label), v in slowdowns.items()
                 if m == model and not math.isnan(v)), default=None)
    share = {g: runs[(m, g)].best.result.generation_share for (m, g) in runs if m == model}
    print(f"{model}: the costliest restriction is '{worst[2]}' at {worst[1]:,} GPUs "
          f"({worst[0]:.2f}x slower); the best plans wait for generation "
          + ", ".join(f"{v:.0%} at {g:,}" for g, v in share.items()))

# %% [markdown]
# Read the slowdowns from the plot and the lines above (they depend on the workload you give the
# planner and on the rates). When the synchronous mode costs most, the rollout's tail leaves
# devices idle that only overlapping training with generation recovers; when the placement does,
# the rollout needs its own share of the devices. In both cases the choices that shape
# generation, whose depth does not shrink with devices (chapter 06), are worth more than a better
# trainer layout, which is compute-bound and scales.
#
# ## 6. The planner as a widget
#
# The same planner with controls: choose a model, a device, a cluster size, an algorithm and a
# workload, press **Plan**, and read the best plans and why the others lose (the text `python -m
# rlm_course plan` prints). The cell below plans once with the controls' defaults (Llama-3.1-70B on
# 64 H100s) so that an answer is on screen. Change a control and the answer greys out under
# "settings changed: press Plan to update" until you press Plan again. A setting that makes no
# sense gets the planner's error instead of a silently corrected value: try 0 GPUs, or
# DeepSeek-V3 on 16 GPUs, where the answer says how many GPUs would fit.

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.cluster.planner_widget import PlannerWidget

planner = PlannerWidget()
planner.run()
assert planner.message == "" and planner.result.best.step > 0
planner.widget

# %% [markdown]
# Behind the widget's answer when nothing fits is `smallest_fitting_gpus`: it doubles the GPU
# count until some plan fits memory, then checks every count one would provision from the one
# asked up to it (whole nodes), smallest first, then the counts between the last miss and the
# first fit, memory only, in a second or two. Every one: fitting is not monotonic in the count,
# since a count that factors badly can miss where smaller ones fit (Llama-3.1-70B with this
# workload misses on 13 and 17 H100s and fits on 12, 14, 15, 16 and 24: 13 and 17 are primes, so
# a colocated engine would have generation TP 1, 141 GB of weights on one device, and every split
# into two pools leaves a trainer of too few devices for its FSDP shards):

# %%
from rlm_course.cluster.planner import fits_memory, smallest_fitting_gpus

search = smallest_fitting_gpus(get_spec("deepseek-v3"), grpo, r1_workload, h100, 16, rates=rates)
print(f"DeepSeek-V3 on 16 H100s: no layout fits; {search.describe()}; counts checked: "
      f"{search.checked}")
assert search.fits == 96 and search.below == 88
fit = {n: fits_memory(get_spec("llama-3.1-70b"), grpo, r1_workload, h100, n, rates)[0]
       for n in (12, 13, 14, 15, 16, 17, 24)}
print(f"Llama-3.1-70B fits memory on: {fit}")
assert fit == {12: True, 13: False, 14: True, 15: True, 16: True, 17: False, 24: True}

# %% [markdown]
# ## Exercises
#
# * `exercises/ex14_plan_a_cluster.py` (check with `python -m rlm_course grade 14` or its
#   notebook): write chapter 07's communication roofline, `min_tokens_per_device`, and chapter
#   08's choice of generation TP, `choose_generation_tp`.
# * **An open-ended planning problem.** You have 512 H100s for three weeks to run DAPO on
#   Qwen2.5-32B: 512 prompts x 16 responses per step, a mean of 3,000 tokens with a long tail to
#   20,480. How many steps can you run, with which plan, and what would you change first if the
#   run's measured generation were twice as slow as the plan assumes?
#
# <details><summary>Answer</summary>
#
# Model the workload, plan with the calibrated rates, then read the best plan: the next cell
# prints it, about 150 s per step (about 170 s priced for its staleness) and so about 10,700
# steps' worth of progress in three weeks (the cell checks these numbers). They leave out one
# thing: DAPO's dynamic sampling generates more groups than it keeps (about three prompts for
# every one kept when most groups are all right or all wrong), so the rollout pool does up to
# three times the work priced here; `plan(..., oversample=3)` (`plan --oversample 3` in a shell)
# generates three prompts for each one trained and drops the extra groups, which bounds the step
# from above. What to change first if
# generation is twice as slow as planned: not the trainer, whose layout barely
# matters; give the rollout a larger share of the devices or raise the staleness bound so that
# the rollout runs further ahead (both are the planner's knobs: plan again with the measured
# `decode_step_latency`, as section 4's sensitivity table does), and shorten the tail (an
# overlong penalty, a tighter budget, partial rollouts) since the tail is the depth no device
# count removes.
#
# </details>

# %%

dapo_load = Workload.long_tailed(512, 16, 512, 3000, 0.8, 20480, seed=0)
dapo = algorithm("dapo", minibatches=16)
answer = plan(get_spec("qwen2.5-32b"), dapo, dapo_load, h100, 512, rates=rates,
              length_buckets=32)
best = answer.best
steps = 21 * 24 * 3600 / best.cost
print(best.name, f"-> {best.step:,.0f} s per step ({best.cost:,.0f} s priced for staleness), "
      f"{steps:,.0f} steps' worth of progress in three weeks; generation "
      f"{best.result.generation_share:.0%} of the step")
assert 130 < best.step < 180 and 150 < best.cost < 190  # the answer's "about 150 s (170 s)"
assert 9_500 < steps < 12_000  # "about 10,700 steps"

# %% [markdown]
# > **Key numbers and takeaways**
# >
# > * A 10,000-GPU RL iteration simulates in seconds of wall time, and the planner searches a
# >   10,000-GPU cluster in seconds (`python -m rlm_course bench simulator`): worker groups are
# >   processes, decode steps closed forms between events.
# > * A synchronous step is the sum of its stages; with separate pools and one step of
# >   staleness it is the longer of generation and training, plus the weight transfer.
# > * One cost model, calibrated once per family of systems on a few declared published figures,
# >   predicts the rest without refitting; section 3 prints how many it gets within 30% (25% on a
# >   speed-up's gain), beside a null model, and why the misses miss (`python -m rlm_course
# >   validate`).
# > * What real systems pay beyond the roofline decides plans: milliseconds per decode step and
# >   per sequence, seconds per synced tensor, an MoE's low training efficiency; the planner's
# >   sensitivity table shows which of them flips a plan.
# > * Asynchrony hides generation's depth but costs staleness; the planner prices it, and the
# >   price is yours to set.
#
# ## Further reading
#
# * HybridFlow / verl (Sheng et al. 2024, arXiv:2409.19256): the single controller and the
#   auto-mapping that searches placements with a simulator; verl's one-step-off and fully-async
#   recipes (`docs/advance/one_step_off.md`, `docs/advance/fully_async.md`).
# * AReaL (Fu et al. 2025, arXiv:2505.24298): asynchronous RL with a staleness bound and
#   interruptible rollouts; ReaL (arXiv:2406.14088): an estimator-driven search over execution
#   plans; RLHFuse (arXiv:2409.13221): stage fusion; StreamRL (arXiv:2504.15930).
# * NeMo-RL's performance summary (`docs/about/performance-summary.md`) and verl's DeepSeek
#   guide (`docs/perf/dpsk.md`): configurations and step times of large MoE runs.
# * SimPy's documentation, https://simpy.readthedocs.io: processes, events, resources.
