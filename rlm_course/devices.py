"""Where the course's tensors live: the ``--device`` of every command that computes.

The RL programs (``grpo``, ``ppo``, ``sft``, ``eval``, the benches, data-parallel GRPO and the Ray
workers) take ``--device {auto,cpu,cuda}``: ``auto`` is CUDA when torch sees a GPU, else the CPU.
The model is moved to the device once; every tensor a step makes is made there (the trainer reads
the device from the policy's parameters), and the random generators that sample are made on it
too, seeded as on the CPU (a CUDA generator draws other numbers than a CPU one from the same seed:
a run on a GPU is reproducible on that GPU, not bit-equal to the CPU run). Checkpoints are written
from wherever the model is and always read onto the CPU first
(:func:`rlm_course.lm.checkpoint.load_checkpoint`), so a checkpoint saved on a GPU loads on a
laptop and back.
"""

from __future__ import annotations

import torch

#: The values of ``--device``.
DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when torch sees a GPU, else ``"cpu"``; other names are checked.

    Raises:
        ValueError: for an unknown device, or ``"cuda"`` on a machine (or torch build) without
            one.
    """
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in DEVICE_CHOICES:
        raise ValueError(f"--device {device!r}: choose one of {', '.join(DEVICE_CHOICES)} (auto: "
                         "CUDA when torch sees a GPU, else the CPU).")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA GPU here (torch.cuda.is_available() is "
                         f"False; torch {torch.__version__}"
                         f"{', a CPU-only build' if torch.version.cuda is None else ''}); use "
                         "--device cpu, or run on a GPU machine with a CUDA build of torch.")
    return device


def module_device(module: torch.nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (the course's models live on one device).

    Raises:
        ValueError: for a module without parameters.
    """
    try:
        return next(module.parameters()).device
    except StopIteration:
        raise ValueError(f"{type(module).__name__} has no parameters, so no device; pass the "
                         "device explicitly.") from None


def device_description(device: str | torch.device) -> str:
    """A device in words for run records: ``"cpu"`` or ``"cuda:0 (NVIDIA H200)"``."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{index} ({torch.cuda.get_device_name(index)})"


def peak_device_memory_bytes(device: str | torch.device) -> int | None:
    """The CUDA caching allocator's high-water mark on ``device`` (bytes), None on a CPU (where
    the process's peak RSS is the measure, :func:`rlm_course.cost.accounting.peak_rss_bytes`)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(device))


def generator_on(device: str | torch.device, seed: int) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed``: sampling ops (``multinomial``)
    need a generator on the device of their input."""
    return torch.Generator(device=torch.device(device)).manual_seed(seed)
