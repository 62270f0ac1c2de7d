"""Count and time what really goes over a process group.

Three measurements, from the most logical to the most physical:

* :class:`CommCounter` (a ``TorchDispatchMode``, the mechanism of torch's own ``CommDebugMode``)
  sees every collective and point-to-point call that reaches the dispatcher: the ``c10d`` ops
  that ``torch.distributed`` calls (also those DDP's C++ reducer issues during backward) and the
  functional collectives of DTensor, tensor and pipeline parallelism. It records each call's kind,
  message size ``M`` (the nccl-tests convention: the all-reduce buffer, the all-gather *output*,
  the reduce-scatter *input*, the broadcast buffer, the all-to-all buffer, the point-to-point
  message) and group size, and converts it to the bytes this rank sends and receives with the
  same ring and tree conventions as the simulated ranks of :mod:`rlm_course.parallel.world`
  (:func:`bytes_sent`), so that a real run and a simulated one can be compared number for number.
* :func:`comm_seconds` reads the communication intervals from a ``torch.profiler`` trace: the
  ``gloo:*`` (or ``nccl:*``) records of the time the backend spends on each call, including
  waiting for slower peers; their union is the communication time of a step.
* :func:`wire_bytes` reads the bytes this process has handed to the operating system for writing
  (``wchar`` of ``/proc/self/io``, Linux): around a step with no file or console output, that is
  what gloo wrote to its TCP sockets, headers included. It shows which algorithm the backend
  really ran (e.g. whether a reduce-scatter moved ``(p-1)/p`` of its input, or a whole all-reduce).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: The dispatcher ops of each kind of communication (``c10d``: torch.distributed's calls;
#: ``_c10d_functional``: the functional collectives of DTensor and friends).
KINDS = {
    "all_reduce": ("c10d.allreduce_", "c10d.allreduce_coalesced_", "_c10d_functional.all_reduce",
                   "_c10d_functional.all_reduce_", "_c10d_functional.all_reduce_coalesced",
                   "_c10d_functional.all_reduce_coalesced_"),
    "all_gather": ("c10d._allgather_base_", "c10d.allgather_", "c10d.allgather_coalesced_",
                   "c10d.allgather_into_tensor_coalesced_",
                   "_c10d_functional.all_gather_into_tensor",
                   "_c10d_functional.all_gather_into_tensor_out",
                   "_c10d_functional.all_gather_into_tensor_coalesced"),
    "reduce_scatter": ("c10d._reduce_scatter_base_", "c10d.reduce_scatter_",
                       "c10d.reduce_scatter_tensor_coalesced_",
                       "_c10d_functional.reduce_scatter_tensor",
                       "_c10d_functional.reduce_scatter_tensor_coalesced"),
    "broadcast": ("c10d.broadcast_", "_c10d_functional.broadcast", "_c10d_functional.broadcast_"),
    "all_to_all": ("c10d.alltoall_", "c10d.alltoall_base_", "_c10d_functional.all_to_all_single",
                   "_c10d_functional_autograd.all_to_all_single"),
    "send": ("c10d.send",),
    "recv": ("c10d.recv_", "c10d.recv_any_source_"),
    "gather": ("c10d.gather_",),
    "scatter": ("c10d.scatter_",),
    "reduce": ("c10d.reduce_",),
}
_KIND_OF = {op: kind for kind, ops in KINDS.items() for op in ops}


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    return []


def _nbytes(obj) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(obj))


def _binomial_tree_sent(p: int, position: int, m: int) -> tuple[int, int]:
    """Bytes sent and received by the rank at ``position`` of a binomial-tree broadcast of ``m``
    bytes whose root is position 0 (the convention of :mod:`rlm_course.parallel.world`)."""
    from rlm_course.parallel.world import binomial_tree_bytes

    sent, received = binomial_tree_bytes(list(range(p)), m)
    return sent[position], received[position]


def bytes_sent(kind: str, nbytes: int, group_size: int, position: int = 0) -> tuple[int, int]:
    """Bytes one rank sends and receives for one call, by the conventions of
    :class:`rlm_course.parallel.world.World` (ring all-reduce, ring all-gather and reduce-scatter,
    binomial-tree broadcast, pairwise all-to-all).

    Args:
        kind: one of :data:`KINDS`; nbytes: the message size ``M`` (see the module docstring);
        group_size: ``p``; position: the rank's distance from the root (broadcast, scatter,
            gather, reduce), 0 for the root.

    Returns:
        ``(sent, received)`` in bytes: all-reduce ``2 (p-1) M / p`` each way, all-gather and
        reduce-scatter ``(p-1) M / p``, all-to-all ``(p-1) M / p`` (equal splits), send ``M`` out,
        recv ``M`` in.

    Raises:
        ValueError: for an unknown kind.
    """
    p, m = group_size, nbytes
    if kind not in KINDS:
        raise ValueError(f"unknown communication kind {kind!r}; known: {sorted(KINDS)}.")
    if p <= 1 and kind not in ("send", "recv"):
        return 0, 0
    if kind == "all_reduce":
        each = 2 * (p - 1) * m // p
        return each, each
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        each = (p - 1) * m // p
        return each, each
    if kind == "send":
        return m, 0
    if kind == "recv":
        return 0, m
    if kind in ("broadcast", "scatter"):
        return _binomial_tree_sent(p, position, m)
    received, sent = _binomial_tree_sent(p, position, m)  # gather, reduce: a broadcast reversed
    return sent, received


@dataclass
class Call:
    """One communication call seen by :class:`CommCounter`: ``kind`` (see :data:`KINDS`), the
    dispatcher ``op``, message size ``nbytes`` (bytes), ``group_size``, and this rank's ``sent``
    and ``received`` bytes by the ring/tree conventions (:func:`bytes_sent`)."""

    kind: str
    op: str
    nbytes: int
    group_size: int
    sent: int
    received: int


class CommCounter(TorchDispatchMode):
    """Records every communication call made while it is active::

        with CommCounter() as comm:
            loss.backward()
        comm.sent, comm.totals()

    It sees the calls of this process only (each rank counts its own) and of every thread that
    inherits the mode (the autograd engine's, where DDP and FSDP communicate during backward).
    Tensor-subclass ops (DTensor) are first handed to the subclass, so the collectives it issues
    are counted, not the ops that caused them.

    Attributes:
        calls: the :class:`Call` s in order.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Call] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **kwargs)
        if any(t is not torch.Tensor for t in types):
            return NotImplemented  # let a tensor subclass (DTensor) turn the op into collectives
        out = func(*args, **kwargs)
        name = f"{func.namespace}.{func._overloadpacket.__name__}"
        kind = _KIND_OF.get(name)
        if kind is not None:
            self.calls.append(_describe(kind, name, args, kwargs))
        return out

    @property
    def sent(self) -> int:
        """Bytes this rank sent over all calls (ring/tree conventions)."""
        return sum(c.sent for c in self.calls)

    @property
    def received(self) -> int:
        return sum(c.received for c in self.calls)

    def totals(self) -> dict[str, dict[str, int]]:
        """``{kind: {"calls", "nbytes", "sent"}}`` summed over the calls of each kind."""
        out: dict[str, dict[str, int]] = {}
        for c in self.calls:
            entry = out.setdefault(c.kind, {"calls": 0, "nbytes": 0, "sent": 0})
            entry["calls"] += 1
            entry["nbytes"] += c.nbytes
            entry["sent"] += c.sent
        return out


