"""Saving and loading small checkpoints atomically, with errors that say how to recover."""

from __future__ import annotations

import hashlib
import io
import warnings
from pathlib import Path

import torch

from rlm_course.lm.model import ModelConfig, TinyGPT
from rlm_course.utils import atomic_write_bytes

FORMAT = "rlm_course-checkpoint-v1"


def save_checkpoint(path: str | Path, model: TinyGPT, **extra) -> None:
    """Write ``model`` (config + weights) and ``extra`` entries to ``path`` atomically.

    ``extra`` may hold optimizer state dicts, the step, the task key, the command that made it.
    The payload carries its SHA-256 digest (:func:`payload_digest`), which
    :func:`load_checkpoint` checks: a damaged byte inside an optimizer state loads without any
    error from torch, and would surface steps later as a "diverged" loss. A ``torch.compile``'d
    model is saved as the model it wraps.

    Raises:
        ValueError: before anything is written (the file at ``path`` stays as it was) for what
            :func:`load_checkpoint` would refuse: weights that are not finite, an ``extra`` named
            as one of the checkpoint's own entries (but ``digest``, which a loaded checkpoint's
            entries passed back hold: it is recomputed), a set (its order, and so the digest,
            changes from one process to the next), or a value ``torch.load(weights_only=True)``
            cannot read back (numpy's scalars and arrays, paths, namespaces).
    """
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: the model it compiled
    extra.pop("digest", None)  # a loaded checkpoint's entries passed back: it is recomputed
    reserved = sorted(set(extra) & {"format", "model_config", "state_dict", "model"})
    if reserved:
        raise ValueError(f"save_checkpoint: {', '.join(map(repr, reserved))} names the "
                         "checkpoint's own entry; store the value under another name.")
    bad = _non_finite_parameter(model)
    if bad is not None:
        raise ValueError(f"save_checkpoint: the model holds non-finite weights (NaN or inf in "
                         f"{bad}), which no run can resume from; save an earlier state.")
    for key, value in extra.items():
        if _has_set(value):
            raise ValueError(f"save_checkpoint: entry {key!r} holds a set, whose order (and so "
                             "the checkpoint's digest) changes from one process to the next; "
                             "store sorted(...) instead.")
    payload = {"format": FORMAT, "model_config": model.config.to_dict(),
               "state_dict": model.state_dict(), **extra}
    payload["digest"] = payload_digest(payload)
    data = _serialized(payload)
    if not _safely_loadable(data):  # name the entry torch's safe loader refuses
        key = next((k for k, v in extra.items() if not _safely_loadable(_serialized(v))), None)
        value = extra.get(key)
        raise ValueError(f"save_checkpoint: entry {key!r} holds a {type(value).__name__} (or "
                         "something inside it) that a checkpoint cannot hold safely "
                         "(torch.load(weights_only=True) refuses it); store Python numbers, "
                         "strings, lists, dicts and tensors (float(x), x.tolist(), str(path), "
                         "vars(namespace)).")
    atomic_write_bytes(path, data)


