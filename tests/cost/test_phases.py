"""Seconds of the stages (rlm_course.cost.phases) against closed forms: decode, the passes' FLOPs,
the trainer's pipeline bubble."""

import numpy as np
import pytest

from rlm_course.cost.architectures import get_spec
from rlm_course.cost.hardware import get_device
from rlm_course.parallel.pipeline import schedule_table, simulate as simulate_pipeline
from rlm_course.rl.algorithms import preset
from rlm_course.cost import comm
from rlm_course.cost.layouts import Layout
from rlm_course.cost.comm import Link
from rlm_course.cost.phases import DecodeCost, Rates, TrainerCost, pass_flops

H100 = get_device("H100-SXM-80GB")
SPEC = get_spec("qwen2.5-7b")


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
    # numpy's integers as the degree: the same replica (its all-reduces were refused, numpy's
    # comparison giving a numpy bool for the one-shot all-reduce's in_node)
    same = DecodeCost(SPEC, H100, np.int64(2), rates, comm.Fabric.of(H100))
    assert same.tp == 2 and type(same.tp) is int
    assert same.seconds(300, 512, 512 * 900) == cost.seconds(300, 512, 512 * 900)


def test_one_sequence_decodes_at_the_bandwidth_bound():
    rates = Rates(decode_bandwidth=1.0)
    cost = DecodeCost(SPEC, H100, 1, rates)
    # one token: the weights are read once, 2 bytes per parameter
    assert cost.seconds(1, 1, 0) == pytest.approx(
        (2 * SPEC.params() + SPEC.kv_cache_bytes_per_token()) / H100.memory_bandwidth)


def test_an_engine_across_nodes_pays_its_all_reduces_over_the_network_per_layer():
    # Qwen3-235B (94 layers): a TP-16 replica spans two H100 nodes, one level of NCCL's node
    # tree, and pays the cross-node rate once on each of its 2 x 94 = 188 all-reduces a decode
    # step; TP 32 spans four nodes, two levels: twice; TP 8 stays in a node and pays nothing, and
    # so does TP 32 on a GB200 NVL72 rack (one NVLink domain of 72)
    spec = get_spec("qwen3-235b-a22b")
    gb200 = get_device("GB200-NVL72-186GB")
    x = 5e-5
    for device, tp, extra in ((H100, 16, 188 * x), (H100, 32, 2 * 188 * x), (H100, 8, 0.0),
                              (gb200, 32, 0.0)):
        fabric = comm.Fabric.of(device)
        plain = DecodeCost(spec, device, tp, Rates(), fabric)
        paid = DecodeCost(spec, device, tp, Rates(cross_node_all_reduce_seconds=x), fabric)
        assert paid.seconds(10, 32, 32 * 1000) - plain.seconds(10, 32, 32 * 1000) == (
            pytest.approx(10 * extra, abs=1e-12)), (device.name, tp)
    with pytest.raises(ValueError, match="cross_node_all_reduce_seconds=-1e-05 must be a finite"):
        Rates(cross_node_all_reduce_seconds=-1e-5)


def test_a_rate_that_is_not_a_number_is_refused_by_name():
    # a corrupt rates file or a typed-in value: a clear ValueError, not a TypeError from a comparison
    for field, value, message in (
            ("cross_node_all_reduce_seconds", "x", "must be a number, not a str"),
            ("decode_step_latency", True, "must be a number, not a bool"),
            ("train_hfu", None, r"None: give a number \(the default is 0.4\)"),
            ("host_bandwidth", "fast", "must be a number, not a str"),
            ("train_flops_factor", [2], "must be a number, not a list")):
        with pytest.raises(ValueError, match=f"Rates.{field}=.*{message}"):
            Rates(**{field: value})
        with pytest.raises(ValueError, match=f"Rates.{field}="):
            Rates.from_dict({field: value})
    assert Rates(decode_step_latency=1, host_bandwidth=None).decode_step_latency == 1


