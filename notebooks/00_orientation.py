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
# # 00 · Orientation: one iteration of RL for a reasoning model
#
# Reasoning language models (DeepSeek-R1, o3, Kimi k1.5) are post-trained with reinforcement
# learning: the model writes answers, a **verifier** scores them, and the model is pushed towards
# what scored well. This course is about what that costs and how the systems that run it split the
# work across devices. Everything starts from a loop small enough to run on a laptop CPU in
# minutes, which we measure, model and then split.
#
# **One iteration** of the loop has four stages:
#
# | stage | what happens | models involved |
# |---|---|---|
# | 1. rollout (generation) | for each prompt, sample a *group* of G responses, token by token | policy (actor) |
# | 2. experience preparation (reward, scoring) | rewards from the verifier; log-probs of the sampled tokens under the old policy and the frozen reference; values from a critic (PPO only) | verifier, policy, reference, (critic) |
# | 3. training | a few gradient steps on the clipped policy loss (+ critic loss for PPO) | policy, (critic) |
# | 4. weight sync | copy the new weights to the rollout engine | (same module here) |
#
# RL with verifiable rewards (RLVR) needs no reward model: exact-answer checks or unit tests score
# a response. Our tasks are multi-digit addition and Countdown.
#
# **Learning objectives.** After this notebook you can:
#
# 1. name the four stages of an RL iteration and the models each one uses;
# 2. run a short GRPO loop end to end on the tiny policy and read its metrics;
# 3. read where the seconds of an iteration go, and say why the answer on a laptop differs from
#    the answer for a reasoning model on a cluster;
# 4. find your way in the course: which chapter measures, models or splits what.

# %%
# NBVAL_IGNORE_OUTPUT
import platform

import torch

import rlm_course
from rlm_course.utils import seed_everything

seed_everything(0)
print(f"rlm_course {rlm_course.__version__}, torch {torch.__version__}, python {platform.python_version()}, "
      f"{torch.get_num_threads()} CPU threads")

# %% [markdown]
# ## The policy, the task and the verifier
#
# The policy is a 4-layer transformer of about 0.8M parameters that has had a short supervised
# warm start (SFT) on addition demonstrations, just enough to answer in the right format and be
# right some of the time. The checkpoint ships in `data/checkpoints/`; the JSON beside it names the
# command that made it.

# %%
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.evaluate import evaluate
from rlm_course.rl.runs import load_sft_policy
from rlm_course.tasks import get_task
from rlm_course.tasks.eval_sets import load_eval_set

tokenizer = CharTokenizer()
task = get_task("addition", digits=3)
policy, sft_info = load_sft_policy(task, tokenizer)
held_out = load_eval_set(task)
print(f"{policy.num_parameters():,} parameters; warm start made by: {sft_info['command']}")

before = evaluate(policy, task, held_out, tokenizer)
for problem, response in list(zip(held_out, before.responses))[:6]:
    verdict = task.verify(problem, response)
    print(f"{problem.prompt}{response:<6} reward {verdict.reward:.1f}  {verdict.reason or 'correct'}")
print(f"greedy accuracy on {len(held_out)} held-out problems: {before.accuracy:.1%}")
assert 0.1 <= before.accuracy <= 0.4, "the warm start should be weak but not hopeless"

# %% [markdown]
# The reward has a **format** part (0.1 for a well-formed number) and a **correctness** part (0.9).
# Accuracy counts correctness only.
#
# ## Run the loop
#
# `RLTrainer.step()` runs one iteration: 64 prompts x 8 samples = 512 rollouts, verifier rewards,
# a scoring pass with the policy and the reference, then a policy update. Thirty steps take well
# under a minute here.

# %%
from tqdm.auto import tqdm

from rlm_course.rl.algorithms import GRPOConfig
from rlm_course.rl.trainer import RLTrainer

trainer = RLTrainer(policy, task, tokenizer, GRPOConfig(steps=30, eval_every=10), held_out)
metrics = [trainer.step() for _ in tqdm(range(30), desc="GRPO")]
print({k: round(v, 3) for k, v in metrics[-1].items()})
assert metrics[-1]["accuracy_eval"] > before.accuracy

# %%
from rlm_course.tools.plots import plot_learning_curve

plot_learning_curve(metrics, accuracy_before=before.accuracy, title="30 GRPO steps on addition-3");

