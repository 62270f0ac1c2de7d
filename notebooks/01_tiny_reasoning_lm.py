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
# # 01 · A tiny reasoning LM: tokenizer, tasks, transformer, KV cache, sampling
#
# Every later chapter measures and splits the pieces built here, so we look at each one:
#
# 1. a character **tokenizer**;
# 2. two **verifiable tasks** (addition, Countdown) with verifiers that never call `eval`;
# 3. a decoder-only **transformer** (`rlm_course/lm/model.py`, one readable file), its parameter
#    count and its forward FLOPs, checked against `torch.utils.flop_counter`;
# 4. **sampling** with and without a **KV cache**.
#
# **Learning objectives.** After this chapter you can:
#
# 1. encode prompts for a batch (left padding) and say what a verifier checks;
# 2. count the parameters and forward FLOPs of the transformer, `2N` per token plus attention,
#    and check the count against PyTorch's FLOP counter;
# 3. explain what a KV cache saves, and what it costs in memory;
# 4. say why GRPO needs sampling diversity (temperature).

# %%
# NBVAL_IGNORE_OUTPUT
import copy
import time

import matplotlib.pyplot as plt
import torch

from rlm_course.utils import seed_everything

seed_everything(0)
print(torch.__version__)

# %% [markdown]
# ## 1. Tokenizer
#
# One token per character, plus `<pad>` (id 0), `<bos>` (1) and `<eos>` (2). Prompts are
# left-padded in a batch so that all sequences end in the same column and generation appends on
# the right.

# %%
from rlm_course.lm.tokenizer import CharTokenizer

tok = CharTokenizer()
ids = tok.encode("47+85=", bos=True)
print(tok.vocab_size, "tokens in the vocabulary;", ids, "->", repr(tok.decode(ids)))
tokens, mask = tok.encode_prompts(["7+8=", "123+456="])
print(tokens)
print(mask.int())
try:
    tok.encode("12 apples")
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# ## 2. Verifiable tasks
#
# A verifier returns a `Verdict` with a format part and a correctness part. Countdown's verifier
# parses the expression with a small recursive-descent parser over exact fractions, and rejects
# division by zero, non-integer intermediate results, numbers that were not given or are used too
# often, huge numbers and trailing text.

# %%
from rlm_course.tasks import get_task

addition, countdown = get_task("addition", digits=3), get_task("countdown")
problem = countdown.problems(1, seed=3)[0]
print("prompt:", problem.prompt, " a demonstration:", problem.answer)
first, second = problem.numbers[0], problem.numbers[1]
for response in [problem.answer, f"{first}*{first}", f"{first}/0", f"{first}+{second}",
                 f"{first}/{second}*{second}" if first % second else f"{first}-{second}-{second}",
                 "99*99", problem.answer + "=", ""]:
    v = countdown.verify(problem, response)
    print(f"{response!r:<14} format={v.format_ok!s:<5} correct={v.correct!s:<5} reward={v.reward:.1f}  {v.reason}")

# %% [markdown]
# ## 3. The transformer and its FLOPs
#
# Per token, a forward pass costs about **2 FLOPs per matmul parameter** (one multiply, one add)
# plus the attention scores: `2 * N_matmul + 4 * n_layer * d_model * ctx`
# (`rlm_course.lm.model.forward_flops`). We check the formula against PyTorch's own FLOP counter.

# %%
from rlm_course.cost.flops import count_flops
from rlm_course.lm.model import ModelConfig, TinyGPT, forward_flops, matmul_parameters

config = ModelConfig(vocab_size=tok.vocab_size, n_layer=4, n_head=4, d_model=128, max_seq_len=128)
model = TinyGPT(config).eval()
print(f"parameters: {model.num_parameters():,} (matmul parameters {matmul_parameters(config):,})")
rows = []
for seq in (8, 32, 128):
    x = torch.randint(3, tok.vocab_size, (4, seq))
    with torch.no_grad():
        measured, _ = count_flops(model, x)
    predicted = forward_flops(config, seq, batch=4)
    rows.append((seq, predicted, measured))
    print(f"seq {seq:>3}: predicted {predicted / 1e6:8.1f} MFLOP, flop_counter {measured / 1e6:8.1f} MFLOP")
    assert abs(predicted - measured) / measured < 0.02

# %% [markdown]
# ## 4. Sampling and the KV cache
#
# Without a cache, producing token `t` re-runs the model over all `t` previous tokens. With a
# cache, each layer keeps the keys and values of earlier positions, and one decode step processes
# a single token that attends to the cache. Same samples, far fewer FLOPs, as long as the cache
# fits in memory. (`attend_with_kv_cache` in `model.py` is the heart of it, and your first
# exercise.)

# %%
from rlm_course.lm.sampling import generate

