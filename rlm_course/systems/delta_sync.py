"""Delta weight sync: send only the bf16 weights that changed since the last sync (chapter 12).

A rollout engine holds the policy in bf16. Between two consecutive versions, an optimizer step
moves each fp32 master weight by about the learning rate (Adam's update is about ``lr`` whatever
the gradient's scale), while one bf16 step of a weight ``|x|`` is ``2^-7 |x|`` (8 significant
bits). With the small learning rates of RL post-training (1e-6 on weights of size 1e-2) almost
every bf16 weight rounds to the same value as before: about 99% are bit-identical, so a sparse
delta (the positions and new values of the changed ones) sends a few percent of the bytes
(proposed in 2026 for TRL and slime). With the course's learning rates (1e-4 to 3e-4 on a model of
a million weights) many more change: :func:`unchanged_fraction` measures it.

**Format and bytes.** Per tensor of ``n`` weights of which ``k`` changed, a header of 8 bytes, then
either the ``k`` positions (int32, 4 bytes) and new values (bf16, 2 bytes), or, when that is not
smaller, the whole tensor in bf16:

    bytes(n, k) = 8 + min(6 k, 2 n)                                   (:func:`delta_bytes`)

A dense bf16 sync sends ``2 n`` per tensor. Both sides keep the last synced bf16 weights
(:class:`DeltaState`); the receiver's are bit-identical to the sender's after every sync.
:func:`delta_broadcast` sends the payload with any broadcast (a ``torch.distributed`` group, as
:func:`rlm_course.systems.weight_sync.bucketed_broadcast` takes one): its length, then the bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

HEADER_BYTES = 8
INDEX_BYTES = 4
VALUE_BYTES = 2


def delta_bytes(n: int, k: int) -> int:
    """Bytes of one tensor's delta: ``8 + min(6 k, 2 n)`` (see the module docstring).

    Raises:
        ValueError: unless ``0 <= k <= n``.
    """
    if not (isinstance(n, int) and isinstance(k, int) and 0 <= k <= n):
        raise ValueError(f"delta_bytes: k={k!r} changed weights of n={n!r}; need integers "
                         "0 <= k <= n.")
    return HEADER_BYTES + min((INDEX_BYTES + VALUE_BYTES) * k, VALUE_BYTES * n)


def bf16_bits(t: Tensor) -> Tensor:
    """The bf16 rounding of ``t``, flattened, as its 16-bit patterns (int16)."""
    return t.detach().reshape(-1).to(torch.bfloat16).view(torch.int16)


def unchanged_fraction(before: Sequence[Tensor], after: Sequence[Tensor]) -> float:
    """The share of weights whose bf16 value is bit-identical in ``before`` and ``after`` (two
    versions of the same tensors, any float dtype).

    Raises:
        ValueError: for tensors that differ in number or shapes.
    """
    before, after = list(before), list(after)
    if not before or len(before) != len(after) or any(a.shape != b.shape
                                                      for a, b in zip(before, after)):
        raise ValueError("unchanged_fraction: the two versions must hold the same tensors, at "
                         "least one.")
    same = sum(int((bf16_bits(a) == bf16_bits(b)).sum()) for a, b in zip(before, after))
    return same / max(1, sum(a.numel() for a in before))


class DeltaState:
    """The bf16 weights last synced, as one side of a delta sync keeps them (both sides start
    from the same full sync).

    Args:
        tensors: the weights at the last full sync (any float dtype).
    """

    def __init__(self, tensors: Sequence[Tensor]) -> None:
        tensors = list(tensors)
        self.shapes = [tuple(t.shape) for t in tensors]
        self.bits = [bf16_bits(t).clone() for t in tensors]

    def encode(self, tensors: Sequence[Tensor]) -> tuple[Tensor, list[int]]:
        """The payload that brings a receiver from this state to ``tensors`` (rounded to bf16),
        and the number of changed weights per tensor; the state becomes ``tensors``.

        Returns:
            ``(payload, changed)``: a flat uint8 tensor of ``sum delta_bytes(n_i, k_i)`` bytes,
            and ``[k_i]``.

        Raises:
            ValueError: for tensors of other number or sizes than the state's.
        """
        tensors = list(tensors)
        self._check(tensors)
        parts, changed = [], []
        for i, t in enumerate(tensors):
            new = bf16_bits(t)
            where = (new != self.bits[i]).nonzero().squeeze(1)
            k, n = len(where), new.numel()
            changed.append(k)
            if (INDEX_BYTES + VALUE_BYTES) * k < VALUE_BYTES * n:
                parts += [torch.tensor([k], dtype=torch.int64).view(torch.uint8),
                          where.to(torch.int32).view(torch.uint8),
                          new[where].contiguous().view(torch.uint8)]
            else:  # dense: the whole tensor in bf16
                parts += [torch.tensor([-1], dtype=torch.int64).view(torch.uint8),
                          new.contiguous().view(torch.uint8)]
            self.bits[i] = new.clone()
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8), changed

    def apply(self, payload: Tensor, tensors: Sequence[Tensor] | None = None) -> None:
        """Apply a payload of :meth:`encode` to this state and, when given, write the new bf16
        values into ``tensors`` (the receiver's weights, in place, in their own dtype). The whole
        payload is checked before anything changes.

        Raises:
            ValueError: for a payload that is not uint8, or does not match the state's tensors
                (another model, cut short, bytes left over, a header or position out of range).
        """
        if tensors is not None:
            tensors = list(tensors)
            self._check(tensors)
        if payload.dtype != torch.uint8 or payload.dim() != 1:
            raise ValueError(f"delta payload: a flat uint8 tensor from DeltaState.encode, not "
                             f"{payload.dtype} of shape {tuple(payload.shape)}.")
        data, offset, updates = payload.contiguous(), 0, []
        for i, bits in enumerate(self.bits):
            n = bits.numel()
            if offset + HEADER_BYTES > len(data):
                raise ValueError(f"delta payload ends at tensor {i} of {len(self.bits)}: it was "
                                 "made for other tensors, or cut short.")
            k = int(data[offset:offset + HEADER_BYTES].clone().view(torch.int64))  # aligned copy
            offset += HEADER_BYTES
            size = VALUE_BYTES * n if k == -1 else (INDEX_BYTES + VALUE_BYTES) * k
            if not (k == -1 or 0 <= k <= n) or offset + size > len(data):
                raise ValueError(f"delta payload: tensor {i} (of {n} weights) has a header of "
                                 f"{k} changed weights or too few bytes: it was made for other "
                                 "tensors, or cut short.")
            if k == -1:
                updates.append((i, None, data[offset:offset + size].clone().view(torch.int16)))
            else:
                end = offset + INDEX_BYTES * k
                where = data[offset:end].clone().view(torch.int32).long()
                if k and (int(where.min()) < 0 or int(where.max()) >= n):
                    raise ValueError(f"delta payload: tensor {i} has positions outside its {n} "
                                     "weights: it was made for other tensors.")
                updates.append((i, where, data[end:offset + size].clone().view(torch.int16)))
            offset += size
        if offset != len(data):
            raise ValueError(f"delta payload has {len(data) - offset} bytes left over: it was "
                             "made for other tensors.")
        for i, where, values in updates:  # checked: now change the state and the weights
            if where is None:
                self.bits[i].copy_(values)
            else:
                self.bits[i][where] = values
            if tensors is not None:
                with torch.no_grad():
                    tensors[i].copy_(self.bits[i].view(torch.bfloat16).view_as(tensors[i]))

    def _check(self, tensors: Sequence[Tensor]) -> None:
        if [tuple(t.shape) for t in tensors] != self.shapes:
            raise ValueError(f"delta sync: {len(tensors)} tensors against a state of "
                             f"{len(self.bits)}, or other shapes; both sides must hold the same "
                             "model.")


def delta_broadcast(tensors: Sequence[Tensor], state: DeltaState, source: bool,
                    broadcast: Callable[[Tensor], None]) -> int:
    """One delta sync over a broadcast: the source encodes ``tensors`` against ``state`` and
    sends the payload's length, then the payload; a receiver receives both, applies the payload
    to its ``state`` and writes the new values into its ``tensors``. ``broadcast(buffer)`` must
    fill ``buffer`` in place with the source's bytes on every process (e.g.
    ``lambda b: dist.broadcast(b, src, group=sync_group)``).

    Returns:
        the payload's bytes (the same on every process).
    """
    if source:
        payload, _ = state.encode(tensors)
        broadcast(torch.tensor([len(payload)], dtype=torch.int64))
        broadcast(payload)
        return len(payload)
    size = torch.zeros(1, dtype=torch.int64)
    broadcast(size)
    payload = torch.zeros(int(size), dtype=torch.uint8)
    broadcast(payload)
    state.apply(payload, tensors)
    return len(payload)


def unchanged_per_step(trainer, steps: int) -> list[dict]:
    """Run ``steps`` iterations of ``trainer`` (an :class:`~rlm_course.rl.trainer.RLTrainer`)
    and, after each, measure against the weights before it: the bf16-unchanged fraction and the
    bytes of a delta sync against a dense bf16 one.

    Returns:
        per step ``{"step", "lr", "unchanged", "delta_bytes", "dense_bytes"}``.

    Raises:
        ValueError: for ``steps < 1``.
    """
    if steps < 1:
        raise ValueError(f"steps={steps}: give 1 or more.")
    tensors = lambda: [p.detach().clone() for p in trainer.policy.parameters()]  # noqa: E731
    state = DeltaState(tensors())
    out = []
    for _ in range(steps):
        before = tensors()
        trainer.step()
        after = tensors()
        payload, _ = state.encode(after)
        out.append({"step": trainer.step_count, "lr": trainer.optimizer.param_groups[0]["lr"],
                    "unchanged": unchanged_fraction(before, after),
                    "delta_bytes": len(payload),
                    "dense_bytes": VALUE_BYTES * sum(t.numel() for t in after)})
    return out
