"""Two collectives written by hand on a real process group (chapter 11's exercises): a ring
all-reduce from send/recv, and DDP's gradient bucketing.

* :func:`ring_all_reduce`: the bandwidth-optimal ring (Patarasuk & Yuan 2009, "Bandwidth optimal
  all-reduce algorithms for clusters of workstations"; the algorithm chapter 07's
  :class:`~rlm_course.parallel.world.World` counts): a reduce-scatter then an all-gather, each
  ``p - 1`` steps in which every rank sends one ``1/p`` chunk to its right neighbour and receives
  one from its left, so every rank sends ``2 (p - 1) / p`` of the tensor.
* :func:`bucketed_all_reduce`: what ``DistributedDataParallel`` does with the gradients (Li et al.
  2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training", VLDB,
  section 3.2.3): pack consecutive gradients into flat buckets of about ``bucket_bytes``,
  all-reduce each bucket once (fewer, larger messages: ``alpha`` is paid per bucket, not per
  tensor), and copy the averaged values back. DDP launches each bucket as soon as its gradients
  are ready, so communication overlaps the rest of the backward pass.

:func:`exercise_worker` runs the exercise checks on real ranks (see
:mod:`rlm_course.tools.checks`).
"""

from __future__ import annotations

import importlib.util
import math

import torch
from torch import Tensor

from rlm_course.distributed.launch import RankContext


