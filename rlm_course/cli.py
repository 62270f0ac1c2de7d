"""Command line: ``python -m rlm_course <command> ...`` (``--help`` on each command).

Answering ``--help`` imports nothing heavy: torch and the training code are imported by the
command that needs them."""


from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from rlm_course.tasks import TASKS, get_task

DESCRIPTION = ("The course's jobs, benchmarks and tools. Run `python -m rlm_course <command> --help` "
               "for a command's options. Needs the course's environment: `source .venv/bin/activate` "
               "after `make demo` or `make test` (or call .venv/bin/python -m rlm_course ...).")

TASK_FLAGS = {  # task settings exposed as flags: name -> (type, help)
    "digits": (int, "addition: digits per operand"),
    "n_numbers": (int, "countdown: how many numbers are given"),
    "max_number": (int, "countdown: largest given number"),
    "max_target": (int, "countdown: largest target"),
    "max_digits": (int, "scratchpad: most digits per operand"),
    "decay": (float, "scratchpad: P(n digits) proportional to decay ** (n - 1)"),
}
TASK_SETTINGS = {name: tuple(f.name for f in dataclasses.fields(cls) if f.init and f.name in TASK_FLAGS)
                 for name, cls in TASKS.items()}


def _add_task_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", required=True, help=f"one of {sorted(TASKS)}")
    for name, (kind, help_text) in TASK_FLAGS.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None, help=help_text)


def _task_from_args(args):
    if args.task not in TASKS:
        raise ValueError(f"unknown task {args.task!r}; choose one of {sorted(TASKS)}.")
    settings = {}
    for name in TASK_FLAGS:
        value = getattr(args, name)
        if value is None:
            continue
        if name not in TASK_SETTINGS[args.task]:
            raise ValueError(f"--{name.replace('_', '-')} does not apply to task {args.task!r} "
                             f"(its settings: {', '.join(TASK_SETTINGS[args.task])}).")
        settings[name] = value
    return get_task(args.task, **settings)


RL_FLAGS = (("steps", int), ("group-size", int), ("prompts-per-step", int), ("lr", float),
            ("seed", int), ("ppo-epochs", int), ("minibatches", int), ("eval-every", int))
#: Algorithm parts (see rlm_course.rl.algorithms.RLConfig): flag -> type, or a tuple of choices, or
#: bool (an on/off pair --x / --no-x). Each overrides the chosen --variant's value.
ALGORITHM_FLAGS = {
    "advantage": "ADVANTAGES",  # the name of the allowed values in rlm_course.rl.options
    "normalize-std": bool,
    "ratio-level": "RATIO_LEVELS",
    "clip-eps": float,
    "clip-eps-high": float,
    "loss-agg": "AGGREGATIONS",
    "kl-mode": "KL_MODES",
    "kl-estimator": "KL_ESTIMATORS",
    "kl-coef": float,
    "entropy-coef": float,
    "dynamic-sampling": bool,
    "max-sampling-rounds": int,
    "overlong-buffer": int,
    "use-critic": bool,
    "gamma": float,
    "lam": float,
    "critic-lr": float,
    "value-clip": float,
}


def _set_threads(args) -> None:
    """Set torch's thread count for a job (``--threads``, or :func:`rlm_course.utils.choose_threads`)."""
    import torch

    from rlm_course.utils import choose_threads

    threads, why = choose_threads(getattr(args, "threads", None))
    torch.set_num_threads(threads)
    if not getattr(args, "no_progress", False):
        print(f"Using {threads} CPU thread{'s' if threads > 1 else ''} ({why}; --threads to "
              "change).", file=sys.stderr)


def _rl_config(args):
    """The RLConfig of a ``grpo``/``ppo`` command line: the preset with the flags' overrides."""
    from rlm_course.algorithms import preset

    names = [n for n, _ in RL_FLAGS] + list(ALGORITHM_FLAGS)
    overrides = {n.replace("-", "_"): getattr(args, n.replace("-", "_")) for n in names
                 if getattr(args, n.replace("-", "_")) is not None}
    config = preset(args.variant, **overrides)
    ignored = config.unused(overrides)
    if ignored:
        raise ValueError("; ".join(f"--{k.replace('_', '-')} has no effect in this combination: {v}"
                                   for k, v in ignored.items()) + ". Drop it, or turn on what uses it.")
    return config


