"""The hardware catalog: peak compute, memory and bandwidths of accelerators, and of this machine.

Accelerator figures live in ``data/hardware/accelerators.json``, each with its datasheet source.
This machine's CPU is measured, not looked up: ``python -m rlm_course hardware --measure`` times
fp32 matmuls (peak FLOP/s) and large tensor copies (memory bandwidth) and writes
``data/hardware/this-machine.json``, naming the command that made it.

Units: FLOP/s, bytes, bytes/s, seconds. The **ridge point** ``peak / bandwidth`` (FLOP per byte)
is where the roofline bends: below it a kernel is memory-bound (Williams et al. 2009, "Roofline",
CACM 52(4)).

Link bandwidths are **per direction**: a datasheet's NVLink figure (900 GB/s for an H100) counts
both directions, and a ring step of a collective sends and receives at the same time, so the beta
of the alpha-beta model is half of it (450 GB/s). A NIC's line rate (400 Gb/s = 50 GB/s) is
already per direction. The latencies (the alpha) are NCCL's cost model per ring step.
"""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rlm_course.utils import best_seconds, data_dir, is_real, unknown_name


@dataclass(frozen=True)
class Device:
    """One device of the catalog.

    Attributes:
        peak_flops: dense peak FLOP/s at the precision the course assumes for it (bf16 for
            accelerators, fp32 for a CPU); memory_bytes: device memory; memory_bandwidth: bytes/s
            between memory and compute; intra_node_bandwidth / inter_node_bandwidth: bytes/s **per
            direction** of one device's links inside a node and to other nodes (0: none);
            intra_node_latency / inter_node_latency: seconds per message step on those links;
            host_bandwidth: bytes/s per direction between the device and host memory (offloading
            optimizer states, a rollout engine's sleep and wake; 0: unknown);
            reported_memory_bytes: the total CUDA reports for the device (``torch.cuda``'s total
            capacity), of which an inference engine's memory share (vLLM's
            ``gpu_memory_utilization``) is taken; a datasheet's "80 GB" is 80 GiB of HBM, of
            which an H100 reports 79.11 GiB, 84.9e9 bytes, not 80e9 (0: ``memory_bytes``);
            intra_node_links: how the node's devices connect: 0, through a switch (NVSwitch,
            an NVL72 domain), every group inside a node at ``intra_node_bandwidth`` a device;
            ``k``, a full mesh of ``k`` point-to-point links a device (AMD's Infinity Fabric on
            an MI300X platform: 7 links of 64 GB/s a direction, 448 GB/s together), each
            ``1 / k`` of it, so a group of ``g`` devices of a node reaches ``(g - 1) / k`` of it
            (:meth:`Fabric.link <rlm_course.cost.comm.Fabric.link>`: two devices one link);
            devices_per_host: the devices that share one host's CPUs and memory (a server, or a
            GB200 NVL72 compute tray of two Grace CPUs and four GPUs; 0: ``devices_per_node``),
            what an optimizer stepped on the CPU shares (:meth:`TrainerCost.adam_seconds
            <rlm_course.cost.phases.TrainerCost.adam_seconds>`);
            source: where the figures come from.

    Raises:
        ValueError: for a peak, memory or bandwidth that is not positive and finite, a link,
            latency or host bandwidth that is negative or not finite, ``devices_per_node`` that
            is not a positive integer, ``intra_node_links`` other than 0 or ``devices_per_node -
            1``, or ``reported_memory_bytes`` far from ``memory_bytes``.
    """

    name: str
    peak_flops: float
    memory_bytes: float
    memory_bandwidth: float
    intra_node_bandwidth: float
    inter_node_bandwidth: float
    devices_per_node: int
    source: str
    intra_node_latency: float = 0.0
    inter_node_latency: float = 0.0
    host_bandwidth: float = 0.0
    reported_memory_bytes: float = 0.0
    devices_per_host: int = 0
    intra_node_links: int = 0

    def __post_init__(self) -> None:
        for name in ("peak_flops", "memory_bytes", "memory_bandwidth"):
            value = getattr(self, name)
            if not (is_real(value) and 0 < value < math.inf):
                raise ValueError(f"Device {self.name!r}: {name}={value!r} must be positive and "
                                 "finite.")
        for name in ("intra_node_bandwidth", "inter_node_bandwidth", "intra_node_latency",
                     "inter_node_latency", "host_bandwidth"):
            value = getattr(self, name)
            if not (is_real(value) and 0 <= value < math.inf):
                raise ValueError(f"Device {self.name!r}: {name}={value!r} must be finite and >= 0 "
                                 "(0: none or unknown).")
        if isinstance(self.devices_per_node, bool) or not (
                isinstance(self.devices_per_node, int) and self.devices_per_node >= 1):
            raise ValueError(f"Device {self.name!r}: devices_per_node={self.devices_per_node!r} "
                             "must be a positive integer.")
        if isinstance(self.devices_per_host, bool) or not (
                isinstance(self.devices_per_host, int) and self.devices_per_host >= 0):
            raise ValueError(f"Device {self.name!r}: devices_per_host={self.devices_per_host!r} "
                             "must be an integer >= 0 (0: devices_per_node).")
        if isinstance(self.intra_node_links, bool) or self.intra_node_links not in (
                0, self.devices_per_node - 1):
            raise ValueError(f"Device {self.name!r}: intra_node_links={self.intra_node_links!r} "
                             "must be 0 (a switch) or devices_per_node - 1 = "
                             f"{self.devices_per_node - 1} (a full mesh: one link to each other "
                             "device of the node).")
        if not (is_real(self.reported_memory_bytes)
                and 0 <= self.reported_memory_bytes <= 2 * self.memory_bytes):
            raise ValueError(f"Device {self.name!r}: reported_memory_bytes="
                             f"{self.reported_memory_bytes:g} must be the total CUDA reports, near "
                             f"memory_bytes={self.memory_bytes:g} (or 0).")

    @property
    def host_devices(self) -> int:
        """Devices sharing one host's CPUs: :attr:`devices_per_host`, else
        :attr:`devices_per_node`."""
        return self.devices_per_host or self.devices_per_node

    @property
    def engine_memory_bytes(self) -> float:
        """Bytes of the device a process can allocate from, of which an engine's memory share
        (vLLM's ``gpu_memory_utilization``) and a trainer's usable fraction are taken:
        :attr:`reported_memory_bytes`, or :attr:`memory_bytes` where the catalog has no reported
        total."""
        return self.reported_memory_bytes or self.memory_bytes

    @property
    def ridge_point(self) -> float:
        """FLOP per byte at which a kernel stops being memory-bound: ``peak / bandwidth``."""
        return self.peak_flops / self.memory_bandwidth


