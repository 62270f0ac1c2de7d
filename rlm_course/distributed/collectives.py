"""Collectives measured on real processes, and the alpha-beta model of chapter 07 fitted to them.

``python -m rlm_course bench collectives`` (:func:`bench_collectives`) times all-reduce,
all-gather, reduce-scatter, broadcast, all-to-all and send/recv over message sizes from 4 B to
64 MiB at 2 and 4 processes, the way nccl-tests does (Jeaugey, NVIDIA nccl-tests,
``doc/PERFORMANCE.md``):

* the **message size** ``S`` is the all-reduce buffer, the all-gather *output*, the reduce-scatter
  *input*, the broadcast buffer, each rank's all-to-all buffer, the send/recv message; sizes that
  do not split into ``p`` equal parts round up;
* each size runs ``warmup`` untimed calls, then ``repeats`` timed ones, each after a barrier; a
  call's time is the slowest rank's (the collective is done when every rank is), the size's time
  the median over repeats;
* **algorithm bandwidth** ``algbw = S / t``; **bus bandwidth** ``busbw = algbw x factor`` with
  the factor of the bytes a rank must move in the bandwidth-optimal algorithm:
  all-reduce ``2 (p-1) / p``, all-gather, reduce-scatter and all-to-all ``(p-1) / p``, broadcast
  and send/recv 1. Bus bandwidth is comparable across collectives and rank counts: it is the
  speed of the links the algorithm keeps busy.

:func:`fit_link` fits a latency ``alpha`` and bandwidth ``beta`` per collective by least squares
(on relative errors, so that 4 B and 64 MiB weigh alike) to ``t = a alpha + b S / beta``, with
the coefficients ``a``, ``b`` taken from :class:`rlm_course.parallel.world.World` itself (ring
all-reduce, all-gather and reduce-scatter, binomial-tree broadcast, pairwise all-to-all, one
message for send/recv). :func:`predicted_seconds` then lets the fitted :class:`Link` drive the
World: predicted against measured time per collective and size (:func:`plot_fit`). Where the
backend runs another algorithm than the World assumes (gloo's reduce-scatter moves as many bytes
as an all-reduce; see the ``wire`` bytes), the fitted ``beta`` absorbs it: it is an *effective*
bandwidth for the World's formula.
"""

from __future__ import annotations

import math
import statistics
import time

import torch
import torch.distributed as dist

from rlm_course.distributed.comm import bytes_sent, wire_bytes
from rlm_course.distributed.launch import RankContext
from rlm_course.cost.comm import Link
from rlm_course.parallel.world import World
from rlm_course.utils import cores

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all",
               "send_recv")
#: 4 B, 16 B, ..., 64 MiB (powers of 4).
SIZES = tuple(4 ** k for k in range(1, 14))
#: The comm kind of :mod:`rlm_course.distributed.comm` each benchmark moves (send/recv: one send).
KIND = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
        "broadcast": "broadcast", "all_to_all": "all_to_all", "send_recv": "send"}


def bus_factor(name: str, p: int) -> float:
    """nccl-tests' bus-bandwidth factor of collective ``name`` on ``p`` ranks.

    Raises:
        ValueError: for an unknown collective.
    """
    if name not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}; choose from {COLLECTIVES}.")
    if name == "all_reduce":
        return 2 * (p - 1) / p
    if name in ("all_gather", "reduce_scatter", "all_to_all"):
        return (p - 1) / p
    return 1.0


def elements(name: str, nbytes: int, p: int, element_size: int = 4) -> int:
    """Elements of the message of ``nbytes`` bytes: at least one, rounded up to a multiple of
    ``p`` for the collectives that split it into ``p`` parts."""
    n = max(1, math.ceil(nbytes / element_size))
    if name in ("all_gather", "reduce_scatter", "all_to_all"):
        n = math.ceil(n / p) * p
    return n


