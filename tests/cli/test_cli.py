"""The command line: every RLConfig field is a flag, the flags reach the configuration, the
torchrun worker parses the same options, and --debug shows a traceback."""

import argparse
import dataclasses
import json
import typing

import pytest

from rlm_course.algorithms import PRESETS, RLConfig
from rlm_course.arguments import config_overrides, rl_config_from_args, rl_run_parser
from rlm_course.cli import build_parser, main


def _other_value(f: dataclasses.Field, kind):
    """A value of the field's type that differs from its default (and is valid alone)."""
    choices = f.metadata.get("choices")
    if choices is not None:
        return next(c for c in choices if c != f.default)
    if kind is bool:
        return not f.default
    if kind is int:
        return f.default + 3
    if kind is str:
        raise AssertionError(f"{f.name}: a str field without choices")
    return 0.375  # floats, and the optional float clip_eps_high


def test_every_rl_config_field_is_a_flag_of_grpo_and_ppo():
    hints = typing.get_type_hints(RLConfig)
    for command in ("grpo", "ppo"):
        for f in dataclasses.fields(RLConfig):
            kind = hints[f.name]
            value = _other_value(f, kind)
            flag = "--" + f.name.replace("_", "-")
            if kind is bool:
                argv = [flag if value else "--no-" + f.name.replace("_", "-")]
            else:
                argv = [flag, str(value)]
            args = build_parser().parse_args([command, "--task", "addition", *argv])
            got = args.variant if f.name == "variant" else config_overrides(args)[f.name]
            assert got == value, (command, f.name, got, value)


def test_unset_flags_keep_the_preset_and_set_ones_reach_the_config():
    args = build_parser().parse_args(["grpo", "--task", "addition"])
    assert config_overrides(args) == {} and rl_config_from_args(args) == RLConfig(**{
        **dataclasses.asdict(RLConfig()), **PRESETS["grpo"], "variant": "grpo"})
    args = build_parser().parse_args(
        ["ppo", "--task", "addition", "--warmup-steps", "5", "--min-lr-ratio", "0.5",
         "--temperature", "0.7", "--max-grad-norm", "0.5", "--value-coef", "0.25"])
    config = rl_config_from_args(args)
    assert (config.variant, config.warmup_steps, config.min_lr_ratio, config.temperature,
            config.max_grad_norm, config.value_coef) == ("ppo", 5, 0.5, 0.7, 0.5, 0.25)
    # an optional field can be set back to its "off" value
    args = build_parser().parse_args(["grpo", "--task", "addition", "--variant", "dapo",
                                      "--clip-eps-high", "none"])
    assert rl_config_from_args(args).clip_eps_high is None


def test_a_conflict_says_which_settings_are_the_presets():
    # ppo --advantage group: "--group-size 1" read as if the user had typed it
    args = build_parser().parse_args(["ppo", "--task", "addition", "--advantage", "group"])
    with pytest.raises(ValueError) as err:
        rl_config_from_args(args)
    message = str(err.value)
    assert message.startswith("2 settings conflict:\n - --group-size 1 with --advantage group")
    assert message.endswith("(--group-size, --use-critic: the ppo preset's values, not given on "
                            "the command line)")
    args = build_parser().parse_args(["grpo", "--task", "addition", "--group-size", "1"])
    with pytest.raises(ValueError) as err:
        rl_config_from_args(args)
    assert str(err.value).endswith("(--advantage: the grpo preset's value, not given on the "
                                   "command line)")
    # a conflict between given flags names no preset
    args = build_parser().parse_args(["grpo", "--task", "addition", "--group-size", "1",
                                      "--advantage", "group"])
    with pytest.raises(ValueError) as err:
        rl_config_from_args(args)
    assert "--group-size 1" in str(err.value) and "preset's" not in str(err.value)


def test_the_torchrun_worker_parses_the_same_options():
    args = rl_run_parser().parse_args(["--task", "addition", "--temperature", "0.7",
                                       "--variant", "rloo", "--steps", "7"])
    config = rl_config_from_args(args)
    assert (config.variant, config.temperature, config.steps) == ("rloo", 0.7, 7)


def test_flags_that_do_nothing_are_refused_and_debug_shows_the_traceback(capsys):
    assert main(["grpo", "--task", "addition", "--lam", "0.9"]) == 2
    assert "--lam has no effect" in capsys.readouterr().err
    assert main(["grpo", "--task", "addition", "--steps", "0"]) == 2
    with pytest.raises(ValueError, match="--steps 0 must be a positive integer"):
        main(["--debug", "grpo", "--task", "addition", "--steps", "0"])
    with pytest.raises(ValueError, match="--steps 0 must be a positive integer"):  # after it too
        main(["grpo", "--task", "addition", "--steps", "0", "--debug"])


