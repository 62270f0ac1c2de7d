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
# # 02 · GRPO from scratch
#
# Group Relative Policy Optimization (Shao et al. 2024, *DeepSeekMath*, arXiv:2402.03300) is PPO
# without a critic: the baseline for a response is the mean reward of **all** G responses to the
# same prompt, its own included, and the difference is divided by their standard deviation
# (section 4.1.2). (A baseline made of the mean of the *other* responses is RLOO's, chapter 04.)
# Its loss, for a group of G responses `o_1..o_G` to a prompt `q`:
#
# $$
# \mathcal{L} = \frac{1}{G}\sum_{i=1}^{G}\frac{1}{|o_i|}\sum_{t=1}^{|o_i|}
# \Big[-\min\big(r_{i,t}A_i,\ \mathrm{clip}(r_{i,t},1-\epsilon,1+\epsilon)A_i\big)
# + \beta\,\mathrm{KL}_{k3}\big(\pi_\theta\,\|\,\pi_{\mathrm{ref}}\big)_{i,t}\Big],
# \qquad A_i = \frac{R_i-\mathrm{mean}(R)}{\mathrm{std}(R)},
# \qquad r_{i,t} = \frac{\pi_\theta(o_{i,t}\mid q,o_{i,<t})}{\pi_{\mathrm{old}}(o_{i,t}\mid q,o_{i,<t})}
# $$
#
# We build it in four pieces: group sampling, group-relative advantages
# (`rlm_course/rl/advantages.py`), the clipped surrogate (`rlm_course/rl/losses.py`) and the k3 KL
# to the frozen reference (`rlm_course/rl/kl.py`); then assemble and train. Chapter 04 extends the
# same three modules with the rest of the family.
#
# **Learning objectives.** After this chapter you can:
#
# 1. sample groups and compute group-relative advantages, and say why a group of equal rewards
#    teaches nothing;
# 2. write the clipped surrogate and say which tokens get no gradient;
# 3. tell what the k3 estimator's *value* estimates from what its *gradient* follows, and why
#    GRPO's loss is about 0 on the first mini-batch while its gradient is not;
# 4. train a tiny policy with GRPO and read its metrics.

# %%
# NBVAL_IGNORE_OUTPUT
import matplotlib.pyplot as plt
import torch

from rlm_course.utils import seed_everything

seed_everything(0)
print(torch.__version__)

# %% [markdown]
# ## 1. Group sampling
#
# Each prompt is repeated G times in the batch (groups contiguous) and sampled at temperature 1.

# %%
from rlm_course.lm.sampling import generate
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.advantages import group_advantages
from rlm_course.rl.runs import load_sft_policy
from rlm_course.tasks import get_task

tok, task = CharTokenizer(), get_task("addition", digits=3)
policy, _ = load_sft_policy(task, tok)
G = 8
problems = task.problems(4, seed=5)
group = [p for p in problems for _ in range(G)]
tokens, mask = tok.encode_prompts([p.prompt for p in group])
rollout = generate(policy, tokens, mask, task.max_response_len, tok.eos_id,
                   generator=torch.Generator().manual_seed(0))
responses = [tok.decode_response(r) for r in rollout.responses]
rewards = torch.tensor([task.verify(p, r).reward for p, r in zip(group, responses)])
advantages = group_advantages(rewards, G)
for i, p in enumerate(problems):
    row = slice(i * G, (i + 1) * G)
    print(f"{p.prompt:<9} answer {p.answer:<5}| " + " ".join(f"{r:>4}" for r in responses[row]))
    print(f"{'':<9} rewards     | " + " ".join(f"{x:4.1f}" for x in rewards[row].tolist()))
    print(f"{'':<9} advantages  | " + " ".join(f"{x + 0.0:4.1f}" for x in advantages[row].tolist()))

# %% [markdown]
# ## 2. Group-relative advantages
#
# Correct answers in a group that is mostly wrong get a large positive advantage; a group where
# every sample gets the same reward gets **zero advantage and teaches nothing**: that is why the
# warm start must be neither hopeless nor perfect. Dr. GRPO (arXiv:2503.20783) drops the division
# by the std, which otherwise up-weights prompts that are nearly always right or nearly always
# wrong.

