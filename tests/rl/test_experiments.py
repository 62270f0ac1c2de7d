"""The stored family comparison: its command, its runs, and the file notebook 04 reads."""

import json
from pathlib import Path

import pytest

from rlm_course.cost.accounting import predict_passes
from rlm_course.rl.algorithms import PRESETS, preset
from rlm_course.rl.experiments import default_results_path, run_family
from rlm_course.tasks import get_task

TASK = get_task("addition", digits=3)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_family_experiment_writes_runs_and_the_command(tmp_path):
    out = run_family(TASK, ["--task", "addition"], seeds=[0], steps=2, variants=["rloo", "ppo"],
                     runs_dir=tmp_path / "runs", out=tmp_path / "family.json", progress=False)
    results = json.loads(out.read_text())
    assert results["command"].endswith(
        "python -m rlm_course family --task addition --seeds 0 --steps 2 --variants rloo ppo")
    assert [(r["variant"], r["seed"]) for r in results["runs"]] == [("rloo", 0), ("ppo", 0)]
    for run in results["runs"]:
        assert len(run["reward_curve"]) == 2 and run["eval_curve"] == []
        assert run["cost"]["passes_per_response"] == predict_passes(preset(run["variant"]))
        assert run["cost"]["memory_bytes"]["process_peak_rss"] > 0


def test_family_experiment_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="unknown variant"):
        run_family(TASK, ["--task", "addition"], [0], 2, ["grpo", "ppo2"], out=tmp_path / "f.json")
    with pytest.raises(ValueError, match="at least one seed"):
        run_family(TASK, ["--task", "addition"], [], 2, out=tmp_path / "f.json")
    with pytest.raises(ValueError, match=r"--seeds: 0 given more than once"):
        run_family(TASK, ["--task", "addition"], [0, 1, 0], 2, out=tmp_path / "f.json")
    assert not (tmp_path / "f.json").exists()


def test_stored_family_results_cover_every_preset_and_name_their_command():
    results = json.loads(default_results_path(TASK).read_text())
    assert "python -m rlm_course family --task addition" in results["command"]
    assert sorted(results["variants"]) == sorted(PRESETS)
    assert len(results["runs"]) == len(PRESETS) * len(results["seeds"])


def test_family_and_sft_replace_stored_results_only_with_store(tmp_path, monkeypatch, capsys):
    """A trial `family` or `sft` writes to its runs folder; the stored file the notebooks and the
    RL commands read is replaced only with --store."""
    import rlm_course.rl.experiments as experiments
    import rlm_course.rl.runs as runs
    from rlm_course.cli import main

    data = tmp_path / "data"
    monkeypatch.setenv("RLM_COURSE_DATA", str(data))
    written = []

    def fake_family(task, flags, seeds, steps, variants, runs_dir, out, progress, store):
        written.append((Path(out), store))
        return Path(out)

    monkeypatch.setattr(experiments, "run_family", fake_family)
    assert main(["family", "--task", "addition", "--runs-dir", str(tmp_path / "r")]) == 0
    assert written[-1] == (tmp_path / "r" / "family-addition-3.json", False)
    assert "add --store to replace it" in capsys.readouterr().out
    assert main(["family", "--task", "addition", "--store"]) == 0
    assert written[-1] == (data / "experiments" / "family-addition-3.json", True)
    assert main(["family", "--task", "addition", "--store", "--out", "x.json"]) == 2

    def fake_sft(task, tok, out, config, progress, device):
        written.append((Path(out), None))
        assert device == "auto"  # the command's --device, resolved by make_sft_checkpoint
        return Path(out)

    monkeypatch.setattr(runs, "make_sft_checkpoint", fake_sft)
    stored = data / "checkpoints" / "sft-addition-3.pt"
    assert main(["sft", "--task", "addition", "--runs-dir", str(tmp_path / "s")]) == 0
    assert written[-1][0] == stored  # the first warm start of these settings: where RL looks
    stored.parent.mkdir(parents=True)
    stored.write_bytes(b"committed")
    assert main(["sft", "--task", "addition", "--runs-dir", str(tmp_path / "s")]) == 0
    assert written[-1][0] == tmp_path / "s" / "sft-addition-3.pt"
    assert "--sft-checkpoint" in capsys.readouterr().out
    assert main(["sft", "--task", "addition", "--store"]) == 0
    assert written[-1][0] == stored
