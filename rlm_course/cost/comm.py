"""Communication in seconds at cluster scale: collectives over the catalog's links, what each
parallelism strategy sends for a named model, and the **communication roofline**.

**Links.** A :class:`Fabric` holds two alpha-beta links (:class:`~rlm_course.parallel.world.Link`)
built from a catalog device (:mod:`rlm_course.cost.hardware`): inside a node (NVLink: latency
``intra_node_latency``, bandwidth ``intra_node_bandwidth`` **per direction**) and between nodes (one
NIC per device: ``inter_node_latency``, ``inter_node_bandwidth``). A group of ranks that fits in one
node talks over the first, any other over the second (the slowest link of a ring sets its pace).
Measured links (chapter 11 fits alpha and beta on real process groups) can replace either.

**Collectives** (Thakur, Rabenseifner & Gropp 2005; Patarasuk & Yuan 2009), ``M`` bytes, ``p``
ranks, the same closed forms as the simulated :class:`~rlm_course.parallel.world.World`:

* ring all-reduce ``2 (p - 1) (alpha + M / (p beta))``; tree (binomial reduce + broadcast)
  ``2 ceil(log2 p) (alpha + M / beta)``; ``auto`` takes the faster, as NCCL's tuner does (trees
  for small latency-bound messages, rings for large ones);
* ring reduce-scatter and all-gather ``(p - 1) (alpha + M / (p beta))`` (``M``: the whole tensor);
* all-to-all ``(p - 1) alpha + (p - 1) / p x M / beta`` (``M``: what one rank holds);
* broadcast: binomial ``ceil(log2 p) (alpha + M / beta)``, or pipelined in chunks
  ``M / beta + ceil(log2 p) alpha`` (how NCCL broadcasts large weights);
* point-to-point ``alpha + M / beta``.

**Per strategy**, bf16 (2 bytes) unless told otherwise, per device:

* DP / ZeRO-1/2: one all-reduce of the gradients per optimizer step (ZeRO-1/2: reduce-scatter plus
  all-gather, the same bytes); ZeRO-3 / FSDP: one more all-gather of the parameters, 1.5x
  (Rajbhandari et al. 2019, arXiv:1910.02054, section 7);
* TP: two all-reduces of the ``tokens x d_model`` activations per layer forward, two backward
  (Shoeybi et al. 2019, arXiv:1909.08053); in decoding, two per layer **per generated token**;
* PP: the ``tokens x d_model`` activations per stage boundary, forward and back;
* CP (ring attention): ``(p - 1) / p`` of each layer's keys and values; Ulysses: four all-to-alls
  of ``(p - 1) / p`` of a rank's shard per layer (Jacobs et al. 2023, arXiv:2309.14509);
* EP: a dispatch and a combine all-to-all of ``tokens x k x d_model`` per MoE layer forward, two
  more backward (Lepikhin et al. 2020, arXiv:2006.16668).

**The communication roofline.** A data-parallel step computes ``6 N B`` FLOPs on ``B`` tokens per
device and sends ``k (p - 1) / p x b N`` bytes (``k = 2`` for DP and ZeRO-1/2, 3 for ZeRO-3; ``b``
bytes per gradient element): the compute grows with the batch, the communication does not. They
take equally long at

    B* = k (p - 1) / p x b x peak / (6 beta)      tokens per device,

independent of the model size: below ``B*`` the step is communication-bound, above it
compute-bound (and with overlap, the communication hides entirely). For tensor parallelism the
same balance, per token of an MLP block (``m`` = 2 or 3 matrices of ``d x d_ff``), gives a
minimum hidden width per shard, ``d_ff / tp >= (tp - 1) / tp x b x peak / (m beta)``: about 1,300
on H100 NVLink at ``tp = 8`` but 11,500 across nodes, which is why TP stays inside a node (the
scaling book's "How to Scale Your Model", chapter on training parallelism, derives the same
ratios for TPUs).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from rlm_course.cost.architectures import TransformerSpec
from rlm_course.cost.hardware import Device
from rlm_course.utils import as_int, check_amount, is_real


@dataclass(frozen=True)
class Link:
    """Latency ``alpha`` (seconds per message) and bandwidth ``beta`` (bytes/s) of a link.

    Raises:
        ValueError: for a value that is not a number, a negative or infinite latency, or a
            bandwidth that is not positive and finite.
    """

    alpha: float = 5e-6
    beta: float = 25e9

    def __post_init__(self) -> None:
        for name in ("alpha", "beta"):
            value = getattr(self, name)
            if not is_real(value):
                raise ValueError(f"Link.{name}={value!r} must be a number, not a "
                                 f"{type(value).__name__} (alpha in seconds, beta in bytes/s).")
        if not (0 <= self.alpha < math.inf and self.beta > 0 and math.isfinite(self.beta)):
            raise ValueError(f"Link(alpha={self.alpha}, beta={self.beta}): need alpha >= 0 and a "
                             "positive finite bandwidth.")

    def seconds(self, nbytes: float) -> float:
        """``alpha + nbytes / beta``: one message of ``nbytes`` bytes.

        Raises:
            ValueError: for a byte count that is negative, infinite or not a number.
        """
        if not (is_real(nbytes) and 0 <= nbytes < math.inf):  # NaN, text and bools too
            raise ValueError(f"Link.seconds: nbytes={nbytes!r} must be a finite number of bytes "
                             ">= 0.")
        return self.alpha + nbytes / self.beta


ALGORITHMS = ("ring", "tree", "auto")
BF16 = 2


# ---------------------------------------------------------------------- links
@dataclass(frozen=True)
class Fabric:
    """The links of a cluster: ``intra`` inside a node of ``devices_per_node`` devices, ``inter``
    between nodes; ``mesh_links``: 0 when a switch gives every group inside a node the whole
    ``intra`` link, ``k`` when the node is a full mesh of ``k`` links a device (an MI300X
    platform: :attr:`~rlm_course.cost.hardware.Device.intra_node_links`).

    Raises:
        ValueError: for ``devices_per_node < 1``, or ``mesh_links`` other than 0 or
            ``devices_per_node - 1``.
    """

    intra: Link | None
    inter: Link | None
    devices_per_node: int
    mesh_links: int = 0

    def __post_init__(self) -> None:
        if (isinstance(self.devices_per_node, bool) or not isinstance(self.devices_per_node,
                                                                       numbers.Integral)
                or self.devices_per_node < 1):
            raise ValueError(f"devices_per_node={self.devices_per_node!r} must be a positive integer.")
        object.__setattr__(self, "devices_per_node", int(self.devices_per_node))
        if isinstance(self.mesh_links, bool) or self.mesh_links not in (
                0, self.devices_per_node - 1):
            raise ValueError(f"Fabric.mesh_links={self.mesh_links!r} must be 0 (a switch) or "
                             f"devices_per_node - 1 = {self.devices_per_node - 1} (a full mesh: "
                             "one link to each other device of the node).")
        object.__setattr__(self, "mesh_links", int(self.mesh_links))
        for name in ("intra", "inter"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Link):
                raise ValueError(f"Fabric.{name}={value!r} must be a Link (or None: no such link); "
                                 "pass e.g. Link(alpha=5e-6, beta=25e9).")

    @classmethod
    def of(cls, device: Device, intra: Link | None = None, inter: Link | None = None) -> "Fabric":
        """The catalog device's links (per-direction bandwidth, NCCL's per-step latency) and its
        node's topology (a switch, or a mesh of ``intra_node_links`` links), or the measured
        ``intra`` / ``inter`` links given instead (a measured ``intra`` link is what the groups
        inside a node reach: no mesh)."""
        if not isinstance(device, Device):
            raise ValueError(f"Fabric.of: device={device!r} must be a Device; pass e.g. "
                             "get_device('H100-SXM-80GB').")
        mesh = 0
        if intra is None and device.intra_node_bandwidth > 0:
            intra = Link(device.intra_node_latency, device.intra_node_bandwidth)
            mesh = device.intra_node_links
        if inter is None and device.inter_node_bandwidth > 0:
            inter = Link(device.inter_node_latency, device.inter_node_bandwidth)
        return cls(intra, inter, device.devices_per_node, mesh)

    def link(self, size: int, stride: int = 1) -> Link:
        """The link a group of ``size`` ranks, ``stride`` apart in rank order, talks over: intra-node
        if the group spans at most one node (``size x stride <= devices_per_node``), else the
        network. In a full mesh of ``k`` links a device (:attr:`mesh_links`) a group inside a node
        has ``size - 1`` of them, ``(size - 1) / k`` of the intra-node bandwidth: an MI300X pair
        talks at 64 GB/s a direction over its one Infinity Fabric link, eight of them at 448 GB/s
        (RCCL's rings over all seven).

        Raises:
            ValueError: for a size or stride that is not a positive integer, or if the device
                has no such link (e.g. a machine measured alone).
        """
        for name, value in (("size", size), ("stride", stride)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"Fabric.link: {name}={value!r} must be a positive integer "
                                 "(ranks).")
        inside = size * stride <= self.devices_per_node
        link = self.intra if inside else self.inter
        if link is None:
            kind = "intra-node" if inside else "inter-node"
            raise ValueError(f"a group of {size} ranks (stride {stride}) needs an {kind} link, "
                             "which this device has none of; give a measured Link (Rates.intra_link "
                             "/ inter_link) or use a catalog accelerator.")
        if inside and self.mesh_links and 1 < size <= self.mesh_links:
            return Link(link.alpha, link.beta * (size - 1) / self.mesh_links)
        return link

    def p2p_link(self, size: int, stride: int = 1) -> Link:
        """The link one point-to-point hop between two ranks of a group of ``size`` ranks,
        ``stride`` apart, crosses (a pipeline stage's activations, a ring-attention block): as
        :meth:`link`, but inside a mesh node one link between the pair, ``1 / mesh_links`` of the
        intra-node bandwidth (an MI300X pair: 64 GB/s a direction), whatever the group's size.

        Raises:
            ValueError: as :meth:`link`.
        """
        wire = self.link(size, stride)
        if self.mesh_links and wire is not self.inter and size > 1:
            return self.link(2)
        return wire

    def ring_link(self, size: int, stride: int = 1) -> Link:
        """The link a ring collective (all-reduce, all-gather, reduce-scatter, broadcast) of
        ``size`` ranks, ``stride`` apart, runs at: inside a node, :meth:`link`'s; across nodes,
        the network cards of the group's ranks on a node together. NCCL runs one ring per card
        (a channel), each entering a node by one rank's card and leaving by another's after
        crossing the node over NVLink, so a card carries ``1 / c`` of what crosses and the ring
        moves at ``c x beta_inter`` up to the intra-node link's, ``c`` the fewest of the group's
        ranks on any of its nodes (NCCL's maintainers, NVIDIA/nccl#412: "NCCL is able to
        aggregate the bandwidth of multiple NICs, but that requires GPUs to be connected with
        NVLink"; 2 nodes of 8 x 400 Gb/s reach about 470 GB/s of all-reduce bus bandwidth,
        NVIDIA/nccl#2409). One rank a node (a data-parallel group strided by TP 8) has one card:
        ``beta_inter``. An all-to-all or a point-to-point hop sends each rank's own bytes through
        its own card: :meth:`link`.

        Raises:
            ValueError: as :meth:`link`.
        """
        wire = self.link(size, stride)
        if wire is not self.inter or self.intra is None:
            return wire
        per_node = max(1, self.devices_per_node // stride)  # the group's ranks on a full node
        last = size - (math.ceil(size / per_node) - 1) * per_node  # on its last node
        return self.cards_link(min(per_node, last))

    def cards_link(self, cards: int) -> Link:
        """The network as ``cards`` of a node's cards carry it together: ``cards x beta_inter``,
        up to the intra-node link's (a node's traffic crosses NVLink to reach them); one card is
        :attr:`inter` itself."""
        if cards == 1 or self.intra is None:
            return self.inter
        return Link(self.inter.alpha, min(cards * self.inter.beta, self.intra.beta))


# ---------------------------------------------------------------------- collectives
_NO_LINK = object()  # _check's default: a caller that passes no link to check


def _check(nbytes: float, p: int, link=_NO_LINK) -> None:
    if (not is_real(nbytes) or not nbytes >= 0 or not math.isfinite(nbytes) or isinstance(p, bool)
            or not (isinstance(p, numbers.Integral) and p >= 1)):
        raise ValueError(f"collective of {nbytes} bytes over p={p!r} ranks: need a finite number "
                         "of bytes >= 0 and a positive integer number of ranks.")
    if link is not _NO_LINK and not isinstance(link, Link):
        raise ValueError(f"link={link!r} must be a Link; pass e.g. "
                         "Fabric.of(get_device('H100-SXM-80GB')).ring_link(p).")


def _check_mfu(mfu) -> None:
    if not (is_real(mfu) and 0 < mfu <= 1):
        raise ValueError(f"mfu={mfu!r} must be a fraction in (0, 1] of the peak.")


def ring_all_reduce_seconds(nbytes: float, p: int, link: Link) -> float:
    """``2 (p - 1) (alpha + M / (p beta))``; 0 for one rank."""
    _check(nbytes, p, link)
    return 2 * (p - 1) * link.seconds(nbytes / p) if p > 1 else 0.0


def tree_all_reduce_seconds(nbytes: float, p: int, link: Link) -> float:
    """``2 ceil(log2 p) (alpha + M / beta)``; 0 for one rank."""
    _check(nbytes, p, link)
    return 2 * math.ceil(math.log2(p)) * link.seconds(nbytes) if p > 1 else 0.0


def all_reduce_seconds(nbytes: float, p: int, link: Link, algorithm: str = "auto") -> float:
    """An all-reduce of ``nbytes`` over ``p`` ranks: ``ring``, ``tree``, or ``auto`` (the faster).

    Raises:
        ValueError: for an unknown algorithm or negative sizes.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r}: choose one of {ALGORITHMS}.")
    ring = ring_all_reduce_seconds(nbytes, p, link)
    if algorithm == "ring":
        return ring
    tree = tree_all_reduce_seconds(nbytes, p, link)
    return tree if algorithm == "tree" else min(ring, tree)


#: NCCL's latencies for small messages (the LL protocol, tree algorithm), seconds: a base per
#: collective, a step over NVLink, a step over the network (``baseLat`` and ``hwLat`` in NVIDIA's
#: ``src/graph/tuning.cc``: 6.8, 0.52 and 5.0 microseconds).
NCCL_LL_TREE_LATENCY = {"base": 6.8e-6, "intra": 0.52e-6, "inter": 5.0e-6}


def node_tree_levels(nodes: int) -> int:
    """Network levels NCCL's tuning model charges a tree across ``nodes`` nodes:
    ``log2i(nNodes)``, the base-2 logarithm rounded down (``src/graph/tuning.cc``; 1 for 2 or 3
    nodes, 2 for 4 to 7), 0 inside one node.

    Raises:
        ValueError: for a node count that is not a positive integer.
    """
    nodes = as_int(nodes)  # numpy's integers too
    if isinstance(nodes, bool) or not (isinstance(nodes, int) and nodes >= 1):
        raise ValueError(f"node_tree_levels: nodes={nodes!r} must be a positive integer.")
    return nodes.bit_length() - 1


def node_tree_all_reduce_seconds(nbytes: float, p: int, fabric: "Fabric") -> float:
    """NCCL's tree all-reduce of a small message of ``nbytes`` over ``p`` ranks spread over whole
    nodes of ``fabric.devices_per_node``: inside each node a chain of ``ppn - 1`` NVLink steps,
    between nodes a pipelined binary tree of :func:`node_tree_levels` network steps, up (reduce) and
    down (broadcast), and the message crossing the network link once each way. The latency is
    NCCL's own tuning model for its low-latency protocol (``src/graph/tuning.cc``:
    ``baseLat + 2 ((ppn - 1) intraLat + log2i(nNodes) interLat)``,
    :data:`NCCL_LL_TREE_LATENCY`), what a decode step's all-reduce across nodes pays:
    ``base + 2 ((ppn - 1) lat_intra + log2i(nodes) lat_inter) + 2 M / beta_inter``. A group
    inside one node is the ring/tree of :func:`all_reduce_seconds` over the intra-node link.

    Raises:
        ValueError: for negative sizes, ``p < 1``, or a fabric without the links it needs.
    """
    _check(nbytes, p)
    if p == 1:
        return 0.0
    per_node = min(p, fabric.devices_per_node)
    nodes = -(-p // per_node)
    if nodes == 1:
        return all_reduce_seconds(nbytes, p, fabric.link(p))
    lat = NCCL_LL_TREE_LATENCY
    return (lat["base"] + 2 * ((per_node - 1) * lat["intra"]
                               + node_tree_levels(nodes) * lat["inter"])
            + 2 * nbytes / fabric.link(p).beta)


def reduce_scatter_seconds(nbytes: float, p: int, link: Link) -> float:
    """Ring reduce-scatter of an ``nbytes`` tensor: ``(p - 1) (alpha + M / (p beta))``."""
    _check(nbytes, p, link)
    return (p - 1) * link.seconds(nbytes / p) if p > 1 else 0.0


def all_gather_seconds(nbytes: float, p: int, link: Link) -> float:
    """Ring all-gather into an ``nbytes`` tensor (``nbytes / p`` per rank): same as the
    reduce-scatter."""
    return reduce_scatter_seconds(nbytes, p, link)


def all_to_all_seconds(nbytes: float, p: int, link: Link) -> float:
    """All-to-all where each rank holds ``nbytes`` and keeps ``1/p`` of it:
    ``(p - 1) alpha + (p - 1) / p x M / beta``."""
    _check(nbytes, p, link)
    return (p - 1) * link.alpha + (p - 1) / p * nbytes / link.beta if p > 1 else 0.0


def broadcast_seconds(nbytes: float, p: int, link: Link, pipelined: bool = False) -> float:
    """Broadcast to ``p`` ranks: a binomial tree ``ceil(log2 p) (alpha + M / beta)``, or
    ``pipelined`` in small chunks, ``M / beta + ceil(log2 p) alpha``."""
    _check(nbytes, p)
    if p == 1:
        return 0.0
    rounds = math.ceil(math.log2(p))
    return nbytes / link.beta + rounds * link.alpha if pipelined else rounds * link.seconds(nbytes)


def p2p_seconds(nbytes: float, link: Link) -> float:
    """One message: ``alpha + M / beta``."""
    _check(nbytes, 1, link)
    return link.seconds(nbytes)


# ---------------------------------------------------------------------- per strategy
@dataclass(frozen=True)
class CommCost:
    """What one device sends (bytes) and how long its collectives take (seconds) for one step of
    a strategy; ``collectives`` counts the operations (each pays its latency)."""

    bytes: float
    seconds: float
    collectives: int

    def __add__(self, other: "CommCost") -> "CommCost":
        return CommCost(self.bytes + other.bytes, self.seconds + other.seconds,
                        self.collectives + other.collectives)

    def __mul__(self, k: float) -> "CommCost":
        return CommCost(self.bytes * k, self.seconds * k, int(self.collectives * k))


NONE = CommCost(0.0, 0.0, 0)


def _check_options(owner: str, link, flags: dict | None = None, **sizes) -> None:
    """A ValueError naming what a strategy's cost was given in place of a :class:`Link`, a flag
    (``backward``, ``recompute``, ``in_node``: True or False, not a truthy string) or a size in
    bytes per element (``act_bytes``, ``kv_bytes``: a positive integer)."""
    if not isinstance(link, Link):
        raise ValueError(f"{owner}: link={link!r} must be a Link(alpha, beta), e.g. "
                         "Fabric.of(device).link(size, stride).")
    for name, value in (flags or {}).items():
        if not isinstance(value, bool):
            raise ValueError(f"{owner}: {name}={value!r} must be True or False.")
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{owner}: {name}={value!r} must be a positive integer number of "
                             "bytes per element (2 for bf16, 1 for fp8, 4 for fp32).")


def data_parallel_comm(params: float, dp: int, link: Link, zero_stage: int = 0,
                       grad_bytes: int = BF16, param_bytes: int = BF16,
                       micro_batches: int = 1) -> CommCost:
    """One optimizer step's traffic of data parallelism over ``dp`` devices holding ``params``
    parameters each (their share after TP/PP): DP all-reduces the gradients; ZeRO-1/2
    reduce-scatter them and all-gather the updated ``param_bytes`` parameters; ZeRO-3 / FSDP
    all-gathers the parameters twice (forward and backward) and reduce-scatters the gradients.
    With gradient accumulation over ``micro_batches``, ZeRO-2 reduce-scatters after every
    micro-batch's backward, since a device keeps only its shard of the accumulated gradient
    (DeepSpeed's stage 2, deepspeedai/DeepSpeed#2252); the others sync the accumulated gradient
    once (ZeRO-3's per-micro-batch gathers are its caller's to count).

    Raises:
        ValueError: for an unknown stage or non-positive sizes.
    """
    if zero_stage not in (0, 1, 2, 3) or isinstance(zero_stage, bool):
        raise ValueError(f"ZeRO stage={zero_stage!r}: choose 0 (plain DP), 1, 2 or 3.")
    check_amount("params", params)
    dp, micro_batches = as_int(dp), as_int(micro_batches)  # numpy's integers too
    if isinstance(dp, bool) or not (isinstance(dp, int) and dp >= 1):
        raise ValueError(f"dp={dp!r} must be a positive integer (1: no data parallelism).")
    if isinstance(micro_batches, bool) or not (isinstance(micro_batches, int)
                                               and micro_batches >= 1):
        raise ValueError(f"micro_batches={micro_batches!r} must be a positive integer.")
    for name, width in (("grad_bytes", grad_bytes), ("param_bytes", param_bytes)):
        if not (is_real(width) and 0 < width < math.inf):
            raise ValueError(f"data_parallel_comm: {name}={width!r} must be a positive number of "
                             "bytes per element (2: bf16, 4: fp32).")
    if dp == 1:
        return NONE
    g, w = params * grad_bytes, params * param_bytes
    share = (dp - 1) / dp
    if zero_stage == 0:
        return CommCost(2 * share * g, ring_all_reduce_seconds(g, dp, link), 1)
    gather = CommCost(share * w, all_gather_seconds(w, dp, link), 1)
    scatter = CommCost(share * g, reduce_scatter_seconds(g, dp, link), 1)
    if zero_stage == 2:
        return scatter * micro_batches + gather
    return scatter + gather * (2 if zero_stage == 3 else 1)


def tensor_parallel_comm(spec: TransformerSpec, tp: int, tokens: float, link: Link,
                         backward: bool = True, act_bytes: int = BF16,
                         layers: int | None = None, recompute: bool = False) -> CommCost:
    """Megatron TP over ``tp`` devices on ``tokens`` tokens through ``layers`` layers (default
    all): two all-reduces of ``tokens x d_model`` activations per layer forward, two more
    backward (ring), and two more with full activation recomputation, which runs the forward
    (and its all-reduces) again: 6 per layer (Korthikanti et al. 2022).

    Raises:
        ValueError: for a ``tp`` that does not fit the model
            (:meth:`~rlm_course.cost.architectures.TransformerSpec.check_degree`), a negative or
            non-finite token count, ``layers`` outside 1..``n_layer``, or a link, flag or
            element size of the wrong kind.
    """
    spec.check_degree("tp", tp)
    check_amount("tokens", tokens)
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int)
                               or not 1 <= layers <= spec.n_layer):
        raise ValueError(f"layers={layers!r} must be an integer from 1 to {spec.name}'s "
                         f"{spec.n_layer} layers (None: all).")
    if tp == 1:
        return NONE
    _check_options("tensor_parallel_comm", link, dict(backward=backward, recompute=recompute),
                   act_bytes=act_bytes)
    layers = spec.n_layer if layers is None else layers
    m = tokens * spec.d_model * act_bytes
    count = layers * ((6 if recompute else 4) if backward else 2)
    one = CommCost(2 * (tp - 1) / tp * m, ring_all_reduce_seconds(m, tp, link), 1)
    return one * count


