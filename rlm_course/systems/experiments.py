"""The measured experiments of chapters 12-13, as command-line jobs whose results the notebooks
plot: ``python -m rlm_course systems <experiment> --store`` writes
``data/experiments/systems-<experiment>.json``, with the command that made it (without
``--store``, ``runs/systems/systems-<experiment>.json``, so that a trial never replaces the
stored result).

* ``weight-sync``: the link's alpha and beta between two workers, then a bucketed broadcast of
  models of three sizes at six bucket sizes (and one message per tensor), measured against
  :func:`~rlm_course.systems.weight_sync.predict_sync_seconds`; the colocated hand-over of the
  same models (:func:`weight_sync_experiment`).
* ``reshard``: four workers move the course model from TP 4 to TP 2 x DP 2, naive and
  HybridFlow, with bytes, memory, seconds and the identity check; the same predicted for the
  course model and for 70B from TP 8 to TP 2 (:func:`reshard_experiment`).
* ``async``: GRPO on the long-tailed scratchpad task, colocated synchronous on two devices, and
  disaggregated (one trainer, one rollout worker) at ``eta`` = 0, 1, 2, 4 and with partial
  rollouts, the same seed for all: throughput, held-out accuracy against wall time, staleness,
  response lengths and the timelines (:func:`async_experiment`).
* ``fusion``: experience preparation unfused against fused on two colocated workers
  (:func:`rlm_course.systems.pipelines.fusion_experiment`).
* ``mismatch``: the rollout/trainer mismatch of rounded engines, measured, and GRPO with fp8
  rollouts without a correction, with TIS and with MIS, two seeds each (one process per run, no
  Ray: :func:`rlm_course.systems.mismatch.mismatch_experiment`).

Timings on a shared machine move with its load; every comparison is made inside one run, side by
side, and the stored file says how many cores and threads it had.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict
from pathlib import Path

EXPERIMENTS = ("weight-sync", "reshard", "async", "fusion", "mismatch")


def experiment_path(name: str) -> Path:
    from rlm_course.utils import data_dir

    return data_dir() / "experiments" / f"systems-{name}.json"


def load_experiment(name: str) -> dict:
    """The stored results of experiment ``name`` (see the module docstring).

    Raises:
        ValueError: for an unknown name, or a missing or unreadable file (the message gives the
            command that makes it).
    """
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose one of {EXPERIMENTS}.")
    path = experiment_path(name)
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is missing or unreadable ({err}); make it with `python -m "
                         f"rlm_course systems {name}`.") from None


def _machine() -> dict:
    import torch

    from rlm_course.utils import cores

    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    return {"cores": cores(), "load_average_at_start": None if load is None else round(load, 2),
            "torch": torch.__version__}


# ---------------------------------------------------------------------------------- weight sync
BUCKETS = (None, 2**16, 2**18, 2**20, 2**22, 2**24)


def weight_sync_experiment(controller, widths=(128, 256, 512), buckets=BUCKETS, repeats: int = 5,
                           progress: bool = False) -> dict:
    """See the module docstring. ``controller``: two workers, ``actor`` and ``rollout``
    disaggregated (a ``sync`` group). Returns the link and one row per (model, bucket)."""
    from tqdm.auto import tqdm

    from rlm_course.cost.hardware import copy_bandwidth
    from rlm_course.lm.tokenizer import CharTokenizer
    from rlm_course.systems.pipelines import measure_link
    from rlm_course.systems.weight_sync import predict_sync_seconds
    from rlm_course.systems.workers import RLWorker

    actor, rollout = controller.role_workers("actor")[0], controller.role_workers("rollout")[0]
    link, medians = measure_link(controller, [actor, rollout], repeats=repeats)
    memory = copy_bandwidth(64)  # the copies term: packing and unpacking the buckets
    rows, handovers = [], []
    cases = [(w, b) for w in widths for b in buckets]
    bar = tqdm(total=len(cases), desc="weight sync", disable=not progress)
    for width in widths:
        config = dict(vocab_size=CharTokenizer().vocab_size, n_layer=4, n_head=4, d_model=width,
                      max_seq_len=96)
        controller.call([actor, rollout], RLWorker.make_model, config,
                        per_worker=[{"seed": 0}, {"seed": 1}])
        for bucket in buckets:
            controller.call([actor], RLWorker.perturb_model, len(rows) + 1)
            out = controller.call([actor, rollout], RLWorker.timed_sync, bucket, "sync", actor.rank,
                                  repeats)
            seconds = statistics.median(max(t) for t in zip(*(o["seconds"] for o in out)))
            sizes = out[0]["bucket_bytes"]
            states = controller.call([actor, rollout], RLWorker.model_state)
            identical = all(states[0][k].equal(states[1][k]) for k in states[0])
            wire = predict_sync_seconds(sum(sizes), len(sizes), link)
            predicted = predict_sync_seconds(sum(sizes), len(sizes), link, memory_bandwidth=memory)
            rows.append({"d_model": width, "bytes": sum(sizes), "bucket_bytes": bucket,
                         "messages": len(sizes), "seconds": seconds, "predicted": predicted,
                         "predicted_wire": wire, "ratio": seconds / predicted,
                         "ratio_wire": seconds / wire, "identical": identical})
            bar.update(1)
        hand = controller.call([actor], RLWorker.timed_handover, repeats)[0]
        handovers.append({"d_model": width, "bytes": hand["bytes"],
                          "seconds": statistics.median(hand["seconds"]),
                          "identical": hand["identical"]})
    bar.close()
    return {"link": {"alpha": link.alpha, "beta": link.beta}, "memory_bandwidth": memory,
            "link_medians": {str(k): v for k, v in medians.items()}, "rows": rows,
            "handover": handovers}


# ---------------------------------------------------------------------------------- resharding
def reshard_experiment(controller, tp: int = 4, tp_gen: int = 2, repeats: int = 3,
                       seed: int = 0) -> dict:
    """See the module docstring. ``controller``: ``tp`` workers of one role, with HybridFlow's
    micro data-parallel groups named ``micro/<k>`` (:func:`reshard_controller_groups`)."""
    import torch

    from rlm_course.cost.architectures import SPECS
    from rlm_course.cost.hardware import get_device
    from rlm_course.lm.model import TinyGPT
    from rlm_course.lm.tokenizer import CharTokenizer
    from rlm_course.cost.comm import Link
    from rlm_course.rl.sft import default_model_config
    from rlm_course.cost.weight_sync import predict_transition
    from rlm_course.systems.resharding import split_bytes
    from rlm_course.systems.workers import RLWorker

    torch.manual_seed(seed)
    full = TinyGPT(default_model_config(CharTokenizer())).state_dict()
    d = tp // tp_gen
    measured = {}
    for scheme in ("naive", "hybridflow"):
        per = [{"group": "world" if scheme == "naive" else f"micro/{r // d}"}
               for r in range(tp)]
        runs = [controller.call(controller.workers, RLWorker.reshard, full, tp, tp_gen, scheme,
                                per_worker=per, what=f"resharding ({scheme})")
                for _ in range(repeats)]
        last = runs[-1]
        measured[scheme] = {
            "received_bytes": [r["received_bytes"] for r in last],
            "peak_bytes": [r["peak_bytes"] for r in last],
            "redundant_bytes": [r["redundant_bytes"] for r in last],
            "generation_bytes": [r["generation_bytes"] for r in last],
            "seconds": statistics.median(max(r["seconds"] for r in run) for run in runs),
            "identical": all(r["identical"] for run in runs for r in run)}
    m = split_bytes(full)
    replicated = sum(v.numel() * v.element_size() for v in full.values()) - m
    h100 = get_device("H100-SXM-80GB")
    nvlink = Link(alpha=h100.intra_node_latency, beta=h100.intra_node_bandwidth)
    big = SPECS["llama-3-70b"]
    return {"tp": tp, "tp_gen": tp_gen, "split_bytes": m, "replicated_bytes": replicated,
            "measured": measured, "predicted": predict_transition(m, tp, tp_gen),
            "at_scale": {"model": "llama-3-70b", "params": big.params(), "tp": 8, "tp_gen": 2,
                         "device": h100.name,
                         **predict_transition(2 * big.params(), 8, 2, link=nvlink)}}


def reshard_controller_groups(tp: int, tp_gen: int) -> dict[str, list[int]]:
    """The extra process groups a resharding run needs: HybridFlow's micro data-parallel groups,
    named ``micro/<k>``."""
    from rlm_course.systems.resharding import micro_dp_groups

    return {f"micro/{k}": g for k, g in enumerate(micro_dp_groups(tp, tp_gen))}


# ---------------------------------------------------------------------------------- async RL
#: The runs of the async experiment: (name, placement, eta, partial rollouts).
ASYNC_RUNS = (("colocated sync (2 devices)", "colocated", 0, False),
              ("disaggregated sync (eta=0)", "disaggregated", 0, False),
              ("one-step off (eta=1)", "disaggregated", 1, False),
              ("eta=2", "disaggregated", 2, False),
              ("eta=4", "disaggregated", 4, False),
              ("eta=2 + partial rollouts", "disaggregated", 2, True))


def async_config(steps: int = 60, seed: int = 0, **overrides):
    """The GRPO configuration of chapter 13's runs on the scratchpad task: 16 prompts x 8
    samples per step, lr 1e-4, no in-run evaluation (snapshots are evaluated after the run); the
    decoupled loss with truncated behaviour weights (TIS, cap 2), as the stored runs used."""
    from rlm_course.algorithms import preset

    settings = dict(prompts_per_step=16, group_size=8, lr=1e-4, steps=steps, seed=seed,
                    eval_every=10**9, warmup_steps=10, correction="tis", correction_cap=2.0)
    settings.update(overrides)
    return preset("grpo", **settings)


def async_experiment(steps: int = 60, seed: int = 0, runs=ASYNC_RUNS, eval_every: int = 10,
                     run_dir: str | Path = "runs/systems/systems-async",
                     progress: bool = False) -> dict:
    """See the module docstring: every run of ``runs`` from the same SFT checkpoint and seed.
    Returns ``{"runs": {name: PipelineResult as a dict}, "config", "task"}``."""
    from rlm_course.rl.runs import default_sft_checkpoint
    from rlm_course.systems.async_rl import PipelineConfig
    from rlm_course.systems.controller import Controller, DeviceMapping
    from rlm_course.systems.pipelines import run_pipeline
    from rlm_course.tasks import get_task

    task = get_task("scratchpad")
    config = async_config(steps, seed)
    checkpoint = default_sft_checkpoint(task)
    mappings = {"colocated": DeviceMapping(actor=[0, 1], rollout=[0, 1]),
                "disaggregated": DeviceMapping(actor=[0], rollout=[1])}
    out = {"task": task.key, "config": asdict(config), "runs": {}}
    for placement in ("colocated", "disaggregated"):
        chosen = [r for r in runs if r[1] == placement]
        if not chosen:
            continue
        with Controller(mappings[placement]) as controller:
            for name, _, eta, partial in chosen:
                pipe = PipelineConfig(eta=eta, partial_rollout=partial, eval_every=eval_every,
                                      checkpoint_every=max(steps, 1))
                result = run_pipeline(controller, task, config, pipe, checkpoint,
                                      run_dir=Path(run_dir) / name.replace(" ", "_"),
                                      progress=progress)
                out["runs"][name] = result.to_dict()
    return out


# ---------------------------------------------------------------------------------- the CLI
#: The flags each experiment takes (``python -m rlm_course systems <name> --<flag>``), with what
#: they mean there; any other flag is refused rather than ignored.
FLAGS = {
    "weight-sync": {"repeats": "timing repeats (5)"},
    "reshard": {"repeats": "timing repeats (3)"},
    "async": {"steps": "RL steps per run (60)", "seed": "the RL seed (0)"},
    "fusion": {"repeats": "iterations (5)", "seed": "the RL seed (0)"},
    "mismatch": {"steps": "RL steps per run (60)", "seed": "the first of its two seeds (0)"},
}


def check_flags(name: str, steps: int | None = None, repeats: int | None = None,
                seed: int | None = None) -> None:
    """Refuse what experiment ``name`` cannot use, before any work.

    Raises:
        ValueError: for an unknown experiment, a flag the experiment does not take (naming the
            ones it does), ``steps``/``repeats`` below 1, or a seed outside [0, 2**63 - 1).
    """
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose one of {EXPERIMENTS}.")
    given = {"steps": steps, "repeats": repeats, "seed": seed}
    takes = FLAGS[name]
    for flag, value in given.items():
        if value is None:
            continue
        if flag not in takes:
            options = "; ".join(f"--{k}: {v}" for k, v in takes.items())
            raise ValueError(f"--{flag}: the {name} experiment does not take it (it takes "
                             f"{options}).")
        if flag != "seed" and value < 1:
            raise ValueError(f"--{flag} {value}: give 1 or more.")
        if flag == "seed" and not 0 <= value < 2**63 - 1:
            raise ValueError(f"--seed {value}: seeds are integers in [0, 2**63 - 1).")


#: The experiments whose training runs keep a folder each (under ``<runs dir>/systems-<name>/``).
RUN_FOLDERS = ("async", "mismatch")


def run_and_store(name: str, steps: int | None = None, repeats: int | None = None,
                  seed: int | None = None, progress: bool = True, store: bool = False,
                  runs_dir: str | Path = "runs/systems", overwrite: bool = False) -> int:
    """Run experiment ``name`` and write its results (``python -m rlm_course systems <name>``;
    see the module docstring): to ``runs_dir/systems-<name>.json``, or, with ``store``, to the
    stored file the notebooks read (:func:`experiment_path`). The run folders of the async and
    mismatch experiments (metrics and checkpoint of each run, :data:`RUN_FOLDERS`) go to
    ``runs_dir/systems-<name>/<run>/`` either way.
    ``steps``, ``repeats``, ``seed``: see :data:`FLAGS` (None: the experiment's default). A
    results file or run folders of an earlier run are replaced only with ``overwrite`` (the
    stored file ``store`` replaces is replaced always: that is what it is for).

    Raises:
        ValueError: see :func:`check_flags`; an unwritable ``runs_dir``; an earlier run's
            results without ``overwrite``.
    """
    from rlm_course.systems.controller import Controller, DeviceMapping, start_ray, stop_ray
    from rlm_course.utils import ensure_writable_folder, result_path

    check_flags(name, steps, repeats, seed)
    out = result_path(experiment_path(name), store, runs_dir)
    runs = Path(runs_dir) / f"systems-{name}"
    earlier = ([str(out)] if not store and out.exists() else []) + (
        [f"{runs}/"] if name in RUN_FOLDERS and runs.is_dir() and any(runs.iterdir()) else [])
    if earlier and not overwrite:
        raise ValueError(f"{' and '.join(earlier)} hold{'s' if len(earlier) == 1 else ''} an "
                         f"earlier run of systems {name}; pass --overwrite to replace "
                         f"{'it' if len(earlier) == 1 else 'them'}, or another --runs-dir.")
    ensure_writable_folder(out.parent, "--runs-dir" if not store else "data folder")
    if name in RUN_FOLDERS and store:
        ensure_writable_folder(runs_dir, "--runs-dir")
    given = {"steps": steps, "repeats": repeats, "seed": seed}
    command = "python -m rlm_course systems " + name + "".join(
        f" --{k} {v}" for k, v in sorted(given.items()) if v is not None)
    command += " --store" if store else ""
    started = time.time()
    machine = _machine()
    if name == "mismatch":
        from rlm_course.systems.mismatch import mismatch_experiment

        first = seed or 0
        result = mismatch_experiment(steps=steps or 60, seeds=(first, first + 1),
                                     progress=progress,
                                     runs_dir=Path(runs_dir) / "systems-mismatch")
        return _store(out, result, command, machine, started, store)
    start_ray()
    try:
        if name == "weight-sync":
            with Controller(DeviceMapping(actor=[0], rollout=[1])) as c:
                result = weight_sync_experiment(c, repeats=repeats or 5, progress=progress)
        elif name == "reshard":
            with Controller(DeviceMapping(actor=[0, 1, 2, 3]),
                            groups=reshard_controller_groups(4, 2)) as c:
                result = reshard_experiment(c, repeats=repeats or 3)
        elif name == "async":
            result = async_experiment(steps=steps or 60, seed=seed or 0, progress=progress,
                                      run_dir=Path(runs_dir) / "systems-async")
        else:
            from rlm_course.rl.runs import default_sft_checkpoint
            from rlm_course.systems.pipelines import fusion_experiment
            from rlm_course.tasks import get_task

            task = get_task("scratchpad")
            with Controller(DeviceMapping(actor=[0, 1], rollout=[0, 1])) as c:
                result = fusion_experiment(c, task, async_config(seed=seed or 0),
                                           default_sft_checkpoint(task), steps=repeats or 5,
                                           progress=progress)
                result["events"] = [e.to_dict() for e in result["events"]]
                result["windows"] = [list(w) for w in result["windows"]]
    finally:
        stop_ray()
    return _store(out, result, command, machine, started, store)


def summarize(name: str, result: dict) -> str:
    """What a learner reads of experiment ``name``'s ``result`` (the dict ``systems <name>``
    writes): a short table of its measured figures, beside their predictions where it has them."""
    from statistics import median

    from rlm_course.utils import format_table

    if name == "weight-sync":
        link = result["link"]
        rows = [[r["d_model"], f"{r['bytes'] / 1e6:,.2f}",
                 "whole" if r["bucket_bytes"] is None else f"{r['bucket_bytes'] / 2**20:g} MiB",
                 r["messages"], f"{r['seconds'] * 1e3:,.2f}", f"{r['predicted'] * 1e3:,.2f}",
                 f"{r['ratio']:.2f}", "yes" if r["identical"] else "NO"]
                for r in result["rows"]]
        return (f"link fitted on the workers: alpha {link['alpha'] * 1e6:,.0f} us, beta "
                f"{link['beta'] / 1e9:,.2f} GB/s\n" + format_table(
                    rows, ["d_model", "MB", "bucket", "messages", "ms", "predicted ms",
                           "measured / predicted", "same weights"]))
    if name == "reshard":
        measured, predicted = result["measured"], result["predicted"]
        rows = [[way, f"{max(measured[way]['received_bytes']) / 1e6:,.2f}",
                 f"{predicted[way]['received_bytes'] / 1e6:,.2f}",
                 f"{max(measured[way]['peak_bytes']) / 1e6:,.2f}",
                 f"{predicted[way]['peak_bytes'] / 1e6:,.2f}"] for way in ("naive", "hybridflow")]
        return (f"tp {result['tp']} -> generation tp {result['tp_gen']}, bytes per rank\n"
                + format_table(rows, ["reshard", "received MB", "predicted", "peak MB",
                                      "predicted"]))
    if name == "async":
        runs = result["runs"]
        base = next((r["tokens_per_second"] for n, r in runs.items() if "eta=0" in n), None)
        rows = [[n, f"{r['seconds']:,.1f}", f"{r['tokens_per_second']:,.0f}",
                 f"{r['tokens_per_second'] / base:.2f}x" if base else "-", r["max_staleness"]]
                for n, r in runs.items()]
        return format_table(rows, ["run", "seconds", "trained tokens/s",
                                   "vs disaggregated sync", "max staleness"])
    if name == "fusion":
        return (f"unfused {median(result['unfused_seconds']):.2f} s, fused "
                f"{median(result['fused_seconds']):.2f} s a step (medians of "
                f"{len(result['fused_seconds'])}): stage fusion {result['gain']:.2f}x; the "
                f"early responses the same: {'yes' if result['same_early_rows'] else 'NO'}")
    if name == "mismatch":
        kl = ", ".join(f"{p} {m['stats']['behaviour_kl']:.2g}"
                       for p, m in result["measured"].items())
        rows = [[r["precision"], r["correction"], r["seed"], f"{r['accuracy_before']:.1%}",
                 f"{r['accuracy_after']:.1%}"] for r in result["runs"]]
        return (f"behaviour KL per token of the engine's rollouts: {kl}\n"
                + format_table(rows, ["rollout", "correction", "seed", "accuracy before",
                                      "after"]))
    return ""


def _store(path: Path, result: dict, command: str, machine: dict, started: float,
           store: bool) -> int:
    from rlm_course.utils import atomic_write_json

    result.update(command=command, machine=machine, seconds=round(time.time() - started, 1))
    atomic_write_json(path, result)
    name = path.stem.removeprefix("systems-")
    try:
        print(summarize(name, result))
    except KeyError:  # a result without its usual figures: written, nothing to show
        pass
    print(f"wrote {path} ({result['seconds']:.0f} s)")
    if not store:
        print(f"(the notebooks read {experiment_path(path.stem.removeprefix('systems-'))}; add "
              "--store to replace it with this run)")
    return 0


# ---------------------------------------------------------------------------------- the bench
def bench(repeats: int = 5, steps: int = 6) -> dict:
    """``python -m rlm_course bench systems``: on two Ray workers (one trainer, one rollout),
    trained tokens per second of synchronous RL, one-step off-policy and ``eta = 2`` on the
    scratchpad task, ``repeats`` rounds of ``steps`` steps each, the three modes alternating
    inside each round; and one weight sync of the course model in 1 MiB buckets against the
    alpha-beta prediction from the link measured on the same workers. Targets: the asynchronous
    runs at least 1.3x the synchronous one; the sync within 2x of its prediction."""
    from rlm_course.cost.hardware import copy_bandwidth
    from rlm_course.rl.runs import default_sft_checkpoint
    from rlm_course.systems.async_rl import PipelineConfig
    from rlm_course.systems.controller import Controller, DeviceMapping, start_ray
    from rlm_course.systems.pipelines import measure_link, run_pipeline
    from rlm_course.systems.weight_sync import predict_sync_seconds
    from rlm_course.systems.workers import RLWorker
    from rlm_course.tasks import get_task
    from rlm_course.utils import format_table

    task = get_task("scratchpad")
    checkpoint = default_sft_checkpoint(task)
    config = async_config(steps=steps)
    modes = {"sync": 0, "one_step_off": 1, "eta_2": 2}
    from tqdm.auto import tqdm

    print(f"bench systems: starting Ray and two workers, then {repeats} rounds of {len(modes)} "
          f"runs of {steps} steps (a few minutes)", flush=True)
    start_ray()
    machine = _machine()
    throughput = {m: [] for m in modes}
    with Controller(DeviceMapping(actor=[0], rollout=[1])) as c:
        actor, rollout = c.role_workers("actor")[0], c.role_workers("rollout")[0]
        link, _ = measure_link(c, [actor, rollout], repeats=repeats)
        c.call([actor, rollout], RLWorker.rl_setup, _bench_spec(task, config, checkpoint))
        nbytes = c.call([actor, rollout], RLWorker.make_model, _course_model(task),
                        per_worker=[{"seed": 0}, {"seed": 1}])[0]
        out = c.call([actor, rollout], RLWorker.timed_sync, 2**20, "sync", actor.rank, repeats)
        sync_seconds = statistics.median(max(t) for t in zip(*(o["seconds"] for o in out)))
        sizes = out[0]["bucket_bytes"]
        predicted = predict_sync_seconds(sum(sizes), len(sizes), link,
                                         memory_bandwidth=copy_bandwidth(64))
        runs = tqdm(total=repeats * len(modes), desc="bench systems runs", unit="run")
        with runs:
            for _ in range(repeats):
                for mode, eta in modes.items():
                    runs.set_postfix_str(mode)
                    result = run_pipeline(c, task, config, PipelineConfig(eta=eta), checkpoint,
                                          evaluate=False)
                    throughput[mode].append(result.tokens_per_second)
                    runs.update()
    median = {m: statistics.median(v) for m, v in throughput.items()}
    rows = [[m, f"{median[m]:,.0f}", f"{median[m] / median['sync']:.2f}x",
             " ".join(f"{x:,.0f}" for x in throughput[m])] for m in modes]
    load = machine["load_average_at_start"]
    print(f"async RL on the scratchpad task, {steps} steps x {repeats} rounds, one trainer and one "
          f"rollout worker (1 thread each; {machine['cores']} cores"
          + (f", 1-minute load average {load:.1f} at the start)" if load is not None else ")"))
    print(format_table(rows, ["mode", "trained tokens/s (median)", "vs sync", "each round"]))
    print(f"weight sync of {nbytes / 1e6:.2f} MB in {len(sizes)} buckets of 1 MiB: "
          f"{sync_seconds * 1e3:.2f} ms measured, {predicted * 1e3:.2f} ms predicted "
          f"(alpha {link.alpha * 1e6:.1f} us, beta {link.beta / 1e9:.2f} GB/s, and the bucket "
          "copies at this machine's copy bandwidth): "
          f"{sync_seconds / predicted:.2f}x")
    speedups = {m: median[m] / median["sync"] for m in modes if m != "sync"}
    return {"tokens_per_second": median, "tokens_per_second_rounds": throughput,
            "speedup_one_step_off": speedups["one_step_off"], "speedup_eta_2": speedups["eta_2"],
            "async_at_least_1_3x": min(speedups.values()) >= 1.3,
            "sync_seconds": sync_seconds, "sync_predicted_seconds": predicted,
            "sync_over_predicted": sync_seconds / predicted,
            "sync_within_2x": 0.5 <= sync_seconds / predicted <= 2.0,
            "link": {"alpha": link.alpha, "beta": link.beta}, "sync_bytes": sum(sizes),
            "steps": steps, "rounds": repeats, "machine": machine}


def _course_model(task) -> dict:
    from rlm_course.lm.tokenizer import CharTokenizer
    from rlm_course.rl.sft import default_model_config

    return default_model_config(CharTokenizer(), task).to_dict()


def _bench_spec(task, config, checkpoint) -> dict:
    from rlm_course.systems.async_rl import PipelineConfig
    from rlm_course.systems.pipelines import worker_spec

    return worker_spec(task, config, checkpoint, PipelineConfig())