def test_a_flag_a_count_or_a_link_of_the_wrong_kind_is_refused_by_name():
    # "false" in a rates file is a true string, and a link written as text failed deep in a
    # simulation; numpy's integers are integers
    for field, value, message in (
            ("cuda_graphs", "false", "must be true or false"),
            ("static_batching", 7, "must be true or false"),
            ("prefix_caching", None, "must be true or false"),
            ("sync_pipeline_whole", "true", "must be true or false"),
            ("max_batch", True, "must be a positive integer"),
            ("max_batch", 1024.0, "must be a positive integer"),
            ("intra_link", "fast", r"must be a Link, written \[alpha seconds, beta bytes/s\]"),
            ("inter_link", {"alpha": 1e-6, "beta": 1e10}, "must be a Link")):
        with pytest.raises(ValueError, match=f"Rates.{field}=.*{message}"):
            Rates(**{field: value})
        with pytest.raises(ValueError, match=f"Rates.{field}="):
            Rates.from_dict({field: value})
    for link, message in (([1, 2, 3], "two numbers"), ([1e-6], "two numbers"),
                          (["a", "b"], "Link.alpha='a' must be a number, not a str"),
                          ([-1, 1e9], "need alpha >= 0"), ([1e-6, 0], "positive finite")):
        with pytest.raises(ValueError, match=message):
            Rates.from_dict({"intra_link": link})
    assert Rates(max_batch=np.int64(8)).max_batch == 8
    assert Rates.from_dict({"inter_link": [2e-6, 5e10]}).inter_link == Link(2e-6, 5e10)
    # a family's name where Rates belong, a list where a dict belongs: ValueError, with the fix
    with pytest.raises(ValueError, match=r"calibrated_rates\('nemo-rl'\)"):
        Rates.from_dict({"train_hfu": 0.5}, "nemo-rl")
    with pytest.raises(ValueError, match="must be a dict"):
        Rates.from_dict(["train_hfu"])
    assert Rates.from_dict({"train_hfu": 0.5}, Rates(forward_mfu=0.3)) == Rates(
        train_hfu=0.5, forward_mfu=0.3)


def test_pass_flops_follow_the_algorithms_passes():
    grpo, ppo = preset("grpo"), preset("ppo")
    g = pass_flops(SPEC, grpo, 100, [200, 300])
    p = pass_flops(SPEC, ppo, 100, [200, 300])
    assert set(g) == {"scoring", "policy update"} and set(p) == {"scoring", "policy update",
                                                                 "critic update"}
    assert g["policy update"] == pytest.approx(3 * g["scoring"] / 2)  # old policy + reference
    engine = pass_flops(SPEC, grpo, 100, [200, 300], engine_log_probs=True)
    assert engine["scoring"] == pytest.approx(g["scoring"] / 2)


def test_the_trainer_and_the_stage_costs_refuse_sequences_past_the_window():
    from rlm_course.cost.anatomy import Workload, stage_costs

    config, lay = preset("grpo", minibatches=1), Layout(dp=1, micro_batch=1)
    cost = TrainerCost(SPEC, config, lay, H100, Rates(), comm.Fabric.of(H100), 100)
    window = SPEC.max_context  # Qwen2.5-7B: 131,072
    assert cost.seconds([window - 100])["policy update"] > 0  # up to the window: priced
    with pytest.raises(ValueError, match=f"reads at most {window:,} tokens"):
        cost.seconds([500, 10 ** 7])  # 10 million tokens was priced at 398,607 s
    with pytest.raises(ValueError, match="llama-3-8b reads at most 8,192 tokens"):
        stage_costs(get_spec("llama-3-8b"), config, Workload(4, 4, 8000, 8000))


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
    # of its stage) read and written once at the memory bandwidth; the busiest stage is the last:
    # 7 of the 28 layers, the final norm and the untied output head (152,064 x 3,584): 2.18B
    # parameters, where a quarter of the model is 1.90B
    stage = 7 * SPEC.layer_params() + 152064 * 3584 + 3584
    assert stage == 2_176_405_504 and SPEC.params() / 4 == pytest.approx(1.904e9, rel=1e-3)
    adam = 2 * 16 * stage / H100.memory_bandwidth
    assert cost.adam_seconds() == pytest.approx(adam, rel=1e-9)
    assert seconds == pytest.approx(ideal / (1 - bubble) + hops + adam, rel=1e-9)
    # fixed seconds per micro-batch and per optimizer step add as counted: 8 micro-batches
    slow = TrainerCost(SPEC, config, lay, H100, Rates(micro_batch_seconds=0.01,
                                                        optimizer_step_seconds=0.5),
                       comm.Fabric.of(H100), 100).seconds(lengths)["policy update"]
    assert slow == pytest.approx(seconds + 8 * 0.01 + 0.5, rel=1e-9)
    # the compute at a multiple of the rate: FP8's 2, an unfused trainer's 0.8 (NeMo-RL before
    # v0.5 on Qwen3: "~25% training perf speedup" from bias_activation_fusion); the hops and the
    # optimizer's memory-bound step do not change
    for factor in (2.0, 0.8):
        scaled = TrainerCost(SPEC, config, lay, H100, Rates(train_flops_factor=factor),
                             comm.Fabric.of(H100), 100).seconds(lengths)["policy update"]
        assert scaled == pytest.approx(ideal / factor / (1 - bubble) + hops + adam, rel=1e-9)
    for bad in (0.0, 0.05, 9):
        with pytest.raises(ValueError, match=r"train_flops_factor=.* must be in \[0.1, 8\]"):
            Rates(train_flops_factor=bad)