#: The largest message an engine's custom all-reduce takes (vLLM's ``CustomAllreduce``
#: ``max_size``, 8 MiB); larger ones go to NCCL.
ENGINE_ALL_REDUCE_MAX_BYTES = 8 * 2**20
#: the group sizes vLLM's custom all-reduce runs (CustomAllreduce._SUPPORTED_WORLD_SIZES in
#: vllm/distributed/device_communicators/custom_all_reduce.py); others fall back to NCCL.
ENGINE_ALL_REDUCE_WORLD_SIZES = (2, 4, 6, 8)


def engine_all_reduce_seconds(nbytes: float, p: int, link: Link) -> float:
    """An inference engine's all-reduce of ``nbytes`` inside one NVLink domain (vLLM's and
    SGLang's custom all-reduce, ``csrc/custom_all_reduce.cuh``): every rank reads its peers'
    buffers directly, so a call pays one latency, not one per ring step. One-shot (each rank reads
    all ``p - 1`` peers' whole buffers: ``alpha + (p - 1) M / beta``) for small messages,
    two-shot (a reduce-scatter then an all-gather, each in one step: ``2 alpha + 2 (p - 1) / p x
    M / beta``) for large ones; the faster of the two. Messages above
    :data:`ENGINE_ALL_REDUCE_MAX_BYTES`, and groups of a size the kernel does not support
    (:data:`ENGINE_ALL_REDUCE_WORLD_SIZES`: TP 16 or 32 inside a GB200 NVL72 domain), go to NCCL
    (:func:`all_reduce_seconds`). 0 for one rank.

    Raises:
        ValueError: for a negative size or ``p < 1``.
    """
    _check(nbytes, p)
    if p == 1:
        return 0.0
    if nbytes > ENGINE_ALL_REDUCE_MAX_BYTES or p not in ENGINE_ALL_REDUCE_WORLD_SIZES:
        return all_reduce_seconds(nbytes, p, link, "auto")
    one_shot = link.alpha + (p - 1) * nbytes / link.beta
    two_shot = 2 * link.alpha + 2 * (p - 1) / p * nbytes / link.beta
    return min(one_shot, two_shot)