def _operation(name: str, n: int, ctx: RankContext):
    """A callable running collective ``name`` on a message of ``n`` float32 elements."""
    p, rank, device = ctx.world_size, ctx.rank, ctx.device
    x = torch.ones(n, device=device)
    if name == "all_reduce":
        return lambda: dist.all_reduce(x)
    if name == "all_gather":
        shard = torch.ones(n // p, device=device)
        return lambda: dist.all_gather_single(x, shard)
    if name == "reduce_scatter":
        out = torch.empty(n // p, device=device)
        return lambda: dist.reduce_scatter_single(out, x)
    if name == "broadcast":
        return lambda: dist.broadcast(x, 0)
    if name == "all_to_all":
        out = torch.empty(n, device=device)
        return lambda: dist.all_to_all_single(out, x)
    buf = torch.empty(n, device=device)

    def send_recv():  # every rank sends to the next and receives from the previous, at once
        ops = [dist.P2POp(dist.isend, x, (rank + 1) % p), dist.P2POp(dist.irecv, buf, (rank - 1) % p)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    return send_recv


def collectives_worker(ctx: RankContext, names=COLLECTIVES, sizes=SIZES, repeats: int = 5,
                       warmup: int = 2, progress: bool = False) -> dict | None:
    """Time every collective of ``names`` at every size of ``sizes`` (bytes).

    Returns (on rank 0; None elsewhere):
        ``{name: [{"bytes", "seconds", "times", "wire", "ring"}, ...]}``: the message size,
        the median over ``repeats`` of the slowest rank's time, every repeat's time, the bytes
        rank 0 wrote to its sockets per call (``wire``; None off Linux) and the bytes it sends by
        the World's convention (``ring``).
    """
    from tqdm.auto import tqdm

    p = ctx.world_size
    table: dict[str, list[dict]] = {}
    todo = [(name, size) for name in names for size in sizes]
    bar = tqdm(todo, desc=f"collectives on {p} ranks", disable=not (progress and ctx.is_main))
    for name, size in bar:
        n = elements(name, size, p)
        op = _operation(name, n, ctx)
        for _ in range(warmup):
            op()
        dist.barrier()
        before = wire_bytes()
        op()
        after = wire_bytes()
        times = torch.zeros(repeats, dtype=torch.float64)
        for i in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            op()
            times[i] = time.perf_counter() - start
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a call ends when its slowest rank does
        nbytes = 4 * n
        table.setdefault(name, []).append({
            "bytes": nbytes, "seconds": statistics.median(times.tolist()),
            "times": times.tolist(),
            "wire": None if before is None or after is None else after - before,
            "ring": bytes_sent(KIND[name], nbytes, p)[0]})
        del op
    return table if ctx.is_main else None


# ---------------------------------------------------------------------------- the alpha-beta model
def predicted_seconds(name: str, nbytes: int, p: int, link: Link) -> float:
    """Time of collective ``name`` on a message of ``nbytes`` bytes over ``p`` ranks, by
    chapter 07's :class:`~rlm_course.parallel.world.World` with ``link`` (meta tensors: no memory
    is used, whatever the size)."""
    world = World(p, link)
    n = elements(name, nbytes, p, 1)
    t = [torch.empty(n, dtype=torch.uint8, device="meta") for _ in range(p)]
    if name == "all_reduce":
        world.all_reduce(t)
    elif name == "all_gather":
        world.all_gather([x[: n // p] for x in t])
    elif name == "reduce_scatter":
        world.reduce_scatter(t)
    elif name == "broadcast":
        world.broadcast(t[0], 0)
    elif name == "all_to_all":
        world.all_to_all([list(x.chunk(p)) for x in t])
    elif name == "send_recv":
        world.ring_shift(t)
    else:
        raise ValueError(f"unknown collective {name!r}; choose from {COLLECTIVES}.")
    return max(world.clock)


def _coefficients(name: str, nbytes: int, p: int) -> tuple[float, float]:
    """``(a, b S)`` of ``t = a alpha + b S / beta``, read off the World: the time with a unit
    latency and no transfer cost, and with no latency and a unit bandwidth."""
    a = predicted_seconds(name, nbytes, p, Link(alpha=1.0, beta=1e300))
    bs = predicted_seconds(name, nbytes, p, Link(alpha=0.0, beta=1.0))
    return a, bs


def fit_link(name: str, sizes: list[int], seconds: list[float], p: int) -> Link:
    """Least-squares ``alpha`` (s) and ``beta`` (bytes/s) of collective ``name`` on ``p`` ranks
    from measured ``seconds`` at message ``sizes`` (bytes), minimising the squared *relative*
    errors ``sum ((a alpha + b S / beta) / t - 1)^2``, with ``alpha >= 0`` and ``beta > 0``.

    Raises:
        ValueError: for fewer than two sizes, mismatched lists, non-positive times, or times that
            do not grow with size (no bandwidth to fit).
    """
    if len(sizes) != len(seconds) or len(sizes) < 2:
        raise ValueError(f"fit_link({name}): need at least two (size, time) pairs, got "
                         f"{len(sizes)} sizes and {len(seconds)} times.")
    if min(seconds) <= 0:
        raise ValueError(f"fit_link({name}): times must be positive.")
    rows = [_coefficients(name, s, p) for s in sizes]
    a = torch.tensor([[ra / t, rb / t] for (ra, rb), t in zip(rows, seconds)], dtype=torch.float64)
    ones = torch.ones(len(sizes), 1, dtype=torch.float64)

    def residual(x: torch.Tensor) -> float:
        return float(((a @ x.reshape(2, 1)) - ones).square().sum())

    # non-negative least squares in two unknowns: the unconstrained optimum if it is feasible,
    # else the better of the two boundaries (alpha = 0, or no bandwidth term)
    candidates = [torch.linalg.lstsq(a, ones).solution.squeeze(1)]
    candidates.append(torch.cat([torch.zeros(1, dtype=torch.float64),
                                 torch.linalg.lstsq(a[:, 1:], ones).solution.reshape(1)]))
    candidates.append(torch.cat([torch.linalg.lstsq(a[:, :1], ones).solution.reshape(1),
                                 torch.zeros(1, dtype=torch.float64)]))
    feasible = [x for x in candidates if bool((x >= 0).all())]
    alpha, inv_beta = min(feasible, key=residual).tolist()
    if inv_beta <= 0:
        raise ValueError(f"fit_link({name}): the times do not grow with the message size, so "
                         "there is no bandwidth to fit; include larger sizes.")
    return Link(alpha=alpha, beta=1.0 / inv_beta)


def fit_all(tables: dict[int, dict]) -> dict[int, dict[str, Link | None]]:
    """:func:`fit_link` for every collective of ``{p: collectives_worker table}``; None for a
    collective whose times do not grow over the measured sizes (too small to show a bandwidth)."""
    out: dict[int, dict[str, Link | None]] = {}
    for p, table in tables.items():
        out[p] = {}
        for name, rows in table.items():
            try:
                out[p][name] = fit_link(name, [r["bytes"] for r in rows],
                                        [r["seconds"] for r in rows], p)
            except ValueError:
                out[p][name] = None
    return out


def rows_with_model(tables: dict[int, dict], fits: dict[int, dict[str, Link]]) -> list[dict]:
    """Every measurement with its bandwidths and the fitted World's prediction: ``ranks``,
    ``collective``, ``bytes``, ``seconds``, ``algbw``, ``busbw`` (bytes/s), ``predicted``
    (seconds), ``wire_ratio`` (socket bytes over the World's bytes sent; None when unknown)."""
    out = []
    for p, table in tables.items():
        for name, rows in table.items():
            for r in rows:
                algbw = r["bytes"] / r["seconds"]
                out.append({"ranks": p, "collective": name, "bytes": r["bytes"],
                            "seconds": r["seconds"], "algbw": algbw,
                            "busbw": algbw * bus_factor(name, p),
                            "predicted": (None if fits[p][name] is None else
                                          predicted_seconds(name, r["bytes"], p, fits[p][name])),
                            "wire_ratio": (r["wire"] / r["ring"] if r["wire"] is not None
                                           and r["ring"] else None)})
    return out


def _human(nbytes: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def plot_fit(rows: list[dict], path=None, title: str = "collectives: measured (dots) and the "
             "fitted World (lines)"):
    """One panel per rank count: time against message size (log-log), measured points and the
    fitted World's prediction as a line, one colour per collective."""
    from rlm_course.tools.plots import finish_figure, plt

    ranks = sorted({r["ranks"] for r in rows})
    fig, axes = plt.subplots(1, len(ranks), figsize=(5.5 * len(ranks), 4), squeeze=False)
    colors = dict(zip(COLLECTIVES, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, p in zip(axes[0], ranks):
        for name in COLLECTIVES:
            pts = [r for r in rows if r["ranks"] == p and r["collective"] == name]
            if not pts:
                continue
            xs = [r["bytes"] for r in pts]
            ax.loglog(xs, [r["seconds"] for r in pts], "o", ms=4, color=colors[name], label=name)
            if all(r["predicted"] is not None for r in pts):
                ax.loglog(xs, [r["predicted"] for r in pts], "-", color=colors[name], alpha=0.7)
        ax.set(xlabel="message size (bytes)", ylabel="seconds", title=f"{p} processes")
        ax.grid(True, which="major", alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    return finish_figure(fig, path)


def bench_collectives(repeats: int = 5, ranks=(2, 4), sizes=SIZES, names=COLLECTIVES,
                      warmup: int = 2, progress: bool = True, log=print) -> dict:
    """Measure, fit and print (see the module docstring); returns the JSON-able summary:
    ``{"bench", "threads", "fits": {p: {name: {"alpha", "beta"}}}, "bus_bandwidth": {p: {name:
    {bytes: busbw}}}, "peak_bus_bandwidth": {p: {name: best busbw}}, "rows": [...]}``."""
    from rlm_course.distributed.launch import launch

    tables = {}
    for p in ranks:
        with _quiet_oversubscription():
            tables[p] = launch(collectives_worker, p, kwargs=dict(
                names=tuple(names), sizes=tuple(sizes), repeats=repeats, warmup=warmup,
                progress=progress))[0]
    fits = fit_all(tables)
    rows = rows_with_model(tables, fits)
    for p in ranks:
        log("\n" + format_rows(rows, fits, p, repeats, warmup))
    bus = {p: {name: {r["bytes"]: r["busbw"] for r in rows if r["ranks"] == p
                      and r["collective"] == name} for name in names} for p in ranks}
    return {"bench": "collectives", "threads_per_rank": 1, "repeats": repeats,
            "fits": {p: {n: None if link is None else {"alpha": link.alpha, "beta": link.beta}
                         for n, link in f.items()} for p, f in fits.items()},
            "bus_bandwidth": bus,
            "peak_bus_bandwidth": {p: {n: max(v.values()) for n, v in b.items()}
                                   for p, b in bus.items()},
            "rows": rows}


def format_rows(rows: list[dict], fits: dict, p: int, repeats: int = 5, warmup: int = 2) -> str:
    """The measurements and fits of ``p`` ranks as two plain-text tables."""
    from rlm_course.utils import format_table

    note = f"; oversubscribed: {p} ranks > {cores()} cores" if p > cores() else ""
    table = [[r["collective"], _human(r["bytes"]), f"{r['seconds'] * 1e6:,.0f}",
              f"{r['algbw'] / 1e9:.3f}", f"{r['busbw'] / 1e9:.3f}",
              "-" if r["predicted"] is None else f"{r['predicted'] * 1e6:,.0f}",
              "-" if r["wire_ratio"] is None else f"{r['wire_ratio']:.2f}"]
             for r in rows if r["ranks"] == p]
    return "\n".join([
        f"{p} processes (1 thread each{note}), median of {repeats} after {warmup} warm-up calls; "
        "busbw in the nccl-tests convention",
        format_table(table, ["collective", "size", "measured us", "algbw GB/s", "busbw GB/s",
                             "World us", "wire / World bytes"]),
        format_table([[name, "-", "-"] if link is None else
                      [name, f"{link.alpha * 1e6:.1f}", f"{link.beta / 1e9:.3f}"]
                      for name, link in fits[p].items()],
                     ["collective", "fitted alpha us", "fitted beta GB/s"])])


class _quiet_oversubscription:
    """The benchmark says in its header that 4 ranks oversubscribe 2 cores; no warning on top."""

    def __enter__(self):
        import warnings

        from rlm_course.distributed.launch import OversubscriptionWarning

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore", OversubscriptionWarning)

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


# ---------------------------------------------------------------------------- on GPUs
def catalog_links(device: str = "H100-SXM-80GB") -> dict[str, Link]:
    """The two links of a catalog device (:mod:`rlm_course.cost.hardware`) as alpha-beta links:
    ``"intra-node"`` (NVLink / Infinity Fabric, per direction, NCCL's per-step latency) and
    ``"inter-node"`` (one NIC per device).

    Raises:
        ValueError: for an unknown device, or one whose catalog entry has no such links.
    """
    from rlm_course.cost.hardware import get_device

    d = get_device(device)
    if d.intra_node_bandwidth <= 0 or d.inter_node_bandwidth <= 0:
        raise ValueError(f"{device} has no inter-device links in the catalog; choose an "
                         "accelerator (e.g. H100-SXM-80GB).")
    return {"intra-node": Link(d.intra_node_latency, d.intra_node_bandwidth),
            "inter-node": Link(d.inter_node_latency, d.inter_node_bandwidth)}


def gradient_sync(grad_bytes: float, p: int, link: Link, bucket_bytes: float = 25 * 2**20,
                  backward_seconds: float = 0.0) -> dict[str, float]:
    """DDP's gradient all-reduce in buckets, by the World's ring formula, and how much of it the
    backward pass can hide (Li et al. 2020, VLDB, section 3.2.3).

    Buckets of ``bucket_bytes`` (the last one smaller) are each all-reduced once, as soon as the
    backward pass has produced their gradients, so all but the last can overlap with the
    remaining ``backward_seconds`` of compute. Exposed time: ``max(total - backward, last
    bucket)`` (the last bucket starts when the backward pass ends).

    Returns:
        ``{"buckets", "seconds"`` (all buckets, back to back), ``"latency_seconds"`` (the
        ``alpha`` part), ``"exposed_seconds"}``.

    Raises:
        ValueError: for non-positive sizes.
    """
    if grad_bytes <= 0 or bucket_bytes <= 0 or p < 1:
        raise ValueError(f"gradient_sync: grad_bytes={grad_bytes}, bucket_bytes={bucket_bytes} "
                         f"and p={p} must be positive.")
    full, rest = divmod(int(grad_bytes), int(bucket_bytes))
    sizes = [int(bucket_bytes)] * full + ([rest] if rest else [])
    per = [2 * (p - 1) * (link.alpha + b / p / link.beta) for b in sizes]  # ring all-reduce
    total = sum(per)
    return {"buckets": len(sizes), "seconds": total,
            "latency_seconds": 2 * (p - 1) * link.alpha * len(sizes),
            "exposed_seconds": max(total - backward_seconds, per[-1])}