def test_expert_parallel_all_to_alls_carry_a_ranks_sequence_parallel_shard(monkeypatch):
    """Under TP with sequence parallelism a rank dispatches its 1/tp of a micro-batch's tokens
    (Megatron-Core's all-to-all dispatcher takes [S/TP, B, H]); with full recomputation the
    update runs the dispatch and combine of each layer's forward again."""
    spec = get_spec("qwen3-235b-a22b")
    calls = []
    real = comm.expert_parallel_comm

    def spy(spec, ep, tokens, link, backward=True, act_bytes=2, recompute=False):
        calls.append((ep, tokens, backward, recompute))
        return real(spec, ep, tokens, link, backward, act_bytes, recompute)

    monkeypatch.setattr(comm, "expert_parallel_comm", spy)
    config = preset("grpo", minibatches=1)
    for tp in (1, 4):
        calls.clear()
        lay = Layout(dp=16 // tp, tp=tp, pp=8, ep=16, zero=1, recompute=True,
                     micro_batch_tokens=8192)
        TrainerCost(spec, config, lay, H100, Rates(), comm.Fabric.of(H100), 110).seconds(
            [8082] * 64)
        # one 8,192-token micro-batch holds one 8,192-token sequence; a rank of the TP group
        # dispatches 8,192 / tp of its tokens, in the update and in the scoring pass
        assert sorted(calls) == [(16, 8192 / tp, False, True), (16, 8192 / tp, True, True)]
    with pytest.raises(ValueError, match="sequence parallelism"):
        Layout(dp=4, tp=4, pp=8, ep=16, sequence_parallel=False).check(spec)


def test_zero2_reduce_scatters_every_micro_batch_and_gathers_once_per_step():
    """ZeRO-2 keeps only a shard of the accumulated gradient, so each micro-batch's backward
    reduce-scatters (DeepSpeed's stage 2); ZeRO-1 reduces the accumulated gradient once."""
    spec = get_spec("llama-3-8b")
    fabric = comm.Fabric.of(H100)
    link = fabric.link(8, 1)
    g = spec.params() * 2
    scatter = comm.reduce_scatter_seconds(g, 8, link)
    gather = comm.all_gather_seconds(g, 8, link)
    seconds = {}
    for zero in (1, 2):
        cost = TrainerCost(spec, preset("grpo"), Layout(dp=8, zero=zero, overlap=False), H100,
                           Rates(), fabric, 256)
        seconds[zero] = [cost._data_parallel(0.0, 1, micro, True) for micro in (1, 8)]
    assert seconds[1] == pytest.approx([scatter + gather] * 2, rel=1e-12)
    assert seconds[2] == pytest.approx([scatter + gather, 8 * scatter + gather], rel=1e-12)
    assert seconds[2][1] == pytest.approx(0.28127, rel=1e-4)  # Llama-3-8B on 8 H100s, 8 micro


