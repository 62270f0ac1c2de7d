"""The cost model at scale holds the right values where it was once wrong (chapters 05, 12, 14):
KV caches that TP ranks replicate, Megatron's distributed optimizer, the link a TP group spans,
MFU against HFU, the one weight-sync model and its bounds, the engine's all-reduce, the lengths
of a GRPO group."""

import math

import pytest

from rlm_course.cluster.planner import generation_estimate
from rlm_course.cluster.simulator import Scenario, algorithm, simulate
from rlm_course.cost import comm
from rlm_course.cost.anatomy import (Workload, activation_bytes, decode_step_seconds,
                                     iteration_report, lognormal_lengths)
from rlm_course.cost.architectures import get_spec, teacher_forced_flops
from rlm_course.cost.hardware import get_device
from rlm_course.cost.layouts import Layout, generation_memory, kv_slots, training_memory, usable
from rlm_course.cost.phases import Cluster, DecodeCost, Rates, offload_seconds
from rlm_course.cost.weight_sync import BUCKET_BYTES, predict_transition, sync_cost, tensor_count

H100 = get_device("H100-SXM-80GB")
DSV3, LLAMA70 = get_spec("deepseek-v3"), get_spec("llama-3-70b")
H100_LINK = comm.Fabric.of(H100).link(8)


def test_mla_and_gqa_kv_caches_are_replicated_past_their_heads():
    # DeepSeek-V3's latent: (512 + 64) values x 61 layers x 2 bytes per token, whole on every rank
    assert DSV3.kv_cache_bytes_per_token() == 576 * 61 * 2
    for tp in (1, 8, 32):
        assert DSV3.kv_shards(tp) == 1
        assert generation_memory(DSV3, tp)["kv_per_token"] == 576 * 61 * 2
    # Llama-3-70B: 8 KV heads, split up to TP 8, copied beyond
    per_token = LLAMA70.kv_cache_bytes_per_token()
    assert [LLAMA70.kv_shards(tp) for tp in (1, 4, 8, 16, 32)] == [1, 4, 8, 8, 8]
    assert generation_memory(LLAMA70, 16)["kv_per_token"] == per_token / 8
    # a memory-bound decode step of 256 sequences at 8,192 tokens on a TP-32 replica reads the
    # whole latent cache on each device: 32x what a split cache would cost
    bytes_per_device = 2 * DSV3.params(active=False) * 0 + 256 * 8192 * 576 * 61 * 2
    step = decode_step_seconds(DSV3, H100, 32, 256, 8192)
    assert step >= bytes_per_device / H100.memory_bandwidth
    cost = DecodeCost(DSV3, H100, 32, Rates(decode_bandwidth=1.0, decode_mfu=1.0),
                      comm.Fabric.of(H100), Workload(1, 1, 1, 1))
    _, _, b0, _ = cost._terms(256, 256 * 8192)
    weights = cost._weight_bytes(256)
    assert b0 * H100.memory_bandwidth == pytest.approx(weights + 256 * 8193 * 576 * 61 * 2)


