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
# **Learning objectives.** After this chapter you can:
#
# 1. derive the FLOPs of a forward and a training pass (the `6N` rule and the attention term) and
#    check them against a FLOP counter, stage by stage;
# 2. place prefill, decode and training on a roofline, and say what limits each one on this
#    machine and on a GPU;
# 3. estimate the memory (model states, reference, KV cache, activations) and a lower bound on the
#    time of an RL iteration at scale, including what a long tail of response lengths costs;
# 4. say what MFU measures, and what a roofline bound leaves out.
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
from tqdm.auto import tqdm

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
progress = tqdm(total=6, desc="GRPO then PPO: warm-up, counted and timed steps")
for variant in ("grpo", "ppo"):
    policy, _ = load_sft_policy(task, tok)
    trainer = RLTrainer(policy, task, tok, preset(variant, eval_every=1000), held_out)
    trainer.step()  # warm-up: the first step pays one-off costs
    progress.update()
    steps[variant] = row = measure_step(trainer)
    progress.update()
    timed[variant] = trainer.step()  # timings without the counter's overhead
    progress.update()
    for stage in ("generation", "scoring", "training"):
        measured, predicted = row["measured_flops"][stage], row["predicted_flops"][stage]
        rows.append([variant, stage, f"{predicted / 1e9:.2f}", f"{measured / 1e9:.2f}",
                     f"{measured / predicted:.3f}"])
        assert abs(measured / predicted - 1) < 0.05
progress.close()
print(format_table(rows, ["algorithm", "stage", "predicted GFLOP", "measured GFLOP", "ratio"]))

# %% [markdown]
# ### Where `6N` comes from, and what MFU counts
#
# **Forward: `2N` per token.** A linear layer `y = x W` with `W` of shape `(k, n)` does, for each
# token, one multiply and one add per weight: `2 k n` FLOPs. Summed over every weight that takes
# part in a matmul, a forward pass costs `2N` FLOPs per token, `N` the matmul parameters
# (Kaplan et al. 2020, arXiv:2001.08361, section 2.1, whose `N` leaves out the embedding and the
# output head; counting the head, which is a matmul, follows PaLM and Megatron).
#
# **Backward: `4N` per token.** The backward of the same layer needs two matmuls of the same
# size: the gradient for the layer's input, `dx = dy W^T` (to pass back to the layer below), and
# the gradient for the weight, `dW = x^T dy` (for the optimizer). Each costs `2 k n` per token, so
# the backward is twice the forward, **2:1**, and a training step is `2N + 4N = 6N` per token:
# three forwards' worth. With **full activation recomputation** the forward runs once more during
# the backward: `8N`, four forwards' worth.
#
# The GRPO step above shows it in measured numbers: its scoring runs two forwards (old policy and
# reference) over the same tokens that training runs one forward and one backward over, so
# training / (scoring / 2) should be 3.

# %%
grpo_flops = steps["grpo"]["measured_flops"]
ratio = grpo_flops["training"] / (grpo_flops["scoring"] / 2)
print(f"measured training FLOPs / one scoring forward = {ratio:.3f}")
assert abs(ratio - 3) < 0.05

# %% [markdown]
# **The attention term, and its convention.** Attention adds FLOPs that no weight accounts for:
# `q k^T` and `softmax(.) v` cost `2 d_h` FLOPs each per query, key and head, so a forward over
# `S` tokens adds `4 L H d_h S^2` per sequence. The course counts the **full** score matrix, as a
# kernel that computes it does (the forward third of PaLM's `12 L H Q T` training term, Chowdhery
# et al. 2022, arXiv:2204.02311, appendix B). Causal counters count only the lower triangle, half
# of it: verl's MFU counter uses `6 L H d_h sum_s s^2` for forward and backward
# (`verl/utils/flops_counter.py`, since its PR #4959 of January 2026; before it verl used 12,
# the course's count), **half** the course's `12 L H d_h S^2`. Compare two MFU figures only
# after checking which count, and which version of the counter, they use. For Llama-3-8B on 4,096-token sequences:

# %%
from rlm_course.cost.architectures import get_spec

llama = get_spec("llama-3-8b")
S = 4096
dense = 6 * llama.matmul_params() * S
course = 3 * 4 * llama.n_layer * llama.n_head * llama.head_dim * S**2
causal = 6 * llama.n_layer * llama.n_head * llama.head_dim * S**2
print(f"training FLOPs of one {S}-token sequence: 6N part {dense / 1e12:.0f} TFLOP; attention "
      f"{course / 1e12:.1f} TFLOP (course, full matrix) or {causal / 1e12:.1f} TFLOP (causal "
      f"count): +{course / dense:.0%} or +{causal / dense:.0%}")
assert course == 2 * causal

