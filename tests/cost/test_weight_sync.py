"""Stage 4, the weight sync, in the anatomy and the work-depth DAG (rlm_course.cost.weight_sync)."""

import itertools
import math
import re

import pytest

from rlm_course.cost import workdepth as wd
from rlm_course.cost.anatomy import Workload, iteration_report
from rlm_course.cost.comm import Fabric
from rlm_course.cost.layouts import Layout
from rlm_course.cost.weight_sync import broadcast_link, sync_cost, tensor_count
from rlm_course.cost.architectures import SPECS, get_spec
from rlm_course.cost.hardware import get_device
from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.rl.algorithms import preset

TOK = CharTokenizer()


def test_stage_four_in_the_anatomy_and_the_dag():
    spec, h100 = SPECS["llama-3-70b"], get_device("H100-SXM-80GB")
    dis = sync_cost(spec, h100, generation_tp=8, replicas=1)
    assert dis.bytes == 2 * spec.params()
    assert dis.messages == math.ceil(dis.bytes / 2**29)
    # one trainer rank, 8 receivers on 9 devices (two nodes): the network link, pipelined
    assert dis.transfer == pytest.approx(dis.messages * 4 * h100.inter_node_latency
                                         + dis.bytes / h100.inter_node_bandwidth)
    assert dis.copies == pytest.approx(4 * dis.bytes / h100.memory_bandwidth)
    # 8 trainer ranks and an engine of 8: two whole nodes, the broadcast on all 8 cards of each
    full = sync_cost(spec, h100, generation_tp=8, replicas=1, trainer=Layout(tp=8))
    assert full.transfer == pytest.approx(full.messages * 4 * h100.inter_node_latency
                                          + full.bytes / (8 * h100.inter_node_bandwidth))
    fabric = Fabric.of(h100)
    assert broadcast_link(fabric, 20).beta == 4 * h100.inter_node_bandwidth  # 8 + 8 + 4
    assert broadcast_link(fabric, 8) is fabric.intra
    nvl = Fabric.of(get_device("GB200-NVL72-186GB"))
    assert broadcast_link(nvl, 144).beta == nvl.intra.beta  # 72 cards, capped by NVLink
    assert dis.seconds == pytest.approx(dis.transfer + dis.copies) and dis.ideal <= dis.seconds
    col = sync_cost(spec, h100, "colocated", generation_tp=8, replicas=1)
    assert col.network_bytes == 0 and col.seconds < dis.seconds / 10
    with pytest.raises(ValueError, match="placement"):
        sync_cost(spec, h100, "nearby")
    w = Workload(8, 4, 128, 256)
    plain = iteration_report(spec, preset("grpo"), w, h100, devices=16, generation_tp=8)
    synced = iteration_report(spec, preset("grpo"), w, h100, devices=16, generation_tp=8,
                              weight_sync="disaggregated")
    assert "weight sync" not in plain["stages"] and "weight sync" in synced["stages"]
    assert synced["seconds"] == pytest.approx(plain["seconds"]
                                              + synced["stages"]["weight sync"]["seconds"])
    node = wd.weight_sync(1000, receivers=3, messages=5)
    assert (node.work, node.depth) == (3000, 5 * 2)
    assert synced["work"] == plain["work"] + 2 * spec.params()  # two replicas receive
    assert (wd.weight_sync(1000, 0).work, wd.weight_sync(1000, 0).depth) == (1000, 1)
    # colocated: a copy in place, no message on a link (it raised "messages=0" before)
    in_place = iteration_report(spec, preset("grpo"), w, h100, devices=16, generation_tp=8,
                                weight_sync="colocated")
    expected = sync_cost(spec, h100, "colocated", generation_tp=8, replicas=2).seconds
    assert in_place["stages"]["weight sync"]["seconds"] == pytest.approx(expected)
    assert in_place["seconds"] == pytest.approx(plain["seconds"] + expected)
    assert in_place["stages"]["weight sync"]["network_bytes"] == 0
    assert in_place["work"] == plain["work"] + spec.params()  # one copy of every parameter
    with pytest.raises(ValueError, match="messages=0"):
        wd.weight_sync(1000, receivers=2, messages=0)