def test_a_prefill_reads_the_experts_its_tokens_touch_and_pays_tp_all_reduces():
    from rlm_course.cost.anatomy import Workload, weight_bytes
    from rlm_course.cost.architectures import teacher_forced_flops

    moe, rates = get_spec("qwen3-30b-a3b"), Rates()
    cost = DecodeCost(moe, H100, 1, rates)
    w = Workload(1, 1, 1, 1)
    # one 512-token prompt touches all 128 experts (it was priced as reading the 8 that one
    # token touches: 7.5 ms where the weights alone take 26 ms)
    assert weight_bytes(moe, w, 512) == pytest.approx(2 * moe.params(), rel=1e-6)
    want = max(teacher_forced_flops(moe, 512, 1) / cost.prefill_rate,
               (weight_bytes(moe, w, 512) + cost.kv * 512) / cost.byte_rate)
    assert cost.prefill_seconds({512: 1}) == pytest.approx(want)
    assert cost.prefill_seconds({512: 1}) >= cost.prefill_seconds({8: 64}) * 0.99
    # no sequence to prefill reads nothing (it was priced one read of the weights)
    assert cost.prefill_seconds({512: 0}) == cost.prefill_seconds({}) == 0.0
    with pytest.raises(ValueError, match="sequences=-1"):
        cost.prefill_seconds({512: -1})
    # TP 8: two all-reduces of tokens x d_model a layer, as a decode step of that many tokens
    big, fabric = get_spec("llama-3.1-70b"), comm.Fabric.of(H100)
    tp8 = DecodeCost(big, H100, 8, rates, fabric)
    roofline = max(teacher_forced_flops(big, 4096, 8) / tp8.prefill_rate,
                   (2 * big.params() / 8 + tp8.kv * 32768) / tp8.byte_rate)
    reduce = comm.decode_tp_comm(big, 8, 32768, fabric.intra, in_node=True).seconds
    assert reduce > 0.1 * roofline
    assert tp8.prefill_seconds({4096: 8}) == pytest.approx(roofline + reduce)


def test_the_engine_all_reduce_runs_only_on_the_group_sizes_its_kernel_supports():
    gb200 = get_device("GB200-NVL72-186GB")
    link = comm.Fabric.of(gb200).intra
    m = 512 * 1024
    for p in (2, 4, 8):
        assert comm.engine_all_reduce_seconds(m, p, link) < comm.all_reduce_seconds(m, p, link)
    for p in (16, 32, 64):  # inside one NVL72 domain, but vLLM's kernel stops at 8: NCCL
        assert comm.engine_all_reduce_seconds(m, p, link) == comm.all_reduce_seconds(m, p, link)


