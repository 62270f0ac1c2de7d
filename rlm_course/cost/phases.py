"""Seconds of each phase of an RL iteration on a cluster: a generation replica's decode steps and
prefills, the trainer's scoring and update passes, weight synchronisation and offloading. The
one home of these costs: chapter 14's simulator (:mod:`rlm_course.cluster.simulator`) composes
them, chapter 12's stage 4 and chapters 05-06's anatomy call the same formulas.

FLOPs and bytes come from :mod:`rlm_course.cost` (:func:`~rlm_course.cost.architectures.teacher_forced_flops`
for every teacher-forced pass, :meth:`~rlm_course.cost.architectures.TransformerSpec.forward_flops_per_token`
for a decode step, :func:`~rlm_course.cost.anatomy.weight_bytes` for the weights a step reads,
:func:`~rlm_course.cost.accounting.predict_passes` for which models run which passes);
communication from :mod:`rlm_course.cost.comm`; weight sync from
:func:`rlm_course.cost.weight_sync.sync_cost`. They become seconds through **rates**
(:class:`Rates`): the fraction of the peak FLOP/s and of the memory bandwidth each kind of pass
reaches, the fixed seconds real software adds (per decode step, per micro-batch, per optimizer
step, per synced tensor), measured links. The dataclass defaults are named assumptions; rates
calibrated on published runs live in ``data/published/rates.json``
(:func:`rlm_course.cluster.validation.calibrated_rates`), and a measured run replaces both
(chapter 14 measures this machine's).

**A decode step** of a replica of ``tp`` devices with ``a`` sequences whose contexts sum to
``C`` takes, on one of its devices,

    max(F / (tp x peak x decode_mfu), B / (bandwidth x decode_bandwidth)) + latency + TP comm

(``latency = decode_step_latency + a x decode_sequence_latency``, plus a cost per layer without
CUDA graphs, and ``cross_node_all_reduce_seconds`` per all-reduce and network level of NCCL's
node tree for a replica that spans nodes;
a mixture-of-experts model's bandwidth is also scaled by ``moe_decode_efficiency``)

with ``F = a 2 N + 4 L H d_h C`` (:meth:`forward_flops_per_token` summed over the sequences) and
``B`` the device's bytes: its ``1 / tp`` of the weights the ``a`` tokens touch, plus ``C + a``
tokens of KV cache (read, and one written per sequence) divided over
:meth:`~rlm_course.cost.architectures.TransformerSpec.kv_shards` devices only (past the KV heads,
and always for a latent cache, the ranks read copies); two all-reduces per layer, the engine's
one-shot all-reduce inside a node or NCCL's node tree across nodes
(:func:`~rlm_course.cost.comm.decode_tp_comm`).
Over ``s`` steps with the same sequences, ``C`` grows by ``a`` per step, so both terms are linear
in the step and their sum has a closed form (:meth:`DecodeCost.seconds`), which the simulator
inverts when a weight update interrupts a replica (:meth:`DecodeCost.steps_within`).

**Speculative decoding** (``speculative_tokens = k``): a draft proposes ``k`` tokens a sequence,
and one forward of the model verifies all ``1 + k``: it computes ``1 + k`` tokens a sequence,
reads the weights those tokens touch (of an MoE, more experts) and each sequence's KV cache
once, and keeps the drafted tokens up to the first it rejects, ``(1 - p^(k+1)) / (1 - p)`` a
sequence on average at acceptance ``p`` (Leviathan et al. 2023, arXiv:2211.17192, eq. 1). The
draft here is the model's own multi-token-prediction layer (DeepSeek-V3, arXiv:2412.19437,
section 2.2; vLLM's ``deepseek_mtp``): each of its ``k`` passes reads one more layer and the
output head. The model prices a step so and spreads it over the tokens it yields, so the
simulator's steps stay one token a sequence (the context grows by ``a`` each) and the model
FLOPs count the tokens kept.

**A trainer pass** over a batch of sequences on a :class:`~rlm_course.cost.layouts.Layout`
takes its *hardware* FLOPs (``4x`` a forward for an update with activation recomputation, ``3x``
without) at ``train_hfu`` (updates) or ``forward_mfu`` (scoring) on the layout's devices,
divided by ``1 - bubble`` for a pipeline (``(pp - 1) / (m + pp - 1)``, ``m`` micro-batches per
optimizer step; a scoring pass's micro-batches hold the layout's ``scoring_micro_batch_tokens``
when set), plus the communication that cannot hide: TP and EP collectives (on the critical
path of every layer), the fill and drain hops of the pipeline, what the compute cannot hide of
the data-parallel gradient traffic (:func:`~rlm_course.cost.comm.exposed`; ZeRO-3 gathers the
weights for every micro-batch) and of ring attention; plus what does not shrink with more
devices: ``micro_batch_seconds`` per micro-batch a device runs and, per optimizer step,
``optimizer_step_seconds`` and the Adam update's memory traffic (every state read and written
once). **MFU** counts the model's FLOPs only (``3x`` a forward: no recomputation); **HFU** counts
what the hardware ran (Chowdhery et al. 2022, PaLM, appendix B; Korthikanti et al. 2022).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import numbers
import random
from collections import Counter
from dataclasses import dataclass, field

from rlm_course.cost import comm
from rlm_course.cost.accounting import predict_passes
from rlm_course.cost.anatomy import Workload, weight_bytes
from rlm_course.cost.architectures import TransformerSpec, teacher_forced_flops
from rlm_course.cost.comm import Link
from rlm_course.cost.hardware import Device
from rlm_course.cost.layouts import Layout, model_states, axis_strides, params_per_device
from rlm_course.cost.weight_sync import TRANSPORTS, SyncCost, sync_cost
from rlm_course.algorithms import RLConfig
from rlm_course.utils import check_amount, check_kinds, is_real
from rlm_course.vocabulary import ROUTINGS

#: Parameters a second one host's CPUs step with Adam when the optimizer is offloaded
#: (Megatron's ``HybridDeviceOptimizer``: PyTorch's AdamW on the CPU, the copies overlapped):
#: GLM-4.5-Air's 106B parameters over 4 H100 nodes in 9.6 s a step, measured under PyTorch's
#: profiler (THUDM/slime issue #1139, December 2025): 2.8B a second a host of 8 GPUs. Another
#: Megatron run measured 1.1B (ISEEKYAN/Megatron-LM issue #188, August 2026: verl's GRPO on
#: Qwen3.5-35B-A3B over 2 nodes of 8 GPUs, a 15.5 s optimizer step); the CPUs, their memory
#: and the threads each rank gets decide, so this is a rate to measure on one's own hosts.
#: ``HOST_ADAM_MEASURED``: the two measurements, slower first.
HOST_ADAM_MEASURED = (35e9 / 2 / 15.5, 106e9 / 4 / 9.6)
HOST_ADAM_PARAMS_PER_SECOND = HOST_ADAM_MEASURED[1]


@dataclass(frozen=True)
class Rates:
    """How fast the hardware and the software really run each kind of work: the inputs that turn
    FLOPs and bytes into seconds. Calibrated on published runs
    (:func:`rlm_course.cluster.validation.calibrated_rates`) or measured on a real run; the
    defaults here are named assumptions (a roofline with no software overheads).

    Attributes:
        train_hfu: fraction of peak FLOP/s the training passes (forward + backward, and the
            recomputed forward) run at: hardware FLOPs utilisation; default 0.40 (Megatron-LM
            reports 0.52 on 3,072 A100s counting the recomputed forward, arXiv:2104.04473).
        forward_mfu: the same for teacher-forced forwards (scoring, prefill); default 0.45.
        decode_mfu: for a decode step when it is compute-bound; default 0.5.
        decode_bandwidth: fraction of the memory bandwidth a memory-bound decode step reaches;
            default 0.7.
        decode_step_latency: seconds added to every decode step (the engine's scheduler,
            sampling, what launching its captured CUDA graph costs); default 0.
        decode_sequence_latency: seconds each sequence in the batch adds to a decode step (the
            engine's per-sequence scheduling, sampling and detokenizing on the CPU): a step of
            ``a`` sequences pays ``decode_step_latency + a x decode_sequence_latency`` beyond its
            roofline, so a long tail of few sequences decodes faster per step than a full batch;
            default 0.
        cuda_graphs: the engine replays each decode step as captured CUDA graphs (vLLM's default;
            ``enforce_eager`` turns them off); default True.
        eager_layer_seconds: without CUDA graphs, seconds each layer adds to a decode step by
            launching its kernels one by one from Python (about 10-20 kernels of a few
            microseconds each); default 0.
        cross_node_all_reduce_seconds: seconds each of a decode step's TP all-reduces adds per
            network level of NCCL's node tree (:func:`~rlm_course.cost.comm.node_tree_levels`:
            1 for a TP-16 engine on two 8-GPU nodes, 2 for TP 32 on four) when the replica spans
            nodes, beyond NCCL's
            tuning model (:func:`~rlm_course.cost.comm.node_tree_all_reduce_seconds`, whose
            latency grows with the same levels): a network collective
            captured in the step's CUDA graph, paced by NCCL's proxy thread, where inside a node
            the engine's one-shot all-reduce reads its peers' memory directly. vLLM's guide
            keeps tensor parallelism inside a node and crosses nodes with pipeline parallelism
            for this reason ("Distributed Inference and Serving", docs.vllm.ai v0.5.5-v0.8);
            RL systems still run TP 16-32 engines across nodes (NeMo-RL's DeepSeek-V3 and
            Qwen3-235B recipes); default 0.
        micro_batch_seconds: seconds added to every micro-batch of a training or scoring pass
            on a device (launches, packing, the pipeline schedule's bookkeeping); default 0.
        optimizer_step_seconds: seconds added to every optimizer step (gradient clipping, the
            optimizer's kernels and bookkeeping beyond its memory traffic); default 0.
        sync_tensor_seconds, sync_fixed_seconds: the weight sync's software rates per tensor per
            tree level and per sync (:func:`rlm_course.cost.weight_sync.sync_cost`); default 0.
        colocated_tensor_seconds: the same per tensor for a colocated hand-over (converting each
            tensor to the engine's layout and passing it in process or by CUDA IPC, a different
            code path from a network sync's); default 0.
        sync_transport: ``broadcast`` (rank 0 sends whole tensors, one collective a tensor),
            ``packed`` (rank 0 sends them packed in buckets) or ``sharded``.
        sync_pipeline_whole: the trainer's pipeline stages broadcast each tensor whole,
            all-gathered over TP first (NeMo-RL v0.3's ``gather_params``), instead of each
            rank's TP shard (Megatron-Bridge's export, verl's; the default, False).
        reward_seconds: verifier seconds per response (on CPUs, serial per trainer); default 0.
        iteration_overhead: fixed seconds per iteration on the trainer (controller, data
            movement, logging); default 0.
        host_bandwidth: bytes/s between a device and host memory, for offloading; default the
            catalog device's host link (PCIe Gen5 on H100s, about 50 GB/s).
        host_adam_params_per_second: parameters per second one host's CPUs advance by an Adam
            step when the optimizer is offloaded (ZeRO-Offload; Megatron's
            ``optimizer_cpu_offload``, whose ``HybridDeviceOptimizer`` steps the fp32 master
            weights and moments on the CPU), all the host's devices' shards together; default
            :data:`HOST_ADAM_PARAMS_PER_SECOND`, measured on Megatron's ``HybridDeviceOptimizer``
            (a host's CPUs and memory decide it: measure it on one's own hosts).
        intra_link, inter_link: measured links replacing the catalog's.
        memory_fraction: usable share of device memory; default 0.9.
        rollout_memory_fraction: the share of a device the rollout engine takes for its weights and
            KV cache (vLLM's ``gpu_memory_utilization``); default None: what the trainer's state
            leaves of ``memory_fraction``.
        train_flops_factor: training and scoring run at this multiple of the rate ``train_hfu``
            and ``forward_mfu`` give at the catalog's bf16 peak: 2 for FP8 GEMMs on Hopper and
            Blackwell tensor cores; below 1 for a trainer without a fusion the family's
            calibration runs have, e.g. 0.8 for Megatron-Core's SwiGLU unfused
            (``bias_activation_fusion`` off, the default of Megatron-Bridge's generic and Qwen3
            model providers; NeMo-RL sets it from v0.5 on, "gives ~25% training perf speedup
            with sequence packing and apply_rope_fusion", NVIDIA-NeMo/RL PR #1241); default 1.
        moe_efficiency: the training and scoring efficiencies of a mixture-of-experts model, as a
            fraction of a dense model's (``train_hfu``, ``forward_mfu``): at RL's few tokens per
            device, expert parallelism's all-to-alls, token permutation and grouped GEMMs of few
            tokens per expert run far below a dense layer's rate; default 1.
        moe_decode_efficiency: the share of ``decode_bandwidth`` a mixture-of-experts model's
            memory-bound decode step reaches: the engine's fused-MoE kernels run with tile
            configurations tuned per device and expert shape, and a device without one falls
            back to a default (vLLM warns "Using default MoE config. Performance might be
            sub-optimal!"; Blackwell's tuned configurations came late: vLLM PR #31448, Qwen3
            MoE on B200, December 2025; PR #33510 measured +2% to +25% decode throughput from
            one on B200); default 1. Fitted per (engine, device) family, never measured here.
            It scales every byte of the step, the KV cache's and the attention's too: applied to
            the routed experts' bytes alone and refitted, NeMo-RL's GB200 families predict their
            Qwen3-30B-A3B rows (KV cache about half of a step's bytes) further from the
            published ones (one figure fewer out of sample within tolerance), so what the
            share measures on GB200 is more than the fused-MoE kernels.
        max_batch: most sequences a generation replica decodes at once; default 1024 (verl's
            rollout ``max_num_seqs``).
        static_batching: the engine decodes a batch in lockstep until its longest sequence ends,
            finished rows still computed, and admits new sequences only then (Hugging Face
            ``generate``, this course's sampler); default False: continuous batching, a finished
            sequence's slot goes to the next one at once (vLLM, SGLang; Yu et al. 2022, Orca).
        prefix_caching: the samples of a group share their prompt's KV cache, prefilled once
            (vLLM's automatic prefix caching, SGLang's radix cache); default True.
        speculative_tokens: tokens a draft proposes ahead at every decode step, which the model
            verifies in the same forward (speculative decoding: Leviathan et al. 2023,
            arXiv:2211.17192; vLLM's ``num_speculative_tokens``, e.g. DeepSeek-V3's own
            multi-token-prediction layer as the draft, ``method: deepseek_mtp``); default 0.
        draft_acceptance: the chance that the model accepts a drafted token (each independently,
            the first rejection ending the run): a step yields ``(1 - p^(k+1)) / (1 - p)``
            tokens a sequence for ``k`` speculative tokens (Leviathan et al., eq. 1). The
            DeepSeek-V3 report measures 85-90% for its multi-token-prediction layer's token
            (arXiv:2412.19437, section 5.4.3); sampling at temperature 1 and a policy moving
            away from the draft lower it; default 0.85.
        routing: how a batch's samples reach the generation replicas (:data:`ROUTINGS`):
            ``group``, each group's samples to one replica, the groups in turn (a batch split in
            contiguous shards over the engines' data-parallel ranks: NeMo-RL's ``generate``
            without ``async_engine``, ``BatchedDataDict.shard_by_batch_size``; verl's
            ``generate_sequences`` dispatched to the rollout worker group); ``sample``, each
            sample a request of its own, the replicas in turn (NeMo-RL's ``generate_async``
            with ``async_engine``: "restricted to handle only single samples", each call to the
            next data-parallel shard, ``VllmGeneration._next_dp_shard_idx``; verl's agent loop,
            ``AsyncLLMServerManager`` sending each request to the server with the fewest sent so
            far). A group spread over the replicas has its prompt prefilled on each; default
            ``group``.

    Raises:
        ValueError: for a value that is not a number, an efficiency outside (0, 1], a negative
            or infinite time, a non-positive bandwidth, an unknown transport or routing, a flag
            that is not a bool, a ``max_batch`` that is not a positive integer or a link that is
            not a :class:`Link` (each names the field).
    """

    train_hfu: float = 0.40
    forward_mfu: float = 0.45
    decode_mfu: float = 0.50
    decode_bandwidth: float = 0.70
    decode_step_latency: float = 0.0
    decode_sequence_latency: float = 0.0
    cuda_graphs: bool = True
    eager_layer_seconds: float = 0.0
    cross_node_all_reduce_seconds: float = 0.0
    micro_batch_seconds: float = 0.0
    optimizer_step_seconds: float = 0.0
    sync_tensor_seconds: float = 0.0
    colocated_tensor_seconds: float = 0.0
    sync_fixed_seconds: float = 0.0
    sync_transport: str = "broadcast"
    sync_pipeline_whole: bool = False
    reward_seconds: float = 0.0
    iteration_overhead: float = 0.0
    host_bandwidth: float | None = None
    host_adam_params_per_second: float = HOST_ADAM_PARAMS_PER_SECOND
    intra_link: Link | None = None
    inter_link: Link | None = None
    memory_fraction: float = 0.9
    rollout_memory_fraction: float | None = None
    train_flops_factor: float = 1.0
    moe_efficiency: float = 1.0
    moe_decode_efficiency: float = 1.0
    max_batch: int = 1024
    static_batching: bool = False
    prefix_caching: bool = True
    routing: str = "group"
    speculative_tokens: int = 0
    draft_acceptance: float = 0.85

    #: the fields that are seconds (each finite and >= 0)
    SECONDS = ("decode_step_latency", "decode_sequence_latency", "eager_layer_seconds",
               "cross_node_all_reduce_seconds", "micro_batch_seconds",
               "optimizer_step_seconds",
               "sync_tensor_seconds", "colocated_tensor_seconds", "sync_fixed_seconds",
               "reward_seconds",
               "iteration_overhead")

    def __post_init__(self) -> None:
        numbers_ = ("train_hfu", "forward_mfu", "decode_mfu", "decode_bandwidth", "memory_fraction",
                    "moe_efficiency", "moe_decode_efficiency", "train_flops_factor") + self.SECONDS
        for name in numbers_ + ("rollout_memory_fraction", "host_bandwidth"):
            value = getattr(self, name)
            if value is None and name in numbers_:
                raise ValueError(f"Rates.{name}=None: give a number (the default is "
                                 f"{getattr(type(self), name)!r}).")
            if value is not None and not is_real(value):
                raise ValueError(f"Rates.{name}={value!r} must be a number, not a "
                                 f"{type(value).__name__}.")
        for name in ("train_hfu", "forward_mfu", "decode_mfu", "decode_bandwidth",
                     "memory_fraction", "moe_efficiency", "moe_decode_efficiency"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ValueError(f"Rates.{name}={value} must be a fraction in (0, 1].")
        for name in self.SECONDS:
            if not (getattr(self, name) >= 0 and math.isfinite(getattr(self, name))):
                raise ValueError(f"Rates.{name}={getattr(self, name)} must be a finite number of "
                                 "seconds >= 0.")
        if self.rollout_memory_fraction is not None and not 0 < self.rollout_memory_fraction <= 1:
            raise ValueError(f"Rates.rollout_memory_fraction={self.rollout_memory_fraction} must be "
                             "a fraction in (0, 1], or None.")
        if not (0.1 <= self.train_flops_factor <= 8):
            raise ValueError(f"Rates.train_flops_factor={self.train_flops_factor} must be in "
                             "[0.1, 8] (2 for FP8 training on Hopper, 1 for the family's own).")
        if not (is_real(self.host_adam_params_per_second)
                and 1 <= self.host_adam_params_per_second < math.inf):
            raise ValueError("Rates.host_adam_params_per_second="
                             f"{self.host_adam_params_per_second!r} must be a finite number of "
                             "parameters a second, at least 1 (the default is "
                             f"{HOST_ADAM_PARAMS_PER_SECOND:.3g}).")
        if self.host_bandwidth is not None and not 0 < self.host_bandwidth < math.inf:
            raise ValueError(f"Rates.host_bandwidth={self.host_bandwidth} must be positive and "
                             "finite (bytes/s), or None for the device's host link.")
        # a name, not an array or list that compares equal to one (numpy's would pass `in`)
        if not isinstance(self.sync_transport, str) or self.sync_transport not in TRANSPORTS:
            raise ValueError(f"Rates.sync_transport={self.sync_transport!r}: choose one of "
                             f"{TRANSPORTS}.")
        if not isinstance(self.routing, str) or self.routing not in ROUTINGS:
            raise ValueError(f"Rates.routing={self.routing!r}: choose one of {ROUTINGS} (a "
                             "group's samples to one replica, or each sample to the next one).")
        if not (is_real(self.max_batch) and isinstance(self.max_batch, numbers.Integral)
                and self.max_batch >= 1):
            raise ValueError(f"Rates.max_batch={self.max_batch!r} must be a positive integer.")
        if not (isinstance(self.speculative_tokens, numbers.Integral)
                and not isinstance(self.speculative_tokens, bool)
                and 0 <= self.speculative_tokens <= 16):
            raise ValueError(f"Rates.speculative_tokens={self.speculative_tokens!r} must be an "
                             "integer from 0 (no speculative decoding) to 16, the tokens a draft "
                             "proposes a step (vLLM's num_speculative_tokens).")
        if not (is_real(self.draft_acceptance) and 0 < self.draft_acceptance < 1):
            raise ValueError(f"Rates.draft_acceptance={self.draft_acceptance!r} must be a "
                             "probability in (0, 1): the chance the model accepts a drafted "
                             "token (0.85-0.9 for DeepSeek-V3's multi-token prediction).")
        for name in ("cuda_graphs", "static_batching", "prefix_caching", "sync_pipeline_whole"):
            if not isinstance(getattr(self, name), bool):  # "false" in a file would read as true
                raise ValueError(f"Rates.{name}={getattr(self, name)!r} must be true or false "
                                 f"(a bool; the default is {getattr(type(self), name)}).")
        for name in ("intra_link", "inter_link"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), Link):
                raise ValueError(f"Rates.{name}={getattr(self, name)!r} must be a Link, written "
                                 "[alpha seconds, beta bytes/s] in a rates file, or None for the "
                                 "catalog's link.")

    def to_dict(self) -> dict:
        """The fields as JSON-ready values (links as ``[alpha, beta]``)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = [value.alpha, value.beta] if isinstance(value, Link) else value
        return out

    @classmethod
    def from_dict(cls, values: dict | None, base: "Rates | None" = None) -> "Rates":
        """``base`` (default: the defaults) with the fields of ``values`` (links as ``[alpha,
        beta]``).

        Raises:
            ValueError: for an unknown field (the message lists the known ones), a bad value,
                ``values`` that are not a mapping or a ``base`` that is not Rates (a family's
                name belongs in :func:`rlm_course.cluster.calibration.calibrated_rates`).
        """
        if base is not None and not isinstance(base, Rates):
            raise ValueError(f"Rates.from_dict: base={base!r} must be Rates or None; for a "
                             "family's calibrated rates use calibrated_rates('nemo-rl') "
                             "(rlm_course.cluster.calibration).")
        if values is not None and not isinstance(values, dict):
            raise ValueError(f"Rates.from_dict: values={values!r} must be a dict of rate: value, "
                             "e.g. {'train_hfu': 0.5}.")
        values = dict(values or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown rate(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}.")
        for key in ("intra_link", "inter_link"):
            if isinstance(values.get(key), (list, tuple)):
                if len(values[key]) != 2:
                    raise ValueError(f"Rates.{key}={list(values[key])!r}: a link is [alpha seconds, "
                                     "beta bytes/s], two numbers (e.g. [5e-6, 25e9]).")
                values[key] = Link(*values[key])
        return dataclasses.replace(base or cls(), **values)

    def host(self, device: Device) -> float:
        """Bytes/s of the host link: the rate's, else the device's, else (a device the catalog
        knows no host link of) its memory bandwidth."""
        return self.host_bandwidth or device.host_bandwidth or device.memory_bandwidth


@dataclass(frozen=True)
class Cluster:
    """``gpus`` devices of a catalog type.

    Raises:
        ValueError: for ``gpus < 1``.
    """

    device: Device
    gpus: int

    def __post_init__(self) -> None:
        if not isinstance(self.device, Device):
            raise ValueError(f"Cluster.device={self.device!r} must be a Device; pass e.g. "
                             "get_device('H100-SXM-80GB') (rlm_course.cost.hardware).")
        if not (isinstance(self.gpus, numbers.Integral) and not isinstance(self.gpus, bool)
                and self.gpus >= 1):
            raise ValueError(f"Cluster.gpus={self.gpus!r} must be a positive integer.")
        object.__setattr__(self, "gpus", int(self.gpus))  # numpy's integers too

    def fabric(self, rates: Rates) -> comm.Fabric:
        return comm.Fabric.of(self.device, rates.intra_link, rates.inter_link)


def _check_parts(owner: str, **parts) -> None:
    """A ValueError for a name or a dict where a spec, device, Rates, Workload, config, Layout or
    Fabric belongs (a ``fabric`` of None is allowed: one device needs none)."""
    kinds = {"spec": (TransformerSpec, "get_spec('qwen2.5-7b')"),
             "device": (Device, "get_device('H100-SXM-80GB')"),
             "rates": (Rates, "calibrated_rates('nemo-rl') or Rates()"),
             "workload": (Workload, "Workload(8, 4, 128, 256)"),
             "config": (RLConfig, "algorithm('grpo')"),
             "layout": (Layout, "Layout(tp=8, dp=2)"),
             "fabric": (comm.Fabric, "Cluster(device, 8).fabric(rates)")}
    check_kinds([(name, value, *kinds[name]) for name, value in parts.items()
                 if not (name == "fabric" and value is None)], f"{owner}: ")


# ---------------------------------------------------------------------- generation
def speculative_yield(speculative_tokens: int, acceptance: float) -> float:
    """Tokens a sequence gains per engine step when a draft proposes ``speculative_tokens``
    (``k``) and the model accepts each with probability ``acceptance`` (``p``), up to the first it
    rejects, plus the one it samples itself: ``(1 - p^(k+1)) / (1 - p)`` (Leviathan et al. 2023,
    arXiv:2211.17192, eq. 1); 1 for ``k = 0``."""
    return (1 - acceptance ** (speculative_tokens + 1)) / (1 - acceptance)


def _linear_sum(c0: float, c1: float, lo: int, hi: int) -> float:
    """The sum of ``c0 + c1 t`` over ``t = lo .. hi - 1``."""
    n = hi - lo
    return n * c0 + c1 * (lo + hi - 1) * n / 2 if n > 0 else 0.0


@dataclass
class DecodeCost:
    """Seconds of a generation replica's work: ``tp`` devices of ``device`` holding ``spec``.

    Attributes:
        flops: FLOPs counted so far by :meth:`seconds` and :meth:`prefill_seconds` (for MFU).
        tokens_per_step: tokens an engine step yields a sequence: 1, or under speculative
            decoding ``(1 - p^(k+1)) / (1 - p)`` (the module docstring).
    """

    spec: TransformerSpec
    device: Device
    tp: int
    rates: Rates
    fabric: comm.Fabric | None = None
    workload: Workload = field(default_factory=lambda: Workload(1, 1, 1, 1))
    flops: float = 0.0

    def __post_init__(self) -> None:
        _check_parts("DecodeCost", spec=self.spec, device=self.device, rates=self.rates,
                     workload=self.workload, fabric=self.fabric)
        s, r, tp = self.spec, self.rates, self.tp
        s.check_degree("tp", tp)
        self.tp = tp = int(tp)  # numpy's integers too (their comparisons give numpy bools)
        # FLOPs of one token's matmuls, and per key it attends over (MLA's absorbed kernel: the
        # cached latents themselves; a prefill runs the up-projected heads, flop_terms)
        self.per_token, self.attention = s.flop_terms[0], s.decode_flops_per_key
        # KV bytes of one token on one device: split over the ranks that hold distinct KV heads
        self.kv = s.kv_cache_bytes_per_token(self.workload.kv_bytes) / s.kv_shards(tp)
        self.flop_rate = tp * self.device.peak_flops * r.decode_mfu
        self.byte_rate = (self.device.memory_bandwidth * r.decode_bandwidth  # one device's
                          * (r.moe_decode_efficiency if s.is_moe else 1.0))
        self.prefill_rate = tp * self.device.peak_flops * r.forward_mfu
        self.link = self.fabric.link(tp) if tp > 1 and self.fabric is not None else None
        if tp > 1 and self.link is None:
            raise ValueError(f"a tp={tp} replica needs links; give the cluster's fabric.")
        self.in_node = self.fabric is not None and tp <= self.fabric.devices_per_node
        # over the network, the fitted extra of two all-reduces a layer, each up and down the
        # node tree: a constant of the engine
        self.network_extra = 0.0 if self.in_node or tp == 1 else (
            2 * s.n_layer * comm.node_tree_levels(-(-tp // self.fabric.devices_per_node))
            * r.cross_node_all_reduce_seconds)
        # speculative decoding: a step verifies 1 + k tokens a sequence and yields tokens_per_step
        # of them on average; everything below is priced per yielded token
        self.verified = 1 + r.speculative_tokens
        self.tokens_per_step = speculative_yield(r.speculative_tokens, r.draft_acceptance)
        # the k draft passes of a step, each one more layer and the output head for a token a
        # sequence, attending over the context with the draft layer's own KV cache (one layer's
        # share of the model's: DeepSeek-V3's MTP module is a transformer block): their matmul
        # FLOPs a sequence, and their attention FLOPs and KV bytes per token of context
        k, head = r.speculative_tokens, 2 * s.d_model * s.vocab_size
        self.draft_flops = k * ((self.per_token - head) / s.n_layer + head)
        self.draft_attention = k * self.attention / s.n_layer
        self.draft_kv = k * self.kv / s.n_layer
        self._fixed: dict[int, float] = {}
        self._weights: dict[int, float] = {}

    def _tp_comm(self, tokens: int) -> float:
        """Seconds of TP's two all-reduces a layer on ``tokens`` tokens (a decode step's one per
        sequence, a prefill's every prompt token); over the network, the fitted extra each."""
        if self.tp == 1 or not tokens:
            return 0.0
        return comm.decode_tp_comm(self.spec, self.tp, tokens, self.link, in_node=self.in_node,
                                   fabric=self.fabric).seconds + self.network_extra

    def _constant(self, active: int) -> float:
        """Per-token seconds that do not depend on the context: latency and the TP all-reduces
        (of a step verifying ``1 + k`` tokens a sequence, over the tokens it yields)."""
        if active not in self._fixed:
            k = self.verified - 1
            tp_comm = self._tp_comm(active * self.verified)
            eager = 0.0 if self.rates.cuda_graphs else (
                (self.spec.n_layer + k) * self.rates.eager_layer_seconds)  # a draft pass: 1 layer
            self._fixed[active] = (self.rates.decode_step_latency + eager + tp_comm
                                   + active * self.rates.decode_sequence_latency
                                   ) / self.tokens_per_step
        return self._fixed[active]

    def _weight_bytes(self, active: int) -> float:
        """The weights a step of ``active`` sequences reads on one device of the replica: those
        its tokens touch (``1 + k`` a sequence under speculative decoding) and, for each of the
        ``k`` draft passes, a multi-token-prediction layer's (one more layer of the model, the
        experts ``active`` tokens touch, and the output head it shares: DeepSeek-V3's MTP
        module, arXiv:2412.19437, section 2.2)."""
        if active not in self._weights:
            s, w, k = self.spec, self.workload, self.verified - 1
            total = weight_bytes(s, w, active * self.verified)
            if k:
                head = s.vocab_size * s.d_model * w.weight_bytes
                total += k * (weight_bytes(s, w, active) / s.n_layer + head)
            self._weights[active] = total / self.tp
        return self._weights[active]

    def _terms(self, active: int, context_sum: float) -> tuple[float, float, float, float]:
        """``(f0, f1, b0, b1)``: compute and memory seconds of token step ``t`` (every sequence
        one token further) are ``f0 + f1 t`` and ``b0 + b1 t``. Under speculative decoding a
        step computes ``1 + k`` tokens a sequence, each attending over the context, reads the
        KV cache once and writes ``1 + k`` entries; its ``k`` draft passes each compute one
        layer and the output head a sequence and read and extend the draft layer's KV cache;
        it yields :attr:`tokens_per_step` tokens a sequence: its seconds are spread over them."""
        a, v, n = active, self.verified, self.tokens_per_step
        f0 = (v * (a * self.per_token + self.attention * context_sum)
              + a * self.draft_flops + self.draft_attention * context_sum) / self.flop_rate / n
        f1 = (v * self.attention + self.draft_attention) * a / self.flop_rate / n
        b0 = (self._weight_bytes(a) + self.kv * (context_sum + v * a)
              + self.draft_kv * (context_sum + a)) / self.byte_rate / n
        b1 = (self.kv + self.draft_kv) * a / self.byte_rate / n
        return f0, f1, b0, b1

    def seconds(self, steps: int, active: int, context_sum: float, count: bool = False) -> float:
        """Seconds of ``steps`` decode steps of ``active`` sequences whose contexts sum to
        ``context_sum`` at the first step (each step adds ``active`` to it: a step is one token a
        sequence, under speculative decoding a share of an engine step that yields
        :attr:`tokens_per_step`); ``count`` adds their FLOPs to :attr:`flops`.

        Raises:
            ValueError: for a step or sequence count that is not an integer >= 0, or a context
                sum that is not a finite number >= 0.
        """
        try:  # a comparison refuses text as cheaply as it passes a number (a hot path)
            context_ok = 0 <= context_sum < math.inf
        except TypeError:
            context_ok = False
        if not (steps.__class__ is int or isinstance(steps, numbers.Integral)) or steps < 0 \
                or not (active.__class__ is int or isinstance(active, numbers.Integral)) \
                or active < 0 or isinstance(steps, bool) or isinstance(active, bool) \
                or not context_ok:
            raise ValueError(f"DecodeCost.seconds: steps={steps!r} and active={active!r} must be "
                             f"integers >= 0 and context_sum={context_sum!r} a finite number of "
                             "tokens >= 0.")
        if steps == 0 or active == 0:
            return 0.0
        f0, f1, b0, b1 = self._terms(active, context_sum)
        d0, d1 = f0 - b0, f1 - b1  # compute-bound where d0 + d1 t >= 0
        if d1 == 0:
            split, compute_first = steps, d0 >= 0
        elif d1 > 0:  # memory-bound until the lines cross, compute-bound after
            split, compute_first = min(steps, max(0, math.ceil(-d0 / d1))), False
        else:  # compute-bound until they cross
            split, compute_first = min(steps, max(0, math.floor(-d0 / d1) + 1)), True
        first, second = ((f0, f1), (b0, b1)) if compute_first else ((b0, b1), (f0, f1))
        head = _linear_sum(*first, 0, split)
        tail = _linear_sum(*second, split, steps)
        if count:
            self.count(steps, active, context_sum)
        return head + tail + steps * self._constant(active)

    def count(self, steps: int, active: int, context_sum: float) -> None:
        """Add the FLOPs of ``steps`` decode steps (as :meth:`seconds` times them) to
        :attr:`flops`."""
        self.flops += steps * active * self.per_token + self.attention * (
            steps * context_sum + active * steps * (steps - 1) / 2)

    def steps_within(self, elapsed: float, active: int, context_sum: float, limit: int) -> int:
        """The most whole steps (at most ``limit``) that fit in ``elapsed`` seconds.

        Raises:
            ValueError: for a ``limit`` that is not an integer >= 0 or an ``elapsed`` that is
                not a number.
        """
        if isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit < 0:
            raise ValueError(f"DecodeCost.steps_within: limit={limit!r} must be an integer >= 0.")
        if not is_real(elapsed) or math.isnan(elapsed):
            raise ValueError(f"DecodeCost.steps_within: elapsed={elapsed!r} must be a number of "
                             "seconds.")
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.seconds(mid, active, context_sum) <= elapsed:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def prefill_seconds(self, contexts: dict[int, int], count: bool = True) -> float:
        """Seconds to prefill ``{context length: sequences}``: the roofline of one forward over
        all their tokens (compute-bound but for a short batch: each device's weights read once,
        of an MoE the experts all those *tokens* touch, and their keys and values written), plus
        TP's two all-reduces of ``tokens x d_model`` per layer, on the critical path as in a
        decode step (:func:`~rlm_course.cost.comm.decode_tp_comm`); ``count`` adds the FLOPs to
        :attr:`flops` (not for a context prefilled again: model FLOPs count each token once).

        Raises:
            ValueError: for ``contexts`` that is not a dict of token counts to sequence counts.
        """
        if not isinstance(contexts, dict):
            raise ValueError(f"DecodeCost.prefill_seconds: contexts={contexts!r} must be "
                             "{context length: sequences}, e.g. {512: 16}.")
        if not any(c and n for c, n in contexts.items()):  # no sequence, or none of any length:
            return 0.0  # nothing is read (a prefill of zero sequences was priced a weight read)
        flops = self._prefill_flops(contexts)
        tokens = sum(c * n for c, n in contexts.items())
        if count:
            self.flops += flops
        return self._tp_comm(tokens) + max(
            flops / self.prefill_rate,
            (self._weight_bytes(tokens) + self.kv * tokens) / self.byte_rate)

    def _prefill_flops(self, contexts: dict[int, int]) -> float:
        return sum(teacher_forced_flops(self.spec, c, n) for c, n in contexts.items())

    def count_prefill(self, contexts: dict[int, int]) -> None:
        """Add the FLOPs of prefilling ``{context length: sequences}`` to :attr:`flops` (what
        :meth:`prefill_seconds` counts, without timing it)."""
        self.flops += self._prefill_flops(contexts)


# ---------------------------------------------------------------------- training
def pass_flops(spec: TransformerSpec, config: RLConfig, prompt_len: int, lengths,
               recompute: bool = False, engine_log_probs: bool = False) -> dict[str, float]:
    """FLOPs of the trainer's stages for sequences of ``prompt_len + length`` tokens: ``scoring``
    (the forwards :func:`~rlm_course.cost.accounting.predict_passes` prescribes: old policy,
    reference, critic values), ``policy update`` and ``critic update`` (epochs x forward +
    backward, ``3x`` a forward, ``4x`` with recomputation: the hardware's FLOPs; the model's
    FLOPs, for MFU, are those with ``recompute=False``), as
    :func:`rlm_course.cost.anatomy.stage_costs` counts them. With ``engine_log_probs`` the
    rollout engine's log-probs stand for ``pi_old`` and the old policy's forward is skipped
    (verl's ``use_rollout_log_probs``, at the price of the engine/trainer mismatch that
    importance sampling corrects). Stages the algorithm does not run are absent."""
    passes = predict_passes(config)
    if engine_log_probs:
        passes["scoring"].pop("policy", None)
    counts = Counter(lengths)

    def forward(critic: bool) -> float:
        return sum(teacher_forced_flops(spec, prompt_len + t, n, t if critic else None)
                   for t, n in counts.items())

    out = {}
    scoring = sum(c["forward"] * forward(model == "critic") for model, c in passes["scoring"].items())
    if scoring:
        out["scoring"] = scoring
    factor = 4 if recompute else 3
    for model, stage in (("policy", "policy update"), ("critic", "critic update")):
        if model in passes["training"]:
            out[stage] = passes["training"][model]["forward"] * factor * forward(model == "critic")
    return out


@functools.lru_cache(maxsize=4)
def _sequence_flops_memo(spec: TransformerSpec, passes: tuple, prompt_len: int,
                         engine_log_probs: bool) -> dict[tuple[int, bool], dict[str, float]]:
    """``{(length, recompute): pass_flops}``, one memo shared by every :class:`TrainerCost` of the
    same model, passes (:func:`predict_passes`, as a tuple) and prompt: a planner's search prices
    hundreds of layouts on the same lengths, and :func:`pass_flops` depends on nothing else."""
    return {}


@dataclass
class TrainerCost:
    """Seconds of the trainer's stages on ``layout`` (the policy's; a critic and a reference use
    the same layout)."""

    spec: TransformerSpec
    config: RLConfig
    layout: Layout
    device: Device
    rates: Rates
    fabric: comm.Fabric | None
    prompt_len: int
    engine_log_probs: bool = False

    def __post_init__(self) -> None:
        _check_parts("TrainerCost", spec=self.spec, config=self.config, layout=self.layout,
                     device=self.device, rates=self.rates, fabric=self.fabric)
        self.layout.check(self.spec)
        if (isinstance(self.prompt_len, bool) or not isinstance(self.prompt_len, numbers.Integral)
                or self.prompt_len < 0):
            raise ValueError(f"TrainerCost: prompt_len={self.prompt_len!r} must be a whole number "
                             "of tokens >= 0.")
        if self.layout.devices > 1 and self.fabric is None:
            raise ValueError("a trainer on several devices needs the cluster's fabric.")
        strides = axis_strides(self.layout)
        # pipeline hops and ring-attention blocks go point to point: one link between the pair
        self.links = {axis: ((self.fabric.p2p_link if axis in ("pp", "cp") else self.fabric.link)(
                                 size, stride) if size > 1 else None)
                      for axis, (size, stride) in strides.items()}
        # the data-parallel groups, computed once: the dense part's, and the experts' over their
        # expert-data-parallel group: (parameters a device holds, ranks, the ring's link)
        lay = self.layout
        dense, experts = params_per_device(self.spec, lay)
        groups = [(dense, lay.dp * lay.cp, lay.tp)]
        if experts:
            edp, stride = strides["edp"] if lay.ep > 1 else (lay.dp * lay.cp, lay.tp)
            groups.append((experts, edp, stride))
        self.dp_groups = [(params, n, self.fabric.ring_link(n, stride))
                          for params, n, stride in groups if n > 1]
        passes = predict_passes(self.config)
        shape = tuple((stage, model, c["forward"], c["backward"])
                      for stage, models in passes.items() for model, c in models.items())
        self._flops = _sequence_flops_memo(self.spec, shape, self.prompt_len,
                                           self.engine_log_probs)

    def sequence_flops(self, length: int, recompute: bool | None = None) -> dict[str, float]:
        """:func:`pass_flops` of one sequence of ``length`` response tokens (hardware FLOPs with
        the layout's recomputation, or as ``recompute`` says), computed once per length."""
        recompute = self.layout.recompute if recompute is None else recompute
        key = (length, recompute)
        if key not in self._flops:
            self._flops[key] = pass_flops(self.spec, self.config, self.prompt_len, [length],
                                          recompute, self.engine_log_probs)
        return self._flops[key]

    def flops(self, lengths, recompute: bool | None = None) -> dict[str, float]:
        """``{stage: FLOPs}`` of a batch (:meth:`sequence_flops` summed)."""
        out: dict[str, float] = {}
        for t, n in Counter(lengths).items():
            for stage, value in self.sequence_flops(t, recompute).items():
                out[stage] = out.get(stage, 0.0) + n * value
        return out

    def seconds(self, lengths, optimizer_steps: int | None = None) -> dict[str, float]:
        """``{stage: seconds}`` for a batch of responses of ``lengths`` tokens (each after a
        ``prompt_len``-token prompt), ``optimizer_steps`` gradient steps per update epoch
        (default the configuration's ``minibatches``).

        The compute of a stage is that of its **busiest data-parallel replica**, step by step:
        each optimizer step's sequences (a deterministic shuffle of the batch cut into
        mini-batches, the same whatever order the lengths come in: a simulator hands them over
        in the order they finished) go to the ``dp`` replicas longest first, each to the least
        loaded one (the LPT rule; verl and AReaL balance their ranks the same way, with Karmarkar-Karp),
        and the step lasts as long as the replica with the most FLOPs. With equal lengths that
        is ``FLOPs / (devices x peak x hfu)``; with a long tail, a replica holding one of the
        longest sequences can outlast the average by far, and adding replicas no longer helps.
        To that come the exposed communication and the fixed costs (the module docstring).

        Raises:
            ValueError: for ``lengths`` that are not positive integers, a prompt and longest
                response past the model's context window, or ``optimizer_steps`` that is not None
                or a positive integer.
        """
        try:
            lengths = list(lengths)
        except TypeError:
            raise ValueError(f"TrainerCost.seconds: lengths={lengths!r} must be the responses' "
                             "lengths in tokens, e.g. [512, 1024].") from None
        if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) and t >= 1
                   for t in lengths):
            bad = next(t for t in lengths if isinstance(t, bool)
                       or not isinstance(t, numbers.Integral) or t < 1)
            raise ValueError(f"TrainerCost.seconds: a response length of {bad!r}: lengths must be "
                             "positive integers (tokens).")
        if optimizer_steps is not None and (isinstance(optimizer_steps, bool) or not isinstance(
                optimizer_steps, numbers.Integral) or optimizer_steps < 1):
            raise ValueError(f"TrainerCost.seconds: optimizer_steps={optimizer_steps!r} must be a "
                             "positive integer (None: the configuration's minibatches).")
        lay, spec, dev, r = self.layout, self.spec, self.device, self.rates
        lengths = list(lengths)
        if not lengths:
            return {}
        spec.check_context(int(self.prompt_len), int(max(lengths)))  # no position past the window
        steps = self.config.minibatches if optimizer_steps is None else optimizer_steps
        lengths.sort()  # the shuffle below from a canonical order: the batch, not its order
        sequences = len(lengths)
        tokens = sum(self.prompt_len + t for t in lengths)
        mean_seq = tokens / sequences
        per_sequence = {t: self.sequence_flops(t) for t in set(lengths)}
        order = list(range(sequences))
        random.Random(0).shuffle(order)
        out = {}
        for stage in per_sequence[lengths[0]]:
            backward = stage != "scoring"
            mfu = (r.train_hfu if backward else r.forward_mfu) * (
                r.moe_efficiency if spec.is_moe else 1.0)
            cut = self._steps_per_epoch(sequences, steps) if backward else 1
            busiest = sum(_busiest([per_sequence[lengths[i]][stage] for i in order[k::cut]], lay.dp)
                          for k in range(cut))
            epochs = self.config.ppo_epochs if backward else 1  # (in the FLOPs already)
            replica = lay.tp * lay.pp * lay.cp
            compute = busiest / (replica * dev.peak_flops * r.train_flops_factor * mfu)
            opt_steps = cut * epochs if backward else 1
            per_rank = sequences / (lay.dp * cut)
            # sequences per micro-batch: micro_batch of them, or the token budget's share (at
            # least one); at the mean length itself, not rounded (a 768.02-token mean rounded to
            # 768 made a micro-batch hold 0.99998 sequences and added one on every rank)
            mb_seq = lay.micro_tokens(mean_seq, scoring=not backward) / mean_seq
            m = max(1, math.ceil(per_rank / mb_seq - 1e-9))
            if lay.pp > 1:
                compute /= 1 - (lay.pp - 1) / (m + lay.pp - 1)
            micro = m * opt_steps  # micro-batches each device runs in this stage
            # tokens of the average micro-batch: the m of them hold the rank's tokens, a last
            # one partly filled (charging m full ones overpriced the TP traffic by up to one)
            mb_tokens = per_rank * mean_seq / (m * lay.cp)
            layers = spec.n_layer / lay.pp
            total = compute
            if lay.tp > 1:
                total += micro * comm.tensor_parallel_comm(
                    spec, lay.tp, mb_tokens, self.links["tp"], backward, layers=1,
                    recompute=lay.recompute).seconds * layers
            if lay.ep > 1:
                # each rank dispatches its sequence-parallel shard, 1 / tp of the micro-batch's
                # tokens (Megatron-Core's all-to-all dispatcher: [S/TP, B, H] in, all-to-all
                # over EP, then an all-gather over the expert-TP group, 1 by default in NeMo-RL)
                per_layer = comm.expert_parallel_comm(
                    spec, lay.ep, mb_tokens / lay.tp, self.links["ep"], backward,
                    recompute=lay.recompute).seconds / spec.n_layer
                total += micro * per_layer * layers
            if lay.pp > 1:
                hop = comm.pipeline_comm(spec, mb_tokens, self.links["pp"], backward).seconds
                total += opt_steps * (lay.pp - 1) * hop
            if lay.cp > 1:
                ring = comm.context_parallel_comm(spec, lay.cp, mb_tokens * lay.cp,
                                                  self.links["cp"], backward).seconds
                total += comm.exposed(micro * ring * layers / spec.n_layer, compute, 1, True)
            if lay.dp * lay.cp > 1 or lay.ep > 1:
                total += self._data_parallel(compute, opt_steps, m, backward)
            total += micro * r.micro_batch_seconds
            if backward:
                total += opt_steps * (r.optimizer_step_seconds + self.adam_seconds())
            out[stage] = total
        return out

    def optimizer_steps(self, sequences: int, minibatches: int | None = None) -> int:
        """Optimizer steps an update of ``sequences`` responses takes: ``minibatches`` (default
        the configuration's) gradient steps an epoch, at most one a response, times
        ``ppo_epochs``."""
        return self._steps_per_epoch(sequences, minibatches) * self.config.ppo_epochs

    def _steps_per_epoch(self, sequences: int, minibatches: int | None = None) -> int:
        steps = self.config.minibatches if minibatches is None else minibatches
        return max(1, min(steps, sequences))

    def adam_seconds(self) -> float:
        """Seconds of one Adam step on one device: its weights, gradients and optimizer states
        (after ZeRO's sharding) read once and the updated ones written once, at the memory
        bandwidth (the update is memory-bound). With offload (ZeRO-Offload, Ren et al. 2021;
        Megatron's ``optimizer_cpu_offload``), the gradients go to the host, the CPU steps the
        device's optimizer shard and the new weights come back over the host link, the copies
        overlapped with the CPU's step (Megatron's ``overlap_cpu_optimizer_d2h_h2d``): the
        longer of the two. Each device moves and steps only its optimizer shard (``1 / dp``
        under ZeRO; its gradients out, its bf16 weights back); the CPU runs at
        :attr:`Rates.host_adam_params_per_second`, shared by the layout's devices on one host
        (:attr:`~rlm_course.cost.hardware.Device.host_devices`: 8 on an H100 server, 4 on a
        GB200 compute tray), each stepping its shard at once."""
        lay = self.layout
        dense, experts = params_per_device(self.spec, lay)
        dp_dense = lay.dp * lay.cp
        dp_expert = lay.tp * dp_dense // lay.ep if lay.ep > 1 else dp_dense
        states = {}
        for part, n in ((dense, dp_dense), (experts, dp_expert)):
            for k, v in model_states(part, n, lay.zero, False, lay.grad_bytes).items():
                states[k] = states.get(k, 0.0) + v
        if lay.offload:
            # the parameters this device's optimizer steps: its 1/dp shard under ZeRO (Megatron's
            # distributed optimizer, ZeRO-Offload), all of its copy without
            shard = sum(p / n if lay.zero else p for p, n in ((dense, dp_dense),
                                                              (experts, dp_expert)))
            copies = shard * (lay.grad_bytes + 2) / self.rates.host(self.device)
            sharing = min(lay.devices, self.device.host_devices)
            return max(copies, shard * sharing / self.rates.host_adam_params_per_second)
        return 2 * sum(states.values()) / self.device.memory_bandwidth

    def _data_parallel(self, compute: float, opt_steps: int, micro: int, backward: bool) -> float:
        """Exposed data-parallel seconds of a stage: ZeRO-0/1 sync the gradients once per
        optimizer step (the backward, 2/3 of the compute, hides them); ZeRO-2 reduce-scatters
        them after every micro-batch's backward and all-gathers the parameters once per step
        (:func:`~rlm_course.cost.comm.data_parallel_comm`); ZeRO-3
        gathers the weights for every micro-batch (and reduce-scatters its gradients), hidden
        behind all of it. The experts sync over their expert-data-parallel group."""
        lay, spec = self.layout, self.spec
        cost = comm.NONE
        for params, n, link in self.dp_groups:
            cost = cost + comm.data_parallel_comm(params, n, link, lay.zero,
                                                  grad_bytes=lay.grad_bytes, micro_batches=micro)
        if lay.zero == 3:
            per_micro = cost if backward else cost * (1 / 3)  # a forward gathers the weights once
            total = per_micro.seconds * micro * opt_steps
            return comm.exposed(total, compute, spec.n_layer * micro * opt_steps, lay.overlap)
        if not backward:
            return 0.0
        hidden = compute * 2 / 3 / opt_steps
        return opt_steps * comm.exposed(cost.seconds, hidden, 25, lay.overlap)


def _busiest(loads: list[float], replicas: int) -> float:
    """The largest total when ``loads`` go, largest first, each to the least loaded of
    ``replicas`` bins (Graham's LPT rule, within 4/3 of the best split)."""
    if replicas <= 1 or len(loads) <= 1:
        return sum(loads) if replicas <= 1 else max(loads, default=0.0)
    if len(loads) <= replicas:
        return max(loads)
    bins = [0.0] * replicas
    for load in sorted(loads, reverse=True):
        heapq.heapreplace(bins, bins[0] + load)
    return max(bins)


# ---------------------------------------------------------------------- moving weights and state
def weight_sync(spec: TransformerSpec, device: Device, placement: str, generation_tp: int,
                replicas: int, trainer: Layout, rates: Rates, fabric: comm.Fabric | None = None,
                weight_bytes: int = 2) -> SyncCost:
    """One weight sync from ``trainer`` to ``replicas`` generation replicas of ``generation_tp``
    devices: :func:`rlm_course.cost.weight_sync.sync_cost` with the software rates, transport and
    links of ``rates`` (the model chapter 12's stage 4 uses too).

    Raises:
        ValueError: if ``rates`` is not a Rates, or as :func:`sync_cost` does.
    """
    _check_parts("weight_sync", rates=rates, device=device)
    fabric = fabric or comm.Fabric.of(device, rates.intra_link, rates.inter_link)
    tensor_seconds = (rates.colocated_tensor_seconds if placement == "colocated"
                      else rates.sync_tensor_seconds)
    return sync_cost(spec, device, placement, generation_tp=generation_tp, replicas=replicas,
                     trainer=trainer, fabric=fabric, transport=rates.sync_transport,
                     pipeline_whole=rates.sync_pipeline_whole,
                     weight_bytes=weight_bytes, tensor_seconds=tensor_seconds,
                     fixed_seconds=rates.sync_fixed_seconds)


def offload_seconds(nbytes: float, rates: Rates, device: Device) -> float:
    """Seconds to move ``nbytes`` per device to host memory and back (both ways) over the host
    link (:meth:`Rates.host`).

    Raises:
        ValueError: for a byte count that is not a finite number >= 0.
    """
    check_amount("nbytes", nbytes)
    return 2 * nbytes / rates.host(device)