def test_a_colocated_reshard_receives_what_the_training_shard_lacks():
    from rlm_course.cost.weight_sync import predict_transition, reshard_received_bytes

    spec, h100 = SPECS["llama-3-70b"], get_device("H100-SXM-80GB")
    m = 2 * spec.params()
    # TP 1 x PP 2 -> TP 2: each device holds half the layers whole and needs half the columns
    # of all of them; it keeps a quarter of the model and receives a quarter (it was free before,
    # as if PP 2 were TP 2)
    assert reshard_received_bytes(spec, 1, 2, 1, 2) == (pytest.approx(m / 4), 2)
    # TP 2 x PP 8 -> TP 16: 1/16 - 1/128 of the model
    assert reshard_received_bytes(spec, 2, 8, 1, 16)[0] == pytest.approx(7 * m / 128)
    # without PP, HybridFlow's row of Table 2: (tp - g) / (g tp) M, from tp / g devices
    for tp, g in ((8, 2), (4, 1), (8, 8)):
        want = predict_transition(m, tp, g)["hybridflow"]
        assert reshard_received_bytes(spec, tp, 1, 1, g) == (pytest.approx(want["received_bytes"]),
                                                             want["group"])
    # PP 2 x TP 4 -> TP 2: the group gathers 3/8 of the model into each device, as HybridFlow's
    # count with PP (predict_transition's pp) says
    assert reshard_received_bytes(spec, 4, 2, 1, 2)[0] == pytest.approx(
        predict_transition(m, 4, 2, 2, 1)["hybridflow"]["received_bytes"])
    # routed experts over EP 4 with PP 2 -> TP 4: of each device's generation shard (a quarter of
    # every expert's columns) it holds a quarter of the experts of half the layers: 1/32 kept
    moe = SPECS["qwen3-30b-a3b"]
    e = 2 * moe.n_layer * moe.n_experts * moe.mlp_params()
    d = 2 * moe.params() - e
    got, devices = reshard_received_bytes(moe, 1, 2, 4, 4)
    assert got == pytest.approx(d / 4 - d / 8 + e / 4 - e / 32) and devices == 8
    # those bytes are the sync's lower bound; the trainers of open systems move more: every
    # device assembles every whole tensor (Megatron-Bridge's export, verl's per-tensor
    # generator). PP 2 over 16 devices: the stages' ranks lie 8 apart, on two nodes, and each
    # device takes the other stage's half of the model through its one card
    c = sync_cost(spec, h100, "colocated", generation_tp=2, replicas=8, trainer=Layout(pp=2, dp=8))
    inter = Fabric.of(h100).inter
    assert c.gather == pytest.approx((m / 2) / inter.beta)
    assert c.ideal == pytest.approx((m / 4) / h100.intra_node_bandwidth)  # a pair in a node
    assert c.ideal < c.gather
    # TP 8 -> TP 8: nothing need move, yet the export all-gathers the model over the TP group
    same = sync_cost(spec, h100, "colocated", generation_tp=8, replicas=2,
                     trainer=Layout(tp=8, dp=2))
    assert same.ideal == 0.0
    assert same.gather == pytest.approx(7 * (h100.intra_node_latency
                                             + m / 8 / h100.intra_node_bandwidth))
    with pytest.raises(ValueError, match="pp=0"):
        reshard_received_bytes(spec, 1, 0, 1, 2)