def test_the_stage_model_refuses_bad_input_with_a_value_error():
    import re

    rates, fabric = Rates(), comm.Fabric.of(H100)
    cost = DecodeCost(SPEC, H100, 1, rates)
    trainer = TrainerCost(SPEC, preset("grpo"), Layout(), H100, rates, None, 100)
    link = Link()
    bad = [
        (lambda: cost.seconds(1, 4, -1e9), "context_sum=-1000000000.0"),
        (lambda: cost.seconds(float("nan"), 4, 100), "steps=nan"),
        (lambda: cost.seconds(2.5, 4, 100), "steps=2.5"),
        (lambda: cost.seconds(1, True, 100), "active=True"),
        (lambda: cost.seconds(1, 4, float("inf")), "context_sum=inf"),
        (lambda: cost.steps_within(1.0, 4, 100, 2.5), "limit=2.5"),  # looped forever
        (lambda: cost.steps_within(float("nan"), 4, 100, 10), "elapsed=nan"),
        (lambda: trainer.seconds([-100] * 8), "a response length of -100"),
        (lambda: trainer.seconds([100.7]), "a response length of 100.7"),
        (lambda: trainer.seconds(5), "lengths=5"),
        (lambda: trainer.seconds([100], optimizer_steps=0), "optimizer_steps=0"),
        (lambda: DecodeCost("qwen2.5-7b", H100, 1, rates), "spec='qwen2.5-7b'"),
        (lambda: DecodeCost(SPEC, H100, 1, None), "rates=None"),
        (lambda: DecodeCost(SPEC, H100, 2, rates, "nvlink"), "fabric='nvlink'"),
        (lambda: TrainerCost(SPEC, None, Layout(), H100, rates, None, 100), "config=None"),
        (lambda: TrainerCost(SPEC, preset("grpo"), {"dp": 2}, H100, rates, None, 100),
         "layout={'dp': 2}"),
        (lambda: link.seconds(-1e9), "nbytes=-1000000000.0"),
        (lambda: link.seconds(float("nan")), "nbytes=nan"),
        (lambda: comm.Fabric(link, link, True), "devices_per_node=True"),
        (lambda: comm.Fabric("nvlink", link, 8), "Fabric.intra='nvlink'"),
        (lambda: comm.Fabric.of(H100, intra=(5e-6, 25e9)), "Fabric.intra=(5e-06"),
        (lambda: comm.Fabric.of("H100-SXM-80GB"), "device='H100-SXM-80GB'"),
        (lambda: fabric.link(0), "size=0"),
        (lambda: fabric.link(2.5), "size=2.5"),
        (lambda: fabric.link(64, stride=0), "stride=0"),
    ]
    for call, message in bad:
        with pytest.raises(ValueError, match=re.escape(message)):
            call()
    assert comm.Fabric(link, link, np.int64(8)).devices_per_node == 8  # numpy's integers too


def test_an_offloaded_optimizer_step_is_the_cpu_adam_of_the_host_or_the_host_copies():
    # ZeRO-1 with the optimizer on the host (Megatron's optimizer_cpu_offload): each device's
    # 1/dp shard is stepped by its host's CPUs, all the host's shards at once, so one 8-GPU host
    # steps the whole 7.6B-parameter model in params / rate seconds, two hosts in half that;
    # each device's gradient shard goes out and its bf16 weight shard comes back meanwhile
    # (2 + 2 bytes a parameter of the shard), which bounds the step on fast CPUs
    config = preset("grpo", minibatches=1)
    params = SPEC.params()
    assert params == pytest.approx(7.6e9, rel=0.01)
    rate = 2.5e9  # parameters a second a host
    host = Rates().host(H100)
    for devices, seconds in ((8, params / rate), (16, params / (2 * rate)), (2, params / rate),
                             (72, params / (9 * rate))):
        lay = Layout(dp=devices, zero=1, offload=True)
        cost = TrainerCost(SPEC, config, lay, H100, Rates(host_adam_params_per_second=rate),
                           comm.Fabric.of(H100), 100)
        assert cost.adam_seconds() == pytest.approx(seconds, rel=1e-9), devices
        fast = TrainerCost(SPEC, config, lay, H100, Rates(host_adam_params_per_second=rate * 1e3),
                           comm.Fabric.of(H100), 100)
        assert fast.adam_seconds() == pytest.approx(4 * params / devices / host, rel=1e-9), devices
    # ZeRO-0: every replica steps its whole copy, the host's 8 at once
    zero0 = TrainerCost(SPEC, config, Layout(dp=8, zero=0, offload=True), H100,
                        Rates(host_adam_params_per_second=rate), comm.Fabric.of(H100), 100)
    assert zero0.adam_seconds() == pytest.approx(8 * params / rate, rel=1e-9)
    # a GB200 NVL72 is one NVLink domain of 72 GPUs but 18 hosts of 4: 72 devices step on 18
    gb200 = get_device("GB200-NVL72-186GB")
    assert gb200.devices_per_node == 72 and gb200.host_devices == 4
    rack = TrainerCost(SPEC, config, Layout(dp=72, zero=1, offload=True), gb200,
                       Rates(host_adam_params_per_second=rate), comm.Fabric.of(gb200), 100)
    assert rack.adam_seconds() == pytest.approx(params / (18 * rate), rel=1e-9)
    # without offload the step stays on the device, at its memory bandwidth, whatever the CPU
    on_device = TrainerCost(SPEC, config, Layout(dp=8, zero=1), H100,
                            Rates(host_adam_params_per_second=1.0), comm.Fabric.of(H100), 100)
    assert on_device.adam_seconds() < 0.1
    for bad in (0, -1.0, 1e-300, float("inf"), float("nan"), "fast", True, None):
        with pytest.raises(ValueError, match="host_adam_params_per_second"):
            Rates(host_adam_params_per_second=bad)


