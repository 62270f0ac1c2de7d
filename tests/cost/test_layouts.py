"""Memory per device and its refusals (rlm_course.cost.layouts): ZeRO, experts, KV slots, the
generation TP."""

from dataclasses import replace
import math

import pytest

from rlm_course.cost.anatomy import zero_model_state_bytes
from rlm_course.cost.architectures import get_spec
from rlm_course.cost.hardware import get_device
from rlm_course.cost import comm
from rlm_course.cost.layouts import (DoesNotFit, Layout, check_training, choose_generation_tp,
                                        generation_memory, kv_slots, replica_decode_step_seconds,
                                        training_memory)

H100 = get_device("H100-SXM-80GB")
SPEC = get_spec("qwen2.5-7b")


def test_training_memory_uses_zero_and_refuses_what_does_not_fit():
    spec = get_spec("llama-3-70b")
    lay = Layout(dp=64, zero=3, recompute=True)
    m = training_memory(spec, lay, 4096)
    states = m["weights"] + m["gradients"] + m["optimizer"]
    assert states == pytest.approx(zero_model_state_bytes(spec.params(), 64, 3), rel=1e-9)
    # 70.55B parameters: 2 + 2 + 12 bytes each, replicated on every data-parallel rank
    with pytest.raises(DoesNotFit, match=r"trainer layout dp8 of llama-3-70b needs 1,220.9 GB per "
                                          r"H100-SXM-80GB \(weights 141.1, gradients 141.1, "
                                          r"optimizer 846.6, .* 76.4 GB usable .* ZeRO-3/FSDP"):
        check_training(spec, Layout(dp=8), H100, 4096, role="trainer")
    offloaded = training_memory(spec, Layout(dp=8, tp=8, offload=True), 4096)
    assert offloaded["optimizer"] == 0
    # one data-parallel rank: ZeRO-3 has nothing to shard, so it is not offered
    with pytest.raises(DoesNotFit, match="raise tp or pp") as one_rank:
        check_training(spec, Layout(dp=1), H100, 4096, role="trainer")
    assert "ZeRO-3" not in str(one_rank.value)


def test_expert_parallelism_shards_the_experts():
    spec = get_spec("qwen3-30b-a3b")
    a = training_memory(spec, Layout(dp=8, ep=8), 2048)
    b = training_memory(spec, Layout(dp=8), 2048)
    assert a["weights"] < b["weights"] / 4
    with pytest.raises(ValueError, match="ep=3 must divide tp x cp x dp = 8"):
        Layout(dp=8, ep=3)


def test_zero3_is_named_alone_only_where_it_frees_enough_beyond_the_stage_in_use():
    # Llama-3.1-8B on 2 H100s under ZeRO-1: 16.1 GB of weights, 16.1 of gradients, 48.2 of
    # optimizer; ZeRO-3 frees half the weights and gradients only (the optimizer is sharded
    # already): 16.1 GB, not half of the 80.3 GB of states; 76.4 GB usable (90% of the 84.9 GB
    # CUDA reports)
    spec, layout = get_spec("llama-3.1-8b"), Layout(dp=2, zero=1)
    with pytest.raises(DoesNotFit) as long_seq:  # 95.6 GB: ZeRO-3 leaves 79.5, not enough
        check_training(spec, layout, H100, 3072)
    assert sum(check_training(spec, replace(layout, zero=3), H100, 2048).values()) < 76.4e9
    with pytest.raises(DoesNotFit) as short_seq:  # 90.5 GB: ZeRO-3 leaves 74.4, enough
        check_training(spec, layout, H100, 2048)
    with pytest.raises(DoesNotFit, match=r"needs 79\.5 GB"):
        check_training(spec, replace(layout, zero=3), H100, 3072)
    assert "ZeRO-3" not in str(long_seq.value) and "needs 95.6 GB" in str(long_seq.value)
    assert str(short_seq.value).endswith("usable (90% of 84.9 GB): shard with ZeRO-3/FSDP (zero=3), "
                                         "or split each model copy over more GPUs (raise tp or "
                                         "pp), or offload the optimizer.")