def test_reshards_whose_blocks_straddle_and_fsdp_shards():
    from rlm_course.cost.weight_sync import reshard_received_bytes

    spec, h100 = SPECS["llama-3-70b"], get_device("H100-SXM-80GB")
    m = 2 * spec.params()
    # TP 4 -> TP 6 and back (a model of 12 heads): the blocks straddle, and with ranks in order
    # the busiest device keeps none of its generation shard (it was priced as keeping it all)
    small = SPECS["r1-distill-qwen-1.5b"]
    ms = 2 * small.params()
    assert reshard_received_bytes(small, 4, 1, 1, 6)[0] == pytest.approx(ms / 6)
    assert reshard_received_bytes(small, 6, 1, 1, 4)[0] == pytest.approx(ms / 4)
    # FSDP over 2 with TP 8 -> TP 4: a device holds M/16 of the M/4 it needs (it was priced as
    # the all-gather of the generation shard over the 2 FSDP ranks alone, M/8)
    c = sync_cost(spec, h100, "colocated", generation_tp=4, replicas=4,
                  trainer=Layout(tp=8, dp=2, zero=3))
    # two nodes: the least it receives, through NVLink and its card at once
    ports = h100.intra_node_bandwidth + Fabric.of(h100).inter.beta
    assert c.ideal * ports == pytest.approx(3 * m / 16)
    assert reshard_received_bytes(spec, 1, 4, 1, 2, fsdp=2)[0] == pytest.approx(m / 2 - m / 16)
    # FSDP alone: the all-gather of the generation shard, as before
    fsdp = sync_cost(spec, h100, "colocated", generation_tp=8, replicas=1,
                     trainer=Layout(dp=8, zero=3))
    assert fsdp.ideal * h100.intra_node_bandwidth == pytest.approx(m / 8 * 7 / 8)


def test_a_broadcast_gathers_the_experts_over_ep_first():
    moe, h20 = SPECS["qwen3-30b-a3b"], get_device("H20-96GB")
    experts = 2 * moe.n_layer * moe.n_experts * moe.mlp_params()
    replicated = sync_cost(moe, h20, generation_tp=4, replicas=2, trainer=Layout(dp=8))
    ep = sync_cost(moe, h20, generation_tp=4, replicas=2, trainer=Layout(dp=8, ep=8))
    assert replicated.gather == 0.0  # every rank holds the whole model
    # rank 0 lacks 7/8 of the experts: a ring all-gather over the node's 8 devices
    link = Fabric.of(h20).intra
    assert ep.gather == pytest.approx(7 * (link.alpha + experts / 8 / link.beta))


def test_a_packed_broadcast_pays_each_tensor_once():
    """NeMo-RL's non-colocated refit up to v0.7 (packed_broadcast_producer from rank 0) moves the
    bytes as a broadcast does but packs each tensor once and loads it once on every receiver at
    the same time; one collective a tensor (verl's) pays its launch at every level of the tree."""
    v3, h100 = SPECS["deepseek-v3"], get_device("H100-SXM-80GB")
    kwargs = dict(generation_tp=32, replicas=1, trainer=Layout(pp=16, ep=16, dp=16),
                  tensor_seconds=1e-4)
    one_by_one = sync_cost(v3, h100, transport="broadcast", **kwargs)
    packed = sync_cost(v3, h100, transport="packed", **kwargs)
    assert packed.tensors == one_by_one.tensors == tensor_count(v3)
    for term in ("gather", "transfer", "copies", "fixed"):
        assert getattr(packed, term) == getattr(one_by_one, term), term
    # 256 trainer and 32 rollout devices: a 9-level tree (ceil(log2 288)) against one pass
    assert one_by_one.software == pytest.approx(9 * tensor_count(v3) * 1e-4)
    assert packed.software == pytest.approx(tensor_count(v3) * 1e-4)
    assert packed.transport == "packed" and packed.seconds < one_by_one.seconds

