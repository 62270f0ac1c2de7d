"""Command-line arguments built from the course's configurations: the task's settings and every
field of :class:`~rlm_course.algorithms.RLConfig` as a flag, and their values back as a task
and a configuration.

The flags of an RL run are generated from the dataclass fields (name, type, and the ``help``
and ``choices`` in each field's metadata), so that every setting of a run can be given on the
command line and a new field gets its flag without an edit here. A flag left out keeps the
chosen preset's value (:func:`rl_config_from_args`).

Used by the command line (:mod:`rlm_course.cli`) and by the data-parallel worker under
``torchrun`` (:mod:`rlm_course.distributed.__main__`), which parses the same options; it imports
neither, and nothing heavy (no torch), so that ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing

from rlm_course.algorithms import PRESETS, RLConfig, preset
from rlm_course.tasks import TASKS, get_task

#: Task settings exposed as flags: name -> (type, help).
TASK_FLAGS = {
    "digits": (int, "addition: digits per operand"),
    "n_numbers": (int, "countdown: how many numbers are given"),
    "max_number": (int, "countdown: largest given number"),
    "max_target": (int, "countdown: largest target"),
    "max_digits": (int, "scratchpad: most digits per operand"),
    "decay": (float, "scratchpad: P(n digits) proportional to decay ** (n - 1)"),
}
#: Per task, the settings of :data:`TASK_FLAGS` it has.
TASK_SETTINGS = {name: tuple(f.name for f in dataclasses.fields(cls)
                             if f.init and f.name in TASK_FLAGS)
                 for name, cls in TASKS.items()}


def flag(name: str) -> str:
    """The flag of a field: ``group_size`` -> ``--group-size``."""
    return "--" + name.replace("_", "-")


def add_task_args(parser: argparse.ArgumentParser) -> None:
    """``--task`` and the task settings of :data:`TASK_FLAGS` (each optional)."""
    parser.add_argument("--task", required=True, help=f"one of {sorted(TASKS)}")
    for name, (kind, help_text) in TASK_FLAGS.items():
        parser.add_argument(flag(name), type=kind, default=None, help=help_text)


def task_settings(args: argparse.Namespace) -> dict:
    """The task settings given on the command line.

    Raises:
        ValueError: for an unknown task, or a setting the task does not have (naming its
            settings).
    """
    if args.task not in TASKS:
        raise ValueError(f"unknown task {args.task!r}; choose one of {sorted(TASKS)}.")
    settings = {}
    for name in TASK_FLAGS:
        value = getattr(args, name, None)
        if value is None:
            continue
        if name not in TASK_SETTINGS[args.task]:
            raise ValueError(f"{flag(name)} does not apply to task {args.task!r} (its settings: "
                             f"{', '.join(map(flag, TASK_SETTINGS[args.task])) or 'none'}).")
        settings[name] = value
    return settings


def task_from_args(args: argparse.Namespace):
    """The task of ``--task`` with its settings (see :func:`task_settings` for the errors; a
    task's own refusal names the flags, ``--digits 0``, not ``Addition: digits=0``)."""
    settings = task_settings(args)
    try:
        return get_task(args.task, **settings)
    except ValueError as err:  # without the task class's name, in flags
        raise ValueError(as_flags(re.sub(r"^[A-Z][A-Za-z]*: ", "", str(err)),
                                  TASK_FLAGS)) from None


def _optional_float(text: str) -> float | None:
    if text.lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (or 'none')") from None


def _kind(field_type):
    """argparse's type for a field's annotation (``int``, ``float``, ``str``, ``bool``, or an
    optional float)."""
    if field_type in (int, float, str, bool):
        return field_type
    if typing.get_origin(field_type) in (typing.Union, getattr(__import__("types"), "UnionType")):
        args = set(typing.get_args(field_type))
        if args == {float, type(None)}:
            return _optional_float
    raise TypeError(f"no command-line type for a field of type {field_type!r}; give the field a "
                    "plain int, float, str or bool, or teach rlm_course.arguments._kind.")


def add_config_args(parser: argparse.ArgumentParser, config_class=RLConfig,
                    skip: tuple[str, ...] = (), default_note: str = "") -> list[str]:
    """One flag per field of ``config_class`` (except ``skip``): its type from the annotation,
    ``help`` and ``choices`` from the field's metadata (plus ``default_note``), on/off pairs
    (``--x`` / ``--no-x``) for booleans. A flag that is not given does not appear in the parsed
    namespace.

    Returns:
        the names of the fields that got a flag.
    """
    hints = typing.get_type_hints(config_class)
    names = []
    for f in dataclasses.fields(config_class):
        if f.name in skip or not f.init:
            continue
        kind = _kind(hints[f.name])
        help_text = f.metadata.get("help", "") + default_note
        options = dict(default=argparse.SUPPRESS, help=help_text)
        if kind is bool:
            parser.add_argument(flag(f.name), action=argparse.BooleanOptionalAction, **options)
        else:
            choices = f.metadata.get("choices")
            parser.add_argument(flag(f.name), type=kind,
                                choices=list(choices) if choices is not None else None,
                                metavar=None if choices is not None else f.name.upper(),
                                **options)
        names.append(f.name)
    return names


def config_overrides(args: argparse.Namespace, config_class=RLConfig,
                     skip: tuple[str, ...] = ("variant",)) -> dict:
    """The fields of ``config_class`` given on the command line (see :func:`add_config_args`)."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(config_class)
            if f.name not in skip and hasattr(args, f.name)}


def rl_config_from_args(args: argparse.Namespace) -> RLConfig:
    """The :class:`~rlm_course.algorithms.RLConfig` of a ``grpo``/``ppo`` command line:
    ``--variant``'s preset with the given flags' overrides.

    Raises:
        ValueError: for an invalid combination (see :class:`~rlm_course.algorithms.RLConfig`),
            or a flag the combination ignores (e.g. ``--lam`` without a critic): the message
            names it and what would use it.
    """
    overrides = config_overrides(args)
    try:
        config = preset(args.variant, **overrides)
    except ValueError as err:
        # a conflicting setting the command line did not give is the preset's: say so, or
        # "--group-size 1" reads as if the user had typed it
        fields = {f.name for f in dataclasses.fields(RLConfig)}
        implied = sorted({name for name, _ in _FIELD_VALUE.findall(str(err))
                          if name in fields and name not in overrides})
        note = (f" ({', '.join(map(flag, implied))}: the {args.variant} preset's "
                f"{'value' if len(implied) == 1 else 'values'}, not given on the command line)"
                if implied else "")
        raise ValueError(as_flags(str(err)) + note) from None
    ignored = config.unused(overrides)
    if ignored:
        raise ValueError("; ".join(f"{flag(k)} has no effect in this combination: {v}"
                                   for k, v in ignored.items())
                         + ". Drop it, or turn on what uses it.")
    return config


_FIELD_VALUE = re.compile(r"\b([a-z][a-z0-9_]*)=('[^']*'|[^\s,;:)]+)")


def as_flags(message: str, fields=None) -> str:
    """``message`` (an :class:`~rlm_course.algorithms.RLConfig` error, or a task's with
    ``fields`` :data:`TASK_FLAGS`, which name fields as the Python API spells them) as the command
    line spells them: ``group_size=1`` -> ``--group-size 1``, ``advantage='gae'`` ->
    ``--advantage gae``, ``use_critic=True`` -> ``--use-critic`` (``False``:
    ``--no-use-critic``). Names that are not ``fields`` (default: RLConfig's) stay as they are.
    """
    fields = set(fields) if fields is not None else {f.name for f in dataclasses.fields(RLConfig)}

    def one(match: re.Match) -> str:
        name, value = match.group(1), match.group(2).strip("'")
        if name not in fields:
            return match.group(0)
        if value in ("True", "False"):
            return flag(name) if value == "True" else "--no-" + flag(name)[2:]
        return f"{flag(name)} {value}"

    text = _FIELD_VALUE.sub(one, message)
    # a flag the message then repeats in parentheses (``--advantage gae (--advantage gae)``)
    text = re.sub(r"(--[a-z0-9-]+(?: [^\s();,]+)?) \(\1\)", r"\1", text)
    return re.sub(r"(--[a-z0-9-]+(?: [^\s();,]+)?) \(\1; ", r"\1 (", text)


def add_device_arg(parser: argparse.ArgumentParser) -> None:
    """``--device {auto,cpu,cuda}`` (:mod:`rlm_course.devices`; the names are spelled out here so
    that ``--help`` does not import torch)."""
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where the model computes (default auto: CUDA when torch sees a GPU, "
                             "else the CPU; a run records it)")


def path_arg(text: str) -> str:
    """argparse ``type`` of a path option: an empty one (``--out ""``) is refused instead of being
    taken as "not given" and replaced by the default.

    Raises:
        argparse.ArgumentTypeError: for an empty or blank path.
    """
    if not text.strip():
        raise argparse.ArgumentTypeError("give a path (it was empty)")
    return text


def add_rl_run_args(parser: argparse.ArgumentParser, variant: str) -> None:
    """Everything a ``grpo``/``ppo`` command takes: the task, every RLConfig field (``--variant``
    defaulting to ``variant``), and the run's folder, resume and threads."""
    add_task_args(parser)
    parser.add_argument("--variant", choices=list(PRESETS), default=variant,
                        help=f"the preset algorithm (default {variant}); the flags below override "
                             "parts of it")
    add_config_args(parser, RLConfig, skip=("variant",), default_note=" (default: the preset's)")
    parser.add_argument("--name", default=None,
                        help="run folder name (default <variant>-<task>-seed<seed>, the task with "
                             "its settings, e.g. grpo-addition-3-seed0)")
    parser.add_argument("--out", default="runs", help="parent folder of runs (default runs/)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run from its checkpoint")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    parser.add_argument("--sft-checkpoint", default=None, type=path_arg,
                        help="warm-start checkpoint (default data/checkpoints/sft-<task>.pt, made "
                             "if missing)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads (default: the free cores; 1 when other work is running)")
    add_device_arg(parser)
    parser.add_argument("--nproc", type=int, default=1,
                        help="data-parallel processes (gloo on CPU, NCCL on GPUs; --threads per "
                             "process, default 1); the default --name ends in -dp<nproc>")


def rl_run_parser(prog: str = "grpo", variant: str = "grpo") -> argparse.ArgumentParser:
    """A stand-alone parser of the ``grpo`` options (the data-parallel worker under torchrun
    parses its options with it)."""
    parser = argparse.ArgumentParser(prog=prog, allow_abbrev=False)
    add_rl_run_args(parser, variant)
    return parser
