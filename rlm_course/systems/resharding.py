"""Hybrid-engine resharding: the actor's weights from its training layout to its generation
layout, on the same devices.

A colocated actor trains with one layout and generates with another: training wants a large
tensor-parallel (TP) degree to fit optimizer states and activations, generation wants *small* TP
replicas, many of them, because decode reads every weight at every token (chapter 05). Here the
training layout is Megatron TP over ``t`` ranks (rank ``r`` holds shard ``r`` of every split
tensor: its heads' QKV rows, its MLP slice; the layout of
:class:`rlm_course.parallel.tensor_parallel.TensorParallelBlock`) and the generation layout is TP
``t_g`` x DP ``d_g = t / t_g`` (``d_g`` replicas of ``t_g`` ranks each). Layer norms, embeddings,
row-parallel biases and the head are replicated in both layouts and do not move.

**Naive** (DeepSpeed-Chat's hybrid engine and "HybridFlow-V" of the paper): the generation groups
are consecutive ranks (rank ``r`` gets generation shard ``r mod t_g``), which in general is *not*
a union of the training shards ``r`` holds, so every rank all-gathers the whole model over the
training TP group and slices its generation shard out. Per rank it receives ``(t - 1) / t x M``
bytes (``M``: the split tensors' bytes), holds ``M`` (plus its training shard) at the peak, and
keeps its training shard next to its generation shard afterwards: ``M / t`` redundant bytes.

**HybridFlow** (3D-HybridEngine, Sheng et al. 2024, arXiv:2409.19256, section 5.4): rank ``r``
gets generation shard ``r // d_g``, so that every generation shard is the union of the training
shards of the ``d_g`` consecutive ranks that share it -- a *micro data-parallel group*. An
all-gather inside that group builds it: each rank receives ``M / t_g - M / t`` bytes, and its
training shard becomes part of its generation shard (zero redundancy). With pipeline degrees
``p``, ``p_g`` the paper's formulas (its Table 2) are ``(tp - 1) / (tp) M`` (naive) against
``(t p - t_g p_g) / (t_g p_g t p) M`` (HybridFlow) bytes per rank, peak ``M`` against
``M / (t_g p_g)``: :func:`rlm_course.cost.weight_sync.predict_transition`. The paper reports the transition time cut by up to
89.1% for a 70B model (its baseline, DeepSpeed-Chat, gathers over every GPU of the job).

:func:`reshard` runs either scheme inside a worker of a real process group (chapter 12 runs it
on four Ray workers with gloo); :func:`megatron_splits`, :func:`shard` and :func:`merge` are the
layouts, and every function counts the bytes it received and measures the memory it held.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

SCHEMES = ("naive", "hybridflow")


@dataclass(frozen=True)
class Split:
    """How a TP-split tensor is cut: along ``dim`` into equal chunks, inside each of ``groups``
    equal parts of that dimension (3 for a fused QKV weight: the chunk of Q, of K and of V)."""

    dim: int
    groups: int = 1


def megatron_splits(names) -> dict[str, Split | None]:
    """The Megatron TP split of each state-dict entry of a :class:`~rlm_course.lm.model.TinyGPT`:
    QKV column-parallel by heads (``Split(0, 3)``), the attention output projection row-parallel
    (``Split(1)``), the MLP's ``fc`` column-parallel (``Split(0)``) and ``out`` row-parallel
    (``Split(1)``); every other entry replicated (None)."""
    out = {}
    for name in names:
        if name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            out[name] = Split(0, 3)
        elif name.endswith(("attn.proj.weight", "mlp.out.weight")):
            out[name] = Split(1)
        elif name.endswith(("mlp.fc.weight", "mlp.fc.bias")):
            out[name] = Split(0)
        else:
            out[name] = None
    return out


def _parts(tensor: Tensor, split: Split, degree: int) -> Tensor:
    """``tensor`` viewed with ``split.dim`` as ``(groups, degree, chunk)``."""
    size = tensor.shape[split.dim]
    if size % (split.groups * degree):
        raise ValueError(f"a dimension of {size} does not split into {split.groups} x {degree} "
                         "equal chunks; choose a TP degree that divides the heads and the MLP "
                         "width.")
    shape = list(tensor.shape)
    chunk = size // (split.groups * degree)
    return tensor.reshape(*shape[:split.dim], split.groups, degree, chunk, *shape[split.dim + 1:])


def shard(tensor: Tensor, split: Split, index: int, degree: int) -> Tensor:
    """Shard ``index`` of ``degree`` of ``tensor`` (a copy; shape: ``split.dim`` divided by
    ``degree``).

    Raises:
        ValueError: if the dimension does not divide into ``groups x degree`` chunks, or for an
            index outside ``0 .. degree - 1``.
    """
    if not 0 <= index < degree:
        raise ValueError(f"shard index {index} is not in 0..{degree - 1}.")
    parts = _parts(tensor, split, degree)
    piece = parts.narrow(split.dim + 1, index, 1)
    shape = list(tensor.shape)
    shape[split.dim] //= degree
    return piece.reshape(shape).clone()


def merge(shards: list[Tensor], split: Split) -> Tensor:
    """The inverse of :func:`shard`: the tensor whose shards ``0 .. len(shards) - 1`` these are.
    Merging the training shards ``k d .. k d + d - 1`` of degree ``t`` gives shard ``k`` of
    degree ``t / d``: shards of a finer split nest in those of a coarser one (what HybridFlow's
    grouping uses)."""
    degree = len(shards)
    views = [_parts(s, split, 1) for s in shards]  # (.., groups, 1, chunk, ..)
    stacked = torch.cat(views, dim=split.dim + 1)
    shape = list(shards[0].shape)
    shape[split.dim] *= degree
    return stacked.reshape(shape)


def generation_index(rank: int, tp: int, tp_gen: int, scheme: str) -> int:
    """Which generation TP shard (of ``tp_gen``) rank ``rank`` (of ``tp`` training ranks) holds:
    ``rank mod tp_gen`` (naive: consecutive ranks form a generation replica) or
    ``rank // (tp / tp_gen)`` (HybridFlow: the generation shard contains the training shard).

    Raises:
        ValueError: for an unknown scheme, or a ``tp_gen`` that does not divide ``tp``.
    """
    check_degrees(tp, tp_gen)
    if scheme == "naive":
        return rank % tp_gen
    if scheme == "hybridflow":
        return rank // (tp // tp_gen)
    raise ValueError(f"scheme={scheme!r}: choose one of {SCHEMES}.")


def check_degrees(tp: int, tp_gen: int) -> None:
    if not (isinstance(tp, int) and isinstance(tp_gen, int) and tp >= 1 and tp_gen >= 1
            and tp % tp_gen == 0):
        raise ValueError(f"generation TP {tp_gen} must be a positive divisor of training TP {tp} "
                         "(the generation replicas are made of whole training shards).")


def micro_dp_groups(tp: int, tp_gen: int) -> list[list[int]]:
    """HybridFlow's micro data-parallel groups: the ``tp / tp_gen`` consecutive ranks whose
    training shards make up one generation shard, e.g. ``[[0, 1], [2, 3]]`` for 4 -> 2."""
    check_degrees(tp, tp_gen)
    d = tp // tp_gen
    return [list(range(k * d, (k + 1) * d)) for k in range(tp_gen)]


def training_shards(state: dict[str, Tensor], rank: int, tp: int) -> dict[str, Tensor]:
    """Rank ``rank``'s training layout of a full state dict: its shard of every split tensor,
    and every replicated tensor."""
    splits = megatron_splits(state)
    return {k: (v.clone() if splits[k] is None else shard(v, splits[k], rank, tp))
            for k, v in state.items()}


def generation_shards(state: dict[str, Tensor], index: int, tp_gen: int) -> dict[str, Tensor]:
    """The generation layout's shard ``index`` of a full state dict (what a rank must end with)."""
    return training_shards(state, index, tp_gen)


