"""The planner: it ranks by simulated step time, keeps every refusal with its reason, refuses a
cluster nothing fits with a clear error, and answers the same through the CLI and the widget."""

import dataclasses

import pytest

from rlm_course.cli import main
from rlm_course.cost.anatomy import Workload
from rlm_course.cost.architectures import get_spec
from rlm_course.cost.hardware import get_device
from rlm_course.cost.layouts import DoesNotFit, Layout
from rlm_course.cluster.planner import (FEWER_MARGIN, OFFLOADED, fits_memory, format_plan, plan,
                                      sensitivity, trainer_layouts)
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
    # why a plan loses: the cost ratio, and the steps' ratio where staleness prices differ
    from rlm_course.cluster.planner import why

    best = result.best
    for c in result.ranked[1:]:
        said = why(c, best)
        assert said.startswith(f"{c.cost / best.cost:.2f}x ")
        if abs(c.result.staleness - best.result.staleness) > 0.05 and c.step > best.step:
            assert f"{c.step / best.step:.2f}x the best's step" in said, said
        elif c.step > best.step:
            assert f"x slower ({c.step:,.0f} s)" in said, said


def test_a_colocated_plan_offloads_the_trainer_while_generating_when_that_is_faster():
    """Llama-3.1-70B on 16 H100s, colocated, FSDP: the trainer's states resident beside a TP-8
    engine (17.6 GB of weights) leave room for 319 sequences' KV cache; offloaded while it
    generates, 580, for a copy each way over the host link. Both are ranked; the offloaded one
    generates faster and leads."""
    workload = Workload.long_tailed(512, 16, 512, 2000, 0.8, 8192, seed=0)
    result = plan(get_spec("llama-3.1-70b"), algorithm("grpo", minibatches=4), workload, H100, 16,
                  placements="colocated", modes=["sync"])
    best = result.best
    assert best.name.endswith(OFFLOADED) and best.scenario.offload_trainer
    resident = next(c for c in result.ranked if c.name == best.name.removesuffix(OFFLOADED))
    assert not resident.scenario.offload_trainer and resident.step > best.step
    # a sequence's KV cache on one of 8 ranks: 2 (K, V) x 80 layers x 8 KV heads x 128 x 2 bytes
    # / 8 = 40,960 bytes a token, at the prompt and the mean response
    per_sequence = 2 * 80 * 8 * 128 * 2 / 8 * (workload.prompt_len + workload.mean_response_len)
    for c in (best, resident):
        memory = c.result.memory
        room = (memory["usable"] - memory["rollout"]["weights"]
                - memory["rollout"].get("resident trainer state", 0.0))
        assert memory["slots"] == int(room // per_sequence)
    assert (best.result.memory["slots"], resident.result.memory["slots"]) == (580, 319)
    assert best.result.stages["generation"] < resident.result.stages["generation"]
    assert best.result.stages["offload"] > 0 and "offload" not in resident.result.stages


def test_a_plan_says_whether_memory_or_the_engine_caps_a_replica_batch():
    from rlm_course.cluster.calibration import calibrated_rates

    # Qwen2.5-7B's replicas hold the KV caches of thousands of these 1,256-token sequences; an
    # engine capped at 16 (max_num_seqs) decodes 16 at once, which the plan calls a cap, not room
    rates = calibrated_rates(H100)
    for max_batch, said in ((16, "a replica decodes at most 16 sequences at once (the engine's "
                                 "max_batch; its KV cache has room for more)"),
                            (10 ** 6, "KV cache room for ")):
        result = plan(get_spec("qwen2.5-7b"), algorithm("grpo", minibatches=4), WORKLOAD, H100,
                      8, rates=dataclasses.replace(rates, max_batch=max_batch),
                      placements=("colocated",), modes=["sync"])
        assert said in " ".join(format_plan(result, top=1, width=1000).split()), max_batch
        slots = result.best.result.memory["slots"]
        assert (slots == 16) if max_batch == 16 else (16 < slots < max_batch), slots


def test_why_a_plan_loses_names_the_stage_it_loses_by_not_the_one_it_shares():
    """Two plans with the same trainer (its update the largest stage of both): the loser loses by
    its slower generation, which is what the planner must say."""
    from types import SimpleNamespace

    from rlm_course.cluster.planner import why

    def candidate(generation, step, placement="colocated", update=173.0):
        stages = {"policy update": update, "generation": generation, "scoring": 86.0}
        result = SimpleNamespace(stages=stages, step_seconds=step, staleness=1.0)
        scenario = SimpleNamespace(placement=placement, rollout_pool=16)
        return SimpleNamespace(refused=None, result=result, cost=step * 1.1, step=step,
                               staleness_penalty=0.1, scenario=scenario)

    said = why(candidate(120.0, 379.0), candidate(95.0, 353.0))
    assert said == ("1.07x slower (379 s): waits for generation (generation 120 s, 32% of its "
                    "step, against 95 s in the best)"), said
    # a loser longer in no stage (the steps overlap differently): its largest stage
    said = why(candidate(90.0, 379.0), candidate(95.0, 353.0))
    assert said.endswith("training-bound (policy update 173 s, 46% of its step, against 173 s in "
                         "the best)"), said
    # against an asynchronous best whose trainer never waits for samples: said so, not "0 ms"
    said = why(candidate(120.0, 379.0), candidate(0.0, 353.0, "disaggregated"))
    assert said.endswith("waits for generation (generation 120 s, 32% of its step, where the "
                         "best generates on its own 16 rollout GPUs while its trainer trains)"), \
        said
    # nor set against the part of the best's generation its trainer waits for: a whole
    # generation phase is not comparable with a wait (DeepSeek-V3 on 1,024 H100s said "1,555 s
    # against 462 s in the best", whose rollout pool sets its 913 s step)
    said = why(candidate(120.0, 379.0), candidate(95.0, 353.0, "disaggregated"))
    assert said.endswith("waits for generation (generation 120 s, 32% of its step, where the "
                         "best generates on its own 16 rollout GPUs while its trainer trains, the "
                         "trainer waiting 95 s of its 353 s step for samples)"), said
    # on separate pools "generation" is the trainer's wait: a trainer that waits is held back by
    # the rollout pool, however much longer its update is than the best's (a slower trainer
    # behind the same rollout pool takes the same step)
    said = why(candidate(120.0, 379.0, "disaggregated", update=250.0), candidate(0.0, 353.0))
    assert said == ("1.07x slower (379 s): generation-bound (its 16 rollout GPUs set the 379 s "
                    "step: the trainer waits 120 s of it, 32%, for samples)"), said
    # a trainer that barely waits (2% of the step or less) is held back by its own stages
    said = why(candidate(5.0, 379.0, "disaggregated", update=250.0), candidate(0.0, 353.0))
    assert said.endswith("training-bound (policy update 250 s, 66% of its step, against 173 s in "
                         "the best)"), said


def test_layouts_that_do_not_fit_are_refused_with_their_reason():
    config = algorithm("grpo")
    fits, refused = trainer_layouts(get_spec("llama-3-70b"), config, H100, 8, 4352, 8704)
    assert fits and all(lay.devices == 8 for lay in fits)
    assert any("needs" in r and "GB usable" in r for r in refused)
    # 16 bytes of model state per parameter: 1.13 TB for 70.6B, more than 8 x 76.4 GB, so every
    # layout that fits keeps its optimizer states in host memory
    assert all(lay.offload for lay in fits)
    fits64, _ = trainer_layouts(get_spec("llama-3-70b"), config, H100, 64, 4352, 8704)
    assert not any(lay.offload for lay in fits64)


def test_a_cluster_no_layout_fits_is_a_clear_error():
    # 4 GPUs: the nearest layout (dp4 fsdp, offloaded) needs 113.8 GB of 76.4 GB usable; 8 fit
    with pytest.raises(DoesNotFit, match=r"no layout of llama-3-70b fits 2 x H100-SXM-80GB for "
                                         r"this workload; the smallest count that fits is 8 \(on 4 "
                                         r"the nearest layout misses by 37.4 GB\)\. .* Use 8 or "
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
    assert main(["plan", "--model", "llama-3.1-70b", "--gpus", "1"]) == 2
    assert "no layout of llama-3.1-70b fits 1 x H100-SXM-80GB" in capsys.readouterr().err
    # Llama 3 reads 8,192 tokens: a budget of 512 + 16,384 does not fit its window
    assert main(["plan", "--model", "llama-3-70b", "--gpus", "8", "--max-response", "16384"]) == 2
    err = capsys.readouterr().err
    assert "llama-3-70b reads at most 8,192 tokens" in err and "16,896" in err
    assert "lower --max-response to at most 7,680 tokens" in err and "llama-3.1-70b" in err
    # without --max-response the budget is 16,384 or what the window leaves: 8,192 - 512
    assert main(["plan", "--model", "llama-3-8b", "--gpus", "8", "--prompts", "32",
                 "--group-size", "8", "--mean-response", "500", "--placement", "colocated",
                 "--top", "1"]) == 0
    # the header gives the mean of the lengths drawn beside the one asked for, and how many the
    # budget cut: none here, so a small batch's mean is off by chance, not by the cap
    assert "(mean 500, 518 in the 256 drawn, none capped, sigma 0.8, at most 7,680)" in \
        capsys.readouterr().out
    # a budget hint fits the window, and a mean the window cannot hold says so
    assert main(["plan", "--model", "llama-3-8b", "--gpus", "8", "--max-response", "100"]) == 2
    assert "raise it (e.g. --max-response 7680)" in capsys.readouterr().err
    assert main(["plan", "--model", "llama-3-8b", "--gpus", "8", "--mean-response", "9000"]) == 2
    # (the budget the CLI derived from the window is not named as if it had been given)
    assert ("--mean-response 9000 does not fit the window: the model reads at most "
            "8,192 tokens (its context window), so a prompt of 512 leaves at most 7,680 for a "
            "response: lower --mean-response to at most 7,680, shorten --prompt-len, or choose a "
            "model with a longer window.") in capsys.readouterr().err
    # a mean past a long window and past the budget: the hint names the budget, and following
    # it plans
    assert main(["plan", "--model", "llama-3.1-8b", "--gpus", "8", "--mean-response",
                 "1e12"]) == 2
    assert ("lower --mean-response to at most 16,384 (its budget, --max-response 16384), or "
            "raise --max-response to at most 130,560 and the mean with it") in (
        capsys.readouterr().err)
    assert main(["plan", "--model", "llama-3.1-8b", "--gpus", "8", "--mean-response", "16384",
                 "--placement", "colocated", "--top", "1"]) == 0
    # the budget cuts the tail, and the header says by how much (the drawn lengths' mean) and
    # how many it cut
    drawn = Workload.long_tailed(512, 16, 512, 16384, 0.8, 16384, 0)
    capped, cut = drawn.mean_response_len, sum(n == 16384 for n in drawn.lengths)
    assert 0.6 * 16384 < capped < 0.75 * 16384 and 0 < cut < 8192
    assert (f"(mean 16,384 before the cap, {capped:,.0f} after ({cut:,} of 8,192 capped), "
            "sigma 0.8, at most 16,384)" in capsys.readouterr().out)
    # a mean and a budget both past the window: one message names both, and following it plans
    assert main(["plan", "--model", "llama-3-8b", "--gpus", "8", "--mean-response", "10000",
                 "--max-response", "20000"]) == 2
    assert ("lower --mean-response and --max-response to at most 7,680, shorten --prompt-len, or "
            "choose a model with a longer window.") in capsys.readouterr().err
    # a prompt that fills the window leaves nothing to lower but the prompt
    for prompt_len in ("131072", "200000"):
        assert main(["plan", "--model", "llama-3.1-8b", "--gpus", "16", "--prompt-len",
                     prompt_len]) == 2
        assert (f"--prompt-len {int(prompt_len):,}: the model reads at most 131,072 tokens (its "
                "context window), so the prompt leaves no room for a response; shorten "
                "--prompt-len to below 131,072") in capsys.readouterr().err
    assert main(["plan", "--model", "llama-3-8b", "--gpus", "8", "--mean-response", "7680",
                 "--max-response", "7680", "--placement", "colocated", "--top", "1"]) == 0


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
    w.controls["group_size"].value = 1  # GRPO's group baseline needs two responses a prompt
    assert w.run() is None and w.message.startswith(
        "group size 1 with algorithm grpo: its group baseline needs 2 or more responses per prompt")
    assert "give group size 2 or more" in w.message and "--" not in w.message
    w.controls["group_size"].value = 8
    w.controls["max_response"].value = 16384  # past Llama 3's 8,192-token window
    assert w.run() is None and "lower max response to at most 7,680 tokens" in w.message
    w.controls["max_response"].value = 2048
    w.controls["mean_response"].value = 5000.0  # longer than its budget
    assert w.run() is None and w.message.startswith("max response 2048 is below mean response "
                                                    "5000: the budget caps the lengths")
    assert "(e.g. max response 7680)" in w.message  # within the model's window


def test_the_search_functions_refuse_bad_arguments_by_name():
    import numpy as np

    from rlm_course.cluster.calibration import calibrated_rates
    from rlm_course.cluster.planner import smallest_fitting_gpus

    spec, grpo = get_spec("qwen2.5-7b"), algorithm("grpo", minibatches=4)
    for call, message in (
            (lambda: fits_memory("qwen2.5-7b", grpo, WORKLOAD, H100, 8),
             "spec='qwen2.5-7b' must be a TransformerSpec"),
            (lambda: fits_memory(spec, grpo, WORKLOAD, "H100-SXM-80GB", 8),
             "device='H100-SXM-80GB' must be a Device"),
            (lambda: fits_memory(spec, grpo, WORKLOAD, H100, 0),
             "fits_memory: gpus=0 must be a positive integer"),
            (lambda: fits_memory(spec, grpo, WORKLOAD, H100, 8, None, ("bogus",)),
             "fits_memory: placements=('bogus',): give colocated, disaggregated or both"),
            (lambda: smallest_fitting_gpus(spec, grpo, WORKLOAD, "H100-SXM-80GB", 2),
             "device='H100-SXM-80GB' must be a Device"),
            (lambda: sensitivity(spec, grpo, WORKLOAD, H100, 8, variations=["train_hfu"]),
             "sensitivity: variations=['train_hfu'] must be {rate: values to try}, e.g."),
            (lambda: sensitivity(spec, grpo, WORKLOAD, H100, 8, rates="verl"),
             "rates='verl' must be a Rates or None")):
        with pytest.raises(ValueError) as caught:
            call()
        assert message in str(caught.value), str(caught.value)
    # rates default to the device's calibrated ones, numpy's integers count devices
    assert fits_memory(spec, grpo, WORKLOAD, H100, np.int64(8)) == \
        fits_memory(spec, grpo, WORKLOAD, H100, 8, calibrated_rates(H100)) == (True, "")
    # a link moved as the rates file writes it, [alpha, beta]
    rows = sensitivity(spec, grpo, WORKLOAD, H100, 8, variations={"intra_link": [[1e-6, 1e11]]})
    assert [(r["rate"], list(r["value"])) for r in rows] == [("intra_link", [1e-6, 1e11])]


def test_modes_a_placement_cannot_run_are_refused_before_the_search(capsys):
    spec, grpo = get_spec("qwen2.5-7b"), algorithm("grpo", minibatches=4)
    with pytest.raises(ValueError, match="fused.*needs colocated devices"):
        plan(spec, grpo, WORKLOAD, H100, 8, placements=("disaggregated",), modes=["fused"])
    with pytest.raises(ValueError, match="async.*need disaggregated pools"):
        plan(spec, grpo, WORKLOAD, H100, 8, placements="colocated", modes=["async"])
    # one step off on colocated devices would only wait a step: refused, not planned
    with pytest.raises(ValueError, match=r"modes one-step-off do not run on the colocated "
                                         r"placement.*\(one-step-off, async, async-eta2\)"):
        plan(spec, grpo, WORKLOAD, H100, 8, placements="colocated", modes=["one-step-off"])
    with pytest.raises(ValueError, match="at least 2 devices"):
        plan(spec, grpo, WORKLOAD, H100, 1, placements=("disaggregated",))
    # on one device the off-policy modes are refused for what they need, two pools, not memory
    with pytest.raises(ValueError, match=r"gpus=1 with modes async: they run on disaggregated "
                                         r"pools only, which need at least 2 devices"):
        plan(spec, grpo, WORKLOAD, H100, 1, modes=["async"])
    with pytest.raises(ValueError, match="keep=0"):
        plan(spec, grpo, WORKLOAD, H100, 8, keep=0)
    # the default search still runs fused where it can: colocated only
    result = plan(spec, grpo, WORKLOAD, H100, 8, modes=["fused"])
    assert {c.scenario.placement for c in result.ranked} == {"colocated"}


def test_stage_fusion_needs_two_replicas():
    from rlm_course.cluster.simulator import MODES, Cluster, Scenario

    with pytest.raises(ValueError, match="at least 2 generation replicas"):  # 4 devices, one tp4
        Scenario(get_spec("qwen2.5-7b"), algorithm("grpo"), WORKLOAD, Cluster(H100, 4),
                 generation_tp=4, trainer=Layout(dp=4), mode=MODES["fused"])
    with pytest.raises(ValueError, match="tp=8 does not divide qwen2.5-7b's 28 attention heads"):
        Scenario(get_spec("qwen2.5-7b"), algorithm("grpo"), WORKLOAD, Cluster(H100, 8),
                 generation_tp=8, mode=MODES["fused"])  # refused up front, as no engine runs it
    # one device: nothing can score while the tail decodes, so no fused plan is offered
    result = plan(get_spec("qwen2.5-7b"), algorithm("grpo", minibatches=4), WORKLOAD, H100, 1)
    assert result.ranked and not any(c.scenario.mode.stage_fusion for c in result.ranked)
    # where the best-ranked generation TP leaves one replica, fused runs at the next one that
    # leaves two (Llama-3.1-8B on 2 GPUs ranks TP 2 first: fused was never tried)
    two = plan(get_spec("llama-3.1-8b"), algorithm("grpo", minibatches=4), WORKLOAD, H100, 2,
               modes=["fused"])
    assert two.ranked and all(c.scenario.mode.stage_fusion and c.scenario.generation_tp == 1
                              for c in two.ranked)
    # asked for fused alone on one device: not a memory problem, and the message says so
    from rlm_course.cluster.planner import NoLayoutFits

    with pytest.raises(NoLayoutFits) as caught:
        plan(get_spec("r1-distill-qwen-1.5b"), algorithm("grpo", minibatches=4), WORKLOAD, H100,
             1, modes=["fused"])
    assert str(caught.value) == (
        "no plan of r1-distill-qwen-1.5b runs on 1 x H100-SXM-80GB: 1 fits memory, but not with "
        "the placements and modes asked (stage fusion needs two generation replicas, a "
        "disaggregated mode a pool of devices for each role). Use more devices, or the sync mode.")


@pytest.mark.parametrize("flag, value, message", [
    ("--gpus", "0", "--gpus 0: give 1 or more"), ("--top", "0", "--top 0: give 1 or more"),
    ("--minibatches", "0", "--minibatches 0: give 1 or more"),
    ("--group-size", "0", "--group-size 0: give 1 or more"),
    ("--gpus", "100000", "up to 10,000 devices"),
    ("--mean-response", "0", "--mean-response 0: the mean response length must be at least 1"),
    ("--sigma", "-1", "--sigma -1: the spread of the log-normal lengths must be >= 0"),
    ("--max-response", "10", "--max-response 10 is below --mean-response 4000"),
    # past the limits: a batch that would take minutes to hours, steps that no recipe takes, a
    # spread at which the lengths no longer have their mean
    ("--prompts", "100000", "--prompts 100000 x --group-size 16 = 1,600,000 responses per "
                            "iteration: the planner simulates at most 65,536"),
    ("--minibatches", "2049", "--minibatches 2049: give at most 1,024 gradient steps"),
    ("--sigma", "50", "--sigma 50: the spread of the log-normal lengths must be >= 0 and at "
                      "most 3, and finite"),
    ("--mean-response", "inf", "--mean-response inf: the mean response length must be at least "
                               "1 token, and finite"),
    ("--mean-response", "1e308", "--max-response 16384 is below --mean-response 1e+308")])
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
    with pytest.raises(ValueError, match=rf"--threads {8 * cores + 1}: more than 4 threads per "
                                         rf"core on these {cores} cores"):
        choose_threads(8 * cores + 1)


def test_too_many_threads_are_said_even_without_progress_lines(capsys):
    import argparse
    import os

    import torch

    from rlm_course.cli.train import set_threads

    cores, before = len(os.sched_getaffinity(0)), torch.get_num_threads()
    try:
        set_threads(argparse.Namespace(threads=cores + 1, no_progress=True, device=None))
        assert f"more than the {cores} cores" in capsys.readouterr().err
        set_threads(argparse.Namespace(threads=1, no_progress=True, device=None))
        assert capsys.readouterr().err == ""  # a fitting count stays quiet
    finally:
        torch.set_num_threads(before)


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
    base = plan(spec, grpo, WORKLOAD, H100, 16).best
    for r in rows:
        assert r["step"] > 0 and r["cost"] >= r["step"] and isinstance(r["flips"], bool)
        # a flip is a new best that beats the plan above by more than the simulator's resolution
        # (FEWER_MARGIN); the plan above still best is 0 behind, a closer winner a tie
        assert r["flips"] == (r["behind"] > FEWER_MARGIN) and r["behind"] >= 0
        if r["best"] == base.name:
            assert r["behind"] == 0 and not r["flips"]
    with pytest.raises(ValueError, match="not a rate"):
        sensitivity(spec, grpo, WORKLOAD, H100, 16, variations={"luck": (1,)})
    # a base planned for another request would make every row a flip: refused by name
    with pytest.raises(ValueError, match=r"base is a plan of qwen2.5-7b on 16 x H100-SXM-80GB, "
                                         r"not of this request \(qwen2.5-7b on 8 x"):
        sensitivity(spec, grpo, WORKLOAD, H100, 8, base=free, variations={"train_hfu": (0.3,)})


R1 = Workload.long_tailed(512, 16, 512, 4000, 0.8, 16384, seed=0)  # chapter 14's R1-style run


def test_when_nothing_fits_the_planner_says_how_many_gpus_would():
    from rlm_course.cluster.calibration import calibrated_rates
    from rlm_course.cluster.planner import NoLayoutFits, smallest_fitting_gpus

    spec, grpo, rates = get_spec("deepseek-v3"), algorithm("grpo", minibatches=16), \
        calibrated_rates(H100)
    search = smallest_fitting_gpus(spec, grpo, R1, H100, 16, rates)
    # doubling: 16, 32, 64 miss, 128 fits; then every whole node from 16 up, 24..96 (32 and 64
    # known): 96 is the first that fits; then the counts between 88 and 96, which miss too; then
    # the counts just below 16 (a node, then powers of two): none fits
    assert search.checked == [16, 32, 64, 128, 24, 40, 48, 56, 72, 80, 88, 96,
                              *range(89, 96), 8, 4, 2, 1]
    assert search.fits_below is None and search.fits_between is None
    assert (search.fits, search.below) == (96, 88)
    # on 88 the nearest layout is 24 rollout GPUs and a dp64 fsdp trainer with micro-batches of
    # one sequence and the optimizer on the host: 86.4 GB per device of 76.4 usable (90% of the
    # 84.9 GB CUDA reports); the nearest miss named is a count one provisions, the whole node
    # under the fit (88), not the counts 89-95 between, which miss too
    assert search.miss_gb == pytest.approx(10.0) and "dp64 fsdp" in search.reason
    assert search.describe() == ("the smallest count that fits is 96 (on 88 the nearest "
                                 "layout misses by 10.0 GB)")
    # from 11, the doubling's 22 fits, then whole nodes: 16 fits; between 11 and 16, 12 fits too
    # (tp4 replicas), and the search says so, with the whole node below the asked count that fits
    eleven = smallest_fitting_gpus(get_spec("llama-3.1-70b"), grpo, R1, H100, 11, rates)
    assert eleven.checked[:3] == [11, 22, 16]
    assert (eleven.fits, eleven.below, eleven.fits_between, eleven.fits_below) == (16, 11, 12, 8)
    assert eleven.describe() == ("the smallest count above 11 that fits is 12, of whole nodes 16 "
                                 "(on 11 the nearest layout misses by 14.9 GB); 8, below it, fits")
    with pytest.raises(NoLayoutFits) as caught:
        plan(spec, grpo, R1, H100, 16, rates=rates, length_buckets=16)
    message = str(caught.value)
    assert message.startswith("no layout of deepseek-v3 fits 16 x H100-SXM-80GB for this "
                              "workload; the smallest count that fits is 96 (on 88 the "
                              "nearest layout misses by 10.0 GB). The nearest miss on 16: ")
    # (on 16 the excess is model states: shorter sequences are not offered)
    assert message.endswith("Use 96 or more devices or a device with more memory.") \
        and "\n" not in message
    assert message.count("more memory") == 1  # the nearest miss's generic advice is not repeated
    # the nearest miss named for the asked count is the search's (every pool split), the one the
    # clause before it measures; on 10,000 it misses by 19.6 GB, both times (dp39 tp8 pp8: the
    # busiest stage holds 8 of the 61 layers and the output head, and under 1F1B the first
    # stage's activations of 8 micro-batches of 8 layers: 64 layers' worth)
    with pytest.raises(NoLayoutFits) as huge:
        plan(spec, grpo, R1, H100, 10000, rates=rates, length_buckets=16)
    said = str(huge.value)
    assert "fits 10,000 x H100-SXM-80GB" in said and "nearest miss on 10,000: " in said
    assert "misses by 19.6 GB" in said and "needs 96.0 GB per H100-SXM-80GB" in said
    assert caught.value.search.fits == 96
    assert "fsdp recompute cpu-optimizer (micro-batches of one sequence) of deepseek-v3 needs " \
        "275.1 GB" in message  # the nearest miss on 16, at the budget it was tried with
    # and the answer is a plan: 96 GPUs plan, on micro-batches of one sequence, which it says
    best = plan(spec, grpo, R1, H100, 96, rates=rates, length_buckets=16).best
    assert best.step > 0 and best.scenario.trainer_layout.micro_batch_tokens == 512 + 16384
    assert "recompute cpu-optimizer (micro-batches of one sequence), " in best.name
    # a limit below the answer: none fits up to it, and the largest miss is the limit
    capped = smallest_fitting_gpus(spec, grpo, R1, H100, 16, rates, limit=64)
    assert (capped.fits, capped.below, capped.checked) == (None, 64, [16, 32, 64, 8, 4, 2, 1])
    assert capped.describe() == ("no count up to 64 fits (on 64 the nearest layout misses by "
                                 "10.0 GB)")
    # fitting is not monotonic in the count: Llama-3.1-70B misses on 13 and 17 and fits on 12,
    # 14, 15, 16 and 24, so the answer is the smallest fitting count from the one asked, not from
    # the last doubling that missed (which said 34 for 17)
    llama = get_spec("llama-3.1-70b")
    assert [fits_memory(llama, grpo, R1, H100, n, rates)[0]
            for n in (12, 13, 14, 15, 16, 17, 24)] == [True, False, True, True, True, False, True]
    assert smallest_fitting_gpus(llama, grpo, R1, H100, 7, rates).fits == 8
    seventeen = smallest_fitting_gpus(llama, grpo, R1, H100, 17, rates)
    assert (seventeen.fits, seventeen.fits_below) == (24, 16)
    # a count that factors badly misses where whole nodes just below and above it fit, and each
    # count the message names plans (the planner's data-parallel limit applies to the search:
    # 512 x 16 responses in 16 gradient steps allow at most 512 data-parallel ranks)
    odd = smallest_fitting_gpus(spec, grpo, R1, H100, 1000, rates)
    assert (odd.fits_below, odd.fits) == (984, 1016)
    assert odd.describe() == ("the smallest count above 1,000 that fits is 1,016 (on 1,008 the "
                              "nearest layout misses by 8.7 GB); 984, below it, fits")
    for count in (984, 1016):
        assert plan(spec, grpo, R1, H100, count, rates=rates, length_buckets=16).best.step > 0
    # none fits from the asked count to the limit, some below it do: said without contradiction
    above = dataclasses.replace(odd, fits=None, limit=1008)
    assert above.describe() == ("no count from 1,000 up to 1,008 fits (on 1,008 the nearest "
                                "layout misses by 8.7 GB); 984, below it, fits")
    at = dataclasses.replace(odd, asked=1008, fits=None, limit=1008)
    assert at.describe() == ("1,008 does not fit (on 1,008 the nearest layout misses by 8.7 GB) "
                             "and the planner plans at most 1,008 GPUs; 984, below it, fits")
    with pytest.raises(ValueError, match="gpus=0"):
        smallest_fitting_gpus(spec, grpo, R1, H100, 0, rates)


def test_advice_applies_to_the_layout_it_names():
    from rlm_course.cluster.calibration import calibrated_rates
    from rlm_course.cluster.planner import advise, data_parallel_ranks, shortfall_gb
    from rlm_course.cost.layouts import Layout, check_training, kv_slots

    spec, grpo = get_spec("deepseek-v3"), algorithm("grpo", minibatches=16)
    fits, refused = trainer_layouts(spec, grpo, H100, 64, 16896, 33792)
    assert not fits
    # the nearest: FSDP over all 64 with micro-batches of one sequence and the optimizer on the
    # host; half its activations and logits (11.8 GB) cover the 10.0 GB it misses by, so TP
    # added to FSDP is offered (not PP: a first stage keeps as many activations), nor ZeRO-3
    # (it is), nor offloading (done)
    nearest = min(refused, key=shortfall_gb)
    assert nearest.startswith("trainer layout dp64 fsdp recompute cpu-optimizer (micro-batches "
                              "of one sequence) of deepseek-v3 needs 86.4 GB")
    assert nearest.endswith("76.4 GB usable (90% of 84.9 GB): add tensor parallelism to FSDP "
                            "(raise tp, keeping the states sharded: it splits the activations; "
                            "the layouts searched here pair TP with ZeRO-1), or use more GPUs or "
                            "a device with more memory.")
    # one data-parallel rank (tp8 x pp8 = all 64 GPUs): no ZeRO label, no ZeRO advice, no larger
    # model-parallel group that divides 64, the optimizer already offloaded
    one_rank = [r for r in refused if r.startswith("trainer layout dp1 tp8 pp8 recompute "
                                                   "cpu-optimizer fp32-grads")]
    # two micro-batch budgets, two sequences and one (said): 99.0 and 96.0 GB
    assert [r.split(" per ")[0].split("needs ")[1] for r in one_rank] == ["99.0 GB", "96.0 GB"]
    assert ["(micro-batches of one sequence) of" in r for r in one_rank] == [False, True]
    assert all(r.endswith("76.4 GB usable (90% of 84.9 GB): use more GPUs or a device with more "
                          "memory.") for r in one_rank)
    for reason in refused:  # ZeRO advice only where a parameter has more than one rank
        layout = reason.split(" of deepseek-v3")[0]
        one_rank = " dp1 " in layout + " " and (" ep" not in layout or " zero" not in layout)
        assert not (one_rank and "ZeRO" in reason), reason
    # by hand: dp2 tp8 pp4 ep16 holds its dense part on 2 ranks, its experts on 8 x 2 / 16 = 1
    two = Layout(dp=2, tp=8, pp=4, ep=16, zero=1, recompute=True, main_grads_fp32=True,
                 micro_batch_tokens=33792)
    assert data_parallel_ranks(spec, two) == 2
    one = Layout(dp=1, tp=8, pp=8, recompute=True, main_grads_fp32=True, micro_batch_tokens=33792)
    assert data_parallel_ranks(spec, one) == 1
    for layout, devices, expected in (
            (two, 64, "GB): shard the model states over its 2 data-parallel ranks with "
                      "ZeRO-3/FSDP, or split each model copy over more of the 64 GPUs (raise tp or "
                      "pp), or offload the optimizer states to the host, or use more GPUs or a "
                      "device with more memory."),
            (one, 64, "76.4 GB usable (90% of 84.9 GB): offload the optimizer states to the host, or "
                      "use more GPUs"),
            (one, 128, "split each model copy over more of the 128 GPUs (raise tp or pp)")):
        with pytest.raises(DoesNotFit) as caught:
            check_training(spec, layout, H100, 16896)
        assert expected in advise(str(caught.value), spec, H100, devices, trainer=layout)
        if layout is one:
            assert "ZeRO" not in advise(str(caught.value), spec, H100, devices, trainer=layout)
    # FSDP over the whole pool already gives a device 1/2 of the states: a larger TP or PP only
    # splits the activations, which is advice only when half of them cover the excess
    # (Llama-3.1-70B on 2 GPUs misses by 73 GB, 8 of them activations and logits; Qwen2.5-7B on
    # 8 at 131,072 tokens by 34 GB, 106 of them activations and logits)
    for name, devices, seq, advised in (("llama-3.1-70b", 2, 4096, False),
                                        ("qwen2.5-7b", 8, 131072, True)):
        fsdp = Layout(dp=devices, zero=3, recompute=True, offload=True, micro_batch_tokens=seq)
        with pytest.raises(DoesNotFit) as caught:
            check_training(get_spec(name), fsdp, H100, seq)
        said = advise(str(caught.value), get_spec(name), H100, devices, trainer=fsdp)
        assert ("add tensor parallelism to FSDP (raise tp, keeping the states sharded: it "
                "splits the activations; the layouts searched here pair TP with ZeRO-1)"
                in said) is advised, said
        assert "raise tp or pp" not in said
    # generation: tp16 on a 16-GPU rollout pool cannot be raised; on 32 GPUs it can
    with pytest.raises(DoesNotFit) as caught:
        kv_slots(spec, 16, H100, 4512, calibrated_rates(H100).memory_fraction)
    on16 = advise(str(caught.value), spec, H100, 16, generation_tp=16)
    assert "raise the generation tp" not in on16
    assert on16.endswith("usable: give the rollout more GPUs or use a device with more memory.")
    assert "raise the generation tp (to 32)" in advise(str(caught.value), spec, H100, 32,
                                                       generation_tp=16)
    # 671B parameters in bf16 over 16 devices: 83.9 GB, + 0.32 GB of KV, of 76.4 GB usable
    assert shortfall_gb(str(caught.value)) == pytest.approx(83.9 + 0.32 - 76.4, abs=0.06)
    # a single device has nothing to shard: the layout says so
    fits1, _ = trainer_layouts(get_spec("r1-distill-qwen-1.5b"), grpo, H100, 1, 4352, 8704)
    assert fits1 and all(lay.zero == 0 and "fsdp" not in lay.describe() for lay in fits1)


def test_pools_have_their_sides_named_and_each_mode_one_name():
    from rlm_course.cluster.planner import mode_key, pool_label
    from rlm_course.cluster.simulator import MODES

    assert pool_label(256, 64) == "disaggregated: 64 rollout GPUs + 192 training GPUs"
    assert pool_label(256, None) == "colocated"
    assert {k: mode_key(m) for k, m in MODES.items()} == {k: k for k in MODES}
    result = plan(get_spec("qwen2.5-7b"), algorithm("grpo", minibatches=4), WORKLOAD, H100, 16)
    for c in result.ranked:
        s = c.scenario
        side = ("colocated" if s.placement == "colocated" else
                f"disaggregated: {s.rollout_gpus} rollout GPUs + {s.trainer_pool} training GPUs")
        assert c.name.startswith(side + ", ")
        assert c.name.removesuffix(OFFLOADED).endswith(", " + mode_key(s.mode))
    text = format_plan(result, top=3)
    assert "rollout GPUs + " in text and not __import__("re").search(r"\d+:\d+", text)


def test_the_printed_plan_fits_100_columns_and_never_splits_a_number():
    result = plan(get_spec("qwen2.5-7b"), algorithm("grpo", minibatches=4), WORKLOAD, H100, 16)
    text = format_plan(result, top=3)
    assert max(len(line) for line in text.splitlines()) <= 100
    flat = " ".join(line.strip() for line in text.splitlines())
    for c in result.ranked[:3]:
        r = c.result
        assert f"step {r.step_seconds:,.1f} s, {r.tokens_per_second:,.0f} tokens/s" in flat
        assert f"MFU {r.mfu:.1%}" in flat
    with pytest.raises(ValueError, match="width=10"):
        format_plan(result, width=10)


def test_a_device_without_links_plans_one_device():
    from rlm_course.cluster.planner import linked_gpus
    from rlm_course.cost.hardware import load_catalog

    if "this-machine" not in load_catalog():
        pytest.skip("this machine is not measured (python -m rlm_course hardware --measure)")
    cpu = get_device("this-machine")
    assert linked_gpus(cpu) == 1 and linked_gpus(H100) == float("inf")
    small = Workload.long_tailed(4, 2, 64, 100, 0.8, 256, seed=0)
    spec = get_spec("r1-distill-qwen-1.5b")
    with pytest.raises(ValueError, match=r"gpus=2: this-machine has no link between devices "
                                         r"\(one device per node and no network between nodes\), "
                                         r"so a plan holds at most 1"):
        plan(spec, algorithm("grpo"), small, cpu, 2)
    result = plan(spec, algorithm("grpo"), small, cpu, 1)
    assert result.best.scenario.placement == "colocated" and result.best.step > 0


def test_the_widget_refuses_0_gpus_marks_a_stale_answer_and_says_how_many_fit():
    from rlm_course.cluster.planner_widget import STALE

    w = PlannerWidget()
    for name, value in (("model", "qwen2.5-7b"), ("gpus", 8), ("prompts", 32), ("group_size", 8),
                        ("mean_response", 500.0), ("max_response", 2048), ("top", 1)):
        w.controls[name].value = value
    assert w.output == "" and not w.stale  # nothing planned yet: nothing to mark
    assert w.run() is not None and not w.stale and w.output.startswith("<pre>1. ")
    answer = w.output
    w.controls["gpus"].value = 0  # the box keeps 0: no silent clamp to 1
    assert w.controls["gpus"].value == 0 and w.stale
    assert w.output.startswith(f"<div style='color:#888'><p><b>{STALE}</b></p>")
    assert answer in w.output and w.html.value == w.output
    assert w.run() is None and w.message == "GPUs 0: give 1 or more." and not w.stale
    w.controls["gpus"].value = -3
    assert w.run() is None and w.message == "GPUs -3: give 1 or more."
    w.controls["group_size"].value = 0
    w.controls["gpus"].value = 8
    assert w.run() is None and w.message == "group size 0: give 1 or more."
    w.controls["group_size"].value = 8
    w.controls["model"].value = "deepseek-v3"
    w.controls["gpus"].value = 16
    assert w.run() is None
    assert "no layout of deepseek-v3 fits 16 x H100-SXM-80GB" in w.message
    assert "the smallest count that fits is " in w.message and STALE not in w.output


def test_a_typo_of_an_option_is_refused_not_taken_for_the_option_it_begins(capsys):
    # `validate --calibrate` rewrites the stored rates: `--calibrat` must not start it
    with pytest.raises(SystemExit) as caught:
        main(["validate", "--calibrat"])
    assert caught.value.code == 2
    assert "unrecognized arguments: --calibrat" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["plan", "--model", "qwen2.5-7b", "--gpu", "8"])


def test_the_api_names_an_argument_of_the_wrong_kind_and_how_to_make_it():
    from rlm_course.cluster.planner import Plan

    spec, grpo = get_spec("qwen2.5-7b"), algorithm("grpo", minibatches=4)
    cases = [(("qwen2.5-7b", grpo, WORKLOAD, H100), {}, "spec='qwen2.5-7b' must be a "
              "TransformerSpec; pass e.g. rlm_course.cost.architectures.get_spec"),
             ((spec, grpo, WORKLOAD, "H100-SXM-80GB"), {}, "device='H100-SXM-80GB' must be a "
              "Device; pass e.g. rlm_course.cost.hardware.get_device"),
             ((spec, "grpo", WORKLOAD, H100), {}, "config='grpo' must be a RLConfig"),
             ((spec, grpo, WORKLOAD, H100), {"rates": "verl"}, "rates='verl' must be a Rates"),
             ((spec, grpo, WORKLOAD, H100), {"placements": None}, "placements=None"),
             ((spec, grpo, WORKLOAD, H100), {"modes": []}, "modes is empty; give one or more"),
             ((spec, grpo, WORKLOAD, H100), {"staleness_penalty": "0.1"},
              "staleness_penalty='0.1' must be a number from 0 to 1,000"),
             ((spec, grpo, WORKLOAD, H100), {"staleness_penalty": 1e308},
              "staleness_penalty=1e+308 must be a number from 0 to 1,000 (extra steps")]
    for args, kwargs, message in cases:
        with pytest.raises(ValueError) as caught:
            plan(*args, 8, **kwargs)
        assert message in str(caught.value), caught.value
    for bad in (None, "plan"):
        with pytest.raises(ValueError, match="must be a Plan"):
            format_plan(bad)
    with pytest.raises(ValueError, match="top=True"):
        format_plan(Plan(), top=True)
    with pytest.raises(ValueError, match="minibatches=2000: give 1 to 1,024"):
        algorithm("grpo", minibatches=2000)
    # the API holds the CLI's limits: 10,000 devices, 65,536 responses an iteration
    with pytest.raises(ValueError, match="gpus=True must be a positive integer"):
        plan(spec, grpo, WORKLOAD, H100, True)
    with pytest.raises(ValueError, match="gpus 10001: the planner searches clusters of up to "
                                         "10,000 devices"):
        plan(spec, grpo, WORKLOAD, H100, 10_001)
    with pytest.raises(ValueError, match="70,000 responses per iteration: the planner simulates "
                                         "at most 65,536"):
        plan(spec, grpo, Workload(70_000, 1, 256, 1024), H100, 8)
    # the workload's groups, not the configuration's group_size, are what the plan simulates
    with pytest.raises(ValueError, match=r"workload.group_size=1 with a group baseline \(advantage "
                                         r"'group'\).*without a group baseline \(ppo, "
                                         r"reinforce_pp\)"):
        plan(spec, grpo, Workload.long_tailed(16, 1, 64, 200, 0.5, 512, seed=0), H100, 2)
    # a Scenario built by hand: each argument of the wrong kind is named (they failed inside
    # the simulation with an AttributeError, or a string was read as True)
    from rlm_course.cluster.simulator import Cluster, Scenario

    for kwargs, message in (({"rates": "nemo-rl"}, "Scenario.rates='nemo-rl' must be a Rates"),
                            ({"config": "grpo"}, "Scenario.config='grpo' must be a RLConfig"),
                            ({"offload_trainer": "yes"}, "offload_trainer='yes' must be True or"),
                            ({"trainer": "dp8"}, "Scenario.trainer='dp8' must be a Layout"),
                            ({"placement": "disaggregated", "rollout_gpus": True},
                             "rollout_gpus=True must be a number of devices")):
        settings = {"config": grpo, **kwargs}
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            Scenario(spec, settings.pop("config"), WORKLOAD, Cluster(H100, 8), **settings)
    with pytest.raises(ValueError, match="Cluster.device='H100-SXM-80GB' must be a Device"):
        Cluster("H100-SXM-80GB", 8)
    # strings where numbers belong: named as given (they crashed in a format, or read as "8")
    from rlm_course.cluster.planner import check_settings
    from rlm_course.cluster.simulator import Mode

    with pytest.raises(ValueError, match="Mode.fusion_threshold='0.5' and fusion_tail=0.125 must"):
        Mode(fusion_threshold="0.5")
    for settings, message in (({"mean_response": "8"}, "mean_response '8': give a number."),
                              ({"gpus": "8"}, "gpus '8': give a number.")):
        with pytest.raises(ValueError, match=message):
            check_settings(settings)
    with pytest.raises(ValueError, match=r"variations\['train_hfu'\]=0.3 must be a list"):
        sensitivity(spec, grpo, WORKLOAD, H100, 8, variations={"train_hfu": 0.3})


def test_a_device_without_links_is_never_told_to_use_more_of_it():

    from rlm_course.cluster.planner import NoLayoutFits, linked_gpus
    from rlm_course.cost.phases import Rates

    alone = dataclasses.replace(H100, name="one-device", devices_per_node=1,
                                inter_node_bandwidth=0.0)
    assert linked_gpus(alone, Rates()) == 1
    with pytest.raises(NoLayoutFits) as caught:
        plan(get_spec("deepseek-v3"), algorithm("grpo", minibatches=16), R1, alone, 1,
             rates=Rates(), length_buckets=16)
    message = str(caught.value)
    # the search stops at what the links join (1), so no count is offered
    assert "no count up to 1 fits" in message and caught.value.search.fits is None
    assert message.endswith("Use a device with more memory."), message


def test_a_trainer_never_has_more_data_parallel_ranks_than_sequences_per_step():
    spec, grpo = get_spec("llama-3-70b"), algorithm("grpo", minibatches=16)
    free, _ = trainer_layouts(spec, grpo, H100, 1024, 4096, 8192)
    capped, _ = trainer_layouts(spec, grpo, H100, 1024, 4096, 8192, max_dp=32)
    assert max(lay.dp for lay in free) > 32 and capped
    assert all(lay.dp <= 32 for lay in capped)
    assert {lay.describe() for lay in capped} == {lay.describe() for lay in free if lay.dp <= 32}
    # 10,000 = 2^4 x 625: tp x pp divides it at most 16 ways, so every layout has 625+ ranks
    none, refused = trainer_layouts(spec, grpo, H100, 10_000, 4096, 8192, max_dp=512)
    assert none == [] and refused[-1].startswith(
        "trainer: every layout of 10,000 devices has at least 625 data-parallel ranks")
    with pytest.raises(ValueError, match="max_dp=0"):
        trainer_layouts(spec, grpo, H100, 8, 4096, 8192, max_dp=0)


def test_a_batch_too_small_for_the_cluster_is_told_that_half_the_gpus_plan_nearly_as_fast(capsys):
    """16 prompts x 16 of Qwen2.5-7B on 64 H100s: the step is bound by the longest response and
    fixed costs, so 32 GPUs plan it within 25%; 512 prompts keep 64 busy (no note)."""
    from rlm_course.cluster.planner import HALF_MARGIN, Plan, half_the_devices

    assert main(["plan", "--model", "qwen2.5-7b", "--gpus", "64", "--prompts", "16",
                 "--top", "1"]) == 0
    out = capsys.readouterr().out
    note = next(line for line in out.splitlines() if line.startswith("note: "))
    assert note.startswith("note: half these GPUs plan nearly the same step: 32 GPUs, "), note
    assert note.endswith("256 responses per iteration are too few to keep 64 GPUs busy (the "
                         "longest response's decode steps and the fixed costs do not shrink with "
                         "more devices); plan a larger batch (--prompts), or use fewer GPUs."), note
    spec, grpo = get_spec("qwen2.5-7b"), algorithm("grpo", minibatches=4)
    small = Workload.long_tailed(16, 16, 512, 4000, 0.8, 16384, seed=0)
    result = plan(spec, grpo, small, H100, 64)
    count, half = half_the_devices(spec, grpo, small, H100, 64, result)
    assert count == 32 and half.best.cost < (1 + HALF_MARGIN) * result.best.cost
    assert half.best.cost > result.best.cost  # longer, but not by much
    assert half_the_devices(spec, grpo, small, H100, 8, plan(spec, grpo, small, H100, 8)) is None
    assert half_the_devices(spec, grpo, WORKLOAD, H100, 64, Plan()) is None  # nothing planned
    assert main(["plan", "--model", "qwen2.5-7b", "--gpus", "64", "--top", "1"]) == 0
    assert "note: half these GPUs" not in capsys.readouterr().out


def test_a_count_with_few_divisors_is_told_when_the_round_count_below_plans_cheaper(capsys):
    """17 GPUs (a prime) leave only TP 1 and 17-way pools; the 16 under it plan Llama-3.1-8B's
    step about 10% cheaper, and the planner says so; a count one provisions is not re-planned."""
    from rlm_course.cluster.planner import Plan, fewer_devices

    assert main(["plan", "--model", "llama-3.1-8b", "--gpus", "17", "--top", "1"]) == 0
    out = capsys.readouterr().out
    note = next(line for line in out.splitlines() if line.startswith("note: "))
    assert note.startswith("note: 16 of these 17 GPUs plan a cheaper step: colocated, generation "
                           "tp8, trainer dp16 fsdp recompute, fused, offload while generating, "
                           "1,349.3 s per step priced for staleness against 1,455.0 s above; "
                           "layouts need degrees that divide the pools"), note
    spec, grpo = get_spec("llama-3.1-8b"), algorithm("grpo", minibatches=4)
    for round_count in (16, 24, 4):
        assert fewer_devices(spec, grpo, WORKLOAD, H100, round_count, Plan()) is None


def test_a_plan_whose_optimizer_runs_on_the_cpu_says_so_and_moves_that_rate():
    # Llama-3-70B on 8 H100s trains only with its optimizer on the host: the plan prints the
    # CPU's Adam (its optimizer steps x one step's seconds, from TrainerCost.adam_seconds), and
    # the sensitivity table moves the host's Adam rate, which decides the step
    from rlm_course.cluster.planner import host_optimizer_seconds
    from rlm_course.cost.phases import TrainerCost

    spec, grpo = get_spec("llama-3-70b"), algorithm("grpo")
    workload = Workload.long_tailed(32, 8, 512, 500, 0.8, 2048, seed=0)
    result = plan(spec, grpo, workload, H100, 8, length_buckets=32)
    best = result.best
    s = best.scenario
    assert s.trainer_layout.offload
    seconds, steps = host_optimizer_seconds(best.result)
    adam = TrainerCost(spec, grpo, s.trainer_layout, H100, s.rates, s.cluster.fabric(s.rates),
                       512).adam_seconds()
    assert seconds == adam and steps == grpo.minibatches * grpo.ppo_epochs
    # the whole model's 70.6B parameters on one host's CPUs
    assert seconds == pytest.approx(spec.params() / s.rates.host_adam_params_per_second, rel=1e-6)
    assert f"Adam on the hosts' CPUs, {seconds:.1f} s an optimizer step x {steps}" in " ".join(
        format_plan(result, top=1).split())
    rows = sensitivity(spec, grpo, workload, H100, 8, base=result, length_buckets=32)
    host = [r["step"] for r in rows if r["rate"] == "host_adam_params_per_second"]
    assert len(host) == 3 and host[0] > host[1] > host[2]
    # a plan whose optimizer stays on the devices has no such line and no such row
    small = plan(get_spec("qwen2.5-7b"), grpo, workload, H100, 8, length_buckets=32)
    assert host_optimizer_seconds(small.best.result) is None
    assert "Adam on the hosts' CPUs" not in format_plan(small, top=1)


def test_with_speculative_decoding_the_sensitivity_table_moves_the_draft_acceptance():
    # a drafted token's acceptance decides what speculative decoding buys: the table tries the
    # range around the fitted value, and a higher acceptance plans a shorter step
    from dataclasses import replace

    from rlm_course.cluster.planner import DRAFT_ACCEPTANCE_RANGE
    from rlm_course.cost.phases import Rates

    spec, grpo = get_spec("qwen2.5-7b"), algorithm("grpo")
    workload = Workload.long_tailed(32, 8, 512, 500, 0.8, 2048, seed=0)
    drafted = replace(Rates(decode_step_latency=0.01), speculative_tokens=1)
    result = plan(spec, grpo, workload, H100, 8, rates=drafted, length_buckets=32,
                  placements=("colocated",))
    rows = sensitivity(spec, grpo, workload, H100, 8, rates=drafted, base=result,
                       length_buckets=32, placements=("colocated",))
    accept = [r for r in rows if r["rate"] == "draft_acceptance"]
    assert [r["value"] for r in accept] == list(DRAFT_ACCEPTANCE_RANGE)
    assert accept[0]["step"] > accept[1]["step"] > accept[2]["step"]
    # without a draft the acceptance decides nothing, and the table leaves it out
    plain = plan(spec, grpo, workload, H100, 8, rates=Rates(decode_step_latency=0.01),
                 length_buckets=32, placements=("colocated",))
    assert not any(r["rate"] == "draft_acceptance" for r in sensitivity(
        spec, grpo, workload, H100, 8, rates=Rates(decode_step_latency=0.01), base=plain,
        length_buckets=32, placements=("colocated",)))


def test_dynamic_sampling_is_planned_with_the_prompts_it_generates(capsys):
    """DAPO's dynamic sampling generates more groups than it trains on: plan(oversample=3)
    generates three prompts for each one trained and drops the extra groups, so the same plan
    generates longer and trains the same; the CLI says when a preset samples dynamically and
    was planned without it, and refuses an oversample below 1."""
    from rlm_course.cli import main

    spec, dapo = get_spec("qwen2.5-7b"), algorithm("dapo", minibatches=4)
    one, three = (plan(spec, dapo, WORKLOAD, H100, 8, placements=("colocated",), modes=["sync"],
                       oversample=k) for k in (1, 3))
    same = next(c for c in three.ranked if c.name == one.best.name)
    assert same.scenario.oversample == 3 and one.best.scenario.oversample == 1
    # three times the groups decode side by side: longer steps (more KV cache read each), the
    # same longest response, so much less than three times the seconds (58.3 -> 63.6 s)
    assert (one.best.result.stages["generation"] * 1.05 < same.result.stages["generation"]
            < one.best.result.stages["generation"] * 1.5)
    assert same.result.stages["policy update"] == pytest.approx(
        one.best.result.stages["policy update"], rel=0.02)
    with pytest.raises(ValueError, match=r"oversample=0.5 must be a number from 1 to 64"):
        plan(spec, dapo, WORKLOAD, H100, 8, oversample=0.5)
    args = ["plan", "--model", "qwen2.5-7b", "--gpus", "8", "--prompts", "64", "--group-size",
            "8", "--mean-response", "1000", "--max-response", "4096", "--placement", "colocated",
            "--modes", "sync", "--top", "1", "--algorithm", "dapo"]
    assert main(args) == 0
    out = capsys.readouterr()
    assert "dapo's dynamic sampling generates more groups than it keeps" in out.err
    assert "give --oversample 3 to price the extra generation" in out.err
    assert main(args + ["--oversample", "3"]) == 0
    out = capsys.readouterr()
    assert "dynamic sampling" not in out.err
    assert "3x the prompts generated, the extra groups dropped (--oversample)" in out.out