# %%
example = torch.tensor([1.0, 0.1, 0.1, 0.1, 1.0, 1.0, 1.0, 0.1])
print("rewards          ", [round(x, 2) for x in example.tolist()])
print("GRPO advantages  ", [round(x, 2) for x in group_advantages(example, 4).tolist()])
print("Dr. GRPO (no std)", [round(x, 2) for x in group_advantages(example, 4, normalize_std=False).tolist()])
assert abs(group_advantages(example, 4).view(2, 4).sum(1)).max() < 1e-5

# %% [markdown]
# ## 3. The clipped surrogate
#
# Each rollout batch is reused for several gradient steps, so the policy drifts from the one that
# sampled it (`pi_old`). The ratio `r = pi_theta / pi_old` corrects for that, and PPO's clip stops
# following the gradient once `r` leaves `[1 - eps, 1 + eps]` in the direction that the advantage
# favours.

# %%
from rlm_course.rl.losses import clipped_objective

ratio = torch.linspace(0.5, 1.5, 101)
fig, axes = plt.subplots(1, 2, figsize=(9, 3))
for ax, a in zip(axes, (1.0, -1.0)):
    loss = clipped_objective(ratio[None], torch.tensor([a]), 0.2)[0]
    ax.plot(ratio, -loss, label="-loss = min(rA, clip(r)A)")
    ax.plot(ratio, ratio * a, "--", alpha=0.5, label="rA (unclipped)")
    ax.set(title=f"A = {a:+.0f}", xlabel="ratio r")
    ax.legend(fontsize=8)
fig.tight_layout()

# %% [markdown]
# ## 4. KL to the reference: the k3 estimator
#
# GRPO keeps the policy near the frozen SFT model with the per-token estimator
# `k3 = rho - log(rho) - 1`, `rho = pi_ref / pi_theta`, evaluated on tokens sampled from the
# policy. It is unbiased for KL(pi_theta || pi_ref) and never negative (Schulman, *Approximating
# KL divergence*). Below, its Monte Carlo mean against the exact KL of two categorical
# distributions, for growing distance.

# %%
from rlm_course.rl.kl import kl_k3

g = torch.Generator().manual_seed(0)
base = torch.randn(12, generator=g)
direction = torch.randn(12, generator=g)
exact, estimate = [], []
for s in torch.linspace(0, 2, 9):
    p = torch.softmax(base + s * direction, 0)
    q = torch.softmax(base, 0)
    samples = torch.multinomial(p, 20000, replacement=True, generator=g)
    exact.append((p * (p / q).log()).sum().item())
    estimate.append(kl_k3(p.log()[samples], q.log()[samples]).mean().item())
plt.figure(figsize=(4, 3))
plt.plot(exact, exact, "k:", label="y = x")
plt.plot(exact, estimate, "o", label="mean of k3")
plt.xlabel("exact KL"); plt.ylabel("estimate"); plt.legend();
assert max(abs(a - b) for a, b in zip(exact, estimate)) < 0.05

# %% [markdown]
# ### The value is unbiased; what does the gradient follow?
#
# GRPO does not only *report* k3: it adds `beta x mean(k3)` to the loss and differentiates it. In
# training the tokens are sampled first and then held fixed, so the gradient of the loss is the
# average, over samples from `pi_theta`, of `grad k3(x)`, with no gradient through the sampling.
# Is that the gradient of KL(pi_theta || pi_ref), the divergence k3 estimates?
#
# On a categorical distribution we can take that expectation exactly: weight each category `x` by
# its probability `pi_theta(x)`, *detached* (the sampling is not differentiated), and let autograd
# differentiate `sum_x pi(x) k(x)` with respect to the logits. Then compare with the exact
# gradients of the two KL divergences, KL(pi_theta || pi_ref) and KL(pi_ref || pi_theta), and do
# the same for k1 and k2.

# %%
import torch.nn.functional as F

from rlm_course.rl.kl import kl_estimate

g = torch.Generator().manual_seed(1)
logits = torch.randn(8, generator=g, dtype=torch.float64)
ref_logp = F.log_softmax(torch.randn(8, generator=g, dtype=torch.float64), 0)