def decode_tp_comm(spec: TransformerSpec, tp: int, sequences: int, link: Link,
                   act_bytes: int = BF16, in_node: bool = False,
                   fabric: Fabric | None = None) -> CommCost:
    """One decode step of a ``tp``-way replica with ``sequences`` sequences: two all-reduces of
    ``sequences x d_model`` activations per layer, on the critical path of every generated token.
    Inside one node (``in_node``) an engine's custom all-reduce
    (:func:`engine_all_reduce_seconds`); across the nodes of a ``fabric``, NCCL's node tree
    (:func:`node_tree_all_reduce_seconds`); else the faster of ring and tree over ``link``
    (small messages, so latency-bound).

    Raises:
        ValueError: for a ``tp`` that does not fit the model, a negative sequence count, or a
            link, flag or element size of the wrong kind.
    """
    spec.check_degree("tp", tp)
    check_amount("sequences", sequences)
    if tp == 1:
        return NONE
    _check_options("decode_tp_comm", link, dict(in_node=in_node), act_bytes=act_bytes)
    m = sequences * spec.d_model * act_bytes
    if in_node:
        seconds = engine_all_reduce_seconds(m, tp, link)
    elif fabric is not None:
        seconds = node_tree_all_reduce_seconds(m, tp, fabric)
    else:
        seconds = all_reduce_seconds(m, tp, link, "auto")
    one = CommCost(2 * (tp - 1) / tp * m, seconds, 1)
    return one * (2 * spec.n_layer)


