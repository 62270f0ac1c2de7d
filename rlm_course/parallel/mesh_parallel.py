"""Three-dimensional parallelism: the tiny transformer on a ``dp x pp x tp`` mesh of simulated
ranks, data, pipeline and tensor parallelism at once (Narayanan et al. 2021, "Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", arXiv:2104.04473,
section 2).

The ranks form a :class:`~rlm_course.parallel.world.Mesh` with axes ``dp, pp, tp``, ``tp``
varying fastest (so that, on real hardware, a tensor-parallel group sits inside one node, where
its per-layer collectives have NVLink). Rank ``(d, j, r)``:

* belongs to **data-parallel replica** ``d``: the replicas train on equal slices of the batch and
  all-reduce their gradients over the ``dp`` group of ranks with the same ``(j, r)``;
* holds **pipeline stage** ``j``: ``n_layer / pp`` consecutive blocks (stage 0 also the
  embeddings, the last stage the final norm and the head); activations go forward and gradients
  back to the same ``r`` of the next stage by point-to-point sends, micro-batch by micro-batch, in
  the order of a schedule table (:func:`~rlm_course.parallel.pipeline.schedule_table`, 1F1B by
  default);
* holds **tensor-parallel shard** ``r`` of each of its blocks
  (:class:`~rlm_course.parallel.tensor_parallel.TensorParallelBlock` on the ``tp`` group, a
  :class:`~rlm_course.parallel.world.SubWorld`); the embeddings, the final norm and the head are
  replicated across the ``tp`` group (Megatron splits them too; here they stay whole for
  clarity).

Each axis's traffic is counted apart (each group is a ``SubWorld`` whose collectives are named
``"tp: ..."``, ``"pp: ..."``, ``"dp: ..."``), and equals its closed form
(:func:`bytes_per_axis`): per micro-batch and block, the four all-reduce-sized exchanges of TP;
per micro-batch and stage boundary, one activation forward and one gradient back; per step, one
ring all-reduce of the rank's gradients over ``dp``.

Parallelism does not change what is computed: the gradients gathered from the shards equal one
device's gradients on the whole batch, up to the rounding of sums in another order
(:func:`rlm_course.numerics.reorder_tolerance`).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlm_course.lm.model import TinyGPT
from rlm_course.parallel.pipeline import schedule_table, walk_schedule
from rlm_course.parallel.tensor_parallel import TensorParallelBlock
from rlm_course.parallel.world import Mesh, World

AXES = ("dp", "pp", "tp")


class MeshParallelGPT:
    """A :class:`~rlm_course.lm.model.TinyGPT` split over ``world.size = dp x pp x tp`` ranks.

    Args:
        model: the single-device model (copied; not modified).
        schedule: the pipeline schedule, ``"gpipe"`` or ``"1f1b"``.

    Raises:
        ValueError: if the degrees do not multiply to the world size, ``pp`` does not divide the
            layers, or ``tp`` does not divide the heads or the MLP width.
    """

    def __init__(self, model: TinyGPT, world: World, dp: int = 1, pp: int = 1, tp: int = 1,
                 schedule: str = "1f1b") -> None:
        config = model.config
        self.mesh = Mesh(world, dp=dp, pp=pp, tp=tp)
        if config.n_layer % pp:
            raise ValueError(f"pp={pp} does not divide the {config.n_layer} layers; choose a "
                             "divisor of n_layer.")
        if schedule not in ("gpipe", "1f1b"):
            raise ValueError(f"schedule={schedule!r}: choose 'gpipe' or '1f1b'.")
        self.world, self.dp, self.pp, self.tp, self.schedule = world, dp, pp, tp, schedule
        self.config = config
        per = config.n_layer // pp
        self.replicas = []
        for d in range(dp):
            m = copy.deepcopy(model)
            stages = []
            for j in range(pp):
                group = self.mesh.subworld("tp", self.rank(d, j, 0))
                stages.append([TensorParallelBlock(m.blocks[i], group)
                               for i in range(j * per, (j + 1) * per)])
            self.replicas.append({
                "stages": stages,
                "embeddings": [nn.ModuleDict({"tok": copy.deepcopy(m.tok_emb),
                                              "pos": copy.deepcopy(m.pos_emb)})
                               for _ in range(tp)],
                "final": [nn.ModuleDict({"ln_f": copy.deepcopy(m.ln_f),
                                         "head": copy.deepcopy(m.head)}) for _ in range(tp)],
            })
        self.pp_groups = {(d, r): self.mesh.subworld("pp", self.rank(d, 0, r))
                          for d in range(dp) for r in range(tp)}
        self.dp_groups = {(j, r): self.mesh.subworld("dp", self.rank(0, j, r))
                          for j in range(pp) for r in range(tp)}

    def rank(self, d: int, j: int, r: int) -> int:
        """The global rank of data-parallel replica ``d``, stage ``j``, TP shard ``r``."""
        return (d * self.pp + j) * self.tp + r

    def parameters_of(self, d: int, j: int, r: int) -> list[nn.Parameter]:
        """The parameters rank ``(d, j, r)`` holds, in a fixed order."""
        rep = self.replicas[d]
        params = [p for block in rep["stages"][j] for p in block.shards[r].parameters()]
        if j == 0:
            params = list(rep["embeddings"][r].parameters()) + params
        if j == self.pp - 1:
            params += list(rep["final"][r].parameters())
        return params

    def numel_per_rank(self) -> list[int]:
        """Parameters (elements) each rank holds."""
        out = [0] * self.world.size
        for d in range(self.dp):
            for j in range(self.pp):
                for r in range(self.tp):
                    out[self.rank(d, j, r)] = sum(p.numel() for p in self.parameters_of(d, j, r))
        return out

    def state_bytes_per_rank(self) -> list[int]:
        """Bytes of parameters each rank holds (in the model's dtype)."""
        size = next(iter(self.replicas[0]["final"][0].parameters())).element_size()
        return [n * size for n in self.numel_per_rank()]

    # ------------------------------------------------------------------ one training step
    def step(self, tokens: Tensor, micro_batches: int) -> list[float]:
        """Forward and backward of next-token prediction on ``tokens (batch, seq + 1)`` (the
        model reads ``tokens[:, :-1]`` and predicts ``tokens[:, 1:]``), then the data-parallel
        all-reduce of the gradients (their mean over the replicas). The batch is split into
        ``dp`` equal slices, each into ``micro_batches`` equal micro-batches; every loss is a
        mean, so the gradients are those of the whole batch's mean loss. Each step starts from
        zero gradients (as :meth:`DataParallel.step
        <rlm_course.parallel.data_parallel.DataParallel.step>` does): a second call on the same
        batch gives the same gradients, not twice them.

        Returns:
            the mean loss of each replica's slice.

        Raises:
            ValueError: if ``micro_batches`` is not a positive integer or the batch does not
                split evenly.
        """
        if isinstance(micro_batches, bool) or not (isinstance(micro_batches, int)
                                                   and micro_batches >= 1):
            raise ValueError(f"micro_batches={micro_batches!r} must be a positive integer.")
        for d in range(self.dp):
            for j in range(self.pp):
                for r in range(self.tp):
                    for p in self.parameters_of(d, j, r):
                        p.grad = None
        if not (isinstance(tokens, Tensor) and tokens.dim() == 2 and not tokens.is_floating_point()
                and 2 <= tokens.shape[1] <= self.config.max_seq_len + 1):
            raise ValueError(f"tokens must be integer ids of shape (batch, seq + 1) with seq + 1 "
                             f"from 2 to max_seq_len + 1 = {self.config.max_seq_len + 1}; got "
                             f"{getattr(tokens, 'dtype', type(tokens).__name__)} "
                             f"{tuple(getattr(tokens, 'shape', ()))}.")
        vocab = self.config.vocab_size
        if tokens.numel() and not 0 <= int(tokens.min()) <= int(tokens.max()) < vocab:
            raise ValueError(f"tokens must be ids in 0..{vocab - 1} (the "
                             f"vocabulary); got {int(tokens.min())}..{int(tokens.max())}.")
        batch = tokens.shape[0]
        if batch % (self.dp * micro_batches):
            raise ValueError(f"a batch of {batch} does not split into dp={self.dp} x "
                             f"micro_batches={micro_batches} equal parts.")
        losses = []
        for d, rows in enumerate(tokens.chunk(self.dp)):
            losses.append(self._replica_step(d, list(rows.chunk(micro_batches))))
        for (j, r), group in self.dp_groups.items():
            params = [self.parameters_of(d, j, r) for d in range(self.dp)]
            flat = [torch.cat([p.grad.reshape(-1) for p in ps]) / self.dp for ps in params]
            total = group.all_reduce(flat, name="all-reduce grads")
            for ps, t in zip(params, total):
                offset = 0
                for p in ps:
                    p.grad = t[offset:offset + p.numel()].view_as(p).clone()
                    offset += p.numel()
        return losses

    def _replica_step(self, d: int, micro: list[Tensor]) -> float:
        rep, pp, last = self.replicas[d], self.pp, self.pp - 1
        m = len(micro)
        table = schedule_table(self.schedule, pp, m)
        inputs: dict[tuple[int, int], list[Tensor]] = {}
        outputs: dict[tuple[int, int], object] = {}
        grads: dict[tuple[int, int], list[Tensor]] = {}
        losses = [0.0] * m

        def step(device, kind, mb, chunk, j) -> bool:
            if kind == "F":
                if j > 0 and (mb, j - 1) not in outputs:
                    return False
                if j == 0:
                    x = micro[mb][:, :-1]
                    pos = torch.arange(x.shape[1])
                    xs = [e["tok"](x) + e["pos"](pos) for e in rep["embeddings"]]
                else:
                    xs = [self.pp_groups[(d, r)].send(out.detach(), j - 1, j,
                                                      name="send activations")
                          .requires_grad_(True) for r, out in enumerate(outputs[(mb, j - 1)])]
                    inputs[(mb, j)] = xs
                for block in rep["stages"][j]:
                    xs = block(xs)
                if j == last:
                    target = micro[mb][:, 1:].reshape(-1)
                    loss_r = [F.cross_entropy(f["head"](f["ln_f"](x)).reshape(-1, f["head"].out_features),
                                              target) for f, x in zip(rep["final"], xs)]
                    losses[mb] = loss_r[0].item()
                    xs = sum(loss_r) / m  # each TP rank backpropagates its own copy of the loss
                outputs[(mb, j)] = xs
                return True
            if j < last and (mb, j) not in grads:
                return False
            out = outputs.pop((mb, j))
            if j == last:
                out.backward()
            else:
                torch.autograd.backward(out, grads.pop((mb, j)))
            if j > 0:
                grads[(mb, j - 1)] = [self.pp_groups[(d, r)].send(x.grad, j, j - 1,
                                                                  name="send gradients")
                                      for r, x in enumerate(inputs.pop((mb, j)))]
            return True

        walk_schedule(table, step)
        return sum(losses) / m

    # ------------------------------------------------------------------ comparison
    def gathered_grads(self) -> dict[str, Tensor]:
        """Replica 0's gradients reassembled into the single-device model's parameter names
        (TP shards concatenated along the dimension they were split on; replicated parameters
        taken from TP rank 0)."""
        rep, out, per = self.replicas[0], {}, self.config.n_layer // self.pp
        emb, final = rep["embeddings"][0], rep["final"][0]
        out["tok_emb.weight"], out["pos_emb.weight"] = emb["tok"].weight.grad, emb["pos"].weight.grad
        out["ln_f.weight"], out["ln_f.bias"] = final["ln_f"].weight.grad, final["ln_f"].bias.grad
        out["head.weight"] = final["head"].weight.grad
        for j, blocks in enumerate(rep["stages"]):
            for k, block in enumerate(blocks):
                i, shards = j * per + k, block.shards
                width = block.heads_per_rank * block.d_head
                qkv_w = [torch.cat([s.qkv_w.grad[q * width:(q + 1) * width] for s in shards])
                         for q in range(3)]
                qkv_b = [torch.cat([s.qkv_b.grad[q * width:(q + 1) * width] for s in shards])
                         for q in range(3)]
                prefix = f"blocks.{i}."
                out[prefix + "attn.qkv.weight"] = torch.cat(qkv_w)
                out[prefix + "attn.qkv.bias"] = torch.cat(qkv_b)
                out[prefix + "attn.proj.weight"] = torch.cat([s.proj_w.grad for s in shards], 1)
                out[prefix + "attn.proj.bias"] = shards[0].proj_b.grad
                out[prefix + "mlp.fc.weight"] = torch.cat([s.fc_w.grad for s in shards])
                out[prefix + "mlp.fc.bias"] = torch.cat([s.fc_b.grad for s in shards])
                out[prefix + "mlp.out.weight"] = torch.cat([s.out_w.grad for s in shards], 1)
                out[prefix + "mlp.out.bias"] = shards[0].out_b.grad
                for norm in ("ln1", "ln2"):
                    ln = getattr(shards[0], norm)
                    out[prefix + f"{norm}.weight"], out[prefix + f"{norm}.bias"] = ln.weight.grad, ln.bias.grad
        return out

    def bytes_by_axis(self) -> dict[str, list[int]]:
        """Bytes each global rank sent on each axis (from the groups' own counters)."""
        out = {axis: [0] * self.world.size for axis in AXES}
        groups = ([("tp", block.world) for rep in self.replicas for stage in rep["stages"]
                   for block in stage[:1]]
                  + [("pp", g) for g in self.pp_groups.values()]
                  + [("dp", g) for g in self.dp_groups.values()])
        for axis, group in groups:
            for local, global_rank in enumerate(group.ranks):
                out[axis][global_rank] += group.sent[local]
        return out


def bytes_per_axis(config, dp: int, pp: int, tp: int, batch: int, seq: int, micro_batches: int,
                   numel_per_rank: list[int], bytes_per_element: int = 4) -> dict[str, list[int]]:
    """The closed forms of the bytes each rank sends per step, by axis, for
    :class:`MeshParallelGPT` (``batch`` sequences of ``seq`` input tokens):

    * ``tp``: per micro-batch and block of its stage, four all-reduce-sized exchanges of
      ``b s d`` activations, ``2 (tp - 1) / tp`` of them each
      (:func:`~rlm_course.parallel.tensor_parallel.layer_bytes_per_rank`);
    * ``pp``: per micro-batch, the activations ``b s d`` to the next stage (all but the last
      stage) and their gradient to the previous one (all but the first);
    * ``dp``: one ring all-reduce of the rank's ``numel_per_rank`` gradients,
      ``2 (dp - 1) / dp`` of them.

    ``b = batch / (dp x micro_batches)`` rows per micro-batch.
    """
    from rlm_course.parallel.tensor_parallel import layer_bytes_per_rank

    rows = batch // (dp * micro_batches)
    act = rows * seq * config.d_model * bytes_per_element
    layers = config.n_layer // pp
    out = {axis: [] for axis in AXES}
    for rank in range(dp * pp * tp):
        j = (rank // tp) % pp
        out["tp"].append(micro_batches * layers * layer_bytes_per_rank(rows, seq, config.d_model, tp,
                                                                        bytes_per_element)
                         if tp > 1 else 0)
        out["pp"].append(micro_batches * act * ((j < pp - 1) + (j > 0)))
        m = numel_per_rank[rank] * bytes_per_element
        out["dp"].append(2 * (dp - 1) * m // dp if dp > 1 else 0)
    return out
