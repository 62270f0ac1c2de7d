"""Pipeline parallelism: the layers split into stages on ``p`` devices, the batch into ``m``
micro-batches, and a schedule that says what each device does when.

Schedules are explicit tables: for each device, the ordered list of ``(kind, micro_batch,
chunk)`` with kind ``"F"`` (forward) or ``"B"`` (backward):

* **GPipe** (Huang et al. 2019, arXiv:1811.06965): all forwards, then all backwards;
* **1F1B** (PipeDream-Flush; Narayanan et al. 2021, arXiv:2104.04473, section 2.2.1): device
  ``d`` runs ``p - d - 1`` warm-up forwards, then alternates one forward and one backward, then
  drains; at most ``p`` micro-batches' activations live at once instead of ``m``;
* **interleaved 1F1B** (same paper, section 2.2.2): each device holds ``v`` model chunks
  (virtual stages ``chunk * p + device``), so a micro-batch crosses every device ``v`` times.

:func:`simulate` runs a table on a timeline (a forward of one chunk takes ``t_f / v``, a backward
``t_b / v``; a task starts when its device is free and its input is ready). The bubble it measures
agrees with ``(p - 1) / (m + p - 1)`` of the time for GPipe and 1F1B, and with
``(p - 1) / (v m)`` of the ideal time for the interleaved schedule, when moving activations takes
no time (``t_comm = 0``; communication lengthens every hop). :func:`run_pipeline` executes a
table on the tiny transformer's blocks and gives the single-device gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor, nn

from rlm_course.utils import as_int, is_real

SCHEDULES = ("gpipe", "1f1b", "interleaved")


def schedule_table(name: str, stages: int, micro_batches: int,
                   chunks: int = 1) -> list[list[tuple[str, int, int]]]:
    """The order of work on each of ``stages`` devices: ``table[d]`` lists
    ``(kind, micro_batch, chunk)``.

    Raises:
        ValueError: for an unknown schedule, non-positive sizes, ``chunks > 1`` without the
            interleaved schedule, or (interleaved) micro-batches that are not a multiple of the
            number of devices.
    """
    p, m, v = _check_schedule(name, stages, micro_batches, chunks)
    if name == "gpipe":
        return [[("F", i, 0) for i in range(m)] + [("B", i, 0) for i in reversed(range(m))]
                for _ in range(p)]
    if name == "1f1b":
        return one_f_one_b(p, m)
    total = m * v

    def forward_task(k: int) -> tuple[str, int, int]:
        chunk = (k // p) % v
        return "F", (k // (p * v)) * p + k % p, chunk

    def backward_task(k: int) -> tuple[str, int, int]:
        chunk = v - 1 - (k // p) % v
        return "B", (k // (p * v)) * p + k % p, chunk

    table = []
    for d in range(p):
        warmup = min((p - d - 1) * 2 + (v - 1) * p, total)
        order = [forward_task(k) for k in range(warmup)]
        f, b = warmup, 0
        while f < total:
            order += [forward_task(f), backward_task(b)]
            f, b = f + 1, b + 1
        order += [backward_task(k) for k in range(b, total)]
        table.append(order)
    return table


def _check_schedule(name: str, stages, micro_batches, chunks) -> tuple[int, int, int]:
    """``(p, m, v)`` as Python ints, or the ValueError of a schedule no table runs."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; choose one of {SCHEDULES}.")
    p, m, v = (as_int(x) for x in (stages, micro_batches, chunks))  # numpy's integers too
    for label, value in (("stages", p), ("micro_batches", m), ("chunks", v)):
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise ValueError(f"{label}={value!r} must be a positive integer.")
    if name != "interleaved" and v != 1:
        raise ValueError(f"{name} runs one chunk per device; chunks={v} needs the interleaved "
                         "schedule.")
    if name == "interleaved" and m % p:
        raise ValueError(f"the interleaved schedule needs micro_batches ({m}) to be a multiple of "
                         f"the pipeline devices ({p}).")
    return p, m, v


def one_f_one_b(stages: int, micro_batches: int) -> list[list[tuple[str, int, int]]]:
    """The 1F1B (PipeDream-Flush) table: device ``d`` runs ``min(p - d - 1, m)`` warm-up
    forwards, then alternates one forward and one backward (oldest micro-batch first) until every
    forward has run, then the remaining backwards. Entries are ``(kind, micro_batch, 0)``."""
    # BEGIN SOLUTION: per device: the warm-up forwards, then pairs (forward of the next micro-batch, backward of the oldest), then the backwards that are left
    table = []
    for d in range(stages):
        warmup = min(stages - d - 1, micro_batches)
        order = [("F", i, 0) for i in range(warmup)]
        f, b = warmup, 0
        while f < micro_batches:
            order += [("F", f, 0), ("B", b, 0)]
            f, b = f + 1, b + 1
        order += [("B", i, 0) for i in range(b, micro_batches)]
        table.append(order)
    return table
    # END SOLUTION