def _group(args, kwargs, name: str):
    """``(group_size, rank_in_group)`` of a call: from its ProcessGroup argument (``c10d`` ops) or
    its group name (functional collectives)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    for a in list(args) + list(kwargs.values()):
        if isinstance(a, dist.ProcessGroup):
            return a.size(), a.rank()
    if name.startswith("_c10d_functional"):
        group_name = kwargs.get("group_name", args[-1])
        pg = _resolve_process_group(group_name)
        return pg.size(), pg.rank()
    return dist.get_world_size(), dist.get_rank()


def _describe(kind: str, name: str, args, kwargs) -> Call:
    p, rank = _group(args, kwargs, name)
    position = 0
    if name.startswith("c10d."):
        first = args[0]
        if kind == "all_gather":
            m = _nbytes(first)  # the gathered output
        elif kind == "reduce_scatter":
            m = _nbytes(args[1])  # the full input
        elif kind == "all_to_all":
            m = _nbytes(args[1])  # this rank's input buffer
        elif kind in ("broadcast", "scatter", "gather", "reduce"):
            m = _nbytes(first)
            root = args[2] if kind == "broadcast" else None
            if isinstance(root, int):
                position = (rank - root) % p
        else:
            m = _nbytes(first)
    else:
        first = args[0]
        if kind == "all_gather":
            m = _nbytes(first) * p  # the functional op takes the shard
        else:
            m = _nbytes(first)
    sent, received = bytes_sent(kind, m, p, position)
    return Call(kind, name, m, p, sent, received)


# ---------------------------------------------------------------------------- time and wire bytes
COMM_EVENT_PREFIXES = ("gloo:", "nccl:")


def comm_intervals(profiler) -> list[tuple[float, float]]:
    """``(start, end)`` in seconds of every backend communication record (``gloo:*``,
    ``nccl:*``) of a finished ``torch.profiler.profile``, sorted by start."""
    spans = []
    # the raw records (building profiler.events() would cost seconds per trace)
    for event in profiler.profiler.kineto_results.events():
        if event.name().startswith(COMM_EVENT_PREFIXES):
            start = event.start_ns() / 1e9
            spans.append((start, start + event.duration_ns() / 1e9))
    return sorted(spans)


def union_seconds(spans: list[tuple[float, float]]) -> float:
    """Length of the union of intervals (overlapping calls, e.g. on two gloo threads, count once)."""
    total, end = 0.0, -math.inf
    for start, stop in sorted(spans):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


@contextmanager
def profiled():
    """``torch.profiler.profile`` of CPU activities, without the profiler's start/stop lines on
    stderr; yields the profiler (read it after the block, e.g. with :func:`comm_seconds`)."""
    from torch.profiler import ProfilerActivity, profile

    from rlm_course.cost.profiling import native_stderr_silenced

    prof = profile(activities=[ProfilerActivity.CPU])
    with native_stderr_silenced():
        prof.__enter__()
    try:
        yield prof
    finally:
        with native_stderr_silenced():
            prof.__exit__(None, None, None)


def comm_seconds(profiler) -> float:
    """Seconds this rank's backend spent communicating during a profiled region: the union of its
    ``gloo:*``/``nccl:*`` records (time on the wire plus time waiting for slower peers)."""
    return union_seconds(comm_intervals(profiler))


def wire_bytes() -> int | None:
    """Bytes this process has passed to ``write``-like system calls so far (``wchar`` of
    ``/proc/self/io``); None where the OS does not report it (not Linux). The difference around a
    step with no file or console output is what the backend wrote to its sockets."""
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None
