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
# # 05 · Anatomy of an RL step
#
# Where do the FLOPs, the bytes, the memory and the seconds of one PPO or GRPO iteration go? We
# predict them from formulas, measure them on the tiny model, and then use the same formulas for
# 8B and 70B models on H100s.
#
# Two numbers decide the time of a kernel on a device: its FLOPs and the bytes it moves from
# memory. With peak `F` FLOP/s and bandwidth `B` bytes/s, it takes at least
# `max(FLOPs / F, bytes / B)`: the **roofline** (Williams et al. 2009). The ratio FLOPs/bytes is the
# kernel's **arithmetic intensity**; below the device's **ridge point** `F / B` it is memory-bound.
# Prefill and training process many tokens per weight read; decode reads every weight to produce
# one token per sequence.

# %%
# NBVAL_IGNORE_OUTPUT
import matplotlib.pyplot as plt
import torch

from rlm_course.utils import seed_everything

seed_everything(0)
print(torch.__version__, "threads:", torch.get_num_threads())

# %% [markdown]
# ## 1. Predicted vs measured FLOPs, stage by stage
#
# `measure_step` runs one real step under `torch.utils.flop_counter` and reads the counter at the
# start and end of each stage; `predict_iteration_flops` computes the same from the step's shapes
# (prompt and response columns, responses generated and trained).

# %%
from rlm_course.cost.profiling import measure_step
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.algorithms import preset
from rlm_course.rl.runs import load_sft_policy
from rlm_course.rl.trainer import RLTrainer
from rlm_course.tasks import get_task
from rlm_course.tasks.eval_sets import load_eval_set
from rlm_course.utils import format_table

tok, task = CharTokenizer(), get_task("addition", digits=3)
held_out = load_eval_set(task)
rows, steps, timed = [], {}, {}
for variant in ("grpo", "ppo"):
    policy, _ = load_sft_policy(task, tok)
    trainer = RLTrainer(policy, task, tok, preset(variant, eval_every=1000), held_out)
    trainer.step()  # warm-up: the first step pays one-off costs
    steps[variant] = row = measure_step(trainer)
    timed[variant] = trainer.step()  # timings without the counter's overhead
    for stage in ("generation", "scoring", "training"):
        measured, predicted = row["measured_flops"][stage], row["predicted_flops"][stage]
        rows.append([variant, stage, f"{predicted / 1e9:.2f}", f"{measured / 1e9:.2f}",
                     f"{measured / predicted:.3f}"])
        assert abs(measured / predicted - 1) < 0.05
print(format_table(rows, ["algorithm", "stage", "predicted GFLOP", "measured GFLOP", "ratio"]))

# %% [markdown]
# ## 2. Predicted vs measured time
#
# For the time we need this machine's roofline: its peak (the best fp32 matmul rate) and its
# memory bandwidth (the best large-copy rate), measured now. The predicted time of a stage is its
# FLOPs at peak or its bytes at full bandwidth, whichever is longer (`rlm_course.cost.anatomy`, with the
# tiny model as an architecture and this step's shapes); the ratio shows how far each stage is
# from the bound.

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.cost.hardware import measure_this_machine

cpu = measure_this_machine(write=False)
print(f"this machine: {cpu.peak_flops / 1e9:.0f} GFLOP/s peak, {cpu.memory_bandwidth / 1e9:.1f} GB/s, "
      f"ridge point {cpu.ridge_point:.1f} FLOP/B")

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.cost.anatomy import Workload, stage_costs
from rlm_course.cost.architectures import from_model_config

tiny = from_model_config(policy.config)
rows = []
for variant, row in steps.items():
    config = preset(variant)
    per_mini = row["responses_trained"] // config.minibatches
    work = Workload(row["responses_trained"], 1, row["prompt_columns"], row["response_columns"],
                    micro_batch=per_mini, weight_bytes=4, kv_bytes=4)  # fp32 on this machine
    costs = stage_costs(tiny, config, work)
    bound = {"generation": costs["prefill"].seconds(cpu) + costs["decode"].seconds(cpu),
             "scoring": costs["scoring"].seconds(cpu),
             "training": sum(c.seconds(cpu) for s, c in costs.items() if s.endswith("update"))}
    measured = {s: timed[variant][f"seconds_{s}"] for s in bound}
    for s in bound:
        rows.append([variant, s, f"{bound[s] * 1e3:.1f}", f"{measured[s] * 1e3:.1f}",
                     f"{measured[s] / bound[s]:.1f}x", f"{bound[s] / sum(bound.values()):.0%}",
                     f"{measured[s] / sum(measured.values()):.0%}"])
