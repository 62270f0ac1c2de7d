"""The main job end to end: learning, Ctrl-C and --resume, and bad input."""

import functools
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlm_course.cli import main
from rlm_course.rl.algorithms import GRPOConfig
from rlm_course.rl.runs import run_rl
from rlm_course.tasks import get_task
from rlm_course.utils import repo_root

ROOT = repo_root()
TASK = get_task("addition", digits=3)


@pytest.mark.slow
def test_short_grpo_run_raises_held_out_accuracy(tmp_path):
    summary = run_rl(TASK, GRPOConfig(steps=40, eval_every=20, seed=0), out_dir=tmp_path,
                       progress=False, log=lambda *a: None)
    assert 0.1 <= summary["accuracy_before"] <= 0.4  # the committed warm start: weak, not hopeless
    assert summary["accuracy_after"] >= summary["accuracy_before"] + 0.05
    run = tmp_path / "grpo-addition-3-seed0"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 41))
    for key in ("reward_mean", "kl", "clip_fraction", "entropy", "response_length",
                "seconds_generation", "seconds_reward", "seconds_scoring", "seconds_training"):
        assert all(key in r for r in rows), key
    assert [r["step"] for r in rows if "accuracy_eval" in r] == [20, 40]
    saved = json.loads((run / "summary.json").read_text())
    for key in ("task", "seed", "steps", "accuracy_before", "accuracy_after", "wall_seconds",
                "stage_seconds", "tokens_generated"):
        assert key in saved
    assert set(saved["stage_seconds"]) == {"generation", "reward", "scoring", "training"}
    assert saved["tokens_generated"] == sum(r["tokens_generated"] for r in rows)
    assert (run / "learning_curve.png").stat().st_size > 10_000


SMALL = ["--prompts-per-step", "8", "--group-size", "4", "--eval-every", "3"]
DETERMINISTIC = ("reward_mean", "kl", "policy_loss", "value_loss", "entropy", "tokens_generated",
                 "responses_generated", "accuracy_eval")


def _cli(args, algorithm="grpo", **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "rlm_course", *algorithm.split(), "--task", "addition",
                             "--no-progress", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kw)


def _rows(path):
    return [{k: r.get(k) for k in ("step",) + DETERMINISTIC}
            for r in map(json.loads, path.read_text().splitlines())]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "grpo --variant dapo"])
def test_ctrl_c_keeps_checkpoint_and_resume_repeats_the_uninterrupted_run(tmp_path, algorithm):
    cli = functools.partial(_cli, algorithm=algorithm)
    # the uninterrupted run and the one to interrupt run side by side (one thread each)
    full = cli(["--steps", "30", "--out", str(tmp_path), "--name", "full", *SMALL])
    try:  # the uninterrupted run is collected even when a check on the other one fails
        part = cli(["--steps", "30", "--out", str(tmp_path), "--name", "cut", *SMALL])
        metrics = tmp_path / "cut" / "metrics.jsonl"
        deadline = time.time() + 120
        while time.time() < deadline and (not metrics.exists()
                                          or len(metrics.read_text().splitlines()) < 4):
            time.sleep(0.05)
        part.send_signal(signal.SIGINT)
        out = part.communicate(timeout=120)[0]
        assert part.returncode == 130, out
        assert "same command with --resume" in out
        stopped = _rows(metrics)
        assert 4 <= len(stopped) < 30
        assert (tmp_path / "cut" / "checkpoint.pt").exists()
        assert not (tmp_path / "cut" / "summary.json").exists()
    finally:
        out = full.communicate(timeout=300)[0]
    assert full.returncode == 0, out

    resumed = cli(["--steps", "30", "--out", str(tmp_path), "--name", "cut", "--resume", *SMALL])
    out = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, out
    assert f"from step {len(stopped)}" in out
    assert _rows(metrics) == _rows(tmp_path / "full" / "metrics.jsonl")
    a = json.loads((tmp_path / "cut" / "summary.json").read_text())
    b = json.loads((tmp_path / "full" / "summary.json").read_text())
    assert (a["accuracy_before"], a["accuracy_after"], a["tokens_generated"]) == \
           (b["accuracy_before"], b["accuracy_after"], b["tokens_generated"])


