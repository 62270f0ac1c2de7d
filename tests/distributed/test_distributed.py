"""Chapter 11 on real processes (gloo, one thread per rank): the launcher and its faults, the
collective benchmark's fit, every strategy equal to one device with bytes = formulas, and
data-parallel GRPO. Ranks start from a forkserver (started once per session), so each launch
costs a fraction of a second; several checks share one launch where they can."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from rlm_course.distributed import strategies as S
from rlm_course.distributed.collectives import (
    COLLECTIVES,
    bus_factor,
    collectives_worker,
    fit_all,
    fit_link,
    predicted_seconds,
    rows_with_model,
)
from rlm_course.distributed.comm import bytes_sent, union_seconds
from rlm_course.distributed.demo import faulty, hello
from rlm_course.distributed.launch import (
    DistributedError,
    OversubscriptionWarning,
    cores,
    launch,
    start,
)
from rlm_course.cost.comm import Link
from rlm_course.parallel.world import World
from rlm_course.utils import repo_root  # noqa: E402

ROOT = str(repo_root())


# ---------------------------------------------------------------------------- the launcher
@pytest.mark.multiprocess
def test_launch_returns_each_rank_result_in_rank_order():
    results = launch(hello, 2)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["sum"] == 3.0 and r["threads"] == 1 and r["backend"] == "gloo" for r in results)
    assert results[0]["pid"] != results[1]["pid"] != os.getpid()


def _defined_in_a_notebook(ctx):
    return ctx.rank


def test_a_worker_defined_in_a_notebook_is_refused(monkeypatch):
    monkeypatch.setattr(_defined_in_a_notebook, "__module__", "__main__")
    with pytest.raises(ValueError, match="defined in the notebook or script itself"):
        launch(_defined_in_a_notebook, 2)


def test_workers_and_limits_a_rank_cannot_use_are_refused_before_any_process_starts():
    import functools
    import math

    with pytest.raises(ValueError, match="functools.partial cannot be imported"):
        launch(functools.partial(hello), 2)
    for kw, name in ((dict(deadline=0), "deadline=0"), (dict(timeout=math.inf), "timeout=inf"),
                     (dict(threads=True), "threads=True")):
        with pytest.raises(ValueError, match=name):
            launch(hello, 2, **kw)


def test_missing_backend_and_device_are_clear_errors():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="backend='nccl' needs CUDA GPUs"):
        launch(hello, 2, backend="nccl")
    with pytest.raises(ValueError, match="--device cuda: torch sees no CUDA GPU"):
        launch(hello, 2, device="cuda")
    with pytest.raises(ValueError, match="nprocs=0"):
        launch(hello, 0)


def test_a_port_in_use_is_a_clear_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ValueError, match=f"port {port} is already in use"):
            launch(hello, 2, port=port)


@pytest.mark.multiprocess
def test_more_ranks_than_cores_warn_and_still_run():
    n = cores() + 1
    with pytest.warns(OversubscriptionWarning, match="oversubscribe"):
        results = launch(hello, n)
    assert [r["sum"] for r in results] == [n * (n + 1) / 2] * n


@pytest.mark.multiprocess
@pytest.mark.parametrize("how,cause", [("raise", "ValueError: rank 1 fails on purpose"),
                                       ("exit", "exited with code 3")])
def test_a_failing_rank_is_one_line_per_rank_and_its_traceback_is_in_the_log(
        how, cause, tmp_path, monkeypatch):
    monkeypatch.delenv("RLM_COURSE_DEBUG", raising=False)
    start_time = time.time()
    log = tmp_path / "failure.log"
    with pytest.raises(DistributedError) as info:
        launch(faulty, 2, kwargs=dict(how=how), grace=10.0, log_file=log)
    err = info.value
    assert err.first_rank == 1 and time.time() - start_time < 10.0
    assert f"rank 1 of 2 failed first: {cause}" in str(err)
    assert set(err.failures) == {0, 1}
    assert "Traceback" in err.failures[0]  # rank 0 stopped on its own, with its traceback
    # the message: one line per rank and the log's path, no traceback, no gloo boilerplate
    lines = str(err).splitlines()
    assert len(lines) == 3 and lines[1].startswith("rank 0: RuntimeError: ")
    assert "Traceback" not in str(err) and "This is typically" not in str(err)
    assert lines[2].startswith(f"Full tracebacks: {log}") and err.log_path == str(log)
    text = log.read_text()
    assert "--- rank 0 ---" in text and "--- rank 1 ---" in text and "Traceback" in text
    monkeypatch.setenv("RLM_COURSE_DEBUG", "1")  # the tracebacks in the message too
    assert "--- rank 0 ---" in str(DistributedError(err.summary, 1, err.failures, str(log)))


@pytest.mark.multiprocess
def test_a_rank_killed_by_pid_stops_the_others_within_the_grace(tmp_path):
    # the peer's sockets close and rank 0's all-reduce fails at once; gloo can miss the closed
    # socket under load (twice in full test runs: rank 0 still waiting when the grace ran out),
    # and then the collective's timeout ends the wait: 5 s here, inside the 10 s grace
    job = start(faulty, 2, kwargs=dict(how="none", ready_file=str(tmp_path / "ready")),
                timeout=5.0, grace=10.0)
    deadline = time.time() + 60
    while not all((tmp_path / f"ready.{r}").exists() for r in range(2)):
        assert time.time() < deadline, "the ranks never started"
        time.sleep(0.02)
    killed = time.time()
    os.kill(job.pids[1], signal.SIGKILL)
    with pytest.raises(DistributedError) as info:
        job.join()
    elapsed = time.time() - killed
    assert info.value.first_rank == 1
    assert "rank 1 of 2 failed first: killed by signal SIGKILL" in str(info.value)
    assert "rank 0: RuntimeError" in str(info.value)
    # rank 0 fails on its own (the sockets, or the timeout) and exits without tearing the group
    # down (a destroy_process_group with a dead peer could block it until the launcher's grace)
    assert elapsed < 10.0


@pytest.mark.multiprocess
def test_a_hung_rank_is_named_after_the_collective_timeout():
    start_time = time.time()
    with pytest.raises(DistributedError) as info:
        launch(faulty, 2, kwargs=dict(how="hang"), timeout=2.0, grace=1.0)
    elapsed = time.time() - start_time
    assert elapsed < 2.0 + 1.0 + 5.0  # timeout, grace, stopping
    assert "Timed out" in str(info.value)
    assert "Rank(s) [1] never reached the collective" in str(info.value)
    assert "rank 1: still running" in str(info.value)


# ---------------------------------------------------------------------------- bytes and time
def test_bytes_sent_follow_the_world_conventions():
    p, m = 4, 4096
    world = World(p)
    world.all_reduce([torch.zeros(m // 4) for _ in range(p)])
    assert bytes_sent("all_reduce", m, p) == (world.sent[0], world.received[0]) == (6144, 6144)
    world = World(p)
    world.all_gather([torch.zeros(m // 16) for _ in range(p)])
    assert bytes_sent("all_gather", m, p)[0] == world.sent[0] == 3072
    world = World(p)
    world.broadcast(torch.zeros(m // 4), src=0)
    assert [bytes_sent("broadcast", m, p, r)[0] for r in range(p)] == world.sent
    assert bytes_sent("send", m, p) == (m, 0) and bytes_sent("recv", m, p) == (0, m)
    assert bytes_sent("all_reduce", m, 1) == (0, 0)
    assert union_seconds([(0, 2), (1, 3), (5, 6)]) == 4


def test_bus_bandwidth_factors_are_nccl_tests():
    assert bus_factor("all_reduce", 4) == 1.5
    assert bus_factor("all_gather", 4) == bus_factor("reduce_scatter", 4) == 0.75
    assert bus_factor("broadcast", 4) == bus_factor("send_recv", 4) == 1.0
    with pytest.raises(ValueError, match="unknown collective"):
        bus_factor("gossip", 2)


@pytest.mark.parametrize("p", [2, 4])
def test_the_alpha_beta_fit_recovers_known_parameters(p):
    truth = Link(alpha=50e-6, beta=2e9)
    sizes = [4 ** k for k in range(1, 14)]
    g = torch.Generator().manual_seed(p)
    for name in COLLECTIVES:
        noise = 1 + 0.01 * torch.randn(len(sizes), generator=g, dtype=torch.float64)
        times = [predicted_seconds(name, s, p, truth) * float(e) for s, e in zip(sizes, noise)]
        fit = fit_link(name, sizes, times, p)
        assert abs(fit.alpha / truth.alpha - 1) < 0.05, (name, fit)
        assert abs(fit.beta / truth.beta - 1) < 0.05, (name, fit)
    with pytest.raises(ValueError, match="at least two"):
        fit_link("all_reduce", [4], [1e-4], p)


def test_gradient_sync_on_catalog_links_follows_the_world():
    from rlm_course.distributed.collectives import catalog_links, gradient_sync

    links = catalog_links("H100-SXM-80GB")
    assert links["intra-node"].beta == 450e9 and links["inter-node"].beta == 50e9
    one = gradient_sync(25 * 2**20, 8, links["intra-node"])
    assert one["buckets"] == 1
    assert one["seconds"] == pytest.approx(predicted_seconds("all_reduce", 25 * 2**20, 8,
                                                             links["intra-node"]), rel=1e-12)
    sync = gradient_sync(100 * 2**20 + 1, 8, links["inter-node"], backward_seconds=1.0)
    assert sync["buckets"] == 5 and sync["exposed_seconds"] < sync["seconds"]
    with pytest.raises(ValueError, match="must be positive"):
        gradient_sync(0, 8, links["intra-node"])


@pytest.mark.multiprocess
def test_collectives_are_timed_on_real_ranks():
    # the largest message takes about 10-20 ms, well above the millisecond a small call takes
    # now and then on a busy machine, so every collective shows a bandwidth to fit
    sizes = (4, 4096, 32 << 20)
    table = launch(collectives_worker, 2, kwargs=dict(sizes=sizes, repeats=3, warmup=1))[0]
    assert set(table) == set(COLLECTIVES)
    assert all(len(rows) == 3 and all(r["seconds"] > 0 for r in rows) for rows in table.values())
    rows = rows_with_model({2: table}, fit_all({2: table}))
    assert all(r["predicted"] > 0 and r["busbw"] > 0 for r in rows)
    big = next(r for r in table["all_reduce"] if r["bytes"] == 32 << 20)
    assert big["ring"] == 32 << 20  # 2 (p - 1) / p of the message at p = 2
    if big["wire"] is not None:  # Linux: the socket bytes of a ring, plus headers
        assert 1.0 <= big["wire"] / big["ring"] < 1.05


# ---------------------------------------------------------------------------- strategies
def _assert_equal_and_counted(rows):
    for r in rows:
        assert r["ok"], (r["strategy"], r["loss_error"], r["grad_error"], r["param_error"],
                         r["tolerance"])
        assert r["bytes_ok"], (r["strategy"], r["sent"], r["predicted"])


@pytest.mark.multiprocess
def test_every_strategy_equals_one_device_and_sends_the_formula_bytes_on_2_ranks():
    setup = S.check_setup(2)
    names = S.fitting(setup, 2)
    assert names == list(S.STRATEGIES)
    rows = S.check_equivalence(launch(S.equivalence_worker, 2, args=(names, setup)), setup)
    _assert_equal_and_counted(rows)
    tp = next(r for r in rows if r["strategy"] == "tp")
    assert tp["calls"] == f"{4 * setup.n_layer} all_reduce"  # Megatron: 2 forward, 2 backward


@pytest.mark.slow
@pytest.mark.multiprocess
def test_strategies_on_4_ranks():
    setup = S.check_setup(4)
    names = ["ddp", "fsdp2", "tp_sp", "pp_interleaved"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OversubscriptionWarning)
        per_rank = launch(S.equivalence_worker, 4, args=(names, setup))
    _assert_equal_and_counted(S.check_equivalence(per_rank, setup))


def test_strategies_that_do_not_fit_say_why():
    with pytest.raises(ValueError, match="do not divide the 4 heads"):
        S.Setup().check("tp", 3)
    with pytest.raises(ValueError, match="do not split into 8 stages"):
        S.Setup(n_layer=4).check("pp_interleaved", 4)
    assert "tp" not in S.fitting(S.check_setup(8), 8)


def test_a_strategies_run_names_what_it_leaves_out_and_refuses_what_was_asked_for():
    # 2 and 4 ranks: the chapter's setups, unchanged, and every strategy runs
    for p in (2, 4):
        setup, names, skipped = S.select(p)
        assert names == list(S.STRATEGIES) and skipped == {}
        assert (setup.n_layer, setup.batch, setup.micro_batches) == ((4, 8, 4) if p == 2
                                                                     else (8, 8, 4))
    # 3 ranks: everything but TP runs (sizes follow p), and TP says why, once each
    for timing in (False, True):
        setup, names, skipped = S.select(3, timing=timing)
        assert names == ["ddp", "fsdp2", "pp_gpipe", "pp_1f1b", "pp_interleaved",
                         "pp_zero_bubble"]
        assert skipped == {name: f"{name}: skipped, 3 ranks do not divide the 4 heads; use "
                                 "--nproc 2 or 4" for name in ("tp", "tp_sp")}
    with pytest.raises(ValueError, match=r"^--strategies tp on 3 ranks: tp: 3 ranks do not "
                                         r"divide the 4 heads; use --nproc 2 or 4\.$"):
        S.select(3, ["tp"])
    with pytest.raises(ValueError, match="unknown nope"):
        S.select(2, ["nope"])
    with pytest.raises(ValueError, match="2 or more ranks"):
        S.select(1)


def test_head_major_qkv_is_the_same_attention():
    torch.manual_seed(0)
    model = S.make_model(S.Setup(dtype="float64"))
    ready = S.tp_ready(model)
    x = torch.randint(0, 24, (2, 16))
    assert torch.allclose(model(x), ready(x), rtol=0, atol=1e-12)
    name = "blocks.0.attn.qkv.weight"
    back = S.from_head_major(name, dict(ready.named_parameters())[name].detach(), model.config)
    assert torch.equal(back, dict(model.named_parameters())[name].detach())


# ---------------------------------------------------------------------------- data-parallel GRPO
@pytest.mark.multiprocess
def test_one_dp_grpo_update_equals_the_single_process_update():
    from rlm_course.distributed.grpo import update_equivalence_worker

    out = launch(update_equivalence_worker, 2, kwargs=dict(unweighted=("dapo",)))[0]
    for variant in ("grpo", "dapo"):
        assert out[variant]["param_error"] <= out[variant]["tolerance"], out[variant]
        assert out[variant]["grad_error"] < 1e-12, out[variant]  # float64: the same gradient
        assert out[variant]["ranks_differ"] == 0.0
    assert out["dapo"]["loss_agg"] == "token-mean"
    # without weighing each rank by its share of the tokens, token-mean is not one process's
    assert out["dapo unweighted"]["param_error"] > 100 * out["dapo unweighted"]["tolerance"]
    assert out["dapo unweighted"]["grad_error"] > 1e-3


def test_data_parallel_refuses_what_it_cannot_run():
    from rlm_course.distributed.grpo import check_data_parallel
    from rlm_course.rl.algorithms import preset

    with pytest.raises(ValueError, match="dynamic sampling"):
        check_data_parallel(preset("dapo"), 2)
    with pytest.raises(ValueError, match=r"--variant ppo \(advantage='gae', with a critic\): it "
                       "normalises advantages over the whole batch"):
        check_data_parallel(preset("ppo"), 2)
    with pytest.raises(ValueError, match="normalises advantages over the whole batch"):
        check_data_parallel(preset("reinforce_pp"), 2)
    with pytest.raises(ValueError, match="does not split into 3 equal shares"):
        check_data_parallel(preset("grpo", prompts_per_step=64), 3)
    check_data_parallel(preset("dapo", dynamic_sampling=False), 2)
    check_data_parallel(preset("dapo"), 1)  # one process runs everything


def test_a_failed_dp_overwrite_never_costs_the_existing_run(tmp_path, monkeypatch):
    """--overwrite of a data-parallel run: the old run stays aside until the new one has a
    checkpoint (it was deleted before the processes started, so a failed launch lost it); the
    launch is stubbed, no process starts."""
    import rlm_course.distributed.launch as launcher
    from rlm_course.distributed.grpo import run_rl_distributed
    from rlm_course.rl.algorithms import preset
    from rlm_course.tasks import get_task

    run = tmp_path / "dp"
    run.mkdir()
    (run / "metrics.jsonl").write_text("old\n")
    (run / "checkpoint.pt").write_bytes(b"old run")
    config = preset("grpo", steps=2, prompts_per_step=4, group_size=4, eval_every=10**6)

    def fails(*args, **kwargs):
        raise launcher.DistributedError("rank 1 failed: boom", 1, {1: "boom"})

    monkeypatch.setattr(launcher, "launch", fails)
    with pytest.raises(launcher.DistributedError, match="boom"):
        run_rl_distributed(get_task("addition"), config, 2, name="dp", out_dir=tmp_path,
                           overwrite=True, progress=False, log=lambda *a: None)
    assert (run / "checkpoint.pt").read_bytes() == b"old run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dp"]

    def writes_a_checkpoint(worker, nproc, kwargs, **options):
        (Path(kwargs["run_dir"]) / "checkpoint.pt").write_bytes(b"new run")
        return [{"interrupted": True, "step": 1, "run_dir": kwargs["run_dir"]}]

    monkeypatch.setattr(launcher, "launch", writes_a_checkpoint)
    run_rl_distributed(get_task("addition"), config, 2, name="dp", out_dir=tmp_path,
                       overwrite=True, progress=False, log=lambda *a: None)
    assert (run / "checkpoint.pt").read_bytes() == b"new run"
    assert not (run / "metrics.jsonl").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dp"]


@pytest.mark.multiprocess
def test_a_dp_grpo_run_writes_its_files_and_resumes_with_the_uninterrupted_numbers(tmp_path):
    from rlm_course.distributed.grpo import run_rl_distributed
    from rlm_course.lm.checkpoint import load_checkpoint
    from rlm_course.rl.algorithms import preset
    from rlm_course.rl.runs import run_rl
    from rlm_course.tasks import get_task

    task = get_task("addition")
    config = preset("grpo", steps=2, prompts_per_step=4, group_size=4, eval_every=10**6)
    said = []
    summary = run_rl_distributed(task, config, 2, name="dp", out_dir=tmp_path, progress=False,
                                 log=said.append)
    run = tmp_path / "dp"
    assert summary["world_size"] == 2 and summary["steps"] == 2
    # the default 20 warm-up steps are longer than the run: said, as a one-process run says it
    assert ("Note: --warmup-steps 20 is longer than --steps 2: the learning rate only rises, to "
            "2/20 of --lr 0.0003, and never decays (a --warmup-steps below 2 gives a warm-up "
            "and then a decay).") in said
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["lr"] for r in rows] == [config.lr_at(1), config.lr_at(2)]
    assert rows[0]["responses_generated"] == 16 and len(rows[0]["rank_seconds"]) == 2
    timeline = json.loads((run / "timeline.json").read_text())
    assert len(timeline["ranks"]) == 2
    assert {e["stage"] for e in timeline["ranks"][1]} >= {"generation", "scoring", "training",
                                                          "communication"}
    assert {e["worker"] for e in timeline["ranks"][1]} == {1}
    assert (run / "timeline.png").exists() and (run / "learning_curve.png").exists()
    state = load_checkpoint(run / "checkpoint.pt")
    assert state["trainer"]["step"] == 2 and state["config"]["prompts_per_step"] == 4
    # the same run resumed on 2 processes to step 3 = the run that went to step 3 at once
    import shutil

    shutil.copytree(run, tmp_path / "dp-copy")
    longer = preset("grpo", steps=3, prompts_per_step=4, group_size=4, eval_every=10**6)
    with pytest.raises(ValueError, match="already holds a run; pass --resume"):
        run_rl_distributed(task, longer, 2, name="dp", out_dir=tmp_path, progress=False,
                           log=lambda *a: None)
    resumed = run_rl_distributed(task, longer, 2, name="dp", out_dir=tmp_path, resume=True,
                                 progress=False, log=lambda *a: None)
    assert resumed["steps"] == 3 and resumed["resumed_from_step"] == 2
    whole = run_rl_distributed(task, longer, 2, name="whole", out_dir=tmp_path, progress=False,
                               log=lambda *a: None)
    a, b = load_checkpoint(run / "checkpoint.pt"), load_checkpoint(tmp_path / "whole" / "checkpoint.pt")
    assert a["trainer"]["step"] == b["trainer"]["step"] == 3
    for (name, x), y in zip(a["model"].state_dict().items(), b["model"].state_dict().values()):
        assert torch.equal(x, y), name
    assert resumed["accuracy_after"] == whole["accuracy_after"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    same = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["reward_mean"] for r in rows] == [r["reward_mean"] for r in same]
    # the distributed run's checkpoint also continues in one process
    said = []
    resumed = run_rl(task, longer, name="dp-copy", out_dir=tmp_path, resume=True,
                     progress=False, log=said.append)
    assert resumed["steps"] == 3
    assert ("Note: the run used 2 processes, this one 1: it continues from step 2, but with other "
            "samples than an uninterrupted run (pass --nproc 2 to repeat it exactly); its "
            "timeline.json and timeline.png keep the steps its processes ran.") in said


def test_cli_nproc_refusals(capsys):
    from rlm_course.cli import main

    assert main(["grpo", "--task", "addition", "--variant", "dapo", "--nproc", "2",
                 "--no-progress"]) == 2
    assert "dynamic sampling" in capsys.readouterr().err
    assert main(["grpo", "--task", "addition", "--nproc", "2", "--resume", "--no-progress",
                 "--out", "/nonexistent-runs"]) == 2
    assert "--resume: no run to resume" in capsys.readouterr().err


def test_more_ranks_than_the_memory_holds_are_refused_before_any_starts(monkeypatch, capsys):
    """hello --nproc 1000 on a 24 GB machine started ranks until the memory ran out (166 of
    them, 147 MB each) and everything else on the machine stalled."""
    from rlm_course.cli import main
    from rlm_course.distributed import launch as launch_module

    monkeypatch.setattr(launch_module, "available_memory_bytes", lambda: 1e9)  # 1 GB free
    with pytest.raises(ValueError, match=r"nprocs 5: 5 CPU ranks take about 1 GB \(0.25 GB each: "
                                         r"a Python process with torch\), and this machine has "
                                         r"1.0 GB available; give at most 4\."):
        start(hello, 5)
    assert main(["distributed", "hello", "--nproc", "5"]) == 2
    assert "--nproc 5: 5 CPU ranks take about 1 GB" in capsys.readouterr().err
    monkeypatch.setattr(launch_module, "available_memory_bytes", lambda: None)  # not known
    launch_module.check_rank_memory(10_000, "nprocs")  # no refusal on a guess


# ---------------------------------------------------------------------------- torchrun
@pytest.mark.slow
@pytest.mark.multiprocess
def test_the_single_node_torchrun_command_runs_the_same_worker(tmp_path):
    from rlm_course.distributed.torchrun import torchrun_command

    multi = torchrun_command("grpo", 8, ["--task", "addition"], nnodes=2, endpoint="host:29400")
    assert "--nnodes=2" in multi and "--rdzv-backend=c10d" in multi
    assert multi[-4:] == ["rlm_course.distributed", "grpo", "--task", "addition"]
    logs = tmp_path / "tmp"
    logs.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(logs)}
    done = subprocess.run([sys.executable, "-m", "rlm_course", "distributed", "hello", "--nproc",
                           "2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    # a run that logged nothing leaves no empty rlm_course-torchrun-* log folder behind
    assert not list(logs.glob("rlm_course-torchrun-*"))
    assert "rank 1 of 2: pid" in done.stdout
    last = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["sum"] for r in last["ranks"]] == [3.0, 3.0]
    assert "torchrun --standalone --nproc-per-node=2 -m rlm_course.distributed hello" in done.stderr


# ---------------------------------------------------------------------------- from the command line
def _cli(*args, timeout=180, **popen):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RLM_COURSE_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "rlm_course", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, **popen)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_ctrl_c_on_a_dp_grpo_run_saves_a_checkpoint_and_resume_with_nproc_continues(tmp_path):
    from rlm_course.lm.checkpoint import load_checkpoint

    flags = ["grpo", "--task", "addition", "--nproc", "2", "--prompts-per-step", "4",
             "--group-size", "4", "--eval-every", "1000", "--out", str(tmp_path), "--name", "run",
             "--no-progress"]
    metrics = tmp_path / "run" / "metrics.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "rlm_course", *flags, "--steps", "500"],
                            cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own process group, as in a terminal
    try:
        deadline = time.time() + 150
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole process group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    assert "leaked semaphore" not in err and "Traceback" not in err, err[-3000:]
    steps = len(metrics.read_text().splitlines())
    assert f"Stopped at step {steps};" in out and "--resume" in out
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt")["trainer"]["step"] == steps
    # what the message advises: the same command plus --resume (here with one more step)
    done = _cli(*flags, "--steps", str(steps + 1), "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Resuming {tmp_path / 'run'} from step {steps}." in done.stdout
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, steps + 2))


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_failed_rank_under_torchrun_is_one_line_each_with_the_traceback_in_a_file():
    done = _cli("distributed", "faulty", "--nproc", "2")
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if not line.startswith(("running:",
                                                                                "on several"))]
    assert "Traceback" not in done.stderr and "leaked semaphore" not in done.stderr
    assert len(lines) == 3, done.stderr  # one line per rank, one from the launcher
    mine = next(line for line in lines if line.startswith("rank 1 of 2: "))
    assert mine.startswith("rank 1 of 2: ValueError: rank 1 fails on purpose (traceback: ")
    log = mine.split("(traceback: ")[1].rstrip(")")
    assert "ValueError: rank 1 fails on purpose" in open(log).read()
    assert any(line.startswith("rank 0 of 2: RuntimeError: ") for line in lines)
    summary = lines[-1]
    assert summary.startswith("error: torchrun: ") and "of 2 rank(s) failed" in summary
    # rank 1 exits with code 1 after writing its line, unless torchrun sees rank 0 (whose
    # collective rank 1 broke) exit first and stops rank 1 with SIGTERM: the processes race
    assert "rank 1 (exit code 1)" in summary or "rank 1 (signal SIGTERM)" in summary, summary


@pytest.mark.slow
@pytest.mark.multiprocess
def test_strategies_on_3_ranks_run_what_fits_and_say_what_they_leave_out():
    done = _cli("distributed", "strategies", "--nproc", "3", timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("tp", "tp_sp"):
        line = f"{name}: skipped, 3 ranks do not divide the 4 heads; use --nproc 2 or 4"
        assert done.stderr.splitlines().count(line) == 1, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["strategy"] for r in result["equivalence"]] == [
        "ddp", "fsdp2", "pp_gpipe", "pp_1f1b", "pp_interleaved", "pp_zero_bubble"]
    assert all(r["ok"] and r["bytes_ok"] for r in result["equivalence"])
    assert set(result["skipped"]) == {"tp", "tp_sp"}
