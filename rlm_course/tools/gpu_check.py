"""``python -m rlm_course gpu-check``: does the course run right on this machine's GPU?

One command, a few minutes on one GPU, that checks the CUDA path against the CPU path and times
it against the roofline:

1. **forward/backward**: the warm-start policy's log-probs and gradients on a rollout batch, on
   the CPU and on the GPU in fp32, agree within :func:`rlm_course.numerics.reorder_tolerance`
   (the same sums in another order: GPU kernels add differently);
2. **GRPO step**: one update from the same fixed batch in float64 on both devices; the parameters
   agree within :func:`rlm_course.numerics.adam_tolerance`;
3. **demo learns**: ``make demo``'s run (GRPO on 3-digit addition) on the GPU gains at least 30
   points of held-out accuracy, as it must on the CPU;
4. **strategies on NCCL**: chapter 11's strategies equal one device at the number of visible GPUs
   (``python -m rlm_course distributed strategies --device cuda``); with one GPU, skipped with
   the reason;
5. **timings**: ``bench train`` (fp32 and bf16 autocast; MFU against the catalog's peak) and
   ``bench sampling`` (the decode roofline).

A table of the checks, then one JSON object as the last line. Exit code 0 when every check that
ran passed, 1 when one failed, 2 on a machine without CUDA (with the reason).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
import time

import torch

#: Points of held-out accuracy the demo must gain (the README's promise for ``make demo``).
DEMO_GAIN_POINTS = 30.0


def _no_cuda_reason() -> str | None:
    if torch.cuda.is_available():
        return None
    build = ("a CPU-only build of torch" if torch.version.cuda is None
             else f"torch built for CUDA {torch.version.cuda}, but no GPU or driver is visible")
    return (f"gpu-check needs a CUDA GPU: torch.cuda.is_available() is False here ({build}, "
            f"torch {torch.__version__}). Run it on a machine with an NVIDIA GPU and a CUDA build "
            "of torch (pip install torch==2.13.0 from PyPI on Linux).")


def _fixed_batch(policy, config, task, tokenizer):
    """One seeded rollout batch of ``config`` generated on the CPU (the input both devices get)."""
    from rlm_course.rl.trainer import RLTrainer

    return RLTrainer(copy.deepcopy(policy).cpu(), task, tokenizer, config, []).collect(1)


def check_forward_backward(policy, task, tokenizer, device: str = "cuda") -> dict:
    """fp32 log-probs and gradients of one batch on the CPU and on ``device``."""
    from rlm_course.algorithms import preset
    from rlm_course.lm.sampling import response_log_probs
    from rlm_course.numerics import relative_error, reorder_tolerance

    batch = _fixed_batch(policy, preset("grpo", prompts_per_step=8, group_size=8), task,
                         tokenizer)
    out = []
    for where in ("cpu", device):
        model = copy.deepcopy(policy).to(where).float()
        r = batch.to(where).rollout
        logp = response_log_probs(model, r.tokens, r.attention_mask, r.prompt_len)
        (logp * r.response_mask).sum().backward()
        out.append((logp.detach().cpu(),
                    torch.cat([p.grad.reshape(-1).cpu() for p in model.parameters()])))
    config = policy.config
    tolerance = reorder_tolerance(torch.float32, 4 * config.d_model,
                                  depth=2 * (6 * config.n_layer + 1))
    mask = batch.rollout.response_mask
    logp_error = relative_error(out[1][0][mask], out[0][0][mask])
    grad_error = relative_error(out[1][1], out[0][1])
    return {"passed": logp_error <= tolerance and grad_error <= tolerance,
            "log_prob_error": logp_error, "grad_error": grad_error, "tolerance": tolerance}


def check_grpo_step(policy, task, tokenizer, device: str = "cuda") -> dict:
    """One GRPO update from the same float64 batch on the CPU and on ``device``."""
    from rlm_course.algorithms import preset
    from rlm_course.numerics import adam_tolerance, relative_error
    from rlm_course.rl.trainer import RLTrainer

    config = preset("grpo", prompts_per_step=8, group_size=4, minibatches=1, ppo_epochs=1,
                    eval_every=10**6)
    base = copy.deepcopy(policy).cpu().double()
    batch = _fixed_batch(base, config, task, tokenizer)
    params, grads = [], []
    for where in ("cpu", device):
        trainer = RLTrainer(copy.deepcopy(base).to(where), task, tokenizer, config, [])
        trainer.collect = lambda step, batch=batch.to(where): batch
        step = trainer.optimizer.step

        def keep_grads(*args, step=step, trainer=trainer, **kwargs):
            grads.append({n: p.grad.detach().to("cpu", copy=True)
                          for n, p in trainer.policy.named_parameters()})
            return step(*args, **kwargs)
        trainer.optimizer.step = keep_grads
        trainer.step()
        params.append({n: p.detach().to("cpu", copy=True)
                       for n, p in trainer.policy.named_parameters()})
    seq = batch.rollout.tokens.shape[1]
    tolerance = adam_tolerance(torch.float64, batch.trained * seq, config.lr_at(1), 1,
                               depth=2 * (6 * base.config.n_layer + 1))
    errors = {n: (params[1][n] - params[0][n]).abs().max().item() for n in params[0]}
    worst = max(errors, key=errors.get)
    flat = [torch.cat([g[n].reshape(-1) for n in g]) for g in grads]
    # where a check fails, which parameter and how far its gradients are apart say why: Adam
    # divides a gradient near 0 by eps (1e-8), so a difference there moves the weight most
    return {"passed": errors[worst] <= tolerance, "param_error": errors[worst],
            "tolerance": tolerance, "worst_parameter": worst,
            "grad_error": relative_error(flat[1], flat[0]),
            "worst_parameter_grad_difference":
                (grads[1][worst] - grads[0][worst]).abs().max().item()}


def check_demo_learns() -> dict:
    """``make demo``'s run on the GPU."""
    from rlm_course.algorithms import preset
    from rlm_course.rl.runs import run_rl
    from rlm_course.tasks import get_task

    with tempfile.TemporaryDirectory() as out:
        summary = run_rl(get_task("addition"), preset("grpo"), name="demo", out_dir=out,
                         progress=False, log=lambda *a: None, device="cuda")
    gain = summary["accuracy_gain_points"]
    return {"passed": gain >= DEMO_GAIN_POINTS, "accuracy_before": summary["accuracy_before"],
            "accuracy_after": summary["accuracy_after"], "gain_points": gain,
            "wall_seconds": summary["wall_seconds"], "stage_seconds": summary["stage_seconds"]}