def test_the_node_tree_has_nccls_levels():
    # NCCL's tuning model charges log2i(nNodes) network levels: the logarithm rounded down
    from rlm_course.cost.comm import node_tree_levels

    assert [node_tree_levels(n) for n in (1, 2, 3, 4, 5, 7, 8, 9, 16)] == [0, 1, 1, 2, 2, 2, 3, 3, 4]
    for bad in (0, -2, 2.0, True):
        with pytest.raises(ValueError, match="node_tree_levels"):
            node_tree_levels(bad)
    # a TP-40 engine on five H100 nodes pays two levels on each of its all-reduces
    spec = get_spec("qwen2.5-32b")
    x = 5e-5
    fabric = comm.Fabric.of(H100)
    plain = DecodeCost(spec, H100, 40, Rates(), fabric)
    paid = DecodeCost(spec, H100, 40, Rates(cross_node_all_reduce_seconds=x), fabric)
    assert paid.seconds(10, 32, 32 * 1000) - plain.seconds(10, 32, 32 * 1000) == pytest.approx(
        10 * 2 * spec.n_layer * 2 * x, abs=1e-12)


def test_speculative_decoding_prices_a_verify_step_over_the_tokens_it_yields():
    from rlm_course.cost.anatomy import Workload, weight_bytes

    # one drafted token accepted half the time: a step yields (1 - 0.5^2) / (1 - 0.5) = 1.5
    # tokens a sequence (Leviathan et al. 2023, eq. 1); it computes 2 tokens a sequence, reads
    # the weights 4 tokens touch (2 a sequence) and, for its draft pass, one more layer's and the
    # output head, reads the KV cache once and writes 2 entries a sequence; the draft pass
    # computes one layer and the head a sequence and reads and extends its layer's own cache
    fabric = comm.Fabric.of(H100)
    plain = DecodeCost(SPEC, H100, 2, Rates(decode_step_latency=1e-3), fabric)
    spec = DecodeCost(SPEC, H100, 2, Rates(decode_step_latency=1e-3, speculative_tokens=1,
                                           draft_acceptance=0.5), fabric)
    assert spec.tokens_per_step == pytest.approx(1.5)
    w = Workload(1, 1, 1, 1)
    a, context = 2, 2 * 600
    head = SPEC.vocab_size * SPEC.d_model * 2
    weights = (weight_bytes(SPEC, w, 4) + weight_bytes(SPEC, w, 2) / SPEC.n_layer + head) / 2
    layers = SPEC.n_layer
    memory = (weights + spec.kv * (context + 4) + spec.kv / layers * (context + 2)
              ) / spec.byte_rate
    head_flops = 2 * SPEC.d_model * SPEC.vocab_size
    draft_flops = (spec.per_token - head_flops) / layers + head_flops
    compute = (2 * (a * spec.per_token + spec.attention * context)
               + a * draft_flops + spec.attention / layers * context) / spec.flop_rate
    fixed = 1e-3 + comm.decode_tp_comm(SPEC, 2, 4, fabric.intra, in_node=True).seconds
    assert spec.seconds(1, a, context) == pytest.approx((max(memory, compute) + fixed) / 1.5)
    # memory-bound, so a token costs about 1 / 1.5 of an ordinary step (a little more: the
    # draft's layer and head); model FLOPs count the tokens kept, the same as without a draft
    assert 0.67 < spec.seconds(100, a, context) / plain.seconds(100, a, context) < 0.72
    spec.count(100, a, context)
    plain.count(100, a, context)
    assert spec.flops == plain.flops
    # no speculative tokens: the same seconds whatever the acceptance
    assert DecodeCost(SPEC, H100, 2, Rates(decode_step_latency=1e-3, draft_acceptance=0.3),
                      fabric).seconds(100, a, context) == plain.seconds(100, a, context)
    # an acceptance near 1 with 3 drafted tokens yields close to 4 tokens a step
    assert DecodeCost(SPEC, H100, 1, Rates(speculative_tokens=3, draft_acceptance=0.99)
                      ).tokens_per_step == pytest.approx(3.94, abs=0.01)
    for field, value, message in (("speculative_tokens", 1.5, "must be an integer from 0"),
                                  ("speculative_tokens", -1, "must be an integer from 0"),
                                  ("speculative_tokens", True, "must be an integer from 0"),
                                  ("draft_acceptance", 1.0, r"must be a probability in \(0, 1\)"),
                                  ("draft_acceptance", 0, r"must be a probability in \(0, 1\)"),
                                  ("draft_acceptance", "high", r"must be a probability")):
        with pytest.raises(ValueError, match=f"Rates.{field}=.*{message}"):
            Rates(**{field: value})