def pipeline_comm(spec: TransformerSpec, tokens: float, link: Link, backward: bool = True,
                  act_bytes: int = BF16) -> CommCost:
    """One stage boundary for ``tokens`` tokens: the activations forward (and their gradient
    back).

    Raises:
        ValueError: for a bad token count, link, flag or element size.
    """
    check_amount("tokens", tokens)
    _check_options("pipeline_comm", link, dict(backward=backward), act_bytes=act_bytes)
    m = tokens * spec.d_model * act_bytes
    one = CommCost(m, p2p_seconds(m, link), 1)
    return one * (2 if backward else 1)


def context_parallel_comm(spec: TransformerSpec, cp: int, tokens: float, link: Link,
                          backward: bool = True, kv_bytes: int = BF16) -> CommCost:
    """Ring attention over ``cp`` devices for a sequence (or packed batch) of ``tokens`` tokens,
    every layer: ``cp - 1`` ring steps, each passing a ``tokens / cp`` shard of keys and values
    (``2 x kv_heads x d_head`` values per token; under MLA the up-projected heads' keys and values,
    ``n_head x (qk_head_dim + v_head_dim)``, as Megatron-Core's ring attention runs it:
    :meth:`~rlm_course.cost.architectures.TransformerSpec.kv_values_per_token`); the backward pass
    sends the keys and values and their gradients again (2x).

    Raises:
        ValueError: for a ``cp`` that is not a positive integer, a bad token count, or a link,
            flag or element size of the wrong kind.
    """
    spec.check_degree("cp", cp)
    check_amount("tokens", tokens)
    if cp == 1:
        return NONE
    _check_options("context_parallel_comm", link, dict(backward=backward), kv_bytes=kv_bytes)
    shard = tokens / cp * spec.kv_values_per_token() * kv_bytes
    steps = (cp - 1) * spec.n_layer * (3 if backward else 1)
    return CommCost(shard * steps, p2p_seconds(shard, link) * steps, steps)