def gradient(loss_of_logp):
    x = logits.clone().requires_grad_(True)
    return torch.autograd.grad(loss_of_logp(F.log_softmax(x, 0)), x)[0]


kl_forward = lambda logp: (logp.exp() * (logp - ref_logp)).sum()  # noqa: E731  KL(pi_theta || pi_ref)
kl_reverse = lambda logp: (ref_logp.exp() * (ref_logp - logp)).sum()  # noqa: E731  KL(pi_ref || pi_theta)
exact = {"KL(pi_theta || pi_ref)": gradient(kl_forward), "KL(pi_ref || pi_theta)": gradient(kl_reverse)}
follows = {}
for estimator in ("k1", "k2", "k3"):
    # E_{x ~ pi_theta}[grad k(x)] with the samples held fixed: weights pi(x), detached
    grad = gradient(lambda logp: (logp.exp().detach() * kl_estimate(logp, ref_logp, estimator)).sum())
    match = [name for name, e in exact.items() if torch.allclose(grad, e, rtol=1e-5, atol=1e-9)]
    follows[estimator] = match[0] if match else ("0" if grad.abs().max() < 1e-12 else "neither")
    print(f"{estimator}: expected gradient {[round(v, 4) for v in grad[:4].tolist()]}... "
          f"= gradient of {follows[estimator]}")
print({name: [round(v, 4) for v in e[:4].tolist()] for name, e in exact.items()})
assert follows == {"k1": "0", "k2": "KL(pi_theta || pi_ref)", "k3": "KL(pi_ref || pi_theta)"}

# %% [markdown]
# So, as a loss on on-policy samples:
#
# * **k3**'s gradient is that of **KL(pi_ref || pi_theta)**, the divergence with its arguments
#   swapped, although its *value* estimates KL(pi_theta || pi_ref). By hand:
#   `grad k3 = (1 - rho) grad log pi_theta` (with `rho = pi_ref / pi_theta`), and
#   `sum_x pi_theta (1 - rho) grad log pi_theta = -sum_x pi_ref grad log pi_theta`, the gradient
#   of KL(pi_ref || pi_theta).
# * **k2**'s gradient is that of **KL(pi_theta || pi_ref)**: `grad k2 = (log pi_theta - log pi_ref)
#   grad log pi_theta`, whose expectation is exactly the gradient of the KL it approximates.
# * **k1**'s gradient is 0 in expectation (`sum_x pi_theta grad log pi_theta = 0`): as a loss it
#   only adds noise, which is why k1 goes into the reward instead (chapters 03-04).
#
# Both KL directions pull `pi_theta` towards `pi_ref` and agree to first order when the two are
# close, which is where the KL term keeps them; they differ when the policy drifts far (verl offers
# "k3+" variants that take k3's value and k2's gradient for this reason).
#
# k3 has a heavy tail: `rho - log(rho) - 1` grows like `exp(log rho)`. A token the policy now
# finds very unlikely (`log pi_theta = -12`) but the reference does not (`log pi_ref = -1`) scores
# `e^11 - 12`, about 60,000 nats, enough to swamp a whole batch. The trainer therefore caps each
# token's KL term in the loss at 10 (`rlm_course.rl.kl.KL_CLAMP`), as verl does for k3 (a KL put
# into the reward instead, chapters 03-04, goes in as estimated).

# %%
print(kl_k3(torch.tensor([-12.0]), torch.tensor([-1.0])).item())

# %% [markdown]
# ## 5. The GRPO loss, assembled
#
# The equation at the top, in five lines: the ratio per token, the clipped objective, the k3
# penalty, then the mean over each response's tokens and over the responses. Here on the rollout of
# section 1, with a perturbed copy of the policy standing in for `pi_theta` after a few updates.
# The trainer computes the same number with the general loss of the whole family
# (`rlm_course.rl.losses.policy_loss` with GRPO's options: token ratio, symmetric clip,
# `seq-mean-token-mean`), which chapter 04 opens up.

# %%
import copy

from rlm_course.lm.sampling import response_log_probs
from rlm_course.rl.kl import KL_CLAMP
from rlm_course.rl.losses import aggregate_loss, policy_loss