# %% [markdown]
# **MFU** (model FLOPs utilization; PaLM, Chowdhery et al. 2022, appendix B) is the FLOPs the
# model *needs* per second, counted by such a formula (`6N` per token plus attention, recomputation
# not counted), divided by the device's peak FLOP/s. Recomputed forwards make the step slower but
# not the model's FLOPs larger, so they lower MFU (the count that includes them is the hardware
# FLOPs utilization). What `python -m rlm_course bench train` reports under the key `mfu` is the
# achieved FLOP/s over **this machine's best measured fp32 matmul rate**, not over a datasheet
# peak: a fraction of the measured matmul rate, which is what a CPU can reach.
#
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
print(f"mean response: {steps['grpo']['response_length']:.1f} tokens")

# %% [markdown]
# Read the ratios: no stage reaches its bound, and how far each one stays from it is a property
# of this machine. Generation here is a prefill plus four or five decode steps (the answers are
# that short), each a separate small forward pass with its own fixed costs (Python, kernel
# launches, sampling) that the roofline does not count. `torch.profiler` shows where a step's
# time goes, operator by operator:

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.cost.profiling import profile_ops

print(profile_ops(trainer.step, row_limit=8))

# %% [markdown]
# ## 3. The roofline of this machine, with measured points
#
# Prefill and decode of the tiny model for batches of 1 to 256 sequences. The weights are read
# once per pass whatever the batch, so the intensity grows with the batch. Where do the measured
# points land?

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

# %%
# NBVAL_IGNORE_OUTPUT
weights_mb = sum(p.numel() * p.element_size() for p in policy.parameters()) / 1e6
print(f"fp32 weights of the tiny model: {weights_mb:.1f} MB")
print(format_table([[p["kind"], p["batch"], f"{p['intensity']:.1f}", f"{p['seconds'] * 1e3:.2f}",
                     f"{p['flops_per_s'] / cpu.peak_flops:.0%}",
                     f"{p['bytes'] / p['seconds'] / 1e9:.1f}"] for p in points],
                   ["kind", "batch", "FLOP/B", "ms per pass", "of the matmul peak",
                    "bytes counted / s (GB/s)"]))
best_prefill = max(p["flops_per_s"] for p in points if p["kind"] == "prefill") / cpu.peak_flops
decode_rate = max(p["bytes"] / p["seconds"] for p in points if p["kind"] == "decode")
print(f"prefill at best: {best_prefill:.0%} of the matmul peak; decode moves at most "
      f"{decode_rate / 1e9:.1f} GB/s of the bytes it counts, against {cpu.memory_bandwidth / 1e9:.1f} "
      "GB/s of DRAM bandwidth")

# %% [markdown]
# What the table says (read your own numbers; they vary between machines and runs):
#
# * **prefill does not reach the compute roof.** Its matmuls are those of a 128-wide model, far
#   smaller than the square matmuls that set the peak, and it reaches only a fraction of that peak
#   even at batch 256.
# * **decode is not limited by DRAM bandwidth here.** Its points lie far below the DRAM slope: the
#   bytes it counts move at a small fraction of the bandwidth. The 3 MB of weights are small
#   enough to stay in the CPU's caches from one step to the next, so they are not even read from
#   DRAM; and a decode step of 16 sequences costs far less than 16 times a step of one (the "ms
#   per pass" column). What a step costs whatever its batch is **per-step latency**: fixed costs
#   paid once per step.
#
# On a GPU with a model of billions of parameters neither escape exists: the weights (16 GB for an
# 8B model in bf16) cannot stay in any cache, so every decode step streams them from HBM and rides
# the bandwidth slope, plus its per-step latency. The rest of the chapter is about that regime,
# with catalog figures instead of measurements.
#
# ### Where the time of a tiny step goes: the overhead-bound end of the roofline
#
# Below the roofline's two slopes there is a third regime: **overhead-bound**. Every operator
# call costs a fixed few microseconds (Python, PyTorch's dispatcher, allocating the output,
# starting the kernel) whatever its size. A decode step of the tiny model makes a few hundred
# calls for about 0.1 GFLOP of arithmetic, so the calls alone can cost as much as the arithmetic.
# `where_time_goes` times a step without the profiler (`wall`), then runs it once under
# `torch.profiler` to read the matmul and attention kernels' own time; `rest` is what those leave
# of the wall time (small kernels and the framework between them). Two floors frame it: the
# **FLOP floor** (the step's FLOPs at the measured matmul peak) and the **launch floor** (its
# operator calls times the cost of launching an empty one, `dispatch_floor`).

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.cost.profiling import dispatch_floor, where_time_goes
from rlm_course.lm.model import KVCache, forward_flops

config = policy.config
batch, context = 64, 16
cache = KVCache(config, batch, context + 1)
with torch.no_grad():
    policy(torch.randint(0, config.vocab_size, (batch, context)), None, cache)
token = torch.randint(0, config.vocab_size, (batch, 1))


def decode_step():
    with torch.no_grad():
        cache.length = context
        policy(token, None, cache)