def _rl(args) -> int:
    from rlm_course.rl.runs import run_rl

    task = _task_from_args(args)
    config = _rl_config(args)
    if args.nproc != 1:  # data-parallel processes (chapter 11), one thread each by default
        from rlm_course.distributed.grpo import run_rl_distributed

        if args.resume:
            raise ValueError("--resume with --nproc: a data-parallel run restarts from scratch; "
                             "its checkpoint.pt loads in one process (resume it without --nproc).")
        run_rl_distributed(task, config, args.nproc, name=args.name, out_dir=args.out,
                           overwrite=args.overwrite, sft_checkpoint=args.sft_checkpoint,
                           progress=not args.no_progress,
                           threads=1 if args.threads is None else args.threads)
        return 0
    _set_threads(args)
    summary = run_rl(task, config, name=args.name, out_dir=args.out, resume=args.resume,
                     overwrite=args.overwrite, sft_checkpoint=args.sft_checkpoint,
                     progress=not args.no_progress)
    return 130 if summary.get("interrupted") else 0


def _sft(args) -> int:
    from rlm_course.lm.tokenizer import CharTokenizer
    from rlm_course.rl.runs import default_sft_checkpoint, make_sft_checkpoint
    from rlm_course.rl.sft import SFTConfig

    task = _task_from_args(args)
    out = Path(args.out) if args.out else default_sft_checkpoint(task)
    _set_threads(args)
    path = make_sft_checkpoint(task, CharTokenizer(), out, SFTConfig(seed=args.seed),
                               progress=not args.no_progress)
    print(f"Saved SFT checkpoint {path} (see {path.with_suffix('.json')})")
    return 0


def _eval(args) -> int:
    from rlm_course.lm.checkpoint import load_checkpoint
    from rlm_course.lm.tokenizer import CharTokenizer
    from rlm_course.rl.evaluate import evaluate
    from rlm_course.rl.runs import check_model_for_task
    from rlm_course.tasks.eval_sets import load_eval_set

    task = _task_from_args(args)
    if args.show < 0:
        raise ValueError(f"--show {args.show}: give the number of responses to print (0 or more).")
    checkpoint = load_checkpoint(args.checkpoint)
    if checkpoint.get("task") not in (None, task.key):
        raise ValueError(f"checkpoint {args.checkpoint} was trained on {checkpoint['task']}, not "
                         f"{task.key}; pass the matching --task and task options.")
    model = checkpoint["model"]
    check_model_for_task(model.config, CharTokenizer(), task, task.max_response_len,
                         f"checkpoint {args.checkpoint}")
    problems = load_eval_set(task)
    result = evaluate(model, task, problems, CharTokenizer())
    for p, r in list(zip(problems, result.responses))[: args.show]:
        print(f"{p.prompt}{r}   {'ok' if task.verify(p, r).correct else 'wrong, expected ' + p.answer}")
    print(f"accuracy {result.accuracy:.1%}, format {result.format_rate:.1%} on {len(problems)} "
          f"held-out problems of {task.key}")
    return 0


def _bench(args) -> int:
    from rlm_course.tools import bench

    return bench.main(args.what, args)


def _distributed(args) -> int:
    from rlm_course.distributed.torchrun import run_torchrun

    return run_torchrun(args.worker, args.nproc, args.rest)


def _systems(args) -> int:
    from rlm_course.systems.experiments import main as systems_main

    return systems_main(args.experiment, args)


#: The largest cluster `plan` searches (chapter 14 validates the simulator up to here).
MAX_PLAN_GPUS = 10_000