theta = copy.deepcopy(policy)
with torch.no_grad():
    for p in theta.parameters():
        p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    args = (rollout.tokens, rollout.attention_mask, rollout.prompt_len)
    logp_old = response_log_probs(policy, *args)  # pi_old = pi_ref: the warm start
    logp = response_log_probs(theta, *args)
eps, beta, m = 0.2, 0.005, rollout.response_mask.float()

# GRPO as written (DeepSeekMath eq. 3)
per_token = clipped_objective(torch.exp(logp - logp_old), advantages, eps) \
    + beta * kl_k3(logp, logp_old).clamp(max=KL_CLAMP)
simple = ((per_token * m).sum(1) / m.sum(1)).mean()

# the family's general loss with GRPO's options
general, _ = policy_loss(logp, logp_old, advantages, rollout.response_mask, "token", eps, None,
                         "seq-mean-token-mean")
general = general + beta * aggregate_loss(kl_k3(logp, logp_old).clamp(max=KL_CLAMP),
                                          rollout.response_mask, "seq-mean-token-mean")
print(f"GRPO loss as written {simple.item():.6f}, general loss with GRPO's options {general.item():.6f}")
assert torch.allclose(simple, general)

# %% [markdown]
# ### Why the loss is about 0 on the first mini-batch, and the gradient is not
#
# The question users ask most about GRPO: "why is my loss 0?". On the first mini-batch of a
# rollout the policy *is* the one that sampled it, so every ratio is exactly 1 and the clip does
# nothing: the loss is `-(1/G) sum_i A_i` per group, and group-relative advantages sum to 0
# within each group. The k3 term is 0 too while the policy equals the reference. But the gradient
# of `-r A` at `r = 1` is `-A grad log pi_theta`: the policy-gradient itself, which is not 0. Here
# with the package's own loss, `policy_loss`, on the rollout of section 1, with `pi_old` the
# policy itself:

# %%
policy.zero_grad(set_to_none=True)
logp_now = response_log_probs(policy, *args)  # with gradient this time
first, _ = policy_loss(logp_now, logp_now.detach(), advantages, rollout.response_mask, "token",
                       eps, None, "seq-mean-token-mean")
first.backward()
grad_norm = torch.sqrt(sum((p.grad ** 2).sum() for p in policy.parameters() if p.grad is not None))
print(f"loss {first.item():.2e}, gradient norm {grad_norm.item():.3f}")
assert abs(first.item()) < 1e-6 and grad_norm > 1e-3
policy.zero_grad(set_to_none=True)

# %% [markdown]
# The loss value only says how far the ratios have moved; watch the reward, the KL and the
# gradient norm instead. (With DAPO's token-mean aggregation, longer responses weigh more and the
# first loss is small but no longer exactly the mean of the advantages.)

# %% [markdown]
# ## 6. Train
#
# `RLTrainer.step()` puts the pieces together: rollout (64 prompts x 8 samples), rewards,
# advantages, the scoring pass (old-policy and reference log-probs), then one pass over the batch
# in two mini-batches. 80 steps take about a minute here; the full job
# (`python -m rlm_course grpo --task addition`) runs 300.

# %%
from tqdm.auto import tqdm

from rlm_course.rl.algorithms import GRPOConfig
from rlm_course.rl.evaluate import evaluate
from rlm_course.rl.trainer import RLTrainer
from rlm_course.tasks.eval_sets import load_eval_set
from rlm_course.tools.plots import plot_learning_curve

held_out = load_eval_set(task)
policy, _ = load_sft_policy(task, tok)  # fresh copy of the warm start
accuracy_before = evaluate(policy, task, held_out, tok).accuracy
trainer = RLTrainer(policy, task, tok, GRPOConfig(steps=80, eval_every=20, seed=0), held_out)
metrics = [trainer.step() for _ in tqdm(range(80), desc="GRPO")]
accuracy_after = evaluate(policy, task, held_out, tok).accuracy
print(f"held-out greedy accuracy {accuracy_before:.1%} -> {accuracy_after:.1%}")
plot_learning_curve(metrics, accuracy_before=accuracy_before, title="GRPO, addition-3");
assert accuracy_after > accuracy_before + 0.05, "GRPO should improve the held-out accuracy"

