"""The rollout/trainer mismatch, measured on a laptop CPU (chapter 13).

An inference engine and a trainer give different log-probs for the *same* weights (bf16 or fp8
weights in the engine, fp32 master weights in the trainer, other kernels), so a "synchronous,
on-policy" run trains on tokens another policy sampled. verl (rollout importance sampling),
NeMo-RL, TRL (``vllm_importance_sampling_correction``) and prime-rl offer a correction, after Yao
et al. (2025, "Your efficient RL framework secretly brings you off-policy RL training", TIS).

Here the engine is a rounded copy of the policy (:mod:`rlm_course.lm.precision`: bf16 weights and
activations, or fp8-rounded weights) and the trainer the fp32 policy itself:

* :func:`measure_mismatch`: one batch of the task sampled by each engine and scored by the
  trainer: the per-token log-ratios ``log w = log pi_trainer - log pi_engine`` (their histogram),
  KL(engine || trainer) per token and per response, how the response's KL grows with its length,
  the share of tokens and responses a cap of 2 would truncate or mask, and each engine's own
  decode speed against fp32 on this CPU;
* :func:`learning_runs`: GRPO on the task with the engine's rollouts and no correction, TIS and
  MIS (and the fp32 engine as the reference), several seeds, each through the command a learner
  types (``python -m rlm_course grpo ... --rollout-precision fp8 --correction tis``).

``python -m rlm_course systems mismatch`` runs both and stores them in
``data/experiments/systems-mismatch.json`` (:func:`mismatch_experiment`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from rlm_course.algorithms import CORRECTIONS, PRECISIONS
from rlm_course.lm.precision import rollout_copy
from rlm_course.lm.sampling import generate, response_log_probs
from rlm_course.rl.experiments import run_cli_job
from rlm_course.rl.kl import kl_k3
from rlm_course.rl.off_policy import mismatch_stats

#: Histogram bins of ``log w`` (symmetric, finer near 0, where almost every token is).
LOG_RATIO_BINS = (-2.0, -0.5, -0.2, -0.1, -0.05, -0.02, -0.01, -0.005, -0.001, 0.001, 0.005,
                  0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 2.0)


def kl_by_length(log_ratio: torch.Tensor, response_mask: torch.Tensor,
                 edges: tuple[int, ...]) -> list[dict]:
    """The mean KL of whole responses per response-length bin ``[edges[i], edges[i+1])``: per
    response the sum of its tokens' k3 estimates ``w_t - 1 - log w_t`` (``w = exp(log_ratio)``),
    an unbiased, non-negative estimate of KL(engine || trainer) of the response.

    Args:
        log_ratio: ``(batch, R)`` ``log pi_trainer - log pi_engine`` per sampled token.
        response_mask: ``(batch, R)`` bool.
        edges: increasing lengths (tokens).

    Returns:
        per non-empty bin ``{"lengths": [lo, hi], "responses": n, "kl": mean, "kl_per_token":
        mean / mean length}``.
    """
    lengths = response_mask.sum(1)
    log_w = torch.where(response_mask, log_ratio, 0.0).double()
    seq_kl = kl_k3(torch.zeros_like(log_w), log_w).sum(1)  # 0 on padding, where log w = 0
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        rows = (lengths >= lo) & (lengths < hi)
        if rows.any():
            out.append({"lengths": [int(lo), int(hi)], "responses": int(rows.sum()),
                        "kl": float(seq_kl[rows].mean()),
                        "kl_per_token": float(seq_kl[rows].sum() / lengths[rows].sum())})
    return out


def measure_mismatch(model, task, tokenizer, precisions=("bf16", "fp8"), prompts: int = 64,
                     group_size: int = 4, seed: int = 0, cap: float = 2.0,
                     repeats: int = 3) -> dict:
    """Sample one batch of ``task`` with each engine, score it with the trainer (``model`` in
    fp32), and time each engine's generation against the fp32 one (best of ``repeats``).

    Args:
        model: the policy (the trainer's fp32 weights; e.g. the SFT warm start).
        precisions: the engines to measure (:data:`~rlm_course.algorithms.PRECISIONS`; fp32 is
            always measured, as the reference: its gap is the KV cache against the full pass).
        prompts, group_size: the batch (``prompts x group_size`` responses, at temperature 1).
        cap: the cap whose truncated or masked share is reported.

    Returns:
        ``{precision: {"stats": mismatch_stats, "histogram": {"edges", "counts"},
        "kl_by_length": [...], "tokens": n, "seconds": s, "tokens_per_second": t,
        "speed_vs_fp32": ratio}}``.

    Raises:
        ValueError: for an unknown precision or fewer than one prompt, sample or repeat.
    """
    unknown = [p for p in precisions if p not in PRECISIONS]
    if unknown:
        raise ValueError(f"unknown precision(s) {unknown}; choose from {', '.join(PRECISIONS)}.")
    if min(prompts, group_size, repeats) < 1:
        raise ValueError(f"prompts={prompts}, group_size={group_size}, repeats={repeats}: give "
                         "1 or more of each.")
    problems = task.problems(prompts, seed, set())
    group = [p for p in problems for _ in range(group_size)]
    tokens, mask = tokenizer.encode_prompts([p.prompt for p in group])
    budget = task.max_response_len
    edges = tuple(range(0, budget + 9, 8))
    out = {}
    model.eval()
    for precision in ("fp32", *[p for p in precisions if p != "fp32"]):
        engine = rollout_copy(model, precision)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            rollout = generate(engine, tokens, mask, budget, tokenizer.eos_id, tokenizer.pad_id,
                               generator=torch.Generator().manual_seed(seed))
            times.append(time.perf_counter() - start)
        with torch.no_grad():
            trainer = response_log_probs(model, rollout.tokens, rollout.attention_mask,
                                         rollout.prompt_len)
        rmask = rollout.response_mask
        log_ratio = torch.where(rmask, trainer - rollout.log_probs, 0.0)
        counts = torch.histogram(log_ratio[rmask].double().clamp(LOG_RATIO_BINS[0],
                                                                   LOG_RATIO_BINS[-1]),
                                 torch.tensor(LOG_RATIO_BINS, dtype=torch.float64))[0]
        n = int(rmask.sum())
        out[precision] = {
            "stats": mismatch_stats(trainer, rollout.log_probs, rmask, cap),
            "histogram": {"edges": list(LOG_RATIO_BINS), "counts": [int(c) for c in counts]},
            "kl_by_length": kl_by_length(log_ratio, rmask, edges),
            "tokens": n, "seconds": min(times), "tokens_per_second": n / min(times),
        }
    for result in out.values():
        result["speed_vs_fp32"] = result["tokens_per_second"] / out["fp32"]["tokens_per_second"]
    return out


#: The learning runs: (rollout precision, correction); the fp32 engine is the reference.
LEARNING_RUNS = (("fp32", "none"), ("fp8", "none"), ("fp8", "tis"), ("fp8", "mis"))
#: Chapter 13's GRPO settings on the scratchpad task (as ``systems async`` uses).
RUN_FLAGS = ("--task", "scratchpad", "--prompts-per-step", "16", "--group-size", "8", "--lr",
             "1e-4", "--warmup-steps", "10", "--eval-every", "20")


def learning_runs(seeds: list[int], steps: int, runs=LEARNING_RUNS,
                  runs_dir: str | Path = "runs/systems/systems-mismatch",
                  progress: bool = True) -> list:
    """GRPO runs of :data:`LEARNING_RUNS` x ``seeds``, each in its own process through the
    command line (``python -m rlm_course grpo`` with :data:`RUN_FLAGS`), each in its folder
    ``runs_dir/<precision>-<correction>-seed<seed>/`` (replaced by a new run of the same name).

    Returns:
        per run ``{"precision", "correction", "seed", "command", "accuracy_before",
        "accuracy_after", "eval_curve", "behaviour_kl" (per step), "weight_max" (per step),
        "corrected_tokens" (per step, 0 without a correction), "wall_seconds"}``.

    Raises:
        ValueError: for an unknown precision or correction, no seeds, ``steps < 1``, or a failed
            run (the message gives the command to rerun it alone).
    """
    from tqdm.auto import tqdm

    for precision, correction in runs:
        if precision not in PRECISIONS or correction not in CORRECTIONS:
            raise ValueError(f"run ({precision!r}, {correction!r}): choose a precision of "
                             f"{PRECISIONS} and a correction of {CORRECTIONS}.")
    if not seeds or steps < 1:
        raise ValueError(f"seeds={seeds}, steps={steps}: give at least one seed and one step.")
    out = []
    jobs = [(p, c, s) for s in seeds for p, c in runs]
    for precision, correction, seed in tqdm(jobs, desc="mismatch runs", disable=not progress):
        name = f"{precision}-{correction}-seed{seed}"
        flags = [*RUN_FLAGS, "--steps", str(steps), "--seed", str(seed),
                 "--rollout-precision", precision, "--correction", correction]
        summary, rows = run_cli_job(["grpo", *flags, "--out", str(runs_dir), "--name", name,
                                     "--overwrite", "--no-progress"], Path(runs_dir) / name)
        out.append({
            "precision": precision, "correction": correction, "seed": seed,
            "command": "python -m rlm_course grpo " + " ".join(flags)
                       + f" --out {runs_dir} --name {name} --overwrite",
            "accuracy_before": summary["accuracy_before"],
            "accuracy_after": summary["accuracy_after"],
            "eval_curve": [[r["step"], r["accuracy_eval"]] for r in rows if "accuracy_eval" in r],
            "behaviour_kl": [r.get("behaviour_kl", 0.0) for r in rows],
            "weight_max": [r.get("weight_max", 1.0) for r in rows],
            "corrected_tokens": [r.get("corrected_tokens", 0.0) for r in rows],
            "wall_seconds": summary["wall_seconds"],
        })
    return out


def mismatch_experiment(steps: int = 60, seeds=(0, 1), progress: bool = True,
                        runs_dir: str | Path = "runs/systems/systems-mismatch") -> dict:
    """:func:`measure_mismatch` on the scratchpad task's SFT warm start, then
    :func:`learning_runs` (``steps`` each, ``seeds``, their run folders in ``runs_dir``); what
    ``systems mismatch`` stores."""
    from rlm_course.lm.checkpoint import load_checkpoint
    from rlm_course.lm.tokenizer import CharTokenizer
    from rlm_course.rl.runs import default_sft_checkpoint
    from rlm_course.tasks import get_task

    task = get_task("scratchpad")
    model = load_checkpoint(default_sft_checkpoint(task))["model"]
    measured = measure_mismatch(model, task, CharTokenizer())
    runs = learning_runs(list(seeds), steps, runs_dir=runs_dir, progress=progress)
    threads = os.environ.get("OMP_NUM_THREADS")
    return {"task": task.key, "measured": measured, "runs": runs, "steps": steps,
            "seeds": list(seeds), "threads": threads}
