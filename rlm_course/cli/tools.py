"""The tools of the command line: ``bench``, ``gpu-check``, ``distributed`` (a worker under
torchrun), ``grade``, ``exercises``, ``hardware`` and ``make-eval-sets``."""

from __future__ import annotations

import argparse

from rlm_course.tasks import TASKS, get_task


def _bench(args) -> int:
    from rlm_course.tools import bench

    return bench.main(args.what, repeats=args.repeats, device=args.device, bf16=args.bf16)


def _gpu_check(args) -> int:
    from rlm_course.tools.gpu_check import main

    return main()


def _distributed(args) -> int:
    from rlm_course.distributed.torchrun import run_torchrun

    return run_torchrun(args.worker, args.nproc, args.rest)


def _grade(args) -> int:
    from rlm_course.tools.grading import main as grade_main

    return grade_main(args.impl, args.chapter)


def _exercises(args) -> int:
    from rlm_course.tools.exercisegen import main as gen_main

    if args.check and args.force:
        raise ValueError("--check and --force: --check only compares (it writes nothing) and "
                         "--force overwrites your exercise files; give one.")
    return gen_main(check=args.check, force=args.force)


def _hardware(args) -> int:
    from rlm_course.cost.hardware import load_catalog, measure_this_machine
    from rlm_course.utils import format_table

    if args.measure:
        import os

        from rlm_course.utils import cores

        try:  # before measuring: the measurement's own threads raise it
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = 0.0
        device = measure_this_machine()
        print(f"measured this machine: {device.peak_flops / 1e9:.1f} GFLOP/s fp32 matmul peak, "
              f"{device.memory_bandwidth / 1e9:.1f} GB/s copy bandwidth "
              "(written to data/hardware/this-machine.json)")
        if load >= 0.5:
            print(f"Note: the machine was busy when measured (load average {load:.1f} on {cores()} "
                  "cores): other jobs took part of its cores and memory bandwidth, so these "
                  "figures are low; measure again when it is idle.")
    catalog = load_catalog()
    rows = [[d.name, f"{d.peak_flops / 1e12:,.2f}", f"{d.memory_bytes / 1e9:,.0f}",
             f"{d.memory_bandwidth / 1e12:.3f}", f"{d.ridge_point:,.0f}",
             f"{d.intra_node_bandwidth / 1e9:,.0f}"
             + (f" ({d.intra_node_bandwidth / d.intra_node_links / 1e9:,.0f} a pair)***"
                if d.intra_node_links else ""),
             f"{d.inter_node_bandwidth / 1e9:,.0f}"]
            for d in catalog.values()]
    print(format_table(rows, ["device", "dense peak TFLOP/s*", "memory GB", "bandwidth TB/s",
                              "ridge FLOP/B", "intra-node GB/s**", "inter-node GB/s**"]))
    print("* bf16 for accelerators, fp32 for this machine; ** per direction (half a datasheet's "
          "bidirectional NVLink figure); sources in data/hardware/")
    if any(d.intra_node_links for d in catalog.values()):
        print("*** a full mesh, one link to each other device of the node, no switch: a group of "
              "g devices reaches (g - 1) links' worth, a pair one link")
    if "this-machine" in catalog:  # whose machine the row is: the course's until measured here
        print(f"this-machine: {catalog['this-machine'].source}")
    return 0


def _make_eval_sets(args) -> int:
    from rlm_course.tasks.eval_sets import write_eval_set

    for name in sorted(TASKS):
        print(f"wrote {write_eval_set(get_task(name))}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The tool commands, on the main parser's subcommands."""
    p = sub.add_parser("bench", help="benchmarks: sampling (KV cache), train (MFU), family "
                                     "(seconds per step and memory of every preset), parallel (simulated "
                                     "strategies), memory (memory per step of every preset), systems (async RL "
                                     "throughput and weight sync on Ray workers), simulator (simulated "
                                     "GPU-iterations per second at 64, 1,024 and 10,000 GPUs), "
                                     "compile (torch.compile against eager, compile time "
                                     "counted), peer (beside HF generate and TRL's GRPOTrainer "
                                     "at 1 and 2 threads; pip install -e \".[peer]\"), "
                                     "collectives (collectives on 2 and 4 real processes and "
                                     "their alpha-beta fit), realrun (chapter 14's simulator "
                                     "against this machine's own GRPO and PPO iterations)")
    p.add_argument("what", choices=["sampling", "train", "family", "parallel", "memory", "peer",
                                    "collectives", "systems", "simulator", "realrun", "compile"])
    p.add_argument("--repeats", type=int, default=5,
                   help="timed repeats of each measurement, the median reported (default 5)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None,
                   help="sampling and train: where they run (default auto: CUDA when torch sees "
                        "a GPU); on a catalog GPU they add MFU and the decode roofline")
    p.add_argument("--bf16", action="store_true",
                   help="train: the forward under bf16 autocast (fp32 master weights)")
    p.set_defaults(func=_bench)

    p = sub.add_parser("gpu-check", help="check the course on this machine's GPU against the CPU "
                                         "(forward/backward, a GRPO step, the demo learns, the "
                                         "strategies on NCCL, timings vs the roofline); JSON last "
                                         "line")
    p.set_defaults(func=_gpu_check)

    from rlm_course.distributed.__main__ import WORKERS  # names only: nothing heavy

    p = sub.add_parser("distributed", help="run a worker of rlm_course.distributed under torchrun "
                                           f"on this machine ({', '.join(WORKERS)})")
    p.add_argument("worker", help=f"{', '.join(WORKERS[:-1])} or {WORKERS[-1]}")
    p.add_argument("--nproc", type=int, default=2, help="processes (torchrun --nproc-per-node)")
    p.add_argument("rest", nargs=argparse.REMAINDER,
                   help="launcher options (--port --device --threads --timeout --debug), then "
                        "-- and the options of the worker")
    p.set_defaults(func=_distributed)

    p = sub.add_parser("grade", help="autograde the exercises (yours, or the worked solutions)")
    p.add_argument("chapter", nargs="?", default=None, help="e.g. 02 (default: all)")
    p.add_argument("--impl", choices=["exercises", "solutions"], default="exercises")
    p.set_defaults(func=_grade)

    p = sub.add_parser("exercises", help="regenerate exercises/ and solutions/ from the package")
    p.add_argument("--check", action="store_true", help="fail if the committed files are stale")
    p.add_argument("--force", action="store_true",
                   help="also overwrite exercise files that differ from their stub (your work: "
                        "each is saved first as <name>.bak)")
    p.set_defaults(func=_exercises)

    p = sub.add_parser("hardware", help="the hardware catalog (data/hardware/); --measure adds "
                                        "this machine")
    p.add_argument("--measure", action="store_true",
                   help="time this machine's matmul peak and memory bandwidth and store them")
    p.set_defaults(func=_hardware)

    p = sub.add_parser("make-eval-sets", help="rewrite data/eval/*.jsonl (fixed seeds)")
    p.set_defaults(func=_make_eval_sets)