def test_a_replica_must_hold_one_sequence_of_the_budget():
    # Llama-3.1-70B at tp2 on an H100: 70.6 GB of weights a device leaves 5.8 GB of the 76.4
    # usable; a token's KV cache is 80 layers x 4 of the 8 KV heads x 128 x 2 (K, V) x 2 bytes =
    # 163,840 bytes a device, so about 35,600 tokens fit: 8 sequences of the mean length (4,436)
    # but not one of a 41,472-token budget (6.79 GB), which the engine must admit
    spec = get_spec("llama-3.1-70b")
    assert generation_memory(spec, 2)["kv_per_token"] == 80 * 4 * 128 * 2 * 2
    assert kv_slots(spec, 2, H100, 4436) == 8
    assert kv_slots(spec, 2, H100, 4436, longest=16896) == 8
    with pytest.raises(DoesNotFit, match=r"70\.6 GB of weights \+ 6\.79 GB of KV cache for one "
                                         r"sequence of the 41,472-token budget per device"):
        kv_slots(spec, 2, H100, 4436, longest=41472)
    assert kv_slots(spec, 4, H100, 4436, longest=41472) == kv_slots(spec, 4, H100, 4436)
    for bad in (4000, math.nan, math.inf, "16896"):
        with pytest.raises(ValueError, match="longest="):
            kv_slots(spec, 4, H100, 4436, longest=bad)


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
    # 12 query heads, 6 KV heads: tp 4 divides the heads but would split the KV heads 1.5 a rank;
    # the choice skips it (it used to reach the step's check and raise) and keeps 1 and 2
    from rlm_course.cost.architectures import TransformerSpec

    odd = TransformerSpec(name="odd", n_layer=4, d_model=768, n_head=12, d_ff=3072,
                          vocab_size=1000, n_kv_head=6)
    assert [odd.allows("tp", t) for t in (1, 2, 4, 8, 12)] == [True, True, False, False, True]
    _, odd_times = choose_generation_tp(odd, H100, 8, 64, 512, link)
    assert set(odd_times) == {1, 2}
    # on a mesh node each degree all-reduces over its own links (an MI300X pair: 64 GB/s), so
    # give the Fabric: one link for all would price TP 2 at eight devices' 448 GB/s; on an
    # NVSwitch node the Fabric and the one link agree
    mi300x = get_device("MI300X-192GB")
    mesh = comm.Fabric.of(mi300x)
    _, own = choose_generation_tp(spec, mi300x, 8, 1024, 4096, mesh)
    _, one = choose_generation_tp(spec, mi300x, 8, 1024, 4096, mesh.link(8))
    assert own[2] > one[2] and own[8] == one[8]
    assert choose_generation_tp(spec, H100, 64, 1024, 4096, comm.Fabric.of(H100)) == \
        choose_generation_tp(spec, H100, 64, 1024, 4096, link)


def test_without_sequence_parallelism_tp_splits_only_its_matmuls_activations():
    """Korthikanti et al. 2022, Table 2's accounting for a Llama layer (FlashAttention keeps no
    attention scores; no dropout masks): Llama-3-70B keeps 8 s h bytes around TP's split matmuls
    (the two norms' inputs, attention's and the MLP's inputs) and 25.5 s h inside them (Q and the
    attention output, 2 x 2 x 64 x 128 = 4 h; K and V, 2 x 2 x 8 x 128 = 0.5 h; the gated MLP's
    gate, up and product, 3 x 2 x 28,672 = 21 h): s h (8 + 25.5 / t) with TP alone, 33.5 s h / t
    with sequence parallelism; 11.2 s h at t = 8 (the paper's GPT layer: 10 + 24 / t)."""
    spec = get_spec("llama-3-70b")
    s, h, layers = 8192, spec.d_model, spec.n_layer
    sp = training_memory(spec, Layout(dp=8, tp=8, zero=1), s)["activations"]
    no_sp = training_memory(spec, Layout(dp=8, tp=8, zero=1, sequence_parallel=False), s)
    assert sp == pytest.approx(layers * s * h * 33.5 / 8)
    assert no_sp["activations"] == pytest.approx(layers * s * h * (8 + 25.5 / 8))
    # chapter 09's TP 8 x DP 8 layout of Llama-3-70B fits 80 GB with SP and not without
    assert sum(training_memory(spec, Layout(dp=8, tp=8, zero=1), s).values()) / 1e9 < 80
    assert sum(no_sp.values()) / 1e9 == pytest.approx(109.1, abs=0.05)  # > 80 GB: no fit
    recomputed = training_memory(spec, Layout(dp=8, tp=8, recompute=True,
                                              sequence_parallel=False), s)
    assert recomputed["activations"] == pytest.approx(layers * 2 * s * h)  # inputs, whole


