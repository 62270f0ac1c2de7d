"""The planner: it ranks by simulated step time, keeps every refusal with its reason, refuses a
cluster nothing fits with a clear error, and answers the same through the CLI and the widget."""

import pytest

from rlm_course.cli import main
from rlm_course.cost.anatomy import Workload
from rlm_course.cost.architectures import get_spec
from rlm_course.cost.hardware import get_device
from rlm_course.cost.layouts import DoesNotFit
from rlm_course.cluster.planner import format_plan, plan, sensitivity, trainer_layouts
from rlm_course.cluster.planner_widget import PlannerWidget
from rlm_course.cluster.simulator import algorithm

H100 = get_device("H100-SXM-80GB")
WORKLOAD = Workload.long_tailed(64, 8, 256, 1000, 0.8, 4096, seed=0)


def test_the_plan_is_the_cheapest_simulated_candidate_and_says_why_others_lose():
    result = plan(get_spec("qwen2.5-7b"), algorithm("grpo", minibatches=4), WORKLOAD, H100, 16)
    costs = [c.cost for c in result.ranked]
    assert costs == sorted(costs) and result.best.cost == min(costs)
    assert {c.scenario.placement for c in result.ranked} == {"colocated", "disaggregated"}
    text = format_plan(result, top=2)
    assert text.startswith("1. ") and "why the others lose:" in text
    assert "memory per device" in text and "HFU" in text and "staleness" in text


def test_layouts_that_do_not_fit_are_refused_with_their_reason():
    config = algorithm("grpo")
    fits, refused = trainer_layouts(get_spec("llama-3-70b"), config, H100, 8, 4352, 8704)
    assert fits and all(lay.devices == 8 for lay in fits)
    assert any("needs" in r and "GB usable" in r for r in refused)
    # 16 bytes of model state per parameter: 1.13 TB for 70.6B, more than 8 x 72 GB, so every
    # layout that fits keeps its optimizer states in host memory
    assert all(lay.offload for lay in fits)
    fits64, _ = trainer_layouts(get_spec("llama-3-70b"), config, H100, 64, 4352, 8704)
    assert not any(lay.offload for lay in fits64)


def test_a_cluster_no_layout_fits_is_a_clear_error():
    with pytest.raises(DoesNotFit, match=r"no layout of llama-3-70b fits 2 x H100-SXM-80GB .* Use "
                                         r"more devices"):
        plan(get_spec("llama-3-70b"), algorithm("grpo"), WORKLOAD, H100, 2)