@dataclass
class Timeline:
    """Result of :func:`simulate`: per device the ``(kind, micro_batch, chunk, start, end)``
    tasks, the makespan, and the bubble (idle) fraction."""

    tasks: list[list[tuple[str, int, int, float, float]]]
    makespan: float
    busy: float

    @property
    def bubble_fraction(self) -> float:
        """Idle share of the devices' time: ``1 - busy / (p x makespan)`` (0 for an empty run)."""
        if self.makespan == 0:
            return 0.0
        return 1 - self.busy / (len(self.tasks) * self.makespan)

    def peak_in_flight(self, device: int) -> int:
        """Most micro-batch chunks whose forward has run on ``device`` and whose backward has not:
        the activations it must hold at once (GPipe: all ``m``; 1F1B: at most ``p``)."""
        live = peak = 0
        for kind, *_ in self.tasks[device]:
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        return peak


def _check_table(table) -> None:
    """A table runs each micro-batch's forward and backward of each chunk once on every device:
    entries ``(kind, micro_batch, chunk)`` with kind 'F' or 'B' and integers >= 0, and for
    ``m`` micro-batches and ``v`` chunks (one more than the largest of each), every device lists
    the ``2 m v`` tasks exactly once."""
    if not table or not all(table):
        raise ValueError("a schedule table needs at least one device with tasks.")
    entries = [e for order in table for e in order]
    bad = next((e for e in entries if not (isinstance(e, tuple) and len(e) == 3
                                           and all(isinstance(x, int) and not isinstance(x, bool)
                                                   and x >= 0 for x in e[1:]))), None)
    if bad is not None:
        raise ValueError(f"schedule entry {bad!r}: give (kind, micro_batch, chunk) with integers "
                         ">= 0, e.g. ('F', 0, 0).")
    kinds = {kind for kind, _, _ in entries}
    if not kinds <= {"F", "B"}:
        raise ValueError(f"unknown task kinds {sorted(map(str, kinds - {'F', 'B'}))}: use 'F' and "
                         "'B'.")
    m = 1 + max(mb for _, mb, _ in entries)
    v = 1 + max(chunk for _, _, chunk in entries)
    every = {(kind, mb, chunk) for kind in "FB" for mb in range(m) for chunk in range(v)}
    for d, order in enumerate(table):
        if len(order) != len(every) or set(order) != every:
            missing = sorted(every - set(order))
            twice = sorted({e for e in order if order.count(e) > 1})
            raise ValueError(f"device {d}'s schedule must run each of the {m} micro-batches' "
                             f"forward and backward of each of the {v} chunks once"
                             + (f"; missing {missing[:3]}" if missing else "")
                             + (f"; repeated {twice[:3]}" if twice else "") + ".")


def walk_schedule(table: list[list[tuple[str, int, int]]], step) -> None:
    """Run every device's tasks in table order: sweep the devices, letting each run its next task
    when ``step(device, kind, micro_batch, chunk, virtual_stage)`` says it could (returns True).

    Raises:
        ValueError: if a sweep makes no progress (the table deadlocks).
    """
    p = len(table)
    position = [0] * p
    remaining = sum(len(o) for o in table)
    while remaining:
        progressed = False
        for d in range(p):
            if position[d] == len(table[d]):
                continue
            kind, mb, chunk = table[d][position[d]]
            if step(d, kind, mb, chunk, chunk * p + d):
                position[d] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise ValueError("the schedule deadlocks: some device waits for work that never runs.")


def simulate(table: list[list[tuple[str, int, int]]], t_forward: float = 1.0,
             t_backward: float = 2.0, t_comm: float = 0.0) -> Timeline:
    """Run a schedule table on a timeline.

    A forward of virtual stage ``j = chunk * p + device`` needs the forward of ``j - 1`` (plus
    ``t_comm`` to move the activations); a backward needs the backward of ``j + 1`` (plus
    ``t_comm``) and its own forward. Each task starts when its device is free and its inputs are
    ready. Durations are per device for the whole model slice: a chunk takes ``1 / v`` of them.

    Raises:
        ValueError: if the table deadlocks (a device waits for a task that can never run).
    """
    _check_table(table)
    for label, value in (("t_forward", t_forward), ("t_backward", t_backward), ("t_comm", t_comm)):
        if not (is_real(value) and 0 <= value < math.inf):  # NaN too
            raise ValueError(f"simulate: {label}={value!r} must be a finite number >= 0.")
    p = len(table)
    v = 1 + max(c for order in table for _, _, c in order)
    last = p * v - 1
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * p
    tasks: list[list] = [[] for _ in range(p)]

    def step(d, kind, mb, chunk, j) -> bool:
        if kind == "F":
            deps = [("F", mb, j - 1)] if j > 0 else []
            duration = t_forward / v
        else:
            deps = [("F", mb, j)] + ([("B", mb, j + 1)] if j < last else [])
            duration = t_backward / v
        if any(dep not in done for dep in deps):
            return False
        # activations and gradients cross a link only between devices: with one device the
        # chunks of an interleaved schedule hand them over in place
        ready = max([free[d]] + [done[dep] + (t_comm if dep[2] % p != d else 0.0)
                                 for dep in deps])
        done[(kind, mb, j)] = free[d] = ready + duration
        tasks[d].append((kind, mb, chunk, ready, ready + duration))
        return True

    walk_schedule(table, step)
    makespan = max(free)
    busy = sum(end - start for order in tasks for *_, start, end in order)
    return Timeline(tasks, makespan, busy)


