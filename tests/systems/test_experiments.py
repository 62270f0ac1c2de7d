"""``python -m rlm_course systems <experiment>``: flags an experiment does not take are refused
before any work, and a run writes to the runs folder unless ``--store`` asks it to replace the
stored result the notebooks read."""

import json

import pytest
from rlm_course.cli import main
from rlm_course.systems import experiments
from rlm_course.utils import result_path


@pytest.mark.parametrize("argv, named", [
    (["weight-sync", "--steps", "3"], "--steps: the weight-sync experiment does not take it"),
    (["reshard", "--seed", "1"], "--seed: the reshard experiment does not take it"),
    (["async", "--repeats", "2"], "--repeats: the async experiment does not take it"),
    (["fusion", "--steps", "2"], "--steps: the fusion experiment does not take it"),
    (["mismatch", "--repeats", "2"], "--repeats: the mismatch experiment does not take it"),
    (["async", "--steps", "0"], "--steps 0: give 1 or more"),
    (["mismatch", "--seed", "-1"], "--seed -1: seeds are integers"),
])
def test_flags_an_experiment_does_not_take_are_refused_in_one_line(argv, named, capsys):
    assert main(["systems", *argv]) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1


def test_the_refusal_names_the_flags_the_experiment_takes():
    with pytest.raises(ValueError, match="it takes --steps: RL steps per run .60.; --seed"):
        experiments.check_flags("async", repeats=3)


def test_result_path_replaces_the_stored_file_only_when_asked(tmp_path):
    stored = tmp_path / "data" / "systems-async.json"
    assert result_path(stored, True, tmp_path / "runs") == stored
    assert result_path(stored, False, tmp_path / "runs") == tmp_path / "runs" / "systems-async.json"


def test_a_run_writes_to_the_runs_folder_and_leaves_the_stored_result(tmp_path, monkeypatch,
                                                                      capsys):
    import rlm_course.systems.mismatch as mismatch

    stored = tmp_path / "data" / "experiments" / "systems-mismatch.json"
    stored.parent.mkdir(parents=True)
    stored.write_text('{"stored": true}\n')
    monkeypatch.setenv("RLM_COURSE_DATA", str(tmp_path / "data"))
    calls = []
    monkeypatch.setattr(mismatch, "mismatch_experiment",
                        lambda steps, seeds, progress, runs_dir:
                        calls.append((steps, seeds, runs_dir)) or {"ran": 1})
    runs = tmp_path / "runs"
    assert main(["systems", "mismatch", "--steps", "3", "--runs-dir", str(runs)]) == 0
    # its learning runs' folders go under --runs-dir too, never to the working folder's runs/
    assert calls == [(3, (0, 1), runs / "systems-mismatch")]
    written = json.loads((runs / "systems-mismatch.json").read_text())
    assert written["ran"] == 1 and written["command"] == "python -m rlm_course systems mismatch --steps 3"
    assert json.loads(stored.read_text()) == {"stored": True}  # untouched
    assert "add --store to replace it" in capsys.readouterr().out
    # an earlier run's results are replaced only when asked, before any work
    assert main(["systems", "mismatch", "--steps", "3", "--runs-dir", str(runs)]) == 2
    assert (f"{runs / 'systems-mismatch.json'} holds an earlier run of systems mismatch; pass "
            "--overwrite to replace it, or another --runs-dir.") in capsys.readouterr().err
    (runs / "systems-mismatch" / "fp32-none-seed0").mkdir(parents=True)
    assert main(["systems", "mismatch", "--steps", "3", "--runs-dir", str(runs)]) == 2
    assert "and " + str(runs / "systems-mismatch") + "/ hold an earlier run" in \
        capsys.readouterr().err
    assert len(calls) == 1
    assert main(["systems", "mismatch", "--steps", "2", "--runs-dir", str(runs),
                 "--overwrite"]) == 0
    assert calls[-1] == (2, (0, 1), runs / "systems-mismatch")
    # --store replaces the stored file whatever it holds (its run folders still need --overwrite)
    assert main(["systems", "mismatch", "--steps", "3", "--seed", "4", "--store", "--runs-dir",
                 str(runs), "--overwrite"]) == 0
    assert calls[-1] == (3, (4, 5), runs / "systems-mismatch")
    replaced = json.loads(stored.read_text())
    assert replaced["command"] == "python -m rlm_course systems mismatch --seed 4 --steps 3 --store"


def test_the_readme_scratchpad_line_quotes_the_stored_runs_of_its_command():
    from rlm_course.utils import repo_root

    line = next(l for l in (repo_root() / "README.md").read_text().splitlines()
                if l.startswith("python -m rlm_course grpo --task scratchpad --lr"))
    command, claim = line.split("#", 1)
    stored = experiments.load_experiment("mismatch")
    plain = [r for r in stored["runs"] if r["precision"] == "fp32" and r["correction"] == "none"]
    for run in plain:  # the README's flags are the stored run's flags
        for flag in command.split()[3:]:
            assert flag in run["command"].split(), (flag, run["command"])
        assert f"{run['accuracy_after']:.1%}".replace(".0%", "%") in claim
    assert f"{plain[0]['accuracy_before']:.0%} ->" in claim


def test_each_experiment_prints_its_figures_beside_their_predictions():
    """What `systems <name>` prints before the path, from the stored results: the async runs'
    throughput against the disaggregated synchronous run, the sync's measured/predicted ratio."""
    runs = experiments.load_experiment("async")["runs"]
    text = experiments.summarize("async", experiments.load_experiment("async"))
    base = runs["disaggregated sync (eta=0)"]["tokens_per_second"]
    for name, run in runs.items():
        line = next(l for l in text.splitlines() if l.startswith(name))
        assert f"{run['tokens_per_second'] / base:.2f}x" in line, line
    sync = experiments.load_experiment("weight-sync")
    text = experiments.summarize("weight-sync", sync)
    assert text.startswith("link fitted on the workers: alpha ")
    assert all(f"{r['ratio']:.2f}" in text for r in sync["rows"])
    for name in ("reshard", "fusion", "mismatch"):
        assert experiments.summarize(name, experiments.load_experiment(name))
    fusion = experiments.load_experiment("fusion")
    assert f"stage fusion {fusion['gain']:.2f}x" in experiments.summarize("fusion", fusion)


def test_a_runs_dir_that_is_a_file_is_named_as_such(tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    assert main(["systems", "weight-sync", "--runs-dir", str(a_file)]) == 2
    assert (f"cannot write to {a_file}: it is a file, not a folder; choose another --runs-dir."
            in capsys.readouterr().err)  # mkdir's own words were '(File exists)'
