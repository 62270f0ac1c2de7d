"""Whole simulated iterations (rlm_course.cluster.simulator): a synchronous step is the sum of its
stages, an asynchronous one the longer of generation and training, stage fusion's saving, the
staleness bound, and the scenarios refused."""

import dataclasses

import pytest

from rlm_course.cost.anatomy import Workload, generation_costs
from rlm_course.cost.architectures import get_spec
from rlm_course.cost.hardware import get_device
from rlm_course.rl.algorithms import preset
from rlm_course.cost import comm
from rlm_course.cost.layouts import (DoesNotFit, Layout)
from rlm_course.cost.phases import Cluster, DecodeCost, Rates, TrainerCost, pass_flops
from rlm_course.cluster.simulator import MODES, Mode, Scenario, memory_plan, simulate

H100 = get_device("H100-SXM-80GB")
SPEC = get_spec("qwen2.5-7b")


def _scenario(**kw):
    workload = kw.pop("workload", Workload(32, 8, 256, 1024))
    config = kw.pop("config", preset("grpo", minibatches=2))
    return Scenario(SPEC, config, workload, Cluster(H100, kw.pop("gpus", 16)), **kw)


def test_a_synchronous_step_is_the_sum_of_its_stages():
    s = _scenario(trainer=Layout(dp=16, zero=3))
    result = simulate(s, iterations=3, warmup=1)
    st = result.stages
    assert result.step_seconds == pytest.approx(sum(st.values()), rel=1e-9)
    # generation: one prefill of each group's prompt (prefix caching: 2 groups of 8 per replica)
    # and 1023 decode steps of 16 sequences on each of 16 replicas
    w = s.workload
    cost = DecodeCost(SPEC, H100, 1, s.rates, None, w)
    n = w.responses // 16
    gen = cost.prefill_seconds({256: n // 8}) + cost.seconds(1023, n, n * 257)
    assert st["generation"] == pytest.approx(gen, rel=1e-9)
    # without prefix caching every sample prefills its prompt
    plain = simulate(_scenario(trainer=Layout(dp=16, zero=3), rates=Rates(prefix_caching=False)),
                     iterations=3, warmup=1)
    assert plain.stages["generation"] == pytest.approx(
        cost.prefill_seconds({256: n}) + cost.seconds(1023, n, n * 257), rel=1e-9)
    trainer = TrainerCost(SPEC, s.config, s.trainer_layout, H100, s.rates,
                          comm.Fabric.of(H100), 256).seconds([1024] * w.responses)
    for stage, seconds in trainer.items():
        assert st[stage] == pytest.approx(seconds, rel=1e-9)
    # the FLOPs the replicas count are anatomy's generation FLOPs (independent code), the prompt
    # of a group prefilled once
    costs = generation_costs(SPEC, w)
    flops = costs["prefill"].flops / w.group_size + costs["decode"].flops
    trained = sum(pass_flops(SPEC, s.config, 256, [1024] * w.responses).values())
    assert result.mfu == pytest.approx((flops + trained) / (16 * H100.peak_flops * result.step_seconds),
                                       rel=1e-9)
    assert result.tokens_per_second * result.step_seconds == pytest.approx(w.responses * 1280)


def test_samples_routed_one_by_one_spread_each_group_and_prefill_its_prompt_on_every_replica():
    # 32 groups of 8 equal samples on 16 replicas. Routed by group (an offline generate over
    # contiguous shards), a replica holds 2 whole groups and prefills 2 prompts; routed by
    # sample (NeMo-RL's async engine, verl's agent loop: the replicas in turn), sample i of group
    # g goes to replica (8 g + i) mod 16, so replica r holds one sample of each of 16 groups and
    # prefills 16 prompts. The decode is the same 1023 steps of 16 sequences either way.
    s = _scenario(trainer=Layout(dp=16, zero=3))
    w = s.workload
    cost = DecodeCost(SPEC, H100, 1, s.rates, None, w)
    decode = cost.seconds(1023, 16, 16 * 257)
    work = set()
    for routing, caching, prompts in (("group", True, 2), ("sample", True, 16),
                                      ("group", False, 16)):
        result = simulate(_scenario(trainer=Layout(dp=16, zero=3),
                                    rates=Rates(routing=routing, prefix_caching=caching)),
                          iterations=3, warmup=1)
        assert result.stages["generation"] == pytest.approx(
            cost.prefill_seconds({256: prompts}) + decode, rel=1e-9), routing
        # the model FLOPs (MFU x step) count each group's prompt once however often the
        # replicas prefill it: the same work, done in more seconds
        work.add(round(result.mfu * result.step_seconds, 9))
    assert len(work) == 1
    # a long group: routed by group its 8 samples decode together on one replica, beside one
    # short group for the short one's 255 steps, then 3840 steps of 8 sequences; routed by
    # sample each of 8 replicas holds one of them beside 15 short samples, then decodes it
    # alone: the same tail of steps, each reading one sequence's KV cache instead of eight
    lengths = tuple([4096] * 8 + [256] * 8 * 31)
    steps = {}
    for routing in ("group", "sample"):
        steps[routing] = simulate(_scenario(
            trainer=Layout(dp=16, zero=3), rates=Rates(routing=routing),
            workload=Workload(32, 8, 256, 4096, response_lengths=lengths)),
            iterations=3, warmup=1).stages["generation"]
    tail = DecodeCost(SPEC, H100, 1, s.rates, None, w)
    assert steps["group"] == pytest.approx(
        tail.prefill_seconds({256: 2}) + tail.seconds(255, 16, 16 * 257)
        + tail.seconds(4095 - 255, 8, 8 * (257 + 255)), rel=1e-9)
    assert steps["sample"] == pytest.approx(
        tail.prefill_seconds({256: 16}) + tail.seconds(255, 16, 16 * 257)
        + tail.seconds(4095 - 255, 1, 257 + 255), rel=1e-9)
    assert steps["sample"] < steps["group"]
    import numpy as np

    for bad in ("round-robin", "", None, 1, np.array(["sample"]), ["group"]):
        with pytest.raises(ValueError, match="Rates.routing=.*choose one of .'group', 'sample'."):
            Rates(routing=bad)
    with pytest.raises(ValueError, match="Rates.sync_transport=.*choose one of"):
        Rates(sync_transport=np.array(["sharded"]))  # an array compares equal to a name


def test_an_asynchronous_step_is_the_longer_of_generation_and_training():
    for rollout in (4, 12):  # training-bound, then generation-bound
        sync = simulate(_scenario(placement="disaggregated", rollout_gpus=rollout,
                                  trainer=Layout(dp=16 - rollout, zero=3)), iterations=3, warmup=1)
        off = simulate(_scenario(placement="disaggregated", rollout_gpus=rollout,
                                 trainer=Layout(dp=16 - rollout, zero=3), mode=MODES["one-step-off"]))
        gen = sync.stages["generation"]
        train = sync.stages["scoring"] + sync.stages["policy update"]
        sync_seconds = sync.stages["weight sync"]
        assert sync.step_seconds == pytest.approx(gen + train + sync_seconds, rel=1e-9)
        assert off.step_seconds == pytest.approx(max(gen, train) + sync_seconds, rel=1e-9)
        assert off.staleness == pytest.approx(1.0) and sync.staleness == 0


def test_stage_fusion_hides_scoring_behind_a_long_tail_and_cannot_without_one():
    config = preset("grpo", minibatches=2)
    lengths = tuple([256] * 15 + [4096]) * 32  # one long sample per group of 16
    tail = Workload(32, 16, 256, 4096, response_lengths=lengths)
    fusion = Mode(stage_fusion=True, fusion_threshold=0.85, fusion_tail=0.5)
    base = simulate(_scenario(workload=tail, config=config, trainer=Layout(dp=16, zero=3)))
    fused = simulate(_scenario(workload=tail, config=config, trainer=Layout(dp=16, zero=3),
                               mode=fusion))
    assert fused.step_seconds < base.step_seconds
    # closed form: when the short 15/16 of the samples are done (each replica: a prefill of its 2
    # groups' prompts and 255 steps of 32), the 32 long samples migrate to 8 of the 16 replicas
    # (fusion_tail 1/2), re-prefill their 511-token contexts there and decode their last 3,840
    # tokens, 4 a replica, while the short ones are scored on the other half of the devices;
    # the tail's samples are scored after it. (Migrating them to 2 replicas, 16 a replica, reads
    # 8 times the KV cache a step and costs more than the scoring it hides: the trainer's
    # ZeRO-3 gathers run on a node's 8 cards, and its scoring takes 1.6 s of the 32 s step.)
    s = _scenario(workload=tail, config=config, trainer=Layout(dp=16, zero=3))
    cost = DecodeCost(SPEC, H100, 1, s.rates, None, tail)
    t_short = cost.prefill_seconds({256: 2}) + cost.seconds(255, 32, 32 * 257)
    t_tail = cost.prefill_seconds({511: 4}) + cost.seconds(3840, 4, 4 * 512)
    trainer = TrainerCost(SPEC, config, s.trainer_layout, H100, s.rates, comm.Fabric.of(H100), 256)
    head = trainer.seconds([256] * 480)["scoring"]
    whole = trainer.seconds(list(lengths))
    expected = (max(t_short + t_tail, t_short + head / (1 - 1 / 2)) + whole["scoring"] - head
                + whole["policy update"] + base.stages["weight sync"])
    assert fused.step_seconds == pytest.approx(expected, rel=1e-9)
    assert fused.stages["generation"] == pytest.approx(t_short + t_tail, rel=1e-9)
    uniform = simulate(_scenario(trainer=Layout(dp=16, zero=3), mode=fusion))
    plain = simulate(_scenario(trainer=Layout(dp=16, zero=3)))
    assert uniform.step_seconds >= plain.step_seconds  # nothing to overlap without a tail


def test_partial_rollouts_and_staleness_bound():
    long_tail = Workload.long_tailed(32, 8, 256, 1500, 1.2, 16384, seed=1)
    kw = dict(workload=long_tail, placement="disaggregated", rollout_gpus=8,
              trainer=Layout(dp=8, zero=3, recompute=True))
    off = simulate(_scenario(mode=Mode(staleness=1), **kw))
    partial = simulate(_scenario(mode=Mode(staleness=1, partial_rollout=True), **kw))
    streaming = simulate(_scenario(mode=MODES["async"], **kw))
    assert partial.step_seconds < off.step_seconds  # no waiting for the tail at each update
    assert streaming.step_seconds <= partial.step_seconds * 1.0001
    for r in (off, partial, streaming):
        assert r.staleness <= 1 + 1e-9
    sync = simulate(_scenario(**kw))
    assert sync.step_seconds > off.step_seconds and sync.generation_share > off.generation_share


def test_in_order_training_waits_for_each_batchs_longest_group():
    # the first group of every batch is 16x longer than the other 31
    lengths = tuple([4096] * 8 + [256] * 8 * 31)
    kw = dict(workload=Workload(32, 8, 256, 4096, response_lengths=lengths),
              placement="disaggregated", rollout_gpus=8, trainer=Layout(dp=8, zero=3))
    mode = Mode(staleness=1, partial_rollout=True, recompute_kv=False)
    fifo = simulate(_scenario(mode=mode, **kw))
    order = simulate(_scenario(mode=Mode(staleness=1, partial_rollout=True, recompute_kv=False,
                                         in_order=True), **kw))
    # a long group holds one replica for 4,095 decode steps of at least its own 8 samples
    s = _scenario(**kw)
    latency = DecodeCost(SPEC, H100, 1, s.rates, None, s.workload).seconds(4095, 8, 8 * 257)
    train = order.stages["scoring"] + order.stages["policy update"]
    # in order, batch k + 2 is admitted when step k publishes and trained in step k + 2: two
    # steps hold its long group and its training
    assert 2 * order.step_seconds >= latency + train
    # in the order groups finish, later batches' short groups stand in for the long ones
    assert 2 * fifo.step_seconds < latency and fifo.staleness < 1
    assert order.staleness == pytest.approx(1.0)  # every batch exactly one version behind
    # without a tail the two orders train the same groups at the same times
    even = dict(kw, workload=Workload(32, 8, 256, 1024))
    assert simulate(_scenario(mode=mode, **even)).step_seconds == pytest.approx(
        simulate(_scenario(mode=Mode(staleness=1, partial_rollout=True, recompute_kv=False,
                                     in_order=True), **even)).step_seconds, rel=1e-12)
    assert Mode(staleness=1, partial_rollout=True, in_order=True).name == (
        "one-step-off + partial + in order")
    with pytest.raises(ValueError, match="in-order consumption"):
        Mode(stage_fusion=True, in_order=True)


def test_a_semaphore_on_groups_in_flight_keeps_one_batch_generating():
    # generation-bound one step off (4 rollout GPUs, 4,096-token responses): without a limit
    # the next batch decodes beside the current one, a larger decode batch per replica; with
    # NeMo-RL's semaphore of one batch of groups, the next batch's groups start only as the
    # current ones finish (equal lengths: all at once), so in the steady state each step is
    # one batch's generation alone plus the weight sync that pauses it
    kw = dict(placement="disaggregated", rollout_gpus=4, trainer=Layout(dp=12, zero=3),
              workload=Workload(32, 8, 256, 4096))
    alone = simulate(_scenario(**kw), iterations=3, warmup=1).stages

    def step(cap):
        mode = Mode(staleness=1, partial_rollout=True, recompute_kv=False, in_order=True,
                    inflight_batches=cap)
        return simulate(_scenario(mode=mode, **kw), iterations=10, warmup=4).step_seconds

    assert alone["generation"] > alone["scoring"] + alone["policy update"]  # generation-bound
    # (the pause for the sync lands inside a decode step, which is lost: at most one step of 64
    # sequences more)
    s = _scenario(**kw)
    one_step = DecodeCost(SPEC, H100, 1, s.rates, None, s.workload).seconds(1, 64, 64 * 4353)
    expected = alone["generation"] + alone["weight sync"]
    assert expected <= step(1) <= expected + one_step
    assert step(0) < 0.92 * step(1)
    for bad in (-1, 66, True, "1", float("nan")):
        with pytest.raises(ValueError, match="Mode.inflight_batches=.* must be a number from 0"):
            Mode(staleness=1, inflight_batches=bad)


def test_a_deep_pipeline_is_measured_past_its_first_bursts():
    # 8 versions of staleness: 9 batches admitted at once; the default measurement warms up 18
    # iterations and measures 16, within 2% of a 40-iteration warm-up measuring 40, where 4 and
    # 2 measure the first bursts, over 10% off
    w = Workload.long_tailed(32, 8, 256, 1500, 0.6, 8192, seed=1, group_share=0.5)
    s = _scenario(workload=w, placement="disaggregated", rollout_gpus=8,
                  trainer=Layout(dp=8, zero=3),
                  mode=Mode(staleness=8, partial_rollout=True, recompute_kv=False))
    default, long = simulate(s), simulate(s, iterations=80, warmup=40)
    assert default.step_seconds == pytest.approx(long.step_seconds, rel=0.02)
    short = simulate(s, iterations=6, warmup=4)
    assert short.step_seconds < 0.9 * long.step_seconds
    # in order, the steps repeat every eta + 1 iterations: the default measures whole cycles
    w = Workload.long_tailed(32, 8, 256, 1500, 1.0, 8192, seed=1)
    for eta in (2, 3, 8):
        s = _scenario(workload=w, placement="disaggregated", rollout_gpus=8,
                      trainer=Layout(dp=8, zero=3),
                      mode=Mode(staleness=eta, partial_rollout=True, in_order=True))
        assert simulate(s).step_seconds == pytest.approx(
            simulate(s, iterations=80, warmup=40).step_seconds, rel=0.025)


def test_scenarios_that_make_no_sense_are_refused():
    with pytest.raises(ValueError, match="streaming trains while generating"):
        _scenario(mode=MODES["async"])
    with pytest.raises(ValueError, match="stage fusion overlaps scoring"):
        _scenario(placement="disaggregated", rollout_gpus=8, trainer=Layout(dp=8),
                  mode=MODES["fused"])
    with pytest.raises(ValueError, match="uses 8 devices, but the trainer pool has 16"):
        _scenario(trainer=Layout(dp=8))
    with pytest.raises(ValueError, match="rollout_gpus=16 must leave devices to both pools"):
        _scenario(placement="disaggregated", rollout_gpus=16)
    with pytest.raises(DoesNotFit, match="trainer layout dp16 of llama-3-70b needs"):
        simulate(Scenario(get_spec("llama-3-70b"), preset("grpo"), Workload(32, 8, 256, 1024),
                          Cluster(H100, 16)))
    with pytest.raises(ValueError, match="llama-3-70b reads at most 8,192 tokens"):
        Scenario(get_spec("llama-3-70b"), preset("grpo"), Workload(32, 8, 256, 16384),
                 Cluster(H100, 16))


def test_an_engine_memory_share_is_of_the_memory_cuda_reports():
    # NeMo-RL's Qwen3-235B one step off: vLLM at TP 8 with gpu_memory_utilization 0.8 on H100s,
    # whose "80 GB" CUDA reports as 79.11 GiB (84.94e9 bytes). 470 GB of bf16 weights over 8
    # ranks; 4 KV heads over 8 ranks, so each rank holds one: 94 layers x 2 x 128 x 2 bytes =
    # 48,128 bytes per token, 5,831 tokens a sequence
    spec = get_spec("qwen3-235b-a22b")
    s = Scenario(spec, preset("grpo"), Workload(16, 32, 110, 5721), Cluster(H100, 256),
                 placement="disaggregated", rollout_gpus=128, generation_tp=8,
                 trainer=Layout(tp=4, pp=8, ep=16, dp=4, zero=1, recompute=True),
                 rates=Rates(rollout_memory_fraction=0.8))
    per_sequence = 94 * 2 * 128 * 2 * (110 + 5721)
    weights = spec.params() * 2 / 8
    assert H100.engine_memory_bytes == 84.94e9 and H100.memory_bytes == 80e9
    assert memory_plan(s)["slots"] == int((0.8 * 84.94e9 - weights) // per_sequence) == 32
    assert int((0.8 * 80e9 - weights) // per_sequence) == 18  # the datasheet's GB: two waves
    # a speculative draft (one more layer of the model, the output head shared) sits beside the
    # weights: a 94th of 235B less the embedding and head, over 8 ranks, 0.62 GB a device; and
    # its layer keeps a KV cache of its own, a 95th layer's a token: two sequences' caches fewer
    drafted = dataclasses.replace(s, rates=Rates(rollout_memory_fraction=0.8,
                                                 speculative_tokens=1))
    draft = (spec.params() - 2 * spec.vocab_size * spec.d_model) / 94 * 2 / 8
    assert memory_plan(drafted)["rollout"]["draft weights"] == pytest.approx(draft)
    assert memory_plan(drafted)["slots"] == int((0.8 * 84.94e9 - weights - draft)
                                                // (per_sequence * 95 / 94)) == 30
    assert memory_plan(drafted)["rollout"]["kv cache"] == pytest.approx(30 * per_sequence * 95 / 94)
    assert "draft weights" not in memory_plan(s)["rollout"]
    # a device without a reported total takes the datasheet's
    assert get_device("H200-SXM-141GB").engine_memory_bytes == 141e9


def test_colocated_generation_memory_contention_and_offload():
    spec = get_spec("llama-3-70b")
    lay = Layout(dp=8, tp=8, zero=3, recompute=True)
    s = Scenario(spec, preset("grpo", minibatches=2), Workload(64, 8, 512, 2048), Cluster(H100, 64),
                 generation_tp=8, trainer=lay)
    freed = Scenario(spec, preset("grpo", minibatches=2), Workload(64, 8, 512, 2048),
                     Cluster(H100, 64), generation_tp=8, trainer=lay, offload_trainer=True)
    a, b = simulate(s, iterations=2, warmup=1), simulate(freed, iterations=2, warmup=1)
    assert a.memory["slots"] < b.memory["slots"]   # resident trainer state takes KV room
    assert b.stages["offload"] > 0


def test_a_reference_kept_in_host_memory_frees_the_device_and_pays_three_copies():
    """NeMo-RL's Megatron worker keeps the reference's weights on the CPU and swaps them in for
    its log-probs: Llama-3.1-8B on 8 H100s with data parallelism only (NeMo-RL v0.3's run) does
    not fit with a resident reference (80.6 GB of 76.4 GB usable: the reference's 16.1 GB bf16
    weights among them) and fits without it; the scoring pays the device's 16.06 GB shard three
    times over the host link (the policy's out, the reference's in, the policy's back)."""
    from rlm_course.cluster.simulator import reference_swap_seconds

    spec = get_spec("llama-3.1-8b")
    kw = dict(trainer=Layout(dp=8, zero=1), offload_trainer=True,
              rates=Rates(rollout_memory_fraction=0.6))
    workload, cluster = Workload(64, 32, 110, 3986), Cluster(H100, 8)  # 4,096-token sequences
    with pytest.raises(DoesNotFit, match=r"reference weights 16.1 GB"):
        memory_plan(Scenario(spec, preset("grpo", minibatches=4), workload, cluster, **kw))
    s = Scenario(spec, preset("grpo", minibatches=4), workload, cluster, offload_reference=True,
                 **kw)
    assert "reference weights" not in memory_plan(s)["trainer"]
    swap = 3 * spec.params() * 2 / s.rates.host(H100)
    assert reference_swap_seconds(s) == pytest.approx(swap, rel=1e-12)
    assert 0.5 < swap < 1.5  # 48 GB at PCIe Gen5's host bandwidth
    # where both fit (TP 2), the reference's swap is the only difference: in the scoring stage
    both = dict(trainer=Layout(tp=2, dp=8, zero=1), offload_trainer=True, rates=kw["rates"])
    resident = Scenario(spec, preset("grpo", minibatches=4), workload, Cluster(H100, 16), **both)
    host = Scenario(spec, preset("grpo", minibatches=4), workload, Cluster(H100, 16),
                    offload_reference=True, **both)
    a, b = simulate(resident, iterations=2, warmup=1), simulate(host, iterations=2, warmup=1)
    assert b.stages["scoring"] - a.stages["scoring"] == pytest.approx(
        reference_swap_seconds(host), rel=1e-9)
    assert "reference on the host" in host.describe()
    with pytest.raises(ValueError, match="holds no reference"):
        Scenario(spec, preset("dapo"), workload, cluster, offload_reference=True, **kw)


def test_scenario_inputs_of_every_kind_are_checked():
    import math

    import numpy as np

    # numpy's integers (a sweep over np.arange) are integers
    s = _scenario(gpus=np.int64(16), generation_tp=np.int64(2))
    assert (s.cluster.gpus, s.generation_tp) == (16, 2) and type(s.generation_tp) is int
    d = _scenario(placement="disaggregated", rollout_gpus=np.int64(8))
    assert d.rollout_gpus == 8 and d.trainer_pool == 8
    # oversampling: a number from 1 to 64 (1e6 simulated for hours)
    for bad in ("2", True, 0.5, 65, 1e6, math.nan, math.inf, None):
        with pytest.raises(ValueError, match="oversample=.* must be a number from 1 to 64"):
            _scenario(oversample=bad)
    assert _scenario(oversample=3).oversample == 3.0
    # a colocated staleness bound lets nothing overlap: refused, not the sync step in disguise
    with pytest.raises(ValueError, match="colocated placement with staleness 1: .* use the "
                                         "disaggregated placement"):
        _scenario(mode=Mode(staleness=1))
    _scenario(mode=Mode(staleness=1, partial_rollout=True))  # carries groups over: allowed
    # a group baseline with one response per prompt; more ranks than sequences of a step
    with pytest.raises(ValueError, match="a group baseline needs 2 or more"):
        _scenario(workload=Workload(32, 1, 256, 1024))
    with pytest.raises(ValueError, match="16 data-parallel ranks are more than the 8 sequences "
                                         "of a gradient step .* ranks would hold none"):
        _scenario(workload=Workload(2, 8, 256, 1024), trainer=Layout(dp=16, zero=3))


def test_nonsense_rates_and_modes_are_refused():
    import math

    for field in ("decode_step_latency", "iteration_overhead", "reward_seconds"):
        with pytest.raises(ValueError, match=f"Rates.{field}=inf must be a finite"):
            Rates(**{field: math.inf})
    with pytest.raises(ValueError, match="host_bandwidth"):
        Rates(host_bandwidth=math.inf)
    with pytest.raises(ValueError, match="stage fusion .* does not combine"):
        Mode(stage_fusion=True, partial_rollout=True)
    # colocated, the KV cache is freed for training: carried groups prefill again
    with pytest.raises(ValueError, match="a colocated rollout frees its KV cache .* set "
                                         "recompute_kv=True"):
        _scenario(trainer=Layout(dp=16, zero=3),
                  mode=Mode(staleness=1, partial_rollout=True, recompute_kv=False))
    assert _scenario(trainer=Layout(dp=16, zero=3),
                     mode=Mode(staleness=1, partial_rollout=True)).mode.recompute_kv
    with pytest.raises(ValueError, match=r"give a Mode, e.g. MODES\['async'\]"):
        Scenario(get_spec("qwen2.5-7b"), preset("grpo"),
                 Workload.long_tailed(8, 4, 64, 100, 0.5, 400),
                 Cluster(get_device("H100-SXM-80GB"), 8), mode="async")
    for staleness in (-1, math.nan, math.inf, 65, 1e9, "1", None, True):
        with pytest.raises(ValueError, match="must be a number from 0 to 64"):
            Mode(staleness=staleness)
    for flag in ("in_order", "partial_rollout", "streaming"):
        with pytest.raises(ValueError, match=f"Mode.{flag}='yes' must be True or False"):
            Mode(**{flag: "yes"})
    with pytest.raises(ValueError, match=r"Scenario.spec='qwen2.5-7b' must be a "
                                         r"TransformerSpec; pass e.g. get_spec"):
        Scenario("qwen2.5-7b", preset("grpo"), Workload(8, 4, 64, 100),
                 Cluster(get_device("H100-SXM-80GB"), 8))
    with pytest.raises(ValueError, match="Scenario.workload=None must be a Workload"):
        Scenario(get_spec("qwen2.5-7b"), preset("grpo"), None,
                 Cluster(get_device("H100-SXM-80GB"), 8))


def test_a_scenario_names_which_pool_is_which():
    text = _scenario(placement="disaggregated", rollout_gpus=6).describe()
    assert text.startswith("disaggregated: 6 rollout GPUs + 10 training GPUs, generation tp")


def test_length_buckets_follow_the_longest_response_not_the_budget():
    # the same responses under a budget 30x larger (near qwen2.5-7b's 131,072-token window):
    # the buckets, and so the step, are the same (levels of the budget, 1,920 tokens apart, would
    # round this batch's responses to a few levels); the trainer holds a sequence of the budget
    # (memory is checked at it: any iteration may reach it), its activations and logits split
    # over cp 4
    drawn = Workload.long_tailed(64, 8, 256, 1000, 0.8, 4096, seed=0)
    vast = Workload(64, 8, 256, 4096 * 30, response_lengths=drawn.lengths)
    steps = [simulate(_scenario(workload=w, trainer=Layout(dp=4, cp=4, zero=3, recompute=True)),
                      length_buckets=64).step_seconds
             for w in (drawn, vast)]
    assert steps[0] == pytest.approx(steps[1], rel=1e-9)


def test_memory_is_checked_at_the_budget_not_at_the_longest_response_drawn():
    """A run must hold the longest sequence its budget allows: any iteration may reach it, not
    only the draws of the one simulated. Qwen2.5-7B responses drawn at most 4,096 tokens long
    under a 32,768-token budget: dp16 ZeRO-3 with recomputation and micro-batches of four
    sequences holds the drawn batch's 4,352 tokens, not the budget's 33,024 (its fp32 logits
    alone: 4 x 4 x 33,024 x 152,064 bytes = 80.3 GB)."""
    drawn = Workload.long_tailed(64, 8, 256, 1000, 0.8, 4096, seed=0)
    budget = Workload(64, 8, 256, 32768, response_lengths=drawn.lengths)
    assert drawn.max_response_len == 4096
    lay = Layout(dp=16, zero=3, recompute=True, micro_batch=4)
    fits = memory_plan(_scenario(workload=drawn, trainer=lay))
    assert fits["trainer"]["logits"] == pytest.approx(4 * 4 * (256 + 4096) * 152064)
    with pytest.raises(DoesNotFit, match=r"logits 80\.3"):
        memory_plan(_scenario(workload=budget, trainer=lay))


def _small(gpus=16, **kw):
    from rlm_course.cluster.simulator import algorithm

    rollout = kw.get("rollout_gpus") or 0
    return Scenario(SPEC, kw.pop("config", algorithm("grpo")),
                    kw.pop("w", Workload(16, 4, 256, 512)),
                    Cluster(get_device("H100-SXM-80GB"), gpus),
                    trainer=kw.pop("t", Layout(dp=gpus - rollout, zero=3)), **kw)


def test_a_cap_on_batches_in_flight_neither_deadlocks_nor_admits_during_a_drain():
    from rlm_course.cluster.simulator import algorithm

    # colocated, half the groups at once: the phase waited on an "all idle" event that admitting
    # the next group had replaced, and simpy ran out of events
    capped = simulate(_small(mode=Mode(inflight_batches=0.5)))
    assert capped.step_seconds > simulate(_small()).step_seconds
    assert simulate(_small(mode=Mode(inflight_batches=0.5, in_order=True))).step_seconds == \
        pytest.approx(capped.step_seconds)
    # groups that finish while a weight update drains the rollout admit nobody: the ones they
    # would admit wait for the new weights (groups trained 4 versions late at staleness 3)
    tail = Workload.long_tailed(12, 4, 256, 500, 1.2, 2048, seed=5)
    run = simulate(_small(8, rollout_gpus=6, placement="disaggregated", w=tail,
                          t=Layout(dp=2, zero=3, recompute=True),
                          config=algorithm("grpo", minibatches=3),
                          mode=Mode(staleness=3, inflight_batches=1)))
    assert run.staleness_max <= 3


def test_stage_fusion_without_a_tail_is_the_sync_step_and_prefills_count_once():
    # equal lengths: every sequence is done when the threshold is reached, nothing migrates, and
    # the tail's devices score too (scoring on 7/8 of them made fusion 0.16 s slower than sync)
    assert simulate(_small(mode=Mode(stage_fusion=True))).step_seconds == pytest.approx(
        simulate(_small()).step_seconds)
    # a context prefilled again after a pause is time, not model FLOPs
    w = Workload(16, 4, 256, 1024)
    runs = [simulate(_small(rollout_gpus=2, placement="disaggregated", w=w,
                            mode=Mode(staleness=1, partial_rollout=True, recompute_kv=flag)))
            for flag in (True, False)]
    assert runs[0].step_seconds > runs[1].step_seconds
    assert runs[0].mfu * runs[0].step_seconds == pytest.approx(runs[1].mfu * runs[1].step_seconds)
    # a colocated rollout's events: its decoding, not also the generation phase around it
    events = sorted((e for e in simulate(_small()).events() if e.worker == "rollout"),
                    key=lambda e: e.start)
    assert all(a.end <= b.start + 1e-9 for a, b in zip(events, events[1:]))


def test_a_one_token_longer_response_does_not_add_a_micro_batch():
    h100 = get_device("H100-SXM-80GB")
    cost = TrainerCost(SPEC, preset("grpo"), Layout(dp=8, zero=3), h100,
                       Rates(micro_batch_seconds=0.01), comm.Fabric.of(h100), 256)
    even, one_more = cost.seconds([512] * 64), cost.seconds([512] * 63 + [513])
    for stage in even:  # it added 25%: a 768.02-token mean rounded to 768 held 0.99998 a batch
        assert one_more[stage] == pytest.approx(even[stage], rel=1e-3)


def test_the_simulator_refuses_bad_input_with_a_value_error():
    import re

    import numpy as np

    bad = [
        (lambda: simulate("sync"), "scenario='sync' must be a Scenario"),
        (lambda: memory_plan("x"), "scenario='x' must be a Scenario"),
        (lambda: _small(generation_tp=2.0), "generation_tp=2.0 must be a positive integer"),
        (lambda: _small(generation_tp=True), "generation_tp=True must be a positive integer"),
        (lambda: _small(14, generation_tp=7), "tp=7 splits qwen2.5-7b's 4 key/value heads"),
        (lambda: simulate(_small(), iterations=True, warmup=0), "iterations=True"),
    ]
    for call, message in bad:
        with pytest.raises(ValueError, match=re.escape(message)):
            call()
    assert Mode(staleness=np.int64(1)).name == "one-step-off"  # numpy's numbers too
    assert simulate(_small(), iterations=np.int64(3)).step_seconds > 0


def test_oversampling_keeps_groups_whatever_their_length():
    # DAPO's filter looks at rewards, not at who finishes first: the trained responses have the
    # workload's mean length at any oversampling (the first to finish were kept: 229.6 tokens
    # where the workload's mean is 456.2, at oversample 3)
    tail = Workload.long_tailed(16, 4, 256, 600, 1.0, 4096, seed=3)
    for oversample in (1, 2, 3):
        run = simulate(_small(w=tail, oversample=oversample))
        trained = run.tokens_per_second * run.step_seconds / tail.responses - tail.prompt_len
        assert trained == pytest.approx(tail.mean_response_len)
