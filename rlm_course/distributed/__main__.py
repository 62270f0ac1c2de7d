"""The course's workers under ``torchrun``: one machine, or several.

One machine (what ``python -m rlm_course distributed <worker> --nproc 2`` runs for you)::

    torchrun --standalone --nproc-per-node 2 -m rlm_course.distributed hello
    torchrun --standalone --nproc-per-node 2 -m rlm_course.distributed strategies --time
    torchrun --standalone --nproc-per-node 2 -m rlm_course.distributed collectives
    torchrun --standalone --nproc-per-node 2 -m rlm_course.distributed grpo --task addition

Several machines: the same command on each, with the rendezvous of one of them (``HOST``, any
free port; ``--rdzv-id`` names the job)::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        --rdzv-id strategies-1 -m rlm_course.distributed strategies --time

Each rank picks its backend from its device (``--device auto``: NCCL on a GPU machine, one GPU
per rank, gloo otherwise; for ``grpo`` the worker's own ``--device`` says the same) and runs one
intra-op thread (``--threads``). Rank 0 prints; the last line is one JSON object with the results.

The worker's options are checked before any process group is joined (bad input: rank 0 prints
one line, every rank exits with code 2). A rank that fails prints one line (its rank, the
exception's type and message, the file holding its traceback: in ``$RLM_COURSE_LOG_DIR`` or the
temporary folder) and exits with code 1; ``RLM_COURSE_DEBUG=1`` prints the traceback too.
"""

from __future__ import annotations

import argparse
import json
import sys

WORKERS = ("hello", "strategies", "collectives", "grpo", "faulty")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchrun ... -m rlm_course.distributed",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a collective waits for its peers")
    sub = parser.add_subparsers(dest="worker", required=True)
    sub.add_parser("hello", help="one all-reduce: which ranks, backend and threads")
    p = sub.add_parser("strategies", help="DDP, FSDP2, TP, TP+SP and pipelines on TinyGPT: equal "
                                          "to one device, bytes = formulas (--time: step times)")
    p.add_argument("--strategies", nargs="+", default=None, help="default: all that fit")
    p.add_argument("--time", action="store_true",
                   help="time each strategy at learner size (float32) instead of checking it")
    p = sub.add_parser("collectives", help="time the collectives (see bench collectives)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-bytes", type=int, default=64 * 2**20)
    sub.add_parser("grpo", help="data-parallel GRPO; the options of python -m rlm_course grpo",
                   add_help=False)
    p = sub.add_parser("faulty", help="all-reduces in a loop until one rank fails on purpose: "
                                      "what a failed run reports")
    p.add_argument("--rank", type=int, default=1, help="the rank that fails")
    p.add_argument("--how", choices=["raise", "exit"], default="raise",
                   help="raise a ValueError, or exit with code 3 (no traceback)")
    return parser


class OptionError(ValueError):
    """A worker's option that its parser refuses (argparse's message, with the fix)."""


def _strict(parser: argparse.ArgumentParser, worker: str) -> argparse.ArgumentParser:
    """``parser`` (and its subparsers) raising :class:`OptionError` instead of exiting."""
    def error(message: str):
        raise OptionError(f"{worker}: {message}; see its options with `python -m rlm_course "
                          f"distributed {worker} -- --help`.")

    parser.error = error
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _strict(sub, worker)
    return parser


