"""Chapters 12-13 on real processes: a Ray controller, weight sync, resharding, the asynchronous
pipeline and its faults. One local Ray instance for the whole module (started and stopped here)."""

import os
from dataclasses import replace
import signal
import threading
import time

import pytest
import torch

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.ray, pytest.mark.slow]

from rlm_course.lm.checkpoint import load_checkpoint  # noqa: E402
from rlm_course.lm.tokenizer import CharTokenizer  # noqa: E402
from rlm_course.rl.runs import default_sft_checkpoint  # noqa: E402
from rlm_course.rl.trainer import RLTrainer  # noqa: E402
from rlm_course.systems.async_rl import PipelineConfig  # noqa: E402
from rlm_course.systems.pipelines import run_pipeline  # noqa: E402
from rlm_course.systems.controller import (Controller, DeviceMapping, WorkerDiedError,  # noqa: E402
                                           start_ray, stop_ray)
from rlm_course.systems.experiments import async_config, reshard_controller_groups  # noqa: E402
from rlm_course.systems.pipelines import measure_link  # noqa: E402
from rlm_course.systems.workers import RLWorker  # noqa: E402
from rlm_course.systems.weight_sync import bucket_plan  # noqa: E402
from rlm_course.tasks import get_task  # noqa: E402
from rlm_course.tasks.eval_sets import load_eval_set  # noqa: E402

TASK = get_task("scratchpad")
CHECKPOINT = default_sft_checkpoint(TASK)


@pytest.fixture(scope="module", autouse=True)
def ray_instance():
    start_ray(num_cpus=2)
    yield
    stop_ray()


@pytest.fixture(scope="module")
def disaggregated():
    # half the CPUs: the other tests' controllers start while this one lives
    with Controller(DeviceMapping(actor=[0], rollout=[1]), cpus_per_device=0.5,
                    timeout=120) as controller:
        yield controller


def small_config(steps=2, **overrides):
    return async_config(steps=steps, prompts_per_step=4, group_size=4, **overrides)


def test_a_device_the_cluster_lacks_is_refused_before_any_worker_starts():
    with pytest.raises(ValueError, match=r"device\(s\) \[99\] do not exist"):
        Controller(DeviceMapping(actor=[0], rollout=[99]), cpus_per_device=0.5)


def test_groups_and_placement(disaggregated):
    c = disaggregated
    assert [w.name for w in c.workers] == ["actor/0", "rollout/0"]
    assert c.groups == {"world": [0, 1], "actor": [0], "rollout": [1], "sync": [0, 1]}
    assert len({w.pid for w in c.workers}) == 2 and all(w.pid for w in c.workers)


def test_weight_sync_is_exact_and_moves_the_formula_bytes(disaggregated):
    c = disaggregated
    actor, rollout = c.role_workers("actor")[0], c.role_workers("rollout")[0]
    config = dict(vocab_size=CharTokenizer().vocab_size, n_layer=2, n_head=2, d_model=32,
                  max_seq_len=16)
    nbytes = c.call([actor, rollout], RLWorker.make_model, config, per_worker=[{"seed": 0}, {"seed": 1}])[0]
    c.call([actor], RLWorker.perturb_model, 3)
    for bucket in (256, 4096, 2**20):
        out = c.call([actor, rollout], RLWorker.timed_sync, bucket, "sync", actor.rank, 1)
        sent, received = c.call([actor, rollout], RLWorker.model_state)
        assert all(torch.equal(sent[k], received[k]) for k in sent)
        sizes = [t.numel() * t.element_size() for t in sent.values()]
        assert out[0]["bucket_bytes"] == out[1]["bucket_bytes"]
        assert sum(out[0]["bucket_bytes"]) == nbytes == sum(sizes)
        assert len(out[0]["bucket_bytes"]) == len(bucket_plan(sizes, bucket))
    link, medians = measure_link(c, [actor, rollout], sizes=(2**10, 2**20, 2**24), repeats=3)
    assert link.beta > 0 and link.alpha >= 0 and len(medians) == 3