def ulysses_comm(spec: TransformerSpec, sp: int, tokens: float, link: Link,
                 backward: bool = True, act_bytes: int = BF16) -> CommCost:
    """DeepSpeed-Ulysses over ``sp`` devices on ``tokens`` tokens: per layer, all-to-alls of the
    queries, keys, values and output, each rank holding ``tokens / sp`` positions of
    ``heads x d_head`` (or ``kv_heads x d_head``) values (under MLA queries and keys of
    ``qk_head_dim``, values and output of ``v_head_dim``, every head), twice as many with the
    backward.

    Raises:
        ValueError: if ``sp`` does not divide the key/value heads; for a bad token count, or a
            link, flag or element size of the wrong kind.
    """
    if isinstance(sp, int) and not isinstance(sp, bool) and sp >= 1 and spec.kv_heads % sp:
        raise ValueError(f"Ulysses degree {sp} does not divide {spec.name}'s {spec.kv_heads} "
                         "key/value heads; use ring attention (context_parallel_comm) instead.")
    spec.check_degree("sp", sp)
    check_amount("tokens", tokens)
    if sp == 1:
        return NONE
    _check_options("ulysses_comm", link, dict(backward=backward), act_bytes=act_bytes)
    local = tokens / sp * act_bytes
    qk, v = spec.qk_head_dim, spec.v_dim
    parts = [spec.n_head * qk, spec.kv_heads * qk, spec.kv_heads * v, spec.n_head * v]  # q k v o
    one = sum((CommCost((sp - 1) / sp * local * h, all_to_all_seconds(local * h, sp, link), 1)
               for h in parts), NONE)
    return one * (spec.n_layer * (2 if backward else 1))