def bubble_formula(name: str, stages: int, micro_batches: int, chunks: int = 1) -> float:
    """The textbook bubble: idle fraction ``(p - 1) / (m + p - 1)`` for GPipe and 1F1B; for the
    interleaved schedule the bubble time is ``(p - 1) / (v m)`` of the ideal time, an idle
    fraction of ``(p - 1) / (v m + p - 1)`` (Narayanan et al. 2021, section 2.2).

    Raises:
        ValueError: for what :func:`schedule_table` refuses (an unknown schedule, sizes that
            are not positive integers, chunks without the interleaved schedule, interleaved
            micro-batches that are not a multiple of the devices).
    """
    p, m, v = _check_schedule(name, stages, micro_batches, chunks)
    return (p - 1) / (v * m + p - 1) if name == "interleaved" else (p - 1) / (m + p - 1)


def run_pipeline(layers: list[nn.Module], table: list[list[tuple[str, int, int]]],
                 micro_batches: list[Tensor], loss_fn, world=None) -> list[float]:
    """Execute a schedule on real modules: ``layers`` split evenly into ``p x v`` virtual
    stages, each forward/backward run in table order with activations handed between stages.
    Gradients accumulate in the modules as in one device's step on the whole batch:
    ``loss_fn(output, target)`` must be a mean over the micro-batch's rows, and each micro-batch's
    loss is weighted by its share of the batch's rows (``rows_i / rows``; ``1 / m`` for equal
    micro-batches), so micro-batches of unequal sizes give the whole batch's mean gradient too.
    Returns the micro-batch losses (each its own mean). With a ``world`` of
    ``p`` ranks, every activation sent forward and every gradient sent back between devices is a
    counted send/recv: ``2 x (p v - 1) x m`` messages of one micro-batch's activations.

    Raises:
        ValueError: if the layers do not split evenly into the virtual stages.
    """
    _check_table(table)
    p = len(table)
    v = 1 + max(c for order in table for _, _, c in order)
    stages = p * v
    needed = 1 + max(mb for order in table for _, mb, _ in order)
    if len(micro_batches) != needed:
        raise ValueError(f"the schedule runs {needed} micro-batches; {len(micro_batches)} given.")
    for i, mb in enumerate(micro_batches):
        if not (isinstance(mb, (tuple, list)) and len(mb) == 2 and isinstance(mb[0], Tensor)
                and mb[0].dim() >= 1 and len(mb[0]) >= 1):
            raise ValueError(f"micro_batches[{i}] must be an (input, target) pair whose input has "
                             "one or more rows, e.g. (x[:4], y[:4]); a bare tensor would be read "
                             "as the pair of its first two rows.")
    if world is not None and world.size != p:
        raise ValueError(f"the world has {world.size} ranks for a {p}-device schedule; use "
                         f"World({p}).")
    if len(layers) % stages:
        raise ValueError(f"{len(layers)} layers do not split evenly into {stages} pipeline stages "
                         f"({p} devices x {v} chunks); choose a divisor of the layer count.")
    per = len(layers) // stages
    parts = [nn.Sequential(*layers[j * per:(j + 1) * per]) for j in range(stages)]
    m = len(micro_batches)
    rows = [len(mb[0]) for mb in micro_batches]
    weights = [r / sum(rows) for r in rows]  # the whole batch's mean = sum of weighted means
    inputs: dict[tuple[int, int], Tensor] = {}
    outputs: dict[tuple[int, int], Tensor] = {}
    grads: dict[tuple[int, int], Tensor] = {}
    losses: dict[int, float] = {}

    def step(d, kind, mb, chunk, j) -> bool:
        if kind == "F":
            if j > 0 and (mb, j - 1) not in outputs:
                return False
            x = micro_batches[mb][0] if j == 0 else outputs[(mb, j - 1)].detach()
            if world is not None and j > 0 and (j - 1) % p != d:
                world.send(x, (j - 1) % p, d, name="send activations")
            x = x.requires_grad_(j > 0)
            inputs[(mb, j)] = x
            out = parts[j](x)
            if j == stages - 1:
                loss = loss_fn(out, micro_batches[mb][1])
                losses[mb] = loss.item()
                out = loss * weights[mb]
            outputs[(mb, j)] = out
            return True
        if j < stages - 1 and (mb, j) not in grads:
            return False
        out = outputs.pop((mb, j))
        if j == stages - 1:
            out.backward()
        else:
            out.backward(grads.pop((mb, j)))
        if j > 0:
            grads[(mb, j - 1)] = inputs[(mb, j)].grad
            if world is not None and (j - 1) % p != d:
                world.send(grads[(mb, j - 1)], d, (j - 1) % p, name="send gradients")
        inputs.pop((mb, j))
        return True

    walk_schedule(table, step)
    return [losses[i] for i in range(m)]