def test_cli_plan_prints_plans_and_rejects_bad_input(capsys):
    assert main(["plan", "--model", "qwen2.5-7b", "--gpus", "8", "--prompts", "32",
                 "--group-size", "8", "--mean-response", "500", "--max-response", "2048",
                 "--placement", "colocated", "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "qwen2.5-7b, grpo, 8 x H100-SXM-80GB" in out and "1. colocated" in out
    assert main(["plan", "--model", "gpt-9", "--gpus", "8"]) == 2
    assert "unknown architecture 'gpt-9'" in capsys.readouterr().err
    assert main(["plan", "--model", "qwen2.5-7b", "--gpus", "8", "--device", "TPU9"]) == 2
    assert "unknown device 'TPU9'" in capsys.readouterr().err
    assert main(["plan", "--model", "llama-3-70b", "--gpus", "1"]) == 2
    assert "no layout of llama-3-70b fits 1 x H100-SXM-80GB" in capsys.readouterr().err


def test_the_widget_answers_like_the_planner_and_shows_errors():
    w = PlannerWidget()
    for name, value in (("model", "qwen2.5-7b"), ("gpus", 8), ("prompts", 32), ("group_size", 8),
                        ("mean_response", 500.0), ("max_response", 2048), ("top", 1)):
        w.controls[name].value = value
    result = w.run()
    assert w.message == "" and result.best.step > 0 and "1. " in w.html.value
    w.controls["model"].value = "llama-3-70b"
    w.controls["gpus"].value = 1
    assert w.run() is None and "no layout of llama-3-70b fits" in w.html.value
    w.controls["mean_response"].value = 5000.0  # longer than its budget
    assert w.run() is None and "mean_len" in w.message


def test_modes_a_placement_cannot_run_are_refused_before_the_search(capsys):
    spec, grpo = get_spec("qwen2.5-7b"), algorithm("grpo", minibatches=4)
    with pytest.raises(ValueError, match="fused.*needs colocated devices"):
        plan(spec, grpo, WORKLOAD, H100, 8, placements=("disaggregated",), modes=["fused"])
    with pytest.raises(ValueError, match="async.*need disaggregated pools"):
        plan(spec, grpo, WORKLOAD, H100, 8, placements="colocated", modes=["async"])
    with pytest.raises(ValueError, match="at least 2 devices"):
        plan(spec, grpo, WORKLOAD, H100, 1, placements=("disaggregated",))
    with pytest.raises(ValueError, match="keep=0"):
        plan(spec, grpo, WORKLOAD, H100, 8, keep=0)
    # the default search still runs fused where it can: colocated only
    result = plan(spec, grpo, WORKLOAD, H100, 8, modes=["fused"])
    assert {c.scenario.placement for c in result.ranked} == {"colocated"}


def test_stage_fusion_needs_two_replicas():
    from rlm_course.cluster.simulator import MODES, Cluster, Scenario

    with pytest.raises(ValueError, match="at least 2 generation replicas"):
        Scenario(get_spec("qwen2.5-7b"), algorithm("grpo"), WORKLOAD, Cluster(H100, 8),
                 generation_tp=8, mode=MODES["fused"])
    # one device: nothing can score while the tail decodes, so no fused plan is offered
    result = plan(get_spec("qwen2.5-7b"), algorithm("grpo", minibatches=4), WORKLOAD, H100, 1)
    assert result.ranked and not any(c.scenario.mode.stage_fusion for c in result.ranked)


@pytest.mark.parametrize("flag, value, message", [
    ("--gpus", "0", "--gpus 0: give 1 or more"), ("--top", "0", "--top 0: give 1 or more"),
    ("--minibatches", "0", "--minibatches 0: give 1 or more"),
    ("--group-size", "0", "--group-size 0: give 1 or more"),
    ("--gpus", "100000", "up to 10,000 devices"),
    ("--mean-response", "0", "--mean-response 0: the mean response length must be at least 1"),
    ("--sigma", "-1", "--sigma -1: the spread of the log-normal lengths must be >= 0"),
    ("--max-response", "10", "--max-response 10 is below --mean-response 4000")])
def test_cli_plan_names_the_flag_that_is_wrong(capsys, flag, value, message):
    args = {"--model": "qwen2.5-7b", "--gpus": "8"}
    args[flag] = value
    assert main(["plan", *[x for kv in args.items() for x in kv]]) == 2
    assert message in capsys.readouterr().err


def test_printing_and_rounding_settings_that_make_no_sense_are_refused():
    from rlm_course.cluster.simulator import Cluster, Scenario, simulate

    result = plan(get_spec("qwen2.5-7b"), algorithm("grpo", minibatches=4), WORKLOAD, H100, 8,
                  placements=("colocated",), modes=["sync"])
    for top in (0, -1):
        with pytest.raises(ValueError, match=f"top={top}"):
            format_plan(result, top)
    with pytest.raises(ValueError, match="devices=0"):
        trainer_layouts(get_spec("qwen2.5-7b"), algorithm("grpo"), H100, 0, 1024, 4096)
    scenario = Scenario(get_spec("qwen2.5-7b"), algorithm("grpo"), WORKLOAD, Cluster(H100, 8))
    for buckets in (0, 1, -5):
        with pytest.raises(ValueError, match=f"length_buckets={buckets}"):
            simulate(scenario, length_buckets=buckets)


def test_more_threads_than_cores_are_allowed_but_explained():
    import os

    from rlm_course.utils import choose_threads

    cores = len(os.sched_getaffinity(0))
    threads, why = choose_threads(cores + 1)
    assert threads == cores + 1 and f"more than the {cores} cores" in why
    assert choose_threads(1) == (1, "as requested")


def test_staleness_is_priced_in_the_ranking_and_the_sensitivity_table_says_what_flips():
    spec, grpo = get_spec("qwen2.5-7b"), algorithm("grpo", minibatches=4)
    free = plan(spec, grpo, WORKLOAD, H100, 16, staleness_penalty=0.0)
    dear = plan(spec, grpo, WORKLOAD, H100, 16, staleness_penalty=5.0)
    for result, penalty in ((free, 0.0), (dear, 5.0)):
        costs = [c.cost for c in result.ranked]
        assert costs == sorted(costs)
        for c in result.ranked:
            assert c.cost == pytest.approx(c.step * (1 + penalty * c.result.staleness))
    # at a high price of staleness no plan that trains on stale samples can be cheaper than the
    # best synchronous one it beats by less than that price
    assert dear.best.result.staleness <= free.best.result.staleness
    with pytest.raises(ValueError, match="staleness_penalty"):
        plan(spec, grpo, WORKLOAD, H100, 16, staleness_penalty=-1)
    rows = sensitivity(spec, grpo, WORKLOAD, H100, 16,
                       variations={"decode_step_latency": (0.0, 0.05),
                                   "staleness_penalty": (0.0, 5.0)})
    assert [(r["rate"], r["value"]) for r in rows] == [
        ("decode_step_latency", 0.0), ("decode_step_latency", 0.05),
        ("staleness_penalty", 0.0), ("staleness_penalty", 5.0)]
    assert rows[3]["best"] == dear.best.name and rows[2]["best"] == free.best.name
    for r in rows:
        assert r["step"] > 0 and r["cost"] >= r["step"] and isinstance(r["flips"], bool)
    with pytest.raises(ValueError, match="not a rate"):
        sensitivity(spec, grpo, WORKLOAD, H100, 16, variations={"luck": (1,)})