def test_deepseek_v3_is_its_real_architecture_multi_head_latent_attention_and_dense_layers():
    """DeepSeek-V3 by hand from its config.json: 671B parameters, 36.6B active with the head."""
    d, h, layers = 7168, 128, 61
    # MLA a layer: q 7168 -> 1536 -> 128 x 192; kv 7168 -> 512 + 64, 512 -> 128 x (128 + 128);
    # out 128 x 128 -> 7168; the two latents' norms
    attention = (d * 1536 + 1536 * h * 192 + d * 576 + 512 * h * 256 + h * 128 * d
                 + 512 + 1536)
    assert DSV3.attention_params() == attention == 187_107_328
    expert, router, norms = 3 * d * 2048, 256 * d, 2 * d
    moe_layer = attention + 257 * expert + router + norms
    dense_layer = attention + 3 * d * 18432 + norms
    embeddings = 2 * 129280 * d
    # and a routing bias per expert (e_score_correction_bias): 671,026,419,200, the published
    # count to the parameter (the multi-token-prediction module's 11.5B aside)
    assert DSV3.params() == 58 * (moe_layer + 256) + 3 * dense_layer + embeddings + d
    assert DSV3.params() == 671_026_419_200
    assert DSV3.expert_params() == 58 * 256 * expert
    active = 58 * (attention - 2048 + 9 * expert + router) + 3 * (attention - 2048
                                                                   + 3 * d * 18432) + 129280 * d
    assert DSV3.matmul_params() == active and active / 1e9 == pytest.approx(36.6, abs=0.05)
    # state dict: 7 attention tensors and 2 norms a layer, 256 x 3 + 3 expert matrices and the
    # router's weight and bias in the 58 MoE layers, 3 MLP matrices in the 3 dense ones
    assert tensor_count(DSV3) == 58 * (9 + 771 + 2) + 3 * (9 + 3) + 3 == 45_395
    # DeepSeek-V2-Lite: queries straight from the input, 2 shared experts as one MLP, no routing
    # bias; 15.7B parameters, 2.4B active, 5,291 tensors in its Hugging Face checkpoint
    from rlm_course.cost.architectures import TransformerSpec
    lite = TransformerSpec("deepseek-v2-lite", n_layer=27, d_model=2048, n_head=16, d_head=128,
                           d_ff=1408, vocab_size=102400, n_experts=64, experts_per_token=6,
                           n_shared_experts=2, n_dense_layers=1, dense_d_ff=10944,
                           kv_lora_rank=512, qk_rope_head_dim=64, v_head_dim=128)
    assert lite.params() / 1e9 == pytest.approx(15.7, abs=0.05)
    assert lite.matmul_params() / 1e9 == pytest.approx(2.45, abs=0.01)
    assert tensor_count(lite) == 26 * (7 + 64 * 3 + 3 + 1) + (7 + 3) + 3 == 5_291
    assert lite.kv_cache_bytes_per_token() == 27 * 576 * 2
    # attention FLOPs per key: the teacher-forced kernel on the up-projected heads (keys of 192,
    # values of 128); a decode step's absorbed kernel on the latents (scores over 576, sums of 512)
    assert DSV3.flop_terms[1] == 2 * layers * h * (192 + 128)
    assert DSV3.decode_flops_per_key == 2 * layers * h * (576 + 512)
    assert DSV3.forward_flops_per_token(1000) == DSV3.flop_terms[0] + 1000 * 2 * layers * h * 320
    cost = DecodeCost(DSV3, H100, 32, Rates(), comm.Fabric.of(H100), Workload(1, 1, 1, 1))
    cost.count(1, 1, 1000)  # one step of one sequence over 1,000 cached tokens
    assert cost.flops == DSV3.flop_terms[0] + 1000 * DSV3.decode_flops_per_key
    # ring attention passes the up-projected keys and values (128 x (192 + 128) values a token),
    # not the 576-value latent the cache holds: 32,768 tokens over cp 4, one forward
    ring = comm.context_parallel_comm(DSV3, 4, 32768, H100_LINK, backward=False)
    assert ring.bytes == 3 * layers * 8192 * h * 320 * 2
    # Ulysses splits its 128 heads (no KV heads to divide): sp 8 is allowed
    DSV3.check_degree("sp", 8)
    uly = comm.ulysses_comm(DSV3, 8, 32768, H100_LINK, backward=False)
    assert uly.bytes == pytest.approx(layers * 7 / 8 * 4096 * 2 * h * (192 + 192 + 128 + 128))
    # the expert all-to-alls run in the 58 layers with experts
    ep = comm.expert_parallel_comm(DSV3, 8, 4096, H100_LINK, backward=False)
    assert ep.bytes == pytest.approx(58 * 2 * 7 / 8 * 4096 * 8 * d * 2)
    # the work-depth graph draws the same layers: its matmuls are the FLOP count's, and a decode
    # step's are the absorbed kernel's (3 sequences over 500 cached tokens)
    from rlm_course.cost import workdepth
    for spec in (DSV3, lite):
        assert workdepth.forward(spec, 2, 64).work_of("matmul") == teacher_forced_flops(spec, 64, 2)
        step = workdepth.forward(spec, 3, 1, 500, absorbed=True)
        assert step.work_of("matmul") == 3 * (spec.flop_terms[0] + 500 * spec.decode_flops_per_key)
    with pytest.raises(ValueError, match="dense=True draws one of an MoE model's first dense "
                                         "layers; llama-3-70b has 0"):
        workdepth.layer(LLAMA70, 1, 8, dense=True)
    # an MLA or dense-layer setting that does not describe one is refused by name
    base = dict(n_layer=4, d_model=64, n_head=4, d_ff=128, vocab_size=100)
    moe = dict(n_experts=4, experts_per_token=2)
    for kwargs, said in ((dict(q_lora_rank=32), "give kv_lora_rank too"),
                         (dict(kv_lora_rank=32, d_head=16, n_kv_head=2), "leave n_kv_head out"),
                         (dict(kv_lora_rank=32), "d_head is a head's qk_nope_head_dim"),
                         (dict(n_dense_layers=1, dense_d_ff=256), "a dense model has only those"),
                         (dict(moe, n_dense_layers=1), "go together: give both"),
                         (dict(moe, dense_d_ff=256), "go together: give both"),
                         (dict(moe, n_dense_layers=4, dense_d_ff=256), "must be fewer than its 4"),
                         (dict(router_bias=True), "True only for an MoE model"),
                         (dict(moe, router_bias=1), "router_bias=1 must be True or False"),
                         # a string is truthy: "False" would have tied the embeddings
                         (dict(tied_embeddings="False"), "tied_embeddings='False' must be True"),
                         (dict(glu=1), "glu=1 must be True or False"),
                         (dict(qkv_bias="no"), "qkv_bias='no' must be True or False"),
                         (dict(kv_lora_rank=0), "kv_lora_rank=0 must be a positive integer")):
        with pytest.raises(ValueError, match=said):
            TransformerSpec("bad", **base, **kwargs)
    with pytest.raises(ValueError, match="bytes_per_element=1.5 must be a whole number"):
        DSV3.kv_cache_bytes_per_token(1.5)
    import numpy as np
    assert LLAMA70.kv_shards(np.int64(4)) == 4 and DSV3.kv_shards(np.int64(32)) == 1
    with pytest.raises(ValueError, match="tp=True must be a positive integer"):
        LLAMA70.kv_shards(True)