@pytest.mark.parametrize("args,message", [
    (["--task", "chess"], "unknown task 'chess'"),
    (["--task", "addition", "--group-size", "1"], "--group-size 1 with --advantage group"),
    (["--task", "addition", "--steps", "0"], "--steps 0 must be a positive integer"),
    (["--task", "addition", "--digits", "0"], "--digits 0 must be an integer in 1..9"),
    (["--task", "scratchpad", "--decay", "nan"], "--decay nan must be in (0, 1]"),
    (["--task", "addition", "--variant", "ppo", "--lam", "2"], "error: --lam 2.0 must be in"),
    (["--task", "addition", "--decay", "0.5"], "(its settings: --digits)"),
    (["--task", "countdown", "--digits", "3"], "--digits does not apply to task 'countdown'"),
    (["--task", "addition", "--sft-checkpoint", "nowhere.pt"], "nowhere.pt does not exist"),
    (["--task", "addition", "--resume", "--name", "never-ran"], "no run to resume"),
    (["--task", "addition", "--lr", "inf"], "--lr inf must be a positive finite number"),
    (["--task", "addition", "--lr", "-1"], "--lr -1.0 must be a positive finite number"),
    (["--task", "addition", "--lr", "1e6"], "far too large"),
    (["--task", "addition", "--kl-coef", "nan"], "--kl-coef nan"),
    (["--task", "addition", "--group-size", "100000"], "lower --prompts-per-step or --group-size"),
    (["--task", "addition", "--minibatches", "3"], "--minibatches 3 does not divide the batch of 512"),
    (["--task", "addition", "--seed", "-1"], "--seed -1"),
    (["--task", "addition", "--name", "../escape"], "plain folder name"),
    (["--task", "addition", "--name", ""], "plain folder name"),
    (["--task", "addition", "--name", "run:1?"], "--name 'run:1?' has the character(s) ':?'"),
    (["--task", "addition", "--name", "a\tb"], "has the character"),
    (["--task", "addition", "--name", " run"], "spaces at its start or end"),
    (["--task", "addition", "--name", "..."], "a dot at its end"),
    (["--task", "addition", "--name", "con.txt"], "a name Windows reserves for a device"),
    # the name --overwrite sets a run aside under: the real run was then blocked, and the advice
    # printed for it deleted the run
    (["--task", "addition", "--name", ".grpo-addition-3-seed0.replaced"], "a dot at its start"),
    (["--task", "addition", "--name", ".hidden"], "a dot at its start"),
    (["--task", "addition", "--name=-dash"], "--name '-dash' has a dash at its start"),
    (["--task", "addition", "--name", "x" * 201], "--name of 201 bytes: give at most 200"),
    (["--task", "addition", "--name", "é" * 101], "--name of 202 bytes: give at most 200"),
    (["--task", "addition", "--name", "."], "not empty, . or .., no slashes"),
    (["--task", "addition", "--resume", "--overwrite"], "pass only one"),
    (["--task", "addition", "--resume", "--sft-checkpoint", "x.pt"], "not used with --resume"),
    (["--task", "addition", "--advantage", "gae"], "--advantage gae needs a critic"),
    (["--task", "addition", "--variant", "dapo", "--clip-eps-high", "0.1"],
     "--clip-eps-high 0.1 < --clip-eps 0.2"),
    (["--task", "addition", "--variant", "ppo", "--ratio-level", "sequence"],
     "--ratio-level sequence with --advantage gae"),
    (["--task", "addition", "--variant", "reinforce_pp", "--advantage", "rloo"],
     "--group-size 1 with --advantage rloo"),
    (["--task", "addition", "--variant", "dapo", "--kl-coef", "0.1"], "--kl-mode none"),
    (["--task", "addition", "--kl-mode", "loss", "--kl-estimator", "k1"], "expected gradient"),
    (["--task", "addition", "--gamma", "0.5"], "--gamma has no effect"),
    (["--task", "addition", "--variant", "rloo", "--no-normalize-std"], "--normalize-std has no"),
    (["--task", "addition", "--critic-lr", "0.01"], "only PPO's critic"),
    (["--task", "addition", "--max-sampling-rounds", "2"], "dynamic sampling, which is off"),
    (["--task", "addition", "--variant", "gspo", "--kl-estimator", "k2"], "no KL term is on"),
    (["--task", "addition", "--clip-eps", "1.5"], "would not be positive"),
    (["--task", "addition", "--clip-eps-high", "nan"], "--clip-eps-high nan must be a positive"),
    # a problem space smaller than what is asked of it: an error at once, not an endless loop
    (["--task", "addition", "--digits", "1"], "at most 100 distinct problems"),
    (["--task", "scratchpad", "--max-digits", "1"], "scratchpad-1 has at most 100 distinct problems"),
    (["--task", "countdown", "--n-numbers", "2", "--max-number", "2", "--max-target", "1"],
     "at most 4 distinct problems"),
    # prompt + response longer than the model's context: named before anything is loaded or made
    (["--task", "addition", "--variant", "dapo", "--overlong-buffer", "40"],
     "need 54 positions, but checkpoint"),
    (["--task", "countdown", "--n-numbers", "6", "--max-number", "999"],
     "lower --n-numbers, --max-number, --max-target"),
])
def test_bad_input_is_a_clear_error(args, message, tmp_path, capsys):
    assert main(["grpo", *args, "--out", str(tmp_path), "--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_out_must_be_a_folder(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    assert main(["grpo", "--task", "addition", "--out", str(afile), "--no-progress"]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert main(["sft", "--task", "addition", "--out", str(tmp_path), "--no-progress"]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert afile.read_text() == "keep me"
    assert main(["grpo", "--task", "addition", "--out", str(tmp_path), "--name", "afile",
                 "--no-progress"]) == 2
    assert f"--name afile: {afile} is a file, not a run's folder" in capsys.readouterr().err
    assert main(["grpo", "--task", "addition", "--out", "", "--no-progress"]) == 2
    assert "--out '': give a folder" in capsys.readouterr().err
    assert afile.read_text() == "keep me"


def test_eval_checks_the_task_and_arguments(capsys):
    ckpt = str(ROOT / "data" / "checkpoints" / "sft-addition-3.pt")
    assert main(["eval", "--task", "addition", "--checkpoint", ckpt, "--show", "2"]) == 0
    assert "accuracy 23.0%" in capsys.readouterr().out
    assert main(["eval", "--task", "addition", "--digits", "2", "--checkpoint", ckpt]) == 2
    assert "trained on addition-3, not addition-2" in capsys.readouterr().err
    assert main(["eval", "--task", "addition", "--checkpoint", ckpt, "--show", "-1"]) == 2
    assert main(["eval", "--task", "addition", "--checkpoint", str(ROOT / "data")]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_corrupt_checkpoint_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    assert main(["grpo", "--task", "addition", "--sft-checkpoint", str(bad), "--out",
                 str(tmp_path), "--no-progress"]) == 2
    assert "corrupt" in capsys.readouterr().err
    assert main(["eval", "--task", "addition", "--checkpoint", str(bad)]) == 2


def test_existing_run_is_not_overwritten_by_accident(tmp_path, capsys):
    run = tmp_path / "mine"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    assert main(["grpo", "--task", "addition", "--out", str(tmp_path), "--name", "mine",
                 "--no-progress"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_a_failed_overwrite_never_costs_the_existing_run(tmp_path, capsys, monkeypatch):
    assert main(["grpo", "--task", "addition", "--steps", "1", "--out", str(tmp_path),
                 "--name", "mine", "--no-progress", *SMALL]) == 0
    # the default 20 warm-up steps are longer than the run: said, with the rate it reaches
    assert ("Note: --warmup-steps 20 is longer than --steps 1: the learning rate only rises, to "
            "1/20 of --lr 0.0003, and never decays.") in capsys.readouterr().out
    run = tmp_path / "mine"
    # each metrics row carries the learning rate its updates used: here 1/20 of --lr
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 1 and row["lr"] == pytest.approx(0.0003 / 20, rel=1e-12)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    # an error found by the checks ...
    assert main(["grpo", "--task", "addition", "--variant", "dapo", "--overlong-buffer", "40",
                 "--out", str(tmp_path), "--name", "mine", "--overwrite", "--no-progress"]) == 2
    assert "need 54 positions" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    # ... and one that only the first step meets: the old run is put back
    from rlm_course.rl import trainer

    def broken(self):
        raise FloatingPointError("diverged at step 1")

    monkeypatch.setattr(trainer.RLTrainer, "step", broken)
    assert main(["grpo", "--task", "addition", "--steps", "1", "--out", str(tmp_path),
                 "--name", "mine", "--overwrite", "--no-progress", *SMALL]) == 2
    assert "diverged" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_an_overwrite_killed_earlier_is_named_not_deleted(tmp_path, capsys):
    """A hard kill (SIGKILL) between the set-aside and the first checkpoint leaves the old run in
    a hidden folder: the next --overwrite names it and both ways out, and deletes nothing."""
    run, aside = tmp_path / "mine", tmp_path / ".mine.replaced"
    run.mkdir()
    (run / "metrics.jsonl").write_text("half\n")
    aside.mkdir()
    (aside / "checkpoint.pt").write_bytes(b"old run")
    assert main(["grpo", "--task", "addition", "--steps", "1", "--out", str(tmp_path),
                 "--name", "mine", "--overwrite", "--no-progress", *SMALL]) == 2
    err = capsys.readouterr().err
    assert f"{aside} holds the run an earlier --overwrite of {run} set aside" in err
    assert f"mv {aside} {run}" in err and f"rm -r {aside}" in err
    assert (run / "metrics.jsonl").read_text() == "half\n"
    assert (aside / "checkpoint.pt").read_bytes() == b"old run"


def test_sigterm_stops_a_run_after_the_step_with_a_checkpoint(tmp_path, capsys, monkeypatch):
    """A scheduler's SIGTERM is a first Ctrl-C: the step ends, a checkpoint is saved, and the
    run resumes from it (before, the process died with the step's work and no checkpoint)."""
    from rlm_course.rl import trainer

    step = trainer.RLTrainer.step

    def step_then_term(self):
        row = step(self)
        if self.step_count == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return row

    monkeypatch.setattr(trainer.RLTrainer, "step", step_then_term)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["grpo", "--task", "addition", "--steps", "5", "--out", str(tmp_path),
                 "--name", "termed", "--no-progress", *SMALL]) == 130
    assert "SIGTERM: finishing this step and saving a checkpoint" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == before
    run = tmp_path / "termed"
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert (run / "checkpoint.pt").exists() and not (run / "summary.json").exists()


def test_a_checkpoint_of_another_vocabulary_is_a_clear_error(tmp_path, capsys):
    from rlm_course.lm.checkpoint import save_checkpoint
    from rlm_course.lm.model import ModelConfig, TinyGPT

    path = tmp_path / "other.pt"
    save_checkpoint(path, TinyGPT(ModelConfig(vocab_size=20, max_seq_len=32)), task="addition-3")
    assert main(["grpo", "--task", "addition", "--sft-checkpoint", str(path), "--out",
                 str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {path}: the model's vocabulary has 20 tokens but the tokenizer has 24" in err
    assert main(["eval", "--task", "addition", "--checkpoint", str(path)]) == 2
    assert "vocabulary has 20 tokens" in capsys.readouterr().err


def _unwritable_folder(tmp_path):
    if os.geteuid() != 0:
        folder = tmp_path / "locked"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    if os.path.isdir("/sys"):  # sysfs refuses new files even to root
        import tempfile

        try:
            with tempfile.TemporaryFile(dir="/sys"):
                pass
        except OSError:
            return Path("/sys")
    pytest.skip("no folder here refuses writes to this user (root without a read-only /sys)")


def test_unwritable_outputs_fail_before_any_training(tmp_path, capsys, monkeypatch):
    folder = _unwritable_folder(tmp_path)
    from rlm_course.rl import runs

    def no_training(*args, **kwargs):
        raise AssertionError("SFT started before the output folder was checked")

    monkeypatch.setattr(runs, "run_sft", no_training)
    assert main(["sft", "--task", "addition", "--out", str(folder / "sft.pt"), "--no-progress"]) == 2
    assert f"cannot write a file in {folder} (" in capsys.readouterr().err  # sft.pt's folder
    assert main(["grpo", "--task", "addition", "--out", str(folder), "--no-progress"]) == 2
    assert f"cannot write a file in {folder}/grpo-addition" in capsys.readouterr().err
    # an existing file is not replaced (the committed warm start, a run's checkpoint: neither
    # asked --store), nor is a .pt its own .json note would replace
    existing = tmp_path / "kept.pt"
    existing.write_bytes(b"mine")
    for argv, said in ((["sft", "--out", str(existing)], "exists (a checkpoint, or another file) "
                                                         "and is not replaced"),
                       (["sft", "--out", str(tmp_path / "ck.json")], "which would replace the "
                                                                     "checkpoint; give a .pt"),
                       (["family", "--out", str(existing)], "exists and is not replaced")):
        assert main([*argv, "--task", "addition", "--no-progress"]) == 2
        assert said in capsys.readouterr().err
    assert existing.read_bytes() == b"mine"


def test_resume_with_other_options_is_refused(tmp_path, capsys):
    assert main(["grpo", "--task", "addition", "--steps", "2", "--out", str(tmp_path),
                 "--no-progress", *SMALL]) == 0
    assert main(["grpo", "--task", "addition", "--steps", "2", "--lr", "0.1", "--resume",
                 "--out", str(tmp_path), "--no-progress", *SMALL]) == 2
    err = capsys.readouterr().err
    assert "resume with the same options" in err and "--lr: run 0.0003, now 0.1" in err
    assert main(["grpo", "--task", "addition", "--steps", "1", "--resume", "--out", str(tmp_path),
                 "--no-progress", *SMALL]) == 2
    assert "already has 2 steps" in capsys.readouterr().err


def test_a_run_saved_before_a_setting_existed_resumes_with_its_default(tmp_path):
    import torch

    assert main(["grpo", "--task", "addition", "--steps", "1", "--out", str(tmp_path),
                 "--name", "old", "--no-progress", *SMALL]) == 0
    path = tmp_path / "old" / "checkpoint.pt"
    payload = torch.load(path, weights_only=False)
    for key in ("rollout_precision", "correction", "correction_cap"):  # as an older run saved it
        del payload["config"][key]
    del payload["digest"]  # (older runs wrote no digest either)
    torch.save(payload, path)
    assert main(["grpo", "--task", "addition", "--steps", "2", "--resume", "--out", str(tmp_path),
                 "--name", "old", "--no-progress", *SMALL]) == 0


def test_a_damaged_run_checkpoint_is_named_before_anything_resumes(tmp_path, capsys):
    """A byte changed inside an optimizer state loads without an error from torch; the digest
    names it. A file without a digest (an older run's) gets its entries checked instead: a step
    that is not an integer, an optimizer state of the wrong shape or with NaN."""
    import torch

    assert main(["grpo", "--task", "addition", "--steps", "1", "--out", str(tmp_path),
                 "--name", "src", "--no-progress", *SMALL]) == 0
    path = tmp_path / "src" / "checkpoint.pt"
    intact = path.read_bytes()
    resume = ["grpo", "--task", "addition", "--steps", "2", "--resume", "--out", str(tmp_path),
              "--name", "src", "--no-progress", *SMALL]
    payload = torch.load(path, weights_only=False)
    moment = next(iter(payload["trainer"]["optimizer"]["state"].values()))["exp_avg_sq"]
    moment.view(-1)[moment.numel() // 2] += 1.0  # one value changed, the digest kept
    torch.save(payload, path)
    assert main(resume) == 2
    assert "is damaged: its contents no longer match the SHA-256 digest" in capsys.readouterr().err

    def edited(change):
        payload = torch.load(io.BytesIO(intact), weights_only=False)
        del payload["digest"]
        change(payload)
        torch.save(payload, path)
        assert main(resume) == 2
        return capsys.readouterr().err

    def step_as_text(p):
        p["trainer"]["step"] = "1"

    def lost_totals(p):
        del p["totals"]

    def wrong_shape(p):
        state = next(iter(p["trainer"]["optimizer"]["state"].values()))
        state["exp_avg"] = state["exp_avg"].reshape(-1)[:-1]

    def nan_moment(p):
        next(iter(p["trainer"]["optimizer"]["state"].values()))["exp_avg_sq"].fill_(float("nan"))

    assert "is missing, or holds an invalid value for: trainer step '1' (an integer >= 0). " \
        in edited(step_as_text)
    assert "is missing, or holds an invalid value for: the run's totals. The file is damaged" \
        in edited(lost_totals)
    assert "optimizer state in" in edited(wrong_shape) and "is damaged (its exp_avg has shape" in \
        edited(wrong_shape)
    assert "is damaged (its exp_avg_sq holds NaN or inf)" in edited(nan_moment)

    def newer_setting(p):
        p["config"]["bogus_field"] = 1

    assert "saved with settings this version of the course does not know (bogus_field)" in \
        edited(newer_setting)
    path.write_bytes(intact)
    assert main(resume) == 0


def test_overwrite_never_deletes_files_a_run_does_not_write(tmp_path, capsys):
    docs = tmp_path / "mydocs"
    (docs / "sub").mkdir(parents=True)
    (docs / "notes.txt").write_text("important")
    for extra in ([], ["--overwrite"]):
        assert main(["grpo", "--task", "addition", "--steps", "1", "--out", str(tmp_path),
                     "--name", "mydocs", "--no-progress", *SMALL, *extra]) == 2
        err = capsys.readouterr().err
        assert f"run folder {docs} holds files a run does not write (notes.txt, sub/)" in err
        assert "--overwrite would delete them; nothing was changed" in err
    assert (docs / "notes.txt").read_text() == "important" and (docs / "sub").is_dir()


def test_a_warm_start_inside_the_folder_overwrite_replaces_is_refused_first(tmp_path, capsys):
    # --overwrite set the folder aside, then the run said its --sft-checkpoint did not exist
    run = tmp_path / "r"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(b"earlier run")
    assert main(["grpo", "--task", "addition", "--steps", "1", "--out", str(tmp_path),
                 "--name", "r", "--no-progress", *SMALL, "--overwrite",
                 "--sft-checkpoint", str(run / "checkpoint.pt")]) == 2
    assert (f"--sft-checkpoint {run / 'checkpoint.pt'} lies inside the run folder {run} that "
            "--overwrite replaces") in capsys.readouterr().err
    assert (run / "checkpoint.pt").read_bytes() == b"earlier run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # nothing set aside


def test_a_run_set_aside_and_forgotten_is_named_even_when_its_folder_is_empty(tmp_path, capsys):
    run, aside = tmp_path / "r", tmp_path / ".r.replaced"
    run.mkdir()
    aside.mkdir()
    (aside / "checkpoint.pt").write_bytes(b"old run")
    for extra in ([], ["--overwrite"], ["--resume"]):
        assert main(["grpo", "--task", "addition", "--steps", "1", "--out", str(tmp_path),
                     "--name", "r", "--no-progress", *SMALL, *extra]) == 2
        assert f"{aside} holds the run an earlier --overwrite of {run} set aside" in \
            capsys.readouterr().err
    assert (aside / "checkpoint.pt").read_bytes() == b"old run"


def test_a_damaged_metrics_line_costs_only_itself():
    import tempfile

    from rlm_course.rl.runs import read_metrics

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "metrics.jsonl"
        rows = [json.dumps({"step": k, "reward_mean": k / 10}) for k in range(1, 8)]
        rows[2] = "{garbage"
        path.write_text("\n".join(rows) + '\n{"step": 8, "rew')  # and a last line cut by a kill
        notes = []
        kept = read_metrics(path, 6, notes.append)
        assert [r["step"] for r in kept] == [1, 2, 4, 5, 6]
        assert notes == [f"Note: {path} had 1 damaged line(s) (line 3), left out; the steps of "
                         "its other lines are kept."]


def test_resume_needs_the_same_variant(tmp_path, capsys):
    assert main(["grpo", "--task", "addition", "--variant", "gspo", "--steps", "1", "--out",
                 str(tmp_path), "--name", "g", "--no-progress", *SMALL]) == 0
    summary = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert summary["algorithm"] == "gspo" and summary["config"]["ratio_level"] == "sequence"
    assert main(["grpo", "--task", "addition", "--steps", "2", "--resume", "--out", str(tmp_path),
                 "--name", "g", "--no-progress", *SMALL]) == 2
    assert "its own command: python -m rlm_course grpo --variant gspo ... --resume" in \
        capsys.readouterr().err


def test_run_files_are_readable_by_others(tmp_path):
    from rlm_course.utils import atomic_write_text

    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "f.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "f.json").stat().st_mode & 0o777 == 0o644


def test_a_missing_warm_start_is_announced_and_asked_for_at_a_terminal(tmp_path, monkeypatch):
    """Settings without a warm start (e.g. --max-digits 8) say what will be trained and, at a
    terminal, ask first: "n" stops before any training and names the command that makes it."""
    import io

    from rlm_course.rl import runs
    from rlm_course.tasks import get_task

    monkeypatch.setenv("RLM_COURSE_DATA", str(tmp_path))

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stdin", Terminal("n\n"))
    monkeypatch.setattr("sys.stdout", Terminal())
    made, logged = [], []
    monkeypatch.setattr(runs, "make_sft_checkpoint", lambda *a, **k: made.append(a))
    task = get_task("scratchpad", max_digits=8)
    with pytest.raises(ValueError, match="make it with `python -m rlm_course sft --task scratchpad"):
        runs.load_sft_policy(task, runs.CharTokenizer(), log=logged.append)
    assert made == [] and "running the warm start first" in logged[0]
    assert "Ctrl-C stops it" in logged[0]


def test_refused_warm_starts_and_resumes_leave_no_folder_and_say_why(tmp_path, capsys):
    import shutil

    import torch

    from rlm_course.rl.runs import default_sft_checkpoint
    from rlm_course.tasks import get_task

    sft = default_sft_checkpoint(get_task("addition"))
    other = default_sft_checkpoint(get_task("scratchpad"))
    runs = tmp_path / "runs"
    # a warm start of another task: refused before the run's folder is made
    assert main(["grpo", "--task", "addition", "--name", "x", "--sft-checkpoint", str(other),
                 "--out", str(runs), "--no-progress"]) == 2
    assert "is for task 'scratchpad-6', not 'addition-3'" in capsys.readouterr().err
    assert not (runs / "x").exists()
    # a warm start with a NaN weight: the file is named as damaged, not the learning rate
    payload = torch.load(sft, weights_only=True)
    payload["state_dict"]["head.weight"][0, 0] = float("nan")
    broken = tmp_path / "nan.pt"
    torch.save(payload, broken)
    assert main(["grpo", "--task", "addition", "--name", "y", "--sft-checkpoint", str(broken),
                 "--out", str(runs), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "holds non-finite weights (NaN or inf in head.weight)" in err and "learning" not in err
    assert not (runs / "y").exists()
    assert main(["eval", "--task", "addition", "--checkpoint", str(broken)]) == 2
    assert "holds non-finite weights" in capsys.readouterr().err
    # --resume on a folder whose checkpoint is a warm start, not a run: no KeyError
    (runs / "z").mkdir(parents=True)
    shutil.copy(sft, runs / "z" / "checkpoint.pt")
    assert main(["grpo", "--task", "addition", "--name", "z", "--resume", "--out", str(runs),
                 "--no-progress"]) == 2
    assert "holds a model but no run to continue" in capsys.readouterr().err
    assert main(["grpo", "--task", "addition", "--name", "z", "--resume", "--nproc", "2",
                 "--out", str(runs), "--no-progress"]) == 2  # the data-parallel resume too
    assert "holds a model but no run to continue" in capsys.readouterr().err
    # the ppo command is grpo --variant ppo: another variant is refused, not run
    assert main(["ppo", "--task", "addition", "--variant", "grpo", "--out", str(runs),
                 "--no-progress"]) == 2
    assert "ppo --variant grpo: the ppo command is grpo --variant ppo" in (
        capsys.readouterr().err)
    assert main(["sft", "--task", "addition", "--seed", "-1", "--out",
                 str(tmp_path / "s.pt")]) == 2
    assert "seed=-1 (--seed) must be a whole number" in capsys.readouterr().err
    # data-parallel: a refused launch option leaves no folder either
    assert main(["grpo", "--task", "addition", "--name", "w", "--nproc", "2", "--threads", "0",
                 "--out", str(runs), "--no-progress"]) == 2
    assert "--threads 0: give 1 or more threads per rank." in capsys.readouterr().err
    assert not (runs / "w").exists()


def test_a_learning_rate_that_collapses_the_policy_is_said_before_the_run():
    from rlm_course.rl.algorithms import preset
    from rlm_course.rl.runs import HIGH_LR, start_notes

    high = start_notes(preset("grpo", lr=0.9, warmup_steps=0))
    assert high == ["Note: --lr 0.9 is far above the course's 3e-4: Adam moves every weight by "
                    "about --lr a step, so the policy will likely collapse within a few steps (on "
                    "addition 1e-3 without warm-up already takes it from 23% to under 1% in 6 steps); "
                    "RL fine-tuning of LLMs uses 1e-6 to 1e-5."]
    assert start_notes(preset("grpo", lr=HIGH_LR, warmup_steps=0)) == []
    assert start_notes(preset("grpo")) == []  # the defaults: 300 steps, 20 of warm-up, 3e-4
    both = start_notes(preset("grpo", lr=0.05, steps=5))
    assert len(both) == 2 and both[0].startswith("Note: --warmup-steps 20 is longer than --steps 5")
