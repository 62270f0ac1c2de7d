"""A world of ``size`` simulated ranks in one process, with collectives on their tensors.

A "distributed tensor" is a list with one tensor per rank. Each collective returns what every
rank holds afterwards, adds the bytes each rank sends and receives to its counters, and records a
communication event on the timeline of every rank taking part.

**Cost model** (Hockney's alpha-beta; Thakur, Rabenseifner & Gropp 2005, "Optimization of
collective communication operations in MPICH"): a message of ``n`` bytes over a link takes
``alpha + n / beta`` seconds. With ``p`` ranks and ``M`` bytes per rank:

* ring all-reduce: a reduce-scatter then an all-gather, ``2 (p - 1)`` steps of ``M / p`` bytes:
  ``2 (p - 1) (alpha + M / (p beta))``; every rank sends and receives ``2 (p - 1) M / p`` bytes
  (Patarasuk & Yuan 2009: bandwidth-optimal);
* tree all-reduce: a binomial-tree reduce to rank 0, then a binomial-tree broadcast:
  ``2 ceil(log2 p) (alpha + M / beta)``; fewer steps, more bytes per step;
* ring reduce-scatter / all-gather: ``(p - 1) (alpha + M / (p beta))``, ``(p - 1) M / p`` bytes;
* broadcast: binomial tree, ``ceil(log2 p) (alpha + M / beta)``;
* all-to-all: pairwise exchange, ``(p - 1) alpha + (most bytes a rank sends or receives) / beta``;
* ring shift (each rank sends to the next, all at once): ``alpha + M / beta``;
* send/recv: ``alpha + M / beta``.

A collective starts when the last of its ranks is ready (the others wait) and ends for all of
them together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlm_course.cost.comm import (Link, all_gather_seconds, broadcast_seconds, p2p_seconds,
                                  reduce_scatter_seconds, ring_all_reduce_seconds,
                                  tree_all_reduce_seconds)
from rlm_course.timeline import Event
from rlm_course.utils import as_int

ALGORITHMS = ("ring", "tree")  # what a World runs (the cost model's "auto" picks between them)


def nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class World:
    """``size`` ranks joined by identical links.

    Attributes:
        clock: per-rank simulated time (seconds); sent / received: per-rank byte counters;
        events: the timeline.

    Raises:
        ValueError: for ``size < 1`` or an unknown all-reduce algorithm.
    """

    size: int
    link: Link = field(default_factory=Link)
    algorithm: str = "ring"

    def __post_init__(self) -> None:
        self.size = as_int(self.size)  # numpy's integers too
        if not (isinstance(self.size, int) and not isinstance(self.size, bool) and self.size >= 1):
            raise ValueError(f"World size={self.size!r} must be a positive integer (ranks).")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm={self.algorithm!r}: choose one of {ALGORITHMS}.")
        self.reset()

    def reset(self) -> None:
        """Zero the clocks, the byte counters and the timeline."""
        self.clock = [0.0] * self.size
        self.sent = [0] * self.size
        self.received = [0] * self.size
        self.events: list[Event] = []

    # ------------------------------------------------------------------ bookkeeping
    def _ranks(self, ranks) -> list[int]:
        ranks = list(range(self.size)) if ranks is None else [as_int(r) for r in ranks]
        if not ranks or len(set(ranks)) != len(ranks) or not all(
                isinstance(r, int) and not isinstance(r, bool) and 0 <= r < self.size
                for r in ranks):
            raise ValueError(f"ranks {ranks}: need distinct ranks in 0..{self.size - 1}.")
        return ranks

    def _check(self, tensors: list, ranks: list[int], what: str, same: bool = False) -> None:
        if len(tensors) != len(ranks):
            raise ValueError(f"{what}: {len(tensors)} tensors for {len(ranks)} ranks; give one "
                             "per rank.")
        if not same:
            return
        if not all(isinstance(t, Tensor) for t in tensors):
            raise ValueError(f"{what}: give one torch.Tensor per rank, not "
                             f"{sorted({type(t).__name__ for t in tensors})}.")
        if len({(tuple(t.shape), t.dtype) for t in tensors}) != 1:
            raise ValueError(f"{what}: every rank must contribute a tensor of one shape and dtype; "
                             f"got {sorted({(tuple(t.shape), str(t.dtype)) for t in tensors})}.")

    def compute(self, rank: int, name: str, seconds: float) -> None:
        """Advance ``rank``'s clock by ``seconds`` of computation ``name``."""
        if not 0 <= rank < self.size:
            raise ValueError(f"compute {name!r}: rank={rank} is not in 0..{self.size - 1}.")
        if seconds < 0:
            raise ValueError(f"compute {name!r}: seconds={seconds} must be >= 0.")
        start = self.clock[rank]
        self.clock[rank] = start + seconds
        self.events.append(Event(rank, "compute", start, start + seconds, name=name))

    def _communicate(self, name: str, ranks: list[int], seconds: float, sent: dict[int, int],
                     received: dict[int, int]) -> None:
        start = max(self.clock[r] for r in ranks)
        for r in ranks:
            self.sent[r] += sent.get(r, 0)
            self.received[r] += received.get(r, 0)
            self.clock[r] = start + seconds
            self.events.append(Event(r, "comm", start, start + seconds, name=name,
                                     detail={"bytes": sent.get(r, 0) + received.get(r, 0)}))

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, tensors: list[Tensor], ranks=None, name: str = "all-reduce") -> list[Tensor]:
        """Every rank gets the elementwise sum of all ranks' tensors."""
        ranks = self._ranks(ranks)
        self._check(tensors, ranks, name, same=True)
        total = torch.stack(tensors).sum(0)
        p, m = len(ranks), nbytes(tensors[0])
        if p > 1:
            if self.algorithm == "ring":
                each = 2 * (p - 1) * m // p
                seconds = ring_all_reduce_seconds(m, p, self.link)
                sent = received = {r: each for r in ranks}
                self._communicate(name, ranks, seconds, sent, dict(received))
            else:
                down, up = binomial_tree_bytes(ranks, m)  # the broadcast; the reduce mirrors it
                both = {r: down[r] + up[r] for r in ranks}
                self._communicate(name, ranks, tree_all_reduce_seconds(m, p, self.link), both,
                                  dict(both))
        return [total.clone() for _ in ranks]

    def reduce_scatter(self, tensors: list[Tensor], ranks=None,
                       name: str = "reduce-scatter") -> list[Tensor]:
        """Rank ``i`` gets chunk ``i`` (of ``p`` equal chunks of the flattened tensor) of the sum.

        Raises:
            ValueError: if the number of elements does not split into ``p`` equal chunks.
        """
        ranks = self._ranks(ranks)
        self._check(tensors, ranks, name, same=True)
        p, numel = len(ranks), tensors[0].numel()
        if numel % p:
            raise ValueError(f"{name}: {numel} elements do not split into {p} equal shards; pad "
                             "the tensor to a multiple of the group size.")
        total = torch.stack([t.reshape(-1) for t in tensors]).sum(0)
        m = nbytes(tensors[0])
        if p > 1:
            each = (p - 1) * m // p
            self._communicate(name, ranks, reduce_scatter_seconds(m, p, self.link),
                              {r: each for r in ranks}, {r: each for r in ranks})
        return [c.clone() for c in total.chunk(p)]

    def all_gather(self, shards: list[Tensor], ranks=None, name: str = "all-gather") -> list[Tensor]:
        """Every rank gets the concatenation (along dim 0) of all ranks' shards."""
        ranks = self._ranks(ranks)
        self._check(shards, ranks, name)
        if len({tuple(t.shape) for t in shards}) != 1:
            raise ValueError(f"{name}: shards of different shapes {[tuple(t.shape) for t in shards]}; "
                             "every rank must contribute an equal shard.")
        if shards[0].dim() == 0:
            raise ValueError(f"{name}: shards are concatenated along dim 0; give each rank a "
                             "tensor of one or more dimensions (t.reshape(1) for a scalar).")
        full = torch.cat(shards)
        p, shard = len(ranks), nbytes(shards[0])
        if p > 1:
            each = (p - 1) * shard
            self._communicate(name, ranks, all_gather_seconds(shard * p, p, self.link),
                              {r: each for r in ranks}, {r: each for r in ranks})
        return [full.clone() for _ in ranks]

    def broadcast(self, tensor: Tensor, src: int, ranks=None, name: str = "broadcast") -> list[Tensor]:
        """Every rank of ``ranks`` gets ``src``'s tensor (binomial tree rooted at ``src``)."""
        ranks = self._ranks(ranks)
        if src not in ranks:
            raise ValueError(f"{name}: src={src} is not among the ranks {ranks}.")
        p, m = len(ranks), nbytes(tensor)
        if p > 1:
            order = [src] + [r for r in ranks if r != src]
            sent, received = binomial_tree_bytes(order, m)
            self._communicate(name, ranks, broadcast_seconds(m, p, self.link),
                              sent, received)
        return [tensor.clone() for _ in ranks]

    def all_to_all(self, chunks: list[list[Tensor]], ranks=None,
                   name: str = "all-to-all") -> list[list[Tensor]]:
        """Rank ``i`` sends ``chunks[i][j]`` to rank ``j``; returns, for each rank ``j``, the list
        of what it received from every rank ``i`` (its own chunk included)."""
        ranks = self._ranks(ranks)
        self._check(chunks, ranks, name)
        p = len(ranks)
        if any(len(row) != p for row in chunks):
            raise ValueError(f"{name}: each rank must give one chunk per rank ({p}).")
        sent = {r: sum(nbytes(chunks[i][j]) for j in range(p) if j != i)
                for i, r in enumerate(ranks)}
        received = {r: sum(nbytes(chunks[i][j]) for i in range(p) if i != j)
                    for j, r in enumerate(ranks)}
        if p > 1:  # a rank's link carries what it sends and, at the same time, what it receives
            busiest = max(max(sent.values()), max(received.values()))
            seconds = (p - 1) * self.link.alpha + busiest / self.link.beta
            self._communicate(name, ranks, seconds, sent, received)
        return [[chunks[i][j].clone() for i in range(p)] for j in range(p)]

    def ring_shift(self, tensors: list[Tensor], ranks=None, name: str = "ring shift") -> list[Tensor]:
        """Every rank sends its tensor to the next rank of ``ranks`` (the last to the first), all
        transfers at once: rank ``i`` gets what rank ``i - 1`` had."""
        ranks = self._ranks(ranks)
        self._check(tensors, ranks, name)
        p = len(ranks)
        if p > 1:
            sizes = [nbytes(t) for t in tensors]
            self._communicate(name, ranks, p2p_seconds(max(sizes), self.link),
                              {r: sizes[i] for i, r in enumerate(ranks)},
                              {r: sizes[(i - 1) % p] for i, r in enumerate(ranks)})
        return [tensors[(i - 1) % p].clone() for i in range(p)]

    def send(self, tensor: Tensor, src: int, dst: int, name: str = "send/recv") -> Tensor:
        """Point-to-point: ``dst`` receives ``src``'s tensor."""
        ranks = self._ranks([src, dst])
        m = nbytes(tensor)
        self._communicate(name, ranks, p2p_seconds(m, self.link), {src: m}, {dst: m})
        return tensor.clone()