@pytest.mark.parametrize("value", ["-inf", "-1e-3", "-1.", "-NaN"])
def test_a_negative_or_infinite_value_reaches_the_options_own_check(value, capsys):
    """argparse took -inf, -1e-3 and -1. for unknown options ("expected one argument"): they are
    values, and the option's range check names them."""
    assert main(["plan", "--model", "llama-3.1-8b", "--gpus", "8", "--staleness-penalty",
                 value]) == 2
    assert "error: --staleness-penalty " in capsys.readouterr().err


def test_debug_from_the_environment(monkeypatch):
    monkeypatch.setenv("RLM_COURSE_DEBUG", "1")
    with pytest.raises(ValueError, match="unknown task"):
        main(["eval", "--task", "nothing", "--checkpoint", "x.pt"])


# ---------------------------------------------------------------------------- distributed <worker>
# Launcher options, then `--` and the worker's options; every option is checked before torchrun
# starts, and a refusal is one line with exit code 2.
def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def test_distributed_refuses_strategies_that_cannot_run_before_starting_torchrun(capsys):
    for argv in (["strategies", "--nproc", "3", "--", "--strategies", "tp"],
                 ["strategies", "--nproc", "3", "--strategies", "tp"],
                 ["--nproc", "3", "strategies", "--strategies", "tp"]):
        assert main(["distributed", *argv]) == 2
        assert _one_line_error(capsys) == ("error: --strategies tp on 3 ranks: tp: 3 ranks do "
                                           "not divide the 4 heads; use --nproc 2 or 4.")


def test_distributed_checks_the_workers_and_the_launchers_options_first(capsys):
    assert main(["distributed", "grpo", "--", "--task", "addition", "--stepz", "3"]) == 2
    err = _one_line_error(capsys)
    assert "unrecognized arguments: --stepz 3" in err and "distributed grpo -- --help" in err
    assert main(["distributed", "grpo", "--nproc", "3", "--", "--task", "addition"]) == 2
    assert "does not split into 3 equal shares" in _one_line_error(capsys)
    assert main(["distributed", "grpo", "--nproc", "2", "--", "--task", "addition", "--resume",
                 "--out", "/nonexistent-runs"]) == 2
    assert "--resume: no run to resume" in _one_line_error(capsys)
    # a run folder nobody can write: refused before torchrun, not by every rank once started
    assert main(["distributed", "grpo", "--nproc", "2", "--", "--task", "addition", "--out",
                 "/proc/runs"]) == 2
    assert _one_line_error(capsys).startswith("error: cannot write a file in /proc/runs (")
    assert main(["distributed", "collectives", "--", "--repeats", "0"]) == 2
    assert "--repeats 0" in _one_line_error(capsys)
    assert main(["distributed", "hello", "--threads", "0"]) == 2
    assert "--threads 0" in _one_line_error(capsys)
    # the shared options are checked for every worker, before torchrun starts (strategies and
    # grpo returned before the check: a negative timeout reached torch's C++ stack trace)
    for worker, option, value in (("strategies", "--timeout", "-5"), ("strategies", "--timeout",
                                  "nan"), ("strategies", "--threads", "0"),
                                  ("grpo", "--threads", "0"), ("grpo", "--timeout", "0")):
        assert main(["distributed", worker, "--nproc", "2", option, value]) == 2
        fix = "a positive number of seconds" if option == "--timeout" else "1 or more threads"
        assert _one_line_error(capsys) == (f"error: {option} {value}: give {fix}" + (
            " (the default is 300)." if option == "--timeout" else " per rank."))
    assert main(["distributed", "hello", "--port", "80"]) == 2
    assert "--port 80: give a port number in 1024..65535" in _one_line_error(capsys)
    assert main(["distributed", "nothing"]) == 2
    assert "unknown worker 'nothing'" in _one_line_error(capsys)