print(format_table(rows, ["algorithm", "stage", "roofline ms", "measured ms", "measured / roofline",
                          "predicted share", "measured share"]))

# %% [markdown]
# Generation is the furthest from its bound: every decode step is a separate small forward pass
# (a handful of tokens per sequence), so it is memory- and overhead-bound, not compute-bound.
# `torch.profiler` shows where a step's time goes, operator by operator:

# %%
# NBVAL_IGNORE_OUTPUT
from torch.profiler import ProfilerActivity, profile

with profile(activities=[ProfilerActivity.CPU]) as prof:
    trainer.step()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))

# %% [markdown]
# ## 3. The roofline of this machine, with measured points
#
# Prefill and decode of the tiny model for batches of 1 to 256 sequences. The weights are read
# once per pass whatever the batch, so the intensity grows with the batch: decode climbs the
# bandwidth slope, prefill reaches the compute roof.

# %%
from rlm_course.cost.profiling import roofline_points

points = roofline_points(policy)
xs = [10 ** (k / 10) for k in range(-10, 31)]
plt.figure(figsize=(6, 4))
plt.loglog(xs, [min(cpu.peak_flops, x * cpu.memory_bandwidth) for x in xs], "k-", label="roofline")
for kind, marker in (("prefill", "o"), ("decode", "s")):
    pts = [p for p in points if p["kind"] == kind]
    plt.loglog([p["intensity"] for p in pts], [p["flops_per_s"] for p in pts], marker,
               label=f"{kind} (batch {pts[0]['batch']}..{pts[-1]['batch']})")
plt.xlabel("arithmetic intensity (FLOP/byte)"); plt.ylabel("FLOP/s"); plt.legend(fontsize=8)
plt.title("tiny model on this machine");
decode = [p["intensity"] for p in points if p["kind"] == "decode"]
assert decode == sorted(decode)

# %% [markdown]
# ## 4. At scale: an 8B and a 70B policy on 64 H100s
#
# The same accounting for real architectures (`rlm_course.cost.architectures`: Llama-3-8B and 70B with
# grouped-query attention and SwiGLU) and a GRPO workload of 512 prompts x 16 samples, 512-token
# prompts and 2,048-token responses, in 16 gradient steps; generation runs in replicas of `tp`
# GPUs, and **each replica reads all of its weights at every decode step**. When the KV caches of
# a replica's sequences do not fit beside its weights, it decodes them in several waves, reading
# the weights again for each.

# %%
from rlm_course.cost.anatomy import Workload, shares, stage_costs, stage_seconds
from rlm_course.cost.architectures import get_spec
from rlm_course.cost.hardware import get_device

h100 = get_device("H100-SXM-80GB")
work = Workload(prompts=512, group_size=16, prompt_len=512, response_len=2048)
rows = []
for name, tp in (("llama-3-8b", 1), ("llama-3-70b", 8)):
    for variant in ("grpo", "ppo"):
        config = preset(variant, group_size=16 if variant == "grpo" else 1,
                        prompts_per_step=512 if variant == "grpo" else 8192, minibatches=16)
        w = work if variant == "grpo" else Workload(8192, 1, 512, 2048)
        costs = stage_costs(get_spec(name), config, w)
        seconds = stage_seconds(costs, h100, devices=64, generation_tp=tp)
        flop_share = shares({s: c.flops for s, c in costs.items()})
        time_share = shares(seconds)
        gen = ("prefill", "decode")
        waves = costs["decode"].waves(h100, 64, tp)
        rows.append([name, f"{variant}, tp {tp}", f"{sum(flop_share[s] for s in gen):.0%}",
                     f"{sum(time_share[s] for s in gen):.0%}", waves,
                     f"{sum(seconds.values()):.0f}"])
