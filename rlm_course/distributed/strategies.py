"""TinyGPT trained with every intra-model strategy on real processes: each equal to one device, and
each sending the bytes the simulators of chapters 07-09 predict.

Strategies (:data:`STRATEGIES`), all with ``torch.distributed``'s own implementations:

* ``ddp``: ``DistributedDataParallel``; each rank trains on ``batch / p`` rows, the gradients are
  all-reduced (averaged) in buckets during backward.
* ``fsdp2``: ``fully_shard`` on every block, then on the model (the root group holds the
  embeddings, the final norm and the head), with ``reshard_after_forward=True`` everywhere:
  parameters are gathered for the forward and again for the backward, gradients reduce-scattered.
  (By default FSDP2 keeps the root's parameters gathered between forward and backward, saving one
  all-gather of the root group.)
* ``tp``: DTensor's ``parallelize_module`` on every block: the QKV projection and the MLP's first
  layer column-wise, the attention output and the MLP's second layer row-wise (Megatron's split);
  embeddings, norms and head are replicated. The QKV rows are stored head by head
  (:class:`HeadParallelAttention`) so that a column shard holds whole heads.
* ``tp_sp``: the same plus sequence parallelism: norms and residuals work on sequence shards
  (``SequenceParallel``), the column-wise layers all-gather the sequence and the row-wise ones
  reduce-scatter it; the model enters the sequence layout before its first block and leaves it
  after its last.
* ``pp_gpipe``, ``pp_1f1b``, ``pp_interleaved``, ``pp_zero_bubble``: ``torch.distributed.
  pipelining`` stages (the blocks split evenly; the first stage also embeds, the last also
  normalises and projects to the vocabulary) run by ``ScheduleGPipe``, ``Schedule1F1B``,
  ``ScheduleInterleaved1F1B`` (two stages per rank, looped) and ``ScheduleInterleavedZeroBubble``
  (two stages per rank; the backward split into input and weight gradients).

**Equal to one device.** :func:`equivalence_worker` trains ``steps`` AdamW steps on the global
batch of next-token prediction in float64 and returns the losses, the gradients of the first
step and the parameters after the last; :func:`check_equivalence` compares them with
:func:`reference` (one process, whole batch) within :func:`tolerances`, which come from
:mod:`rlm_course.numerics` (Higham's bound for sums in another order, and its effect through
Adam), not from looking at one machine's error.

**Bytes = the simulators' formulas.** During the last step (pipelining exchanges shapes in its
first, DDP settles its buckets in its second) :class:`~rlm_course.distributed.comm.CommCounter`
records every collective and send/recv;
:func:`predicted_sent` gives each rank's bytes from the course's formulas:
:func:`rlm_course.parallel.data_parallel.bytes_sent_per_step` (DDP: stage 0; FSDP2: stage 3 on
FSDP's padded parameter count), :func:`rlm_course.parallel.tensor_parallel.layer_bytes_per_rank`
per block (TP, TP+SP, plus the two terms the simulator of one block does not have: the model's
entry into and exit from the sequence layout, and the all-reduce of the norms' partial
gradients; only the norms': the row-wise layers' biases get whole gradients from DTensor with
no collective of their own, where chapter 08's simulated block all-reduces them too), and the
simulated pipeline of :func:`rlm_course.parallel.pipeline.run_pipeline` on a
:class:`~rlm_course.parallel.world.World` (PP).

**Time.** :func:`timing_worker` measures the step time of each strategy at learner size in
float32, and the share of it that the backend spends communicating (the union of its
``gloo:*`` profiler records, waiting for peers included; :func:`rlm_course.distributed.comm.
comm_seconds`).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from rlm_course.distributed.comm import CommCounter, comm_seconds, profiled, wire_bytes
from rlm_course.distributed.launch import RankContext
from rlm_course.lm.model import ModelConfig, TinyGPT
from rlm_course.numerics import adam_tolerance, relative_error, reorder_tolerance

STRATEGIES = {
    "ddp": "DDP",
    "fsdp2": "FSDP2 (per block)",
    "tp": "TP (DTensor)",
    "tp_sp": "TP + SP",
    "pp_gpipe": "PP GPipe",
    "pp_1f1b": "PP 1F1B",
    "pp_interleaved": "PP interleaved 1F1B",
    "pp_zero_bubble": "PP interleaved zero bubble",
}
#: Pipeline strategy -> (the schedule table of chapter 09 with the same sends, stages per rank).
PIPELINES = {"pp_gpipe": ("gpipe", 1), "pp_1f1b": ("1f1b", 1), "pp_interleaved": ("interleaved", 2),
             "pp_zero_bubble": ("interleaved", 2)}
DTYPES = {"float64": torch.float64, "float32": torch.float32}


@dataclass(frozen=True)
class Setup:
    """The model, batch and schedule of one comparison.

    A TinyGPT of ``n_layer`` blocks, width ``d_model``, ``n_head`` heads, trained on ``batch``
    sequences of ``seq_len`` tokens (next-token prediction on tokens drawn with ``seed``),
    ``steps`` AdamW steps at ``lr`` in ``dtype``; pipelines cut the batch into ``micro_batches``.
    """

    vocab_size: int = 24
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 32
    seq_len: int = 16
    batch: int = 8
    micro_batches: int = 4
    steps: int = 3
    lr: float = 1e-2
    dtype: str = "float64"
    seed: int = 0

    @property
    def config(self) -> ModelConfig:
        return ModelConfig(vocab_size=self.vocab_size, n_layer=self.n_layer, n_head=self.n_head,
                           d_model=self.d_model, max_seq_len=self.seq_len)

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def check(self, name: str, p: int) -> None:
        """Refuse a strategy that does not fit this setup on ``p`` ranks.

        Raises:
            ValueError: naming the size that does not divide and what to change.
        """
        if name not in STRATEGIES:
            raise ValueError(f"unknown strategy {name!r}; choose from {list(STRATEGIES)}.")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}: choose float64 (the algorithm) or float32.")
        if name in ("ddp", "fsdp2") and self.batch % p:
            raise ValueError(f"{name}: batch {self.batch} does not split into {p} equal shards; use "
                             "a multiple of the number of ranks.")
        if name.startswith("tp") and self.n_head % p:
            raise ValueError(f"{name}: {p} ranks do not divide the {self.n_head} heads; choose a "
                             "divisor of n_head.")
        if name == "tp_sp" and self.seq_len % p:
            raise ValueError(f"tp_sp: {p} ranks do not divide the sequence of {self.seq_len}.")
        if name in PIPELINES:
            stages = p * PIPELINES[name][1]
            if self.n_layer % stages:
                raise ValueError(f"{name}: {self.n_layer} blocks do not split into {stages} stages "
                                 f"({p} ranks x {PIPELINES[name][1]}); use n_layer a multiple of "
                                 f"{stages}.")
            if self.batch % self.micro_batches:
                raise ValueError(f"{name}: batch {self.batch} does not split into "
                                 f"{self.micro_batches} equal micro-batches.")
            if PIPELINES[name][1] > 1 and self.micro_batches % p:
                raise ValueError(f"{name}: {self.micro_batches} micro-batches are not a multiple of "
                                 f"the {p} ranks (interleaved schedules need it).")


def check_setup(p: int) -> Setup:
    """The float64 setup of the equivalence checks on ``p`` ranks: a 32-wide TinyGPT with enough
    blocks for two pipeline stages per rank (4, or ``2 p``), micro-batches a multiple of ``p``."""
    m = max(4, p)
    return Setup(n_layer=max(4, 2 * p), micro_batches=m, batch=2 * m)


def learner_setup(p: int) -> Setup:
    """The float32 setup of the timings on ``p`` ranks: the course's model width (128, 4 heads,
    32 positions) with ``max(8, 2 p)`` blocks (the same model at 2 and 4 ranks), 16 sequences
    per step (or ``4 x`` the micro-batches)."""
    m = max(4, p)
    return Setup(n_layer=max(8, 2 * p), d_model=128, seq_len=32, batch=max(16, 4 * m),
                 micro_batches=m, dtype="float32", lr=1e-3)


def fitting(setup: Setup, p: int) -> list[str]:
    """The strategies that fit ``setup`` on ``p`` ranks (e.g. TP needs ``p`` to divide the
    heads)."""
    out = []
    for name in STRATEGIES:
        try:
            setup.check(name, p)
        except ValueError:
            continue
        out.append(name)
    return out


# ---------------------------------------------------------------------------- model and data
def make_model(setup: Setup) -> TinyGPT:
    torch.manual_seed(setup.seed)
    return TinyGPT(setup.config).to(setup.torch_dtype)


def make_tokens(setup: Setup) -> Tensor:
    """``(batch, seq_len + 1)`` token ids: inputs are ``[:, :-1]``, targets ``[:, 1:]``."""
    g = torch.Generator().manual_seed(setup.seed + 1)
    return torch.randint(0, setup.vocab_size, (setup.batch, setup.seq_len + 1), generator=g)


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross-entropy: ``logits (batch, seq, vocab)``, ``targets (batch, seq)``."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _optimizer(params, setup: Setup, foreach: bool | None = None) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=setup.lr, weight_decay=0.0, foreach=foreach)


def reference(setup: Setup) -> dict:
    """One process, the whole batch: ``{"losses": [per step], "grads": {name: first step's
    gradient}, "params": {name: after the last step}}``."""
    model = make_model(setup)
    tokens = make_tokens(setup)
    optimizer = _optimizer(model.parameters(), setup)
    losses, grads = [], {}
    for step in range(setup.steps):
        optimizer.zero_grad(set_to_none=True)
        loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "grads": grads,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


# ---------------------------------------------------------------------------- tensor parallelism
def head_major_rows(n_head: int, d_head: int) -> Tensor:
    """Row order that stores a fused QKV weight ``(3 d, d)`` head by head: ``[q_0 k_0 v_0 q_1 ...]``
    (each ``d_head`` rows) instead of ``[q_0 .. q_h, k_0 .., v_0 ..]``, so that a contiguous
    column-wise shard of ``3 d / p`` rows holds whole heads. ``new = old[rows]``."""
    d = n_head * d_head
    return torch.cat([torch.arange(i * d + h * d_head, i * d + (h + 1) * d_head)
                      for h in range(n_head) for i in range(3)])


class HeadParallelAttention(nn.Module):
    """:class:`~rlm_course.lm.model.CausalSelfAttention` with its QKV rows stored head by head
    (:func:`head_major_rows`): the same function, but the number of heads is read from the QKV
    output's width, so the module runs unchanged on a column-parallel shard (``n_head / p`` heads
    per rank). Causal, without padding or KV cache (training on full sequences)."""

    def __init__(self, attn: nn.Module) -> None:
        super().__init__()
        self.d_head = attn.d_head
        rows = head_major_rows(attn.n_head, attn.d_head)
        self.qkv = copy.deepcopy(attn.qkv)
        self.proj = copy.deepcopy(attn.proj)
        with torch.no_grad():
            self.qkv.weight.copy_(attn.qkv.weight[rows])
            self.qkv.bias.copy_(attn.qkv.bias[rows])

    def forward(self, x: Tensor, attn_mask=None, cache=None) -> Tensor:
        if attn_mask is not None or cache is not None:
            raise ValueError("HeadParallelAttention trains on full causal sequences: no padding "
                             "mask or KV cache.")
        b, t, _ = x.shape
        qkv = self.qkv(x)
        heads = qkv.shape[-1] // (3 * self.d_head)
        q, k, v = qkv.view(b, t, heads, 3, self.d_head).permute(3, 0, 2, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, heads * self.d_head))


def tp_ready(model: TinyGPT) -> TinyGPT:
    """A copy of ``model`` whose attention modules store QKV head by head (same function)."""
    model = copy.deepcopy(model)
    for block in model.blocks:
        block.attn = HeadParallelAttention(block.attn)
    return model


def from_head_major(name: str, tensor: Tensor, config: ModelConfig) -> Tensor:
    """Undo :func:`head_major_rows` on a QKV weight or bias (by name); other tensors unchanged."""
    if name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
        rows = head_major_rows(config.n_head, config.d_head)
        out = torch.empty_like(tensor)
        out[rows] = tensor
        return out
    return tensor


def tensor_parallel_plan(sequence_parallel: bool) -> dict:
    """DTensor's plan for one block (Megatron's column/row split; with sequence parallelism the
    norms shard the sequence and the row-wise layers reduce-scatter it)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    if not sequence_parallel:
        return {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
                "mlp.fc": ColwiseParallel(), "mlp.out": RowwiseParallel()}
    return {"ln1": SequenceParallel(), "ln2": SequenceParallel(),
            "attn.qkv": ColwiseParallel(input_layouts=Shard(1)),
            "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
            "mlp.fc": ColwiseParallel(input_layouts=Shard(1)),
            "mlp.out": RowwiseParallel(output_layouts=Shard(1))}