def test_a_note_of_the_course_is_one_line_and_other_warnings_are_left_alone(capsys):
    """The oversubscription note (a rlm_course.utils.Note) printed as 'Note: ...', without
    Python's file, line and source line; another warning keeps Python's form."""
    import warnings

    from rlm_course.cli import _notes_as_lines
    from rlm_course.distributed.launch import OversubscriptionWarning, oversubscription
    from rlm_course.utils import cores

    note = oversubscription(cores() + 1, 1)
    assert note.startswith(f"{cores() + 1} ranks x 1 thread(s) on {cores()} CPU cores")
    assert oversubscription(1, 1) is None
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        with _notes_as_lines():
            warnings.warn(note, OversubscriptionWarning)
            with pytest.warns(UserWarning, match="something else"):
                warnings.warn("something else", UserWarning)
    err = capsys.readouterr().err
    assert err == f"Note: {note}\n"  # the other warning went to Python's own handler


def test_distributed_builds_the_torchrun_command_from_launcher_and_worker_options():
    from rlm_course.distributed.torchrun import split_options, torchrun_command

    launcher, worker = split_options(["--nproc", "4", "--port", "29511", "--time", "--",
                                      "--strategies", "tp", "--nproc", "9"])
    assert (launcher.nproc, launcher.port) == (4, 29511)
    assert worker == ["--time", "--strategies", "tp", "--nproc", "9"]  # after --: the worker's
    command = torchrun_command("strategies", 4, worker, port=29511, common=["--threads", "2"])
    assert command[3:] == ["--nnodes=1", "--master-addr=127.0.0.1", "--master-port=29511",
                           "--nproc-per-node=4", "-m", "rlm_course.distributed", "--threads", "2",
                           "strategies", "--time", "--strategies", "tp", "--nproc", "9"]
    assert split_options(["--task", "addition"], nproc=3)[0].nproc == 3


def test_grpo_resume_with_nproc_is_accepted_and_checked(capsys):
    # the message of an interrupted run says: the same command plus --resume
    assert main(["grpo", "--task", "addition", "--nproc", "2", "--resume", "--no-progress",
                 "--out", "/nonexistent-runs"]) == 2
    assert "--resume: no run to resume" in _one_line_error(capsys)
    assert main(["grpo", "--task", "addition", "--nproc", "2", "--resume", "--overwrite",
                 "--no-progress"]) == 2
    assert "pass only one" in _one_line_error(capsys)