print(format_table(rows, ["model", "algorithm", "generation FLOP share", "generation time share",
                          "decode waves", "iteration s (bound)"]))

# %% [markdown]
# Even at the roofline, with every other stage at full peak, generation's share of the time is
# larger than its share of the FLOPs: several times larger for the 8B model, whose many small
# replicas each re-read their weights at every step; less so for the 70B model here, whose
# training FLOPs also grow. This bound is optimistic for generation: real systems run training at
# 30-50% of peak, but decode also waits for the longest response of the batch (its depth, chapter
# 06). Measured systems report generation at about 70% of a step or more (verl's DAPO recipe on a
# 32B model, `docs/advance/one_step_off.md`; NeMo-Aligner's 405B PPO, about 140 s of a 165 s step,
# arXiv:2405.01481).
#
# Why decode is memory-bound: its intensity is at most about the batch size (2 FLOPs per weight
# per sequence, 2 bytes per bf16 weight), and the KV-cache reads, which grow with the context and
# are not shared by the batch, pull it further down: at long contexts it stays below the H100's
# ridge point however many sequences share a replica.

# %%
from rlm_course.cost.anatomy import decode_intensity, prefill_intensity

llama = get_spec("llama-3-8b")
batches = [1, 4, 16, 64, 256, 1024]
plt.figure(figsize=(6, 3.5))
for context in (512, 4096, 32768):
    plt.loglog(batches, [decode_intensity(llama, b, context) for b in batches], "o-",
               label=f"decode, context {context}")
plt.loglog(batches, [prefill_intensity(llama, b, 512) for b in batches], "k--",
           label="prefill, 512 tokens")
plt.axhline(h100.ridge_point, color="red", lw=1, label=f"H100 ridge ({h100.ridge_point:.0f})")
plt.xlabel("sequences per replica"); plt.ylabel("FLOP / byte"); plt.legend(fontsize=7);

# %% [markdown]
# ## 5. Memory
#
# Trained models keep 16 bytes per parameter (bf16 weights and gradients, fp32 master weights and
# Adam moments; ZeRO, arXiv:1910.02054); a frozen reference 2; the KV cache of the rollout grows
# with responses x length x `2 L n_kv d_head` elements per token (x 2 bytes in bf16); activations
# with the micro-batch and the sequence length, unless recomputed. ZeRO shards the 16 bytes over
# the data-parallel devices (`zero_model_state_bytes`).

# %%
from rlm_course.cost.anatomy import memory

for name in ("llama-3-8b", "llama-3-70b"):
    spec = get_spec(name)
    print(f"{name}: {spec.params() / 1e9:.2f}B parameters, "
          f"KV cache {spec.kv_cache_bytes_per_token() / 1024:.0f} KiB per token (bf16)")
    for variant in ("grpo", "ppo"):
        parts = memory(spec, preset(variant), Workload(512, 16, 512, 2048, micro_batch=4))
        print(f"   {variant:<5}" + ", ".join(f"{k} {v / 1e9:,.0f} GB" for k, v in parts.items()))

# %% [markdown]
# ## 6. The calculator
#
# Every number above, for any model, algorithm, workload and cluster. Change the controls (or set
# them from code, e.g. `calc.controls["response_len"].value = 16384`).

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.tools.widgets import RLStepCalculator

calc = RLStepCalculator()
calc.widget

# %%
calc.controls["response_len"].value = 8192
print(f"8k-token responses: {calc.result['seconds']:.0f} s per iteration (roofline bound), "
      f"decode {calc.result['time_shares']['decode']:.0%} of it")
assert calc.message == ""

# %% [markdown]
# ## Questions
#
# * Double the group size in the calculator. Which stages grow, and by how much? Now double the
#   response length instead.
# * Move the 70B model's generation from `tp = 4` to `tp = 8`. Why does the decode time drop
#   although the FLOPs do not change?
# * Which is larger for a GRPO run of Llama-3-8B with 16 samples of 8k tokens: the KV cache of the
#   rollout or the policy's training state?
#
# ## Exercises
#
# Write the KV-cache size formula and the decode arithmetic intensity in
# `exercises/ex05_anatomy.py`; check them with `exercises/ex05_anatomy.ipynb` or
# `python -m rlm_course grade 05`.