def _plan(args) -> int:
    from rlm_course.cluster.calibration import calibrated_rates
    from rlm_course.cluster.planner import format_plan, plan
    from rlm_course.cluster.simulator import algorithm
    from rlm_course.cost.anatomy import Workload
    from rlm_course.cost.architectures import get_spec
    from rlm_course.cost.hardware import get_device

    spec, device = get_spec(args.model), get_device(args.device)  # clear errors for unknown names
    for flag in ("gpus", "top", "prompts", "group_size", "minibatches", "prompt_len"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: give 1 or more.")
    if args.gpus > MAX_PLAN_GPUS:
        raise ValueError(f"--gpus {args.gpus}: the planner searches clusters of up to "
                         f"{MAX_PLAN_GPUS:,} devices (the largest size bench simulator runs); "
                         "plan a share of the cluster (e.g. one job's pool) instead.")
    workload = Workload.long_tailed(args.prompts, args.group_size, args.prompt_len,
                                    args.mean_response, args.sigma, args.max_response, args.seed)
    config = algorithm(args.algorithm, minibatches=args.minibatches)
    placements = ("colocated", "disaggregated") if args.placement == "any" else (args.placement,)
    rates = calibrated_rates(args.rates)
    result = plan(spec, config, workload, device, args.gpus, rates=rates, placements=placements,
                  modes=args.modes, staleness_penalty=args.staleness_penalty)
    print(f"{spec.name}, {args.algorithm}, {args.gpus} x {device.name}: {args.prompts} prompts x "
          f"{args.group_size}, prompts of {args.prompt_len} tokens, responses log-normal (mean "
          f"{args.mean_response:g}, sigma {args.sigma:g}, at most {args.max_response}); rates "
          f"calibrated on {args.rates}'s published runs (decode step latency "
          f"{rates.decode_step_latency * 1e3:.1f} ms, training HFU {rates.train_hfu:.2f}); "
          f"staleness priced at {args.staleness_penalty:g} extra steps per version; "
          f"{len(result.ranked)} plans simulated, {len(result.refused)} refused")
    print(format_plan(result, args.top))
    if args.sensitivity:
        from rlm_course.cluster.planner import sensitivity
        from rlm_course.utils import format_table

        rows = sensitivity(spec, config, workload, device, args.gpus, rates=rates, base=result,
                           staleness_penalty=args.staleness_penalty, placements=placements,
                           modes=args.modes)
        print("which rates decide the plan (planned again with one rate moved):")
        print(format_table([[r["rate"], f"{r['value']:g}", r["best"], f"{r['step']:,.0f}",
                             "yes" if r["flips"] else ""] for r in rows],
                           ["rate", "value", "best plan", "step s", "flips"]))
    return 0


def _validate(args) -> int:
    from rlm_course.cluster.calibration import calibrate_all, describe
    from rlm_course.cluster.validation import format_validation, summary, validation_table

    if args.calibrate:
        calibrate_all(progress=None if args.no_progress else
                      (lambda line: print(line, file=sys.stderr)))
        print("wrote data/published/rates.json")
    print(describe())
    rows = validation_table()
    print(format_validation(rows))
    result = summary(rows)
    print(f"out of sample: {result['out_of_sample_hits']} of {result['out_of_sample_total']} "
          f"within tolerance (the null model: {result['null_hits']} of {result['null_total']}); "
          f"{result['direction_errors']} direction errors; {result['free_parameters']} free "
          f"parameters fitted on {result['in_sample_total']} calibration figures")
    print(json.dumps(result))
    return 0


def _grade(args) -> int:
    from rlm_course.tools.grading import main as grade_main

    return grade_main(args.impl, args.chapter)


def _exercises(args) -> int:
    from rlm_course.tools.exercisegen import main as gen_main

    return gen_main(check=args.check, force=args.force)


def _family(args) -> int:
    from rlm_course.rl.experiments import run_family

    task = _task_from_args(args)
    flags = ["--task", args.task]
    for name in TASK_FLAGS:
        if getattr(args, name) is not None:
            flags += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    path = run_family(task, flags, args.seeds, args.steps, args.variants, runs_dir=args.runs_dir,
                      out=args.out, progress=not args.no_progress)
    print(f"wrote {path}")
    return 0


def _hardware(args) -> int:
    from rlm_course.cost.hardware import load_catalog, measure_this_machine
    from rlm_course.utils import format_table

    if args.measure:
        device = measure_this_machine()
        print(f"measured this machine: {device.peak_flops / 1e9:.1f} GFLOP/s fp32 matmul peak, "
              f"{device.memory_bandwidth / 1e9:.1f} GB/s copy bandwidth")
    rows = [[d.name, f"{d.peak_flops / 1e12:,.2f}", f"{d.memory_bytes / 1e9:,.0f}",
             f"{d.memory_bandwidth / 1e12:.3f}", f"{d.ridge_point:,.0f}",
             f"{d.intra_node_bandwidth / 1e9:,.0f}", f"{d.inter_node_bandwidth / 1e9:,.0f}"]
            for d in load_catalog().values()]
    print(format_table(rows, ["device", "dense peak TFLOP/s*", "memory GB", "bandwidth TB/s",
                              "ridge FLOP/B", "intra-node GB/s**", "inter-node GB/s**"]))
    print("* bf16 for accelerators, fp32 for this machine; ** per direction (half a datasheet's "
          "bidirectional NVLink figure); sources in data/hardware/")
    return 0


def _make_eval_sets(args) -> int:
    from rlm_course.tasks.eval_sets import write_eval_set

    for name in sorted(TASKS):
        print(f"wrote {write_eval_set(get_task(name))}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rlm_course", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)

    from rlm_course import algorithms as options
    from rlm_course.algorithms import PRESETS

    for command, help_text in (("grpo", "SFT warm start if needed, then GRPO or another --variant "
                                        "of the family; writes runs/<name>/"),
                               ("ppo", "SFT warm start if needed, then PPO with a critic "
                                       "(= grpo --variant ppo)")):
        p = sub.add_parser(command, help=help_text)
        _add_task_args(p)
        p.add_argument("--variant", choices=list(PRESETS), default=command,
                       help=f"preset algorithm (default {command}); the flags below override parts "
                            "of it")
        for flag, kind in RL_FLAGS:
            p.add_argument(f"--{flag}", type=kind, default=None)
        for flag, kind in ALGORITHM_FLAGS.items():
            if kind is bool:
                p.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, default=None)
            elif isinstance(kind, str):
                p.add_argument(f"--{flag}", choices=getattr(options, kind), default=None)
            else:
                p.add_argument(f"--{flag}", type=kind, default=None)
        p.add_argument("--name", default=None,
                       help="run folder name (default <variant>-<task>-seed<seed>)")
        p.add_argument("--out", default="runs", help="parent folder of runs (default runs/)")
        p.add_argument("--resume", action="store_true", help="continue the run from its checkpoint")
        p.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
        p.add_argument("--sft-checkpoint", default=None,
                       help="warm-start checkpoint (default data/checkpoints/sft-<task>.pt, made if "
                            "missing)")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
        p.add_argument("--threads", type=int, default=None,
                       help="CPU threads (default: the free cores; 1 when other work is running)")
        p.add_argument("--nproc", type=int, default=1,
                       help="data-parallel processes (gloo on CPU, NCCL on GPUs; --threads per "
                            "process, default 1); runs/<name> gets -dp<nproc>")
        p.set_defaults(func=_rl)

    p = sub.add_parser("sft", help="make the supervised warm-start checkpoint")
    _add_task_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="checkpoint path (default data/checkpoints/sft-<task>.pt)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: the free cores; 1 when other work is running)")
    p.set_defaults(func=_sft)

    p = sub.add_parser("eval", help="greedy held-out accuracy of a checkpoint")
    _add_task_args(p)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--show", type=int, default=5, help="print this many responses")
    p.set_defaults(func=_eval)

    p = sub.add_parser("bench", help="benchmarks: sampling (KV cache), train (MFU), family "
                                     "(seconds per step and memory of every preset), parallel (simulated "
                                     "strategies), memory (memory per step of every preset), systems (async RL "
                                     "throughput and weight sync on Ray workers), simulator (simulated "
                                     "GPU-iterations per second at 64, 1,024 and 10,000 GPUs)")
    p.add_argument("what", choices=["sampling", "train", "family", "parallel", "memory", "peer",
                                    "collectives", "systems", "simulator", "realrun"])
    p.add_argument("--repeats", type=int, default=5)
    p.set_defaults(func=_bench)

    p = sub.add_parser("distributed", help="run a worker of rlm_course.distributed under torchrun "
                                           "on this machine (hello, strategies, collectives, grpo)")
    p.add_argument("worker", help="hello, strategies, collectives or grpo")
    p.add_argument("--nproc", type=int, default=2, help="processes (torchrun --nproc-per-node)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="options of the worker")
    p.set_defaults(func=_distributed)

    from rlm_course.systems.experiments import EXPERIMENTS

    p = sub.add_parser("systems", help="chapters 12-13's measured experiments on Ray workers "
                                       "(weight-sync, reshard, async, fusion); stores "
                                       "data/experiments/systems-<experiment>.json")
    p.add_argument("experiment", choices=EXPERIMENTS)
    p.add_argument("--steps", type=int, default=None, help="async: RL steps per run (default 60)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timing repeats (weight-sync 5, reshard 3); fusion: iterations (5)")
    p.add_argument("--seed", type=int, default=None, help="async, fusion: the RL seed (0)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_systems)

    from rlm_course.cluster.simulator import MODES

    p = sub.add_parser("plan", help="search placements, per-role layouts and execution modes of an "
                                    "RL run on a cluster; print the best plans and why the others "
                                    "lose")
    p.add_argument("--model", required=True, help="an architecture of rlm_course.cost.architectures")
    p.add_argument("--gpus", type=int, required=True, help="devices in the cluster")
    p.add_argument("--device", default="H100-SXM-80GB", help="a device of the hardware catalog")
    p.add_argument("--algorithm", choices=list(PRESETS), default="grpo")
    p.add_argument("--minibatches", type=int, default=16, help="gradient steps per iteration")
    p.add_argument("--prompts", type=int, default=512, help="prompts per iteration")
    p.add_argument("--group-size", type=int, default=16, help="responses per prompt")
    p.add_argument("--prompt-len", type=int, default=512, help="prompt tokens")
    p.add_argument("--mean-response", type=float, default=4000, help="mean response tokens")
    p.add_argument("--sigma", type=float, default=0.8, help="log-normal tail of the lengths")
    p.add_argument("--max-response", type=int, default=16384, help="response budget")
    p.add_argument("--placement", choices=["any", "colocated", "disaggregated"], default="any")
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=None,
                   help="execution modes to try (default: all that the placement runs)")
    p.add_argument("--top", type=int, default=5, help="plans to print in full")
    p.add_argument("--seed", type=int, default=0, help="seed of the response lengths")
    p.add_argument("--rates", default="nemo-rl", choices=["nemo-rl", "verl"],
                   help="the family of calibrated rates to plan with (data/published/rates.json)")
    p.add_argument("--staleness-penalty", type=float, default=0.1,
                   help="extra steps per version of staleness to reach the same accuracy "
                        "(0: staleness is free)")
    p.add_argument("--sensitivity", action="store_true",
                   help="then plan again with each deciding rate moved (decode latency, HFU, "
                        "sync seconds, staleness price) and say which flip the plan")
    p.set_defaults(func=_plan)

    p = sub.add_parser("validate", help="chapter 14's simulator against published runs: rates "
                                        "calibrated once per family, every other figure "
                                        "predicted, with a null model")
    p.add_argument("--calibrate", action="store_true",
                   help="refit the rates on the calibration figures first and rewrite "
                        "data/published/rates.json (a few minutes)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_validate)

    p = sub.add_parser("grade", help="autograde the exercises (yours, or the worked solutions)")
    p.add_argument("chapter", nargs="?", default=None, help="e.g. 02 (default: all)")
    p.add_argument("--impl", choices=["exercises", "solutions"], default="exercises")
    p.set_defaults(func=_grade)

    p = sub.add_parser("exercises", help="regenerate exercises/ and solutions/ from the package")
    p.add_argument("--check", action="store_true", help="fail if the committed files are stale")
    p.add_argument("--force", action="store_true",
                   help="also overwrite exercise files that differ from their stub (your work!)")
    p.set_defaults(func=_exercises)

    p = sub.add_parser("family", help="every preset x several seeds; stores the results that "
                                      "notebook 04 plots")
    _add_task_args(p)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--variants", nargs="+", default=None, help="default: every preset")
    p.add_argument("--out", default=None,
                   help="results file (default data/experiments/family-<task>.json)")
    p.add_argument("--runs-dir", default="runs/family",
                   help="folder of the runs (default runs/family; runs of the same variant and "
                        "seed there are replaced)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_family)

    p = sub.add_parser("hardware", help="the hardware catalog (data/hardware/); --measure adds "
                                        "this machine")
    p.add_argument("--measure", action="store_true",
                   help="time this machine's matmul peak and memory bandwidth and store them")
    p.set_defaults(func=_hardware)

    p = sub.add_parser("make-eval-sets", help="rewrite data/eval/*.jsonl (fixed seeds)")
    p.set_defaults(func=_make_eval_sets)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] in ("torch", "numpy", "matplotlib", "tqdm",
                                                   "ipywidgets"):
            print(f"error: {err.name} is not installed for {sys.executable}. The course's packages "
                  "live in .venv (made by `make demo` or `make test`): run `source "
                  ".venv/bin/activate` first, or call `.venv/bin/python -m rlm_course ...`.",
                  file=sys.stderr)
            return 2
        raise
    except (ValueError, FloatingPointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (e.g. `... | head`): not an error of ours
        sys.stdout = open(os.devnull, "w")
        return 0
    except OSError as err:
        print(f"error: {err.strerror or err} ({err.filename or ''}); check the paths you passed.",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nInterrupted. Files written so far are kept (checkpoints are written atomically); "
              "a GRPO run continues from its last checkpoint with the same command plus --resume.",
              file=sys.stderr)
        return 130
    except RuntimeError as err:
        if "allocate" in str(err) or "out of memory" in str(err).lower():
            print("error: out of memory; lower --prompts-per-step or --group-size.", file=sys.stderr)
            return 2
        raise