# %% [markdown]
# ## Where do the seconds go?

# %%
stages = ("generation", "reward", "scoring", "training")
totals = {s: sum(m[f"seconds_{s}"] for m in metrics) for s in stages}
whole = sum(totals.values())
for s in stages:
    print(f"{s:<11} {totals[s]:6.2f} s  {totals[s] / whole:5.1%}")
assert all(totals[s] > 0 for s in stages)
length = sum(m["response_length"] for m in metrics) / len(metrics)
weights_mb = sum(p.numel() * p.element_size() for p in policy.parameters()) / 1e6
print(f"mean response: {length:.1f} tokens; the policy's fp32 weights: {weights_mb:.1f} MB")

# %% [markdown]
# On this tiny model generation is a *minority* of the time, for two reasons:
#
# * **the answers are 4-5 tokens long** (printed above): generation is one prefill and a handful
#   of decode steps, while scoring runs two full forward passes (old policy and reference) and
#   training a forward and a backward over every response;
# * **the weights are 3 MB** (printed above): they stay in the CPU's caches, so a decode step
#   does not wait for its weights to stream from memory, the cost that makes decode slow on a
#   GPU. Chapter 05 measures it: on this machine decode is limited by the fixed cost of each
#   step, not by memory bandwidth.
#
# Reasoning models flip the picture. Responses run to thousands of tokens, and each decode step
# re-reads gigabytes of weights from memory to produce one token per sequence. Open systems
# report **generation at about 30% to 90% of the wall time**: 70-90% in several runs with long
# chains of thought (OpenRLHF, arXiv:2405.11143 and its documentation: about 80%, up to 90%;
# verl's DAPO recipe on a 32B model: about 70%), but 30-43% in verl's own 7B DAPO run with
# 8k-20k-token budgets on 16 H20s (`docs/advance/one_step_off.md`: 207 s of 699 s, 321 s of
# 749 s), whose GPUs are poor in FLOPs and rich in bandwidth. The share depends on the hardware,
# the model size, the placement and the length tail; with short generations training can
# dominate (chapter 04 cites a PPO breakdown with 128-token responses). Generation's *depth* (sequential steps) grows with the longest
# response, and no number of devices removes it. Chapters 05-06 make that precise; chapters
# 07-13 are ways to split, hide or shorten it.
#
# ## The course
#
# | # | notebook | status |
# |---|---|---|
# | 00 | orientation | ready |
# | 01 | a tiny reasoning LM | ready |
# | 02 | GRPO from scratch | ready |
# | 03 | PPO from scratch | ready |
# | 04 | the GRPO family (Dr. GRPO, DAPO, RLOO, REINFORCE++, GSPO) | ready |
# | 05 | anatomy of an RL step | ready |
# | 06 | work and depth | ready |
# | 07-10 | data (ZeRO), tensor and sequence, pipeline, context and expert parallelism, simulated | ready |
# | 11 | real `torchrun` runs | planned |
# | 12-14 | placement and hybrid engines; asynchronous RL; capstone | planned |
#
# **Try it:** from a terminal, `python -m rlm_course grpo --task addition` runs the full job (under
# three minutes) and writes `runs/<name>/metrics.jsonl`, `summary.json` and a learning-curve PNG.
#
# > **Key numbers and takeaways**
# >
# > * One iteration: rollout, experience preparation (rewards, old-policy and reference
# >   log-probs, critic values for PPO), training, weight sync.
# > * The tiny policy: about 0.8M parameters, 23% held-out accuracy after its warm start; 30 GRPO
# >   steps already raise it (the curve above).
# > * Here generation is a minority of the seconds: 4-5-token answers and 3 MB of cached weights.
# > * For reasoning models, generation takes about 30-90% of the wall time (70-90% in several
# >   long chain-of-thought runs); the share depends on hardware, model size and length tail.
#
# ## Further reading
#
# * Shao et al. 2024, DeepSeekMath (arXiv:2402.03300): GRPO and RL with verifiable rewards.
# * Sheng et al. 2024, HybridFlow / verl (arXiv:2409.19256): an RL iteration as a dataflow of
#   models.
# * Stanford CS336, *Language Modeling from Scratch*, assignment 5 (alignment and GRPO);
#   https://github.com/stanford-cs336