def expert_parallel_comm(spec: TransformerSpec, ep: int, tokens: float, link: Link,
                         backward: bool = True, act_bytes: int = BF16,
                         recompute: bool = False) -> CommCost:
    """Expert parallelism over ``ep`` devices, ``tokens`` tokens per device: per MoE layer
    (:attr:`~rlm_course.cost.architectures.TransformerSpec.moe_layers`) a
    dispatch and a combine all-to-all of ``tokens x k x d_model`` (two more backward, and two
    more with full activation recomputation, which runs the layer's forward, its dispatch and
    combine included, again: 6 per layer). Under tensor parallelism with sequence parallelism a
    device dispatches its own ``1 / tp`` of a micro-batch's tokens (Megatron-Core's
    ``MoEAlltoAllTokenDispatcher``: ``[S/TP, B, H]`` in, all-to-all over EP).

    Raises:
        ValueError: for an ``ep`` that does not divide the experts (or above 1 for a dense model),
            a bad token count, or a link, flag or element size of the wrong kind.
    """
    spec.check_degree("ep", ep)
    check_amount("tokens", tokens)
    if ep == 1:
        return NONE
    _check_options("expert_parallel_comm", link, dict(backward=backward, recompute=recompute),
                   act_bytes=act_bytes)
    m = tokens * spec.experts_per_token * spec.d_model * act_bytes
    one = CommCost((ep - 1) / ep * m, all_to_all_seconds(m, ep, link), 1)
    return one * (spec.moe_layers * ((6 if recompute else 4) if backward else 2))