def test_the_moe_decode_efficiency_slows_an_moe_models_memory_bound_decode_only():
    # one sequence on one device: a memory-bound step, its bytes over the bandwidth it reaches
    qwen30, qwen32 = get_spec("qwen3-30b-a3b"), get_spec("qwen3-32b")
    for spec, slower in ((qwen30, 1 / 0.4), (qwen32, 1.0)):
        plain = DecodeCost(spec, H100, 1, Rates(), None, Workload(1, 1, 1, 1))
        fitted = DecodeCost(spec, H100, 1, Rates(moe_decode_efficiency=0.4), None,
                            Workload(1, 1, 1, 1))
        assert fitted.byte_rate == pytest.approx(H100.memory_bandwidth * 0.7 * (0.4 if spec.is_moe
                                                                                 else 1.0))
        assert fitted.seconds(1, 1, 1000) == pytest.approx(slower * plain.seconds(1, 1, 1000))
    with pytest.raises(ValueError, match="moe_decode_efficiency=0 must be a fraction"):
        Rates(moe_decode_efficiency=0)


def test_megatron_distributed_optimizer_keeps_fp32_main_gradients():
    # Llama-3-70B on TP 8 x PP 2 x DP 8: 6 + 12/8 bytes per parameter of a device's sixteenth
    per_device = LLAMA70.params() / 16
    lay = Layout(dp=8, tp=8, pp=2, zero=1, main_grads_fp32=True, recompute=True)
    mem = training_memory(LLAMA70, lay, 4096)
    assert mem["weights"] == pytest.approx(2 * per_device)
    assert mem["gradients"] == pytest.approx(4 * per_device)
    assert mem["optimizer"] == pytest.approx(12 * per_device / 8)
    bf16 = training_memory(LLAMA70, Layout(dp=8, tp=8, pp=2, zero=1, recompute=True), 4096)
    # about 8.8 GB per device more than 2 + 2 + 12/d bytes per parameter
    extra = sum(mem.values()) - sum(bf16.values())
    assert extra == pytest.approx(2 * per_device) and 8.7e9 < extra < 8.9e9
    assert lay.grad_bytes == 4 and "fp32-grads" in lay.describe()