def check_worker_options(worker: str, options: list[str], world_size: int,
                         common: list[str] | None = None) -> list[str]:
    """Check ``worker``'s ``options`` for ``world_size`` ranks before anything starts: they
    parse, and what they ask for can run (the strategies' sizes, the data-parallel GRPO
    configuration and run folder). ``--help`` among the options prints the worker's help and exits.

    Returns:
        Notes to print (one line per strategy left out).

    Raises:
        ValueError: one line naming the option and the fix.
    """
    if worker not in WORKERS:
        raise ValueError(f"unknown worker {worker!r}; choose one of {', '.join(WORKERS)}.")
    # the launcher's options every worker shares, checked whatever the worker
    shared = _strict(build_parser(), worker).parse_args([*(common or []), "hello"])
    if shared.threads < 1:
        raise ValueError(f"--threads {shared.threads}: give 1 or more threads per rank.")
    if not 0 < shared.timeout < float("inf"):  # NaN fails too
        raise ValueError(f"--timeout {shared.timeout:g}: give a positive number of seconds (the "
                         "default is 300).")
    if worker == "grpo":
        from pathlib import Path

        from rlm_course.arguments import rl_config_from_args, rl_run_parser, task_from_args
        from rlm_course.distributed.grpo import check_data_parallel
        from rlm_course.rl.runs import check_run_folder, run_folder

        args = _strict(rl_run_parser("python -m rlm_course distributed grpo --"), "grpo"
                       ).parse_args(options)
        task, config = task_from_args(args), rl_config_from_args(args)
        check_data_parallel(config, world_size)
        run_dir = run_folder(args.out, args.name if args.name is not None else
                             f"{config.algorithm}-{task.key}-seed{config.seed}-dp{world_size}")
        check_run_folder(Path(run_dir), args.resume, args.overwrite, args.sft_checkpoint)
        from rlm_course.utils import ensure_writable_folder

        ensure_writable_folder(Path(run_dir).parent, "--out")  # before the ranks start
        return []
    args = _strict(build_parser(), worker).parse_args([*(common or []), worker, *options])
    if worker == "strategies":
        from rlm_course.distributed.strategies.setup import select

        return list(select(world_size, args.strategies, args.time)[2].values())
    if worker == "faulty" and not 0 <= args.rank < world_size:
        raise ValueError(f"faulty: --rank {args.rank}: give a rank in 0..{world_size - 1}.")
    if worker == "collectives":
        if args.repeats < 1:
            raise ValueError(f"collectives: --repeats {args.repeats}: give 1 or more.")
        if args.max_bytes < 4:
            raise ValueError(f"collectives: --max-bytes {args.max_bytes}: give 4 or more bytes.")
    return []


def _print_rank0(ctx, text: str) -> None:
    if ctx.is_main:
        print(text, flush=True)


def _hello(ctx, _args) -> dict:
    import torch.distributed as dist

    from rlm_course.distributed.demo import hello

    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, hello(ctx))
    for r in everyone:
        _print_rank0(ctx, f"rank {r['rank']} of {r['world_size']}: pid {r['pid']}, backend "
                          f"{r['backend']}, {r['threads']} thread(s), all-reduce sum {r['sum']:g}")
    return {"ranks": everyone}


def _strategies(ctx, args) -> dict:
    import torch.distributed as dist

    from rlm_course.distributed import strategies as s
    from rlm_course.utils import format_table

    p = ctx.world_size
    setup, names, skipped = s.select(p, args.strategies, args.time)
    for line in skipped.values():  # what a run on p ranks leaves out, and why
        if ctx.is_main:
            print(line, file=sys.stderr, flush=True)
    worker = s.timing_worker if args.time else s.equivalence_worker
    mine = worker(ctx, names, setup)
    everyone = [None] * p
    dist.all_gather_object(everyone, mine)
    if not ctx.is_main:
        return {}
    if args.time:
        rows = s.summarize_timing(everyone)
        print(format_table([[r["label"], f"{r['seconds'] * 1e3:.1f}",
                             f"{r['comm_seconds'] * 1e3:.1f}", f"{r['comm_share']:.0%}",
                             f"{r['vs_one_process']:.2f}"] for r in rows],
                           ["strategy", "step ms", "comm ms", "comm share",
                            "step / one process's"]))
        print("comm ms and comm share: a profiled step's communication and its share of that "
              "step (the profiler slows a step, so the share is not comm ms / step ms); step / one "
              "process's: the step's time over one process's on the whole batch (above 1: "
              "slower).")
        return {"timing": rows, "skipped": skipped}
    rows = s.check_equivalence(everyone, setup)
    print(s.format_equivalence(rows))
    return {"equivalence": [{k: v for k, v in r.items() if k != "tolerance"} for r in rows],
            "skipped": skipped}


def _faulty(ctx, args) -> dict:
    from rlm_course.distributed.demo import faulty

    return {"all_reduces": faulty(ctx, args.rank, args.how, steps=100)}


def _collectives(ctx, args) -> dict:
    from rlm_course.distributed.collectives import (
        SIZES,
        collectives_worker,
        fit_all,
        format_rows,
        rows_with_model,
    )

    sizes = tuple(s for s in SIZES if s <= args.max_bytes)
    table = collectives_worker(ctx, sizes=sizes, repeats=args.repeats, progress=True)
    if not ctx.is_main:
        return {}
    fits = fit_all({ctx.world_size: table})
    rows = rows_with_model({ctx.world_size: table}, fits)
    print(format_rows(rows, fits, ctx.world_size, args.repeats))
    return {"fits": {n: None if f is None else {"alpha": f.alpha, "beta": f.beta}
                     for n, f in fits[ctx.world_size].items()}}