# ---------------------------------------------------------------------- the roofline
def min_tokens_per_device(peak_flops: float, beta: float, dp: int, zero_stage: int = 0,
                          grad_bytes: int = 2, mfu: float = 1.0) -> float:
    """The communication roofline of data parallelism: the tokens per device and optimizer step
    at which a step's compute (``6 N B`` FLOPs at ``mfu x peak_flops``) takes as long as its
    gradient traffic over a link of ``beta`` bytes/s (``k (dp - 1) / dp x grad_bytes x N`` bytes,
    ``k = 2`` for DP and ZeRO-1/2, 3 for ZeRO-3):

        B* = k (dp - 1) / dp x grad_bytes x mfu x peak_flops / (6 beta)

    The model size ``N`` cancels. Below ``B*`` the step is communication-bound; above it,
    compute-bound. E.g. H100s (989 TFLOP/s), plain DP, many devices: about 1,650 tokens per
    device for a group filling nodes (its rings on a node's 8 cards, 400 GB/s:
    :meth:`Fabric.ring_link`), about 13,200 for one rank a node (one card, 50 GB/s).

    Raises:
        ValueError: for non-positive rates, ``dp < 1`` or an unknown ZeRO stage.
    """
    if not (peak_flops > 0 and beta > 0 and 0 < mfu <= 1):
        raise ValueError(f"peak_flops={peak_flops}, beta={beta} must be positive and mfu={mfu} "
                         "in (0, 1].")
    if not (isinstance(dp, int) and dp >= 1) or zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"dp={dp!r} must be a positive integer and zero_stage={zero_stage!r} "
                         "one of 0, 1, 2, 3.")
    # BEGIN SOLUTION: equate compute 6 N B / (mfu peak) with traffic k (dp-1)/dp grad_bytes N / beta (k = 3 for ZeRO-3, else 2) and solve for B
    k = 3 if zero_stage == 3 else 2
    return k * (dp - 1) / dp * grad_bytes * mfu * peak_flops / (6 * beta)
    # END SOLUTION