def test_generation_tp_across_nodes_is_priced_on_the_network_and_the_tail():
    fabric = comm.Fabric.of(H100)
    rates = Rates(decode_step_latency=0.01)
    for tp, beta in ((8, H100.intra_node_bandwidth), (16, H100.inter_node_bandwidth)):
        cost = DecodeCost(LLAMA70, H100, tp, rates, fabric)
        assert cost.link.beta == beta and cost.in_node == (tp <= 8)
    w = Workload.long_tailed(64, 16, 512, 2000, 0.8, 16384, seed=0)
    estimate = generation_estimate(LLAMA70, w, H100, 64, 16, rates)
    # the longest response decodes alone after the others: at least its remaining steps at one
    # sequence, each at least the per-step latency
    tail_steps = w.max_response_len - round(w.mean_response_len)
    assert estimate > tail_steps * rates.decode_step_latency
    # the TP-16 replica's all-reduces cross the network: NCCL's tree over 2 nodes of 8, by hand
    m = 4 * LLAMA70.d_model * 2  # 4 sequences' activations, bf16
    lat = comm.NCCL_LL_TREE_LATENCY
    by_hand = lat["base"] + 2 * (7 * lat["intra"] + 1 * lat["inter"]) + 2 * m / H100.inter_node_bandwidth
    assert comm.node_tree_all_reduce_seconds(m, 16, fabric) == pytest.approx(by_hand)
    per_step = comm.decode_tp_comm(LLAMA70, 16, 4, fabric.link(16), fabric=fabric).seconds
    assert per_step == pytest.approx(2 * LLAMA70.n_layer * by_hand)
    in_node = comm.decode_tp_comm(LLAMA70, 8, 4, fabric.link(8), in_node=True).seconds
    assert per_step > 2 * in_node  # the NIC's latency per all-reduce, not NVLink's


def test_mfu_counts_no_recomputation_and_hfu_does():
    spec = get_spec("qwen2.5-7b")
    workload = Workload(16, 8, 256, 512)
    scenario = Scenario(spec, algorithm("grpo", minibatches=2), workload, Cluster(H100, 8),
                        generation_tp=1, trainer=Layout(dp=8, zero=3, recompute=True))
    result = simulate(scenario)
    assert result.training_hfu == pytest.approx(4 / 3 * result.training_mfu, rel=1e-9)
    plain = simulate(Scenario(spec, algorithm("grpo", minibatches=2), workload, Cluster(H100, 8),
                              generation_tp=1, trainer=Layout(dp=8, zero=3)))
    assert plain.training_hfu == pytest.approx(plain.training_mfu, rel=1e-9)
    assert result.training_mfu < plain.training_mfu  # the recomputed forward is not model work


def test_a_colocated_sync_never_copies_more_than_a_device_holds():
    for spec in (LLAMA70, get_spec("qwen3-235b-a22b")):
        for tp in (4, 8, 16):
            if spec.n_head % tp:
                continue
            try:
                cost = sync_cost(spec, H100, "colocated", generation_tp=tp, replicas=16 // tp,
                                 trainer=Layout(dp=1, tp=8, pp=2))
            except ValueError:
                assert 2 * spec.params() / tp > H100.engine_memory_bytes
                continue
            shard = 2 * spec.params() / tp
            assert shard <= H100.engine_memory_bytes
            assert cost.copies == pytest.approx(2 * shard / H100.memory_bandwidth)
            assert cost.network_bytes == 0 and cost.ideal <= cost.seconds
    with pytest.raises(ValueError, match="raise the generation tp"):
        sync_cost(LLAMA70, H100, "colocated", generation_tp=1)  # 141 GB on an 80 GB device
    # a separate rollout device receives its whole shard too (it was priced, 0.48 s)
    with pytest.raises(ValueError, match=r"a generation shard of .* is 141.1 GB, more than a "
                                         r"H100-SXM-80GB holds \(84.9 GB\); raise the generation tp"):
        sync_cost(LLAMA70, H100, "disaggregated", generation_tp=1)
    # colocated, the trainer's devices are the engines' devices: 16 are not one engine of 8
    with pytest.raises(ValueError, match="give replicas=2 or a trainer of 8 devices"):
        sync_cost(LLAMA70, H100, "colocated", generation_tp=8, replicas=1,
                  trainer=Layout(dp=1, tp=8, pp=2))


