"""The systems and cluster commands: ``systems`` (chapters 12-13's experiments on Ray workers),
``plan`` and ``validate`` (chapter 14)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import textwrap

from rlm_course.algorithms import PRESETS
from rlm_course.arguments import path_arg


def _systems(args) -> int:
    from rlm_course.systems.experiments import run_and_store

    from rlm_course.systems.experiments import RUN_FOLDERS

    if args.store and args.runs_dir is not None and args.experiment not in RUN_FOLDERS:
        raise ValueError("--store and --runs-dir: give one (--store replaces the stored "
                         "data/experiments/ file the notebooks read; --runs-dir writes elsewhere; "
                         "only the async and mismatch experiments, whose run folders go to "
                         "--runs-dir, take both).")
    return run_and_store(args.experiment, steps=args.steps, repeats=args.repeats, seed=args.seed,
                         progress=not args.no_progress, store=args.store,
                         runs_dir=args.runs_dir or "runs/systems", overwrite=args.overwrite)


#: ``plan``'s response budget when ``--max-response`` is not given (tokens).
DEFAULT_MAX_RESPONSE = 16384


def _plan_flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _note_rates_device(chosen: str, device: str, declared: dict) -> None:
    """Say so when the rates were fitted for another device than the plan's (a family the
    figures file declares for a device, or one built on it), or when a family declared for the
    plan's device is built on the one chosen."""
    own, family, seen = None, chosen, set()
    while isinstance(declared.get(family), dict) and family not in seen and own is None:
        seen.add(family)
        own = declared[family].get("device")
        family = declared[family].get("base")
    if own is not None and own != device:
        print(f"note: --rates {chosen} was fitted on {own} runs (its MoE decode share among "
              f"them); planning on {device} with it as asked.", file=sys.stderr)
    if own is None:
        for name, entry in declared.items():
            if (isinstance(entry, dict) and entry.get("base") == chosen
                    and entry.get("device") == device):
                print(f"note: --rates {name} is fitted for {device} and built on {chosen}; "
                      f"planning with {chosen} as asked.", file=sys.stderr)


