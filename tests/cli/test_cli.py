"""The command line: every RLConfig field is a flag, the flags reach the configuration, the
torchrun worker parses the same options, and --debug shows a traceback."""

import dataclasses
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


def test_the_torchrun_worker_parses_the_same_options():
    args = rl_run_parser().parse_args(["--task", "addition", "--temperature", "0.7",
                                       "--variant", "rloo", "--steps", "7"])
    config = rl_config_from_args(args)
    assert (config.variant, config.temperature, config.steps) == ("rloo", 0.7, 7)


def test_flags_that_do_nothing_are_refused_and_debug_shows_the_traceback(capsys):
    assert main(["grpo", "--task", "addition", "--lam", "0.9"]) == 2
    assert "--lam has no effect" in capsys.readouterr().err
    assert main(["grpo", "--task", "addition", "--steps", "0"]) == 2
    with pytest.raises(ValueError, match="steps=0 must be a positive integer"):
        main(["--debug", "grpo", "--task", "addition", "--steps", "0"])


def test_debug_from_the_environment(monkeypatch):
    monkeypatch.setenv("RLM_COURSE_DEBUG", "1")
    with pytest.raises(ValueError, match="unknown task"):
        main(["eval", "--task", "nothing", "--checkpoint", "x.pt"])