def test_weight_sync_refuses_bad_input_with_a_value_error():
    from rlm_course.cost.phases import weight_sync
    from rlm_course.cost.weight_sync import (broadcast_seconds, predict_transition,
                                             reshard_received_bytes, tensor_count)

    spec, h100 = SPECS["llama-3-70b"], get_device("H100-SXM-80GB")
    link = Fabric.of(h100).inter
    bad = [
        (lambda: sync_cost(spec, h100, memory_bandwidth=-1e12), "memory_bandwidth"),
        (lambda: sync_cost(spec, h100, memory_bandwidth=float("nan")), "memory_bandwidth"),
        (lambda: sync_cost(spec, h100, pipelined=None), "pipelined"),
        (lambda: sync_cost(spec, h100, trainer="tp8"), "trainer='tp8' must be a Layout"),
        (lambda: sync_cost(spec, h100, fabric="ib"), "fabric='ib' must be a Fabric"),
        (lambda: sync_cost(spec, h100, link="ib"), "link='ib' must be a Link"),
        (lambda: sync_cost("llama-3-70b", h100), "spec='llama-3-70b' must be a TransformerSpec"),
        (lambda: sync_cost(spec, h100, tensor_seconds=None), "tensor_seconds=None"),
        (lambda: sync_cost(spec, h100, fixed_seconds="1"), "fixed_seconds='1'"),
        (lambda: sync_cost(spec, h100, tensor_seconds=float("nan")), "tensor_seconds=nan"),
        (lambda: sync_cost(spec, h100, trainer=Layout(tp=3)), "tp=3"),
        (lambda: weight_sync(spec, h100, "colocated", 8, 1, Layout(tp=8), None), "rates=None"),
        (lambda: tensor_count("llama-3-70b"), "must be a TransformerSpec"),
        (lambda: broadcast_seconds(float("nan"), 1, link), "total_bytes=nan"),
        (lambda: broadcast_seconds(1e9, 2.5, link), "messages=2.5"),
        (lambda: broadcast_seconds(1e9, 1, link, receivers=True), "receivers=True"),
        (lambda: broadcast_seconds(1e9, 1, None), "link=None"),
        (lambda: broadcast_link(Fabric.of(h100), 0), "ranks=0"),
        (lambda: predict_transition(1e9, 4.0, 2.0), "tp=4.0"),
        (lambda: predict_transition(1e9, 4, -2, 1, -1), "tp_gen=-2"),
        (lambda: predict_transition(1e9, 4, 3), "3 x 1 = 3 must be a divisor"),
        (lambda: reshard_received_bytes(spec, 1, 200, 1, 8), "pp=200"),
        (lambda: reshard_received_bytes(spec, 1, 1, 8, 8), "ep=8"),
        (lambda: reshard_received_bytes(spec, 3, 1, 1, 8), "tp=3"),
        (lambda: reshard_received_bytes(spec, 8, 1, 1, 8, weight_bytes=0), "weight_bytes=0"),
    ]
    for call, message in bad:
        with pytest.raises(ValueError, match=re.escape(message)):
            call()


@pytest.mark.parametrize("device", ["GB200-NVL72-186GB", "H100-SXM-80GB", "MI300X-192GB"])
def test_the_ideal_is_a_lower_bound_on_every_node_size(device):
    # a GB200 NVL72 domain holds 72 devices: a rollout pool smaller than it shares it with
    # trainer devices that hold the model, so no byte need cross a network card (the bound said
    # 2.8 s for Llama-3.1-70B to one GB200 replica, the sync 0.37 s)
    dev, checked = get_device(device), 0
    for model, gtp, replicas, (dp, tp, pp), transport in itertools.product(
            ("llama-3.1-70b", "qwen3-30b-a3b"), (4, 8), (1, 16), ((16, 8, 1), (2, 8, 4)),
            ("broadcast", "packed", "sharded")):
        cost = sync_cost(get_spec(model), dev, "disaggregated", generation_tp=gtp,
                         replicas=replicas, trainer=Layout(dp=dp, tp=tp, pp=pp),
                         transport=transport)
        assert 0 < cost.ideal <= cost.seconds, (model, gtp, replicas, dp, tp, pp, transport)
        checked += 1
    assert checked == 48
    one = sync_cost(get_spec("llama-3.1-70b"), get_device("GB200-NVL72-186GB"), "disaggregated",
                    generation_tp=1, replicas=1, trainer=Layout(dp=16, tp=8))
    # the replica's whole copy over its own NVLink: 141.1 GB at 900 GB/s
    assert one.ideal == pytest.approx(one.bytes / 900e9, rel=1e-3) and one.ideal < one.seconds