def test_log_probs_run_at_their_own_micro_batch_budget():
    # 64 sequences of 128 + 896 = 1,024 tokens on one device: the training budget of 1,024
    # tokens holds one a micro-batch, the log-prob budget of 8,192 (NeMo-RL's logprob_mb_tokens)
    # eight: 64 forward micro-batches become 8, and at 10 ms a micro-batch the scoring stage
    # loses 56 x 10 ms; the update keeps its 64 micro-batches
    rates = Rates(micro_batch_seconds=0.01)
    lengths = [896] * 64

    def stages(**budget):
        lay = Layout(micro_batch_tokens=1024, **budget)
        return TrainerCost(SPEC, preset("grpo"), lay, H100, rates, None, 128).seconds(lengths)

    same, larger = stages(), stages(scoring_micro_batch_tokens=8192)
    assert same["scoring"] - larger["scoring"] == pytest.approx(56 * 0.01)
    assert {k: v for k, v in larger.items() if k != "scoring"} == \
        {k: v for k, v in same.items() if k != "scoring"}
    assert Layout(micro_batch_tokens=1024).micro_tokens(1024, scoring=True) == 1024  # 0: same
    # through a pipeline the fewer, larger micro-batches leave a larger bubble, (pp - 1) /
    # (m + pp - 1), and send larger activations between the stages
    fab = comm.Fabric.of(H100)
    piped = [TrainerCost(SPEC, preset("grpo"), Layout(pp=2, micro_batch_tokens=1024, **b), H100,
                         Rates(), fab, 128).seconds(lengths)["scoring"]
             for b in ({}, {"scoring_micro_batch_tokens": 8192})]
    assert piped[1] > piped[0]
    for bad in (-1, True, 2.5, "8192"):
        with pytest.raises(ValueError, match="Layout.scoring_micro_batch_tokens"):
            Layout(scoring_micro_batch_tokens=bad)


def test_tp_traffic_is_the_tokens_a_rank_holds_however_they_are_cut():
    # 512 responses of 2,000 tokens on TP 8: the TP all-reduces move every token once whatever
    # the micro-batches, and larger micro-batches need fewer of them (fewer latencies): the
    # scoring stage can only shorten as the budget grows. Charging m full micro-batches for a
    # partly filled last one made it rise and fall (14.47, 14.68, 14.46, 14.56 s)
    spec = get_spec("llama-3.1-8b")
    fab = comm.Fabric.of(H100)
    lengths = [2000] * 512
    seconds = [TrainerCost(spec, preset("grpo"),
                           Layout(tp=8, micro_batch_tokens=4096, scoring_micro_batch_tokens=b),
                           H100, Rates(), fab, 128).seconds(lengths)["scoring"]
               for b in (130_000, 140_000, 260_000, 270_000, 2**40)]
    assert all(a >= b for a, b in zip(seconds, seconds[1:])), seconds
    assert seconds[0] - seconds[-1] < 0.01 * seconds[0]  # latencies only: the bytes are the same