def test_eta_zero_pipeline_makes_the_synchronous_update(disaggregated):
    config = small_config(steps=2)
    result = run_pipeline(disaggregated, TASK, config, PipelineConfig(eta=0),
                          CHECKPOINT, evaluate=False)
    async_weights = disaggregated.call(disaggregated.role_workers("actor"), RLWorker.policy_state)[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' thread count: the same operations in the same order
    try:
        trainer = RLTrainer(load_checkpoint(CHECKPOINT)["model"], TASK, CharTokenizer(), config,
                            load_eval_set(TASK))
        for _ in range(config.steps):
            trainer.step()
    finally:
        torch.set_num_threads(threads)
    sync_weights = trainer.policy.state_dict()
    assert all(torch.equal(async_weights[k], sync_weights[k]) for k in sync_weights)
    assert [r["staleness_max"] for r in result.steps] == [0, 0]
    assert result.tokens_per_second > 0


@pytest.mark.parametrize("eta,partial", [(1, False), (2, True)])
def test_staleness_bound_holds_on_a_real_run(disaggregated, eta, partial):
    pipe = PipelineConfig(eta=eta, partial_rollout=partial, segment_tokens=8)
    result = run_pipeline(disaggregated, TASK, small_config(steps=4), pipe, CHECKPOINT,
                          evaluate=False)
    assert result.max_staleness <= eta
    assert [r["step"] for r in result.steps] == [1, 2, 3, 4]
    starts = {}
    for e in result.events:
        if e.stage == "generation":
            starts[e.step] = min(e.start, starts.get(e.step, e.start))
    trains = {e.step: e for e in result.events if e.stage == "training"}
    assert starts[2] < trains[1].end  # batch 2 was generated while step 1 trained
    if partial:  # some responses carry tokens of two versions or more
        assert len(result.token_versions) >= 2


def test_resharding_on_four_workers_is_exact_and_counts_its_bytes():
    from rlm_course.systems.experiments import reshard_experiment

    with Controller(DeviceMapping(actor=[0, 1, 2, 3]), groups=reshard_controller_groups(4, 2),
                    timeout=120) as c:
        out = reshard_experiment(c, repeats=1)
    m = out["split_bytes"]
    naive, hybrid = out["measured"]["naive"], out["measured"]["hybridflow"]
    assert naive["identical"] and hybrid["identical"]
    assert naive["received_bytes"] == [3 * m // 4] * 4  # all-gather over the 4 training ranks
    assert hybrid["received_bytes"] == [m // 4] * 4  # inside the micro-DP group of 2
    assert hybrid["redundant_bytes"] == [0] * 4
    assert naive["redundant_bytes"] == [m // 4] * 4  # the training shard kept beside
    assert max(hybrid["peak_bytes"]) < min(naive["peak_bytes"])
    assert out["predicted"]["naive"]["received_bytes"] == 3 * m / 4


def test_colocated_data_parallel_refuses_what_equal_weight_averaging_gets_wrong():
    """Per-worker token means averaged with equal weights: worker 0 has 2 responses of 6 tokens,
    worker 1 two of 1 token; the batch's token mean weights worker 0's tokens 12/14, the equal
    average 1/2. Per-response means (GRPO) and Dr. GRPO's constant are exact."""
    from rlm_course.algorithms import preset
    from rlm_course.rl.losses import aggregate_loss
    from rlm_course.systems.pipelines import check_colocated_data_parallel

    per_token = torch.arange(1.0, 15.0)
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[:2, :] = True
    mask[2:, 0] = True
    values = torch.zeros(4, 6)
    values[mask] = per_token
    for agg, exact in (("token-mean", False), ("seq-mean-token-mean", True),
                       ("seq-mean-token-sum-norm", True)):
        whole = aggregate_loss(values, mask, agg, 6)
        halves = (aggregate_loss(values[:2], mask[:2], agg, 6)
                  + aggregate_loss(values[2:], mask[2:], agg, 6)) / 2
        assert torch.isclose(whole, halves).item() is exact, agg
    for name in ("grpo", "dr_grpo", "rloo", "gspo"):
        check_colocated_data_parallel(preset(name), 2)
    for name, why in (("dapo", "token-mean"), ("ppo", "advantage='gae'"),
                      ("reinforce_pp", "reinforce_pp")):
        with pytest.raises(ValueError, match=why):
            check_colocated_data_parallel(preset(name), 2)
    check_colocated_data_parallel(preset("dapo"), 1)  # one worker is the one-process algorithm


def test_the_workers_rows_merge_counts_by_sum_and_stages_by_the_slowest():
    from rlm_course.systems.pipelines import _merge_metrics

    rows = [{"tokens_generated": 1753, "responses_trained": 64, "seconds_training": 0.6,
             "reward_mean": 0.25, "weight_max": 1.5, "head_version_min": 3, "prompt_columns": 12,
             "response_lengths": [1, 2], "checkpoint": False},
            {"tokens_generated": 1754, "responses_trained": 64, "seconds_training": 0.7,
             "reward_mean": 0.75, "weight_max": 1.0, "head_version_min": 2, "prompt_columns": 14,
             "response_lengths": [3], "checkpoint": True}]
    assert _merge_metrics(rows) == {
        "tokens_generated": 3507, "responses_trained": 128, "seconds_training": 0.7,
        "reward_mean": 0.5, "weight_max": 1.5, "head_version_min": 2, "prompt_columns": 14,
        "response_lengths": [1, 2, 3], "checkpoint": True}


def test_colocated_data_parallel_workers_stay_identical_and_fusion_keeps_early_responses():
    from rlm_course.systems.pipelines import fusion_experiment

    with Controller(DeviceMapping(actor=[0, 1], rollout=[0, 1]), timeout=120) as c:
        assert c.mapping.placement("actor", "rollout") == "colocated"
        assert [w.name for w in c.workers] == ["actor+rollout/0", "actor+rollout/1"]
        result = run_pipeline(c, TASK, small_config(steps=2), PipelineConfig(eta=0), CHECKPOINT,
                              evaluate=False)
        a, b = c.call(c.workers, RLWorker.policy_state)
        assert all(torch.equal(a[k], b[k]) for k in a)  # averaged gradients: one model
        # a step's row counts what both workers did: the whole batch, in whole tokens
        config = small_config(steps=2)
        for row in result.steps:
            assert row["responses_trained"] == config.prompts_per_step * config.group_size
            assert row["tokens_generated"] == int(row["tokens_generated"]) > 0
            assert row["seconds_generation"] > 0
        assert any(e.stage == "sync" and e.detail.get("in_process") for e in result.events)
        with pytest.raises(ValueError, match="colocated"):
            run_pipeline(c, TASK, small_config(), PipelineConfig(eta=1), CHECKPOINT)
        # refused before any worker loads: equal-weight averaging of per-worker token means
        with pytest.raises(ValueError, match="loss_agg='token-mean'"):
            run_pipeline(c, TASK, replace(small_config(), loss_agg="token-mean"),
                         PipelineConfig(eta=0), CHECKPOINT)
        fusion = fusion_experiment(c, TASK, small_config(), CHECKPOINT, steps=1)
    assert fusion["same_early_rows"]
    assert fusion["unfused_seconds"][0] > 0 and fusion["fused_seconds"][0] > 0


def test_a_killed_rollout_worker_stops_the_run_and_keeps_the_checkpoint(tmp_path):
    with Controller(DeviceMapping(actor=[0], rollout=[1]), timeout=60) as c:
        rollout = c.role_workers("rollout")[0]
        outcome = {}

        def run():
            try:
                run_pipeline(c, TASK, small_config(steps=200), PipelineConfig(
                    eta=1, checkpoint_every=1), CHECKPOINT, run_dir=tmp_path, evaluate=False)
            except Exception as err:  # noqa: BLE001 (the test inspects it)
                outcome["error"] = err

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.time() + 120
        while not (tmp_path / "checkpoint.pt").exists() and time.time() < deadline:
            time.sleep(0.2)
        assert (tmp_path / "checkpoint.pt").exists(), "no checkpoint within 2 minutes"
        os.kill(rollout.pid, signal.SIGKILL)
        thread.join(timeout=90)
        assert not thread.is_alive(), "the controller hung after a worker died"
    err = outcome.get("error")
    assert isinstance(err, WorkerDiedError), err
    assert "rollout/0" in str(err) and "checkpoint" in str(err)
    assert load_checkpoint(tmp_path / "checkpoint.pt")["step"] >= 1
