"""Simulated ranks: collectives give the right tensors, count the bytes the formulas say, and time
themselves with the alpha-beta model; data parallelism and ZeRO equal one device."""

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from rlm_course.numerics import adam_tolerance, reorder_tolerance
from rlm_course.parallel.data_parallel import DataParallel, bytes_sent_per_step, flat_params
from rlm_course.cost.comm import Link
from rlm_course.parallel.world import Mesh, World


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 9), st.integers(1, 5), st.sampled_from(["ring", "tree"]))
def test_all_reduce_sums_and_counts_bytes(p, k, algorithm):
    world = World(p, Link(alpha=1e-5, beta=1e9), algorithm)
    tensors = [torch.full((k * p,), float(r)) for r in range(p)]
    out = world.all_reduce(tensors)
    assert all(torch.equal(o, torch.full((k * p,), p * (p - 1) / 2)) for o in out)
    m = 4 * k * p
    if p == 1:
        assert world.sent == [0] and world.clock == [0.0]
    elif algorithm == "ring":
        assert world.sent == world.received == [2 * (p - 1) * m // p] * p
        assert world.clock[0] == pytest.approx(2 * (p - 1) * (1e-5 + m / p / 1e9))
    else:  # a binomial reduce then broadcast: every rank sends what it receives
        assert world.sent == world.received and sum(world.sent) == 2 * (p - 1) * m
        assert world.clock[0] == pytest.approx(2 * math.ceil(math.log2(p)) * (1e-5 + m / 1e9))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 8), st.integers(1, 4))