def test_every_rank_assembles_the_whole_model_before_a_sync():
    from rlm_course.cost.weight_sync import whole_tensor_gather_seconds

    h100 = get_device("H100-SXM-80GB")
    fabric = Fabric.of(h100)
    a_in, b_in = h100.intra_node_latency, h100.intra_node_bandwidth
    a_out, b_out = fabric.inter.alpha, fabric.inter.beta
    moe = SPECS["qwen3-30b-a3b"]
    e = 2 * moe.expert_params()
    d = 2 * moe.params() - e
    # TP 2 x EP 8 x PP 2 on 32 devices: the dense part all-gathered over TP 2 inside a node, the
    # experts over EP 8 (eight consecutive ranks: one node), and half of each stage's shards
    # (D / 2 + E / 8) broadcast to the other stage, 16 ranks away, through one card
    lay = Layout(tp=2, ep=8, pp=2, dp=8)
    want = (a_in + d / 2 / b_in) + 7 * (a_in + e / 8 / b_in) + (d / 2 + e / 8) / 2 / b_out
    assert whole_tensor_gather_seconds(moe, lay, fabric) == pytest.approx(want)
    # the same export feeds a colocated engine and a rank-0 broadcast alike
    assert sync_cost(moe, h100, "colocated", generation_tp=4, replicas=8,
                     trainer=lay).gather == pytest.approx(want)
    assert sync_cost(moe, h100, "disaggregated", generation_tp=4, replicas=4, trainer=lay,
                     transport="packed").gather == pytest.approx(want)
    # NeMo-RL v0.3's gather_params all-gathers over TP first and broadcasts whole dense tensors
    # over the stages: half of D, not half of D / 2, crosses to the other stage
    whole = whole_tensor_gather_seconds(moe, lay, fabric, pipeline_whole=True)
    assert whole == pytest.approx(want + (d - d / 2) / 2 / b_out)
    assert sync_cost(moe, h100, "colocated", generation_tp=4, replicas=8, trainer=lay,
                     pipeline_whole=True).gather == pytest.approx(whole)
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="pipeline_whole"):
            whole_tensor_gather_seconds(moe, lay, fabric, pipeline_whole=bad)
        with pytest.raises(ValueError, match="pipeline_whole"):
            sync_cost(moe, h100, "colocated", generation_tp=4, replicas=8, trainer=lay,
                      pipeline_whole=bad)
    # the shard-to-shard transfer gathers nothing
    assert sync_cost(moe, h100, "disaggregated", generation_tp=4, replicas=4, trainer=lay,
                     transport="sharded").gather == 0.0
    # FSDP over 8 devices: full_tensor() of every parameter, the model's ring all-gather
    dense = SPECS["qwen2.5-7b"]
    m = 2 * dense.params()
    assert whole_tensor_gather_seconds(dense, Layout(dp=8, zero=3), fabric) == pytest.approx(
        7 * (a_in + m / 8 / b_in))
    # one device holds the whole model already
    assert whole_tensor_gather_seconds(dense, Layout(), fabric) == 0.0
    # FSDP over 4 under TP 2: each rank's slice of its TP shard first (4 ranks 2 apart: one
    # node), then the TP all-gather; context parallelism is data parallelism here, at TP's stride
    fsdp_tp = whole_tensor_gather_seconds(dense, Layout(dp=4, tp=2, zero=3), fabric)
    assert fsdp_tp == pytest.approx(3 * (a_in + m / 2 / 4 / b_in) + (a_in + m / 2 / b_in))
    assert whole_tensor_gather_seconds(dense, Layout(dp=2, cp=4, zero=3), fabric) == \
        pytest.approx(7 * (a_in + m / 8 / b_in))
    # and never less than the least a colocated reshard moves
    for lay in (Layout(dp=4, pp=2, zero=3), Layout(dp=2, tp=2, pp=2, zero=3),
                Layout(dp=8, zero=3), Layout(dp=2, tp=4, zero=3)):
        c = sync_cost(dense, h100, "colocated", generation_tp=1, replicas=lay.devices,
                      trainer=lay)
        assert c.ideal <= c.seconds, lay
    for args, message in (((dense, {"tp": 2}, fabric), "must be a Layout"),
                          ((dense, lay, h100), "fabric"),
                          (("qwen2.5-7b", lay, fabric), "spec")):
        with pytest.raises(ValueError, match=message):
            whole_tensor_gather_seconds(*args)
    for bad in (0, 1.5, "2", True, -1):
        with pytest.raises(ValueError, match="weight_bytes"):
            whole_tensor_gather_seconds(dense, lay, fabric, weight_bytes=bad)