student = type(policy)(config)
student.load_state_dict(policy.state_dict())
optimizer = torch.optim.AdamW(student.parameters(), lr=1e-5)
tokens = torch.randint(0, config.vocab_size, (batch, 24))


def train_step():
    logits = student(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             tokens[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


print(f"one empty operator call: {dispatch_floor() * 1e6:.1f} us")
split = {"decode step (64 x 1 token, 17 keys)":
         where_time_goes(decode_step, forward_flops(config, 1, context + 1, batch),
                         cpu.peak_flops),
         "train step (64 x 23 tokens, AdamW)":
         where_time_goes(train_step, 3 * forward_flops(config, 23, batch=batch), cpu.peak_flops)}
print(format_table([[name, f"{r['wall'] * 1e3:.2f}", f"{r['matmul'] * 1e3:.2f}",
                     f"{r['attention'] * 1e3:.2f}", f"{r['rest'] * 1e3:.2f}", r["operators"],
                     f"{r['launch_floor'] * 1e3:.2f}", f"{r['flop_floor'] * 1e3:.2f}",
                     f"{r['wall'] / r['flop_floor']:.1f}x"] for name, r in split.items()],
                   ["step", "wall ms", "matmul", "attention", "rest", "operator calls",
                    "launch floor", "FLOP floor", "wall / FLOP floor"]))

# %%
for r in split.values():
    assert r["flop_floor"] < r["wall"] and r["operators"] > 50

# %% [markdown]
# Read your own numbers: the decode step sits several times above its FLOP floor, and its `rest`
# (the small kernels and the calls between them) is comparable to the matmuls: that is the
# overhead-bound regime, where fewer, larger operations (a bigger batch, fused kernels,
# `torch.compile` where its compile time pays back, CUDA graphs on a GPU) pay and faster
# arithmetic does not. The train step's matmuls are larger, so a bigger share of its time is
# arithmetic. Inference engines such as vLLM capture the decode step in a CUDA graph for exactly
# this reason: at small batch a GPU decode step is launch-bound too.
#
# ### A kernel's slow path: when 15 tokens cost twice as much as 16
#
# Attention's arithmetic grows with the square of the length, so its time should grow smoothly
# with it. Measure it: one causal self-attention of 256 sequences x 4 heads, for every length from
# 8 to 40 tokens, with PyTorch's SDPA as it is and with the model's own `attention`
# (`rlm_course.lm.attention.attention`), which pads the keys with zeros to the next multiple of 16
# when at most 6 are missing (and the result is at most 128 keys long) and masks the padding out.
# The calls run without gradient: this plot is the forward pass alone.

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.cost.profiling import attention_by_key_length
from rlm_course.lm.attention import KEY_PAD_MULTIPLE, MAX_KEY_PAD

rows = attention_by_key_length(range(8, 41))
lengths = [r["length"] for r in rows]
plt.figure(figsize=(6, 3.5))
plt.plot(lengths, [r["sdpa_seconds"] * 1e3 for r in rows], "o-", ms=3, label="SDPA as it is")
plt.plot(lengths, [r["padded_seconds"] * 1e3 for r in rows], "s-", ms=3,
         label=f"keys padded to a multiple of {KEY_PAD_MULTIPLE} (when <= {MAX_KEY_PAD} short)")
for multiple in range(KEY_PAD_MULTIPLE, 41, KEY_PAD_MULTIPLE):
    plt.axvline(multiple, color="grey", lw=0.5)
plt.xlabel("tokens (queries = keys)"); plt.ylabel("ms per call (best of 11)"); plt.legend(fontsize=8)
plt.title("causal attention, 256 sequences x 4 heads x 32 dims, fp32");
sdpa = {r["length"]: r["sdpa_seconds"] for r in rows}
padded = {r["length"]: r["padded_seconds"] for r in rows}
print(f"SDPA: 15 tokens take {sdpa[15] / sdpa[16]:.1f}x the time of 16, 31 tokens "
      f"{sdpa[31] / sdpa[32]:.1f}x the time of 32; padding 14 tokens to 16 makes the call "
      f"{sdpa[14] / padded[14]:.1f}x faster")

# %% [markdown]
# Read your own plot. On the CPU this chapter was written on (AVX-512, 16 fp32 lanes per
# instruction), SDPA's time climbs with every token past a multiple of 16 and drops back at the
# next one: 15 tokens cost 2 to 2.5 times as much as 16. The kernel runs its inner loop over the
# keys 16 at a time and finishes the remainder on a slower path whose cost grows with the
# remainder; another CPU (AVX2 has 8 lanes, an Apple core 4) shows its own steps, or none. Time is
# not proportional to FLOPs at these sizes.
#
# The fix is a layout choice, not arithmetic: give the kernel the shape it is fast at. The
# padding keys get `exp(-inf) = 0` weight, so the output is unchanged up to rounding; they cost a
# copy, a mask and their share of the arithmetic. In this forward-only plot, padding pays from
# about 8 keys short (24 -> 32); the model pads only when at most 6 are missing because a training
# pass also runs the backward, where the padded keys' gradients and the copies cost more than the
# slow path saves: forward and backward, padding 24 keys to 32 ran 0.96x as fast as not padding,
# 27 to 32 1.07x and 14 to 16 1.28x, on one thread. Just past each multiple of 16 the two curves
# coincide: no padding there. The padded curve is also the noisier one: its copies go through the
# memory allocator, whose time varies from call to call more than the kernel's does, so rerun the
# cell if a point stands out. And only short sequences are padded: past a few hundred keys, an
# explicit mask stops the kernel from skipping the blocks above the causal diagonal, which
# `is_causal=True` lets it do (1,019 keys padded to 1,024 ran 1.4x slower, forward and backward).
#
# The course's default GRPO batches are 14 columns wide (a 9-column prompt and up to 5 response
# tokens), near the worst spot of the sawtooth, so its scoring and training passes take the
# padded path: on the CPU this chapter was written on, a default GRPO step ran 6-8% faster for it.
# On an AVX2 server CPU (AMD EPYC, 2 cores) the same step ran as fast with the padding as without,
# within the 15% that its timings moved from run to run: a rule tuned on one CPU is worth
# re-measuring on the next.
# The same reasoning at scale: GPU matmuls and tensor cores want dimensions divisible by 8, 64 or
# 128, which is why Megatron-LM pads its vocabulary (`--make-vocab-size-divisible-by 128`) and
# nanoGPT rounds GPT-2's 50,257 tokens up to 50,304.
#
# What did *not* pay on that 2-core CPU: `torch.compile` of the training pass (about 25 s to
# compile, then no faster: its matmuls already run near the peak) and of generation (the cache
# grows at every decode step, so the shapes change and the compiled loop ran slower).
# `python -m rlm_course bench compile` measures both on your machine, compile time counted, with
# the number of calls after which compiling pays back: on a 2-core AMD EPYC, 23 s to compile the
# train step, then 0.93x the eager speed; 45 s for generation, then 0.82x; neither ever pays.
# `python -m rlm_course bench peer` sets the course's loop beside Hugging Face `generate` and TRL's
# `GRPOTrainer`, with the FLOP floor of each row: the time the row's FLOPs take at the matmul peak
# measured in the same run. On that CPU, at one thread, the course's generation was 1.21x faster
# than `generate` and its GRPO step 1.02x faster than TRL's (1.28x and 1.14x at two threads;
# both rows of a pair share one floor, so these ratios are the exact ones: rounded multiples of
# the floor, about 4x against 6x and 2.5x against 3x, would read as 1.5x and 1.2x). No
# implementation can beat a step by more than its distance above the floor; the headroom left is
# in generation, whose small per-token kernels and Python loop are overhead, as the profile
# above shows. The bench also gives each row's kernel floor, the course's own matmul and
# attention calls timed alone: on a 2-core Xeon, TRL's step took 2.1x the course's kernel floor
# at one thread, so even a course step that did nothing but its matmuls could not be twice as
# fast as TRL's; `generate` took 3.2x the floor of the course's generation.
#
# ## 4. At scale: an 8B and a 70B policy on 64 H100s
#
# The same accounting for real architectures (`rlm_course.cost.architectures`: Llama-3-8B and 70B with
# grouped-query attention and SwiGLU) and a GRPO workload of 512 prompts x 16 samples, 512-token
# prompts and 2,048-token responses, in 16 gradient steps; generation runs in replicas of `tp`
# GPUs, and **each replica reads all of its weights at every decode step**. When the KV caches of
# a replica's sequences do not fit beside its weights, it decodes them in several waves, reading
# the weights again for each.

# %%
from rlm_course.cost.anatomy import shares, stage_seconds
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
# Even at the roofline, with every stage at full peak or full bandwidth, generation's share of the
# time is larger than its share of the FLOPs: several times larger for the 8B model, whose many
# small replicas each re-read their weights at every step; less so for the 70B model here, whose
# training FLOPs also grow.
#
# **Why this bound flatters decode.** Every stage is at its roofline here, but three assumptions
# help decode more than the others:
#
# 1. **full memory bandwidth**: a real decode step reads its weights and KV cache at a fraction
#    of the datasheet bandwidth;
# 2. **no per-step latency**: kernel launches, sampling, the scheduler and the tensor-parallel
#    collectives of every layer cost a fixed time per step, paid thousands of times (section 3
#    measured it on this machine);
# 3. **equal response lengths**: every response here is exactly 2,048 tokens, so no sequence
#    waits for another. Real reasoning traces have a long tail, and the batch decodes until its
#    longest response ends (section 5).
#
# Chapter 14 measures what these cost on real systems: it fits, once, the seconds a rollout
# engine adds to every decode step beyond this roofline (and per sequence in the batch, and per
# all-reduce of an engine that spans nodes), and the fraction of peak a trainer reaches, on a declared handful of published runs of each system,
# then predicts the others' step times with them (`python -m rlm_course validate`). The fitted
# values:

# %%
from rlm_course.cluster.calibration import calibrated_rates

for family in ("verl", "nemo-rl"):
    fitted = calibrated_rates(family)
    print(f"{family}: {fitted.decode_step_latency * 1e3:.1f} ms per decode step and "
          f"{fitted.decode_sequence_latency * 1e6:.1f} us per sequence beyond the roofline, "
          f"{fitted.cross_node_all_reduce_seconds * 1e6:.0f} us per all-reduce and level of the "
          "node tree across nodes; "
          f"training at {fitted.train_hfu:.0%} of peak (HFU; an MoE at {fitted.moe_efficiency:.0%} "
          "of that)")
    assert fitted.train_hfu <= 1 and fitted.decode_step_latency >= 0

# %% [markdown]
# Measured systems report generation between about 30% and 90% of a step. Several long
# chain-of-thought runs sit at 70% or more (verl's DAPO recipe on a 32B model; OpenRLHF's
# documentation, up to 90%); verl's own 7B DAPO run with 8k-20k-token budgets on 16 H20s spent
# 30-43% (207 s of 699 s with Megatron, 321 s of 749 s with FSDP2,
# `docs/advance/one_step_off.md`): the H20 has little compute and much bandwidth, so its training
# is slow and its decoding relatively fast. NeMo-Aligner's 405B PPO (about 140 s of a 165 s step,
# arXiv:2405.01481) is chat RLHF with short responses, a large model generating: long chains of
# thought are not needed for generation to dominate. The share depends on the hardware, the
# model size, the placement and the length tail.
#
# Why decode is memory-bound: its intensity is at most about the batch size (2 FLOPs per weight
# per sequence, 2 bytes per bf16 weight), and the KV-cache reads, which grow with the context and
# are not shared by the batch, pull it further down: at long contexts it stays below the H100's
# ridge point however many sequences share a replica.

# %%
from rlm_course.cost.anatomy import decode_intensity, prefill_intensity

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
# ## 5. Long tails: the batch waits for its longest response
#
# Response lengths of reasoning models are long-tailed: most responses are of moderate length, a
# few run many times longer. We model them as a log-normal with mean `E[T]` = 2,048 tokens and
# `sigma` = 1 (an assumption for illustration; measure your own runs), capped at a 32k-token
# budget (`rlm_course.cost.anatomy.lognormal_lengths`). A `Workload` with one length per response
# makes the anatomy follow them: the **FLOPs follow each response's own length** (their mean),
# while the batch keeps decoding, and every replica keeps re-reading its weights, until the
# **longest** response `T_max` ends.
#
# The more samples per prompt, the further out the longest one reaches: below, 16 prompts with
# `G` samples each, averaged over 10 draws, for Llama-3-8B on 64 H100s (`tp` = 1), against the
# same batch with every response exactly `E[T]` long.

# %%
from statistics import mean

from rlm_course.cost.anatomy import generation_costs

group_sizes = [2, 4, 8, 16, 32, 64]
curves = {k: [] for k in ("mean", "group max", "batch max", "tail s", "equal s", "flops")}
for G in group_sizes:
    draws = []
    for seed in range(10):
        tail = Workload.long_tailed(16, G, 512, 2048, 1.0, 32768, seed=seed)
        equal = Workload(16, G, 512, round(tail.mean_response_len))
        decode_tail = generation_costs(llama, tail)["decode"]
        draws.append((tail.mean_response_len, mean(tail.group_max_lengths()),
                       tail.max_response_len, decode_tail.seconds(h100, 64),
                       generation_costs(llama, equal)["decode"].seconds(h100, 64),
                       decode_tail.flops / tail.responses))
    for key, values in zip(curves, zip(*draws)):
        curves[key].append(mean(values))
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
for key, style in (("mean", "k:"), ("group max", "o-"), ("batch max", "s-")):
    ax1.semilogx(group_sizes, curves[key], style, base=2, label={"mean": "E[T]",
                 "group max": "longest of each group (mean)", "batch max": "T_max of the batch"}[key])
ax1.set(xlabel="group size G", ylabel="tokens", title="response lengths"); ax1.legend(fontsize=7)
ax2.semilogx(group_sizes, curves["tail s"], "s-", base=2, label="long-tailed lengths")
ax2.semilogx(group_sizes, curves["equal s"], "k:", base=2, label="every response E[T] long")
ax2.set(xlabel="group size G", ylabel="decode seconds (roofline)", title="decode, 64 H100");
ax2.legend(fontsize=7)
fig.tight_layout()
print(format_table([[G, f"{m:.0f}", f"{b:.0f}", f"{t:.0f}", f"{e:.0f}", f"{t / e:.1f}x", f"{f:.3g}"]
                    for G, m, b, t, e, f in zip(group_sizes, curves["mean"], curves["batch max"],
                                                curves["tail s"], curves["equal s"], curves["flops"])],
                   ["G", "E[T]", "T_max", "decode s, tail", "decode s, equal", "ratio",
                    "decode FLOP per response"]))
assert curves["batch max"] == sorted(curves["batch max"])  # more samples, a longer longest one
assert all(t > 2 * e for t, e in zip(curves["tail s"], curves["equal s"]))
assert max(curves["flops"]) < 1.2 * min(curves["flops"])  # FLOPs per response: about flat

# %% [markdown]
# The decode FLOPs per response stay about flat, because the mean length does not change; the
# decode time grows with `G`, because the longest response does. This is the **straggler
# effect**: most replicas finish early and wait, each step of the tail re-reads the weights for a
# handful of sequences. Chapter 06 turns it into the depth of the iteration; chapters 12-13 run
# the systems answers (partial rollouts, asynchronous RL, stage fusion) for real.
#
# ## 6. Memory
#
# Trained models keep 16 bytes per parameter (bf16 weights and gradients, fp32 master weights and
# Adam moments; ZeRO, arXiv:1910.02054); a frozen reference 2; the KV cache of the rollout grows
# with responses x length x `2 L n_kv d_head` elements per token (x 2 bytes in bf16); activations
# with the micro-batch and the sequence length, unless recomputed. ZeRO shards the 16 bytes over
# the data-parallel devices (`zero_model_state_bytes`).
#
# **Activation memory per layer** (Korthikanti et al. 2022, arXiv:2205.05198, section 4.1), for
# `s` tokens, micro-batch `b`, width `h`, `a` heads, 16-bit values (2 bytes) and 1-byte dropout
# masks, counting what the backward needs:
#
# * attention block: the input of the QKV projection (`2sbh`), `Q` and `K` for `Q K^T` (`4sbh`),
#   the softmax output (`2as^2b`), its dropout mask (`as^2b`), the dropout output (`2as^2b`) and
#   `V` (`2sbh`) for the product with `V`, the input of the output projection (`2sbh`) and the
#   output dropout mask (`sbh`): `11sbh + 5as^2b`;
# * MLP (width `4h`): the input of the first matmul (`2sbh`), the GELU's input (`8sbh`) and output
#   (`8sbh`), a dropout mask (`sbh`): `19sbh`;
# * two layer norms, each keeping its input: `4sbh`.
#
# Total `sbh (34 + 5as/h)` bytes per layer. A fused attention kernel (FlashAttention) recomputes
# the `s^2` terms in the backward and keeps `34sbh`; full recomputation keeps only each layer's
# input, `2sbh`, for one more forward. The paper's layer is GPT's: a GELU MLP `4h` wide, as many
# key/value heads as query heads, dropout. The course counts each model's own layer the same way
# (`layer_activation_values`): a gated MLP of width `f` (SwiGLU) keeps its input, the gate's and
# the up-projection's outputs and their product (`2sbh + 6sbf`); grouped-query attention keeps
# smaller `K` and `V`; RL fine-tuning runs these models without dropout, so no masks (and of the
# `5as^2b`, only the softmax's output, `2as^2b`, where no fused kernel recomputes it). A
# Llama-3-8B layer comes to `34sbh` again, a Qwen2.5-7B layer (`f = 5.3h`) to `44sbh`, and a
# DeepSeek-V3 layer to `63sbh` on average: each token keeps the hidden tensors of its 8 experts.

# %%
from rlm_course.cost.anatomy import memory

for name in ("llama-3-8b", "llama-3-70b"):
    spec = get_spec(name)
    print(f"{name}: {spec.params() / 1e9:.2f}B parameters, "
          f"KV cache {spec.kv_cache_bytes_per_token() / 1024:.0f} KiB per token (bf16)")
    for variant in ("grpo", "ppo"):
        parts = memory(spec, preset(variant), Workload(512, 16, 512, 2048, micro_batch=4))
        labels = {"kv cache": "kv cache (whole rollout)",
                  "activations": "activations (one micro-batch)"}
        print(f"   {variant:<5}" + ", ".join(f"{labels.get(k, k)} {v / 1e9:,.0f} GB"
                                           for k, v in parts.items()))
print("model states, reference weights and the KV cache are totals for the whole job, to be "
      "shared among the devices that hold them")
from rlm_course.cost.anatomy import layer_activation_values

per_layer = {name: 2 * sum(layer_activation_values(get_spec(name))) / get_spec(name).d_model
             for name in ("llama-3-8b", "qwen2.5-7b", "deepseek-v3")}
print("activations a layer keeps, in s b h bytes: "
      + ", ".join(f"{name} {v:.0f}" for name, v in per_layer.items()))
assert [round(v) for v in per_layer.values()] == [34, 44, 63]

# %% [markdown]
# ## 7. The calculator
#
# Every number above, for any model, algorithm, workload and cluster. Change the controls (or set
# them from code, as below). A budget past the model's context window is refused with the room
# left: Llama 3 reads 8,192 tokens, so 8k-token responses after 512-token prompts need Llama 3.1
# (the same architecture, `llama-3.1-8b`, 131,072 tokens).

# %%
# NBVAL_IGNORE_OUTPUT
from rlm_course.tools.widgets import RLStepCalculator

calc = RLStepCalculator()
calc.widget

# %%
calc.controls["response_len"].value = 8192
assert "llama-3-8b reads at most 8,192 tokens" in calc.message
calc.controls["model"].value = "llama-3.1-8b"
print(f"8k-token responses: {calc.result['seconds']:.0f} s per iteration (roofline bound), "
      f"decode {calc.result['time_shares']['decode']:.0%} of it")
assert calc.message == ""

# %% [markdown]
# ## 8. An estimate to make by hand: GRPO on a 70B model, 64 H100s
#
# Before you run the next cell, estimate on paper. GRPO on Llama-3-70B (70.6B parameters, KV cache
# 320 KiB per token in bf16, both printed in section 6) with 64 H100s (80 GB, 3.35 TB/s,
# 989 TFLOP/s bf16 each; `get_device("H100-SXM-80GB")`): 256 prompts x 16 samples, 512-token
# prompts, 4,096-token responses, 16 gradient steps per iteration. Training shards the policy with
# ZeRO-3 over all 64 GPUs; generation runs 8 replicas of `tp` = 8.
#
# 1. How many GB of policy model state does each GPU hold?
# 2. Does the rollout's KV cache fit? If not, in how many waves does each replica decode?
# 3. A lower bound on the seconds of prefill, decode, scoring and the policy update.
#
# <details><summary>Answer</summary>
#
# 1. `16 B x 70.6e9 = 1.13 TB` of model state; ZeRO-3 over 64 GPUs: **17.6 GB per GPU**. The
#    frozen reference adds `2 x 70.6e9 = 141 GB`, 2.2 GB per GPU if it is sharded the same way.
# 2. One sequence's cache: `(512 + 4,096) x 320 KiB = 1.51 GB`; the whole rollout's: `4,096 x
#    1.51 GB = 6.2 TB`, more than the cluster's `64 x 80 GB = 5.1 TB`. A replica has
#    `8 x 80 = 640 GB`, of which the weights take 141 GB: room for `499 / 1.51 = 330` sequences,
#    but each replica serves `4,096 / 8 = 512`: **2 waves**. (The course's model counts the
#    84.9e9 bytes CUDA reports of an H100 "80 GB", 80 GiB less what the driver keeps: 680 GB a
#    replica, room for 356 sequences, the same 2 waves.) This assumes the training state
#    (17.6 GB per GPU) and the reference are offloaded while generating, as colocated systems
#    do; left resident they take about 160 GB of the replica, room for 225 sequences: 3 waves.
# 3. With `N` = 70.6e9 and `64 x 989e12 = 6.3e16` FLOP/s:
#    * prefill: `2N x 4,096 x 512 = 3.0e17` FLOPs: **about 5 s**;
#    * decode: each replica reads its 141 GB of weights at each of the 4,095 steps of each of its
#      2 waves: `8 x 2 x 4,095 x 141 GB = 9.2e15` bytes; every sequence also reads its KV cache
#      at every step, on average `512 + 2,048` tokens of 320 KiB: `4,096 x 4,095 x 2,560 x
#      320 KiB = 1.4e16` bytes, more than the weights. Together `2.3e16` bytes at
#      `64 x 3.35e12 = 2.1e14` B/s: **about 110 s**;
#    * scoring: an old-policy forward (16 gradient steps reuse the batch) and a reference
#      forward over `4,096 x 4,608 = 1.9e7` tokens, `2 x 2N x 1.9e7 = 5.3e18` FLOPs: **about
#      85 s**;
#    * policy update: `6N x 1.9e7 = 8.0e18` FLOPs: **about 127 s** at peak (the attention term
#      adds about 9% with the course's full-matrix count at 4,608 tokens, about 4% counted
#      causally, for scoring too).
#
#    Together about 330 s, a third of it generation, and that is a bound: training at 50% of peak
#    (Megatron-LM reached 52% at 1T parameters, Narayanan et al. 2021, arXiv:2104.04473) doubles
#    the update, and a long tail (section 5) stretches the decode.
#
# </details>

# %%
from rlm_course.cost.anatomy import zero_model_state_bytes

spec70 = get_spec("llama-3-70b")
config = preset("grpo", group_size=16, prompts_per_step=256, minibatches=16)
job = Workload(256, 16, 512, 4096)
costs = stage_costs(spec70, config, job)
seconds = stage_seconds(costs, h100, devices=64, generation_tp=8)
states = zero_model_state_bytes(spec70.params(), 64, 3)
kv_total = memory(spec70, config, job)["kv cache"]
waves = costs["decode"].waves(h100, 64, 8)
print(f"policy model state per GPU (ZeRO-3): {states / 1e9:.1f} GB; KV cache of the whole rollout "
      f"{kv_total / 1e12:.1f} TB against {64 * h100.memory_bytes / 1e12:.2f} TB in the cluster; "
      f"{waves} decode waves")
print(format_table([[s, f"{t:.0f}"] for s, t in seconds.items()], ["stage", "seconds (bound)"]))
hand = {"prefill": 5, "decode": 110, "scoring": 85, "policy update": 127}
assert abs(states / 17.6e9 - 1) < 0.02 and waves == 2
assert all(abs(seconds[s] / hand[s] - 1) < 0.15 for s in hand), seconds

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
# <details><summary>Answers</summary>
#
# * Doubling `G` doubles the responses: every stage's FLOPs double (prefill, decode, scoring,
#   training all scale with the number of sequences), and so does the decode's KV traffic, but
#   not the decode's weight reads, which are paid once per step for the whole batch: decode time
#   grows by less than 2x as long as the KV caches fit (once they do not, more waves re-read the
#   weights). With equal lengths the number of decode steps is unchanged; with long-tailed
#   lengths (section 5) a larger group also reaches a longer `T_max`. Doubling the response
#   length instead doubles the decode steps and every weight re-read, and grows attention and KV
#   traffic quadratically: decode time more than doubles; scoring and training FLOPs grow with
#   the sequence length (512 + 2,048 to 512 + 4,096 tokens), plus the quadratic attention term.
# * With `tp = 8` each replica spreads its weights over 8 GPUs: a decode step reads
#   `141 GB / 8` per GPU instead of `/ 4`, and there are half as many replicas, so the weights are
#   re-read half as many times in the cluster as a whole; each replica also has twice the memory
#   for KV caches, so fewer waves. The FLOPs are the same, but decode's time is set by bytes, not
#   FLOPs. (What the roofline leaves out: more TP means more collectives per layer per step.)
# * 16 samples of `512 + 8,192` tokens at 128 KiB per token: `16 x 8,704 x 128 KiB = 18 GB` per
#   prompt, and the 512 prompts of the default workload make `9.3 TB` for the whole rollout;
#   the policy's training state is `16 x 8.03e9 = 128 GB`. The KV cache of the rollout is about
#   70x larger, which is why generation runs in waves or on more replicas, and why RL systems
#   free the training state (offload, or a separate pool of devices) while they generate.
#
# </details>
#
# > **Key numbers and takeaways**
# >
# > * A forward costs `2N` FLOPs per token, a training step `6N` (backward = 2x forward), `8N`
# >   with full recomputation; the measured training / forward ratio above is 3.0.
# > * Attention conventions differ by 2x: the course counts the full score matrix, causal
# >   counters (verl) half of it. MFU divides model FLOPs by the peak; `bench train`'s `mfu` is a
# >   fraction of this machine's measured matmul rate.
# > * Decode reads all of a replica's weights at every step: its intensity is about the batch size,
# >   below the H100 ridge point (computed above) at long contexts whatever the batch.
# > * Activations: `sbh (34 + 5as/h)` bytes per layer, `34sbh` with FlashAttention, `2sbh` with
# >   full recomputation (a GPT layer; each model's own count: 34 for Llama-3-8B, 44 for
# >   Qwen2.5-7B, 63 for DeepSeek-V3). Model states: 16 bytes per parameter.
# > * The batch decodes until its longest response ends: with long-tailed lengths the decode time
# >   follows `T_max`, which grows with `G`, while the FLOPs follow the mean.
# > * The tiny model on a CPU is not in this regime: its prefill stays below the compute roof and
# >   its cached 3 MB of weights make decode latency-bound, not bandwidth-bound.
#
# ## Further reading
#
# * Ultra-Scale Playbook (Hugging Face, nanotron): memory of weights, gradients, optimizer states
#   and activations, recomputation; https://huggingface.co/spaces/nanotron/ultrascale-playbook
# * *How to Scale Your Model* (the JAX scaling book): rooflines, transformer FLOPs, inference and
#   the KV cache; https://jax-ml.github.io/scaling-book/
# * Stanford CS336, *Language Modeling from Scratch*: resource accounting and the systems
#   assignment; https://github.com/stanford-cs336
# * Kaplan et al. 2020 (arXiv:2001.08361) for `6N`; Chowdhery et al. 2022 (PaLM,
#   arXiv:2204.02311, appendix B) for MFU; Korthikanti et al. 2022 (arXiv:2205.05198) for
#   activations; Pope et al. 2022 (arXiv:2211.05102) for the KV cache and decode.
#
# ## Exercises
#
# Write the KV-cache size formula and the decode arithmetic intensity in
# `exercises/ex05_anatomy.py`; check them with `exercises/ex05_anatomy.ipynb` or
# `python -m rlm_course grade 05`.