def test_chapter_12_stage_4_equals_the_simulators_weight_sync():
    spec = get_spec("r1-distill-qwen-1.5b")  # a trainer on one device
    w = Workload(8, 4, 128, 256)
    report = iteration_report(spec, algorithm("grpo"), w, H100, devices=8, generation_tp=2,
                              weight_sync="disaggregated")
    scenario = Scenario(spec, algorithm("grpo"), w, Cluster(H100, 9), placement="disaggregated",
                        rollout_gpus=8, generation_tp=2, trainer=Layout(dp=1))
    result = simulate(scenario, iterations=2, warmup=1)
    assert result.stages["weight sync"] == pytest.approx(
        report["stages"]["weight sync"]["seconds"], rel=1e-12)
    assert result.sync.seconds == pytest.approx(report["stages"]["weight sync"]["seconds"])


def test_weight_sync_terms_and_the_ideal_bound():
    # verl's per-tensor path for Qwen3-30B-A3B from 16 trainer to 16 rollout devices: the
    # software term is a cost per tensor per level of the 32-rank tree
    moe = get_spec("qwen3-30b-a3b")
    assert tensor_count(moe) == 48 * (4 + 4 + 128 * 3 + 1) + 3
    lay = Layout(dp=4, tp=2, ep=8, zero=1)
    fast = sync_cost(moe, H100, generation_tp=4, replicas=4, trainer=lay)
    slow = sync_cost(moe, H100, generation_tp=4, replicas=4, trainer=lay, tensor_seconds=1e-4,
                     fixed_seconds=2.0)
    assert slow.software == pytest.approx(tensor_count(moe) * 1e-4 * 5)
    assert slow.seconds == pytest.approx(fast.seconds + slow.software + 2.0)
    sharded = sync_cost(moe, H100, generation_tp=4, replicas=4, trainer=lay, transport="sharded")
    # each region of the model leaves the trainer once: the experts from the one device of 8
    # that trains them (ep 8), the dense part's tp-2 shards in 4 stripes for the 4 engines, sent
    # by their 4 data-parallel copies in turn (NeMo-RL's nccl_reshard), an eighth of the model a
    # device; the engines all-gather their stripes, each rollout device receiving its quarter
    # (tp 4), which decides
    experts = 2 * moe.n_layer * moe.n_experts * moe.mlp_params()
    dense = 2 * moe.params() - experts
    assert sharded.network_bytes == pytest.approx(dense / 8 + experts / 8)
    wire = comm.Fabric.of(H100).link(8 + 16)
    assert sharded.messages == math.ceil((dense + experts) / 4 / BUCKET_BYTES)
    assert sharded.transfer == pytest.approx(
        math.ceil((dense + experts) / 4 / BUCKET_BYTES) * wire.alpha
        + (dense + experts) / 4 / wire.beta)
    # a data-parallel trainer of 8 copies (Qwen3-4B, 8 GB): to one tp-8 engine every region
    # leaves from its first holder, so one device sends the whole copy (NeMo-RL's exact plan);
    # to 8 engines each region goes in 8 stripes, one from each copy: 1 GB a device
    dense4b = get_spec("qwen3-4b")
    copy = 2 * dense4b.params()
    one = sync_cost(dense4b, H100, generation_tp=8, replicas=1, trainer=Layout(dp=8, zero=1),
                    transport="sharded")
    assert one.network_bytes == pytest.approx(copy)
    assert one.ideal == pytest.approx(copy / 8 / comm.Fabric.of(H100).link(16).beta)
    assert one.transfer > copy / comm.Fabric.of(H100).link(16).beta > one.ideal
    eight = sync_cost(dense4b, H100, generation_tp=1, replicas=8, trainer=Layout(dp=8, zero=1),
                      transport="sharded")
    assert eight.network_bytes == pytest.approx(copy / 8)
    two = sync_cost(dense4b, H100, generation_tp=4, replicas=2, trainer=Layout(dp=8, zero=1),
                    transport="sharded")
    assert two.network_bytes == pytest.approx(copy / 2)  # 2 stripes, 2 of the 8 copies send
    for cost in (fast, slow, sharded):
        assert 0 < cost.ideal <= cost.seconds
    # the lower bound is the busiest device's bytes over its own link, the same whatever the
    # transport: a 70B model to 8 tp-8 engines, each device's 17.6 GB shard at one card's 50 GB/s
    # (a broadcast's wire, a node's 8 cards together, is no device's own link)
    spec70 = get_spec("llama-3-70b")
    ideals = {t: sync_cost(spec70, H100, generation_tp=8, replicas=8,
                           trainer=Layout(dp=4, tp=8, pp=2, zero=1), transport=t).ideal
              for t in ("broadcast", "sharded")}
    bound = 2 * spec70.params() / 8 / comm.Fabric.of(H100).link(128).beta
    assert ideals["broadcast"] == pytest.approx(bound) and ideals["sharded"] == pytest.approx(bound)
    # each of 8 tp-1 engines needs the whole 16 GB of Llama-3.1-8B, but their node takes it in
    # once through its 8 cards (400 GB/s) and NVLink copies it on: 0.04 s, which the modelled
    # broadcast (0.06 s) does not beat (one card's 0.32 s was no lower bound)
    spec8 = get_spec("llama-3.1-8b")
    eight = sync_cost(spec8, H100, generation_tp=1, replicas=8, trainer=Layout(dp=8))
    assert eight.ideal == pytest.approx(2 * spec8.params() / (8 * 50e9))
    assert eight.ideal <= eight.transfer + eight.copies <= eight.seconds
    with pytest.raises(ValueError, match="transport"):
        sync_cost(moe, H100, transport="carrier pigeon")