prompts, prompt_mask = tok.encode_prompts([p.prompt for p in addition.problems(32, seed=0)])
lengths, times = [8, 16, 32, 64], {"KV cache": [], "recompute": []}
for n in lengths:
    for name, use_cache in (("KV cache", True), ("recompute", False)):
        start = time.perf_counter()
        out = generate(model, prompts, prompt_mask, n, eos_id=-1,
                       generator=torch.Generator().manual_seed(0), use_cache=use_cache)
        times[name].append(time.perf_counter() - start)
    assert out.responses.shape[1] == n
# The cache changes the order of the additions inside attention, not the maths: logits agree up
# to rounding. In float32 that is about 1e-7, so a sample could flip only if a random draw fell
# that close to a boundary between two tokens (about one draw in ten million); a float64 copy of
# the model pushes rounding to 1e-16 and makes the check hold on any machine.
model64 = copy.deepcopy(model).double()
same = torch.equal(
    generate(model64, prompts, prompt_mask, 16, eos_id=-1, generator=torch.Generator().manual_seed(1)).tokens,
    generate(model64, prompts, prompt_mask, 16, eos_id=-1, generator=torch.Generator().manual_seed(1),
             use_cache=False).tokens)
print("identical samples with and without the cache:", same)
assert same
for name, ts in times.items():
    plt.plot(lengths, ts, "o-", label=name)
plt.xlabel("new tokens"); plt.ylabel("seconds (32 sequences)"); plt.legend(); plt.title("decoding cost");

# %% [markdown]
# Recomputation grows quadratically with the number of new tokens; the cache makes the matmul
# work linear (the attention over the cache still grows with the context, so the total stays
# quadratic, with a far smaller constant).
# `python -m rlm_course bench sampling` measures the ratio at 64 new tokens.
#
# **Temperature** trades diversity for accuracy. GRPO needs diversity: a group whose 8 samples are
# identical gets identical rewards and so zero advantage.

# %%
from rlm_course.rl.runs import load_sft_policy

policy, _ = load_sft_policy(addition, tok)
one = addition.problems(1, seed=11)[0]
prompt, pmask = tok.encode_prompts([one.prompt] * 16)
for temperature in (0.3, 1.0, 2.0):
    r = generate(policy, prompt, pmask, addition.max_response_len, tok.eos_id, temperature=temperature,
                 generator=torch.Generator().manual_seed(0))
    answers = [tok.decode(x) for x in r.responses]
    right = sum(addition.verify(one, a).correct for a in answers)
    print(f"T={temperature}: {len(set(answers)):>2} distinct answers, {right}/16 correct "
          f"(answer {one.answer}): {sorted(set(answers))[:6]}")

# %% [markdown]
# ## Questions
#
# * Without a cache, generating `T` tokens after a prompt of `P` costs how many token-forwards? And
#   with a cache?
# * What does the cache cost in memory, per token, for this model in fp32? Use
#   `rlm_course.cost.architectures.kv_cache_bytes`.
#
# <details><summary>Answers</summary>
#
# * Without a cache, token `t` needs a forward over the `P + t - 1` tokens before it:
#   `sum_{t=1}^{T} (P + t - 1) = T P + T (T - 1) / 2` token-forwards, quadratic in `T` (at
#   `T = 1` it is the prefill, `P`, as with the cache). With a cache: one prefill of `P`
#   tokens, then one token per step: `P + T - 1`, linear (the attention of each new token still
#   reads all earlier keys, so its attention FLOPs grow with the context, but no matmul is
#   repeated).
# * A key and a value vector of `d_model` = 128 values in each of the 4 layers, 4 bytes each:
#   `2 x 4 x 128 x 4 = 4,096` bytes per token, `kv_cache_bytes(4, 4, 32, 1, 4)` (4 heads of 32).
#   Small here; 128 KiB per token for Llama-3-8B in bf16 (chapter 05), where the cache of a
#   rollout outgrows the weights.
#
# </details>
#
# > **Key numbers and takeaways**
# >
# > * The tiny transformer: 4 layers of width 128, about 0.8M parameters (printed above).
# > * A forward pass costs `2 x matmul parameters` FLOPs per token plus attention; the formula
# >   agrees with `torch.utils.flop_counter` within 2%.
# > * The KV cache turns decoding's matmul work from quadratic into linear in the response length
# >   (the attention over the cache stays quadratic), and gives the same samples (checked in
# >   float64).
# > * GRPO needs diversity within a group: identical samples get identical rewards and zero
# >   advantage.
#
# ## Further reading
#
# * Karpathy's nanoGPT and minGPT (github.com/karpathy): a GPT in one readable file.
# * Stanford CS336, assignment 1 (a transformer language model from scratch);
#   https://github.com/stanford-cs336
# * Pope et al. 2022, "Efficiently Scaling Transformer Inference" (arXiv:2211.05102): the KV
#   cache and the cost of decoding.
#
# ## Exercise
#
# Open `exercises/ex01_kv_cache.py` and write `attend_with_kv_cache`; then run
# `exercises/ex01_kv_cache.ipynb` or `python -m rlm_course grade 01`. The worked version is in
# `solutions/`.
