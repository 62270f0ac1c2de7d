"""The family comparison: every preset, several seeds, one task; results stored for notebook 04.

``python -m rlm_course family --task addition --seeds 0 1 2 --steps 150`` runs each preset of
:data:`rlm_course.rl.algorithms.PRESETS` once per seed, each run in its own process (so that the
process's peak memory belongs to one algorithm), through the same CLI a learner uses, and writes
``data/experiments/family-<task>.json``: the command that made it (with ``OMP_NUM_THREADS`` when
set: the thread count changes the numbers, though not a run's repeatability), and per run the accuracy before
and after, the eval-accuracy and reward curves, seconds per step and per stage, and the run's cost
summary (models held, passes per response, memory).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from rlm_course.algorithms import PRESETS
from rlm_course.tasks.base import Task
from rlm_course.utils import atomic_write_json, data_dir, ensure_writable_folder


def run_cli_job(argv: list[str], run_dir: Path) -> tuple[dict, list[dict]]:
    """Run one job of the command line in its own process (``argv`` after ``python -m
    rlm_course``) and read what it wrote to ``run_dir``.

    Returns:
        ``(summary, rows)``: its ``summary.json`` and the rows of its ``metrics.jsonl``.

    Raises:
        ValueError: for a failed run; the message gives its last error line and the command to
            rerun it alone.
    """
    command = [sys.executable, "-m", "rlm_course", *argv]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ValueError(f"run {Path(run_dir).name} failed: {last} (rerun it alone with: python "
                         f"{' '.join(command[1:])})")
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return summary, rows


def default_results_path(task: Task) -> Path:
    return data_dir() / "experiments" / f"family-{task.key}.json"


def run_family(task: Task, task_flags: list[str], seeds: list[int], steps: int,
               variants: list[str] | None = None, runs_dir: str | Path = "runs/family",
               out: str | Path | None = None, progress: bool = True,
               store: bool = False) -> Path:
    """Run every variant for every seed and store the results (see the module docstring).

    Args:
        task_flags: the CLI flags that select ``task`` (e.g. ``["--task", "addition"]``).
        runs_dir: where the runs' folders go (``<variant>-seed<seed>``, replaced if present).
        out: the results file (default: the stored one, :func:`default_results_path`).
        store: the results replace the stored file (``--store`` in the recorded command).

    Returns:
        The path of the results file.

    Raises:
        ValueError: for an unknown variant, no seeds, non-positive steps, or a failed run (the
            message gives the command to rerun and its last output).
    """
    variants = list(PRESETS) if variants is None else variants
    unknown = [v for v in variants if v not in PRESETS]
    if unknown:
        raise ValueError(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(PRESETS)}.")
    if not seeds:
        raise ValueError("--seeds: give at least one seed.")
    if steps <= 0:
        raise ValueError(f"--steps {steps} must be positive.")
    bad = [s for s in seeds if not 0 <= s < 2**63]
    if bad:
        raise ValueError(f"--seeds: {bad} out of range; seeds are integers in [0, 2**63).")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ValueError(f"--seeds: {', '.join(map(str, repeated))} given more than once; a seed "
                         "repeats its run exactly, so it would count twice in the means and "
                         "standard deviations; give distinct seeds (e.g. --seeds 0 1 2).")
    out = Path(out) if out is not None else default_results_path(task)
    # before an hour of runs, not when they save (and after the checks above, so that a
    # refused command leaves no folder behind)
    checks = [(out.parent, "--out"), (Path(runs_dir), "--runs-dir")]
    if out.parent.resolve().is_relative_to(Path(runs_dir).resolve()):
        checks.reverse()  # the results go into the runs' folder: that is the flag to change
    for folder, flag in checks:
        ensure_writable_folder(folder, flag)
    threads = os.environ.get("OMP_NUM_THREADS")
    command = ((f"OMP_NUM_THREADS={threads} " if threads else "") +
               f"python -m rlm_course family {' '.join(task_flags)} --seeds "
               f"{' '.join(map(str, seeds))} --steps {steps}"
               + ("" if variants == list(PRESETS) else f" --variants {' '.join(variants)}")
               + (" --store" if store else ""))
    results = {"command": command, "torch_threads": torch.get_num_threads(), "task": task.key,
               "steps": steps, "seeds": seeds,
               "variants": variants, "runs": []}
    jobs = [(v, s) for s in seeds for v in variants]
    for variant, seed in tqdm(jobs, desc="family runs", disable=not progress):
        name = f"{variant}-seed{seed}"
        argv = ["grpo", *task_flags, "--variant", variant, "--seed", str(seed), "--steps",
                str(steps), "--out", str(runs_dir), "--name", name, "--overwrite", "--no-progress"]
        start = time.perf_counter()
        summary, rows = run_cli_job(argv, Path(runs_dir) / name)
        results["runs"].append({
            "variant": variant, "seed": seed,
            "accuracy_before": summary["accuracy_before"],
            "accuracy_after": summary["accuracy_after"],
            "eval_curve": [[r["step"], r["accuracy_eval"]] for r in rows if "accuracy_eval" in r],
            "reward_curve": [round(r["reward_mean"], 4) for r in rows],
            "wall_seconds": summary["wall_seconds"],
            "process_seconds": round(time.perf_counter() - start, 1),
            "stage_seconds": summary["stage_seconds"],
            "tokens_generated": summary["tokens_generated"],
            "cost": summary["cost"],
        })
        atomic_write_json(out, results)  # partial results survive an interrupted experiment
    return out
