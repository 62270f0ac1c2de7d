"""The RL jobs of the command line: ``grpo``/``ppo`` (every field of the RL configuration is a
flag, :mod:`rlm_course.arguments`), ``sft``, ``eval`` and ``family``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlm_course.arguments import (add_device_arg, add_rl_run_args, add_task_args, flag, path_arg,
                                  rl_config_from_args, task_from_args, task_settings)


def set_threads(args) -> None:
    """Set torch's thread count for a job (``--threads``, or
    :func:`rlm_course.utils.choose_threads`), once its ``--device`` is known to exist (a run
    that cannot start says why before it says how many threads it would use).

    Raises:
        ValueError: for a device torch does not see, or a thread count out of range.
    """
    import torch

    from rlm_course.devices import resolve_device
    from rlm_course.utils import choose_threads, cores

    if getattr(args, "device", None) is not None:
        resolve_device(args.device)

    requested = getattr(args, "threads", None)
    threads, why = choose_threads(requested)
    torch.set_num_threads(threads)
    over = threads > cores()  # a warning, shown even without progress lines
    if not getattr(args, "no_progress", False) or over:
        # a requested count above the cores already names the --threads that fits
        change = "" if over and requested is not None else "; --threads to change"
        print(f"Using {threads} CPU thread{'s' if threads > 1 else ''} ({why}{change}).",
              file=sys.stderr)


def _rl(args) -> int:
    from rlm_course.rl.runs import run_rl

    if getattr(args, "command", None) == "ppo" and args.variant != "ppo":
        raise ValueError(f"ppo --variant {args.variant}: the ppo command is grpo --variant ppo; "
                         f"for {args.variant} run `python -m rlm_course grpo --variant "
                         f"{args.variant} ...`, or drop --variant.")
    task = task_from_args(args)
    config = rl_config_from_args(args)
    if args.nproc != 1:  # data-parallel processes (chapter 11), one thread each by default
        import os

        from rlm_course.distributed.grpo import run_rl_distributed
        from rlm_course.distributed.launch import DEBUG_ENV, DistributedError, debug_enabled

        if getattr(args, "debug", False):
            os.environ[DEBUG_ENV] = "1"  # the ranks' tracebacks in the message, not only the log
        try:
            summary = run_rl_distributed(task, config, args.nproc, name=args.name,
                                         out_dir=args.out, overwrite=args.overwrite,
                                         sft_checkpoint=args.sft_checkpoint,
                                         progress=not args.no_progress, resume=args.resume,
                                         threads=1 if args.threads is None else args.threads,
                                         device=args.device)
        except DistributedError as err:  # one line per rank; the tracebacks are in a log file
            if debug_enabled():
                raise
            print(f"error: {err}", file=sys.stderr)
            return 1
        return 130 if summary.get("interrupted") else 0
    set_threads(args)
    summary = run_rl(task, config, name=args.name, out_dir=args.out, resume=args.resume,
                     overwrite=args.overwrite, sft_checkpoint=args.sft_checkpoint,
                     progress=not args.no_progress, device=args.device)
    return 130 if summary.get("interrupted") else 0


def _sft(args) -> int:
    from rlm_course.lm.tokenizer import CharTokenizer
    from rlm_course.rl.runs import default_sft_checkpoint, make_sft_checkpoint
    from rlm_course.rl.sft import SFTConfig

    task = task_from_args(args)
    if args.out and args.store:
        raise ValueError("--out and --store: give one (--store replaces the warm start in "
                         f"{default_sft_checkpoint(task).parent}; --out writes elsewhere).")
    stored = default_sft_checkpoint(task)
    if args.out:
        given = Path(args.out)
        if given.suffix == ".json":
            raise ValueError(f"--out {args.out}: the checkpoint's note is written beside it as "
                             f"<name>.json, which would replace the checkpoint; give a .pt path.")
        if given.is_file():
            raise ValueError(f"--out {args.out} exists (a checkpoint, or another file) and is not "
                             "replaced; give a new path, or remove it first (the committed warm "
                             "starts are replaced with --store).")
    # the first warm start of these task settings goes where the RL commands look for it; an
    # existing one (the course's committed ones among them) is replaced only when asked
    out = Path(args.out) if args.out else (
        stored if args.store or not stored.exists() else Path(args.runs_dir) / stored.name)
    if not args.out and out.parent == Path(args.runs_dir) and Path(args.runs_dir).exists() \
            and not Path(args.runs_dir).is_dir():
        raise ValueError(f"--runs-dir {args.runs_dir} is a file; give a folder (or --out for "
                         "the checkpoint's path).")
    set_threads(args)
    path = make_sft_checkpoint(task, CharTokenizer(), out, SFTConfig(seed=args.seed),
                               progress=not args.no_progress, device=args.device)
    print(f"Saved SFT checkpoint {path} (see {path.with_suffix('.json')})")
    if not args.out and out != stored:
        print(f"(the RL commands warm-start from {stored}; add --store to replace it, or pass "
              f"--sft-checkpoint {path} to a run)")
    return 0


def _eval(args) -> int:
    from rlm_course.devices import resolve_device
    from rlm_course.lm.checkpoint import load_checkpoint
    from rlm_course.lm.tokenizer import CharTokenizer
    from rlm_course.rl.evaluate import evaluate
    from rlm_course.rl.runs import check_model_for_task
    from rlm_course.tasks.eval_sets import load_eval_set

    task = task_from_args(args)
    if args.show < 0:
        raise ValueError(f"--show {args.show}: give the number of responses to print (0 or more).")
    device = resolve_device(args.device)
    checkpoint = load_checkpoint(args.checkpoint)
    if checkpoint.get("task") not in (None, task.key):
        raise ValueError(f"checkpoint {args.checkpoint} was trained on {checkpoint['task']}, not "
                         f"{task.key}; pass the matching --task and task options.")
    model = checkpoint["model"].to(device)
    check_model_for_task(model.config, CharTokenizer(), task, task.max_response_len,
                         f"checkpoint {args.checkpoint}")
    problems = load_eval_set(task)
    result = evaluate(model, task, problems, CharTokenizer())
    for p, r in list(zip(problems, result.responses))[: args.show]:
        print(f"{p.prompt}{r}   {'ok' if task.verify(p, r).correct else 'wrong, expected ' + p.answer}")
    print(f"accuracy {result.accuracy:.1%}, format {result.format_rate:.1%} on {len(problems)} "
          f"held-out problems of {task.key}" + ("" if device == "cpu" else f" ({device})"))
    return 0


def _family(args) -> int:
    from rlm_course.rl.experiments import default_results_path, run_family
    from rlm_course.utils import result_path

    task = task_from_args(args)
    if args.out and args.store:
        raise ValueError("--out and --store: give one (--store replaces the stored "
                         f"{default_results_path(task)}; --out writes elsewhere).")
    if args.out and Path(args.out).is_dir():  # before an hour of runs, not when it saves
        raise ValueError(f"--out {args.out} is a folder; give the results file's path (e.g. "
                         f"{Path(args.out) / 'family.json'}).")
    if args.out and Path(args.out).is_file():  # the stored results are replaced with --store
        raise ValueError(f"--out {args.out} exists and is not replaced; give a new path, or "
                         "remove it first (the stored results are replaced with --store).")
    twice = sorted({v for v in args.variants or [] if args.variants.count(v) > 1})
    if twice:
        raise ValueError(f"--variants names {', '.join(twice)} more than once (the second run "
                         "would replace the first); give each variant once.")
    flags = ["--task", args.task]
    for name, value in task_settings(args).items():
        flags += [flag(name), str(value)]
    stored = default_results_path(task)
    out = args.out or result_path(stored, args.store, args.runs_dir)
    path = run_family(task, flags, args.seeds, args.steps, args.variants, runs_dir=args.runs_dir,
                      out=out, progress=not args.no_progress, store=args.store)
    print(f"wrote {path}")
    if Path(path).resolve() != stored.resolve():
        print(f"(notebook 04 reads {stored}; add --store to replace it with these results)")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The RL commands, on the main parser's subcommands."""
    for command, help_text in (("grpo", "SFT warm start if needed, then GRPO or another --variant "
                                        "of the family; writes runs/<name>/"),
                               ("ppo", "SFT warm start if needed, then PPO with a critic "
                                       "(= grpo --variant ppo)")):
        p = sub.add_parser(command, help=help_text)
        add_rl_run_args(p, command)
        p.set_defaults(func=_rl)

    p = sub.add_parser("sft", help="make the supervised warm-start checkpoint")
    add_task_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, type=path_arg,
                   help="checkpoint path (default data/checkpoints/sft-<task>.pt when it does not "
                        "exist yet, otherwise <runs-dir>/sft-<task>.pt)")
    p.add_argument("--store", action="store_true",
                   help="replace the warm start in data/checkpoints/ that the RL commands use")
    p.add_argument("--runs-dir", default="runs/sft", type=path_arg,
                   help="where a new warm start goes when data/checkpoints/ has one (default "
                        "runs/sft)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads (default: the free cores; 1 when other work is running)")
    add_device_arg(p)
    p.set_defaults(func=_sft)

    p = sub.add_parser("eval", help="greedy held-out accuracy of a checkpoint")
    add_task_args(p)
    p.add_argument("--checkpoint", required=True, type=path_arg,
                   help="a checkpoint written by sft or grpo (e.g. runs/demo/checkpoint.pt or "
                        "data/checkpoints/sft-addition-3.pt)")
    p.add_argument("--show", type=int, default=5, help="print this many responses")
    add_device_arg(p)
    p.set_defaults(func=_eval)

    p = sub.add_parser("family", help="every preset x several seeds; stores the results that "
                                      "notebook 04 plots")
    add_task_args(p)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--variants", nargs="+", default=None, help="default: every preset")
    p.add_argument("--out", default=None, type=path_arg,
                   help="results file (default <runs-dir>/family-<task>.json)")
    p.add_argument("--store", action="store_true",
                   help="replace the stored data/experiments/family-<task>.json that notebook 04 "
                        "reads")
    p.add_argument("--runs-dir", default="runs/family", type=path_arg,
                   help="folder of the runs (default runs/family; runs of the same variant and "
                        "seed there are replaced)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_family)
