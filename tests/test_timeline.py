"""Timelines (rlm_course.timeline): the recorder, busy and overlapping seconds, the plot."""

import pytest

from rlm_course.lm.tokenizer import CharTokenizer
from rlm_course.timeline import (Event, Recorder, busy_seconds, clock_offset,
                                 overlap_seconds, utilisation)

TOK = CharTokenizer()


def test_recorder_and_overlaps():
    ticks = iter([0.0, 2.0, 1.0, 3.0])
    rec = Recorder("w", clock=lambda: next(ticks))
    with rec("training", version=1, step=1) as detail:
        detail["tokens"] = 5
    with rec("sync"):
        pass
    events = rec.take()
    assert events[0] == Event("w", "training", 0.0, 2.0, 1, 1, {"tokens": 5})
    assert busy_seconds(events) == 3.0 and rec.take() == []
    both = [Event("a", "x", 0, 4), Event("b", "y", 2, 6)]
    assert overlap_seconds(both, "a", "b") == 2
    assert utilisation(both) == {"a": 4 / 6, "b": 4 / 6}
    assert clock_offset(lambda: 105.0, iter([1.0, 3.0] * 5).__next__) == pytest.approx(103.0)


def test_timeline_plot():
    from rlm_course.tools.plots import plot_timelines

    events = [Event("actor/0", "training", 0, 1, 1, 1), Event("rollout/0", "generation", 0, 2, 0, 2)]
    fig = plot_timelines({"a run": events, "another": events})
    assert len(fig.axes) == 2
