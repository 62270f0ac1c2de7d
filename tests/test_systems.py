"""The systems package against closed forms: collectives and the communication roofline, memory
per device and its refusals, phase seconds, and whole simulated iterations (a synchronous step is
the sum of its stages, an asynchronous one the longer of generation and training, a pipeline's
bubble, stage fusion's saving)."""


import pytest
import torch

from rlm_course.cost.anatomy import Workload, generation_costs, zero_model_state_bytes
from rlm_course.cost.architectures import get_spec
from rlm_course.cost.hardware import get_device
from rlm_course.parallel.pipeline import schedule_table, simulate as simulate_pipeline
from rlm_course.cost.comm import Link
from rlm_course.parallel.world import World
from rlm_course.rl.algorithms import preset
from rlm_course.cost import comm
from rlm_course.cost.layouts import (DoesNotFit, Layout, check_training, choose_generation_tp,
                                        kv_slots, training_memory)
from rlm_course.cost.phases import Cluster, DecodeCost, Rates, TrainerCost, pass_flops
from rlm_course.cluster.simulator import MODES, Mode, Scenario, simulate

H100 = get_device("H100-SXM-80GB")
SPEC = get_spec("qwen2.5-7b")


# ---------------------------------------------------------------------- collectives
@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_closed_forms_equal_the_simulated_world(p, algorithm):
    link = Link(alpha=3e-6, beta=1e9)
    world = World(p, link, algorithm)
    world.all_reduce([torch.ones(1000) for _ in range(p)])
    assert world.clock[0] == pytest.approx(comm.all_reduce_seconds(4000, p, link, algorithm))
    for name, fn in (("reduce_scatter", comm.reduce_scatter_seconds),
                     ("all_gather", comm.all_gather_seconds)):
        w = World(p, link)
        tensors = [torch.ones(1000 // p * p if name == "reduce_scatter" else 1000 // p)
                   for _ in range(p)]
        getattr(w, name)(tensors)
        assert w.clock[0] == pytest.approx(fn(4 * (1000 // p) * p, p, link))
    w = World(p, link)
    w.all_to_all([[torch.ones(10) for _ in range(p)] for _ in range(p)])
    assert w.clock[0] == pytest.approx(comm.all_to_all_seconds(40 * p, p, link))


def test_auto_picks_trees_for_small_messages_and_rings_for_large():
    link = Link(alpha=10e-6, beta=50e9)
    small, large = 1e3, 1e9
    assert comm.all_reduce_seconds(small, 64, link) == comm.tree_all_reduce_seconds(small, 64, link)
    assert comm.all_reduce_seconds(large, 64, link) == comm.ring_all_reduce_seconds(large, 64, link)


def test_fabric_uses_nvlink_inside_a_node_and_the_network_across():
    fabric = comm.Fabric.of(H100)
    assert fabric.link(8).beta == 450e9 and fabric.link(2, stride=4).beta == 450e9
    assert fabric.link(16).beta == 50e9 and fabric.link(4, stride=4).beta == 50e9
    with pytest.raises(ValueError, match="needs an intra-node link"):
        comm.Fabric(None, None, 8).link(2)


def test_zero3_sends_one_and_a_half_times_dp():
    link = Link(1e-5, 50e9)
    dp = comm.data_parallel_comm(7e9, 64, link, 0)
    z1 = comm.data_parallel_comm(7e9, 64, link, 1)
    z3 = comm.data_parallel_comm(7e9, 64, link, 3)
    assert z1.bytes == pytest.approx(dp.bytes) and z3.bytes == pytest.approx(1.5 * dp.bytes)
    assert dp.bytes == pytest.approx(2 * 63 / 64 * 2 * 7e9)


def test_communication_roofline_closed_forms():
    # H100 across nodes: 989.4 TFLOP/s, 50 GB/s per direction: B* = 2 x 2 x 989.4e12 / 300e9
    b = comm.min_tokens_per_device(989.4e12, 50e9, dp=10**9)
    assert b == pytest.approx(4 * 989.4e12 / (6 * 50e9), rel=1e-6) and round(b) == 13192
    assert comm.min_tokens_per_device(989.4e12, 50e9, 10**9, zero_stage=3) == pytest.approx(1.5 * b)
    # at B* the step's compute equals its communication (the ridge of the roofline)
    step = comm.data_parallel_step(SPEC, H100, 1024, comm.min_tokens_per_device(
        H100.peak_flops, 50e9, 1024) * SPEC.params() / SPEC.matmul_params(), Link(0, 50e9),
        overlap=False)
    assert step["compute"] == pytest.approx(step["comm"], rel=1e-9)
    # TP: about 1,300 hidden units per shard on NVLink at tp 8, 11,500 across nodes
    assert comm.min_ffn_per_shard(989.4e12, 450e9, 8) == pytest.approx(1282.6, abs=0.1)
    assert comm.min_ffn_per_shard(989.4e12, 50e9, 8) == pytest.approx(11543, abs=1)
    with pytest.raises(ValueError, match="must be positive"):
        comm.min_tokens_per_device(0, 50e9, 8)


def test_overlap_hides_communication_above_the_roofline_only():
    link = Link(0, 50e9)
    below = comm.data_parallel_step(SPEC, H100, 64, 1000, link)
    above = comm.data_parallel_step(SPEC, H100, 64, 100_000, link)
    assert below["exposed"] > 0.5 * below["comm"]          # communication-bound
    assert above["exposed"] == pytest.approx(above["comm"] / 25)  # only the last bucket shows
    no_overlap = comm.data_parallel_step(SPEC, H100, 64, 100_000, link, overlap=False)
    assert no_overlap["exposed"] == no_overlap["comm"]


def test_strategy_bytes_follow_the_textbook():
    link = Link(0, 1e9)
    spec = get_spec("llama-3-8b")
    tp = comm.tensor_parallel_comm(spec, 8, 4096, link)
    assert tp.bytes == pytest.approx(4 * 32 * 2 * 7 / 8 * 4096 * 4096 * 2)
    assert tp.collectives == 4 * 32
    decode = comm.decode_tp_comm(spec, 8, 64, link)
    assert decode.collectives == 2 * 32
    ep = comm.expert_parallel_comm(get_spec("mixtral-8x7b"), 8, 1000, link)
    assert ep.bytes == pytest.approx(4 * 32 * 7 / 8 * 1000 * 2 * 4096 * 2)
    u = comm.ulysses_comm(spec, 8, 8192, link, backward=False)
    assert u.bytes == pytest.approx(32 * 7 / 8 * 8192 / 8 * 128 * 2 * (32 + 8 + 8 + 32))
    with pytest.raises(ValueError, match="does not divide llama-3-8b's 8 key/value heads"):
        comm.ulysses_comm(spec, 16, 8192, link)


# ---------------------------------------------------------------------- layouts and memory
def test_training_memory_uses_zero_and_refuses_what_does_not_fit():
    spec = get_spec("llama-3-70b")
    lay = Layout(dp=64, zero=3, recompute=True)
    m = training_memory(spec, lay, 4096)
    states = m["weights"] + m["gradients"] + m["optimizer"]
    assert states == pytest.approx(zero_model_state_bytes(spec.params(), 64, 3), rel=1e-9)
    # 70.55B parameters: 2 + 2 + 12 bytes each, replicated on every data-parallel rank
    with pytest.raises(DoesNotFit, match=r"trainer layout dp8 of llama-3-70b needs 1,222.2 GB per "
                                          r"H100-SXM-80GB \(weights 141.1, gradients 141.1, "
                                          r"optimizer 846.6, .* 72.0 GB usable .* ZeRO-3/FSDP"):
        check_training(spec, Layout(dp=8), H100, 4096, role="trainer")
    offloaded = training_memory(spec, Layout(dp=8, tp=8, offload=True), 4096)
    assert offloaded["optimizer"] == 0


def test_expert_parallelism_shards_the_experts():
    spec = get_spec("qwen3-30b-a3b")
    a = training_memory(spec, Layout(dp=8, ep=8), 2048)
    b = training_memory(spec, Layout(dp=8), 2048)
    assert a["weights"] < b["weights"] / 4
    with pytest.raises(ValueError, match="ep=3 must divide tp x cp x dp = 8"):
        Layout(dp=8, ep=3)


def test_kv_slots_and_the_generation_tp_choice():
    spec = get_spec("llama-3-70b")
    with pytest.raises(DoesNotFit, match="raise the generation tp"):
        kv_slots(spec, 1, H100, 4096)
    assert kv_slots(spec, 4, H100, 4096) < kv_slots(spec, 8, H100, 4096)
    link = comm.Fabric.of(H100).link(8)
    best, times = choose_generation_tp(spec, H100, 64, 1024, 4096, link)
    assert 1 not in times and best in (2, 4, 8)
    assert times[best] == min(times.values())
    # a few sequences per device: decode is memory-bound, and splitting the weight reads wins;
    # many: an engine's one-shot all-reduce inside a node keeps a wide TP's collectives cheap,
    # and the weights it splits leave more room for KV caches (fewer waves)
    few, t_few = choose_generation_tp(get_spec("llama-3-8b"), H100, 64, 64, 4096, link)
    many, t_many = choose_generation_tp(get_spec("llama-3-8b"), H100, 64, 65536, 4096, link)
    assert few == 8 and t_few[1] > 2 * t_few[8]
    assert many == 8 and t_many[2] > t_many[8]
    # across nodes the network's latency returns: a TP-16 step of Llama-3-70B pays NCCL's
    # all-reduces over the NICs, several times the TP-8 step's in-node ones
    spec70, fabric = get_spec("llama-3-70b"), comm.Fabric.of(H100)
    inside = comm.decode_tp_comm(spec70, 8, 64, fabric.link(8), in_node=True).seconds
    across = comm.decode_tp_comm(spec70, 16, 64, fabric.link(16)).seconds
    assert across > 5 * inside


# ---------------------------------------------------------------------- phases
def test_decode_closed_form_equals_the_step_by_step_sum():
    rates = Rates(decode_step_latency=1e-4)
    cost = DecodeCost(SPEC, H100, 2, rates, comm.Fabric.of(H100))
    for a, c, s in ((1, 300, 200), (512, 512 * 900, 300), (4096, 4096 * 8000, 50)):
        brute = 0.0
        for t in range(s):
            f0, f1, b0, b1 = cost._terms(a, c)
            brute += max(f0 + f1 * t, b0 + b1 * t) + cost._constant(a)
        assert cost.seconds(s, a, c) == pytest.approx(brute, rel=1e-12)
        k = cost.steps_within(cost.seconds(s, a, c) / 3, a, c, s)
        assert cost.seconds(k, a, c) <= cost.seconds(s, a, c) / 3 < cost.seconds(k + 1, a, c)


def test_one_sequence_decodes_at_the_bandwidth_bound():
    rates = Rates(decode_bandwidth=1.0)
    cost = DecodeCost(SPEC, H100, 1, rates)
    # one token: the weights are read once, 2 bytes per parameter
    assert cost.seconds(1, 1, 0) == pytest.approx(
        (2 * SPEC.params() + SPEC.kv_cache_bytes_per_token()) / H100.memory_bandwidth)


def test_pass_flops_follow_the_algorithms_passes():
    grpo, ppo = preset("grpo"), preset("ppo")
    g = pass_flops(SPEC, grpo, 100, [200, 300])
    p = pass_flops(SPEC, ppo, 100, [200, 300])
    assert set(g) == {"scoring", "policy update"} and set(p) == {"scoring", "policy update",
                                                                 "critic update"}
    assert g["policy update"] == pytest.approx(3 * g["scoring"] / 2)  # old policy + reference
    engine = pass_flops(SPEC, grpo, 100, [200, 300], engine_log_probs=True)
    assert engine["scoring"] == pytest.approx(g["scoring"] / 2)


def test_trainer_pipeline_bubble_is_the_1f1b_bubble():
    config = preset("grpo", minibatches=1, kl_coef=0.0, kl_mode="none")
    lay = Layout(dp=1, pp=4, micro_batch=1)
    lengths = [500] * 8  # 8 micro-batches per optimizer step
    rates = Rates()
    cost = TrainerCost(SPEC, config, lay, H100, rates, comm.Fabric.of(H100), 100)
    seconds = cost.seconds(lengths)["policy update"]
    flops = pass_flops(SPEC, config, 100, lengths)["policy update"]
    ideal = flops / (4 * H100.peak_flops * rates.train_hfu)
    bubble = simulate_pipeline(schedule_table("1f1b", 4, 8)).bubble_fraction
    hops = 3 * comm.pipeline_comm(SPEC, 600, comm.Fabric.of(H100).link(4)).seconds
    # the optimizer step: a device's weights, gradients and Adam states (16 bytes per parameter
    # of its quarter of the model) read and written once at the memory bandwidth
    adam = 2 * 16 * SPEC.params() / 4 / H100.memory_bandwidth
    assert cost.adam_seconds() == pytest.approx(adam, rel=1e-9)
    assert seconds == pytest.approx(ideal / (1 - bubble) + hops + adam, rel=1e-9)
    # fixed seconds per micro-batch and per optimizer step add as counted: 8 micro-batches
    slow = TrainerCost(SPEC, config, lay, H100, Rates(micro_batch_seconds=0.01,
                                                        optimizer_step_seconds=0.5),
                       comm.Fabric.of(H100), 100).seconds(lengths)["policy update"]
    assert slow == pytest.approx(seconds + 8 * 0.01 + 0.5, rel=1e-9)


# ---------------------------------------------------------------------- whole iterations
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
    lengths = tuple([256] * 7 + [4096]) * 32  # one long sample per group
    tail = Workload(32, 8, 256, 4096, response_lengths=lengths)
    fusion = Mode(stage_fusion=True, fusion_threshold=0.85)
    base = simulate(_scenario(workload=tail, config=config, trainer=Layout(dp=16, zero=3)))
    fused = simulate(_scenario(workload=tail, config=config, trainer=Layout(dp=16, zero=3),
                               mode=fusion))
    assert fused.step_seconds < base.step_seconds
    # closed form: when the short 7/8 of the samples are done (each replica: a prefill of its 2
    # groups' prompts and 255 steps of 16), the 32 long samples migrate to 2 of the 16 replicas
    # (1/8), re-prefill their 511-token contexts there and decode their last 3,840 tokens, while
    # the short ones are scored on the other 7/8 of the devices; the tail's samples are scored
    # after it
    s = _scenario(workload=tail, config=config, trainer=Layout(dp=16, zero=3))
    cost = DecodeCost(SPEC, H100, 1, s.rates, None, tail)
    t_short = cost.prefill_seconds({256: 2}) + cost.seconds(255, 16, 16 * 257)
    t_tail = cost.prefill_seconds({511: 16}) + cost.seconds(3840, 16, 16 * 512)
    trainer = TrainerCost(SPEC, config, s.trainer_layout, H100, s.rates, comm.Fabric.of(H100), 256)
    head = trainer.seconds([256] * 224)["scoring"]
    whole = trainer.seconds(list(lengths))
    expected = (max(t_short + t_tail, t_short + head / (1 - 1 / 8)) + whole["scoring"] - head
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


def test_nonsense_rates_and_modes_are_refused():
    import math

    for field in ("decode_step_latency", "iteration_overhead", "reward_seconds"):
        with pytest.raises(ValueError, match=f"Rates.{field}=inf must be a finite"):
            Rates(**{field: math.inf})
    with pytest.raises(ValueError, match="host_bandwidth"):
        Rates(host_bandwidth=math.inf)
    with pytest.raises(ValueError, match="stage fusion .* does not combine"):
        Mode(stage_fusion=True, partial_rollout=True)
    with pytest.raises(ValueError, match=r"give a Mode, e.g. MODES\['async'\]"):
        Scenario(get_spec("qwen2.5-7b"), preset("grpo"),
                 Workload.long_tailed(8, 4, 64, 100, 0.5, 400),
                 Cluster(get_device("H100-SXM-80GB"), 8), mode="async")
