"""The course's main job: SFT warm start (if needed), then GRPO or PPO, with run files that
survive Ctrl-C.

``python -m rlm_course grpo --task addition`` (with ``--variant``, and ``ppo``) call :func:`run_rl`. A run lives in
``runs/<name>/``:

    metrics.jsonl     one JSON object per step (see RLTrainer.step)
    checkpoint.pt     policy, optimizer, reference, critic and step; rewritten atomically
    summary.json      task, seed, steps, accuracy_before/after, wall_seconds, stage_seconds, and
                      the cost: models held, passes per response (measured and predicted),
                      memory, seconds per step (see :func:`cost_summary`)
    learning_curve.png

The first Ctrl-C finishes the current step, writes the checkpoint and exits; a second one stops
at once, leaving the previous checkpoint. ``--resume`` continues from the checkpoint, dropping any
metrics lines written after it, and repeats the uninterrupted run exactly (same seed, machine and
thread count, same numbers).
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import time
from dataclasses import asdict, fields, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from rlm_course.cost.accounting import (
    measured_model_state_bytes,
    models_held,
    peak_rss_bytes,
    predict_model_state_bytes,
    predict_passes,
)
from rlm_course.devices import device_description, peak_device_memory_bytes, resolve_device
from rlm_course.lm.checkpoint import load_checkpoint, save_checkpoint
from rlm_course.lm.model import ModelConfig
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.algorithms import RLConfig
from rlm_course.rl.evaluate import evaluate
from rlm_course.rl.sft import SFTConfig, default_model_config, run_sft
from rlm_course.rl.trainer import RLTrainer
from rlm_course.tasks.base import Task
from rlm_course.tasks.eval_sets import load_eval_set
from rlm_course.utils import (atomic_write_json, atomic_write_text, data_dir,
                              ensure_writable_folder, seed_everything)
from rlm_course.vocabulary import STAGES


def default_sft_checkpoint(task: Task) -> Path:
    return data_dir() / "checkpoints" / f"sft-{task.key}.pt"


def sft_command(task: Task, seed: int = 0) -> str:
    settings = {k: v for k, v in asdict(task).items() if k not in ("name", "format_weight")}
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in settings.items())
    return f"python -m rlm_course sft --task {task.name} {flags} --seed {seed}".strip()


def make_sft_checkpoint(task: Task, tokenizer: CharTokenizer, path: Path | None = None,
                        config: SFTConfig | None = None, progress: bool = True,
                        device: str = "cpu") -> Path:
    """Run SFT on ``device`` (``"cpu"``, ``"cuda"`` or ``"auto"``) and save the warm-start
    checkpoint (with a JSON note of how it was made, its device among it)."""
    device = resolve_device(device)
    config = config or SFTConfig()
    path = Path(path) if path is not None else default_sft_checkpoint(task)
    if path.is_dir():
        raise ValueError(f"--out {path} is a folder; give a file path such as {path / 'sft.pt'}.")
    # fail before a minute of training, not after
    check_model_for_task(default_model_config(tokenizer, task), tokenizer, task,
                         task.max_response_len, "the course's model")
    ensure_writable_folder(path.parent, "--out")
    start = time.perf_counter()
    model, info = run_sft(task, tokenizer, config, progress=progress, device=device)
    info.update(task=task.key, command=sft_command(task, config.seed),
                seconds=round(time.perf_counter() - start, 1), process_peak_rss=peak_rss_bytes())
    if device != "cpu":  # the CPU warm starts keep their notes as they were
        info.update(device=device_description(device),
                    peak_device_memory=peak_device_memory_bytes(device))
    save_checkpoint(path, model, **info)
    atomic_write_json(path.with_suffix(".json"), info)
    return path


def load_sft_policy(task: Task, tokenizer: CharTokenizer, sft_checkpoint: str | Path | None = None,
                    progress: bool = True, log=print, device: str = "cpu"):
    """The warm-start policy of ``task`` on ``device``: from ``sft_checkpoint``, or from the default
    checkpoint, which is made first (about a minute, on ``device``) if it does not exist.

    Returns:
        ``(model, info)`` with ``info``: checkpoint path, SFT steps, the command that made it.

    Raises:
        ValueError: if an explicit ``sft_checkpoint`` is missing, or a checkpoint is corrupt or
            belongs to another task.
    """
    path = Path(sft_checkpoint) if sft_checkpoint else default_sft_checkpoint(task)
    if not path.exists() and sft_checkpoint is None:
        log(f"No SFT checkpoint at {path}: running the warm start first ({sft_command(task)}; "
            "until validation accuracy reaches "
            f"{SFTConfig().target_accuracy:.0%}, at most {SFTConfig().max_steps} steps: about a "
            "minute for short responses, several for long ones; Ctrl-C stops it and writes "
            "nothing).")
        if progress and sys.stdin is not None and sys.stdin.isatty() and sys.stdout.isatty():
            answer = input("Make the warm start now? [Y/n] ").strip().lower()
            if answer not in ("", "y", "yes"):
                raise ValueError(f"no warm start for {task.key}; make it with `{sft_command(task)}` "
                                 "or pass --sft-checkpoint.")
        make_sft_checkpoint(task, tokenizer, path, progress=progress, device=device)
    loaded = load_checkpoint(path)
    _check_sft_task(loaded, path, task)
    info = {"checkpoint": str(path), "steps": loaded.get("sft_steps"),
            "command": loaded.get("command")}
    return loaded["model"].to(device), info


def _check_sft_task(loaded: dict, path: Path, task: Task) -> None:
    if loaded.get("task") != task.key:
        raise ValueError(f"SFT checkpoint {path} is for task {loaded.get('task')!r}, not "
                         f"{task.key!r}; pass the matching --sft-checkpoint.")


def context_needed(task: Task, max_new_tokens: int) -> int:
    """Positions a generation of ``task`` needs: ``<bos>``, the longest prompt and the response
    budget."""
    return 1 + task.max_prompt_len + max_new_tokens


def check_model_for_task(model_config: ModelConfig, tokenizer: CharTokenizer, task: Task,
                         max_new_tokens: int, source: str, overlong_buffer: int = 0) -> None:
    """Refuse, before anything is trained or deleted, a model that cannot serve ``task``.

    Raises:
        ValueError: if the model's vocabulary differs from the tokenizer's (it was made with
            another tokenizer: its embeddings would be indexed out of range), or if a prompt plus
            the response budget exceeds its ``max_seq_len``; the message names ``source``, both
            sizes and the flags to change.
    """
    if model_config.vocab_size != tokenizer.vocab_size:
        raise ValueError(f"{source}: the model's vocabulary has {model_config.vocab_size} tokens "
                         f"but the tokenizer has {tokenizer.vocab_size}; it was made with another "
                         "tokenizer. Make it again with `python -m rlm_course sft ...` or pass a "
                         "checkpoint of this course version.")
    needed = context_needed(task, max_new_tokens)
    if needed > model_config.max_seq_len:
        budget = (f" ({task.max_response_len} + --overlong-buffer {overlong_buffer})"
                  if overlong_buffer else "")
        flags = task.settings_hint() + (", --overlong-buffer" if overlong_buffer else "")
        raise ValueError(f"task {task.key}: a prompt of up to {1 + task.max_prompt_len} tokens "
                         f"(with <bos>) and a response budget of {max_new_tokens}{budget} "
                         f"need {needed} positions, but {source} has max_seq_len="
                         f"{model_config.max_seq_len}; lower {flags}.")


def _warm_start_config(task: Task, tokenizer: CharTokenizer,
                       sft_checkpoint: str | Path | None) -> tuple[ModelConfig, str]:
    """The model configuration a new run will start from, and where it comes from."""
    path = Path(sft_checkpoint) if sft_checkpoint else default_sft_checkpoint(task)
    if path.exists() or sft_checkpoint is not None:
        loaded = load_checkpoint(path)
        _check_sft_task(loaded, path, task)  # here, before the run's folder is made
        return loaded["model"].config, f"checkpoint {path}"
    return default_model_config(tokenizer, task), "the default model (made by the warm start)"


def check_resumable(state: dict, config: RLConfig, task: Task, path: Path) -> None:
    """Refuse to resume the checkpoint ``state`` (read from ``path``) with ``config`` and
    ``task``: it must hold a run (a trainer's state, not only a warm start's model) of the same
    algorithm, task and options; only ``steps`` may change, and not below the steps done.

    Raises:
        ValueError: naming what differs and how to resume.
    """
    from rlm_course.arguments import flag

    if not isinstance(state.get("trainer"), dict):
        raise ValueError(f"--resume: {path} holds a model but no run to continue (no trainer "
                         "state: a warm start written by `sft`?); start a new run with "
                         "--overwrite, or pass the file as --sft-checkpoint of a run with another "
                         "--name.")
    check_run_state(state, path)
    if state.get("algorithm", "grpo") != config.algorithm:
        ran = state.get("algorithm", "grpo")
        command = "ppo" if ran == "ppo" else f"grpo --variant {ran}"
        raise ValueError(f"--resume: {path} is a {ran} run, not {config.algorithm}; resume it "
                         f"with its own command: python -m rlm_course {command} ... --resume.")
    if state.get("task") != task.key:
        raise ValueError(f"--resume: {path} is a run on task {state.get('task')}, not "
                         f"{task.key}; pass the same task options as the run.")
    # a run saved before a field existed ran with its default
    defaults = {f.name: f.default for f in fields(RLConfig)}
    unknown = sorted(set(state.get("config") or {}) - set(defaults))
    if unknown:
        raise ValueError(f"--resume: {path} was saved with settings this version of the course "
                         f"does not know ({', '.join(unknown)}): it comes from another version; "
                         "resume it with that version, or start the run again with --overwrite.")
    saved, wanted = {**defaults, **(state.get("config") or {})}, asdict(config)
    differ = sorted(k for k in set(saved) | set(wanted)
                    if k != "steps" and saved.get(k) != wanted.get(k))
    if differ:
        changes = ", ".join(f"{flag(k)}: run {saved.get(k)!r}, now {wanted.get(k)!r}"
                            for k in differ)
        raise ValueError(f"--resume: options differ from the run's ({changes}); resume with the "
                         "same options (only --steps may change), or start a new run with --name.")
    done = state["trainer"]["step"]
    if config.steps < done:
        raise ValueError(f"--resume: the run already has {done} steps; pass --steps {done} or more.")


#: What a run writes into its folder (single-process and data-parallel runs); an atomic write's
#: temporary file is ``.<name>.<random>.tmp`` (:func:`rlm_course.utils.atomic_write_bytes`).
RUN_FILES = ("checkpoint.pt", "metrics.jsonl", "summary.json", "learning_curve.png",
             "timeline.json", "timeline.png", "failure.log")


def foreign_files(run_dir: Path) -> list[str]:
    """The entries of ``run_dir`` a run does not write (sorted; folders end with ``/``): files
    ``--overwrite`` must not delete."""
    if not run_dir.is_dir():
        return []
    return sorted(p.name + ("/" if p.is_dir() else "") for p in run_dir.iterdir()
                  if not (p.name in RUN_FILES and p.is_file())
                  and not (p.name.startswith(".") and p.name.endswith(".tmp") and p.is_file()))


def check_run_state(state: dict, path: Path) -> None:
    """Refuse a run checkpoint whose entries are missing or of the wrong kind (a damaged file
    without a digest, or one from another version of the course), before anything is resumed.

    Raises:
        ValueError: naming the entry and how to recover.
    """
    trainer = state.get("trainer") if isinstance(state.get("trainer"), dict) else {}
    step = trainer.get("step")
    accuracy = state.get("accuracy_before")
    problems = []
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        problems.append(f"trainer step {step!r} (an integer >= 0)")
    if not isinstance(trainer.get("optimizer"), dict):
        problems.append("the optimizer's state")
    if isinstance(accuracy, bool) or not isinstance(accuracy, (int, float)) \
            or not 0.0 <= accuracy <= 1.0:
        problems.append(f"accuracy_before {accuracy!r} (a share in [0, 1])")
    if not isinstance(state.get("totals"), dict):
        problems.append("the run's totals")
    if "sft" not in state:
        problems.append("the warm start's record (sft)")
    if not isinstance(state.get("config", {}), dict):
        problems.append("the run's options (config)")
    if problems:
        raise ValueError(f"--resume: {path} is missing, or holds an invalid value for: "
                         f"{'; '.join(problems)}. The file is damaged or from another version of "
                         "the course; start the run again with --overwrite.")


def load_trainer_state(trainer, state: dict, path: Path) -> None:
    """``trainer.load_state_dict(state)``, with a damaged state (tensors of the wrong shape, a
    missing entry) refused by name instead of failing inside torch.

    Raises:
        ValueError: naming the file and how to recover.
    """
    try:
        trainer.load_state_dict(state)
    except (KeyError, TypeError, RuntimeError, ValueError, IndexError) as err:
        why = f"no {err.args[0]!r} entry" if isinstance(err, KeyError) else \
            " ".join(str(err).split())[:200]
        raise ValueError(f"--resume: the trainer state in {path} does not load ({why}): the file "
                         "is damaged or from another version of the course; start the run again "
                         "with --overwrite.") from None
    for role in ("reference", "critic"):
        module = getattr(trainer, role, None)
        if module is not None and not all(torch.isfinite(p).all() for p in module.parameters()):
            raise ValueError(f"--resume: the {role} model in {path} holds NaN or inf weights: the "
                             "file is damaged; start the run again with --overwrite.")
    # torch loads an optimizer state of any shape or value: Adam would fail at the first step, or
    # a NaN moment would look like a diverged run
    for optimizer in (trainer.optimizer, getattr(trainer, "critic_optimizer", None)):
        if optimizer is None:
            continue
        for group in optimizer.param_groups:
            for param in group["params"]:
                for key, value in optimizer.state.get(param, {}).items():
                    if not isinstance(value, torch.Tensor):
                        continue
                    if value.dim() and value.shape != param.shape:
                        why = (f"its {key} has shape {tuple(value.shape)} for a parameter of "
                               f"shape {tuple(param.shape)}")
                    elif not torch.isfinite(value).all():
                        why = f"its {key} holds NaN or inf"
                    else:
                        continue
                    raise ValueError(f"--resume: the optimizer state in {path} is damaged ({why}); "
                                     "start the run again with --overwrite.")


def check_run_folder(run_dir: Path, resume: bool = False, overwrite: bool = False,
                     sft_checkpoint: str | Path | None = None) -> None:
    """Refuse what the run folder and the flags cannot do together (nothing is read or written
    besides listing the folder).

    Raises:
        ValueError: ``resume`` with ``overwrite`` or an ``sft_checkpoint``; ``resume`` without a
            checkpoint; a folder that holds files, without ``resume`` or ``overwrite``; a folder
            holding files a run does not write (``--overwrite`` would delete them); the old run
            an earlier ``--overwrite`` set aside and never replaced (:class:`SetAside`); an
            ``sft_checkpoint`` inside the folder ``overwrite`` replaces.
    """
    ckpt = run_dir / "checkpoint.pt"
    has_files = run_dir.is_dir() and any(run_dir.iterdir())
    backup = SetAside.backup_of(run_dir)
    if backup.exists():
        raise ValueError(SetAside.stranded_message(run_dir, backup))
    foreign = foreign_files(run_dir)
    if foreign and not resume:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5
                                          else "")
        raise ValueError(f"run folder {run_dir} holds files a run does not write ({shown}): it "
                         "is not a run's folder, and --overwrite would delete them; nothing was "
                         "changed. Choose another --name (or --out), or move those files away.")
    if resume and overwrite:
        raise ValueError("--resume continues a run and --overwrite deletes it: pass only one.")
    if resume and sft_checkpoint is not None:
        raise ValueError("--sft-checkpoint is not used with --resume (the run's checkpoint holds "
                         "the policy); drop one of them.")
    if overwrite and has_files and sft_checkpoint is not None \
            and Path(sft_checkpoint).resolve().is_relative_to(run_dir.resolve()):
        raise ValueError(f"--sft-checkpoint {sft_checkpoint} lies inside the run folder {run_dir} "
                         "that --overwrite replaces (the run would start without it); copy it "
                         "out first (e.g. to runs/warm-start.pt) and pass the copy, or choose "
                         "another --name; nothing was changed.")
    if resume and not ckpt.exists():
        hint = (" It holds files of a run that stopped before its first checkpoint: start it again "
                "with --overwrite." if has_files else " Start it without --resume.")
        raise ValueError(f"--resume: no run to resume at {run_dir} (no checkpoint.pt).{hint}")
    if not resume and has_files and not overwrite:
        what = ("a run; pass --resume to continue it, " if ckpt.exists() else
                "files of a run that stopped before its first checkpoint; pass ")
        raise ValueError(f"run folder {run_dir} already holds {what}--overwrite to start it again "
                         "from scratch, or --name for a new run.")


#: characters Windows refuses in a file name (and that shells treat specially elsewhere), and
#: the names it keeps for devices (with any extension)
_NOT_IN_NAMES = frozenset('<>:"|?*')
_RESERVED_NAMES = frozenset(["CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(1, 10)),
                             *(f"LPT{i}" for i in range(1, 10))])
#: the longest run name in bytes: folder names stop at 255, and --overwrite's hidden copy adds 10
MAX_NAME = 200


def process_count_note(ran: int, now: int, step: int, more: str = "") -> str | None:
    """The note a resumed run gives when it runs on ``now`` processes where the run used ``ran``
    (its checkpoint's ``world_size``): it continues from ``step`` with other samples than an
    uninterrupted run (``more``: a clause to add); None when the counts agree."""
    if ran == now:
        return None
    return (f"Note: the run used {ran} process{'es' if ran != 1 else ''}, this one {now}: it "
            f"continues from step {step}, but with other samples than an uninterrupted run (pass "
            f"--nproc {ran} to repeat it exactly){more}.")


def warmup_note(config) -> str | None:
    """The note a new run starts with when its warm-up (``config.warmup_steps``) is longer than
    the run (``config.steps``): its learning rate then only rises, to ``steps / warmup_steps`` of
    ``config.lr`` (:meth:`~rlm_course.algorithms.RLConfig.lr_at`); None otherwise."""
    if config.warmup_steps <= config.steps:
        return None
    hint = (f" (a --warmup-steps below {config.steps} gives a warm-up and then a decay)"
            if config.steps > 1 else "")
    return (f"Note: --warmup-steps {config.warmup_steps} is longer than --steps {config.steps}: "
            f"the learning rate only rises, to {config.steps}/{config.warmup_steps} of --lr "
            f"{config.lr:g}, and never decays{hint}.")


#: The learning rate above which a new run says its policy will likely collapse: on addition,
#: 1e-3 without warm-up already takes the policy from 23% to under 1% held-out accuracy in 6 steps
#: (0.9: to 0%), where the course runs at 3e-4 with a warm-up.
HIGH_LR = 1e-2


def start_notes(config) -> list[str]:
    """What a new run says about its configuration before it starts: a warm-up longer than the
    run (:func:`warmup_note`), and a policy learning rate above :data:`HIGH_LR`."""
    notes = [warmup_note(config)]
    if config.lr > HIGH_LR:
        notes.append(f"Note: --lr {config.lr:g} is far above the course's 3e-4: Adam moves every "
                     "weight by about --lr a step, so the policy will likely collapse within a "
                     "few steps (on addition 1e-3 without warm-up already takes it from 23% to "
                     "under 1% in 6 steps); RL fine-tuning of LLMs uses 1e-6 to 1e-5.")
    return [n for n in notes if n]


def run_folder(out_dir: str | Path, name: str) -> Path:
    """``out_dir / name``, the folder of a run, after checking both.

    Raises:
        ValueError: for a name that is not a plain folder name (a hidden one among them: the
            names ``--overwrite`` sets runs aside under start with a dot), or an ``out_dir`` that
            is a file.
    """
    if not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ValueError(f"--name {name!r}: give a plain folder name (not empty, . or .., no "
                         "slashes), e.g. my-run; use --out to choose the parent folder.")
    size = len(name.encode("utf-8", "surrogateescape"))  # the limit counts bytes
    if size > MAX_NAME:
        raise ValueError(f"--name of {size} bytes: give at most {MAX_NAME} (a folder name has a "
                         "length limit, and --overwrite adds a few), e.g. my-run.")
    odd = sorted({c for c in name if c in _NOT_IN_NAMES or ord(c) < 32})
    what = (f"the character(s) {''.join(odd)!r}" if odd
            else "spaces at its start or end" if name != name.strip()
            else "a dot at its end" if name.endswith(".")
            else "a dash at its start (commands such as rm and ls read it as an option)"
            if name.startswith("-")
            else "a name Windows reserves for a device"
            if name.split(".")[0].upper() in _RESERVED_NAMES
            else "a dot at its start (hidden, and .<run>.replaced is where --overwrite sets a run "
                 "aside)" if name.startswith(".") else None)
    if what:
        raise ValueError(f"--name {name!r} has {what}, which some systems do not allow in a "
                         "folder name or the course keeps for itself; use letters, digits, - _ "
                         "and ., e.g. my-run.")
    if not str(out_dir).strip():
        raise ValueError("--out '': give a folder for the runs (default runs; . for this one).")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"--out {out_dir} is a file, not a folder; pass a folder (default runs).")
    if (out_dir / name).exists() and not (out_dir / name).is_dir():
        raise ValueError(f"--name {name}: {out_dir / name} is a file, not a run's folder; choose "
                         "another --name.")
    return out_dir / name


class SetAside:
    """``--overwrite``: the old run's folder is moved aside, not deleted, until the new run has
    written its first checkpoint (:meth:`commit`); an error or a Ctrl-C before that puts it back,
    so a failed start never costs an existing run."""

    def __init__(self, run_dir: Path, active: bool) -> None:
        self.run_dir, self.active, self.backup = run_dir, active, None

    @staticmethod
    def backup_of(run_dir: Path) -> Path:
        """Where ``--overwrite`` keeps the old run of ``run_dir`` until the new one's first
        checkpoint."""
        return run_dir.with_name(f".{run_dir.name}.replaced")

    @staticmethod
    def stranded_message(run_dir: Path, backup: Path) -> str:
        return (f"{backup} holds the run an earlier --overwrite of {run_dir} set aside and never "
                "replaced (that run was killed before its first checkpoint); nothing was "
                f"changed. To keep the old run: rm -r {run_dir} && mv {backup} {run_dir}; to "
                f"drop it: rm -r {backup}; then run again.")

    def __enter__(self):
        if self.active:
            self.backup = backup = self.backup_of(self.run_dir)
            if backup.exists():  # an earlier --overwrite was killed before its first checkpoint
                self.backup = None
                raise ValueError(self.stranded_message(self.run_dir, backup))
            self.run_dir.rename(self.backup)
            self.run_dir.mkdir()
        return self

    def commit(self) -> None:
        if self.backup is not None:
            shutil.rmtree(self.backup, ignore_errors=True)
            self.backup = None

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and self.backup is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.backup.rename(self.run_dir)
        return False


class _GracefulInterrupt:
    """First SIGINT (Ctrl-C) or SIGTERM (a job scheduler's stop, ``kill``): set a flag (stop
    after this step, with a checkpoint). Second: raise KeyboardInterrupt."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict = {}

    def __enter__(self):
        for sig in self.SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not in the main thread (some notebook runners): default handling
                pass
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        what = "Interrupt" if signum == signal.SIGINT else f"{signal.Signals(signum).name}"
        print(f"\n{what}: finishing this step and saving a checkpoint (Ctrl-C again to stop now).",
              file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        return False


def read_metrics(path: Path, up_to_step: int, log=None) -> list[dict]:
    """The rows of a run's ``metrics.jsonl`` up to ``up_to_step`` (the checkpoint's), one per
    step. A line that is not a JSON row with an integer step (the last line cut by a hard kill,
    or a damaged one) is left out, and only that line: ``log`` (if given) names the damaged
    ones; a step written twice keeps its last row."""
    rows: dict[int, dict] = {}
    if not path.exists():
        return []
    lines = path.read_text(errors="replace").splitlines()
    bad = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        step = row.get("step") if isinstance(row, dict) else None
        if isinstance(step, bool) or not isinstance(step, int):
            if number < len(lines) and line.strip():  # a cut last line is the usual hard kill
                bad.append(number)
            continue
        if step <= up_to_step:
            rows[step] = row
    if bad and log is not None:
        log(f"Note: {path} had {len(bad)} damaged line(s) (line {', '.join(map(str, bad[:5]))}"
            f"{', ...' if len(bad) > 5 else ''}), left out; the steps of its other lines are kept.")
    return [rows[k] for k in sorted(rows)]


def cost_summary(trainer: RLTrainer, wall_seconds: float) -> dict:
    """What the run cost: models held, forward/backward passes per response (measured by hooks and
    predicted by :func:`rlm_course.cost.accounting.predict_passes`), memory and seconds per step.

    ``memory_bytes``: ``model_states`` measured on the tensors (and predicted), ``peak_activations``
    measured by autograd's saved-tensor hooks, ``peak_kv_cache`` the size of the largest KV cache
    generation allocated (from its shape), ``process_peak_rss`` the process's high-water mark.
    ``seconds_per_step`` is wall time per step, including the periodic held-out evaluation.
    A step whose batch is empty (DAPO found no group with signal) runs no scoring or training."""
    config = trainer.config
    generated, trained = trainer.responses["generated"], trainer.responses["trained"]
    held = {"policy": (trainer.policy, trainer.optimizer),
            "critic": (trainer.critic, trainer.critic_optimizer),
            "reference": (trainer.reference, None)}
    measured = {name: measured_model_state_bytes(model, opt) for name, (model, opt) in held.items()
                if model is not None}
    counts = {}
    for name, (model, opt) in held.items():
        if model is not None:
            params = [p for p in model.parameters() if p.requires_grad or opt is None]
            counts[name] = (sum(p.numel() for p in params), len(params))
    predicted = predict_model_state_bytes(counts, {n: held[n][1] is not None for n in counts})
    steps = max(trainer.step_count, 1)
    return {
        "models": models_held(config),
        "responses_generated": generated,
        "responses_trained": trained,
        "passes_per_response": trainer.passes.per_sample(generated, trained),
        "passes_per_response_predicted": predict_passes(config),
        "decode_steps_per_response": round(trainer.passes.decode_tokens / max(generated, 1), 3),
        "memory_bytes": {
            "model_states": measured,
            "model_states_predicted": predicted,
            "peak_activations": trainer.activations.peak_bytes,
            "peak_kv_cache": trainer.peak_kv_cache_bytes,
            "process_peak_rss": peak_rss_bytes(),
            **({"peak_device_memory": peak} if (peak := peak_device_memory_bytes(
                trainer.device)) is not None else {}),
        },
        "seconds_per_step": round(wall_seconds / steps, 4),
    }


def run_rl(task: Task, config: RLConfig, name: str | None = None, out_dir: str | Path = "runs",
             resume: bool = False, overwrite: bool = False, sft_checkpoint: str | Path | None = None,
             checkpoint_every: int = 10, progress: bool = True, log=print,
             device: str = "cpu") -> dict:
    """SFT warm start (made if the default checkpoint is missing), then ``config.steps`` steps of
    the algorithm ``config`` describes (any preset of :mod:`rlm_course.rl.algorithms`), on
    ``device`` (``"cpu"``, ``"cuda"``, or ``"auto"``: CUDA when there is a GPU; recorded in the
    summary and the checkpoint).

    Returns:
        The summary dict, also written to ``runs/<name>/summary.json``.

    Every check runs before anything is trained, made or deleted: the task's problem space,
    the model's vocabulary and context against the task's prompts and response budget, a writable
    run folder. With ``overwrite``, the old run is only set aside until the new run's first
    checkpoint, so an error never costs it.

    Raises:
        ValueError: ``--resume`` with no checkpoint in the run folder; an existing finished run
            without ``overwrite``; a missing or corrupt ``sft_checkpoint``; a checkpoint whose task,
            settings, vocabulary or context do not fit this run; a task with too few distinct
            problems; a run folder that cannot be written.
    """
    if checkpoint_every <= 0:
        raise ValueError(f"checkpoint_every={checkpoint_every} must be positive.")
    device = resolve_device(device)
    if resume and overwrite:  # before the folder is named or made
        raise ValueError("--resume continues a run and --overwrite deletes it: pass only one.")
    tokenizer = CharTokenizer()
    run_dir = run_folder(out_dir, name if name is not None
                         else f"{config.algorithm}-{task.key}-seed{config.seed}")
    ckpt_path = run_dir / "checkpoint.pt"
    check_run_folder(run_dir, resume, overwrite, sft_checkpoint)
    has_files = run_dir.is_dir() and any(run_dir.iterdir())
    state = None
    # everything that can be checked is checked before anything is trained, made or deleted
    eval_problems = load_eval_set(task)  # at once if the task has too few distinct problems
    task.check_problem_space(len(eval_problems) + config.prompts_per_step,
                             "the held-out set plus one step's prompts")
    max_new_tokens = task.max_response_len + config.overlong_buffer
    if resume:
        state = load_checkpoint(ckpt_path)
        check_resumable(state, config, task, ckpt_path)
        model_config, source = state["model"].config, f"checkpoint {ckpt_path}"
    else:
        model_config, source = _warm_start_config(task, tokenizer, sft_checkpoint)
    check_model_for_task(model_config, tokenizer, task, max_new_tokens, source,
                         config.overlong_buffer)
    ensure_writable_folder(run_dir, "--out")

    setup_start = time.perf_counter()
    with SetAside(run_dir, active=overwrite and has_files and not resume) as aside:
        return _train(task, config, tokenizer, run_dir, eval_problems, state if resume else None,
                      sft_checkpoint, aside, setup_start, checkpoint_every, progress, log, device)


def _train(task: Task, config: RLConfig, tokenizer: CharTokenizer, run_dir: Path,
           eval_problems: list, state: dict | None, sft_checkpoint, aside: SetAside,
           setup_start: float, checkpoint_every: int, progress: bool, log,
           device: str = "cpu") -> dict:
    """The run itself, once :func:`run_rl` has checked everything it can."""
    ckpt_path, metrics_path = run_dir / "checkpoint.pt", run_dir / "metrics.jsonl"
    summary_path = run_dir / "summary.json"
    resume = state is not None
    if resume:
        policy, accuracy_before = state["model"].to(device), state["accuracy_before"]
        sft_info = state["sft"]
        log(f"Resuming {run_dir} from step {state['trainer']['step']}.")
        ran_on = state.get("device", "cpu")
        if ran_on != device:
            log(f"Note: the run ran on {ran_on}, this process on {device}: it continues from the "
                "checkpoint, with other random draws and rounding than an uninterrupted run "
                f"(pass --device {ran_on} to repeat it exactly).")
        note = process_count_note(state.get("world_size", 1), 1, state["trainer"]["step"],
                                  "; its timeline.json and timeline.png keep the steps its "
                                  "processes ran")
        if note:
            log(note)
        threads = state.get("threads")
        if threads is not None and threads != torch.get_num_threads():
            log(f"Note: the run used {threads} CPU threads, this process {torch.get_num_threads()}: "
                "the numbers will differ in the last bits from an uninterrupted run (pass "
                f"--threads {threads} to repeat it exactly).")
    else:
        for note in start_notes(config):
            log(note)
        policy, sft_info = load_sft_policy(task, tokenizer, sft_checkpoint, progress, log, device)
        accuracy_before = evaluate(policy, task, eval_problems, tokenizer).accuracy

    seed_everything(config.seed)
    trainer = RLTrainer(policy, task, tokenizer, config, eval_problems)
    totals = {"wall_seconds": 0.0, **{s: 0.0 for s in STAGES}, "tokens_generated": 0}
    if resume:
        load_trainer_state(trainer, state["trainer"], run_dir / "checkpoint.pt")
        totals.update(state["totals"])
    metrics = read_metrics(metrics_path, trainer.step_count, log)
    if resume and len(metrics) < trainer.step_count:
        log(f"Note: {metrics_path} holds {len(metrics)} of the {trainer.step_count} steps done "
            "(the file was shortened or deleted): the learning curve and the summary's metrics "
            "cover only those.")
    saved_steps = ((state or {}).get("config") or {}).get("steps") if resume else None
    try:
        planned = (replace(config, steps=saved_steps)
                   if saved_steps is not None and saved_steps != config.steps else None)
    except (TypeError, ValueError):  # a damaged count: the resume's own checks name the rest
        planned = None
    if planned is not None:
        now = config.lr_at(trainer.step_count + 1)
        before = planned.lr_at(min(trainer.step_count + 1, saved_steps))
        log(f"Note: --steps {config.steps} where the run planned {saved_steps}: the learning-rate "
            f"schedule decays to step {config.steps} now, so step {trainer.step_count + 1} runs "
            f"at {now:.3g} (the planned schedule: {before:.3g}).")
    atomic_write_text(metrics_path, "".join(json.dumps(m) + "\n" for m in metrics))
    setup_seconds = time.perf_counter() - setup_start
    log(f"Held-out greedy accuracy before {config.algorithm.upper()}: {accuracy_before:.1%} "
        f"({len(eval_problems)} problems of {task.key})")

    def save() -> None:
        save_checkpoint(ckpt_path, policy, task=task.key, algorithm=config.algorithm,
                        config=asdict(config),
                        trainer=trainer.state_dict(), totals=totals, sft=sft_info,
                        accuracy_before=accuracy_before, threads=torch.get_num_threads(),
                        device=device)
        aside.commit()  # the new run has a checkpoint: the replaced one can go

    bar = tqdm(total=config.steps, initial=trainer.step_count,
               desc=f"{config.algorithm.upper()} {task.key}",
               disable=not progress)
    interrupted = False
    with _GracefulInterrupt() as interrupt, open(metrics_path, "a") as metrics_file:
        while trainer.step_count < config.steps:
            start = time.perf_counter()
            row = trainer.step()
            totals["wall_seconds"] += time.perf_counter() - start
            for s in STAGES:
                totals[s] += row[f"seconds_{s}"]
            totals["tokens_generated"] += row["tokens_generated"]
            metrics.append(row)
            metrics_file.write(json.dumps(row) + "\n")
            metrics_file.flush()
            postfix = {"reward": f"{row['reward_mean']:.2f}", "kl": f"{row['kl']:.3f}"}
            if "accuracy_eval" in row:
                postfix["eval_acc"] = f"{row['accuracy_eval']:.2f}"
            bar.set_postfix(postfix)
            bar.update(1)
            done = trainer.step_count == config.steps
            if done or trainer.step_count % checkpoint_every == 0 or interrupt.requested:
                save()
            if interrupt.requested and not done:
                interrupted = True
                break
    bar.close()
    if interrupted:
        log(f"Stopped at step {trainer.step_count}; checkpoint and metrics are in {run_dir}. "
            "Continue by running the same command with --resume (and without --overwrite).")
        return {"interrupted": True, "step": trainer.step_count, "run_dir": str(run_dir)}

    accuracy_after = evaluate(policy, task, eval_problems, tokenizer).accuracy
    summary = {
        "task": task.key,
        "algorithm": config.algorithm,
        "seed": config.seed,
        "steps": config.steps,
        "accuracy_before": accuracy_before,
        "accuracy_after": accuracy_after,
        "accuracy_gain_points": round(100 * (accuracy_after - accuracy_before), 1),
        "wall_seconds": round(totals["wall_seconds"], 2),
        "threads": torch.get_num_threads(),
        "device": device_description(device),
        "setup_seconds": round(setup_seconds, 2),
        "stage_seconds": {s: round(totals[s], 2) for s in STAGES},
        "tokens_generated": totals["tokens_generated"],
        "eval_problems": len(eval_problems),
        "config": asdict(config),
        "sft": sft_info,
        "model_parameters": policy.num_parameters(),
        "cost": cost_summary(trainer, totals["wall_seconds"]),
    }
    atomic_write_json(summary_path, summary)
    from rlm_course.tools.plots import (
        plot_learning_curve,  # matplotlib import only when a run finishes
    )

    plot_learning_curve(metrics, run_dir / "learning_curve.png", accuracy_before=accuracy_before,
                        title=f"{config.algorithm.upper()} on {task.key}")
    log(f"Held-out greedy accuracy: {accuracy_before:.1%} -> {accuracy_after:.1%} "
        f"({summary['accuracy_gain_points']:+.1f} points) in {summary['wall_seconds']:.1f} s of "
        f"{config.algorithm.upper()} "
        "(" + ", ".join(f"{s} {totals[s]:.1f} s" for s in STAGES) + f"). Run files: {run_dir}/")
    return summary