def test_plan_takes_a_model_and_a_device_in_any_case(capsys):
    # Hugging Face writes Llama-3.1-70B; the catalog llama-3.1-70b: no other model differs by case
    assert main(["plan", "--model", "Llama-3.1-70B", "--gpus", "16", "--device", "h100-sxm-80gb",
                 "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("llama-3.1-70b, grpo, 16 x H100-SXM-80GB: ")
    # the header says how prompts reach the replicas (the rates' routing), which --routing sets
    assert "); each group's samples on one replica (--routing group); " in out.splitlines()[0]
    assert main(["plan", "--model", "llama-3.1-70b", "--gpus", "16", "--top", "1",
                 "--routing", "sample"]) == 0
    assert "); each sample to the next replica (--routing sample); " in (
        capsys.readouterr().out.splitlines()[0])
    with pytest.raises(SystemExit):
        main(["plan", "--model", "llama-3.1-70b", "--gpus", "16", "--routing", "round-robin"])
    assert "--routing: invalid choice: 'round-robin'" in capsys.readouterr().err
    # speculative decoding: said in the header, with the tokens a step yields (1 + 0.5 + 0.25);
    # the step is faster than without a draft
    capsys.readouterr()
    argv = ["plan", "--model", "llama-3.1-8b", "--gpus", "8", "--top", "1", "--placement",
            "colocated"]
    assert main(argv) == 0
    without = capsys.readouterr().out
    assert main([*argv, "--speculative-tokens", "2", "--draft-acceptance", "0.5"]) == 0
    drafted = capsys.readouterr().out
    assert "speculative decoding" not in without.splitlines()[0]
    assert ("; speculative decoding, 2 drafted tokens a step accepted at 0.5 "
            "(--draft-acceptance; 1.75 tokens a step); ") in drafted.splitlines()[0]
    def step(out):
        return float(out.split("   step ")[1].split(" s,")[0].replace(",", ""))
    assert step(drafted) < step(without)
    assert main([*argv, "--draft-acceptance", "0.5"]) == 0
    assert "--draft-acceptance with --speculative-tokens 0: no token is drafted" in (
        capsys.readouterr().err)
    # the acceptance's source: a family that fits it, or the stated default where none does
    assert main([*argv, "--speculative-tokens", "1", "--rates", "nemo-rl-v0.7-gb200"]) == 0
    out, err = capsys.readouterr()
    assert "(fitted for nemo-rl-v0.7; 1." in out.splitlines()[0]
    assert ("note: --rates nemo-rl-v0.7-gb200 was fitted on GB200-NVL72-186GB runs" in err)
    assert main([*argv, "--speculative-tokens", "1"]) == 0
    assert ("accepted at 0.85 (assumed: the DeepSeek-V3 report's, not fitted for this family; "
            "1.85 tokens a step)") in capsys.readouterr().out.splitlines()[0]
    # a family built for the plan's device is named when its base is chosen
    assert main([*argv, "--rates", "nemo-rl-v0.7", "--device", "GB200-NVL72-186GB"]) == 0
    assert ("note: --rates nemo-rl-v0.7-gb200 is fitted for GB200-NVL72-186GB and built on "
            "nemo-rl-v0.7; planning with nemo-rl-v0.7 as asked.") in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    # no layout fits: the answer says how many GPUs would (doubling, then whole nodes between)
    (["--model", "deepseek-v3", "--gpus", "16"],
     "no layout of deepseek-v3 fits 16 x H100-SXM-80GB for this workload; the smallest count "
     "that fits is 96 (on 88 the nearest layout misses by 10.0 GB)"),
    (["--model", "qwen2.5-7b", "--gpus", "8", "--device", "this-machine"],
     "--gpus 8 with --device this-machine: this-machine has no link between devices, so a plan "
     "holds at most 1; give --gpus 1"),
    (["--model", "gpt-9", "--gpus", "8"], "--model: unknown architecture 'gpt-9'; choose "),
    # a batch too small for the cluster: the count below that fits, not "more memory"
    (["--model", "r1-distill-qwen-1.5b", "--gpus", "10000", "--prompts", "1", "--group-size", "2",
      "--mean-response", "1", "--max-response", "1", "--minibatches", "2"],
     "no layout of r1-distill-qwen-1.5b fits 10,000 x H100-SXM-80GB for this workload; 10,000 "
     "does not fit (nothing fits on 10,000) and the planner plans at most 10,000 GPUs; 72, below "
     "it, fits. The nearest miss on 10,000: trainer: every layout of 10,000 devices has at least "
     "625 data-parallel ranks (tp1 pp16), more than the 1 sequence of a gradient step, so ranks "
     "would hold none; take fewer gradient steps per iteration or a larger batch, or give the "
     "trainer fewer devices (a disaggregated split). Use 72 devices, or a larger batch.\n"),
    # async runs on disaggregated pools only: memory is searched there (Qwen2.5-32B plans
    # colocated on 4 GPUs; split into two pools, its trainer of 3 misses)
    (["--model", "qwen2.5-32b", "--gpus", "4", "--modes", "async"],
     "no layout of qwen2.5-32b fits 4 x H100-SXM-80GB for this workload; the smallest count "
     "above 4 that fits is 5, of whole nodes 8 (on 4 the nearest layout misses by 10.5 GB)"),
    (["--model", "qwen2.5-7b", "--gpus", "8", "--device", "TPU9"],
     "--device: unknown device 'TPU9'; choose one of "),
    # a name the user began, a close spelling: the one meant is named (a name in another case
    # is the name: test_plan_takes_a_model_and_a_device_in_any_case)
    (["--model", "qwen3-32", "--gpus", "8"],
     "--model: unknown architecture 'qwen3-32' (did you mean 'qwen3-32b'?); choose "),
    (["--model", "qwen2.5-7b", "--gpus", "8", "--device", "h100"],
     "--device: unknown device 'h100' (did you mean 'H100-SXM-80GB'?); choose one of "),
    (["--model", "x" * 5000, "--gpus", "8"],  # a long name is cut, not echoed whole
     "--model: unknown architecture '" + "x" * 57 + "...'; choose one of "),
    (["--model", "qwen2.5-7b", "--gpus", "8", "--group-size", "1"],  # as training refuses it
     "--group-size 1 with --algorithm grpo: its group baseline needs 2 or more responses per "
     "prompt (with one, every advantage is 0); give --group-size 2 or more (16 is the default), "
     "or an --algorithm without a group baseline (ppo, reinforce_pp)."),
    (["--model", "qwen2.5-7b", "--gpus", "8", "--group-size", "1", "--algorithm", "dapo"],
     "--group-size 1 with --algorithm dapo: its group baseline needs 2 or more"),
    # named by their flags, not by the Python API's arguments
    (["--model", "qwen2.5-7b", "--gpus", "8", "--oversample", "0"],
     "--oversample 0: give a number from 1 to 64 (prompts generated per prompt trained"),
    (["--model", "qwen2.5-7b", "--gpus", "8", "--oversample", "nan"],
     "--oversample nan: give a number from 1 to 64"),
    (["--model", "qwen2.5-7b", "--gpus", "8", "--length-buckets", "1"],
     "--length-buckets 1: give 2 or more levels (64 is the default; fewer plan faster and "
     "coarser).\n"),
    (["--model", "qwen2.5-7b", "--gpus", "8", "--staleness-penalty", "-1"],
     "--staleness-penalty -1: give a number from 0 to 1,000"),
    (["--model", "qwen2.5-7b", "--gpus", "8", "--staleness-penalty", "1e308"],
     "--staleness-penalty 1e+308: give a number from 0 to 1,000 (extra steps per version"),
    (["--model", "qwen2.5-7b", "--gpus", "8", "--staleness-penalty", "nan"],
     "--staleness-penalty nan: give a number from 0 to 1,000"),
    (["--model", "qwen2.5-7b", "--gpus", "8", "--speculative-tokens", "-1"],
     "--speculative-tokens -1: give the number of tokens a draft proposes at each step, from 0 "
     "(none) to 16"),
    # a misspelt or older family: named with the flag and the one meant
    (["--model", "qwen2.5-7b", "--gpus", "8", "--rates", "NeMo-RL-v07"],
     "--rates: unknown family 'nemo-rl-v07' (did you mean 'nemo-rl-v0.7'?); choose one of "),
    (["--model", "qwen2.5-7b", "--gpus", "8", "--rates", "nemo-rl-v0.6"],
     "--rates: unknown family 'nemo-rl-v0.6' (did you mean 'nemo-rl-v0.7'?); choose one of "),
    (["--model", "qwen2.5-7b", "--gpus", "8", "--speculative-tokens", "1", "--draft-acceptance",
      "1"], "--draft-acceptance 1: give a probability between 0 and 1"),
    (["--model", "qwen2.5-7b", "--gpus", "8", "--speculative-tokens", "1", "--draft-acceptance",
      "nan"], "--draft-acceptance nan: give a probability between 0 and 1"),
    # the off-policy modes need two pools: not a matter of memory on one device
    (["--model", "llama-3.1-8b", "--gpus", "1", "--modes", "async", "one-step-off"],
     "--modes async one-step-off with --gpus 1: they run on disaggregated pools only, which need "
     "at least 2 devices (one per pool); give --gpus 2 or more, or a colocated mode (--modes sync "
     "or fused).\n"),
    (["--model", "qwen2.5-7b", "--gpus", "1", "--placement", "disaggregated"],
     "--placement disaggregated with --gpus 1: separate pools need at least 2 devices"),
    (["--model", "qwen2.5-7b", "--gpus", "8", "--placement", "colocated", "--modes", "async"],
     "--modes async with --placement colocated: stage fusion (fused) runs on colocated devices"),
])
def test_plan_errors_are_one_line_naming_the_flag_and_the_fix(capsys, argv, message):
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + message), err
    assert err.count("\n") == 1 and "Traceback" not in err and "TransformerSpec" not in err
    assert "Rates." not in err and "Link" not in err  # no Python-API advice on the command line