def catalog_dir() -> Path:
    return data_dir() / "hardware"


def load_catalog() -> dict[str, Device]:
    """Every device: the accelerators, and this machine if it has been measured.

    Raises:
        ValueError: if a catalog file is missing a field or is not valid JSON.
    """
    devices = {}
    path = catalog_dir() / "accelerators.json"
    try:
        entries = json.loads(path.read_text())["devices"]
    except (OSError, json.JSONDecodeError, KeyError) as err:
        raise ValueError(f"hardware catalog {path} is unreadable ({err}); restore it from git.") from None
    local = catalog_dir() / "this-machine.json"
    if local.exists():
        try:
            entries = {**entries, "this-machine": json.loads(local.read_text())}
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{local} is unreadable ({err}); measure again with `python -m "
                             "rlm_course hardware --measure`, or delete it.") from None
    for name, entry in entries.items():
        try:
            if "intra_node_bandwidth_bidirectional" in entry:  # a datasheet's total of both ways
                intra = float(entry["intra_node_bandwidth_bidirectional"]) / 2
            else:
                intra = float(entry["intra_node_bandwidth"])
            devices[name] = Device(name=name, peak_flops=float(entry.get("peak_flops_bf16",
                                                                          entry.get("peak_flops"))),
                                   memory_bytes=float(entry["memory_bytes"]),
                                   memory_bandwidth=float(entry["memory_bandwidth"]),
                                   intra_node_bandwidth=intra,
                                   inter_node_bandwidth=float(entry["inter_node_bandwidth"]),
                                   devices_per_node=int(entry["devices_per_node"]),
                                   source=str(entry["source"]),
                                   intra_node_latency=float(entry.get("intra_node_latency", 0.0)),
                                   inter_node_latency=float(entry.get("inter_node_latency", 0.0)),
                                   host_bandwidth=float(entry.get("host_bandwidth", 0.0)),
                                   reported_memory_bytes=float(
                                       entry.get("reported_memory_bytes", 0.0)),
                                   devices_per_host=int(entry.get("devices_per_host", 0)),
                                   intra_node_links=int(entry.get("intra_node_links", 0)))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"hardware catalog entry {name!r} is incomplete or wrong ({err}); "
                             "restore it from git, or measure this machine again (python -m "
                             "rlm_course hardware --measure).") from None
    return devices