def test_reduce_scatter_then_all_gather_is_an_all_reduce(p, k):
    world = World(p)
    g = torch.Generator().manual_seed(p * 10 + k)
    tensors = [torch.randn(k * p, generator=g) for _ in range(p)]
    shards = world.reduce_scatter(tensors)
    full = world.all_gather(shards)
    # the ring adds the p contributions in another order than stack().sum(): rounding only
    # (relative to the largest contribution, since a sum may cancel to nearly 0)
    scale = torch.stack(tensors).abs().max()
    assert (full[0] - torch.stack(tensors).sum(0)).abs().max() <= \
        reorder_tolerance(torch.float32, p) * p * scale
    m = 4 * k * p
    assert world.sent == [2 * ((p - 1) * m // p)] * p


def test_all_to_all_and_send_hand_example():
    world = World(3)
    chunks = [[torch.full((r + 1,), 10.0 * i + r) for r in range(3)] for i in range(3)]
    got = world.all_to_all(chunks)
    assert [t.tolist() for t in got[2]] == [[2.0] * 3, [12.0] * 3, [22.0] * 3]
    # rank 0 sends chunks of 2 and 3 floats to ranks 1 and 2: 20 bytes; receives 2 x 4 bytes
    assert world.sent[0] == 20 and world.received[0] == 8
    w = World(2, Link(alpha=1e-3, beta=1e6))
    w.compute(0, "forward", 0.5)
    w.send(torch.zeros(250), 0, 1)  # 1000 bytes: 1 ms + 1 ms, after rank 0's 0.5 s
    assert w.clock == [pytest.approx(0.502)] * 2 and w.received == [0, 1000]


def test_broadcast_binomial_tree():
    world = World(8)
    out = world.broadcast(torch.ones(4), src=3)
    assert len(out) == 8 and world.received[3] == 0 and sum(world.received) == 7 * 16
    assert world.sent[3] == 3 * 16  # the root sends in each of the log2(8) rounds


def test_mesh_groups_and_bad_input():
    mesh = Mesh(World(8), dp=2, tp=2, pp=2)
    assert mesh.groups("tp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert mesh.groups("pp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert mesh.coordinates(6) == {"dp": 1, "tp": 1, "pp": 0}
    with pytest.raises(ValueError, match="multiply to 6, not the world size 8"):
        Mesh(World(8), dp=2, tp=3)
    with pytest.raises(ValueError, match="do not split into 3 equal shards"):
        World(3).reduce_scatter([torch.ones(4)] * 3)
    with pytest.raises(ValueError, match="2 tensors for 3 ranks"):
        World(3).all_reduce([torch.ones(3)] * 2)
    with pytest.raises(ValueError, match="size=0"):
        World(0)


def _model_and_data(dtype=torch.float32):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).to(dtype)
    return model, torch.randn(24, 6, dtype=dtype), torch.randn(24, 3, dtype=dtype)


def _loss(model, batch):
    return ((model(batch[0]) - batch[1]) ** 2).mean()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_zero_stages_equal_one_device_and_send_the_formula_bytes(stage, ranks):
    # float64: Adam amplifies rounding differences of near-zero gradients up to lr per step, so
    # float32 results may differ by far more than its rounding (see rlm_course.numerics)
    model, x, y = _model_and_data(torch.float64)
    reference = copy.deepcopy(model)
    optimizer = torch.optim.Adam(reference.parameters(), lr=1e-2)
    world = World(ranks)
    dp = DataParallel(world, model, stage, lr=1e-2)
    for _ in range(3):
        optimizer.zero_grad()
        _loss(reference, (x, y)).backward()
        optimizer.step()
        dp.step([(a, b) for a, b in zip(x.chunk(ranks), y.chunk(ranks))], _loss)
    # the longest sum: a gradient over the 24 samples of the batch
    tol = adam_tolerance(torch.float64, terms=24, lr=1e-2, steps=3, depth=4)
    assert (dp.parameters() - flat_params(reference)).abs().max() <= tol
    assert world.sent == [3 * bytes_sent_per_step(stage, dp.padded, ranks, 8)] * ranks
    memory = dp.memory_per_rank()
    p = dp.padded
    assert memory["adam"] == 8 * 2 * (p if stage == 0 else p // ranks)
    assert memory["params"] == 8 * (p if stage < 3 else p // ranks)


def test_bench_parallel_reports_every_strategy_and_the_degrees_that_do_not_fit():
    from rlm_course.parallel.bench import bench_parallel

    result = bench_parallel(repeats=1)
    names = {"DP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "TP", "TP+SP", "PP (1F1B)", "CP (ring)",
             "EP (MoE)"}
    assert set(result["strategies"]) == names
    for name, by_degree in result["strategies"].items():
        for degree, row in by_degree.items():
            if "error" in row:
                assert (name, degree) in {("TP", 8), ("TP+SP", 8), ("PP (1F1B)", 8)}, row
            else:
                assert row["max_bytes_sent_per_rank"] > 0 and row["predicted_comm_seconds"] > 0
    zero = result["strategies"]
    # ZeRO-3 sends 1.5x what DP sends; ZeRO-1/2 the same
    assert zero["ZeRO-3"][4]["max_bytes_sent_per_rank"] == 1.5 * zero["DP"][4]["max_bytes_sent_per_rank"]
    assert zero["ZeRO-1"][4]["max_bytes_sent_per_rank"] == zero["DP"][4]["max_bytes_sent_per_rank"]


def test_uneven_batch_slices_are_refused():
    model, x, y = _model_and_data()
    dp = DataParallel(World(2), model)
    with pytest.raises(ValueError, match="slices of sizes \\[10, 14\\]"):
        dp.step([(x[:10], y[:10]), (x[10:], y[10:])], _loss)


def test_a_mesh_and_adam_refuse_what_is_out_of_range():
    from rlm_course.parallel.data_parallel import adam_update
    from rlm_course.parallel.world import Mesh, World

    mesh = Mesh(World(8), dp=2, pp=2, tp=2)
    assert mesh.coordinates(7) == {"dp": 1, "pp": 1, "tp": 1}
    for rank in (8, -1, True):  # 9 was read as (0, 0, 1), -1 as the last rank
        with pytest.raises(ValueError, match=f"rank={rank!r} is not in 0..7"):
            mesh.coordinates(rank)
    zeros = torch.zeros(2)
    with pytest.raises(ValueError, match="step=0 must be a positive integer: Adam counts"):
        adam_update(zeros, torch.ones(2), zeros.clone(), zeros.clone(), 0, 0.1)  # was [nan, nan]


def test_collectives_refuse_tensors_of_different_shapes_by_name():
    import numpy as np

    from rlm_course.parallel.world import World

    world = World(np.int64(4))  # numpy's integers count ranks
    assert world.size == 4 and type(world.size) is int
    ragged = [torch.zeros(3), torch.zeros(4), torch.zeros(3), torch.zeros(3)]
    for call, said in (
            (lambda: world.all_reduce(ragged), "all-reduce: every rank must contribute a tensor "
                                               "of one shape and dtype"),
            (lambda: world.reduce_scatter(ragged), "reduce-scatter: every rank must contribute"),
            (lambda: world.all_reduce([torch.zeros(2), torch.zeros(2, dtype=torch.float64)] * 2),
             "one shape and dtype"),
            (lambda: world.all_gather([torch.tensor(1.0)] * 4), "all-gather: shards are "
                                                                 "concatenated along dim 0"),
            (lambda: world.all_reduce([torch.zeros(2)] * 3, ranks=[0, 1.0, 2]),
             "ranks [0, 1.0, 2]: need distinct ranks in 0..3"),
            (lambda: world.all_reduce([1, 2, 3, 4]), "give one torch.Tensor per rank")):
        with pytest.raises(ValueError) as caught:
            call()
        assert said in str(caught.value), str(caught.value)
    assert torch.equal(world.all_reduce([torch.ones(2)] * 4, ranks=[0, 1, 2, np.int64(3)])[0],
                       torch.full((2,), 4.0))


def test_the_parallel_size_helpers_refuse_what_divides_nothing():
    from rlm_course.cost import workdepth as wd
    from rlm_course.parallel.context_parallel import layout
    from rlm_course.parallel.data_parallel import bytes_sent_per_step
    from rlm_course.parallel.ulysses import ulysses_bytes_per_rank

    # (p - 1) / p x batch x seq / p x d_head x (2 heads + 2 kv heads) x 4 bytes
    assert ulysses_bytes_per_rank(1, 4, 8, 2, 2) == 1 * (8 // 2) * 2 * (2 * 4 + 2 * 4) * 4 // 2
    assert bytes_sent_per_step(1, 8, 4) == 2 * 3 * 32 // 4
    for call, said in (
            (lambda: layout(16, 0, False), "ranks=0 must be a positive integer"),
            (lambda: layout(16, -2, False), "ranks=-2 must be a positive integer"),  # was []
            (lambda: ulysses_bytes_per_rank(1, 4, 8, 2, 0), "degree=0 must be a positive"),
            (lambda: ulysses_bytes_per_rank(1, 4, 8, 2, 3), "divides seq=8 and heads=4"),
            (lambda: bytes_sent_per_step(4, 64, 4), "stage=4: choose a ZeRO stage"),
            (lambda: bytes_sent_per_step(1, 64, 0), "ranks=0 must be a positive integer"),
            (lambda: wd.matmul(True, 2, 2), "m=True must be a positive integer"),
            (lambda: wd.brent_bound(10, 2, True), "processors=True: need an integer >= 1")):
        with pytest.raises(ValueError) as caught:
            call()
        assert said in str(caught.value), str(caught.value)


def test_meshes_moe_layers_and_work_depth_take_numpy_integers():
    import numpy as np

    from rlm_course.cost import workdepth as wd
    from rlm_course.parallel.expert_parallel import MoELayer
    from rlm_course.parallel.world import Mesh, World

    assert Mesh(World(4), dp=np.int64(2), tp=2).degrees == {"dp": 2, "tp": 2}
    assert MoELayer(8, 16, np.int64(4), k=np.int64(2)).k == 2
    assert wd.matmul(np.int64(2), 3, 4).work == 2 * 2 * 3 * 4
    assert wd.brent_bound(10, 2, np.int64(2)) == 10 / 2 + 2
