"""What every worker or rank did, and when: one :class:`Event` per interval of work.

One type for every timeline of the course (a leaf module: every layer may import it): the
simulated ranks of chapters 07-10 (:class:`rlm_course.parallel.world.World`: ``stage``
``"compute"`` or ``"comm"``, ``name`` the collective), the data-parallel ranks of chapter 11
(:mod:`rlm_course.distributed.grpo`: the trainer's stages and ``"communication"``) and the Ray
workers of chapters 12-13.

Each Ray worker (:mod:`rlm_course.systems.workers`) appends an :class:`Event` to its
:class:`Recorder` around every piece of work it does: a generation, a scoring pass, a training
step, a weight sync, a resharding. The controller collects them after the run, in one list, on
one clock: each worker measures ``time.time()``, and the controller subtracts the worker's clock
offset (estimated at start-up, :func:`clock_offset`; 0 on one machine up to microseconds, and what
keeps the timeline right when a Ray cluster spans machines). The events explain a run
afterwards: which batch trained on which policy version, how long the rollout waited at the
staleness gate, where the stages overlapped. :func:`rlm_course.tools.plots.plot_timelines` draws
them as a Gantt chart, one row per worker (:data:`rlm_course.vocabulary.TIMELINE_STAGES` gives
the stages' drawing order).

Times are seconds; ``version`` is the policy version (the number of optimizer steps behind the
weights) the work used or produced, ``step`` the RL iteration it belongs to (0: none).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace


@dataclass(frozen=True)
class Event:
    """One interval of work on one worker or rank.

    Attributes:
        worker: the worker's name (e.g. ``"rollout/0"``) or a rank (0, 1, ...).
        stage: what kind of work: one of :data:`~rlm_course.vocabulary.TIMELINE_STAGES`,
            ``"communication"`` on a real rank, ``"compute"`` or ``"comm"`` on a simulated one.
        start, end: seconds on the run's shared clock.
        version: the policy version used (generation, scoring) or produced (training).
        step: the RL iteration.
        detail: anything else worth keeping (tokens, bytes).
        name: which piece of work, e.g. the collective ``"tp: all-reduce"`` (may be empty).
    """

    worker: str | int
    stage: str
    start: float
    end: float
    version: int = 0
    step: int = 0
    detail: dict = field(default_factory=dict)
    name: str = ""

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def to_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "Event":
        return Event(**d)


class Recorder:
    """Collects the events of one worker: ``with recorder("training", version=3, step=4): ...``.

    Args:
        worker: the name every event carries.
        clock: a function returning seconds (default ``time.time``, comparable across the
            processes of one machine).
    """

    def __init__(self, worker: str, clock=time.time) -> None:
        self.worker, self.clock = worker, clock
        self.events: list[Event] = []

    @contextmanager
    def __call__(self, stage: str, version: int = 0, step: int = 0, **detail):
        start = self.clock()
        try:
            yield detail  # the body may add entries (e.g. bytes moved) to the event's detail
        finally:
            self.events.append(Event(self.worker, stage, start, self.clock(), version, step,
                                     dict(detail)))

    def add(self, stage: str, start: float, end: float, version: int = 0, step: int = 0,
            **detail) -> None:
        """Record an interval measured elsewhere."""
        self.events.append(Event(self.worker, stage, start, end, version, step, dict(detail)))

    def take(self) -> list[Event]:
        """The events recorded so far (and forget them)."""
        out, self.events = self.events, []
        return out


def clock_offset(remote_clock, local_clock=time.time, probes: int = 5) -> float:
    """Seconds to subtract from ``remote_clock()`` readings to put them on ``local_clock``: the
    remote reading minus the midpoint of the local send and receive times, from the probe with
    the shortest round trip (Cristian's algorithm, Distrib. Comput. 3(3), 1989).

    ``remote_clock`` is a function that asks the other process for its time (e.g. a Ray call).
    """
    best = None
    for _ in range(probes):
        sent = local_clock()
        remote = remote_clock()
        received = local_clock()
        if best is None or received - sent < best[0]:
            best = (received - sent, remote - (sent + received) / 2)
    return best[1]


def shifted(events: list[Event], offset: float) -> list[Event]:
    """``events`` with ``offset`` seconds subtracted from every start and end."""
    return [replace(e, start=e.start - offset, end=e.end - offset) for e in events]


def relative(events: list[Event], origin: float | None = None) -> list[Event]:
    """``events`` on a clock that starts at ``origin`` (default: the first start), sorted by start."""
    if not events:
        return []
    origin = min(e.start for e in events) if origin is None else origin
    return sorted(shifted(events, origin), key=lambda e: (e.start, e.worker))


def busy_seconds(events: list[Event], worker: str | None = None,
                 stages: tuple[str, ...] | None = None) -> float:
    """Seconds during which ``worker`` (every worker if None) ran one of ``stages`` (any stage if
    None): the length of the union of its intervals, so overlapping events count once."""
    spans = sorted((e.start, e.end) for e in events
                   if (worker is None or e.worker == worker)
                   and (stages is None or e.stage in stages))
    total, current = 0.0, None
    for start, end in spans:
        if current is None or start > current[1]:
            if current is not None:
                total += current[1] - current[0]
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    if current is not None:
        total += current[1] - current[0]
    return total


def overlap_seconds(events: list[Event], a: str, b: str) -> float:
    """Seconds during which worker ``a`` and worker ``b`` were both busy: what running them at
    the same time saved."""
    union = busy_seconds([e for e in events if e.worker in (a, b)])
    return busy_seconds(events, a) + busy_seconds(events, b) - union


def span(events: list[Event]) -> float:
    """Seconds from the first start to the last end."""
    return max(e.end for e in events) - min(e.start for e in events) if events else 0.0


def utilisation(events: list[Event]) -> dict[str, float]:
    """Each worker's busy share of the whole span (1: never idle)."""
    total = span(events)
    workers = sorted({e.worker for e in events})
    return {w: busy_seconds(events, w) / total if total else 0.0 for w in workers}