def min_ffn_per_shard(peak_flops: float, beta: float, tp: int, glu: bool = True,
                      act_bytes: int = BF16, mfu: float = 1.0) -> float:
    """The communication roofline of tensor parallelism for an MLP block: the hidden width per
    shard ``d_ff / tp`` at which its matmuls (``2 m d d_ff / tp`` FLOPs per token, ``m = 3``
    matrices for SwiGLU, 2 for GELU) take as long as its all-reduce
    (``2 (tp - 1) / tp x d x act_bytes`` per token):

        d_ff / tp = (tp - 1) / tp x act_bytes x mfu x peak_flops / (m beta)

    The width ``d`` cancels. Wider shards are compute-bound.

    Raises:
        ValueError: for non-positive rates or ``tp < 1``.
    """
    if not (peak_flops > 0 and beta > 0 and 0 < mfu <= 1 and isinstance(tp, int) and tp >= 1):
        raise ValueError(f"peak_flops={peak_flops}, beta={beta} must be positive, mfu={mfu} in "
                         f"(0, 1] and tp={tp!r} a positive integer.")
    m = 3 if glu else 2
    return (tp - 1) / tp * act_bytes * mfu * peak_flops / (m * beta)


def exposed(comm: float, overlappable: float, pieces: int, overlap: bool) -> float:
    """Communication time left on the critical path: all of it without ``overlap``; with it,
    what the ``overlappable`` compute cannot hide, and at least one of the ``pieces`` (DDP's last
    gradient bucket, FSDP's first parameter gather), which has nothing to hide behind."""
    if comm <= 0:
        return 0.0
    if not overlap:
        return comm
    return max(comm / max(pieces, 1), comm - overlappable)


def data_parallel_step(spec: TransformerSpec, device: Device, dp: int, tokens_per_device: float,
                       link: Link, zero_stage: int = 0, overlap: bool = True, mfu: float = 1.0,
                       buckets: int = 25) -> dict[str, float]:
    """Seconds of one data-parallel (or ZeRO / FSDP) training step of ``spec`` on ``dp``
    devices, ``tokens_per_device`` tokens each: ``compute`` (``6 N B`` FLOPs at ``mfu x peak``),
    ``comm`` (:func:`data_parallel_comm`), ``exposed`` (:func:`exposed`: DDP overlaps the
    gradient buckets with the backward, two thirds of the compute, leaving the last of
    ``buckets``; FSDP prefetches each layer's parameters during the previous layer's compute,
    leaving the first of ``n_layer`` gathers) and ``step = compute + exposed``.

    Raises:
        ValueError: for non-positive sizes.
    """
    check_amount("tokens_per_device", tokens_per_device, positive=True)
    _check_mfu(mfu)
    spec.check_degree("dp", dp)
    compute = 6 * spec.matmul_params() * tokens_per_device / (mfu * device.peak_flops)
    comm = data_parallel_comm(spec.params(), dp, link, zero_stage).seconds
    if zero_stage == 3:
        hidden = exposed(comm, compute, spec.n_layer, overlap)
    else:
        hidden = exposed(comm, compute * 2 / 3, buckets, overlap)
    return {"compute": compute, "comm": comm, "exposed": hidden, "step": compute + hidden}


def tensor_parallel_layer(spec: TransformerSpec, device: Device, tp: int, tokens: float,
                          link: Link, mfu: float = 1.0, backward: bool = True) -> dict[str, float]:
    """Seconds of one transformer layer under TP on ``tokens`` tokens: ``compute`` (the layer's
    matmuls, ``2 x`` its weights per token forward, ``3 x`` that with the backward, split ``tp``
    ways) and ``comm`` (:func:`tensor_parallel_comm` for one layer), which sits between the
    matmuls that need its result, so ``step = compute + comm``.

    Raises:
        ValueError: for a ``tp`` that does not fit the model, a bad token count or an ``mfu``
            outside (0, 1].
    """
    spec.check_degree("tp", tp)
    _check_mfu(mfu)
    check_amount("tokens", tokens)
    weights = spec.attention_params(weights_only=True) + (
        (spec.experts_per_token + spec.n_shared_experts) * spec.mlp_params(weights_only=True))
    flops = 2 * weights * tokens * (3 if backward else 1)
    compute = flops / (tp * mfu * device.peak_flops)
    comm = tensor_parallel_comm(spec, tp, tokens, link, backward, layers=1).seconds
    return {"compute": compute, "comm": comm, "step": compute + comm}