def _serialized(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _safely_loadable(data: bytes) -> bool:
    """Whether ``torch.load(weights_only=True)``, as :func:`load_checkpoint` reads, reads
    ``data``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 (what torch's safe unpickler refuses varies by type)
        return False
    return True


def _has_set(obj) -> bool:
    if isinstance(obj, (set, frozenset)):
        return True
    if isinstance(obj, dict):
        return any(_has_set(k) or _has_set(v) for k, v in obj.items())
    return isinstance(obj, (list, tuple)) and any(_has_set(v) for v in obj)


def _non_finite_parameter(model: TinyGPT) -> str | None:
    """The name of the first parameter holding a NaN or an inf, or None."""
    return next((name for name, p in model.named_parameters() if not torch.isfinite(p).all()),
                None)


def payload_digest(payload: dict) -> str:
    """SHA-256 of a checkpoint's payload, ``digest`` entry left out: every tensor's dtype, shape
    and bytes, and the ``repr`` of every other value, in a fixed order (dict keys sorted)."""
    h = hashlib.sha256()

    def feed(obj) -> None:
        if isinstance(obj, torch.Tensor):
            t = obj.detach().to("cpu").contiguous().reshape(-1)
            h.update(f"T{t.dtype}{tuple(obj.shape)}:".encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
        elif isinstance(obj, dict):
            h.update(b"{")
            for key in sorted(obj, key=repr):
                if obj is payload and key == "digest":
                    continue
                h.update(repr(key).encode() + b":")
                feed(obj[key])
            h.update(b"}")
        elif isinstance(obj, (list, tuple)):
            h.update(b"[" if isinstance(obj, list) else b"(")
            for item in obj:
                feed(item)
            h.update(b"]")
        else:
            h.update(repr(obj).encode() + b";")

    feed(payload)
    return h.hexdigest()


def load_checkpoint(path: str | Path) -> dict:
    """Read a checkpoint written by :func:`save_checkpoint`.

    Returns:
        The payload dict, with ``"model"``: a :class:`TinyGPT` holding the weights, on the CPU
        wherever the checkpoint was written (a GPU run's checkpoint loads on a CPU-only machine;
        ``model.to(device)`` moves it).

    Raises:
        ValueError: if the file is missing, unreadable, not a course checkpoint, or damaged (its
            digest does not match; files written before digests load without the check).
    """
    if not isinstance(path, (str, Path)):
        raise ValueError(f"load_checkpoint: path={path!r} must be a file's path (a str or a "
                         "Path).")
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"checkpoint {path} is a folder; pass the .pt file inside it (e.g. "
                         f"{path / 'checkpoint.pt'}).")
    if not path.is_file():
        raise ValueError(f"checkpoint {path} does not exist: pass the right path, or make it (a "
                         "run's runs/<name>/checkpoint.pt comes from `make demo` or `python -m "
                         "rlm_course grpo ...`; a warm start in data/checkpoints/ from `python -m "
                         "rlm_course sft --task ...`).")
    try:
        with warnings.catch_warnings():  # a foreign pickle: torch warns, then our error says it
            warnings.simplefilter("ignore", UserWarning)
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for truncated or foreign files
        text = str(err).strip().splitlines()[0] if str(err).strip() else ""
        first_line = text.split(". ")[0].rstrip(".")  # torch's first sentence says what failed
        if len(first_line) > 120:
            first_line = first_line[:117] + "..."
        raise ValueError(f"checkpoint {path} is corrupt or not a torch checkpoint "
                         f"({type(err).__name__}: {first_line}); pass a file written by "
                         "`python -m rlm_course sft` or `grpo`, or make it again.") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        held = (f"format {payload.get('format')!r}" if isinstance(payload, dict)
                else f"it holds a {type(payload).__name__}, not a checkpoint's dict")
        raise ValueError(f"checkpoint {path} is not an rlm_course checkpoint ({held}); "
                         "pass a file written by `python -m rlm_course sft` or `grpo`.")
    if "digest" in payload and payload["digest"] != payload_digest(payload):
        raise ValueError(f"checkpoint {path} is damaged: its contents no longer match the SHA-256 "
                         "digest written with them (a disk or copy error, or an edit); resume "
                         "from an intact copy, or make it again with the command that wrote it "
                         "(a run: start it again with --overwrite).")
    try:
        with torch.device("cpu"):  # on the CPU whatever the default device: .to() moves it
            model = TinyGPT(ModelConfig(**payload["model_config"]))
        model.load_state_dict(payload["state_dict"])
        dtypes = {t.dtype for t in payload["state_dict"].values()
                  if isinstance(t, torch.Tensor) and t.is_floating_point()}
        if len(dtypes) == 1:  # a bf16 model comes back bf16, its outputs as they were
            model.to(dtypes.pop())
    except (KeyError, TypeError, RuntimeError, ValueError, AttributeError) as err:
        why = (f"no {err.args[0]!r} entry" if isinstance(err, KeyError) else
               _shortened(" ".join(str(err).split())))
        raise ValueError(f"checkpoint {path} does not hold a valid model ({why}); "
                         "make it again with the command that wrote it.") from None
    bad = _non_finite_parameter(model)
    if bad is not None:
        raise ValueError(f"checkpoint {path} holds non-finite weights (NaN or inf in {bad}): the "
                         "file is damaged, or the run that saved it diverged; make it again with "
                         "the command that wrote it.")
    payload["model"] = model
    return payload


def _shortened(text: str, limit: int = 200) -> str:
    """``text`` cut at a word boundary to at most ``limit`` characters, marked with ``...``."""
    if len(text) <= limit:
        return text.rstrip(".")
    return text[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " ..."