def _grpo_device(launcher: str, rest: list[str]) -> str:
    """The device of a ``grpo`` worker: the launcher's ``--device``, or (when that is ``auto``) the
    worker's own ``--device`` (the one ``python -m rlm_course grpo`` takes).

    Raises:
        ValueError: when both are given and differ.
    """
    from rlm_course.arguments import rl_run_parser

    own = rl_run_parser().parse_args(rest).device
    if launcher == "auto":
        return own
    if own not in ("auto", launcher):
        raise ValueError(f"grpo: --device {launcher} for the launcher but --device {own} for the "
                         "worker; give one of them.")
    return launcher


def _grpo(ctx, rest: list[str]) -> dict:
    import torch.distributed as dist

    from rlm_course.arguments import rl_config_from_args, rl_run_parser, task_from_args
    from rlm_course.distributed.grpo import grpo_job_worker, prepare_run

    args = rl_run_parser("torchrun ... -m rlm_course.distributed grpo").parse_args(rest)
    task, config = task_from_args(args), rl_config_from_args(args)
    prepared = [None]
    if ctx.is_main:
        try:
            prepared[0] = prepare_run(task, config, ctx.world_size, args.name, args.out,
                                      args.overwrite, args.sft_checkpoint,
                                      not args.no_progress, resume=args.resume)
        except ValueError as err:
            prepared[0] = f"error: {err}"
    dist.broadcast_object_list(prepared, src=0)
    if isinstance(prepared[0], str):
        raise ValueError(prepared[0][len("error: "):])
    run_dir, sft_path = prepared[0]
    summary = grpo_job_worker(ctx, task, config, run_dir, sft_path,
                              progress=not args.no_progress, resume=args.resume)
    if ctx.is_main and summary.get("interrupted"):
        print(f"Stopped at step {summary['step']}; checkpoint and metrics are in {run_dir}. "
              "Continue by running the same command with --resume (and without --overwrite).",
              file=sys.stderr)
    elif ctx.is_main:
        print(f"Held-out greedy accuracy {summary['accuracy_before']:.1%} -> "
              f"{summary['accuracy_after']:.1%} on {ctx.world_size} ranks; run files: {run_dir}/")
    return summary or {}


def _report_failure(err: BaseException, rank: str, world: str) -> None:
    """One line on stderr for a failed rank; its traceback in a log file (and on stderr with
    ``RLM_COURSE_DEBUG=1``)."""
    import os
    import tempfile
    import traceback
    from pathlib import Path

    from rlm_course.distributed.launch import debug_enabled

    text = traceback.format_exc()
    folder = os.environ.get("RLM_COURSE_LOG_DIR") or tempfile.gettempdir()
    where = ""
    try:
        path = Path(folder) / f"rlm_course-rank{rank}-{os.getpid()}.log"
        path.write_text(text)
        where = f" (traceback: {path})"
    except OSError:
        pass
    from rlm_course.distributed.launch import first_line

    message = first_line(str(err))
    print(f"rank {rank} of {world}: {type(err).__name__}: {message}{where}", file=sys.stderr,
          flush=True)
    if debug_enabled():
        print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run one worker on this rank (under torchrun); rank 0 prints the results.

    Returns:
        0; 2 for options the worker refuses (rank 0 says why, in one line); 1 if the worker
        failed (one line per rank, see the module docstring); 130 if interrupted.
    """
    import os

    from rlm_course.distributed.launch import init_from_env, prepare_rank_process

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.worker != "grpo" and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    rank, world = os.environ.get("RANK", "?"), os.environ.get("WORLD_SIZE", "?")
    prepare_rank_process()
    device = args.device
    try:  # bad input: one line from rank 0, before any rank joins the group
        size = int(world) if world.isdigit() else 1
        if args.worker == "grpo":
            check_worker_options("grpo", rest, size)
            device = _grpo_device(args.device, rest)
        elif args.worker == "strategies":
            from rlm_course.distributed.strategies.setup import select

            select(size, args.strategies, args.time)
    except ValueError as err:
        if rank in ("0", "?"):
            print(f"error: {err}", file=sys.stderr, flush=True)
        return 2

    import torch.distributed as dist

    try:
        ctx = init_from_env(device, args.threads, args.timeout)
        try:
            if args.worker == "grpo":
                result = _grpo(ctx, rest)
            else:
                result = {"hello": _hello, "strategies": _strategies, "faulty": _faulty,
                          "collectives": _collectives}[args.worker](ctx, args)
            if ctx.is_main:
                print(json.dumps(result, default=str))
        finally:
            dist.destroy_process_group()
    except KeyboardInterrupt:
        print(f"rank {rank} of {world}: interrupted", file=sys.stderr, flush=True)
        return 130
    except Exception as err:  # one line per rank; the traceback in a file
        _report_failure(err, rank, world)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