def test_a_memory_refusal_offers_shorter_sequences_only_where_they_would_do(capsys):
    # Llama-3.1-70B on 2 H100s misses by 166 GB, 31 of them activations and logits: shorter
    # sequences cannot cover it; DeepSeek-V3 on 88 misses by 10.0 GB, 23.5 of them: they can
    assert main(["plan", "--model", "llama-3.1-70b", "--gpus", "2"]) == 2
    assert capsys.readouterr().err.endswith(
        "Use 8 or more devices or a device with more memory.\n")
    assert main(["plan", "--model", "deepseek-v3", "--gpus", "88"]) == 2
    assert capsys.readouterr().err.endswith(
        "Use 96 or more devices, a device with more memory, or shorter sequences.\n")


def test_plan_takes_its_named_choices_in_any_case(capsys):
    # as --model and --device: a family, an algorithm, a placement, modes and a routing
    argv = ["plan", "--model", "qwen2.5-7b", "--gpus", "8", "--top", "1", "--rates", "NeMo-RL",
            "--algorithm", "GRPO", "--placement", "Disaggregated", "--modes", "Async", "SYNC",
            "--routing", "Sample"]
    assert main(argv) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.startswith("qwen2.5-7b, grpo, 8 x H100-SXM-80GB") and "nemo-rl's" in header
    assert "each sample to the next replica (--routing sample)" in header, header