def binomial_tree_bytes(order: list[int], m: int) -> tuple[dict[int, int], dict[int, int]]:
    """Bytes sent and received per rank by a binomial-tree broadcast of ``m`` bytes from
    ``order[0]`` (a reduce to ``order[0]`` mirrors it: swap the two)."""
    sent = {r: 0 for r in order}
    received = {r: 0 for r in order}
    have, step = 1, 1
    while have < len(order):
        for i in range(min(step, len(order) - have)):
            sender, receiver = order[i], order[have + i]
            sent[sender] += m
            received[receiver] += m
        have = min(len(order), have + step)
        step *= 2
    return sent, received


class Mesh:
    """Ranks arranged on named axes, e.g. ``Mesh(world, dp=2, tp=2)``: rank ``r`` has coordinate
    ``c[axis]`` on each axis (the last axis varies fastest), and :meth:`groups` lists the sets of
    ranks that differ only along one axis (e.g. the TP groups).

    Raises:
        ValueError: if the product of the degrees is not the world size, or a degree is < 1.
    """

    def __init__(self, world: World, **degrees: int) -> None:
        degrees = {axis: as_int(d) for axis, d in degrees.items()}  # numpy's integers too
        if not degrees or any(not isinstance(d, int) or isinstance(d, bool) or d < 1
                              for d in degrees.values()):
            raise ValueError(f"mesh degrees {degrees}: give positive integer degrees, e.g. dp=2, tp=2.")
        if math.prod(degrees.values()) != world.size:
            raise ValueError(f"mesh {degrees}: the degrees multiply to {math.prod(degrees.values())}, "
                             f"not the world size {world.size}.")
        self.world, self.degrees = world, dict(degrees)
        self.axes = list(degrees)

    def coordinates(self, rank: int) -> dict[str, int]:
        """``{axis: coordinate}`` of ``rank``, the last axis fastest.

        Raises:
            ValueError: for a rank outside the world.
        """
        if isinstance(rank, bool) or not (isinstance(rank, int) and 0 <= rank < self.world.size):
            raise ValueError(f"rank={rank!r} is not in 0..{self.world.size - 1}.")
        coords, rest = {}, rank
        for axis in reversed(self.axes):
            coords[axis] = rest % self.degrees[axis]
            rest //= self.degrees[axis]
        return {a: coords[a] for a in self.axes}

    def groups(self, axis: str) -> list[list[int]]:
        """The groups of ranks that share every coordinate except ``axis``.

        Raises:
            ValueError: for an unknown axis.
        """
        if axis not in self.degrees:
            raise ValueError(f"unknown mesh axis {axis!r}; the mesh has {self.axes}.")
        groups: dict[tuple, list[int]] = {}
        for rank in range(self.world.size):
            c = self.coordinates(rank)
            key = tuple(c[a] for a in self.axes if a != axis)
            groups.setdefault(key, []).append(rank)
        return list(groups.values())

    def group_of(self, axis: str, rank: int) -> list[int]:
        """The group along ``axis`` that holds ``rank`` (its ranks in coordinate order).

        Raises:
            ValueError: for an unknown axis or a rank outside the world.
        """
        if not 0 <= rank < self.world.size:
            raise ValueError(f"rank={rank} is not in 0..{self.world.size - 1}.")
        return next(g for g in self.groups(axis) if rank in g)

    def subworld(self, axis: str, rank: int) -> "SubWorld":
        """The group along ``axis`` that holds ``rank``, as a world of its own
        (:class:`SubWorld`), its collectives named ``"<axis>: ..."``."""
        return SubWorld(self.world, self.group_of(axis, rank), axis)