# %% [markdown]
# What to read in `metrics` (one dict per step, the same as `runs/<name>/metrics.jsonl`):
#
# * `reward_mean`, `accuracy_train`: how the sampled responses score (noisy: new prompts each step);
# * `groups_with_signal`: groups whose rewards differ, the only ones with non-zero advantages;
# * `kl`: mean k3 per token against the reference; `clip_fraction`: tokens whose ratio was clipped;
# * `entropy`: falls as the policy sharpens; `response_length`;
# * `seconds_generation / reward / scoring / training`: the cost of each stage (chapter 05 predicts
#   them); `scoring` is the old-policy and reference log-prob passes.

# %%
for key in ("reward_mean", "groups_with_signal", "kl", "clip_fraction", "entropy"):
    first, last = metrics[0][key], sum(m[key] for m in metrics[-10:]) / 10
    print(f"{key:<20} step 1: {first:8.3f}   mean of last 10 steps: {last:8.3f}")

# %% [markdown]
# ## Questions
#
# * In section 1, some groups have all their rewards equal. What fraction of the batch's
#   responses then contributes nothing to the gradient, and what would you change to waste less
#   generation on them?
# * With `kl_coef = 0` GRPO needs no reference model. What does each step save, in memory and in
#   passes? What does it risk?
# * The clip fraction stays near 0 in the metrics above. Why, with one pass over the batch in two
#   mini-batches?
#
# <details><summary>Answers</summary>
#
# * Every response of a group with equal rewards has advantage 0, so its tokens contribute
#   nothing to the policy term (only to the KL term). `groups_with_signal` counts the others: at
#   step 1 about half of the 64 groups carried signal (see the printout above). Generation was
#   spent on the rest for nothing. A warm start that is neither hopeless nor perfect, a larger
#   group (more chances of one different reward), prompts of the right difficulty, or DAPO's
#   dynamic sampling (chapter 04), which samples more prompts until the batch holds only groups
#   with signal, at the cost of more generation.
# * No reference weights in memory (2 bytes per parameter in bf16; here a second copy of the
#   model) and no reference forward over every response in scoring. The risk: nothing holds the
#   policy near the SFT model, so it can drift (reward hacking, loss of fluency, entropy
#   collapse); with verifiable rewards and clipping, several recipes (DAPO, Dr. GRPO) drop it.
# * The first of the two mini-batches is taken with the policy that sampled the batch (all
#   ratios 1); the second follows one optimizer step, which moves the ratios only a little at
#   this learning rate, so few leave `[0.8, 1.2]`. Clipping matters when a batch is reused for
#   many steps (more mini-batches or epochs).
#
# </details>
#
# > **Key numbers and takeaways**
# >
# > * GRPO's advantage: `(R_i - mean R) / std R` over the whole group, its own reward included;
# >   a group of equal rewards gets 0 and teaches nothing.
# > * k3's value is unbiased for KL(pi_theta || pi_ref); as a loss its expected gradient is that
# >   of KL(pi_ref || pi_theta); k2's is that of KL(pi_theta || pi_ref); k1's is 0.
# > * On the first mini-batch the loss is about 0 (ratio 1, advantages summing to 0 per group)
# >   while the gradient is the policy gradient.
# > * 80 GRPO steps raise the held-out accuracy of the tiny model by well over 5 points (the
# >   assert above); the full job runs 300.
#
# ## Further reading
#
# * OpenAI Spinning Up, "Part 3: Intro to Policy Optimization": the policy-gradient derivation,
#   baselines and the log-derivative trick;
#   https://spinningup.openai.com/en/latest/spinningup/rl_intro3.html
# * Shao et al. 2024, DeepSeekMath (arXiv:2402.03300), section 4.1 (GRPO).
# * Schulman 2020, "Approximating KL divergence", http://joschu.net/blog/kl-approx.html
# * Stanford CS336, assignment 5 (alignment and GRPO); https://github.com/stanford-cs336
#
# ## Exercises
#
# Write `group_advantages`, `clipped_objective` and `kl_k3` in `exercises/ex02_grpo.py`, check
# them with `exercises/ex02_grpo.ipynb` or `python -m rlm_course grade 02`. Then try: set
# `normalize_std=False` (Dr. GRPO) or `kl_coef=0` (no reference model at all) and compare the
# curves and the seconds spent in scoring.