def test_a_refusal_prices_each_activation_fix_by_what_it_really_frees():
    """Recomputation keeps the layer inputs (whole on every TP rank without sequence
    parallelism), a micro-batch holds at least one sequence, and a TP layout without sequence
    parallelism can turn it on."""
    from rlm_course.cost.layouts import DoesNotFit, check_training
    llama70, llama8 = get_spec("llama-3-70b"), get_spec("llama-3.1-8b")
    no_sp = Layout(tp=8, sequence_parallel=False, offload=True)
    # 95.9 GB, 60.1 of them activations: recomputation frees 49.4 (10.7 GB of layer inputs stay
    # whole on each rank), sequence parallelism 37.6; against 76.4 GB both cover the excess...
    with pytest.raises(DoesNotFit) as caught:
        check_training(llama70, no_sp, H100, 8192)
    said = str(caught.value)
    assert "needs 95.9 GB" in said and "activations 60.1" in said
    assert "turn on sequence parallelism (sequence_parallel=True)" in said
    assert "recompute activations" in said.split("usable")[1]
    # ...against 44.2 GB (52%) neither does alone: recomputed, the layout still needs 46.5 GB
    with pytest.raises(DoesNotFit) as caught:
        check_training(llama70, no_sp, H100, 8192, 0.52)
    assert str(caught.value).endswith("44.2 GB usable (52% of 84.9 GB): split each sequence's "
                                      "activations and logits over more GPUs (raise cp).")
    with pytest.raises(DoesNotFit):
        check_training(llama70, replace(no_sp, recompute=True), H100, 8192, 0.52)
    # two sequences a micro-batch: one sequence's 8.4 GB of logits and activations stay, so
    # fewer tokens cannot cover an 18.4 GB excess
    with pytest.raises(DoesNotFit) as caught:
        check_training(llama8, Layout(micro_batch=2, recompute=True, offload=True), H100,
                       16384, 0.46)
    assert "fewer tokens" not in str(caught.value).split("usable")[1]


def test_a_refusal_names_only_the_fixes_that_can_free_the_excess():
    spec = get_spec("llama-3.1-8b")
    # a 131,072-token sequence at tp 8: 73.0 GB of activations and 8.4 of logits, 16 GB of model
    # states; PP splits only the states (under 1F1B the first stage holds pp micro-batches of its
    # layers), so it cannot free the 17.5-25.5 GB too much: context parallelism can (it fits
    # at cp 4, 36.4 GB), and recomputation
    for pp in (1, 2, 4, 8):
        with pytest.raises(DoesNotFit, match=r"GB\): split each sequence's activations and "
                                             r"logits over more GPUs \(raise cp, or tp\), or "
                                             r"recompute activations\.$") as refused:
            check_training(spec, Layout(tp=8, pp=pp), H100, 131072)
        assert "raise tp or pp" not in str(refused.value)
    fits = check_training(spec, Layout(tp=8, cp=4), H100, 131072)
    assert sum(fits.values()) == pytest.approx(36.4e9, rel=2e-3)
    # no single change is enough: all of them, to combine
    with pytest.raises(DoesNotFit, match="no one change frees enough; combine: shard with ZeRO-3"):
        check_training(get_spec("llama-3.1-70b"), Layout(dp=8), H100, 4096)


def test_a_pipeline_stage_holds_pp_micro_batches_of_its_layers():
    spec = get_spec("llama-3.1-8b")  # 32 layers: pp 3 stages of 11, 11 and 10
    whole = training_memory(spec, Layout(), 4096)["activations"]
    assert training_memory(spec, Layout(pp=4), 4096)["activations"] == pytest.approx(whole)
    assert training_memory(spec, Layout(pp=3), 4096)["activations"] == pytest.approx(
        whole * 3 * 11 / 32)  # 18.82 GB, where 32 layers' worth is 18.25