def parallelize_tinygpt(model: TinyGPT, mesh, sequence_parallel: bool = False) -> TinyGPT:
    """Apply :func:`tensor_parallel_plan` to every block of a :func:`tp_ready` model (in place);
    with sequence parallelism, the first block's input enters the sequence layout (its backward
    all-gathers the gradient) and the last block's output leaves it (an all-gather)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        PrepareModuleOutput,
        parallelize_module,
    )

    for block in model.blocks:
        parallelize_module(block, mesh, tensor_parallel_plan(sequence_parallel))
    if sequence_parallel:
        parallelize_module(model.blocks[0], mesh, PrepareModuleInput(
            input_layouts=(Replicate(), None, None), desired_input_layouts=(Shard(1), None, None),
            use_local_output=True))
        parallelize_module(model.blocks[-1], mesh, PrepareModuleOutput(
            output_layouts=Shard(1), desired_output_layouts=Replicate(), use_local_output=True))
    return model


def reduce_partial_grads(model: nn.Module) -> None:
    """All-reduce the gradients that DTensor left as partial sums (sequence parallelism: the
    replicated norms see only their rank's positions), so that every rank holds the whole
    gradient before the optimizer step, as Megatron does."""
    from torch.distributed.tensor import DTensor, Replicate

    for p in model.parameters():
        g = p.grad
        if isinstance(g, DTensor) and any(pl.is_partial() for pl in g.placements):
            p.grad = g.redistribute(g.device_mesh, [Replicate()] * len(g.placements))


# ---------------------------------------------------------------------------- pipelines
class PipelinePart(nn.Module):
    """One pipeline stage of a TinyGPT: blocks ``lo .. hi - 1``; the first stage also embeds the
    tokens, the last also applies the final norm and the head (``tokens -> hidden -> logits``)."""

    def __init__(self, model: TinyGPT, lo: int, hi: int, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.tok_emb, self.pos_emb = model.tok_emb, model.pos_emb
        self.blocks = nn.ModuleList(model.blocks[lo:hi])
        if last:
            self.ln_f, self.head = model.ln_f, model.head

    def forward(self, x: Tensor) -> Tensor:
        if self.first:
            x = self.tok_emb(x) + self.pos_emb(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            x = block(x, None)
        if self.last:
            x = self.head(self.ln_f(x))
        return x


def stage_ids(name: str, rank: int, p: int) -> list[int]:
    """Virtual stages of ``rank``: ``rank`` (one per rank) or ``rank, rank + p`` (looped, two)."""
    return [rank + c * p for c in range(PIPELINES[name][1])]


# ---------------------------------------------------------------------------- one strategy
class _Run:
    """A strategy set up on this rank: :meth:`step` trains one step and returns this rank's loss
    (or None), :meth:`grads` / :meth:`params` give the full tensors by the model's parameter
    names (this rank's stages only, for pipelines)."""

    def __init__(self, name: str, ctx: RankContext, setup: Setup) -> None:
        self.name, self.ctx, self.setup = name, ctx, setup
        p, rank, device = ctx.world_size, ctx.rank, ctx.device
        setup.check(name, p)
        self.config = setup.config
        model = make_model(setup).to(device)
        tokens = make_tokens(setup).to(device)
        self.x, self.y = tokens[:, :-1], tokens[:, 1:]
        self.model = model
        if name in ("ddp", "fsdp2"):
            rows = slice(rank * setup.batch // p, (rank + 1) * setup.batch // p)
            self.x, self.y = self.x[rows], self.y[rows]
        if name == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.module = DDP(model)
            self.optimizer = _optimizer(model.parameters(), setup)
        elif name == "fsdp2":
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh(device.type, (p,))
            for block in model.blocks:
                fully_shard(block, mesh=mesh, reshard_after_forward=True)
            fully_shard(model, mesh=mesh, reshard_after_forward=True)
            self.module = model
            self.optimizer = _optimizer(model.parameters(), setup)
        elif name in ("tp", "tp_sp"):
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh(device.type, (p,))
            self.model = model = parallelize_tinygpt(tp_ready(model), mesh, name == "tp_sp")
            self.module = model
            self.optimizer = _optimizer(model.parameters(), setup, foreach=False)
        else:
            self._pipeline(model)

    def _pipeline(self, model: TinyGPT) -> None:
        from torch.distributed import pipelining as pp

        setup, p, rank = self.setup, self.ctx.world_size, self.ctx.rank
        per_rank = PIPELINES[self.name][1]
        n_stages = p * per_rank
        per = setup.n_layer // n_stages
        self.stages = []
        for j in stage_ids(self.name, rank, p):
            part = PipelinePart(model, j * per, (j + 1) * per, j == 0, j == n_stages - 1)
            self.stages.append(pp.PipelineStage(part, j, n_stages, self.ctx.device))
        cls = {"pp_gpipe": pp.ScheduleGPipe, "pp_1f1b": pp.Schedule1F1B,
               "pp_interleaved": pp.ScheduleInterleaved1F1B,
               "pp_zero_bubble": pp.ScheduleInterleavedZeroBubble}[self.name]
        self.schedule = cls(self.stages if per_rank > 1 else self.stages[0],
                            n_microbatches=setup.micro_batches, loss_fn=lm_loss)
        owned = {id(q) for s in self.stages for q in s.submod.parameters()}
        self.owned = {n for n, q in model.named_parameters() if id(q) in owned}
        self.optimizer = _optimizer([q for s in self.stages for q in s.submod.parameters()],
                                    setup)

    def step(self, before_update=None) -> float | None:
        """One training step; ``before_update()`` runs between backward and the optimizer (e.g. to
        read the gradients). Returns this rank's loss (its shard's for DDP/FSDP2, the whole
        batch's for TP, the mean of the micro-batches' on the last pipeline stage, else None)."""
        self.optimizer.zero_grad(set_to_none=True)
        if self.name in PIPELINES:
            losses: list[Tensor] = []
            first = any(s.is_first for s in self.stages)
            last = any(s.is_last for s in self.stages)
            kwargs = {"target": self.y, "losses": losses} if last else {}
            self.schedule.step(*((self.x,) if first else ()), **kwargs)
            loss = torch.stack(losses).mean().item() if last else None
        else:
            out = lm_loss(self.module(self.x), self.y)
            out.backward()
            loss = out.item()
            if self.name == "tp_sp":
                reduce_partial_grads(self.model)
        if before_update is not None:
            before_update()
        self.optimizer.step()
        return loss

    def _full(self, tensors: dict) -> dict:
        from torch.distributed.tensor import DTensor

        out = {}
        for n, t in tensors.items():
            t = t.full_tensor() if isinstance(t, DTensor) else t
            t = t.detach().cpu().clone()
            out[n] = from_head_major(n, t, self.config) if self.name.startswith("tp") else t
        return out

    def grads(self) -> dict:
        named = self.model.named_parameters()
        return self._full({n: q.grad for n, q in named
                           if q.grad is not None and self._mine(n)})

    def params(self) -> dict:
        return self._full({n: q for n, q in self.model.named_parameters() if self._mine(n)})

    def _mine(self, name: str) -> bool:
        return name in self.owned if self.name in PIPELINES else True


# ---------------------------------------------------------------------------- workers
def _progress(names, ctx: RankContext, desc: str, progress: bool):
    from tqdm.auto import tqdm

    return tqdm(names, desc=desc, disable=not (progress and ctx.is_main))


def equivalence_worker(ctx: RankContext, names: list[str], setup: Setup,
                       progress: bool = False) -> dict:
    """For each strategy: ``steps`` steps of training; the losses, the first step's gradients, the
    final parameters (full tensors by name), and what the last step sent (not the first ones:
    pipelining exchanges shapes in its first step, DDP settles its buckets in its second): the
    counted calls,
    the bytes this rank sent (ring/tree conventions) and, on Linux, the bytes written to its
    sockets (``wire``)."""
    out = {}
    for name in _progress(names, ctx, f"strategies on {ctx.world_size} ranks", progress):
        run = _Run(name, ctx, setup)
        losses, grads = [], {}
        for step in range(setup.steps):
            dist.barrier()
            if step == setup.steps - 1:
                wire0 = wire_bytes()
                with CommCounter() as counter:
                    losses.append(run.step())
                wire1 = wire_bytes()
            else:
                losses.append(run.step(
                    (lambda: grads.update(run.grads())) if step == 0 else None))
        out[name] = {"losses": losses, "grads": grads, "params": run.params(),
                     "calls": [asdict(c) for c in counter.calls], "sent": counter.sent,
                     "received": counter.received,
                     "wire": None if wire0 is None or wire1 is None else wire1 - wire0}
        dist.barrier()
    return out


def _synchronize(ctx: RankContext) -> None:
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def timing_worker(ctx: RankContext, names: list[str], setup: Setup, steps: int = 3,
                  progress: bool = False) -> dict:
    """For each strategy: one warm-up step, ``steps`` timed steps (``"seconds"``, this rank's wall
    time, a barrier before each), then ``steps`` steps under ``torch.profiler`` (``"profiled"``
    wall seconds and ``"comm_seconds"``, the time this rank's backend spent communicating,
    :func:`~rlm_course.distributed.comm.comm_seconds`; the profiler slows the step a little, so
    the share is taken within the profiled steps). Rank 0 also times one process training on
    the whole batch (``"one_process"``, seconds per step) while the others wait. On CUDA the
    steps are timed to the GPU's completion, but the profiler's CPU records of NCCL calls time
    their launch, not the transfer: read the communication share from a CUDA trace there."""
    out = {}
    for name in _progress(names, ctx, f"timing on {ctx.world_size} ranks", progress):
        run = _Run(name, ctx, setup)
        run.step()
        plain, profiled_seconds, comm = [], [], []
        for _ in range(steps):
            dist.barrier()
            start = time.perf_counter()
            run.step()
            _synchronize(ctx)
            plain.append(time.perf_counter() - start)
        for _ in range(steps):
            dist.barrier()
            with profiled() as prof:
                start = time.perf_counter()
                run.step()
                _synchronize(ctx)
                profiled_seconds.append(time.perf_counter() - start)
            comm.append(comm_seconds(prof))
        out[name] = {"seconds": plain, "profiled": profiled_seconds, "comm_seconds": comm}
        del run
        dist.barrier()
    if ctx.rank == 0:
        model, tokens = make_model(setup), make_tokens(setup)
        optimizer = _optimizer(model.parameters(), setup)

        def one_step():
            optimizer.zero_grad(set_to_none=True)
            lm_loss(model(tokens[:, :-1]), tokens[:, 1:]).backward()
            optimizer.step()

        one_step()
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            one_step()
            times.append(time.perf_counter() - start)
        out["one_process"] = times
    dist.barrier()
    return out


# ---------------------------------------------------------------------------- the formulas
def fsdp_numel(model: nn.Module, p: int) -> int:
    """Elements FSDP2 gathers for ``model`` on ``p`` ranks: every parameter padded along its first
    dimension to a multiple of ``p`` (FSDP2 shards each parameter on dim 0)."""
    total = 0
    for q in model.parameters():
        rows = q.shape[0] if q.dim() else 1
        total += math.ceil(rows / p) * p * (q.numel() // max(rows, 1))
    return total


def predicted_sent(name: str, setup: Setup, p: int) -> list[int]:
    """Bytes each rank sends in one training step, from the course's formulas and simulators
    (see the module docstring), in the setup's dtype.

    Raises:
        ValueError: if the strategy does not fit (see :meth:`Setup.check`).
    """
    from rlm_course.parallel.data_parallel import bytes_sent_per_step
    from rlm_course.parallel.tensor_parallel import layer_bytes_per_rank

    setup.check(name, p)
    e = torch.empty(0, dtype=setup.torch_dtype).element_size()
    model = make_model(setup)
    if name == "ddp":
        return [bytes_sent_per_step(0, model.num_parameters(), p, e)] * p
    if name == "fsdp2":
        return [bytes_sent_per_step(3, fsdp_numel(model, p), p, e)] * p
    b, t, d = setup.batch, setup.seq_len, setup.d_model
    if name in ("tp", "tp_sp"):
        per_block = layer_bytes_per_rank(b, t, d, p, e)
        if name == "tp" or p == 1:
            return [setup.n_layer * per_block] * p
        norms = 2 * (p - 1) * (4 * d * e) // p  # all-reduce of ln1/ln2 weight and bias gradients
        boundary = 2 * ((p - 1) * (b * t * d * e) // p)  # enter (backward) and leave (forward)
        return [setup.n_layer * (per_block + norms) + boundary] * p
    return _simulated_pipeline_sent(name, setup, p, model)


def _simulated_pipeline_sent(name: str, setup: Setup, p: int, model: TinyGPT) -> list[int]:
    """Chapter 09's simulator on the same blocks: activations forward and gradients back between
    consecutive virtual stages on different ranks, counted by a :class:`World`."""
    from rlm_course.parallel.pipeline import run_pipeline, schedule_table
    from rlm_course.parallel.world import World

    kind, chunks = PIPELINES[name]
    layers = [_BlockLayer(block) for block in model.blocks]
    m = setup.micro_batches
    g = torch.Generator().manual_seed(0)
    x = torch.randn(setup.batch, setup.seq_len, setup.d_model, generator=g,
                    dtype=setup.torch_dtype)
    micro = [(xb, xb) for xb in x.chunk(m)]
    world = World(p)
    run_pipeline(layers, schedule_table(kind, p, m, chunks), micro, F.mse_loss, world)
    return list(world.sent)


class _BlockLayer(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x, None)


# ---------------------------------------------------------------------------- the checks
def tolerances(setup: Setup) -> dict[str, float]:
    """How close a strategy must come to one device, from :mod:`rlm_course.numerics`.

    The longest sums are the weight gradients over the ``batch x seq_len`` tokens; they pass
    through ``depth = 2 (6 n_layer + 1)`` chained reductions (six per block forward -- QKV, the
    two attention products, the projection, the two MLP layers -- plus the head, and as many
    backward). ``loss`` and ``grads`` are relative (normwise) bounds of
    :func:`~rlm_course.numerics.reorder_tolerance`; ``params`` is the absolute bound of
    :func:`~rlm_course.numerics.adam_tolerance` after ``steps`` AdamW steps.
    """
    dtype = setup.torch_dtype
    terms = max(setup.batch * setup.seq_len, 4 * setup.d_model, setup.vocab_size)
    depth = 2 * (6 * setup.n_layer + 1)
    rel = reorder_tolerance(dtype, terms, depth)
    return {"loss": rel, "grads": rel,
            "params": adam_tolerance(dtype, terms, setup.lr, setup.steps, depth=depth)}


def merge_ranks(per_rank: list[dict], name: str) -> dict:
    """One strategy's results from every rank: the global losses per step (mean over ranks of
    the shards' losses for DDP/FSDP2; the losses of the rank that has them otherwise), gradients
    and parameters merged over ranks (pipelines: each rank holds its stages'), bytes per rank."""
    results = [r[name] for r in per_rank]
    steps = len(results[0]["losses"])
    losses = []
    for s in range(steps):
        values = [r["losses"][s] for r in results if r["losses"][s] is not None]
        losses.append(sum(values) / len(values) if name in ("ddp", "fsdp2") else values[0])
    grads, params = {}, {}
    for r in results:
        grads.update(r["grads"])
        params.update(r["params"])
    return {"losses": losses, "grads": grads, "params": params,
            "sent": [r["sent"] for r in results], "wire": [r["wire"] for r in results],
            "calls": [r["calls"] for r in results]}


def check_equivalence(per_rank: list[dict], setup: Setup, ref: dict | None = None) -> list[dict]:
    """Compare each strategy of an :func:`equivalence_worker` run with :func:`reference`.

    Returns:
        One row per strategy: ``strategy``, ``loss_error`` (largest relative error of a step's
        loss), ``grad_error`` (normwise relative error, largest over the parameters), and
        ``param_error`` (largest absolute difference after the last step), each with its
        tolerance and ``ok``; ``sent`` (measured bytes per rank), ``predicted`` (the formula's),
        ``bytes_ok``; ``wire`` (socket bytes per rank, Linux).
    """
    ref = ref or reference(setup)
    tol = tolerances(setup)
    p = len(per_rank)
    rows = []
    for name in per_rank[0]:
        got = merge_ranks(per_rank, name)
        loss_error = max(abs(a - b) / abs(b) for a, b in zip(got["losses"], ref["losses"]))
        missing = sorted(set(ref["params"]) - set(got["params"]))
        if missing:
            raise ValueError(f"{name}: no rank returned parameters {missing[:3]}...")
        grad_error = max(relative_error(got["grads"][n], ref["grads"][n]) for n in ref["grads"])
        param_error = max((got["params"][n] - ref["params"][n]).abs().max().item()
                          for n in ref["params"])
        predicted = predicted_sent(name, setup, p)
        rows.append({"strategy": name, "label": STRATEGIES[name], "ranks": p,
                     "loss_error": loss_error, "grad_error": grad_error,
                     "param_error": param_error, "tolerance": tol,
                     "ok": (loss_error <= tol["loss"] and grad_error <= tol["grads"]
                            and param_error <= tol["params"]),
                     "sent": got["sent"], "predicted": predicted,
                     "bytes_ok": got["sent"] == predicted, "wire": got["wire"],
                     "calls": _call_summary(got["calls"][0])})
    return rows


def _call_summary(calls: list[dict]) -> str:
    counts: dict[str, int] = {}
    for c in calls:
        counts[c["kind"]] = counts.get(c["kind"], 0) + 1
    return ", ".join(f"{n} {k}" for k, n in counts.items())


def summarize_timing(per_rank: list[dict]) -> list[dict]:
    """One row per strategy of a :func:`timing_worker` run: ``seconds`` (median over steps of the
    slowest rank's step), ``comm_seconds`` and ``comm_share`` (per rank, the median
    communication time of a profiled step and its share of that step, averaged over ranks),
    ``one_process_seconds`` and ``vs_one_process`` (step time over one process's on the whole
    batch, with one thread)."""
    import statistics

    one = statistics.median(per_rank[0]["one_process"])
    rows = []
    for name in per_rank[0]:
        if name == "one_process":
            continue
        steps = len(per_rank[0][name]["seconds"])
        slowest = [max(r[name]["seconds"][s] for r in per_rank) for s in range(steps)]
        t = statistics.median(slowest)
        comm = statistics.mean(statistics.median(r[name]["comm_seconds"]) for r in per_rank)
        share = statistics.mean(min(1.0, statistics.median(r[name]["comm_seconds"])
                                    / statistics.median(r[name]["profiled"])) for r in per_rank)
        rows.append({"strategy": name, "label": STRATEGIES[name], "ranks": len(per_rank),
                     "seconds": t, "comm_seconds": comm, "comm_share": share,
                     "one_process_seconds": one, "vs_one_process": t / one})
    return rows


def format_equivalence(rows: list[dict]) -> str:
    """The rows of :func:`check_equivalence` as a table (errors, tolerances, bytes per rank)."""
    from rlm_course.utils import format_table

    tol = rows[0]["tolerance"] if rows else {}
    table = [[r["label"], f"{r['loss_error']:.1e}", f"{r['grad_error']:.1e}",
              f"{r['param_error']:.1e}", "yes" if r["ok"] else "NO",
              " / ".join(f"{b:,}" for b in r["sent"]),
              " / ".join(f"{b:,}" for b in r["predicted"]), "yes" if r["bytes_ok"] else "NO",
              r["calls"]] for r in rows]
    head = (f"tolerances: loss and gradients {tol.get('loss', 0):.1e} (relative), parameters "
            f"{tol.get('params', 0):.1e} (absolute, after the AdamW steps)\n")
    return head + format_table(table, ["strategy", "loss err", "grad err", "param err", "equal",
                                       "bytes sent per rank (measured)", "formula", "bytes =",
                                       "calls in one step (rank 0)"])