def test_the_engine_all_reduce_pays_one_latency_inside_a_node():
    link = comm.Link(alpha=3.4e-6, beta=450e9)
    m = 64 * 8192 * 2
    one_shot = link.alpha + 7 * m / link.beta
    two_shot = 2 * link.alpha + 2 * 7 / 8 * m / link.beta
    assert comm.engine_all_reduce_seconds(m, 8, link) == pytest.approx(min(one_shot, two_shot))
    assert comm.engine_all_reduce_seconds(m, 8, link) < comm.all_reduce_seconds(m, 8, link)
    big = comm.ENGINE_ALL_REDUCE_MAX_BYTES * 2  # past vLLM's custom all-reduce: NCCL's
    assert comm.engine_all_reduce_seconds(big, 8, link) == comm.all_reduce_seconds(big, 8, link)
    assert comm.engine_all_reduce_seconds(m, 1, link) == 0.0


def test_group_lengths_share_their_prompt_and_the_mean_after_the_cap():
    n, g = 4096, 16
    free = lognormal_lengths(n, 2000, 0.8, 8192, seed=3, group_size=g)
    shared = lognormal_lengths(n, 2000, 0.8, 8192, seed=3, group_size=g, group_share=0.8)

    def within_group_spread(lengths):
        logs = [math.log(t) for t in lengths]
        groups = [logs[i:i + g] for i in range(0, n, g)]
        return sum(max(x) - min(x) for x in groups) / len(groups)

    assert within_group_spread(shared) < 0.6 * within_group_spread(free)
    capped = lognormal_lengths(n, 3000, 0.6, 4000, seed=0, mean_after_cap=True)
    assert sum(capped) / n == pytest.approx(3000, rel=2e-3) and max(capped) == 4000
    with pytest.raises(ValueError, match="group_size"):
        lognormal_lengths(10, 100, 0.5, 200, group_size=3)
    with pytest.raises(ValueError, match="group_share"):
        lognormal_lengths(10, 100, 0.5, 200, group_share=1.5)
    # past sigma 3 the draws lose their mean: at 50 every one of 8,192 lengths is 1 token
    with pytest.raises(ValueError, match="sigma=50 must be a finite number from 0 to 3"):
        lognormal_lengths(8192, 4000, 50, 16384)
    assert sum(lognormal_lengths(8192, 4000, 3, 10**9)) > 0


LINK = comm.Link(5e-6, 400e9)
LLAMA8, QWEN30 = get_spec("llama-3.1-8b"), get_spec("qwen3-30b-a3b")


