"""Command line: ``python -m rlm_course <command> ...`` (``--help`` on each command).

One module per group of commands: :mod:`~rlm_course.cli.train` (the RL jobs),
:mod:`~rlm_course.cli.cluster` (systems experiments, plan, validate) and
:mod:`~rlm_course.cli.tools` (benchmarks, grading, exercises, hardware); the flags of an RL run
are generated from the configuration's fields (:mod:`rlm_course.arguments`). Building the parser
imports the cost model (``plan --mode`` lists the simulator's modes), and with it torch; the
trainer and Ray are imported by the command that needs them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import warnings

from rlm_course.cli import cluster, tools, train

DESCRIPTION = ("The course's jobs, benchmarks and tools. Run `python -m rlm_course <command> --help` "
               "for a command's options. Needs the course's environment: `source .venv/bin/activate` "
               "after `make demo` or `make test` (or call .venv/bin/python -m rlm_course ...).")


class ExactArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that takes only whole option names (``allow_abbrev=False``), it and
    its sub-commands: a typo such as ``validate --calibrat`` is an error, not ``--calibrate``
    (which rewrites the stored rates)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        # a value such as -inf, -1e-3 or -1. is a (bad) number for the option before it, which
        # the option's own check then names; argparse's default takes only -1 and -0.5 as
        # numbers and read the others as unknown options ("expected one argument")
        self._negative_number_matcher = re.compile(
            r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)


def commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``{command: its parser}`` of :func:`build_parser`'s parser."""
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _version() -> str:
    """The course's version and the installed torch's, read without importing torch."""
    from importlib import metadata

    from rlm_course import __version__

    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    return f"rlm_course {__version__} (torch {torch})"


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command (whole option names only: :class:`ExactArgumentParser`)."""
    parser = ExactArgumentParser(prog="python -m rlm_course", description=DESCRIPTION)
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error (also RLM_COURSE_DEBUG=1); "
                             "before or after the command")
    parser.add_argument("--version", action="version", version=_version(),
                        help="show the course's version and torch's, and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    train.add_parsers(sub)
    cluster.add_parsers(sub)
    tools.add_parsers(sub)
    for listed in sub._choices_actions:  # a command's --help opens with what the list says of it
        command = sub.choices[listed.dest]
        if command.description is None:
            command.description = listed.help
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; map the errors a user can fix to one line on stderr and exit code 2.

    With ``--debug`` (or ``RLM_COURSE_DEBUG=1``) errors are raised with their traceback instead:
    what to look at when a message looks like a bug of the course rather than of the input.
    """
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # before the command or among its options
    args, extra = parser.parse_known_args([a for a in argv if a != "--debug"])
    args.debug = debug
    if extra:  # an unknown option of a command: its own usage, not the top-level one
        commands(parser)[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    if args.debug or os.environ.get("RLM_COURSE_DEBUG", "") not in ("", "0"):
        return args.func(args)
    with _notes_as_lines():
        return _run(args)


@contextlib.contextmanager
def _notes_as_lines():
    """Print the course's notes (:class:`rlm_course.utils.Note` warnings) as one ``Note:`` line
    each instead of Python's warning with its file, line and source; other warnings as they are."""
    from rlm_course.utils import Note

    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, Note):
            print(f"Note: {message}", file=sys.stderr)
        else:
            original(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = original


def _run(args) -> int:
    """``args.func(args)`` with the errors a user can fix as one line and exit code 2."""
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
        hint = ("if its run folder holds a checkpoint.pt, continue from it with the same "
                "command plus --resume; if not (stopped before its first checkpoint, e.g. during "
                "the warm start or the first evaluation), run the same command again, with "
                "--overwrite if the folder now holds files"
                if hasattr(args, "resume") else "run the same command again to redo it")
        if args.command == "grade":  # grading writes nothing
            print("\nInterrupted: grading stopped; run the same command again (a check that runs "
                  "past its time limit is stopped and reported on its own).", file=sys.stderr)
            return 130
        print(f"\nInterrupted. Files written so far are kept (checkpoints and stored results are "
              f"written atomically); {hint}.", file=sys.stderr)
        return 130
    except RuntimeError as err:
        if "allocate" in str(err) or "out of memory" in str(err).lower():
            print("error: out of memory; lower --prompts-per-step or --group-size.", file=sys.stderr)
            return 2
        raise
