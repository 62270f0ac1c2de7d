"""Weight sync: moving the trainer's new weights to the rollout engine (stage 4 of an iteration).

**Disaggregated** (trainer and rollout on different devices): the trainer's first rank broadcasts
every tensor of the state dict to the rollout ranks over a *sync group* (``dist.new_group``), in
**fixed-size buckets**: tensors are packed, in order, into flat buffers of at most
``bucket_bytes`` (:func:`bucket_plan`), one broadcast per buffer, then unpacked on the receivers
(:func:`bucketed_broadcast`). Few large messages pay the per-message latency few times; one
message per tensor pays it for every tensor (a 16B MoE synced per tensor took about 200 s in
veRL, with 512 MB buckets about 16 s in slime; reference notes, section 5, issue 9). veRL's
checkpoint engine, slime, ROLL and NeMo-RL all bucket (``update_weights_bucket_megabytes``,
about 512 MB).

**Colocated** (the same process hosts both, veRL's hybrid engine): the rollout engine's weights
are loaded from the trainer's in place (:func:`handover`): a memory copy, no network (on GPUs,
CUDA IPC handles pass the buffers between the two engines' processes).

**Cost model** (Hockney's alpha-beta, as :class:`rlm_course.cost.comm.Link`): one broadcast
of ``n`` bytes from one sender to one receiver takes ``alpha + n / beta``; ``B`` buckets of
``M`` bytes in all take

    T_sync = B alpha + M / beta                                          (one receiver)

and with ``r`` receivers on a binomial tree ``ceil(log2(r + 1)) (B alpha + M / beta)``
(:func:`predict_sync_seconds`). ``alpha`` and ``beta`` are measured on the same workers
(:func:`rlm_course.systems.pipelines.measure_link`: bursts of broadcasts of 1 KiB to 16 MiB, the way a bucketed sync sends
them, least squares on the relative error, :func:`rlm_course.distributed.collectives.fit_link`).
Packing and unpacking add a memory copy of ``M`` bytes on each side (a read and a write each,
``4 M / bandwidth`` in all), the copies term of the model. At scale the same model, with the
gather, software and fixed terms real systems pay, is :func:`rlm_course.cost.weight_sync.sync_cost`,
which chapter 12 (stage 4) and chapter 14 (the simulator) both call.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from rlm_course.cost.comm import Link


def tensor_bytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def bucket_plan(sizes: Sequence[int], bucket_bytes: int,
                dtypes: Sequence[torch.dtype] | None = None) -> list[list[int]]:
    """Group tensors, in order, into buckets of at most ``bucket_bytes`` bytes.

    A tensor goes into the current bucket if it fits, else it starts a new one; a tensor larger
    than ``bucket_bytes`` gets a bucket of its own (it is never split). With ``dtypes``, a
    change of dtype also starts a new bucket (a flat buffer has one dtype).

    Args:
        sizes: bytes of each tensor; bucket_bytes: the bucket capacity (bytes, > 0).

    Returns:
        the indices of the tensors in each bucket, e.g. ``[[0, 1], [2], [3, 4, 5]]``.

    Raises:
        ValueError: for a non-positive ``bucket_bytes``, a negative size, or ``dtypes`` of
            another length than ``sizes``.
    """
    if not (isinstance(bucket_bytes, int) and bucket_bytes > 0):
        raise ValueError(f"bucket_bytes={bucket_bytes!r} must be a positive number of bytes "
                         "(e.g. 2**20 for 1 MiB).")
    if any(s < 0 for s in sizes):
        raise ValueError(f"bucket_plan: negative tensor size in {list(sizes)[:5]}.")
    if dtypes is not None and len(dtypes) != len(sizes):
        raise ValueError(f"bucket_plan: {len(dtypes)} dtypes for {len(sizes)} tensors.")
    plan: list[list[int]] = []
    filled = 0
    for i, size in enumerate(sizes):
        new_dtype = dtypes is not None and plan and dtypes[plan[-1][-1]] != dtypes[i]
        if not plan or filled + size > bucket_bytes or new_dtype:
            plan.append([i])
            filled = size
        else:
            plan[-1].append(i)
            filled += size
    return plan


def bucketed_broadcast(tensors: list[Tensor], bucket_bytes: int,
                       broadcast: Callable[[Tensor], None]) -> list[int]:
    """Broadcast ``tensors`` in flat buckets: every process of the group calls this with the same
    shapes and dtypes; on the source ``tensors`` hold the values to send, on the others they are
    overwritten with the source's values.

    For each bucket of :func:`bucket_plan` (the tensors' sizes in bytes, and their dtypes): pack
    its tensors into one flat buffer, call ``broadcast(buffer)`` once (it must fill the buffer in
    place with the source's bytes, e.g. ``lambda b: dist.broadcast(b, src, group=sync_group)``),
    then copy each slice of the buffer back into its tensor.

    Args:
        tensors: the state dict's tensors, in the same order on every process.
        bucket_bytes: bucket capacity in bytes (> 0).
        broadcast: the collective, called once per bucket.

    Returns:
        the bytes of each bucket, in order (their sum is the bytes of ``tensors``).

    Raises:
        ValueError: from :func:`bucket_plan` for a bad ``bucket_bytes``.
    """
    plan = bucket_plan([tensor_bytes(t) for t in tensors], bucket_bytes,
                       [t.dtype for t in tensors])
    sent = []
    # BEGIN SOLUTION: for each bucket of the plan, concatenate its tensors (flattened) into one buffer, broadcast it, copy each slice back into its tensor (same shape), and record the buffer's bytes
    for indices in plan:
        group = [tensors[i] for i in indices]
        buffer = torch.cat([t.reshape(-1) for t in group])
        broadcast(buffer)
        offset = 0
        for t in group:
            t.copy_(buffer[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
        sent.append(tensor_bytes(buffer))
    # END SOLUTION
    return sent


def handover(source: torch.nn.Module, target: torch.nn.Module) -> int:
    """Colocated weight hand-over: copy every parameter and buffer of ``source`` into ``target``
    in place (one process, no network). Returns the bytes copied.

    Raises:
        ValueError: if the two modules' state dicts differ in names or shapes.
    """
    src, dst = source.state_dict(), target.state_dict()
    if list(src) != list(dst) or any(src[k].shape != dst[k].shape for k in src):
        raise ValueError("handover: the trainer's and the rollout engine's models differ in "
                         "parameter names or shapes; build both from the same configuration.")
    copied = 0
    with torch.no_grad():
        for k, v in src.items():
            dst[k].copy_(v)
            copied += tensor_bytes(v)
    return copied


def state_tensors(model: torch.nn.Module) -> list[Tensor]:
    """The tensors a weight sync moves: the state dict's values (the same objects as the model's
    parameters and buffers, so writing into them updates the model), in a fixed order."""
    return list(model.state_dict(keep_vars=False).values())


# ---------------------------------------------------------------------------------- the model
def sync_message_count(total_bytes: int, bucket_bytes: int | None, sizes: Sequence[int] | None = None) -> int:
    """Broadcasts one sync needs: the buckets of :func:`bucket_plan` when the tensors' ``sizes``
    are given, else ``ceil(total_bytes / bucket_bytes)`` (tensors that pack perfectly);
    ``bucket_bytes=None`` means one message per tensor (``len(sizes)``)."""
    if bucket_bytes is None:
        if sizes is None:
            raise ValueError("sync_message_count: one message per tensor needs the tensors' sizes.")
        return len(sizes)
    if sizes is not None:
        return len(bucket_plan(list(sizes), bucket_bytes))
    return max(1, math.ceil(total_bytes / bucket_bytes))


def predict_sync_seconds(total_bytes: float, messages: int, link: Link, receivers: int = 1,
                         memory_bandwidth: float | None = None) -> float:
    """Seconds of a bucketed broadcast of ``total_bytes`` in ``messages`` buckets from one sender:
    the transfer term of the one weight-sync model, :func:`rlm_course.cost.weight_sync.sync_cost`
    (:func:`rlm_course.cost.weight_sync.broadcast_seconds`, unpipelined as gloo sends it:
    ``ceil(log2(receivers + 1)) x (messages x alpha + total_bytes / beta)``) with a measured
    ``link``; with ``memory_bandwidth`` (bytes/s), plus its copies term: packing the buckets on
    the sender and unpacking them on the receivers, ``4 x total_bytes / memory_bandwidth``.

    Raises:
        ValueError: for a negative size, fewer than one message or receiver, or a non-positive
            memory bandwidth.
    """
    from rlm_course.cost.weight_sync import broadcast_seconds

    transfer = broadcast_seconds(total_bytes, messages, link, receivers, pipelined=False)
    if memory_bandwidth is None:
        return transfer
    if not memory_bandwidth > 0:
        raise ValueError(f"memory_bandwidth={memory_bandwidth} must be positive (bytes/s).")
    return transfer + 4 * total_bytes / memory_bandwidth


# ---------------------------------------------------------------------------------- in workers
def time_broadcasts(sizes: Sequence[int], repeats: int, group, src: int, device: str = "cpu",
                    burst: int = 4) -> dict[int, list[float]]:
    """Inside a worker of ``group``: for each size (bytes, float32), ``repeats`` timings of
    ``burst`` back-to-back broadcasts from global rank ``src`` (the pattern of a bucketed sync),
    each timing after a barrier, on this process. Returns ``{size: [seconds per broadcast, ...]}``;
    the controller takes, per repeat, the slowest process (a broadcast is over when the last
    receiver has it)."""
    import torch.distributed as dist

    out = {}
    for size in sizes:
        buffer = torch.zeros(max(1, size // 4), device=device)
        dist.broadcast(buffer, src, group=group)  # warm-up: connections, allocation
        times = []
        for _ in range(repeats):
            dist.barrier(group=group)
            start = time.perf_counter()
            for _ in range(burst):
                dist.broadcast(buffer, src, group=group)
            times.append((time.perf_counter() - start) / burst)
        out[size] = times
    return out


def slowest_median(per_process: list[dict[int, list[float]]]) -> dict[int, float]:
    """Per size: the median over repeats of the slowest process's time."""
    sizes = per_process[0].keys()
    return {s: statistics.median(max(p[s][i] for p in per_process)
                                 for i in range(len(per_process[0][s]))) for s in sizes}


#: Message sizes for the link fit: latency-bound to bandwidth-bound.
LINK_SIZES = tuple(2**k for k in (10, 12, 14, 16, 18, 20, 22, 24))