def check_strategies(timeout: float = 300.0) -> dict:
    """Chapter 11's strategies on NCCL, one rank per visible GPU."""
    gpus = torch.cuda.device_count()
    if gpus < 2:
        return {"skipped": f"{gpus} GPU visible: the strategies need 2 ranks or more, one GPU "
                           "each (run gpu-check on a machine with 2+ GPUs)"}
    command = [sys.executable, "-m", "rlm_course", "distributed", "strategies", "--nproc",
               str(gpus), "--device", "cuda"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    return {"passed": done.returncode == 0, "ranks": gpus, "command": " ".join(command[1:]),
            "result": last[:2000], **({} if done.returncode == 0
                                      else {"stderr": done.stderr.strip()[-2000:]})}


def check_timings(repeats: int = 5) -> dict:
    """``bench train`` (fp32, bf16 autocast) and ``bench sampling`` on the GPU."""
    from rlm_course.tools.bench import bench_sampling, bench_train

    fp32 = bench_train(repeats, device="cuda")
    bf16 = bench_train(repeats, device="cuda", bf16=True)
    sampling = bench_sampling(repeats, device="cuda")
    keep = ("step_seconds", "tokens_per_s", "fraction_of_matmul_peak", "mfu", "catalog_device",
            "matmul_peak_flops_per_s", "step_over_kernel_floor")
    return {"passed": sampling["identical_samples"],
            "train_fp32": {k: fp32[k] for k in keep if k in fp32},
            "train_bf16": {k: bf16[k] for k in keep if k in bf16},
            "sampling": {k: sampling[k] for k in ("kv_cache_seconds", "kv_cache_tokens_per_s",
                                                  "kv_cache_speedup", "decode_roofline_seconds",
                                                  "kv_cache_over_roofline",
                                                  "kv_cache_over_kernel_floor") if k in sampling}}


def main() -> int:
    """Run every check (see the module docstring); print a table and the JSON line.

    Returns:
        0 when every check that ran passed, 1 when one failed, 2 without CUDA.
    """
    reason = _no_cuda_reason()
    if reason is not None:
        print(f"error: {reason}", file=sys.stderr)
        print(json.dumps({"cuda": False, "passed": False, "reason": reason}))
        return 2
    from rlm_course.devices import device_description
    from rlm_course.lm.tokenizer import CharTokenizer
    from rlm_course.rl.runs import load_sft_policy
    from rlm_course.tasks import get_task
    from rlm_course.utils import format_table

    task, tokenizer = get_task("addition"), CharTokenizer()
    policy, _ = load_sft_policy(task, tokenizer, progress=False, log=lambda *a: None)
    checks = {"forward_backward": lambda: check_forward_backward(policy, task, tokenizer),
              "grpo_step": lambda: check_grpo_step(policy, task, tokenizer),
              "demo_learns": check_demo_learns,
              "strategies_nccl": check_strategies,
              "timings": check_timings}
    device = device_description("cuda")
    print(f"gpu-check on {device}, torch {torch.__version__}, CUDA {torch.version.cuda}",
          flush=True)
    results = {}
    for name, check in checks.items():
        print(f"- {name} ...", flush=True)
        start = time.perf_counter()
        try:
            result = check()
        except Exception as err:  # a check that crashes is a failed check, and the rest still run
            result = {"passed": False, "error": f"{type(err).__name__}: {str(err)[:500]}"}
        result["seconds"] = round(time.perf_counter() - start, 1)
        results[name] = result
    rows = []
    for name, r in results.items():
        verdict = "skipped" if "skipped" in r else ("ok" if r["passed"] else "FAILED")
        detail = r.get("skipped") or r.get("error") or ", ".join(
            f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()
            if k not in ("passed", "seconds") and not isinstance(v, dict))[:110]
        rows.append([name, verdict, f"{r['seconds']:.0f}", detail])
    print(format_table(rows, ["check", "result", "s", "detail"]))
    failed = [n for n, r in results.items() if "skipped" not in r and not r["passed"]]
    print(json.dumps({"cuda": True, "device": device, "torch": torch.__version__,
                      "passed": not failed, "failed": failed, "checks": results}, default=str))
    return 1 if failed else 0