def exchange(send: Tensor, recv: Tensor, dst: int, src: int, group=None) -> None:
    """Send ``send`` to rank ``dst`` and receive into ``recv`` from rank ``src`` (ranks within
    ``group``) at the same time, and wait for both. Posting both before waiting is what keeps a
    ring from deadlocking: every rank sends and receives in the same step."""
    dist = torch.distributed
    ops = [dist.P2POp(dist.isend, send, group=group, group_peer=dst),
           dist.P2POp(dist.irecv, recv, group=group, group_peer=src)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def ring_all_reduce(tensor: Tensor, group=None) -> Tensor:
    """Sum ``tensor`` over the ranks of ``group`` (default: all), in place, with a ring of
    send/recv, and return it.

    Cut the flattened tensor into ``p`` chunks (``tensor_split``: sizes may differ by one).
    **Reduce-scatter**, ``p - 1`` steps: at step ``s`` rank ``r`` sends chunk ``(r - s) mod p`` to
    rank ``r + 1`` and adds what it receives from rank ``r - 1`` into chunk ``(r - s - 1) mod p``;
    afterwards rank ``r`` holds the complete sum of chunk ``(r + 1) mod p``. **All-gather**,
    ``p - 1`` steps: at step ``s`` rank ``r`` sends chunk ``(r - s + 1) mod p`` and overwrites
    chunk ``(r - s) mod p`` with what it receives. Each rank sends ``2 (p - 1)`` chunks:
    ``2 (p - 1) / p`` of the tensor's bytes.

    Args:
        tensor: any shape, contiguous; the same shape and dtype on every rank.
        group: a process group (None: the default group).

    Returns:
        ``tensor``, now holding the sum over the ranks.

    Raises:
        ValueError: for a non-contiguous tensor.
    """
    if not tensor.is_contiguous():
        raise ValueError("ring_all_reduce: the tensor must be contiguous (call .contiguous()).")
    rank = torch.distributed.get_rank(group)
    p = torch.distributed.get_world_size(group)
    chunks = tensor.view(-1).tensor_split(p)
    right, left = (rank + 1) % p, (rank - 1) % p
    # BEGIN SOLUTION: p - 1 reduce-scatter steps (exchange one chunk with the neighbours, add what arrives into the matching chunk), then p - 1 all-gather steps (exchange, overwrite); use exchange(send, recv, right, left, group)
    for step in range(p - 1):
        send, recv = (rank - step) % p, (rank - step - 1) % p
        incoming = torch.empty_like(chunks[recv])
        exchange(chunks[send], incoming, right, left, group)
        chunks[recv].add_(incoming)
    for step in range(p - 1):
        send, recv = (rank - step + 1) % p, (rank - step) % p
        exchange(chunks[send], chunks[recv], right, left, group)
    # END SOLUTION
    return tensor


def bucketed_all_reduce(grads: list[Tensor], bucket_bytes: int, group=None) -> list[int]:
    """Average ``grads`` over the ranks of ``group`` in place, in buckets, as DDP does.

    Walk the gradients in the order given, adding each to the current bucket unless that would
    take the bucket past ``bucket_bytes`` (then start a new one; a gradient larger than ``bucket_bytes``
    fills a bucket alone). For each bucket: flatten its gradients into one tensor
    (``torch.cat`` of ``reshape(-1)``), all-reduce it once (sum), divide by the number of ranks,
    and copy each slice back into its gradient.

    DDP itself walks the parameters in *reverse* order (the order backward produces their
    gradients, so the first bucket can start while backward continues), and its first bucket is
    capped at 1 MiB (``torch.distributed``'s ``_DEFAULT_FIRST_BUCKET_BYTES``) so that
    communication starts early; ``bucket_cap_mb`` (25 MB by default) applies to the others. Pass
    ``grads`` reversed to walk them as DDP does.

    Args:
        grads: gradients (any shapes, one dtype), the same shapes on every rank.
        bucket_bytes: the bucket cap in bytes (DDP's ``bucket_cap_mb``, default 25 MB).
        group: a process group (None: the default group).

    Returns:
        The size in bytes of each bucket, in order (one all-reduce each).

    Raises:
        ValueError: for ``bucket_bytes <= 0`` or gradients of several dtypes.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes={bucket_bytes}: give a positive bucket size in bytes.")
    if len({g.dtype for g in grads}) > 1:
        raise ValueError("bucketed_all_reduce: gradients of several dtypes do not share a flat "
                         "bucket; bucket each dtype separately.")
    p = torch.distributed.get_world_size(group)
    # BEGIN SOLUTION: group consecutive gradients into buckets of at most bucket_bytes; per bucket torch.cat the flattened gradients, torch.distributed.all_reduce it (group=group), divide by p, copy the slices back; return the buckets' byte sizes
    buckets, current, size = [], [], 0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(g)
        size += nbytes
    if current:
        buckets.append(current)
    sizes = []
    for bucket in buckets:
        flat = torch.cat([g.reshape(-1) for g in bucket])
        torch.distributed.all_reduce(flat, group=group)
        flat.div_(p)
        offset = 0
        for g in bucket:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        sizes.append(flat.numel() * flat.element_size())
    return sizes
    # END SOLUTION


# ---------------------------------------------------------------------------- checks on real ranks
def _load(path: str, name: str):
    spec = importlib.util.spec_from_file_location(f"_rlm_checked_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def _ring_checks(ctx: RankContext, fn) -> list[tuple[str, bool, str]]:
    from rlm_course.distributed.comm import CommCounter

    dist = torch.distributed
    p, rank, out = ctx.world_size, ctx.rank, []
    g = torch.Generator().manual_seed(rank)

    def against_all_reduce(label, x, exact):
        expected = x.clone()
        dist.all_reduce(expected)
        got = fn(x.clone())
        if not isinstance(got, Tensor) or got.shape != expected.shape:
            return out.append((label, False, f"expected a tensor of shape {tuple(expected.shape)}, "
                                             f"got {type(got).__name__}"))
        if exact:
            ok = torch.equal(got, expected)
        else:  # another order of the same sum: within float64 rounding
            ok = (got - expected).abs().max().item() <= 1e-12 * expected.abs().max().item()
        out.append((label, ok, "" if ok else f"max difference {(got - expected).abs().max():.3g} "
                                            "from dist.all_reduce"))

    against_all_reduce(f"{p} ranks, whole numbers: the same sum as dist.all_reduce",
                       torch.randint(-50, 50, (12,), generator=g).double(), True)
    against_all_reduce(f"{p} ranks, a (5, 7) float64 tensor (chunks of unequal size)",
                       torch.randn(5, 7, generator=g, dtype=torch.float64), False)
    x = torch.ones(6 * p, dtype=torch.float32)
    with CommCounter() as comm:
        fn(x)
    want = 2 * (p - 1) * x.numel() * 4 // p
    sends = [c for c in comm.calls if c.kind == "send"]
    others = sorted({c.kind for c in comm.calls} - {"send", "recv"})
    ok = comm.sent == want and len(sends) == 2 * (p - 1) and not others
    out.append((f"sends 2 (p-1) chunks of 1/p each ({want} bytes per rank), with send/recv only",
                ok, "" if ok else f"sent {comm.sent} bytes in {len(sends)} sends"
                + (f", and used {others}" if others else "")))
    return out


def _bucket_checks(ctx: RankContext, fn) -> list[tuple[str, bool, str]]:
    from rlm_course.distributed.comm import CommCounter

    dist = torch.distributed
    p, rank, out = ctx.world_size, ctx.rank, []
    g = torch.Generator().manual_seed(rank)
    shapes = [(3, 4), (5,), (7, 2), (2, 2), (20,)]
    grads = [torch.randn(s, generator=g) for s in shapes]
    expected = []
    for t in grads:
        e = t.clone()
        dist.all_reduce(e)
        expected.append(e / p)
    with CommCounter() as comm:
        sizes = fn(grads, 64)
    want_sizes = _expected_buckets([math.prod(s) * 4 for s in shapes], 64)
    ok = all(torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(grads, expected))
    out.append((f"{p} ranks: every gradient becomes the mean over ranks (as dist.all_reduce / p)",
                ok, "" if ok else "a gradient differs from the all-reduced mean"))
    ok = sizes == want_sizes
    out.append(("buckets follow the cap: consecutive gradients, a new bucket when the next would "
                "overflow, a large gradient alone", ok,
                "" if ok else f"bucket sizes {sizes}, expected {want_sizes}"))
    calls = [c.nbytes for c in comm.calls if c.kind == "all_reduce"]
    ok = calls == want_sizes and len(comm.calls) == len(want_sizes)
    out.append(("one all-reduce per bucket, of the bucket's bytes", ok,
                "" if ok else f"all-reduces of {calls} bytes (and {len(comm.calls)} calls in all)"))
    big = [t.clone() for t in grads]
    ok = fn(big, 10**9) == [sum(math.prod(s) for s in shapes) * 4]
    out.append(("a cap above the total makes one bucket", ok, "" if ok else "expected one bucket"))
    return out


def _expected_buckets(sizes: list[int], cap: int) -> list[int]:
    buckets, current = [], 0
    for s in sizes:
        if current and current + s > cap:
            buckets.append(current)
            current = 0
        current += s
    if current:
        buckets.append(current)
    return buckets


def exercise_worker(ctx: RankContext, path: str, name: str) -> dict:
    """Run the checks of exercise ``name`` on the function of that name in the file ``path``
    (the learner's, the worked solution's, or the package's). Returns ``{"results": [(description,
    passed, message)]}``, or ``{"not_implemented": message}``."""
    fn = _load(path, name)
    checks = {"ring_all_reduce": _ring_checks, "bucketed_all_reduce": _bucket_checks}[name]
    try:
        return {"results": checks(ctx, fn)}
    except NotImplementedError as err:
        return {"not_implemented": str(err) or "raises NotImplementedError"}