def split_bytes(state: dict[str, Tensor]) -> int:
    """``M``: the bytes of the TP-split tensors of a full state dict (what resharding moves)."""
    splits = megatron_splits(state)
    return sum(v.numel() * v.element_size() for k, v in state.items() if splits[k] is not None)


# ---------------------------------------------------------------------------------- in a worker
def reshard(local: dict[str, Tensor], rank: int, tp: int, tp_gen: int, scheme: str, group,
            measure_memory: bool = True) -> tuple[dict[str, Tensor], dict]:
    """Move rank ``rank``'s training shards ``local`` (see :func:`training_shards`) to its
    generation shards, inside a real process group.

    Args:
        local: this rank's training layout (modified: HybridFlow replaces each training shard by
            a view into the generation shard that contains it).
        group: for ``"naive"`` the training TP group (all ``tp`` ranks); for ``"hybridflow"``
            this rank's micro data-parallel group (:func:`micro_dp_groups`).

    Returns:
        ``(generation, stats)``: the generation layout (shard :func:`generation_index` of each
        split tensor, for HybridFlow in :func:`shard_major` order; the replicated tensors
        unchanged) and ``stats``: ``received_bytes``
        (payload this rank received), ``peak_bytes`` (the most bytes of weights this rank held
        during the move: distinct storages, measured), ``resident_bytes`` (what it holds after,
        training and generation weights together) and ``generation_bytes`` (what generation
        needs), ``redundant_bytes`` (``resident - generation``), ``seconds``.
    """
    import torch.distributed as dist

    splits = megatron_splits(local)
    index = generation_index(rank, tp, tp_gen, scheme)
    d = tp // tp_gen
    received, peak = 0, 0
    start = time.perf_counter()
    generation: dict[str, Tensor] = {}
    if scheme == "naive":
        full = {}
        for name, tensor in local.items():
            split = splits[name]
            if split is None:
                continue
            parts = [torch.empty_like(tensor) for _ in range(tp)]
            dist.all_gather(parts, tensor.contiguous(), group=group)
            received += (tp - 1) * tensor.numel() * tensor.element_size()
            full[name] = merge(parts, split)
            if measure_memory:
                peak = max(peak, _held(local, full, dict(enumerate(parts))))
            del parts
        for name, tensor in local.items():
            split = splits[name]
            generation[name] = tensor if split is None else shard(full[name], split, index, tp_gen)
        del full
    elif scheme == "hybridflow":
        position = rank % d  # this rank's place in its micro-DP group
        for name, tensor in list(local.items()):
            split = splits[name]
            if split is None:
                generation[name] = tensor
                continue
            parts = [torch.empty_like(tensor) for _ in range(d)]
            dist.all_gather(parts, tensor.contiguous(), group=group)
            received += (d - 1) * tensor.numel() * tensor.element_size()
            # shard-major: the d training shards side by side (see shard_major)
            generation[name] = torch.cat(parts, dim=split.dim)
            if measure_memory:
                peak = max(peak, _held(local, generation, dict(enumerate(parts))))
            del parts
            # the training shard lives on inside the generation shard: a view, no second copy
            size = tensor.shape[split.dim]
            local[name] = generation[name].narrow(split.dim, position * size, size)
    else:
        raise ValueError(f"scheme={scheme!r}: choose one of {SCHEMES}.")
    seconds = time.perf_counter() - start
    generation_bytes = _distinct_bytes(generation)
    resident = _distinct_bytes(local, generation)
    return generation, {"scheme": scheme, "rank": rank, "generation_index": index,
                        "received_bytes": received, "peak_bytes": max(peak, resident),
                        "resident_bytes": resident, "generation_bytes": generation_bytes,
                        "redundant_bytes": resident - generation_bytes, "seconds": seconds}