def test_plan_takes_groups_larger_than_a_training_run_holds(capsys):
    # the batch is the workload's: 4 prompts x 2,048 is the default 8,192 responses (a training
    # configuration of 16 prompts of 2,048 was refused at 32,768, naming a flag plan does not have)
    assert main(["plan", "--model", "llama-3.1-8b", "--gpus", "8", "--prompts", "4",
                 "--group-size", "2048", "--top", "1", "--placement", "colocated"]) == 0
    assert "4 prompts x 2,048, " in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize("argv, sentence", [
    (["--modes", "async"],
     "Use 8 or more devices (5, not whole nodes, fits too), a device with more memory, or "
     "shorter sequences. A colocated plan "
     "fits 4 devices, but the modes asked (async) do not run on colocated devices; add sync or "
     "fused to the modes, or leave the modes out.\n"),
    (["--placement", "disaggregated"],
     "A colocated plan fits 4 devices: the placement asked is disaggregated; allow colocated "
     "(placement any) to plan it.\n"),
])
def test_a_memory_refusal_names_the_placement_the_options_left_out(capsys, argv, sentence):
    # Qwen2.5-32B plans colocated on 4 GPUs; split into two pools its trainer of 3 misses: the
    # refusal of a disaggregated-only search says that the options, not the count, rule it out
    assert main(["plan", "--model", "qwen2.5-32b", "--gpus", "4", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no layout of qwen2.5-32b fits 4 x H100-SXM-80GB"), err
    assert err.endswith(sentence), err


def test_plan_runs_on_the_measured_machine_that_the_device_list_offers(capsys):
    from rlm_course.cost.hardware import load_catalog

    if "this-machine" not in load_catalog():
        pytest.skip("this machine is not measured (python -m rlm_course hardware --measure)")
    assert main(["plan", "--model", "r1-distill-qwen-1.5b", "--gpus", "1", "--device",
                 "this-machine", "--prompts", "4", "--group-size", "2", "--mean-response", "100",
                 "--max-response", "256", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "r1-distill-qwen-1.5b, grpo, 1 x this-machine" in out
    assert "1. colocated, generation tp1, trainer dp1 recompute" in out
    assert max(len(line) for line in out.splitlines()[1:]) <= 100


def test_plan_says_when_it_plans_fewer_gradient_steps_than_asked(capsys):
    small = ["plan", "--model", "qwen2.5-7b", "--gpus", "8", "--prompts", "2", "--group-size",
             "4", "--mean-response", "500", "--max-response", "2048", "--top", "1"]
    assert main([*small, "--minibatches", "100"]) == 0
    capped = capsys.readouterr()
    assert capped.err == ("note: --minibatches 100 with 8 responses per iteration: a gradient "
                          "step needs at least one response, so 8 steps are planned.\n")
    assert main([*small, "--minibatches", "8"]) == 0
    exact = capsys.readouterr()
    assert exact.err == "" and exact.out == capped.out  # the same plan: 8 steps either way


def test_plan_says_which_modes_the_placement_does_not_run(capsys):
    assert main(["plan", "--model", "qwen2.5-7b", "--gpus", "8", "--placement", "colocated",
                 "--modes", "sync", "async", "one-step-off", "--prompts", "32", "--group-size",
                 "8", "--mean-response", "500", "--max-response", "2048", "--top", "1"]) == 0
    captured = capsys.readouterr()
    assert ("note: --modes async one-step-off do not run on the colocated placement (fused needs "
            "colocated devices, one-step-off, async and async-eta2 disaggregated pools); "
            "planning sync only.") in captured.err
    assert ", sync\n" in captured.out and ", async" not in captured.out
    assert "one-step-off" not in captured.out


def test_an_unknown_option_shows_the_commands_own_usage(capsys):
    for argv, command in ((["validate", "--bogus"], "validate"),
                          (["plan", "--model", "llama-3-8b", "--gpus", "8", "--bogus"], "plan"),
                          (["hardware", "extra"], "hardware")):
        with pytest.raises(SystemExit) as caught:
            main(argv)
        assert caught.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"usage: python -m rlm_course {command} ")
        assert err.rstrip().endswith(f"python -m rlm_course {command}: error: unrecognized "
                                     f"arguments: {argv[-1]}")


def test_every_command_help_opens_with_what_the_command_list_says(capsys):
    from rlm_course.cli import build_parser, commands

    for name, command in commands(build_parser()).items():
        assert command.description, name
    with pytest.raises(SystemExit):
        main(["make-eval-sets", "--help"])
    assert "rewrite data/eval/*.jsonl (fixed seeds)" in capsys.readouterr().out


def test_version_names_the_course_and_torch(capsys):
    from importlib import metadata

    import rlm_course

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == (
        f"rlm_course {rlm_course.__version__} (torch {metadata.version('torch')})")
    assert rlm_course.__version__ == metadata.version("rlm_course")  # pyproject.toml's


def test_bench_help_describes_every_benchmark_it_accepts():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    bench = sub.choices["bench"]
    what = next(a for a in bench._actions if a.dest == "what")
    text = " ".join(bench.description.split())
    assert [name for name in what.choices if f"{name} (" not in text] == []
    repeats = next(a for a in bench._actions if a.dest == "repeats")
    assert repeats.default == 5 and "default 5" in repeats.help


def test_plan_sensitivity_shows_each_rate_in_its_unit_beside_the_value_planned_with(capsys):
    from rlm_course.cluster.calibration import calibrated_rates

    assert main(["plan", "--model", "qwen2.5-7b", "--gpus", "8", "--prompts", "32",
                 "--group-size", "8", "--mean-response", "500", "--max-response", "2048",
                 "--top", "1", "--sensitivity"]) == 0
    out = capsys.readouterr().out
    rates = calibrated_rates("nemo-rl")
    assert (f"the plan above used decode_step_latency {rates.decode_step_latency * 1e3:.3g} ms, "
            f"train_hfu {rates.train_hfu:.3g}, sync_fixed_seconds 0 s, staleness_penalty 0.1 "
            "steps/version):") in out
    values = [line.split()[1:3] for line in out.splitlines()
              if line.startswith(("decode_step_latency ", "sync_fixed_seconds "))]
    assert values == [["0", "ms"], ["10", "ms"], ["30", "ms"], ["0", "s"], ["10", "s"],
                      ["60", "s"]]
    # the ranking's own number beside the raw step: the step priced for staleness, equal to it
    # when staleness is free and dearer as it is priced higher
    import re

    assert re.search(r"best plan +step +staleness +priced step +flips", out)
    rows = {line.split()[1]: re.search(r"([\d,.]+) s +([\d.]+) +([\d,.]+) s", line).groups()
            for line in out.splitlines() if line.startswith("staleness_penalty ")}
    assert set(rows) == {"0", "0.1", "0.3"}
    for penalty, (step, staleness, cost) in rows.items():  # to the printed decimal
        assert float(cost) == pytest.approx(float(step) * (1 + float(penalty) * float(staleness)),
                                            abs=0.06 + 0.005 * float(step)), penalty
    assert rows["0"][0] == rows["0"][2] and float(rows["0.3"][2]) > float(rows["0.3"][0])
    assert "x (1 + penalty x staleness)" in out
    # the best plans by letter, each named once under the table, A the plan above
    used = {line.split()[3] if line.split()[2] in ("ms", "s", "steps/version")
            else line.split()[2] for line in out.splitlines()
            if line.startswith(("decode_step_latency ", "train_hfu ", "sync_fixed_seconds ",
                                "staleness_penalty "))}
    legend, key = {}, None  # each entry wrapped at 100 characters, continued indented
    for line in out.splitlines():
        if re.match(r"  [A-Z]: ", line):
            key, text = line.strip().split(": ", 1)
            legend[key] = text
        elif key and line.startswith("     "):
            legend[key] += " " + line.strip()
        else:
            key = None
    assert used <= set(legend) and "A" in legend
    assert all(len(line) <= 100 for line in out.splitlines() if re.match(r"  [A-Z]: |     ", line))
    best = next(line for line in out.splitlines() if line.startswith("1. "))[3:]  # wrapped
    assert legend["A"].startswith(best) and legend["A"].endswith(" (the plan above)")


def test_configuration_errors_name_the_flags_the_user_typed():
    from rlm_course.arguments import as_flags

    assert as_flags("use_critic=True with advantage='rloo': drop the critic (--no-use-critic) or "
                    "use advantage='gae' (--advantage gae).") == (
        "--use-critic with --advantage rloo: drop the critic (--no-use-critic) or use "
        "--advantage gae.")
    assert as_flags("normalize_std=False, clip_eps_high=0.1 < clip_eps=0.2") == (
        "--no-normalize-std, --clip-eps-high 0.1 < --clip-eps 0.2")
    # names that are not flags of a run stay as they are
    assert as_flags("max_seq_len=64 exceeds; digits=0") == "max_seq_len=64 exceeds; digits=0"


def test_family_refuses_paths_and_variants_it_would_fail_on_after_its_runs(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    for argv, message in (
            (["--out", str(tmp_path)], f"--out {tmp_path} is a folder; give the results file's"),
            (["--runs-dir", str(afile)], f"cannot write to {afile}: it is a file, not a folder; "
                                         "choose another --runs-dir."),
            # a path through a file: the operating system said "File exists" / "Not a directory"
            (["--runs-dir", str(afile / "runs")], f"cannot write to {afile / 'runs'}: {afile} is "
                                                  "a file, not a folder; choose another --runs-dir."),
            (["--out", str(afile / "family.json")], f"cannot write to {afile}: it is a file, not a "
                                                    "folder; choose another --out."),
            (["--variants", "grpo", "rloo", "grpo"], "--variants names grpo more than once"),
            # refused after the runs folder was made: an empty folder was left behind
            (["--steps", "0", "--runs-dir", str(tmp_path / "runs")], "--steps 0 must be positive")):
        assert main(["family", "--task", "addition", "--steps", "1", "--seeds", "0",
                     "--no-progress", *argv]) == 2
        assert message in _one_line_error(capsys)
    assert afile.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == [
        "afile"]


def test_exercises_check_with_force_and_sft_runs_dir_file_are_refused(tmp_path, capsys):
    assert main(["exercises", "--check", "--force"]) == 2
    assert "--check and --force: --check only compares" in _one_line_error(capsys)
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    assert main(["sft", "--task", "addition", "--runs-dir", str(afile), "--no-progress"]) == 2
    assert f"--runs-dir {afile} is a file; give a folder" in _one_line_error(capsys)
    assert afile.read_text() == "keep me"


def test_systems_refuses_store_with_a_runs_dir(tmp_path, capsys):
    assert main(["systems", "weight-sync", "--store", "--runs-dir", str(tmp_path / "x")]) == 2
    assert "--store and --runs-dir: give one" in _one_line_error(capsys)
    assert not (tmp_path / "x").exists()


def test_systems_async_run_folders_follow_the_runs_dir(tmp_path, monkeypatch, capsys):
    """The async experiment's per-run folders go under --runs-dir (they went to a fixed runs/
    whatever --runs-dir said); Ray and the runs are stubbed, only the paths are checked."""
    import rlm_course.systems.controller as controller
    import rlm_course.systems.experiments as experiments

    seen = {}

    def fake_async(steps, seed, progress, run_dir):
        seen.update(steps=steps, seed=seed, run_dir=run_dir)
        return {"runs": {}}

    monkeypatch.setattr(controller, "start_ray", lambda *a, **k: None)
    monkeypatch.setattr(controller, "stop_ray", lambda *a, **k: None)
    monkeypatch.setattr(experiments, "async_experiment", fake_async)
    runs = tmp_path / "mine"
    assert main(["systems", "async", "--steps", "3", "--runs-dir", str(runs), "--no-progress"]) == 0
    assert seen == {"steps": 3, "seed": 0, "run_dir": runs / "systems-async"}
    assert json.loads((runs / "systems-async.json").read_text())["runs"] == {}
    assert f"wrote {runs / 'systems-async.json'}" in capsys.readouterr().out


@pytest.mark.parametrize("argv, flag", [
    (["sft", "--task", "addition", "--out", ""], "--out"),
    (["sft", "--task", "addition", "--runs-dir", " "], "--runs-dir"),
    (["family", "--task", "addition", "--runs-dir", ""], "--runs-dir"),
    (["family", "--task", "addition", "--out", ""], "--out"),
    (["systems", "async", "--runs-dir", ""], "--runs-dir"),
    (["eval", "--task", "addition", "--checkpoint", ""], "--checkpoint"),
    (["grpo", "--task", "addition", "--sft-checkpoint", ""], "--sft-checkpoint"),
])
def test_an_empty_path_is_refused_not_taken_as_the_default(argv, flag, capsys):
    # sft --out "" trained into the default path; family --runs-dir "" failed an hour later
    # blaming --out; systems --runs-dir "" started Ray
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert f"argument {flag}: give a path (it was empty)" in capsys.readouterr().err
