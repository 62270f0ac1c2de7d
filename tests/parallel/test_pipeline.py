"""Pipeline schedules: the bubble on the simulated timeline equals the formulas, 1F1B bounds the
activations in flight, and executing a schedule on real layers gives one device's gradients."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from rlm_course.numerics import relative_error, reorder_tolerance
from rlm_course.parallel.pipeline import bubble_formula, run_pipeline, schedule_table, simulate


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b", "interleaved"]), st.integers(1, 8), st.integers(1, 4),
       st.integers(1, 4), st.floats(0.5, 3.0))
def test_measured_bubble_equals_the_formula(name, p, k, v, ratio):
    if name != "interleaved":
        v = 1
    m = k * p  # the interleaved schedule needs a multiple of p
    timeline = simulate(schedule_table(name, p, m, v), t_forward=1.0, t_backward=ratio)
    assert timeline.bubble_fraction == pytest.approx(bubble_formula(name, p, m, v), abs=1e-9)
    ideal = m * (1.0 + ratio)
    if name == "interleaved":  # the bubble time is (p - 1) / (v m) of the ideal time
        assert timeline.makespan - ideal == pytest.approx((p - 1) / (v * m) * ideal, abs=1e-9)


def test_1f1b_holds_at_most_p_micro_batches_gpipe_all():
    p, m = 4, 12
    gpipe, one_f = simulate(schedule_table("gpipe", p, m)), simulate(schedule_table("1f1b", p, m))
    assert [gpipe.peak_in_flight(d) for d in range(p)] == [m] * p
    assert [one_f.peak_in_flight(d) for d in range(p)] == [4, 3, 2, 1]
    assert gpipe.makespan == one_f.makespan  # same bubble, less memory


def test_1f1b_table_hand_example():
    table = schedule_table("1f1b", 2, 3)
    assert table[0] == [("F", 0, 0), ("F", 1, 0), ("B", 0, 0), ("F", 2, 0), ("B", 1, 0),
                        ("B", 2, 0)]
    assert table[1] == [("F", 0, 0), ("B", 0, 0), ("F", 1, 0), ("B", 1, 0), ("F", 2, 0),
                        ("B", 2, 0)]


def test_communication_time_lengthens_the_pipeline():
    table = schedule_table("1f1b", 4, 8)
    assert simulate(table, t_comm=0.1).makespan > simulate(table).makespan


@pytest.mark.parametrize("name,p,v", [("gpipe", 2, 1), ("1f1b", 4, 1), ("interleaved", 2, 2),
                                      ("interleaved", 2, 4)])
def test_executing_a_schedule_gives_one_devices_gradients(name, p, v):
    # float64: micro-batches add each weight gradient in another order than the full batch
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(6, 6), nn.Tanh()).double() for _ in range(8)]
    x, y = torch.randn(8, 6, dtype=torch.float64), torch.randn(8, 6, dtype=torch.float64)
    reference = copy.deepcopy(layers)
    loss = nn.functional.mse_loss(nn.Sequential(*reference)(x), y)
    loss.backward()
    m = 4
    micro = list(zip(x.chunk(m), y.chunk(m)))
    from rlm_course.parallel.world import World

    world = World(p)
    losses = run_pipeline(layers, schedule_table(name, p, m, v), micro, nn.functional.mse_loss,
                          world)
    # every stage boundary carries each micro-batch's activations forward and gradients back
    assert sum(world.sent) == 2 * (p * v - 1) * m * (8 // m) * 6 * 8  # 8-byte floats
    tol = reorder_tolerance(torch.float64, terms=8, depth=2 * 8)  # 8 rows, 8 layers each way
    assert sum(losses) / m == pytest.approx(loss.item(), rel=tol)
    for a, b in zip(layers, reference):
        for pa, pb in zip(a.parameters(), b.parameters()):
            assert relative_error(pa.grad, pb.grad) <= tol


def test_unequal_micro_batches_give_one_devices_gradients():
    # 2-stage 1F1B, micro-batches of 3 and 1 rows of a 4-row batch: dividing each micro-batch's
    # mean loss by m = 2 weighed the single row 3x too much (gradients off by 0.142)
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(6, 6), nn.Tanh()).double() for _ in range(4)]
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    reference = copy.deepcopy(layers)
    nn.functional.mse_loss(nn.Sequential(*reference)(x), y).backward()
    losses = run_pipeline(layers, schedule_table("1f1b", 2, 2), [(x[:3], y[:3]), (x[3:], y[3:])],
                          nn.functional.mse_loss)
    tol = reorder_tolerance(torch.float64, terms=4, depth=8)
    for a, b in zip(layers, reference):
        for pa, pb in zip(a.parameters(), b.parameters()):
            assert relative_error(pa.grad, pb.grad) <= tol
    assert (3 * losses[0] + losses[1]) / 4 == pytest.approx(
        nn.functional.mse_loss(nn.Sequential(*reference)(x), y).item(), rel=tol)


def test_bad_input():
    with pytest.raises(ValueError, match="multiple of the pipeline devices"):
        schedule_table("interleaved", 4, 6, 2)
    with pytest.raises(ValueError, match="needs the interleaved schedule"):
        schedule_table("1f1b", 4, 8, 2)
    with pytest.raises(ValueError, match="unknown schedule"):
        schedule_table("zero-bubble", 4, 8)
    with pytest.raises(ValueError, match="do not split evenly into 3 pipeline stages"):
        run_pipeline([nn.Identity()] * 4, schedule_table("1f1b", 3, 3), [(torch.zeros(1), None)] * 3,
                     None)


def test_the_formula_and_the_simulator_refuse_what_no_schedule_runs():
    for args, said in ((("nonsense", 4, 8), "unknown schedule 'nonsense'"),
                       (("gpipe", 0, 1), "stages=0 must be a positive integer"),
                       (("gpipe", 4, 8, 4), "chunks=4 needs the interleaved schedule"),
                       (("interleaved", 4, 6, 2), "needs micro_batches (6) to be a multiple")):
        with pytest.raises(ValueError) as caught:
            bubble_formula(*args)
        assert said in str(caught.value)
    # a table that skips a backward, or runs a micro-batch twice, is not a schedule
    with pytest.raises(ValueError, match=r"device 0's schedule must run each of the 1 "
                                         r"micro-batches' forward and backward.*missing"):
        simulate([[("F", 0, 0)], [("F", 0, 0)]])
    twice = [[("F", 0, 0), ("F", 0, 0), ("B", 0, 0)]]
    with pytest.raises(ValueError, match=r"repeated \[\('F', 0, 0\)\]"):
        simulate(twice)
    with pytest.raises(ValueError, match="t_forward=nan must be a finite number"):
        simulate(schedule_table("gpipe", 2, 2), t_forward=float("nan"))
    # one device: an interleaved schedule's chunks hand over in place, no link crossed
    # (forward 1 + backward 2 for each of 2 micro-batches: 6, not 8.5 with t_comm charged)
    assert simulate(schedule_table("interleaved", 1, 2, 2), t_comm=1.0).makespan == 6.0
    # micro-batches are (input, target) pairs: a bare tensor was read as its first two rows
    layers, x = [nn.Linear(4, 4) for _ in range(4)], torch.randn(12, 4)
    with pytest.raises(ValueError, match=r"micro_batches\[0\] must be an \(input, target\) "
                                         "pair"):
        run_pipeline(layers, schedule_table("1f1b", 2, 2), [x[:6], x[6:]],
                     lambda out, target: ((out - target) ** 2).mean())