def shard_major(tensor: Tensor, split: Split, degree: int) -> Tensor:
    """A generation shard in the order HybridFlow's all-gather leaves it, ``degree`` training
    shards side by side along ``split.dim``, put back into the canonical layout of
    :func:`shard` (the same tensor for ``groups = 1``; for a fused QKV, whose training shards
    each hold Q, K and V rows of their heads, the rows regrouped into all Q, then K, then V).
    The engine may as well keep the shard-major order (attention works head group by head group);
    this is for comparing bit for bit."""
    return merge(list(tensor.chunk(degree, dim=split.dim)), split)


def _distinct_bytes(*dicts: dict[str, Tensor]) -> int:
    storages = {}
    for d in dicts:
        for t in d.values():
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _held(*dicts: dict[str, Tensor]) -> int:
    return _distinct_bytes(*dicts)


def check_identical(generation: dict[str, Tensor], full: dict[str, Tensor], rank: int, tp: int,
                    tp_gen: int, scheme: str) -> bool:
    """Whether ``generation``, the result of :func:`reshard` on rank ``rank``, is exactly the
    generation shard that rank must hold, cut from the full state dict ``full`` (bit for bit:
    resharding only moves bytes)."""
    index = generation_index(rank, tp, tp_gen, scheme)
    want = generation_shards(full, index, tp_gen)
    splits = megatron_splits(full)
    if list(want) != list(generation):
        return False
    for k, w in want.items():
        got = generation[k]
        if scheme == "hybridflow" and splits[k] is not None:
            got = shard_major(got, splits[k], tp // tp_gen)
        if not torch.equal(w, got):
            return False
    return True