@pytest.mark.parametrize("call, message", [
    (lambda: comm.tensor_parallel_comm(LLAMA8, 3, 4096, LINK), "tp=3 does not divide"),
    (lambda: comm.tensor_parallel_comm(LLAMA8, 0, 4096, LINK), "tp=0 must be a positive integer"),
    (lambda: comm.tensor_parallel_comm(LLAMA8, 2, 4096, LINK, layers=100), "layers=100"),
    (lambda: comm.tensor_parallel_comm(LLAMA8, 2, math.nan, LINK), "tokens=nan"),
    (lambda: comm.tensor_parallel_layer(LLAMA8, H100, 3, 4096, LINK), "tp=3 does not divide"),
    (lambda: comm.tensor_parallel_layer(LLAMA8, H100, 2, 4096, LINK, mfu=-1), "mfu=-1"),
    (lambda: comm.decode_tp_comm(LLAMA8, 3, 8, LINK), "tp=3 does not divide"),
    (lambda: comm.expert_parallel_comm(QWEN30, 3, 64, LINK), "ep=3"),
    (lambda: comm.expert_parallel_comm(QWEN30, 0, 64, LINK), "ep=0 must be a positive integer"),
    (lambda: comm.expert_parallel_comm(LLAMA8, 2, 64, LINK), "needs an MoE model"),
    # a truthy string is not a flag: "no" priced the recomputed all-to-alls
    (lambda: comm.expert_parallel_comm(QWEN30, 8, 64, LINK, recompute="no"),
     "recompute='no' must be True or False"),
    (lambda: comm.expert_parallel_comm(QWEN30, 8, 64, LINK, backward="no"),
     "backward='no' must be True or False"),
    (lambda: comm.expert_parallel_comm(QWEN30, 8, 64, LINK, act_bytes=0), "act_bytes=0"),
    (lambda: comm.expert_parallel_comm(QWEN30, 8, 64, LINK, act_bytes=2.5), "act_bytes=2.5"),
    (lambda: comm.expert_parallel_comm(QWEN30, 8, 64, None), "link=None must be a Link"),
    (lambda: comm.tensor_parallel_comm(LLAMA8, 8, 64, LINK, recompute="yes"),
     "recompute='yes' must be True or False"),
    (lambda: comm.decode_tp_comm(LLAMA8, 8, 64, LINK, in_node=1), "in_node=1 must be True"),
    (lambda: comm.pipeline_comm(LLAMA8, 64, "nvlink"), "link='nvlink' must be a Link"),
    (lambda: comm.context_parallel_comm(LLAMA8, 2, 64, LINK, kv_bytes=-2), "kv_bytes=-2"),
    (lambda: comm.ulysses_comm(LLAMA8, 2, 64, LINK, backward=None), "backward=None"),
    (lambda: comm.context_parallel_comm(LLAMA8, 0, 4096, LINK), "cp=0"),
    (lambda: comm.ulysses_comm(LLAMA8, 0, 4096, LINK), "sp=0"),
    (lambda: comm.data_parallel_comm(1e9, 0, LINK), "dp=0"),
    (lambda: comm.data_parallel_step(LLAMA8, H100, 0, 4096, LINK), "dp=0"),
    (lambda: comm.data_parallel_step(LLAMA8, H100, 8, 4096, LINK, mfu=0), "mfu=0"),
    (lambda: comm.ring_all_reduce_seconds(math.nan, 8, LINK), "nan bytes"),
    (lambda: decode_step_seconds(LLAMA8, H100, 64, 4, 100), "tp=64 does not divide"),
    (lambda: DecodeCost(LLAMA8, H100, 3, Rates()), "tp=3 does not divide"),
    (lambda: sync_cost(LLAMA8, H100, generation_tp=3), "tp=3 does not divide"),
    (lambda: sync_cost(LLAMA8, H100, fixed_seconds=math.nan), "fixed_seconds=nan"),
    (lambda: generation_estimate(LLAMA8, Workload(4, 2, 16, 32), H100, 8, 3, Rates()),
     "tp=3 does not divide"),
    (lambda: generation_estimate(LLAMA8, Workload(4, 2, 16, 32), H100, 6, 4, Rates()),
     "devices=6 must be a positive multiple of tp=4"),
    (lambda: generation_memory(LLAMA8, 0), "tp=0 must be a positive integer"),
    (lambda: kv_slots(LLAMA8, 1, H100, -5), "tokens_per_sequence=-5"),
    (lambda: kv_slots(LLAMA8, 1, H100, math.nan), "tokens_per_sequence=nan"),
    (lambda: kv_slots(LLAMA8, 1, H100, 4096, memory_fraction=1.5), "memory_fraction=1.5"),
    (lambda: kv_slots(LLAMA8, 1, H100, 4096, max_batch=0), "max_batch=0"),
    (lambda: usable(H100, -1), "memory_fraction=-1"),
])
def test_the_cost_functions_refuse_degrees_and_sizes_that_do_not_fit(call, message):
    """Degrees that do not fit the model (a tp not dividing the heads, 0, an ep for a dense
    model) and sizes that are negative or NaN are refused by name; they returned numbers (or
    divided by zero) when called from a notebook."""
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("=", "=")):
        call()