def get_device(name: str) -> Device:
    """The catalog's device ``name``, in any case (``h100-sxm-80gb`` is ``H100-SXM-80GB``).

    Raises:
        ValueError: for an unknown name (the message lists the known ones).
    """
    devices = load_catalog()
    if name not in devices:
        same = [key for key in devices if isinstance(name, str) and key.lower() == name.lower()]
        name = same[0] if same else name
    if name not in devices:
        hint = (" Measure this machine first: python -m rlm_course hardware --measure."
                if name == "this-machine" else "")
        raise ValueError(f"{unknown_name('device', name, devices)}.{hint}")
    return devices[name]


def matmul_peak(sizes=(512, 1024, 2048), repeats: int = 3, device: str = "cpu",
                dtype: torch.dtype = torch.float32) -> tuple[float, dict]:
    """Best ``n x n`` matmul throughput (FLOP/s) over ``sizes`` in ``dtype`` on ``device``: this
    machine's peak (on a GPU each timing waits for the kernels: ``torch.cuda.synchronize``)."""
    results = {}
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        a @ b  # warm-up
        results[n] = 2 * n**3 / best_seconds(synchronized(lambda: a @ b, device), repeats)
    return max(results.values()), results


def synchronized(fn, device: str | torch.device = "cpu"):
    """``fn`` followed by a wait for the device's queued kernels (a no-op on the CPU), so that a
    wall-clock timing of it counts the GPU's work."""
    if torch.device(device).type != "cuda":
        return fn

    def run():
        out = fn()
        torch.cuda.synchronize(device)
        return out

    return run


def catalog_device_for(name: str) -> Device | None:
    """The catalog's device whose model (the part of its key before the first dash: ``H200``,
    ``A100``) appears as a word in a CUDA device name such as ``"NVIDIA H200"`` or ``"NVIDIA
    A100-SXM4-80GB"``; None when none does (e.g. a consumer GPU). A PCIe card matches its SXM
    entry, whose peaks are higher."""
    import re

    for key, device in load_catalog().items():
        model = key.split("-")[0]
        if model != "this" and re.search(rf"(?<![A-Za-z0-9]){re.escape(model)}(?![0-9])", name):
            return device
    return None


def copy_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Memory bandwidth in bytes/s: the best time to copy a ``megabytes`` fp32 tensor into another
    (each byte read once and written once, so ``2 x size`` bytes move)."""
    n = megabytes * 2**20 // 4
    src, dst = torch.randn(n), torch.empty(n)
    dst.copy_(src)  # warm-up: touch every page
    return 2 * n * 4 / best_seconds(lambda: dst.copy_(src), repeats)


def measure_this_machine(write: bool = True) -> Device:
    """Measure this machine's CPU and (by default) store it in the catalog as ``this-machine``.

    Peak: the best fp32 matmul throughput at the current thread count; memory bandwidth: the best
    large-copy rate; memory: the physical memory the OS reports; no inter-device links."""
    peak, _ = matmul_peak()
    bandwidth = copy_bandwidth()
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 0
    threads = torch.get_num_threads()
    device = Device(
        name="this-machine", peak_flops=peak, memory_bytes=float(memory),
        memory_bandwidth=bandwidth, intra_node_bandwidth=0.0, inter_node_bandwidth=0.0,
        devices_per_node=1,
        source=(f"measured by `python -m rlm_course hardware --measure` on {platform.machine()} "
                f"{platform.processor() or platform.system()}, {threads} torch "
                f"thread{'s' if threads != 1 else ''}: best fp32 "
                "matmul FLOP/s (n = 512..2048) and best 256 MB tensor-copy rate"))
    if write:
        path = catalog_dir() / "this-machine.json"
        entry = {k: v for k, v in asdict(device).items() if k != "name"}
        path.write_text(json.dumps(entry, indent=2) + "\n")
    return device
