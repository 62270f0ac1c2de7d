"""Weight sync, stage 4 of an RL iteration, at any scale: the one model that chapters 12 (stage 4,
the Ray run's prediction) and 14 (the simulator and planner) price it with.

After every update the rollout engine needs the trainer's new weights. What a real system pays
(verl, slime, NeMo-RL, AReaL, checkpoint-engine; the reference notes, section 5) is rarely the
wire alone: the software around it usually dominates (slime cut a Qwen3-235B sync from 8 minutes
to 1 by removing one cache-clearing call per update; verl's per-tensor path takes 15.8 s for
Qwen3-30B-A3B on 16 + 16 H20s, its checkpoint engine 4.4 s, for the same 61 GB). :func:`sync_cost`
adds five terms, each with its source:

* **gather** (reshard): the training shards become what is sent. The trainers of the course's
  published runs assemble every whole tensor on every rank before a sync, colocated or not
  (:func:`whole_tensor_gather_seconds`: FSDP's ``full_tensor()``; Megatron-Bridge's
  ``export_hf_weights``, a pipeline broadcast and a TP or EP all-gather per tensor); colocated,
  each device's engine then keeps its shard, and a rank-0 ``broadcast`` (one collective per
  tensor) or ``packed`` broadcast (tensors packed into buckets) sends them whole. The least a
  colocated device must receive is the part of its generation shard its training shard lacks
  (:func:`reshard_received_bytes`: HybridFlow's scheme, :func:`predict_transition`,
  arXiv:2409.19256, Table 2; a PP stage's layers are not a TP shard, so PP always moves bytes):
  the colocated :attr:`SyncCost.ideal`. A ``sharded`` transfer sends the trainer's shards as
  they are (checkpoint-engine, NeMo-RL's ``nccl_reshard`` refit), no gather;
* **transfer**: none colocated (CUDA IPC handles or the same process); disaggregated, a
  pipelined broadcast of the whole model from one rank to every rollout device (verl's
  one-step-off and fully-async recipes; packed, NeMo-RL's NCCL refit up to v0.7,
  ``packed_broadcast_producer``): ``B x ceil(log2(r + 1)) x alpha +
  M / beta`` over the group's link, ``B`` buckets, ``r`` receivers, across nodes at all of a
  node's network cards together (:func:`broadcast_link`); or shard-parallel, every region of the
  model leaving the trainer once and every rollout device receiving its ``M / generation_tp``
  (the larger decides), as NeMo-RL's ``nccl_reshard`` refit moves it
  (``nemo_rl/weight_sync/xferdtensor_python.py``, the implementation its published refit times
  were measured with): to one engine, each region from the first trainer device that holds it
  (a data-parallel trainer's copy on one device sends the whole model); to ``r > 1`` engines,
  each region split into ``r`` stripes, sent round-robin from the devices that hold it (``min(c,
  r)`` of its ``c`` copies share the sending) and all-gathered among the engines;
* **copies** at the memory bandwidth: packing the buckets on the sender and unpacking them on the
  receiver, one read and one write of every byte each (``4 M / bandwidth`` in all for a
  broadcast), or colocated the engine's load of its shard (``2 M / (generation_tp bandwidth)``);
  the term the course's Ray run measures (chapter 12) and the alpha-beta model alone leaves out;
* **software**: a fixed cost per tensor per level of the sync group's tree,
  ``tensors x tensor_seconds x ceil(log2 n)`` (``n`` ranks in the per-tensor collectives: the
  Python loop over the state dict, one gather and one broadcast launch and one ``load_weights``
  call per tensor; an MoE of 128 experts has about 400 tensors per layer, which is why MoE syncs
  are slow); packed into buckets, a tensor is packed once on the sender and loaded once on every
  receiver at the same time, a sharded transfer sends each shard point to point, and a colocated
  hand-over converts each tensor in the same process or passes it by a CUDA IPC handle:
  ``tensors x tensor_seconds``, no tree (the simulator's rates give the colocated path its own
  rate);
* **fixed**: pausing and draining the engine, clearing and re-allocating its KV cache, resuming
  (``fixed_seconds``).

``tensor_seconds`` and ``fixed_seconds`` are rates measured on published runs (chapter 14's
calibration); with both at 0 the model is the wire plus the copies. :attr:`SyncCost.ideal` is the
lower bound no system beats, the bytes over the links alone: the busiest device's over its own
link, and across nodes each rollout node's over all its cards together (a node takes in a
replica once; NVLink copies it on).

The bucketed broadcast of one sender (``broadcast_seconds``) is the alpha-beta formula chapter 12
fits and measures on real processes (Hockney's model; a binomial tree doubles the holders each
round, as :meth:`rlm_course.parallel.world.World.broadcast`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlm_course.cost.architectures import TransformerSpec
from rlm_course.cost.comm import Fabric, Link, all_gather_seconds
from rlm_course.cost.hardware import Device
from rlm_course.utils import as_int, check_amount, check_kinds
from rlm_course.vocabulary import PLACEMENTS

if TYPE_CHECKING:
    from rlm_course.cost.layouts import Layout

TRANSPORTS = ("broadcast", "packed", "sharded")
BUCKET_BYTES = 512 * 2**20  # slime's and verl's bucket size


def tensor_count(spec: TransformerSpec) -> int:
    """Tensors of a Hugging Face state dict of ``spec``: per layer the q, k, v and output
    projections (and their biases; under MLA the query's two projections and the latent's, with
    their two norms, and the output: 7), two norms (four tensors with LayerNorm biases or
    QK-norms), the MLP's two or three matrices (and biases) per expert, the shared experts as one
    MLP of their summed width (DeepSeek's ``shared_experts``), the router and its bias
    (:attr:`~rlm_course.cost.architectures.TransformerSpec.router_bias`), the first
    ``n_dense_layers`` layers' one MLP instead; the embedding, the output head unless tied, the
    final norm. DeepSeek-V3: 45,395 (58 layers of 782, 3 of 12).

    Raises:
        ValueError: if ``spec`` is not a TransformerSpec.
    """
    check_kinds([("spec", spec, TransformerSpec, "get_spec('qwen2.5-7b')")], "tensor_count: ")
    if spec.kv_latent:  # q_a (and its norm) and q_b, or q; kv_a, its norm, kv_b; o
        per_layer = (3 if spec.q_lora_rank else 1) + 3 + 1
    else:
        per_layer = 4 + (3 if spec.qkv_bias else 0) + (1 if spec.out_bias else 0)
    norm_params = spec.norm_params_per_layer or 2 * spec.d_model
    per_layer += 4 if norm_params > 2 * spec.d_model else 2  # LayerNorm biases, or QK-norms
    mlp = (3 if spec.glu else 2) * (2 if spec.mlp_bias else 1)
    ends = 2 + (0 if spec.tied_embeddings else 1)
    if not spec.is_moe:
        return spec.n_layer * (per_layer + mlp) + ends
    moe = (per_layer + (spec.n_experts + (1 if spec.n_shared_experts else 0)) * mlp
           + 1 + spec.router_bias)
    return spec.moe_layers * moe + spec.n_dense_layers * (per_layer + mlp) + ends


def broadcast_link(fabric: Fabric, ranks: int) -> Link:
    """The link a broadcast over a group of ``ranks`` ranks, filling nodes in rank order, runs
    at: a ring collective's (:meth:`~rlm_course.cost.comm.Fabric.ring_link`), across nodes the
    cards of the fewest of the group's GPUs on any node together. verl's and NeMo-RL's update
    groups hold all the trainer's ranks and all the rollout's, whole nodes: 8 cards on H100
    nodes; a group of 9 (8 + 1) crosses by the last node's one card.

    Raises:
        ValueError: for fewer than one rank, or if the fabric has no link for such a group.
    """
    ranks = _positive_int("broadcast_link", "ranks", ranks)
    return fabric.ring_link(ranks)


def broadcast_seconds(total_bytes: float, messages: int, link: Link, receivers: int = 1,
                      pipelined: bool = False) -> float:
    """Alpha-beta seconds of a bucketed broadcast of ``total_bytes`` in ``messages`` messages
    from one sender to ``receivers`` receivers on a binomial tree: ``ceil(log2(receivers + 1))
    x (messages x alpha + total_bytes / beta)``, or ``pipelined`` in chunks (NCCL's broadcast:
    every round forwards while the next chunk arrives) ``ceil(log2(receivers + 1)) x messages x
    alpha + total_bytes / beta``. With one receiver both are ``B alpha + M / beta``.

    Raises:
        ValueError: for a size that is not a finite number >= 0, a message or receiver count
            that is not a positive integer, or a ``link`` that is not a Link.
    """
    check_amount("broadcast_seconds: total_bytes", total_bytes)
    messages = _positive_int("broadcast_seconds", "messages", messages)
    receivers = _positive_int("broadcast_seconds", "receivers", receivers)
    check_kinds([("link", link, Link, "Fabric.of(get_device('H100-SXM-80GB')).inter")],
                "broadcast_seconds: ")
    rounds = math.ceil(math.log2(receivers + 1))
    if pipelined:
        return rounds * messages * link.alpha + total_bytes / link.beta
    return rounds * (messages * link.alpha + total_bytes / link.beta)


def predict_transition(model_bytes: float, tp: int, tp_gen: int, pp: int = 1, pp_gen: int = 1,
                       link: Link | None = None) -> dict[str, dict[str, float]]:
    """Resharding a colocated actor from its training layout to its generation layout: bytes
    received, peak and redundant memory per rank of both schemes for a model of ``model_bytes``
    (the split weights, e.g. ``2 x parameters`` in bf16), training on TP ``tp`` x PP ``pp`` and
    generating on TP ``tp_gen`` x PP ``pp_gen`` (HybridFlow, arXiv:2409.19256, Table 2; its
    "HybridFlow-V" row is the naive scheme here). Derivation of HybridFlow's row: a micro
    data-parallel group of ``g = tp pp / (tp_gen pp_gen)`` ranks all-gathers one
    ``M / (tp_gen pp_gen)`` generation shard, of which each rank holds ``M / (tp pp)``, so each
    rank receives ``(g - 1) M / (tp pp) = (tp pp - tp_gen pp_gen) / (tp_gen pp_gen tp pp) M``.
    With a ``link``, the seconds of each all-gather on a ring:
    ``(g - 1) (alpha + model_bytes / (tp pp) / beta)`` for a group of ``g``.

    Returns:
        ``{"naive": {...}, "hybridflow": {...}}``, each with ``received_bytes``, ``peak_bytes``,
        ``redundant_bytes`` and ``group`` (and ``seconds`` with a link), and ``"reduction"``: the
        fraction of bytes (and seconds) HybridFlow saves.

    Raises:
        ValueError: unless ``tp_gen x pp_gen`` divides ``tp x pp``, or for a model size that is
            not a finite number >= 0.
    """
    check_amount("model_bytes", model_bytes)
    tp, tp_gen, pp, pp_gen = (
        _positive_int("predict_transition", name, value)
        for name, value in (("tp", tp), ("tp_gen", tp_gen), ("pp", pp), ("pp_gen", pp_gen)))
    if link is not None:
        check_kinds([("link", link, Link, "Fabric.of(get_device('H100-SXM-80GB')).intra")],
                    "predict_transition: ")
    train, gen = tp * pp, tp_gen * pp_gen
    if train % gen:
        raise ValueError(f"predict_transition: generation TP x PP = {tp_gen} x {pp_gen} = "
                         f"{gen} must be a divisor of training TP x PP = {tp} x {pp} = "
                         f"{train}; for other degrees use reshard_received_bytes.")
    m = model_bytes
    naive = {"received_bytes": (train - 1) / train * m, "peak_bytes": m + m / train,
             "redundant_bytes": m / train, "group": train}
    hybrid = {"received_bytes": (train - gen) / (gen * train) * m, "peak_bytes": m / gen,
              "redundant_bytes": 0.0, "group": train // gen}
    out = {"naive": naive, "hybridflow": hybrid,
           "reduction": {"bytes": 1 - hybrid["received_bytes"] / naive["received_bytes"]
                         if naive["received_bytes"] else 0.0}}
    if link is not None:
        for scheme in (naive, hybrid):
            g = scheme["group"]
            scheme["seconds"] = (g - 1) * (link.alpha + m / train / link.beta) if g > 1 else 0.0
        out["reduction"]["seconds"] = (1 - hybrid["seconds"] / naive["seconds"]
                                       if naive["seconds"] else 0.0)
    return out


def _positive_int(owner: str, name: str, value) -> int:
    """``value`` as a Python int (numpy's integers too), or a ValueError naming it."""
    value = as_int(value)
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise ValueError(f"{owner}: {name}={value!r} must be a positive integer.")
    return value


def _check_layout(owner: str, trainer) -> None:
    """A ValueError unless ``trainer`` is a Layout, known by what it has
    (:mod:`rlm_course.cost.layouts` imports this module's users)."""
    if not all(hasattr(trainer, a) for a in ("tp", "pp", "cp", "dp", "ep", "zero", "devices",
                                             "check", "describe")):
        raise ValueError(f"{owner}: trainer={trainer!r} must be a Layout; pass e.g. "
                         "Layout(tp=8, dp=2) (rlm_course.cost.layouts).")


def _kept(train: int, gen: int) -> float:
    """The share of the columns a device keeps when training holds one of ``train`` column blocks
    and generation needs one of ``gen``: the smaller block when one degree divides the other
    (the blocks nest); else the blocks straddle, and with ranks in order the busiest device
    keeps none of its generation block (TP 6 -> TP 4: the third device of a generation rank
    whose block spans two training blocks)."""
    if train % gen == 0 or gen % train == 0:
        return 1 / max(train, gen)
    return 0.0


def _ideal(fabric: Fabric, link: Link | None, ranks: int, total: float, shard: float,
           trainer_devices: int, rollout_devices: int) -> float:
    """The least seconds any disaggregated sync of ``total`` bytes takes, whatever its transport:
    the model leaves the trainer's devices once (``total / trainer_devices`` each over its own
    link); each rollout device ends up with its ``shard``; across nodes, a rollout node takes in
    what its devices hold between them (the whole model once a node holds a replica: its own
    NVLink copies it on) through all its cards together, and each device's shard arrives over
    NVLink at least. Over one given ``link`` (or inside one node): the larger of a trainer
    device's and a rollout device's bytes over it. A rollout pool smaller than a node shares
    its node with trainer devices, which may hold the model between them (a GB200 NVL72 domain
    of 72): nothing need cross a network card, and each shard arrives over NVLink at least."""
    wire = link or fabric.link(ranks)
    if link is not None or wire is not fabric.inter or fabric.intra is None:
        return max(total / trainer_devices, shard) / wire.beta
    if rollout_devices < fabric.devices_per_node:
        return max(total / trainer_devices, shard) / fabric.intra.beta
    per_node = min(fabric.devices_per_node, rollout_devices)
    ingress = fabric.cards_link(per_node)  # a rollout node's cards together
    return max(total / trainer_devices / wire.beta, min(total, per_node * shard) / ingress.beta,
               shard / fabric.intra.beta)


def whole_tensor_gather_seconds(spec: TransformerSpec, trainer: "Layout", fabric: Fabric,
                                weight_bytes: int = 2, pipeline_whole: bool = False) -> float:
    """Seconds for every device of a trainer laid out as ``trainer`` to assemble every whole
    tensor of ``spec``, which is what the trainers of open RL systems do before each sync, on every
    rank, colocated or not, since every rank runs the same export:

    * ZeRO-3/FSDP: ``full_tensor()`` of every parameter, the all-gather over the data-parallel
      group of each rank's slice (verl's FSDP engine), before any TP, EP or PP gather below;
    * Megatron (Megatron-Bridge's ``export_hf_weights``, NeMo-RL's refit from v0.4 on; verl's
      ``per_tensor_generator``): for each tensor in turn, the owning pipeline stage broadcasts
      its shard to the other stages (``(pp - 1) / pp`` of the shards ``D / tp + E / s`` reach a
      device, ``D`` the dense bytes, ``E`` the routed experts', ``s`` the experts' split: EP, or
      TP without it; the stages' ranks lie on different nodes, one card each), then every stage
      all-gathers it over TP (the dense part, ``D``) or EP (the experts, ``E``): the whole model
      reaches every device. ``pipeline_whole``: NeMo-RL v0.3's ``gather_params``
      (``nemo_rl/models/megatron/refit_utils.py`` at v0.3.0), which all-gathers each tensor over
      TP on its own stage first and broadcasts it whole over the stages: ``(pp - 1) / pp`` of
      ``D`` instead of ``D / tp`` crosses them.

    Colocated, each device then hands its engine the shard the engine needs and drops the rest
    (:func:`reshard_received_bytes` is the least a device must receive instead: HybridFlow's
    scheme, which no system of the course's published runs uses); disaggregated, rank 0
    broadcasts what it assembled.

    Raises:
        ValueError: as :meth:`Layout.check` for a layout the model refuses; for a ``spec``,
            ``trainer`` or ``fabric`` of the wrong kind, a ``weight_bytes`` that is not a
            positive integer, or a ``pipeline_whole`` that is not a bool.
    """
    owner = "whole_tensor_gather_seconds"
    if not isinstance(pipeline_whole, bool):
        raise ValueError(f"{owner}: pipeline_whole={pipeline_whole!r} must be True (NeMo-RL "
                         "v0.3's gather_params) or False (Megatron-Bridge's export).")
    check_kinds([("spec", spec, TransformerSpec, "get_spec('qwen2.5-7b')"),
                 ("fabric", fabric, Fabric, "Fabric.of(get_device('H100-SXM-80GB'))")],
                f"{owner}: ")
    _check_layout(owner, trainer)
    weight_bytes = _positive_int(owner, "weight_bytes", weight_bytes)
    trainer.check(spec)
    total = spec.params() * weight_bytes
    experts = spec.expert_params() * weight_bytes
    dense = total - experts
    tp, pp, ep = trainer.tp, trainer.pp, trainer.ep
    dp = trainer.dp * trainer.cp  # the data-parallel ranks, tp apart (layouts.axis_strides)
    split = ep if ep > 1 else tp
    seconds = 0.0
    if trainer.zero == 3 and dp > 1:  # FSDP first makes each rank's TP/EP/PP shard whole
        seconds += all_gather_seconds((dense / tp + experts / split) / pp, dp,
                                      fabric.ring_link(dp, tp))
    if tp > 1:
        seconds += all_gather_seconds(dense, tp, fabric.ring_link(tp))
    if experts and split > 1:  # an EP group: consecutive ranks (layouts.axis_strides)
        seconds += all_gather_seconds(experts, split, fabric.ring_link(split))
    if pp > 1:
        stages = fabric.ring_link(pp, trainer.devices // pp)
        shard = dense if pipeline_whole else dense / tp
        seconds += (shard + experts / split) * (pp - 1) / pp / stages.beta
    return seconds


def reshard_received_bytes(spec: TransformerSpec, tp: int, pp: int, ep: int,
                           generation_tp: int, weight_bytes: int = 2,
                           fsdp: int = 1) -> tuple[float, int]:
    """Bytes the busiest device receives when a colocated actor goes from its training layout
    (TP ``tp`` x PP ``pp``, routed experts over ``ep`` ranks, over ``tp`` without EP; each shard
    split again over ``fsdp`` ranks by ZeRO-3/FSDP) to generation at TP ``generation_tp`` (no
    PP), and from how many devices (itself included).

    A device keeps what its training shard and its generation shard share and receives the rest
    of its generation shard: for the dense part ``D``, a generation shard is ``D / g`` (a column
    block of every layer, ``g = generation_tp``) and a training shard ``D / (tp pp fsdp)``;
    where one of ``tp`` and ``g`` divides the other they share ``D / (max(tp, g) pp fsdp)``,
    else the busiest device shares nothing (:func:`_kept`). The routed experts ``E`` with EP:
    the training shard holds ``1 / ep`` of the experts whole, the generation shard ``1 / g`` of
    every expert's columns, and they share ``E / (ep g pp fsdp)``. Where ``g`` divides ``tp``,
    without PP and FSDP, this is HybridFlow's resharding (:func:`predict_transition`,
    arXiv:2409.19256, Table 2): ``(tp - g) / (g tp) M``. With PP it is not free even when
    ``tp x pp = g``: training on TP 1 x PP 2 and generating on TP 2, each device holds half the
    layers whole and needs half the columns of all of them, and receives a quarter of the model.
    With FSDP alone it is the all-gather of the generation shard, ``(fsdp - 1) / fsdp`` of it.

    Returns:
        ``(received bytes, devices)``; bytes at ``weight_bytes`` per parameter.

    Raises:
        ValueError: for a degree or size that is not a positive integer, or a degree the model
            does not allow (TP: the heads; PP: at most the layers; EP: dividing the experts of
            an MoE model).
    """
    owner = "reshard_received_bytes"
    tp, pp, ep, generation_tp, weight_bytes, fsdp = (
        _positive_int(owner, name, value) for name, value in (
            ("tp", tp), ("pp", pp), ("ep", ep), ("generation_tp", generation_tp),
            ("weight_bytes", weight_bytes), ("fsdp", fsdp)))
    spec.check_degree("tp", tp)
    spec.check_degree("tp", generation_tp)
    if pp > spec.n_layer:
        raise ValueError(f"{owner}: pp={pp} exceeds {spec.name}'s {spec.n_layer} layers.")
    if ep > 1 and (not spec.is_moe or spec.n_experts % ep):
        raise ValueError(f"{owner}: ep={ep}: {spec.name} has {spec.n_experts} expert(s); expert "
                         "parallelism needs an MoE model and a degree dividing its experts.")
    g = generation_tp
    experts = spec.expert_params() * weight_bytes
    dense = spec.params() * weight_bytes - experts
    columns = -(-tp // g) + (0 if _kept(tp, g) else 1)  # training blocks a generation block spans
    kept = dense * _kept(tp, g)
    if experts and ep > 1:
        kept += experts / (ep * g)
        devices = pp * fsdp * max(ep, columns)
    else:
        kept += experts * _kept(tp, g)
        devices = pp * fsdp * columns
    return max(0.0, (dense + experts) / g - kept / (pp * fsdp)), devices


@dataclass(frozen=True)
class SyncCost:
    """What one weight sync costs (see the module docstring); seconds unless named bytes.

    Attributes:
        placement, transport: how the weights move.
        bytes: the model's weights at the rollout's precision.
        network_bytes: bytes the busiest trainer device sends (0 colocated; a sharded
            transfer's rollout devices also forward stripes among themselves).
        messages: buckets per sync (a sharded transfer's: the busiest device's).
        tensors: tensors in the state dict.
        gather, transfer, copies, software, fixed: the five terms.
        ideal: the lower bound no transport beats (:func:`_ideal`): colocated, the least a
            device receives (:func:`reshard_received_bytes`) through all its ports at once (its
            one group's link when the trainer is one shard); disaggregated, the trainer's devices
            sending the model once and each rollout node taking in its devices' shards through
            its cards.
    """

    placement: str
    transport: str
    bytes: float
    network_bytes: float
    messages: int
    tensors: int
    gather: float
    transfer: float
    copies: float
    software: float
    fixed: float
    ideal: float

    @property
    def seconds(self) -> float:
        return self.gather + self.transfer + self.copies + self.software + self.fixed

    def terms(self) -> dict[str, float]:
        """``{term: seconds}`` of the five terms."""
        return {"gather": self.gather, "transfer": self.transfer, "copies": self.copies,
                "software": self.software, "fixed": self.fixed}


def sync_cost(spec: TransformerSpec, device: Device, placement: str = "disaggregated", *,
              generation_tp: int = 1, replicas: int = 1, trainer: "Layout | None" = None,
              fabric: Fabric | None = None, transport: str = "broadcast",
              bucket_bytes: float = BUCKET_BYTES, weight_bytes: int = 2,
              tensor_seconds: float = 0.0, fixed_seconds: float = 0.0,
              link: Link | None = None, memory_bandwidth: float | None = None,
              pipelined: bool = True, pipeline_whole: bool = False) -> SyncCost:
    """Seconds of one weight sync of ``spec`` from a trainer laid out as ``trainer`` (default:
    one device) to ``replicas`` generation replicas of ``generation_tp`` devices of ``device``
    (see the module docstring for the terms).

    Args:
        placement: ``colocated`` (a hybrid engine: the same devices train and generate) or
            ``disaggregated`` (separate pools).
        fabric: the cluster's links (default: the device's catalog links).
        transport: ``broadcast`` (rank 0 sends every whole tensor to every rollout device, one
            collective a tensor), ``packed`` (the same in buckets of packed tensors: a tensor's
            software cost paid once, not per tree level) or ``sharded`` (every trainer device
            sends its share of the model); a colocated
            hand-over sends nothing over the network and ignores it.
        bucket_bytes: bytes per message of the transfer.
        weight_bytes: bytes per weight the rollout holds (1: fp8; no term prices quantizing on the
            way, which an fp8 trainer does not need).
        tensor_seconds, fixed_seconds: the software rates.
        link: the transfer's link (default: the fabric's link for a group of trainer and rollout
            devices, inter-node unless both pools fit in one node; a broadcast's across nodes at a
            node's cards together, :func:`broadcast_link`).
        memory_bandwidth: bytes/s of the copies (default the device's).
        pipelined: the transfer's broadcast is pipelined (NCCL); ``False``: a binomial tree of
            whole messages (gloo, chapter 12's run on CPUs).
        pipeline_whole: the trainer's stages broadcast whole tensors when they gather
            (:func:`whole_tensor_gather_seconds`).

    Raises:
        ValueError: for an unknown placement or transport, non-positive sizes or degrees, rates
            that are not finite numbers >= 0, an argument of the wrong kind (a name where a spec,
            device, Layout, Fabric or Link belongs), a trainer layout the model refuses
            (:meth:`Layout.check`), a colocated trainer whose devices are not the engines'
            ``replicas x generation_tp``, or a generation shard larger than a device's memory.
    """
    check_kinds([("spec", spec, TransformerSpec, "get_spec('qwen2.5-7b')"),
                 ("device", device, Device, "get_device('H100-SXM-80GB')")], "sync_cost: ")
    check_kinds([(name, value, kind, example) for name, value, kind, example in (
        ("fabric", fabric, Fabric, "Fabric.of(device)"),
        ("link", link, Link, "Fabric.of(device).inter")) if value is not None], "sync_cost: ")
    if trainer is not None:
        _check_layout("sync_cost", trainer)
    if placement not in PLACEMENTS:
        raise ValueError(f"placement={placement!r}: choose one of {PLACEMENTS}.")
    if transport not in TRANSPORTS:
        raise ValueError(f"transport={transport!r}: choose one of {TRANSPORTS}.")
    generation_tp, replicas, weight_bytes = (
        _positive_int("sync_cost", name, value) for name, value in (
            ("generation_tp", generation_tp), ("replicas", replicas), ("weight_bytes", weight_bytes)))
    spec.check_degree("tp", generation_tp)
    check_amount("sync_cost: bucket_bytes", bucket_bytes, positive=True)
    check_amount("sync_cost: tensor_seconds", tensor_seconds)
    check_amount("sync_cost: fixed_seconds", fixed_seconds)
    if memory_bandwidth is not None:
        check_amount("sync_cost: memory_bandwidth (bytes/s; None: the device's)",
                      memory_bandwidth, positive=True)
    if not isinstance(pipelined, bool):
        raise ValueError(f"sync_cost: pipelined={pipelined!r} must be True (NCCL) or False (gloo).")
    if not isinstance(pipeline_whole, bool):
        raise ValueError(f"sync_cost: pipeline_whole={pipeline_whole!r} must be True or False.")
    if trainer is not None:
        trainer.check(spec)
        if placement == "colocated" and trainer.devices != replicas * generation_tp:
            raise ValueError(
                f"sync_cost: a colocated trainer of {trainer.devices} devices "
                f"({trainer.describe()}) generates on the same devices, not on {replicas} "
                f"replica(s) of tp={generation_tp} ({replicas * generation_tp} devices); give "
                f"replicas={trainer.devices // generation_tp} or a trainer of "
                f"{replicas * generation_tp} devices.")
    fabric = fabric or Fabric.of(device)
    bandwidth = memory_bandwidth or device.memory_bandwidth
    total = spec.params() * weight_bytes
    shard = total / generation_tp
    tensors = tensor_count(spec)
    tp, pp, ep = (trainer.tp, trainer.pp, trainer.ep) if trainer is not None else (1, 1, 1)
    dp = trainer.dp * trainer.cp if trainer is not None else 1
    zero3 = trainer is not None and trainer.zero == 3 and dp > 1
    trainer_devices = trainer.devices if trainer is not None else 1
    rollout_devices = replicas * generation_tp
    experts = spec.expert_params() * weight_bytes

    def tree(ranks: int) -> int:
        return max(1, math.ceil(math.log2(max(ranks, 2))))

    if shard > device.engine_memory_bytes:  # a rollout device receives its whole generation shard
        raise ValueError(f"a {'colocated ' if placement == 'colocated' else ''}generation shard "
                         f"of {spec.name} at tp={generation_tp} is {shard / 1e9:,.1f} GB, more "
                         f"than a {device.name} holds ({device.engine_memory_bytes / 1e9:,.1f} GB); "
                         "raise the generation tp.")
    if placement == "colocated":
        copies = 2 * shard / bandwidth
        if trainer is None:  # one training shard: the generation group gathers its shards
            group = generation_tp
            received = shard * (group - 1) / group
            near = fabric.link(group) if group > 1 else None
            gather = (group - 1) * near.alpha + received / near.beta if received else 0.0
            ideal = received / near.beta if received else 0.0
        else:  # every device assembles every whole tensor; its engine loads its shard of it
            gather = whole_tensor_gather_seconds(spec, trainer, fabric, weight_bytes,
                                                  pipeline_whole)
            # the least any reshard moves (HybridFlow's: what a device's generation shard
            # lacks), into a device by every port it has at once
            received, group = reshard_received_bytes(spec, tp, pp, ep, generation_tp,
                                                     weight_bytes, dp if zero3 else 1)
            ideal = 0.0
            if received:
                span = max(tp * pp * (dp if zero3 else 1), group, generation_tp)
                ports = fabric.link(span).beta
                if fabric.intra is not None and fabric.inter is not None:
                    ports = fabric.intra.beta + (fabric.inter.beta
                                                 if span > fabric.devices_per_node else 0.0)
                ideal = received / ports
        # the hand-over converts and passes every tensor in the same process or by CUDA IPC
        # handles (verl's hybrid engine, NeMo-RL's ZMQ stream): no tree, a cost per tensor
        return SyncCost(placement, "in place", total, 0.0, 0, tensors, gather, 0.0, copies,
                        tensors * tensor_seconds, fixed_seconds, ideal)
    messages = max(1, math.ceil(total / bucket_bytes))
    ranks = trainer_devices + rollout_devices
    wire = link or (fabric.link(ranks) if transport == "sharded"
                    else broadcast_link(fabric, ranks))
    # the split a device trains: the dense part over tp x pp, the experts over ep x pp (or tp)
    split = ep if ep > 1 else tp
    if transport != "sharded":  # rank 0 sends what every rank assembles
        gather = (whole_tensor_gather_seconds(spec, trainer, fabric, weight_bytes, pipeline_whole)
                  if trainer is not None else 0.0)
        transfer = broadcast_seconds(total, messages, wire, rollout_devices, pipelined)
        sent, packed, unpacked = total, total, total
        # one broadcast call per tensor pays its launch at every level of the tree; tensors
        # packed into buckets pay their packing and loading once, every receiver at once
        software = tensors * tensor_seconds * (tree(ranks) if transport == "broadcast" else 1)
    else:  # each region leaves once: to one engine from its first holder, to several in
        # stripes shared by min(copies, engines) of the devices that hold it
        if zero3:  # every device holds a distinct slice
            sent = total / trainer_devices
        else:  # the dense part over tp x pp, the experts over ep x pp (or tp), each with copies
            dense_copies = trainer_devices // (tp * pp)
            expert_copies = trainer_devices // (split * pp)
            sent = ((total - experts) / (tp * pp) / min(dense_copies, replicas)
                    + experts / (split * pp) / min(expert_copies, replicas))
        gather = 0.0
        per = max(sent, shard)
        messages = max(1, math.ceil(per / bucket_bytes))  # the busiest device's buckets
        transfer = broadcast_seconds(per, messages, wire, 1, pipelined)
        packed, unpacked = sent, shard
        software = tensors * tensor_seconds  # point to point per shard: no tree
    copies = 2 * (packed + unpacked) / bandwidth
    ideal = _ideal(fabric, link, ranks, total, shard, trainer_devices, rollout_devices)
    return SyncCost(placement, transport, total, sent, messages, tensors, gather, transfer, copies,
                    software, fixed_seconds, ideal)
