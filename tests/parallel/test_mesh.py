"""3-D parallelism (dp x pp x tp) on simulated ranks: one device's gradients, bytes per axis equal
to their closed forms, and the SubWorld view that runs a strategy on a group of ranks."""

import pytest
import torch
import torch.nn.functional as F

from rlm_course.lm.model import ModelConfig, TinyGPT
from rlm_course.numerics import relative_error, reorder_tolerance
from rlm_course.parallel.mesh_parallel import MeshParallelGPT, bytes_per_axis
from rlm_course.parallel.world import Mesh, SubWorld, World

CONFIG = ModelConfig(vocab_size=16, n_layer=4, n_head=4, d_model=32, max_seq_len=16)


def _one_device(model, tokens):
    model.zero_grad()
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.reshape(-1, CONFIG.vocab_size), tokens[:, 1:].reshape(-1)).backward()
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("dp,pp,tp,schedule", [(2, 2, 2, "1f1b"), (1, 4, 2, "gpipe"),
                                               (2, 1, 4, "1f1b"), (4, 2, 1, "1f1b")])
def test_three_d_parallel_gradients_equal_one_device_and_bytes_follow_the_formulas(dp, pp, tp,
                                                                                   schedule):
    torch.manual_seed(0)
    model = TinyGPT(CONFIG).double()
    tokens = torch.randint(0, CONFIG.vocab_size, (8, 13))
    reference = _one_device(model, tokens)
    world = World(dp * pp * tp)
    parallel = MeshParallelGPT(model, world, dp=dp, pp=pp, tp=tp, schedule=schedule)
    parallel.step(tokens, micro_batches=2)
    grads = parallel.gathered_grads()
    assert set(grads) == set(reference)
    # longest sum: a weight gradient over 8 x 12 rows, through the 4 blocks forward and back
    tol = reorder_tolerance(torch.float64, terms=96, depth=16)
    errors = {n: relative_error(grads[n], reference[n]) for n in reference}
    assert max(errors.values()) <= tol, max(errors.items(), key=lambda kv: kv[1])
    expected = bytes_per_axis(CONFIG, dp, pp, tp, batch=8, seq=12, micro_batches=2,
                              numel_per_rank=parallel.numel_per_rank(), bytes_per_element=8)
    measured = parallel.bytes_by_axis()
    assert measured == expected
    assert [sum(axis[r] for axis in measured.values()) for r in range(world.size)] == world.sent


def test_every_rank_holds_its_share_of_the_parameters():
    model = TinyGPT(CONFIG)
    parallel = MeshParallelGPT(model, World(8), dp=2, pp=2, tp=2)
    held = parallel.state_bytes_per_rank()
    one = sum(p.numel() * 4 for p in model.parameters())
    # every dp replica holds one full model in total (replicated pieces counted per TP rank)
    assert sum(held[:4]) == sum(held[4:]) and sum(held[:4]) > one / 2
    assert max(held) < one / 2  # pipeline halves, TP splits the blocks further


def test_a_second_step_starts_from_zero_gradients():
    torch.manual_seed(0)
    model = TinyGPT(CONFIG).double()
    tokens = torch.randint(0, CONFIG.vocab_size, (8, 13))
    parallel = MeshParallelGPT(model, World(8), dp=2, pp=2, tp=2)
    parallel.step(tokens, micro_batches=2)
    first = {n: g.clone() for n, g in parallel.gathered_grads().items()}
    parallel.step(tokens, micro_batches=2)  # was twice the gradients: they accumulated
    assert all(torch.equal(g, first[n]) for n, g in parallel.gathered_grads().items())
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match=f"micro_batches={bad!r} must be a positive integer"):
            parallel.step(tokens, micro_batches=bad)


def test_bad_meshes_are_clear_errors():
    model = TinyGPT(CONFIG)
    with pytest.raises(ValueError, match="multiply to 6, not the world size 8"):
        MeshParallelGPT(model, World(8), dp=3, pp=2, tp=1)
    with pytest.raises(ValueError, match="pp=3 does not divide the 4 layers"):
        MeshParallelGPT(model, World(3), pp=3)
    with pytest.raises(ValueError, match="TP degree 8 does not divide the 4 attention heads"):
        MeshParallelGPT(model, World(8), tp=8)
    parallel = MeshParallelGPT(model, World(4), dp=2, pp=2)
    with pytest.raises(ValueError, match="does not split into dp=2 x micro_batches=4"):
        parallel.step(torch.randint(0, 16, (6, 5)), micro_batches=4)


def test_subworld_maps_local_ranks_and_counts_its_own_traffic():
    world = World(8)
    mesh = Mesh(world, dp=2, pp=2, tp=2)
    assert mesh.group_of("tp", 5) == [4, 5] and mesh.group_of("dp", 5) == [1, 5]
    tp = mesh.subworld("tp", 5)
    out = tp.all_reduce([torch.ones(4), 2 * torch.ones(4)])
    assert torch.equal(out[1], torch.full((4,), 3.0))
    assert tp.sent == [16, 16] and world.sent == [0, 0, 0, 0, 16, 16, 0, 0]
    assert world.events[0].name == "tp: all-reduce"
    dp = SubWorld(world, [1, 5], "dp")
    dp.send(torch.ones(2), 0, 1)
    assert dp.sent == [8, 0] and dp.received == [0, 8] and world.received[5] == 16 + 8
    with pytest.raises(ValueError, match="local ranks in 0..1"):
        dp.all_reduce([torch.ones(1)] * 3, ranks=[0, 1, 2])


def test_a_step_refuses_tokens_the_model_cannot_read():
    parallel = MeshParallelGPT(TinyGPT(CONFIG), World(2), dp=2)
    good = torch.randint(0, CONFIG.vocab_size, (4, 9))
    for tokens, said in ((torch.full((4, 9), CONFIG.vocab_size), "ids in 0.."),
                         (good.float(), "integer ids of shape (batch, seq + 1)"),
                         (torch.randint(0, 4, (4, CONFIG.max_seq_len + 2)), "max_seq_len + 1"),
                         (good[0], "integer ids of shape")):
        with pytest.raises(ValueError) as caught:  # were IndexError or torch's RuntimeError
            parallel.step(tokens, micro_batches=1)
        assert said in str(caught.value), str(caught.value)
    from rlm_course.parallel.expert_parallel import MoELayer

    with pytest.raises(ValueError, match="MoELayer: n_experts=0 must be a positive integer"):
        MoELayer(8, 16, n_experts=0, k=1)  # k was blamed