def _plan(args) -> int:
    from rlm_course.cluster.calibration import (calibrated_rates, device_family,
                                                fitting_family, load_calibration)
    from rlm_course.cluster.published import load_document
    from rlm_course.cluster.planner import (FEWER_MARGIN, MAX_STALENESS_PENALTY, check_group,
                                          check_settings, fewer_devices, format_plan,
                                          half_the_devices,
                                          linked_gpus, plan,
                                          runnable_modes)
    from rlm_course.cluster.simulator import MAX_OVERSAMPLE, algorithm
    from rlm_course.cost.anatomy import Workload
    from rlm_course.cost.architectures import SPECS, get_spec
    from rlm_course.cost.hardware import get_device, load_catalog
    from rlm_course.cost.phases import speculative_yield
    from rlm_course.utils import seconds_text, unknown_name

    try:
        spec = get_spec(args.model)  # in any case: Qwen2.5-7B is qwen2.5-7b
    except ValueError:
        raise ValueError(f"--model: {unknown_name('architecture', args.model, SPECS)}.") from None
    catalog = load_catalog()
    try:
        device = get_device(args.device)
    except ValueError:
        hint = ("; measure this machine first (python -m rlm_course hardware --measure)"
                if args.device == "this-machine" else "")
        raise ValueError(f"--device: {unknown_name('device', args.device, catalog)}{hint}.") \
            from None
    if args.max_response is None:  # 16,384, or what the model's window leaves after the prompt
        room = (DEFAULT_MAX_RESPONSE if spec.max_context is None
                else spec.max_context - args.prompt_len)
        args.max_response = min(DEFAULT_MAX_RESPONSE, room) if room > 0 else DEFAULT_MAX_RESPONSE
    check_settings({k: getattr(args, k) for k in ("gpus", "top", "prompts", "group_size",
                                                  "minibatches", "prompt_len", "mean_response",
                                                  "sigma", "max_response")}, _plan_flag,
                   spec.max_context)
    spec.check_context(args.prompt_len, args.max_response, _plan_flag)
    if args.oversample is not None and not 1 <= args.oversample <= MAX_OVERSAMPLE:  # NaN too
        raise ValueError(f"--oversample {args.oversample:g}: give a number from 1 to "
                         f"{MAX_OVERSAMPLE} (prompts generated per prompt trained: 3 for DAPO's "
                         "usual 3x generation batch; 1 keeps every group).")
    if args.length_buckets < 2:
        raise ValueError(f"--length-buckets {args.length_buckets}: give 2 or more levels (64 is "
                         "the default; fewer plan faster and coarser).")
    if not 0 <= args.staleness_penalty <= MAX_STALENESS_PENALTY:  # NaN fails too
        raise ValueError(f"--staleness-penalty {args.staleness_penalty:g}: give a number from 0 "
                         f"to {MAX_STALENESS_PENALTY:,.0f} (extra steps per version of staleness; "
                         "0 prices staleness at nothing, 1,000 rules out any).")
    calibration = load_calibration()
    calibrated = calibration["families"]
    if args.rates is None:  # the family declared for the device (NeMo-RL on GB200), else nemo-rl
        args.rates = device_family(device)
    elif args.rates not in calibrated:
        raise ValueError(f"--rates: {unknown_name('family', args.rates, calibrated)} (nemo-rl is "
                         "NeMo-RL v0.3-v0.6's software on H100s).")
    _note_rates_device(args.rates, device.name, load_document()["families"])
    rates = dataclasses.replace(calibrated_rates(args.rates), routing=args.routing)
    if not 0 <= args.speculative_tokens <= 16:
        raise ValueError(f"--speculative-tokens {args.speculative_tokens}: give the number of "
                         "tokens a draft proposes at each step, from 0 (none) to 16; 1 to 3 is "
                         "usual.")
    if args.draft_acceptance is not None and not 0 < args.draft_acceptance < 1:  # NaN fails too
        raise ValueError(f"--draft-acceptance {args.draft_acceptance:g}: give a probability "
                         "between 0 and 1, e.g. 0.7 (the chance the model accepts a drafted "
                         "token).")
    if args.draft_acceptance is not None and not args.speculative_tokens:
        print("note: --draft-acceptance with --speculative-tokens 0: no token is drafted, so it "
              "changes nothing.", file=sys.stderr)
    # where the acceptance comes from: the flag, the family's fit, or the stated default
    fitted = fitting_family(args.rates, "draft_acceptance", calibration)
    source = ("--draft-acceptance" if args.draft_acceptance is not None else
              f"fitted for {fitted}" if fitted else
              "assumed: the DeepSeek-V3 report's, not fitted for this family")
    rates = dataclasses.replace(
        rates, speculative_tokens=args.speculative_tokens,
        draft_acceptance=(rates.draft_acceptance if args.draft_acceptance is None
                          else args.draft_acceptance))
    drafted = rates.speculative_tokens
    most = linked_gpus(device, rates)
    if args.gpus > most:
        raise ValueError(f"--gpus {args.gpus} with --device {args.device}: {args.device} has no "
                         f"link between devices, so a plan holds at most {most}; give --gpus "
                         f"{most}, or a catalog accelerator (e.g. --device H100-SXM-80GB).")
    if args.placement == "disaggregated" and args.gpus < 2:
        raise ValueError(f"--placement disaggregated with --gpus {args.gpus}: separate pools need "
                         "at least 2 devices; give --gpus 2 or more, or --placement colocated.")
    if args.modes:
        runs = runnable_modes(args.modes)
        if args.gpus < 2 and not runs["colocated"]:
            raise ValueError(f"--modes {' '.join(args.modes)} with --gpus {args.gpus}: they run "
                             "on disaggregated pools only, which need at least 2 devices (one per "
                             "pool); give --gpus 2 or more, or a colocated mode (--modes sync or "
                             "fused).")
        if args.placement != "any" and not runs[args.placement]:
            other = "disaggregated" if args.placement == "colocated" else "colocated"
            raise ValueError(f"--modes {' '.join(args.modes)} with --placement {args.placement}: "
                             "stage fusion (fused) runs on colocated devices, the off-policy modes "
                             "(one-step-off, async, async-eta2) on disaggregated pools; give --placement "
                             f"{other} or any, or other --modes.")
        dropped = ([m for m in args.modes if m not in runs[args.placement]]
                   if args.placement != "any" else [])
        if dropped:
            verb = "does" if len(dropped) == 1 else "do"
            print(f"note: --modes {' '.join(dropped)} {verb} not run on the {args.placement} "
                  "placement (fused needs colocated devices, one-step-off, async and async-eta2 "
                  f"disaggregated pools); planning {' '.join(runs[args.placement])} only.",
                  file=sys.stderr)
    check_group(args.algorithm, args.group_size, _plan_flag)
    responses = args.prompts * args.group_size
    if args.minibatches > responses:
        print(f"note: --minibatches {args.minibatches} with {responses} responses per iteration: "
              f"a gradient step needs at least one response, so {responses} steps are planned.",
              file=sys.stderr)
    workload = Workload.long_tailed(args.prompts, args.group_size, args.prompt_len,
                                    args.mean_response, args.sigma, args.max_response, args.seed)
    # the batch is the workload's (check_group above refuses a group too small for the
    # algorithm): the configuration carries the algorithm's parts and gradient steps only, so
    # that a training run's limits on its own batch (16,384 responses) do not apply
    config = algorithm(args.algorithm, minibatches=args.minibatches)
    if config.dynamic_sampling and args.oversample is None:
        print(f"note: {args.algorithm}'s dynamic sampling generates more groups than it keeps "
              "(those whose answers are all right or all wrong are dropped; verl's recipes "
              "generate 3x the batch): planned at --oversample 1, every group kept; give "
              "--oversample 3 to price the extra generation.", file=sys.stderr)
    placements = ("colocated", "disaggregated") if args.placement == "any" else (args.placement,)
    search = {"length_buckets": args.length_buckets,
               "oversample": 1.0 if args.oversample is None else args.oversample}
    result = plan(spec, config, workload, device, args.gpus, rates=rates, placements=placements,
                  modes=args.modes, staleness_penalty=args.staleness_penalty, **search)
    # a count with few divisors (17) can plan worse than the round count under it (16)
    fewer = fewer_devices(spec, config, workload, device, args.gpus, result, rates=rates,
                          placements=placements, modes=args.modes,
                          staleness_penalty=args.staleness_penalty, **search)
    # a batch too small for the cluster: half the devices plan nearly the same step
    half = (half_the_devices(spec, config, workload, device, args.gpus, result, rates=rates,
                             placements=placements, modes=args.modes,
                             staleness_penalty=args.staleness_penalty, **search)
            if fewer is None else None)
    # the lengths simulated: their mean, and how many the budget cut (a small batch's mean is
    # also off the drawn one by chance, which the cap did not cause)
    drawn = workload.mean_response_len
    cut = sum(n >= workload.response_len for n in workload.response_lengths or ())
    if cut:
        mean = (f"mean {args.mean_response:,g} before the cap, {drawn:,.0f} after "
                f"({cut:,} of {responses:,} capped)")
    elif abs(drawn - args.mean_response) > 0.01 * args.mean_response:
        mean = (f"mean {args.mean_response:,g}, {drawn:,.0f} in the {responses:,} drawn, none "
                "capped")
    else:
        mean = f"mean {args.mean_response:,g}"
    prompts = f"{args.prompts:,} prompt{'' if args.prompts == 1 else 's'}"
    tokens = f"{args.prompt_len:,} token{'' if args.prompt_len == 1 else 's'}"
    print(f"{spec.name}, {args.algorithm}, {args.gpus:,} x {device.name}: {prompts} x "
          f"{args.group_size:,}, prompts of {tokens}, responses log-normal "
          f"({mean}, sigma {args.sigma:g}, at most {args.max_response:,}); rates "
          f"calibrated on {args.rates}'s published runs (decode step latency "
          f"{rates.decode_step_latency * 1e3:.1f} ms, training HFU {rates.train_hfu:.2f}"
          + (f", MoE decode at {rates.moe_decode_efficiency:.2f} of the bandwidth share"
             if spec.is_moe and rates.moe_decode_efficiency != 1 else "") + "); "
          + (f"speculative decoding, {drafted} drafted token{'' if drafted == 1 else 's'} a "
             f"step accepted at {rates.draft_acceptance:.3g} ({source}; "
             f"{speculative_yield(drafted, rates.draft_acceptance):.2f} tokens a step); "
             if drafted else "")
          + ("each group's samples on one replica" if rates.routing == "group" else
             "each sample to the next replica") + f" (--routing {rates.routing}); "
          + (f"{search['oversample']:g}x the prompts generated, the extra groups dropped "
             "(--oversample); " if search["oversample"] > 1 else "")
          + f"staleness priced at {args.staleness_penalty:g} extra steps per version; "
          f"{len(result.ranked)} plan{'s' if len(result.ranked) != 1 else ''} simulated, "
          f"{len(result.refused)} refused")
    print(format_plan(result, args.top))
    if fewer is not None:
        count, other = fewer
        priced = (" priced for staleness" if other.best.cost != other.best.step
                  or result.best.cost != result.best.step else "")
        print(f"note: {count:,} of these {args.gpus:,} GPUs plan a cheaper step: "
              f"{other.best.name}, {seconds_text(other.best.cost)} per step{priced} against "
              f"{seconds_text(result.best.cost)} above; layouts need degrees that divide the "
              f"pools, and {args.gpus:,} offers fewer of them (plan --gpus {count} shows it in "
              "full; the others could run something else).")
    if half is not None:
        count, other = half
        longer = other.best.cost / result.best.cost - 1
        priced = (" priced for staleness" if other.best.cost != other.best.step
                  or result.best.cost != result.best.step else "")
        print(f"note: half these GPUs plan nearly the same step: {count:,} GPUs, "
              f"{other.best.name}, {seconds_text(other.best.cost)} per step{priced} against "
              f"{seconds_text(result.best.cost)} on {args.gpus:,} ("
              + (f"{longer:.0%} longer" if longer > 0.005 else "no longer")
              + f"): {responses:,} responses per iteration are too few to "
              f"keep {args.gpus:,} GPUs busy (the longest response's decode steps and the fixed "
              "costs do not shrink with more devices); plan a larger batch (--prompts), or use "
              "fewer GPUs.")
    if args.sensitivity:
        from rlm_course.cluster.planner import sensitivity
        from rlm_course.utils import format_table

        rows = sensitivity(spec, config, workload, device, args.gpus, rates=rates, base=result,
                           staleness_penalty=args.staleness_penalty, placements=placements,
                           modes=args.modes, **search,
                           progress=sys.stderr.isatty())  # a bar on a terminal, not in a log
        # each rate in its unit, and the value the plan above was made with
        units = {"decode_step_latency": (1e3, " ms"), "sync_fixed_seconds": (1.0, " s"),
                 "staleness_penalty": (1.0, " steps/version"),
                 "host_adam_params_per_second": (1e-9, "B params/s")}
        now = {r["rate"]: (args.staleness_penalty if r["rate"] == "staleness_penalty"
                           else getattr(rates, r["rate"])) for r in rows}

        def shown(rate: str, value: float) -> str:
            scale, unit = units.get(rate, (1.0, ""))
            return f"{value * scale:.3g}{unit}"

        # each best plan once, by a letter (A: the plan above), named under the table
        letters: dict[str, str] = {result.best.name: "A"}
        for r in rows:
            letters.setdefault(r["best"], chr(ord("A") + len(letters)) if len(letters) < 26
                               else f"P{len(letters) + 1}")
        print("which rates decide the plan (planned again with one rate moved; the plan above "
              "used " + ", ".join(f"{rate} {shown(rate, v)}" for rate, v in now.items()) + "):")
        def flipped(r: dict) -> str:  # how far the plan above falls behind the row's best
            if r["best"] == result.best.name:
                return ""
            if r["behind"] == float("inf"):
                return "yes (A does not fit)"
            return f"{'yes' if r['flips'] else 'tie'} (A +{r['behind']:.1%})"

        print(format_table([[r["rate"], shown(r["rate"], r["value"]), letters[r["best"]],
                             seconds_text(r["step"]), f"{r['staleness']:.2f}",
                             seconds_text(r["cost"]), flipped(r)]
                            for r in rows],
                           ["rate", "value", "best plan", "step", "staleness", "priced step",
                            "flips"]))
        for name, letter in letters.items():
            print(textwrap.fill(f"{letter}: {name}" + (" (the plan above)" if letter == "A"
                                                       else ""), 100,
                                initial_indent="  ", subsequent_indent="     "))
        print(f"(a tie: another plan wins by {FEWER_MARGIN:.0%} or less of the priced step, within "
              "the simulator's resolution, so the rate does not decide between them; plans are "
              "ranked by the priced step = step x (1 + penalty x staleness), the "
              f"penalty {args.staleness_penalty:g} extra steps per version of mean staleness "
              "unless the row moves staleness_penalty; a plan with a shorter step can lose on it)")
    return 0