class SubWorld:
    """Some ranks of a :class:`World` seen as a world of their own: local rank ``i`` is global
    rank ``ranks[i]``. Its collectives run on the parent (whose clocks, byte counters and timeline
    record them, under the name ``"<label>: <name>"``), and it keeps byte counters of its own, so
    that the traffic of each axis of a :class:`Mesh` can be told apart. Code that runs a
    ``World``'s collectives (e.g. :class:`~rlm_course.parallel.tensor_parallel.TensorParallelBlock`,
    ring attention, expert parallelism, :func:`~rlm_course.parallel.pipeline.run_pipeline`) runs on
    a ``SubWorld`` unchanged; the clock, the events and ``reset`` are the parent's
    (``subworld.parent.events`` for a timeline plot).

    Raises:
        ValueError: for an empty group or ranks that are not distinct ranks of the parent.
    """

    def __init__(self, parent: World, ranks, label: str = "group") -> None:
        self.parent, self.ranks, self.label = parent, parent._ranks(ranks), label
        self.size = len(self.ranks)
        self.link, self.algorithm = parent.link, parent.algorithm
        self.sent = [0] * self.size
        self.received = [0] * self.size

    def _global(self, ranks) -> list[int]:
        local = list(range(self.size)) if ranks is None else list(ranks)
        if not local or not all(0 <= r < self.size for r in local):
            raise ValueError(f"ranks {local}: need local ranks in 0..{self.size - 1}.")
        return [self.ranks[r] for r in local]

    def _run(self, method: str, args: tuple, ranks, name: str, **kwargs):
        before = list(self.parent.sent), list(self.parent.received)
        out = getattr(self.parent, method)(*args, ranks=self._global(ranks),
                                           name=f"{self.label}: {name}", **kwargs)
        for i, g in enumerate(self.ranks):
            self.sent[i] += self.parent.sent[g] - before[0][g]
            self.received[i] += self.parent.received[g] - before[1][g]
        return out

    def all_reduce(self, tensors, ranks=None, name: str = "all-reduce"):
        return self._run("all_reduce", (tensors,), ranks, name)

    def reduce_scatter(self, tensors, ranks=None, name: str = "reduce-scatter"):
        return self._run("reduce_scatter", (tensors,), ranks, name)

    def all_gather(self, shards, ranks=None, name: str = "all-gather"):
        return self._run("all_gather", (shards,), ranks, name)

    def all_to_all(self, chunks, ranks=None, name: str = "all-to-all"):
        return self._run("all_to_all", (chunks,), ranks, name)

    def ring_shift(self, tensors, ranks=None, name: str = "ring shift"):
        return self._run("ring_shift", (tensors,), ranks, name)

    def broadcast(self, tensor, src: int, ranks=None, name: str = "broadcast"):
        return self._run("broadcast", (tensor, self._global([src])[0]), ranks, name)

    def send(self, tensor, src: int, dst: int, name: str = "send/recv"):
        before = list(self.parent.sent), list(self.parent.received)
        g_src, g_dst = self._global([src, dst])
        out = self.parent.send(tensor, g_src, g_dst, name=f"{self.label}: {name}")
        for i, g in enumerate(self.ranks):
            self.sent[i] += self.parent.sent[g] - before[0][g]
            self.received[i] += self.parent.received[g] - before[1][g]
        return out

    def compute(self, rank: int, name: str, seconds: float) -> None:
        self.parent.compute(self._global([rank])[0], name, seconds)
