"""The work-depth model: hand examples, closed forms against the composed DAGs, the FLOP
convention against the model's, and the properties the course draws from it."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlm_course.cost import workdepth as wd
from rlm_course.lm.model import ModelConfig, forward_flops
from rlm_course.numerics import relative_error, reorder_tolerance
from rlm_course.rl.advantages import gae

TINY = ModelConfig(vocab_size=24, n_layer=2, n_head=2, d_model=16, max_seq_len=64)


def test_leaves_hand_examples():
    m = wd.matmul(2, 3, 4)
    assert (m.work, m.depth) == (48, 1 + 2)  # 2*2*3*4; products, then a tree sum of 3 (depth 2)
    assert (wd.reduction(5, 8).work, wd.reduction(5, 8).depth) == (40, 3)
    assert (wd.elementwise(10, 3).work, wd.elementwise(10, 3).depth) == (30, 3)
    assert [wd.log2_depth(n) for n in (1, 2, 3, 4, 5, 1024, 1025)] == [0, 1, 2, 2, 3, 10, 11]
    with pytest.raises(ValueError, match="k=0"):
        wd.matmul(2, 0, 4)


def test_sequential_adds_depth_parallel_takes_the_max():
    a, b = wd.elementwise(100, 2), wd.reduction(1, 64)  # (200, 2) and (64, 6)
    s, p = wd.seq("s", a, b), wd.par("p", a, b)
    assert (s.work, s.depth) == (264, 8) and (p.work, p.depth) == (264, 6)
    r = wd.repeat(b, 5, parallel=False)
    q = wd.repeat(b, 5, parallel=True)
    assert (r.work, r.depth) == (320, 30) and (q.work, q.depth) == (320, 6)
    assert r.work_of("reduction") == 320 and r.work_of("matmul") == 0


def test_brents_bound_and_speedup():
    c = wd.seq("c", wd.elementwise(1000, 1), wd.reduction(1, 1000))  # W = 2000, D = 11
    for p in (1, 2, 16, 10**6):
        assert c.lower_bound(p) <= c.brent_time(p)
        assert c.speedup(p) <= min(p, c.parallelism) + 1e-9
    assert c.brent_time(1) == c.work + c.depth and c.lower_bound(10**9) == c.depth
    with pytest.raises(ValueError, match="processors=0"):
        c.brent_time(0)


@pytest.mark.parametrize("batch,seq,ctx", [(1, 1, 1), (3, 7, None), (2, 1, 20), (4, 9, 9)])
def test_forward_closed_form_equals_the_dag_and_its_matmuls_equal_forward_flops(batch, seq, ctx):
    dag = wd.forward(TINY, batch, seq, ctx)
    assert (dag.work, dag.depth) == wd.forward_cost(TINY, batch, seq, ctx)
    assert dag.work_of("matmul") == forward_flops(TINY, seq, ctx, batch)


def test_decode_closed_form_and_depth_linear_in_length_work_in_group():
    dag = wd.decode(TINY, 4, 5, 7)
    assert (dag.work, dag.depth) == wd.decode_cost(TINY, 4, 5, 7)
    step = [wd.decode_cost(TINY, 1, 5, t)[1] for t in (8, 16, 32)]
    # depth grows (at least) linearly with the response length: each step depends on the last
    per_step = wd.forward_cost(TINY, 1, 1, 5)[1]
    assert step[1] - step[0] >= 8 * per_step and step[2] - step[1] >= 16 * per_step
    one, eight = wd.decode_cost(TINY, 4, 5, 7), wd.decode_cost(TINY, 32, 5, 7)
    assert eight[1] == one[1] and eight[0] == 8 * one[0]  # a group of 8 adds work, not depth


def test_backward_mirrors_forward_with_twice_the_matmul_work():
    fwd = wd.forward(TINY, 2, 6)
    bwd = wd.backward(fwd)
    assert bwd.work_of("matmul") == 2 * fwd.work_of("matmul")
    # one matmul (8, 3) @ (3, 5): dX = dY W^T sums over n = 5 (depth 1 + 3), dW = X^T dY over
    # m = 8 (depth 1 + 3), side by side
    d = wd.backward(wd.matmul(8, 3, 5))
    assert (d.work, d.depth) == (2 * 2 * 8 * 3 * 5, 4)
    assert [p.shape for p in d.parts] == [(8, 5, 3), (3, 8, 5)]


def test_gae_prefix_scan_has_log_depth_and_computes_gae():
    for t in (1, 2, 7, 64, 1000):
        loop, scan = wd.gae_scan(3, t), wd.gae_prefix_scan(3, t)
        assert loop.depth == 3 + 2 * t and scan.depth == 3 + 2 * wd.log2_depth(t)
        assert loop.work == 15 * t and scan.work == 9 * t + 9 * t * wd.log2_depth(t)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 1000), st.floats(0, 1), st.floats(0, 1), st.integers(1, 13))
def test_parallel_gae_equals_the_reverse_loop(seed, gamma, lam, width):
    g = torch.Generator().manual_seed(seed)
    # float64: the scan sums the discounted deltas in a tree instead of right to left
    rewards = torch.randn(4, width, generator=g, dtype=torch.float64)
    values = torch.randn(4, width, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, width + 1, (4,), generator=g)
    mask = torch.arange(width)[None] < lengths[:, None]
    expected = gae(rewards, values, mask, gamma, lam)
    got = wd.gae_parallel(rewards, values, mask, gamma, lam)
    # a sum of up to 13 terms; the tree multiplies (gamma lam) powers in another order too
    tol = reorder_tolerance(torch.float64, terms=width, depth=2)
    assert relative_error(got[0], expected[0]) <= tol
    assert relative_error(got[1], expected[1]) <= tol


def test_iterations_generation_depth_dominates_and_group_adds_work_only():
    n_params = 10_000
    g8 = wd.grpo_iteration(TINY, 8, 8, 6, 40, n_params)
    g16 = wd.grpo_iteration(TINY, 8, 16, 6, 40, n_params)
    gen8, gen16 = g8.parts[0], g16.parts[0]
    assert gen16.depth == gen8.depth and gen16.work == 2 * gen8.work
    assert gen8.depth > sum(p.depth for p in g8.parts[1:])  # decode is the critical path
    assert gen8.work < g8.work / 2  # ... though not most of the work
    ppo = wd.ppo_iteration(TINY, 64, 6, 40, n_params)
    scan = wd.ppo_iteration(TINY, 64, 6, 40, n_params, prefix_scan=True)
    assert scan.depth < ppo.depth and scan.work > ppo.work
    with pytest.raises(ValueError, match="does not divide"):
        wd.grpo_iteration(TINY, 3, 3, 6, 4, n_params, minibatches=2)


@pytest.mark.parametrize("name", ["llama-3-8b", "mixtral-8x7b"])
def test_gqa_swiglu_and_moe_layers_count_the_flops_of_the_architecture(name):
    from rlm_course.cost.anatomy import teacher_forced_flops
    from rlm_course.cost.architectures import get_spec

    spec = get_spec(name)
    dag = wd.forward(spec, 2, 64)
    assert dag.work_of("matmul") == teacher_forced_flops(spec, 64, 2)
    # more sequences or a longer prompt add work; the depth of a forward grows only with logs
    assert wd.forward(spec, 8, 64).depth == dag.depth
    assert wd.forward(spec, 2, 4096).depth - dag.depth <= spec.n_layer * 3 * 6


# ----------------------------------------------------------------- response lengths
def test_decode_with_lengths_work_follows_the_sum_depth_the_longest():
    lengths = [1, 3, 7, 2, 40, 5]
    dag = wd.decode(TINY, 6, 5, 40, lengths)
    # a step's work is linear in the sequences it serves: the batch is the sum of its sequences
    assert dag.work == sum(wd.decode_cost(TINY, 1, 5, t)[0] for t in lengths)
    # ... and the sequences run side by side: the depth is that of the longest alone
    assert dag.depth == wd.decode_cost(TINY, 1, 5, 40)[1]
    # equal lengths: the same numbers as without lengths
    same = wd.decode(TINY, 4, 5, 7, [7] * 4)
    assert (same.work, same.depth) == wd.decode_cost(TINY, 4, 5, 7)
    with pytest.raises(ValueError, match="5 response lengths for a batch of 6"):
        wd.decode(TINY, 6, 5, 40, lengths[:5])
    with pytest.raises(ValueError, match="1..response_len=40"):
        wd.decode(TINY, 6, 5, 40, [41, 1, 1, 1, 1, 1])


def test_packed_forward_hand_example():
    # sequences of 4 + 2 and 4 + 6 tokens, independent: work adds, depth of the longer
    packed = wd.packed_forward(TINY, 4, [2, 6])
    a, b = wd.forward_cost(TINY, 1, 6), wd.forward_cost(TINY, 1, 10)
    assert (packed.work, packed.depth) == (a[0] + b[0], max(a[1], b[1]))
    whole = wd.forward(TINY, 3, 9)
    same = wd.packed_forward(TINY, 4, [5, 5, 5])
    assert (same.work, same.depth) == (whole.work, whole.depth)


def test_iterations_with_lengths():
    n_params = 10_000
    plain = wd.grpo_iteration(TINY, 8, 8, 6, 40, n_params)
    equal = wd.grpo_iteration(TINY, 8, 8, 6, 40, n_params, response_lengths=[40] * 64)
    assert (equal.work, equal.depth) == (plain.work, plain.depth)
    ppo = wd.ppo_iteration(TINY, 64, 6, 40, n_params)
    assert ((ppo.work, ppo.depth) == (lambda c: (c.work, c.depth))(
        wd.ppo_iteration(TINY, 64, 6, 40, n_params, response_lengths=[40] * 64)))
    # one response of 40 tokens among 63 of 4: the same generation depth as all 40 long, a tenth
    # of the generation work or so, so far less parallelism
    tail = wd.grpo_iteration(TINY, 8, 8, 6, 40, n_params, response_lengths=[4] * 63 + [40])
    short = wd.grpo_iteration(TINY, 8, 8, 6, 40, n_params, response_lengths=[4] * 64)
    gen_tail, gen_plain, gen_short = tail.parts[0], plain.parts[0], short.parts[0]
    assert gen_tail.depth == gen_plain.depth > 5 * gen_short.depth
    assert gen_tail.work < gen_plain.work / 5
    assert gen_tail.parallelism < gen_short.parallelism / 5
    assert tail.parts[-1].work < plain.parts[-1].work  # training counts each sequence's tokens


def test_the_ppo_dag_gives_the_critic_a_value_head_as_the_flop_count_does():
    from rlm_course.cost.anatomy import Workload, stage_costs
    from rlm_course.cost.architectures import get_spec
    from rlm_course.rl.algorithms import preset

    spec = get_spec("llama-3.1-8b")
    config = preset("ppo", minibatches=2, prompts_per_step=8, group_size=1)
    for lengths in (None, (40, 200, 256, 17, 99, 256, 3, 120)):
        w = Workload(8, 1, 512, 256, response_lengths=lengths)
        dag = wd.ppo_iteration(spec, 8, 512, 256, spec.params(), minibatches=2,
                               response_lengths=lengths)
        flops = sum(c.flops for c in stage_costs(spec, config, w).values())
        # the DAG adds the elementwise work the FLOP count leaves out (norms, softmaxes, Adam):
        # 0.1%; with the critic scored and trained through a language-model head it was 2.9% over
        assert 1.0 <= dag.work / flops < 1.002
    value = wd.forward(spec, 2, 10, value_positions=4)
    lm = wd.forward(spec, 2, 10)
    d, v = spec.d_model, spec.vocab_size
    assert lm.work - value.work == 2 * 20 * d * v - 2 * 8 * d  # 20 rows x V, or 8 x 1


def test_group_advantages_need_whole_groups():
    # 5 responses in groups of 2 was priced as 2 groups, one response dropped without a word
    with pytest.raises(ValueError, match="batch=5 does not split into groups of group_size=2"):
        wd.group_advantage(5, 2)
    assert wd.group_advantage(4, 2).work == wd.group_advantage(2, 2).work * 2
