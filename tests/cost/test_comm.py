"""Collectives and the communication roofline at scale (rlm_course.cost.comm) against the simulated
world and the textbook."""

import math

import pytest
import torch

from rlm_course.cost.architectures import get_spec
from rlm_course.cost.hardware import get_device
from rlm_course.cost.comm import Link
from rlm_course.parallel.world import World
from rlm_course.cost import comm

H100 = get_device("H100-SXM-80GB")
SPEC = get_spec("qwen2.5-7b")


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


def test_a_ring_across_nodes_runs_on_all_the_cards_of_its_ranks_on_a_node():
    """NCCL runs one ring per network card, so a ring collective across nodes moves at the
    cards of the group's ranks on a node together (up to NVLink's), the fewest on any node: a
    data-parallel group of 64 H100s, 8 a node, at 8 x 50 GB/s; strided by TP 8, one a node, at
    one card's; 8 + 1 ranks at the last node's one card. An all-to-all or a hop stays on one."""
    fabric = comm.Fabric.of(H100)
    assert fabric.ring_link(64).beta == 400e9 and fabric.ring_link(64).alpha == fabric.inter.alpha
    assert fabric.ring_link(64, stride=8) is fabric.inter and fabric.ring_link(9) is fabric.inter
    assert fabric.ring_link(16, stride=4).beta == 100e9  # 2 ranks a node
    assert fabric.ring_link(8) is fabric.intra and fabric.ring_link(2, stride=4) is fabric.intra
    assert fabric.link(64) is fabric.inter  # what an all-to-all or a point-to-point hop uses
    # Llama-3-8B's 16 GB of bf16 gradients all-reduced over 64 H100s: 2 x 63/64 x 16 GB at
    # 400 GB/s plus 126 hops' latency, 0.08 s (one card's 50 GB/s made it 0.63 s)
    grads = 2 * get_spec("llama-3-8b").params()
    step = comm.data_parallel_comm(get_spec("llama-3-8b").params(), 64, fabric.ring_link(64), 0)
    assert step.seconds == pytest.approx(2 * 63 * (fabric.inter.alpha + grads / 64 / 400e9))
    assert 0.078 < step.seconds < 0.082


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
    # full recomputation runs each layer's forward again, its dispatch and combine included:
    # 6 all-to-alls a layer; a forward alone (scoring) 2
    again = comm.expert_parallel_comm(get_spec("mixtral-8x7b"), 8, 1000, link, recompute=True)
    assert again.bytes == pytest.approx(6 / 4 * ep.bytes) and again.collectives == 6 * 32
    assert comm.expert_parallel_comm(get_spec("mixtral-8x7b"), 8, 1000, link,
                                     backward=False).collectives == 2 * 32
    u = comm.ulysses_comm(spec, 8, 8192, link, backward=False)
    assert u.bytes == pytest.approx(32 * 7 / 8 * 8192 / 8 * 128 * 2 * (32 + 8 + 8 + 32))
    with pytest.raises(ValueError, match="does not divide llama-3-8b's 8 key/value heads"):
        comm.ulysses_comm(spec, 16, 8192, link)


def test_a_link_and_data_parallel_comm_refuse_what_is_not_a_size():
    from rlm_course.cost.architectures import get_spec
    from rlm_course.cost.comm import data_parallel_comm
    from rlm_course.cost.hardware import get_device
    from rlm_course.cost.phases import DecodeCost, Rates

    link = Link(1e-6, 1e9)
    assert link.seconds(1e9) == pytest.approx(1.000001)
    h100 = get_device("H100-SXM-80GB")
    decode = DecodeCost(get_spec("llama-3.1-8b"), h100, 1, Rates())
    for call, said in ((lambda: link.seconds("5"), "nbytes='5' must be a finite number"),
                       (lambda: link.seconds(math.inf), "nbytes=inf must be a finite number"),
                       (lambda: link.seconds(True), "nbytes=True must be a finite number"),
                       (lambda: data_parallel_comm(1e9, 8, link, 1, grad_bytes=0),
                        "grad_bytes=0 must be a positive number of bytes per element"),
                       (lambda: data_parallel_comm(1e9, 8, link, 1, param_bytes="2"),
                        "param_bytes='2' must be a positive number"),
                       (lambda: decode.seconds(10, 2, "10"), "context_sum='10' a finite number"),
                       (lambda: decode.prefill_seconds([512]),
                        "contexts=[512] must be {context length: sequences}"),
                       (lambda: get_spec(["x"]), "get_spec: name=['x'] must be an architecture")):
        with pytest.raises(ValueError) as caught:
            call()
        assert said in str(caught.value), str(caught.value)
