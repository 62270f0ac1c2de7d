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

Each rank picks its backend from its device (``--device auto``: NCCL on a GPU machine, gloo
otherwise; ``grpo`` takes gloo, its RL loop runs on CPU tensors) and runs one intra-op thread
(``--threads``). Rank 0 prints; the last line is one JSON object with the results.
"""

from __future__ import annotations

import argparse
import json
import sys

WORKERS = ("hello", "strategies", "collectives", "grpo")


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
    return parser


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
    setup = s.learner_setup(p) if args.time else s.check_setup(p)
    names = args.strategies or s.fitting(setup, p)
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
                           ["strategy", "step ms", "comm ms", "comm share", "vs one process"]))
        return {"timing": rows}
    rows = s.check_equivalence(everyone, setup)
    print(s.format_equivalence(rows))
    return {"equivalence": [{k: v for k, v in r.items() if k != "tolerance"} for r in rows]}


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
                                      not args.no_progress)
        except ValueError as err:
            prepared[0] = f"error: {err}"
    dist.broadcast_object_list(prepared, src=0)
    if isinstance(prepared[0], str):
        raise ValueError(prepared[0][len("error: "):])
    run_dir, sft_path = prepared[0]
    summary = grpo_job_worker(ctx, task, config, run_dir, sft_path,
                              progress=not args.no_progress)
    if ctx.is_main:
        print(f"Held-out greedy accuracy {summary['accuracy_before']:.1%} -> "
              f"{summary['accuracy_after']:.1%} on {ctx.world_size} ranks; run files: {run_dir}/")
    return summary or {}


def main(argv: list[str] | None = None) -> int:
    """Run one worker on this rank (under torchrun); rank 0 prints the results."""
    from torch.distributed.elastic.multiprocessing.errors import record

    from rlm_course.distributed.launch import init_from_env

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.worker != "grpo" and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")

    @record
    def run() -> int:
        import torch.distributed as dist

        # the RL loop runs on CPU tensors: GRPO takes gloo unless told otherwise
        device = "cpu" if args.worker == "grpo" and args.device == "auto" else args.device
        ctx = init_from_env(device, args.threads, args.timeout)
        try:
            if args.worker == "grpo":
                result = _grpo(ctx, rest)
            else:
                result = {"hello": _hello, "strategies": _strategies,
                          "collectives": _collectives}[args.worker](ctx, args)
            if ctx.is_main:
                print(json.dumps(result, default=str))
        finally:
            dist.destroy_process_group()
        return 0

    return run()


if __name__ == "__main__":
    sys.exit(main())