def test_the_memory_model_refuses_bad_input_with_a_value_error():
    import math
    import re

    from rlm_course.cost.layouts import generation_memory, model_states, usable

    spec = get_spec("llama-3.1-8b")
    bad = [
        (lambda: Layout(recompute="no"), "Layout.recompute='no' must be True or False"),
        (lambda: Layout(sequence_parallel=None), "Layout.sequence_parallel=None"),
        (lambda: Layout(zero=1.0), "Layout.zero=1.0"),
        (lambda: Layout(micro_batch_tokens=True), "Layout.micro_batch_tokens=True"),
        (lambda: training_memory("llama-3.1-8b", Layout(), 4096),
         "spec='llama-3.1-8b' must be a TransformerSpec"),
        (lambda: training_memory(spec, {"dp": 2}, 4096), "must be a Layout"),
        (lambda: training_memory(spec, Layout(), 10**6), "context window of 131,072"),
        (lambda: training_memory(spec, Layout(), 4096, trained="no"), "trained='no'"),
        (lambda: kv_slots(spec, 1, H100, 200_000), "context window"),
        (lambda: kv_slots(spec, 1, H100, 4096, kv_bytes=0), "kv_bytes=0"),
        (lambda: kv_slots(spec, 1, H100, 4096, weight_bytes=math.nan), "weight_bytes=nan"),
        (lambda: kv_slots(spec, 1, "H100-SXM-80GB", 4096), "must be a Device"),
        (lambda: choose_generation_tp(spec, H100, 8, 64, 1024, None, candidates=(0, 1)),
         "candidates=(0, 1) must be a list of positive integers"),
        (lambda: choose_generation_tp(spec, H100, 8, 64, 1024, None, candidates=8),
         "candidates=8 must be a list"),
        (lambda: choose_generation_tp(spec, H100, 8, 64, 1024, None, bandwidth_efficiency=5),
         "bandwidth_efficiency=5 must be a share of the memory bandwidth in (0, 1]"),
        (lambda: replica_decode_step_seconds(spec, H100, 1, 1, 10, None, bandwidth_efficiency=0),
         "bandwidth_efficiency=0"),
        (lambda: replica_decode_step_seconds("llama-3.1-8b", H100, 1, 1, 10, None),
         "replica_decode_step_seconds: spec='llama-3.1-8b' must be a TransformerSpec"),
        (lambda: generation_memory(spec, 1, weight_bytes=-1), "weight_bytes=-1"),
        (lambda: usable("H100-SXM-80GB", 0.9), "must be a Device"),
        (lambda: model_states(-5, 8, 1, False), "params=-5"),
        (lambda: model_states(1e9, 8, 1, False, grad_bytes=3), "grad_bytes=3"),
        (lambda: model_states(math.inf, 8, 1, False), "params=inf"),
        (lambda: zero_model_state_bytes(math.nan, 8, 1), "params=nan"),
        (lambda: zero_model_state_bytes(1e9, True, 1), "dp=True"),
        (lambda: check_training(spec, Layout(), H100, 4096, extra={"ref": math.nan}),
         "extra['ref']=nan"),
        (lambda: check_training(spec, Layout(), H100, 4096, extra=1e9), "extra=1000000000.0"),
        (lambda: check_training(spec, Layout(), "H100-SXM-80GB", 4096), "must be a Device"),
        (lambda: choose_generation_tp(spec, H100, 0, 64, 1024, None), "gpus=0"),
        (lambda: choose_generation_tp(spec, H100, 8, True, 1024, None), "sequences=True"),
    ]
    for call, message in bad:
        with pytest.raises(ValueError, match=re.escape(message)):
            call()
    # no parameters, no bytes (an MoE's expert part on a dense model)
    assert model_states(0, 8, 1, False) == {"weights": 0.0, "gradients": 0.0, "optimizer": 0.0}


def test_a_speculative_drafts_layer_keeps_a_kv_cache_of_its_own():
    """DeepSeek-V3's multi-token-prediction module is a transformer block: its cache is one more
    layer's a token (61 + 1 of MLA's 576-value latent, whole on every rank)."""
    spec = get_spec("deepseek-v3")
    base = generation_memory(spec, 8)["kv_per_token"]
    assert base == spec.kv_cache_bytes_per_token(2)  # the latent is not split over TP ranks
    assert generation_memory(spec, 8, draft_layers=1)["kv_per_token"] == pytest.approx(
        base * 62 / 61)
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match=f"draft_layers={bad!r} must be an integer >= 0"):
            generation_memory(spec, 8, draft_layers=bad)