@pytest.mark.parametrize("call, message", [
    (lambda: training_memory(LLAMA8, Layout(), -1), "seq_len=-1 must be a finite number >= 0"),
    (lambda: training_memory(LLAMA8, Layout(), math.nan), "seq_len=nan"),
    (lambda: activation_bytes(LLAMA8, -1, 100, False), "batch=-1"),
    (lambda: teacher_forced_flops(LLAMA8, -1, 4), "seq_len=-1"),
    (lambda: offload_seconds(-1e9, Rates(), H100), "nbytes=-1000000000.0"),
    (lambda: predict_transition(-1, 4, 2), "model_bytes=-1"),
])
def test_sizes_that_no_run_has_are_refused(call, message):
    """Negative or NaN lengths, batches and bytes gave negative or NaN bytes, FLOPs and seconds."""
    with pytest.raises(ValueError, match=message):
        call()


def test_lower_level_costs_refuse_bad_input_by_name():
    """The building blocks a learner calls directly refuse what the constructors refuse: NaN,
    infinity, text or a wrong kind where a size, a spec, a device or a link belongs (they
    returned nan, inf or an AttributeError from deep inside)."""
    from rlm_course.cost.anatomy import decode_intensity, decode_step_seconds, prefill_intensity
    from rlm_course.cost.architectures import kv_cache_bytes
    from rlm_course.cost.phases import Rates, TrainerCost
    from rlm_course.rl.algorithms import preset

    spec = get_spec("llama-3.1-8b")
    assert kv_cache_bytes(32, 8, 128, 1) == 131072  # Llama-3-8B's 128 KiB a token
    for bad in (float("nan"), float("inf"), "5", -1):
        with pytest.raises(ValueError, match="kv_cache_bytes: tokens="):
            kv_cache_bytes(32, 8, 128, bad)
        with pytest.raises(ValueError, match="forward_flops_per_token: context="):
            spec.forward_flops_per_token(bad)
        with pytest.raises(ValueError, match="decode_step_seconds: context="):
            decode_step_seconds(spec, H100, 1, 1, context=bad)
    with pytest.raises(ValueError, match="kv_cache_bytes: n_layer=32.5 must be a whole number"):
        kv_cache_bytes(32.5, 8, 128, 1)
    # a step writes position `context`: Llama-3-8B's 8,192-token window ends at position 8,191
    llama3 = get_spec("llama-3-8b")
    assert decode_step_seconds(llama3, H100, 1, 1, context=8191) > 0
    with pytest.raises(ValueError, match="context=8,192 writes a token past llama-3-8b's "
                                         "8,192-token window"):
        decode_step_seconds(llama3, H100, 1, 1, context=8192)
    with pytest.raises(ValueError, match=r"decode_step_seconds: device='H100-SXM-80GB' must be "
                                         r"a Device"):
        decode_step_seconds(spec, "H100-SXM-80GB")
    with pytest.raises(ValueError, match=r"decode_intensity: spec='llama-3.1-8b' must be a "
                                         r"TransformerSpec"):
        decode_intensity("llama-3.1-8b", 1, 10)
    for bad in (0, 2.5, float("nan")):
        with pytest.raises(ValueError, match="batch="):
            decode_intensity(spec, bad, 10)
        with pytest.raises(ValueError, match="prefill_intensity: batch="):
            prefill_intensity(spec, bad, 10)
    for bad in ("nvlink", None):
        with pytest.raises(ValueError, match=r"link=.* must be a Link"):
            comm.ring_all_reduce_seconds(1e9, 8, bad)
        with pytest.raises(ValueError, match=r"link=.* must be a Link"):
            comm.p2p_seconds(1e9, bad)
    import numpy as np

    link = comm.Fabric.of(H100).ring_link(8)
    assert comm.ring_all_reduce_seconds(1e9, np.int64(8), link) == \
        comm.ring_all_reduce_seconds(1e9, 8, link)  # numpy's integers, as Fabric takes them
    with pytest.raises(ValueError, match="TrainerCost: prompt_len=-1 must be a whole number"):
        TrainerCost(spec, preset("grpo"), Layout(), H100, Rates(), None, -1)