def _validate(args) -> int:
    from rlm_course.cluster.calibration import (COMMAND, calibrate_all, describe,
                                                load_calibration, stale_families, stale_loans)
    from rlm_course.cluster.validation import format_validation, summary, validation_table

    if args.calibrate:
        calibrate_all(progress=None if args.no_progress else
                      (lambda line: print(line, file=sys.stderr)))
        print("wrote data/published/rates.json")
    print(describe())
    for family, (stored, now) in stale_families().items():
        print(f"warning: {family}'s rates no longer give the error they were fitted with (rms "
              f"log error {stored:.4f} stored, {now:.4f} now): the model, a calibration figure or "
              f"a stored rate changed since; the predictions below do not use this model's fit; "
              f"remake the rates with `{COMMAND}`.")
    for family, (declared, stored) in stale_loans().items():
        print(f"warning: {family} borrows {declared or 'nothing'} by the figures file but "
              f"{stored or 'nothing'} in the rates file; remake the rates with `{COMMAND}`.")
    rows = validation_table()
    print(format_validation(rows))
    result = summary(rows)
    points = sum(entry["data_points"] for entry in load_calibration()["families"].values())
    print(f"out of sample: {result['out_of_sample_hits']} of {result['out_of_sample_total']} "
          f"within tolerance (the null model: {result['null_hits']} of {result['null_total']}); "
          f"{result['direction_errors']} direction errors; {result['free_parameters']} free "
          f"parameters fitted on {points} published values of {result['in_sample_total']} "
          f"calibration figure{'' if result['in_sample_total'] == 1 else 's'} (a figure can "
          "publish several: a step and its stages)")
    print(json.dumps(result))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """The systems and cluster commands, on the main parser's subcommands."""
    from rlm_course.systems.experiments import EXPERIMENTS

    p = sub.add_parser("systems", help="chapters 12-13's measured experiments on Ray workers "
                                       "(weight-sync, reshard, async, fusion) and the "
                                       "rollout/trainer mismatch (mismatch); writes "
                                       "runs/systems/systems-<experiment>.json, or with --store "
                                       "the data/experiments/ file the notebooks read")
    p.add_argument("experiment", choices=EXPERIMENTS)
    p.add_argument("--steps", type=int, default=None, help="async, mismatch: RL steps per run (default 60)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timing repeats (weight-sync 5, reshard 3); fusion: iterations (5)")
    p.add_argument("--seed", type=int, default=None, help="async, fusion: the RL seed (0); mismatch: the first of "
                                         "its two seeds (0)")
    p.add_argument("--store", action="store_true",
                   help="replace the stored data/experiments/systems-<experiment>.json that the "
                        "notebooks read (default: write to --runs-dir)")
    p.add_argument("--runs-dir", default=None, type=path_arg,
                   help="folder of the results file when not --store, and of the async and "
                        "mismatch experiments' run folders (<runs-dir>/systems-<experiment>/<run>/) "
                        "either way (default runs/systems)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier run's results file and run folders in --runs-dir")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_systems)

    from rlm_course.cluster.simulator import MODES
    from rlm_course.vocabulary import ROUTINGS

    p = sub.add_parser("plan", help="search placements, per-role layouts and execution modes of an "
                                    "RL run on a cluster; print the best plans and why the others "
                                    "lose")
    p.add_argument("--model", required=True,
                   help="an architecture of rlm_course.cost.architectures (e.g. llama-3.1-8b, "
                        "qwen3-30b-a3b, deepseek-v3; a wrong name lists them all)")
    p.add_argument("--gpus", type=int, required=True, help="devices in the cluster (1 to 10,000)")
    p.add_argument("--device", default="H100-SXM-80GB",
                   help="a device of the hardware catalog (default %(default)s; a wrong name "
                        "lists them all)")
    p.add_argument("--algorithm", type=str.lower, choices=list(PRESETS), default="grpo",
                   help="the RL algorithm, which decides the models held and the passes "
                        "(default %(default)s)")
    p.add_argument("--minibatches", type=int, default=16,
                   help="gradient steps per iteration (default %(default)s)")
    p.add_argument("--prompts", type=int, default=512, help="prompts per iteration (default %(default)s)")
    p.add_argument("--group-size", type=int, default=16,
                   help="responses per prompt (default %(default)s)")
    p.add_argument("--prompt-len", type=int, default=512, help="prompt tokens (default %(default)s)")
    p.add_argument("--mean-response", type=float, default=4000,
                   help="mean response tokens of the log-normal draw, before the budget caps its "
                        "tail (the header prints the mean after the cap; default %(default)g)")
    p.add_argument("--sigma", type=float, default=0.8,
                   help="log-normal spread of the lengths, 0 to 3 (0: all of the mean length; "
                        "default %(default)s)")
    p.add_argument("--max-response", type=int, default=None,
                   help=f"response budget (default {DEFAULT_MAX_RESPONSE:,}, or what the model's "
                        "context window leaves after the prompt if less)")
    p.add_argument("--placement", type=str.lower, choices=["any", "colocated", "disaggregated"],
                   default="any",
                   help="colocated: every device generates and trains in turn; disaggregated: a "
                        "rollout pool and a training pool; any: both (default %(default)s)")
    p.add_argument("--modes", nargs="+", type=str.lower, choices=list(MODES), default=None,
                   help="execution modes to try (default: sync and fused colocated; sync, "
                        "one-step-off and async disaggregated; async-eta2 only when named)")
    p.add_argument("--top", type=int, default=5, help="plans to print in full (default %(default)s)")
    p.add_argument("--oversample", type=float, default=None,
                   help="prompts generated per prompt trained, 1 to 64 (DAPO's dynamic sampling "
                        "generates more groups than it keeps: verl's recipes 3; default 1)")
    p.add_argument("--length-buckets", type=int, default=64,
                   help="the simulator rounds the response lengths to this many levels up to "
                        "the longest drawn (default %(default)s; fewer plan faster and coarser: "
                        "chapter 14's notebook plans with 32, which can rank two plans within "
                        "about 1%% of each other the other way)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the response lengths (default %(default)s)")
    p.add_argument("--rates", type=str.lower, default=None,
                   help="the family of calibrated rates to plan with, one of those of "
                        "data/published/rates.json: nemo-rl (NeMo-RL v0.3-v0.6 on H100s), "
                        "nemo-rl-gb200 (the same with its MoE decode fitted on GB200 runs), "
                        "nemo-rl-v0.7 and nemo-rl-v0.7-gb200 (NeMo-RL v0.7's), verl; default: "
                        "the family declared for the device (nemo-rl-gb200 on GB200s), else the "
                        "file's default_family")
    p.add_argument("--routing", type=str.lower, choices=list(ROUTINGS), default="group",
                   help="how prompts reach the generation replicas: group (each group's samples "
                        "on one replica, the groups dealt in turn) or sample (each "
                        "sample to the next replica, as NeMo-RL's asynchronous engine and verl's "
                        "agent loop send them); default %(default)s")
    p.add_argument("--speculative-tokens", type=int, default=0,
                   help="tokens a draft proposes at each decode step, 0 to 16, verified by the "
                        "model in the same forward (vLLM's num_speculative_tokens; the draft "
                        "priced as one more layer and the output head a token, as DeepSeek-V3's "
                        "multi-token prediction or an EAGLE head; NeMo-RL v0.7's DeepSeek-V3 "
                        "recipes draft 1); default %(default)s")
    p.add_argument("--draft-acceptance", type=float, default=None,
                   help="the chance the model accepts a drafted token (default: as fitted for "
                        "the rates family, nemo-rl-v0.7 and the family built on it, on NeMo-RL "
                        "v0.7's DeepSeek-V3 runs; else 0.85, the DeepSeek-V3 report's measure)")
    p.add_argument("--staleness-penalty", type=float, default=0.1,
                   help="extra steps per version of staleness to reach the same accuracy "
                        "(default %(default)s; 0: staleness is free; at most 1,000)")
    p.add_argument("--sensitivity", action="store_true",
                   help="then plan again with each deciding rate moved (decode latency, HFU, "
                        "sync seconds, staleness price) and say which flip the plan (about ten "
                        "more plans: up to a minute or two on 2 cores)")
    p.set_defaults(func=_plan)

    p = sub.add_parser("validate", help="chapter 14's simulator against published runs: rates "
                                        "calibrated once per family, every other figure "
                                        "predicted, with a null model")
    p.add_argument("--calibrate", action="store_true",
                   help="refit the rates on the calibration figures first and rewrite "
                        "data/published/rates.json (a few minutes)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress lines while --calibrate fits (predicting prints none)")
    p.set_defaults(func=_validate)
