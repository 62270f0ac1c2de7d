"""The work-depth model of an RL iteration: how much parallelism each stage offers.

A computation is a DAG of operations. Its **work** ``W`` is the number of operations (its time on
one processor) and its **depth** ``D`` the longest chain of operations that depend on each other
(its time on unboundedly many processors). ``W / D`` is its parallelism, and Brent's theorem
bounds its time on ``p`` processors: ``max(W/p, D) <= T_p <= W/p + D`` (Blelloch, "Programming
Parallel Algorithms", CACM 39(3), 1996; Brent, JACM 21(2), 1974).

**Cost model** (what counts, and at what depth):

* work is counted in FLOPs, with the course's convention (:func:`rlm_course.lm.model.forward_flops`):
  a matmul ``(m, k) @ (k, n)`` is ``2 m k n`` FLOPs; an elementwise operation (add, multiply,
  exp, GELU, rsqrt, compare, ...) on ``n`` values is ``n`` per operation;
* depth: an elementwise operation is depth 1; a sum (or max) of ``n`` values is a balanced tree of
  depth ``ceil(log2 n)``; so a matmul is depth ``1 + ceil(log2 k)`` (all products at once, then a
  tree sum over ``k``);
* composition: **sequential** parts add both work and depth; **parallel** (independent) parts add
  work and take the maximum depth;
* backward mirrors forward: each matmul's backward is two matmuls (input and weight gradients,
  independent of each other), each elementwise operation one, each reduction a broadcast (depth 1),
  in reverse order;
* the verifier and the data movement (embedding look-ups, reshapes, KV-cache writes) are not
  counted: they are not arithmetic (chapter 05 counts their bytes); except stage 4, the weight
  sync (:func:`weight_sync`), whose work is element moves (it has no arithmetic, and chapter 12
  adds it to an iteration's DAG when asked).

Build blocks with :func:`matmul`, :func:`elementwise`, :func:`reduction`, compose them with
:func:`seq`, :func:`par` and :func:`repeat`, or use the ready blocks (:func:`attention`,
:func:`layer`, :func:`forward`, :func:`backward`, :func:`optimizer_step`, :func:`decode`,
:func:`gae_scan`, :func:`gae_prefix_scan`, :func:`grpo_iteration`, :func:`ppo_iteration`). The
closed forms (:func:`forward_cost`, :func:`decode_cost`) give the same numbers without a DAG.

Responses of different lengths (``response_lengths``, e.g. from
:func:`rlm_course.cost.anatomy.lognormal_lengths`): the work of decoding follows the sum of the
lengths, its depth the longest one, ``T_max`` (:func:`decode`); scoring and training process each
sequence at its own length (:func:`packed_forward`). In seconds, that depth is
:func:`rlm_course.cost.anatomy.generation_time_bounds`.
"""

from __future__ import annotations

import math
import numbers
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from rlm_course.cost.architectures import TransformerSpec, from_model_config
from rlm_course.lm.model import ModelConfig

Model = ModelConfig | TransformerSpec


def as_spec(model: Model) -> TransformerSpec:
    """A :class:`TransformerSpec` for either description of a model."""
    return from_model_config(model) if isinstance(model, ModelConfig) else model

ADAM_OPS_PER_PARAMETER = 14  # m: 3, v: 4, sqrt, +eps, divide, bias corrections 2, decay, update


def log2_depth(n: int) -> int:
    """Depth of a balanced-tree reduction of ``n`` values: ``ceil(log2 n)`` (0 for n = 1)."""
    if n < 1:
        raise ValueError(f"a reduction needs at least one value, got n={n}.")
    return (n - 1).bit_length()


@dataclass(frozen=True)
class Computation:
    """A node of the DAG: a leaf operation, or a composition of parts.

    Attributes:
        name: what it is (e.g. ``"matmul qkv"``).
        work: FLOPs; depth: longest dependent chain, in operations.
        kind: ``"matmul"``, ``"elementwise"``, ``"reduction"`` (leaves), ``"seq"``, ``"par"``.
        parts: the children of a composition (a repeated part appears once, with ``count``).
        count: how many copies of ``parts`` the node stands for.
        shape: ``(m, k, n)`` of a matmul (its backward needs it).
    """

    name: str
    work: int
    depth: int
    kind: str
    parts: tuple["Computation", ...] = field(default=(), repr=False)
    count: int = 1
    shape: tuple[int, ...] = field(default=(), repr=False)

    @property
    def parallelism(self) -> float:
        """``W / D``: the processors it can keep busy on average."""
        return self.work / self.depth if self.depth else math.inf

    def brent_time(self, processors: int) -> float:
        """Brent's upper bound ``W/p + D`` on the time (in operations) with ``p`` processors
        (:func:`brent_bound`)."""
        return brent_bound(self.work, self.depth, processors)

    def lower_bound(self, processors: int) -> float:
        """No schedule beats ``max(W/p, D)``."""
        _check_processors(processors)
        return max(self.work / processors, self.depth)

    def speedup(self, processors: int) -> float:
        """Guaranteed speedup over one processor, ``W / (W/p + D)``: it saturates at ``W/D``."""
        return self.work / self.brent_time(processors)

    def work_of(self, kind: str) -> int:
        """Work of the leaves of one kind (e.g. ``"matmul"``), counting repetitions."""
        if not self.parts:
            return self.work if self.kind == kind else 0
        return self.count * sum(p.work_of(kind) for p in self.parts)

    def breakdown(self) -> list[tuple[str, int, int]]:
        """``(name, work, depth)`` of each direct part (repetitions multiplied in)."""
        return [(p.name, p.work * self.count, p.depth * (self.count if self.kind == "seq" else 1))
                for p in self.parts]


def brent_bound(work: float, depth: float, processors: int) -> float:
    """Brent's theorem: a greedy schedule on ``p`` processors takes at most ``W/p + D`` steps
    (Brent 1974; Blelloch 1996, section 2).

    Raises:
        ValueError: unless ``processors`` is an integer >= 1.
    """
    _check_processors(processors)
    if work < 0 or depth < 0:
        raise ValueError(f"work={work} and depth={depth} must be >= 0.")
    # BEGIN SOLUTION: every step either keeps all p processors busy (at most W/p such steps) or finishes a level of the longest chain (at most D)
    return work / processors + depth
    # END SOLUTION


def _check_processors(p: int) -> None:
    if isinstance(p, bool) or not (isinstance(p, numbers.Integral) and p >= 1):
        raise ValueError(f"processors={p!r}: need an integer >= 1.")


def _positive(**sizes: int) -> None:
    for name, value in sizes.items():  # numpy's integers too
        if isinstance(value, bool) or not (isinstance(value, numbers.Integral) and value >= 1):
            raise ValueError(f"{name}={value!r} must be a positive integer.")


# ----------------------------------------------------------------------------- leaves
def matmul(m: int, k: int, n: int, name: str = "matmul") -> Computation:
    """``(m, k) @ (k, n)``: ``W = 2 m k n``, ``D = 1 + ceil(log2 k)``."""
    _positive(m=m, k=k, n=n)
    return Computation(name, 2 * m * k * n, 1 + log2_depth(k), "matmul", shape=(m, k, n))


def elementwise(n: int, ops: int = 1, name: str = "elementwise") -> Computation:
    """``ops`` dependent elementwise operations on ``n`` values: ``W = ops n``, ``D = ops``."""
    _positive(n=n, ops=ops)
    return Computation(name, ops * n, ops, "elementwise")


def reduction(rows: int, n: int, name: str = "reduction") -> Computation:
    """``rows`` independent sums (or maxima) of ``n`` values: ``W = rows n``,
    ``D = ceil(log2 n)``."""
    _positive(rows=rows, n=n)
    return Computation(name, rows * n, log2_depth(n), "reduction")


# ----------------------------------------------------------------------------- composition
def seq(name: str, *parts: Computation) -> Computation:
    """Parts that run one after the other: work and depth add."""
    return Computation(name, sum(p.work for p in parts), sum(p.depth for p in parts), "seq", parts)


def par(name: str, *parts: Computation) -> Computation:
    """Independent parts: work adds, depth is the maximum."""
    return Computation(name, sum(p.work for p in parts), max((p.depth for p in parts), default=0),
                       "par", parts)


def repeat(part: Computation, count: int, parallel: bool, name: str | None = None) -> Computation:
    """``count`` copies of ``part``, one after the other (``parallel=False``: ``count x`` work and
    depth) or independent (``count x`` work, the same depth)."""
    _positive(count=count)
    depth = part.depth if parallel else count * part.depth
    return Computation(name or f"{count} x {part.name}", count * part.work, depth,
                       "par" if parallel else "seq", (part,), count)


# ----------------------------------------------------------------------------- transformer blocks
def softmax(rows: int, n: int, name: str = "softmax") -> Computation:
    """Row max, subtract and exp, row sum, divide: ``W = 5 rows n``, ``D = 2 ceil(log2 n) + 3``."""
    return seq(name, reduction(rows, n, "max"), elementwise(rows * n, 2, "subtract, exp"),
               reduction(rows, n, "sum"), elementwise(rows * n, 1, "divide"))


def layer_norm(rows: int, d: int, name: str = "layer norm") -> Computation:
    """Mean, centre, variance, normalise, scale and shift: ``W = 7 rows d``,
    ``D = 2 ceil(log2 d) + 5``."""
    return seq(name, reduction(rows, d, "sum"), elementwise(rows * d, 2, "centre, square"),
               reduction(rows, d, "sum of squares"),
               elementwise(rows * d, 3, "rsqrt-scale, gain, bias"))


def attention(batch: int, n_head: int, seq_len: int, context: int, d_head: int,
              d_v: int | None = None) -> Computation:
    """Scaled dot-product attention of ``seq_len`` queries over ``context`` keys in every head:
    ``softmax(q k^T / sqrt(d)) v``; the ``batch x n_head`` heads are independent. ``d_v``: the
    values' width when it differs from the keys' (MLA's 128 against 192)."""
    one_head = seq("one head", matmul(seq_len, d_head, context, "q k^T"),
                   elementwise(seq_len * context, 1, "scale + mask"),
                   softmax(seq_len, context),
                   matmul(seq_len, context, d_head if d_v is None else d_v, "p v"))
    return repeat(one_head, batch * n_head, parallel=True, name="attention")


def mlp(spec: TransformerSpec, rows: int, name: str = "mlp",
        d_ff: int | None = None) -> Computation:
    """One MLP on ``rows`` tokens: up-projection, nonlinearity, down-projection. A gated (SwiGLU)
    MLP projects to ``2 d_ff`` (gate and up, fused) and spends 2 operations per hidden value
    (SiLU, multiply); a GELU MLP projects to ``d_ff`` and spends 1. ``d_ff``: a width other
    than the spec's (an MoE model's dense layers)."""
    d, hidden = spec.d_model, spec.d_ff if d_ff is None else d_ff
    if spec.glu:
        return seq(name, matmul(rows, d, 2 * hidden, "gate + up"),
                   elementwise(rows * hidden, 2, "silu * up"), matmul(rows, hidden, d, "down"))
    return seq(name, matmul(rows, d, hidden, "up"), elementwise(rows * hidden, 1, "gelu"),
               matmul(rows, hidden, d, "down"))


def moe(spec: TransformerSpec, rows: int) -> Computation:
    """A mixture-of-experts MLP with balanced routing: the router (a matmul to ``n_experts``
    scores, a softmax, a top-k as ``k`` maxima), then each token's ``experts_per_token`` routed
    experts and the shared ones side by side, then a weighted sum of their outputs."""
    k, shared = spec.experts_per_token, spec.n_shared_experts
    router = seq("router", matmul(rows, spec.d_model, spec.n_experts, "router scores"),
                 softmax(rows, spec.n_experts), repeat(reduction(rows, spec.n_experts, "top-1"), k,
                                                       parallel=False, name=f"top-{k}"))
    experts = repeat(mlp(spec, rows, "expert"), k + shared, parallel=True,
                     name=f"{k} routed + {shared} shared experts")
    return seq("moe", router, experts, elementwise(rows * spec.d_model, 2 * (k + shared) - 1,
                                                     "weighted sum"))


def mla_attention(spec: TransformerSpec, batch: int, seq_len: int, context: int,
                  absorbed: bool = False) -> Computation:
    """Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, section 2.1) as a
    teacher-forced pass runs it: the query's down- and up-projections (or one projection without
    ``q_lora_rank``), the latent's down-projection with the shared RoPE key, its norm and
    up-projection to every head's key and value, attention with keys of ``qk_head_dim`` and values
    of ``v_dim``, the output projection. ``absorbed``: as a decode step runs it (appendix C;
    vLLM's and SGLang's MLA decode), the key up-projection folded into each head's query
    (``d_head -> kv_lora_rank``) and the value up-projection applied after attention
    (``kv_lora_rank -> v_dim``), each head scoring the cached latents and RoPE keys
    (``kv_lora_rank + qk_rope_head_dim`` wide) and summing the latents (``kv_lora_rank``): the
    same matmul work a token, :attr:`~rlm_course.cost.architectures.TransformerSpec.decode_flops_per_key`
    per cached key. The latents' norms are RMSNorms, drawn as :func:`layer_norm` like the
    block's."""
    d, rows, h = spec.d_model, batch * seq_len, spec.n_head
    rq, r, rope = spec.q_lora_rank, spec.kv_lora_rank, spec.qk_rope_head_dim
    query = (seq("query", matmul(rows, d, rq, "q down"), layer_norm(rows, rq, "q norm"),
                 matmul(rows, rq, h * spec.qk_head_dim, "q up")) if rq
             else matmul(rows, d, h * spec.qk_head_dim, "q"))
    if absorbed:
        query = seq("query", query, matmul(rows * h, spec.head_dim, r, "absorb key up"))
        latent = seq("latent", matmul(rows, d, r + rope, "kv down + rope key"),
                     layer_norm(rows, r, "kv norm"))
        return seq("mla (absorbed)", par("projections", query, latent),
                   attention(batch, h, seq_len, context, r + rope, r),
                   matmul(rows * h, r, spec.v_dim, "value up"),
                   matmul(rows, h * spec.v_dim, d, "out proj"))
    latent = seq("latent", matmul(rows, d, r + rope, "kv down + rope key"),
                 layer_norm(rows, r, "kv norm"),
                 matmul(rows, r, h * (spec.head_dim + spec.v_dim), "kv up"))
    return seq("mla", par("projections", query, latent),
               attention(batch, h, seq_len, context, spec.qk_head_dim, spec.v_dim),
               matmul(rows, h * spec.v_dim, d, "out proj"))


def _decode_key_widths(spec: TransformerSpec) -> tuple[int, int]:
    """A decode step's attention widths per head, ``(scored, summed)``: the keys' and values'
    (:attr:`~rlm_course.cost.architectures.TransformerSpec.qk_head_dim`, ``v_dim``), or under
    MLA the cached latent's, ``(kv_lora_rank + qk_rope_head_dim, kv_lora_rank)``."""
    if spec.kv_latent:
        return spec.kv_lora_rank + spec.qk_rope_head_dim, spec.kv_lora_rank
    return spec.qk_head_dim, spec.v_dim


def _deepseek_layer(spec: TransformerSpec, batch: int, seq_len: int, context: int,
                    dense: bool, absorbed: bool) -> Computation:
    """:func:`layer` of an MLA model (:func:`mla_attention`) or of an MoE model's first dense
    layers (its MLP ``dense_d_ff`` wide): the same pre-norm block around other parts."""
    rows, d = batch * seq_len, spec.d_model
    ffn = (mlp(spec, rows, d_ff=spec.dense_d_ff) if dense
           else moe(spec, rows) if spec.is_moe else mlp(spec, rows))
    attn = (mla_attention(spec, batch, seq_len, context, absorbed) if spec.kv_latent else seq(
        "attention block", matmul(rows, d, (spec.n_head + 2 * spec.kv_heads) * spec.head_dim,
                                  "qkv"),
        attention(batch, spec.n_head, seq_len, context, spec.head_dim),
        matmul(rows, spec.n_head * spec.head_dim, d, "out proj")))
    return seq("layer", layer_norm(rows, d, "norm 1"), attn, elementwise(rows * d, 1, "residual"),
               layer_norm(rows, d, "norm 2"), ffn, elementwise(rows * d, 1, "residual"))


def layer(model: Model, batch: int, seq_len: int, context: int | None = None,
          dense: bool = False, absorbed: bool = False) -> Computation:
    """One pre-norm transformer block on ``batch x seq_len`` new tokens attending over
    ``context`` positions (default ``seq_len``); queries in ``n_head`` heads, keys and values in
    ``n_kv_head`` (GQA), fused into one projection (under MLA, :func:`mla_attention`, with
    ``absorbed`` as a decode step runs it). ``dense``: one of an MoE model's first
    ``n_dense_layers`` layers, with a dense MLP of ``dense_d_ff``.

    Raises:
        ValueError: for non-positive sizes, or ``dense`` for a model without dense layers.
    """
    spec = as_spec(model)
    ctx = seq_len if context is None else context
    _positive(batch=batch, seq_len=seq_len, context=ctx)
    if dense is not False and (dense is not True or not spec.n_dense_layers):
        raise ValueError(f"layer: dense={dense!r} draws one of an MoE model's first dense layers; "
                         f"{spec.name} has {spec.n_dense_layers} (n_dense_layers).")
    if spec.kv_latent or dense:  # DeepSeek's layers: latent attention, a dense MLP first
        return _deepseek_layer(spec, batch, seq_len, ctx, dense, absorbed)
    d, rows, dh = spec.d_model, batch * seq_len, spec.head_dim
    qkv_width = (spec.n_head + 2 * spec.kv_heads) * dh
    # BEGIN SOLUTION: in order: norm, fused qkv matmul, attention over the heads, output projection, residual add, norm, the MLP (or MoE), residual add
    return seq("layer",
               layer_norm(rows, d, "norm 1"), matmul(rows, d, qkv_width, "qkv"),
               attention(batch, spec.n_head, seq_len, ctx, dh),
               matmul(rows, spec.n_head * dh, d, "out proj"), elementwise(rows * d, 1, "residual"),
               layer_norm(rows, d, "norm 2"), moe(spec, rows) if spec.is_moe else mlp(spec, rows),
               elementwise(rows * d, 1, "residual"))
    # END SOLUTION


def forward(model: Model, batch: int, seq_len: int, context: int | None = None,
            value_positions: int | None = None, absorbed: bool = False) -> Computation:
    """A forward pass: position embedding add, ``n_layer`` blocks in sequence, final norm, and the
    language-model head on every position; a critic's (``value_positions`` given) a scalar value
    head on its ``value_positions`` response positions instead, as
    :func:`~rlm_course.cost.architectures.teacher_forced_flops` counts it. ``absorbed``: MLA's
    attention as a decode step runs it (:func:`mla_attention`)."""
    spec = as_spec(model)
    _positive(batch=batch, seq_len=seq_len)
    rows = batch * seq_len
    head = (matmul(rows, spec.d_model, spec.vocab_size, "lm head") if value_positions is None
            else matmul(batch * value_positions, spec.d_model, 1, "value head"))
    blocks = repeat(layer(spec, batch, seq_len, context, absorbed=absorbed),
                    spec.moe_layers or spec.n_layer, parallel=False,
                    name=f"{spec.moe_layers or spec.n_layer} layers")
    if spec.n_dense_layers:  # an MoE model's first layers, with a dense MLP
        blocks = seq(f"{spec.n_layer} layers",
                     repeat(layer(spec, batch, seq_len, context, dense=True, absorbed=absorbed),
                            spec.n_dense_layers, parallel=False,
                            name=f"{spec.n_dense_layers} dense layers"), blocks)
    return seq("forward", elementwise(rows * spec.d_model, 1, "embed + position"), blocks,
               layer_norm(rows, spec.d_model, "final norm"), head)


def backward(node: Computation) -> Computation:
    """The backward pass of ``node``, mirroring it (see the module docstring): a matmul
    ``(m,k)@(k,n)`` becomes ``dX = dY W^T`` (``(m,n)@(n,k)``) and ``dW = X^T dY``
    (``(k,m)@(m,n)``) side by side; sequences run in reverse."""
    if node.kind == "matmul":
        m, k, n = node.shape
        return par(f"d {node.name}", matmul(m, n, k, "dX"), matmul(k, m, n, "dW"))
    if node.kind == "elementwise":
        return Computation(f"d {node.name}", node.work, node.depth, "elementwise")
    if node.kind == "reduction":  # gradient of a sum is a broadcast: one operation per value
        return Computation(f"d {node.name}", node.work, 1, "elementwise")
    parts = tuple(backward(p) for p in node.parts)
    if node.count > 1:
        return repeat(parts[0], node.count, node.kind == "par", f"d {node.name}")
    if node.kind == "seq":
        return seq(f"d {node.name}", *reversed(parts))
    return par(f"d {node.name}", *parts)


def optimizer_step(n_params: int) -> Computation:
    """AdamW on ``n_params`` parameters: :data:`ADAM_OPS_PER_PARAMETER` dependent elementwise
    operations each, all parameters independent."""
    return elementwise(n_params, ADAM_OPS_PER_PARAMETER, "AdamW")


def _loss(config: Model, rows: int, value_rows: int | None) -> Computation:
    """The policy's loss (log-softmax over the vocabulary and a mean over ``rows`` positions), or
    a critic's (a squared error and a mean over its ``value_rows`` values)."""
    if value_rows is None:
        return seq("loss", softmax(rows, as_spec(config).vocab_size, "log-softmax"),
                   reduction(1, rows, "mean"))
    return seq("value loss", elementwise(value_rows, 2, "error, square"),
               reduction(1, value_rows, "mean"))


def training_step(config: Model, batch: int, seq_len: int, n_params: int,
                  value_positions: int | None = None) -> Computation:
    """One gradient step on ``batch`` sequences: forward, loss (log-softmax over the vocabulary and
    a mean; a critic's, ``value_positions`` given: a squared error of its values), backward,
    gradient-norm clip (a sum over all parameters), AdamW."""
    fwd = forward(config, batch, seq_len, value_positions=value_positions)
    loss = _loss(config, batch * seq_len,
                 None if value_positions is None else batch * value_positions)
    return seq("training step", fwd, loss, backward(seq("model + loss", fwd, loss)),
               seq("clip grad norm", elementwise(n_params, 1, "square"),
                   reduction(1, n_params, "sum"), elementwise(n_params, 1, "scale")),
               optimizer_step(n_params))


def decode(config: Model, batch: int, prompt_len: int, response_len: int,
           response_lengths: Sequence[int] | None = None) -> Computation:
    """Autoregressive generation: a prefill of the prompt, then ``response_len - 1`` decode steps,
    each a one-token forward over the growing context and a sampling softmax; token ``t + 1``
    needs token ``t``, so the steps are sequential. ``batch`` sequences decode side by side:
    more sequences add work, never depth.

    Steps whose contexts share a depth (contexts between two powers of two: only the
    ``ceil(log2 context)`` reductions depend on it) are summarised by one node of kind
    ``"decode steps"`` with their exact total work and depth, so that long responses stay cheap
    to describe (``O(log T)`` nodes).

    ``response_lengths`` (optional, ``batch`` lengths in ``1..response_len``): responses of
    different lengths. Decode step ``t`` then works only for the sequences longer than ``t``
    tokens, so **the work follows the sum of the lengths and the depth the longest one**,
    ``T_max``: the depth of this node equals that of one sequence of ``T_max`` tokens.

    Raises:
        ValueError: for non-positive sizes, or lengths of the wrong count or out of range.
    """
    _positive(batch=batch, prompt_len=prompt_len, response_len=response_len)
    spec = as_spec(config)
    if response_lengths is not None:
        return _decode_lengths(spec, batch, prompt_len, response_len, response_lengths)
    sample = softmax(batch, spec.vocab_size, "sample")
    steps = [seq("prefill", forward(spec, batch, prompt_len), sample)]
    # per extra key, one query in every head of every layer costs q.k (2 d_h), scale and mask (1),
    # softmax (5) and p.v (2 d_h); under MLA over the latents (absorbed)
    slope = batch * spec.n_head * spec.n_layer * (2 * sum(_decode_key_widths(spec)) + 6)
    t = 1
    while t < response_len:
        ctx = prompt_len + t
        bucket_end = 1 << (ctx - 1).bit_length()  # the same log2 depth up to this context
        n = min(response_len - t, bucket_end - ctx + 1)
        first = seq("decode step", forward(spec, batch, 1, ctx, absorbed=True), sample)
        work = n * first.work + slope * n * (n - 1) // 2
        steps.append(Computation(f"decode steps {t}..{t + n - 1}", work, n * first.depth,
                                 "decode steps"))
        t += n
    return seq("generation", *steps)


def _check_lengths(batch: int, response_len: int, lengths) -> list[int]:
    lengths = list(lengths)
    if len(lengths) != batch:
        raise ValueError(f"{len(lengths)} response lengths for a batch of {batch}; give one per "
                         "sequence.")
    if any(not isinstance(t, int) or isinstance(t, bool) or not 1 <= t <= response_len
           for t in lengths):
        raise ValueError(f"response lengths must be integers in 1..response_len={response_len}.")
    return lengths


def _decode_lengths(spec: TransformerSpec, batch: int, prompt_len: int, response_len: int,
                    lengths) -> Computation:
    """:func:`decode` for responses of different lengths: the same buckets of steps, each step's
    work scaled to the sequences still decoding (a step's work is linear in the sequences, its
    depth independent of them)."""
    lengths = sorted(_check_lengths(batch, response_len, lengths))
    longest = lengths[-1]
    sample = softmax(batch, spec.vocab_size, "sample")
    steps = [seq("prefill", forward(spec, batch, prompt_len), sample)]
    one_sample = softmax(1, spec.vocab_size, "sample")
    slope = spec.n_head * spec.n_layer * (2 * sum(_decode_key_widths(spec)) + 6)  # a key more
    # active[t]: sequences longer than t tokens, i.e. still decoding at step t
    active, i = [0] * longest, 0
    for t in range(1, longest):
        while lengths[i] <= t:
            i += 1
        active[t] = batch - i
    t = 1
    while t < longest:
        ctx = prompt_len + t
        bucket_end = 1 << (ctx - 1).bit_length()
        n = min(longest - t, bucket_end - ctx + 1)
        first = seq("decode step", forward(spec, 1, 1, ctx, absorbed=True), one_sample)
        work = sum(active[t + j] * (first.work + slope * j) for j in range(n))
        steps.append(Computation(f"decode steps {t}..{t + n - 1}", work, n * first.depth,
                                 "decode steps"))
        t += n
    return seq("generation", *steps)


def packed_forward(config: Model, prompt_len: int, lengths: Sequence[int],
                   name: str = "forward", critic: bool = False) -> Computation:
    """Teacher-forced forwards over sequences of ``prompt_len + T_i`` tokens, each at its own
    length (sequence packing, no padding): sequences are independent, so the work adds and the
    depth is that of the longest. Equal lengths give the work and depth of one
    :func:`forward` over the whole batch. ``critic``: a value head on each response's positions
    instead of the language-model head."""
    spec = as_spec(config)
    counts = sorted(Counter(lengths).items())
    return par(name, *(forward(spec, count, prompt_len + t, value_positions=t if critic else None)
                       for t, count in counts))


def _packed_training_step(config: Model, prompt_len: int, lengths, n_params: int,
                          critic: bool = False) -> Computation:
    """:func:`training_step` on sequences of different lengths (packed); ``critic``: the value
    head and loss."""
    fwd = packed_forward(config, prompt_len, lengths, critic=critic)
    loss = _loss(config, sum(prompt_len + t for t in lengths), sum(lengths) if critic else None)
    return seq("training step", fwd, loss, backward(seq("model + loss", fwd, loss)),
               seq("clip grad norm", elementwise(n_params, 1, "square"),
                   reduction(1, n_params, "sum"), elementwise(n_params, 1, "scale")),
               optimizer_step(n_params))


def _training(config: Model, prompt_len: int, response_len: int, batch: int, n_params: int,
              epochs: int, minibatches: int, lengths, critic: bool = False) -> Computation:
    """``epochs x minibatches`` sequential gradient steps; with ``lengths``, mini-batch ``k``
    holds the ``k``-th contiguous slice of the sequences, each at its own length; ``critic``
    (PPO): each step the policy's and the critic's side by side."""
    size = batch // minibatches
    if lengths is None:
        seq_len = prompt_len + response_len
        one = training_step(config, size, seq_len, n_params)
        if critic:
            one = par("policy + critic step", one,
                      training_step(config, size, seq_len, n_params, value_positions=response_len))
        return repeat(one, epochs * minibatches, parallel=False, name="training")
    slices = [lengths[k * size:(k + 1) * size] for k in range(minibatches)]
    steps = [_packed_training_step(config, prompt_len, part, n_params) for part in slices]
    if critic:
        steps = [par("policy + critic step", s,
                     _packed_training_step(config, prompt_len, part, n_params, critic=True))
                 for s, part in zip(steps, slices)]
    return seq("training", *(steps * epochs))


# ----------------------------------------------------------------------------- closed forms
def forward_cost(config: ModelConfig, batch: int, seq_len: int,
                 context: int | None = None) -> tuple[int, int]:
    """``(W, D)`` of :func:`forward` in closed form, for the course's model (a GELU MLP, as many
    key/value heads as query heads).

    ``W = rows d + L [14 rows d + 2 rows d (3d + d + 2 r d) + 2 rows d + rows r d
    + B H (4 S C d_h + 6 S C)] + 7 rows d + 2 rows d V``, with ``rows = B S``, ``C`` the context,
    ``r`` the MLP ratio; ``D = 1 + L [2 (2 lg d + 5) + (1 + lg d) + (1 + lg d) + (1 + lg d)
    + (1 + lg (r d)) + 3 + (1 + lg d_h) + 1 + (2 lg C + 3) + (1 + lg C)] + (2 lg d + 5)
    + (1 + lg d)``, ``lg = ceil(log2)``.
    """
    _positive(batch=batch, seq_len=seq_len)
    ctx = seq_len if context is None else context
    d, r, h, dh, v = config.d_model, config.mlp_ratio, config.n_head, config.d_head, config.vocab_size
    rows, lg = batch * seq_len, log2_depth
    attn_work = batch * h * (2 * seq_len * dh * ctx + seq_len * ctx + 5 * seq_len * ctx
                             + 2 * seq_len * ctx * dh)
    layer_work = (2 * 7 * rows * d + 2 * rows * d * (3 * d + d + 2 * r * d) + 2 * rows * d
                  + rows * r * d + attn_work)
    work = rows * d + config.n_layer * layer_work + 7 * rows * d + 2 * rows * d * v
    attn_depth = (1 + lg(dh)) + 1 + (2 * lg(ctx) + 3) + (1 + lg(ctx))
    layer_depth = (2 * (2 * lg(d) + 5) + 3 * (1 + lg(d)) + (1 + lg(r * d)) + 3 + attn_depth)
    depth = 1 + config.n_layer * layer_depth + (2 * lg(d) + 5) + (1 + lg(d))
    return work, depth


def decode_cost(config: ModelConfig, batch: int, prompt_len: int,
                response_len: int) -> tuple[int, int]:
    """``(W, D)`` of :func:`decode` in closed form: the prefill plus ``sum_t`` of one-token
    forwards at context ``P + t``, each followed by a sampling softmax
    (``W = 5 B V``, ``D = 2 ceil(log2 V) + 3``)."""
    _positive(batch=batch, prompt_len=prompt_len, response_len=response_len)
    sample_w, sample_d = 5 * batch * config.vocab_size, 2 * log2_depth(config.vocab_size) + 3
    work, depth = forward_cost(config, batch, prompt_len)
    work, depth = work + sample_w, depth + sample_d
    for t in range(1, response_len):
        w, d = forward_cost(config, batch, 1, prompt_len + t)
        work, depth = work + w + sample_w, depth + d + sample_d
    return work, depth


# ----------------------------------------------------------------------------- advantages
def gae_scan(batch: int, response_len: int) -> Computation:
    """GAE as the reverse loop: the TD errors ``delta_t = r_t + gamma V_{t+1} - V_t`` at once
    (3 operations), then ``A_t = delta_t + gamma lambda A_{t+1}`` one position after the other
    (2 dependent operations per step): ``W = 5 B T``, ``D = 3 + 2 T``."""
    _positive(batch=batch, response_len=response_len)
    deltas = elementwise(batch * response_len, 3, "TD errors")
    step = elementwise(batch, 2, "A_t = delta_t + c A_{t+1}")
    return seq("GAE, sequential scan", deltas, repeat(step, response_len, parallel=False,
                                                      name="reverse loop"))


def gae_prefix_scan(batch: int, response_len: int) -> Computation:
    """GAE as a parallel prefix scan (Blelloch 1990): ``A_t = delta_t + c A_{t+1}`` is a
    first-order linear recurrence, so the affine maps ``x -> c x + delta`` compose associatively
    and a Hillis-Steele scan (Hillis & Steele 1986, CACM 29(12)) evaluates all ``A_t`` in
    ``ceil(log2 T)`` rounds of one combine each (a multiply and an add, depth 2, on every
    position): ``W = 3 B T + 3 B T ceil(log2 T)``, ``D = 3 + 2 ceil(log2 T)``. More work,
    exponentially less depth (Blelloch's work-efficient scan, 1990, would keep ``O(T)`` work at
    twice the depth); :func:`gae_parallel` runs it."""
    _positive(batch=batch, response_len=response_len)
    deltas = elementwise(batch * response_len, 3, "TD errors")
    rounds = log2_depth(response_len)
    if rounds == 0:
        return seq("GAE, prefix scan", deltas)
    combine = elementwise(batch * response_len, 3, "combine: c a + b, c c")
    # each round: A += c^k shifted A (multiply, add) and c^k squared; depth 2 (the square runs
    # beside the multiply)
    combine = Computation(combine.name, combine.work, 2, "elementwise")
    return seq("GAE, prefix scan", deltas, repeat(combine, rounds, parallel=False,
                                                  name=f"{rounds} scan rounds"))


def gae_parallel(rewards: Tensor, values: Tensor, response_mask: Tensor, gamma: float = 1.0,
                 lam: float = 0.95) -> tuple[Tensor, Tensor]:
    """GAE by a Hillis-Steele prefix scan in ``ceil(log2 R)`` vectorised rounds; the same result
    as the reverse loop of :func:`rlm_course.rl.advantages.gae` (same arguments and returns).

    ``A_t = sum_{k >= 0} c^k delta_{t+k}`` (``c = gamma lambda``): after round ``j`` every
    position holds the sum over the next ``2^j`` deltas; round ``j`` adds ``c^(2^j)`` times the
    partial sum ``2^j`` positions ahead.
    """
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"gae_parallel: gamma={gamma} and lam={lam} must be in [0, 1].")
    if rewards.dim() != 2 or rewards.shape != values.shape or values.shape != response_mask.shape:
        raise ValueError("gae_parallel: rewards, values and response_mask must all be (batch, R); "
                         f"got {tuple(rewards.shape)}, {tuple(values.shape)}, "
                         f"{tuple(response_mask.shape)}.")
    mask = response_mask.to(values.dtype)
    values = values * mask
    next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    acc = (rewards + gamma * next_values - values) * mask
    c, shift = gamma * lam, 1
    while shift < acc.shape[1]:
        ahead = torch.cat([acc[:, shift:], torch.zeros_like(acc[:, :shift])], dim=1)
        acc = acc + (c ** shift) * ahead
        shift *= 2
    acc = acc * mask
    return acc, (acc + values) * mask


def weight_sync(n_params: int, receivers: int, messages: int = 1) -> Computation:
    """Stage 4: the trainer's weights to the rollout engine. Moving a value is counted as one
    operation (this node's work is element moves, not FLOPs). Disaggregated
    (``receivers >= 1``): a binomial-tree broadcast to ``receivers`` ranks, ``n_params x
    receivers`` moves; each of the ``messages`` buckets is one step per tree round
    (``ceil(log2(receivers + 1))`` rounds), the buckets one after another: depth
    ``messages x rounds``. Colocated (``receivers = 0``): one in-memory copy, ``n_params`` moves,
    depth 1 (every element at once); ``messages`` is not used (nothing crosses a link, and a
    colocated :class:`~rlm_course.cost.weight_sync.SyncCost` counts 0 messages).

    Raises:
        ValueError: for non-positive ``n_params``, negative ``receivers``, or non-positive
            ``messages`` with ``receivers >= 1``.
    """
    _positive(n_params=n_params)
    if not (isinstance(receivers, int) and receivers >= 0):
        raise ValueError(f"receivers={receivers!r} must be an integer >= 0 (0: colocated).")
    if receivers == 0:
        return Computation("weight sync (in place)", n_params, 1, "sync")
    _positive(messages=messages)
    rounds = log2_depth(receivers + 1)
    return Computation("weight sync (broadcast)", n_params * receivers, messages * rounds, "sync")


def group_advantage(batch: int, group_size: int) -> Computation:
    """GRPO's group statistics: mean, centre, std (square, sum, sqrt), divide; groups are
    independent, so depth is logarithmic in ``G`` and does not grow with the batch.

    Raises:
        ValueError: for sizes that are not positive integers, or a batch that does not split
            into groups of ``group_size``.
    """
    _positive(batch=batch, group_size=group_size)
    if batch % group_size:
        raise ValueError(f"group_advantage: batch={batch} does not split into groups of "
                         f"group_size={group_size}; give a batch of whole groups (prompts x "
                         "group_size).")
    return seq("group advantage", reduction(batch // group_size, group_size, "group mean"),
               elementwise(batch, 2, "centre, square"),
               reduction(batch // group_size, group_size, "group variance"),
               elementwise(batch, 2, "sqrt + eps, divide"))


# ----------------------------------------------------------------------------- iterations
def grpo_iteration(config: Model, prompts: int, group_size: int, prompt_len: int,
                   response_len: int, n_params: int, epochs: int = 1, minibatches: int = 2,
                   reference: bool = True, old_policy: bool | None = None,
                   response_lengths: Sequence[int] | None = None) -> Computation:
    """One GRPO iteration with every response ``response_len`` tokens long: generation of
    ``prompts x group_size`` responses, scoring (the old-policy forward, needed when the batch
    serves more than one gradient step (default: ``epochs x minibatches > 1``), and with a KL
    the reference forward; independent), group advantages, then ``epochs x minibatches``
    sequential gradient steps.

    ``response_lengths`` (optional): one length per response in ``1..response_len`` (the
    budget), the responses of a prompt contiguous. Generation's depth then follows the longest
    (:func:`decode`); scoring and training process each sequence at its own length
    (:func:`packed_forward`), mini-batch ``k`` the ``k``-th contiguous slice.

    Raises:
        ValueError: for non-positive sizes, or minibatches that do not divide the batch.
    """
    _positive(prompts=prompts, group_size=group_size, prompt_len=prompt_len,
              response_len=response_len, n_params=n_params, epochs=epochs,
              minibatches=minibatches)
    batch = prompts * group_size
    if batch % minibatches:
        raise ValueError(f"minibatches={minibatches} does not divide the batch of {batch} "
                         "sequences; choose a divisor of it.")
    seq_len = prompt_len + response_len
    old_policy = epochs * minibatches > 1 if old_policy is None else old_policy
    lengths = (None if response_lengths is None
               else _check_lengths(batch, response_len, response_lengths))
    one = (forward(config, batch, seq_len) if lengths is None
           else packed_forward(config, prompt_len, lengths))
    scoring = [one] * (int(old_policy) + int(reference))
    parts = [decode(config, batch, prompt_len, response_len, lengths)]
    if scoring:
        parts.append(par("scoring", *scoring))
    parts += [group_advantage(batch, group_size),
              _training(config, prompt_len, response_len, batch, n_params, epochs, minibatches,
                        lengths)]
    return seq("GRPO iteration", *parts)


def ppo_iteration(config: Model, prompts: int, prompt_len: int, response_len: int,
                  n_params: int, epochs: int = 1, minibatches: int = 2,
                  prefix_scan: bool = False, reference: bool = True,
                  response_lengths: Sequence[int] | None = None) -> Computation:
    """One PPO iteration: generation, scoring (old policy and critic forwards, and the reference
    one with a KL; independent), GAE (reverse loop or prefix scan), then per gradient step the
    policy and critic updates side by side (independent models).

    ``response_lengths``: as in :func:`grpo_iteration` (GAE still scans ``response_len``
    positions, padded).

    Raises:
        ValueError: for non-positive sizes, or minibatches that do not divide the batch.
    """
    _positive(prompts=prompts, prompt_len=prompt_len, response_len=response_len,
              n_params=n_params, epochs=epochs, minibatches=minibatches)
    if prompts % minibatches:
        raise ValueError(f"minibatches={minibatches} does not divide the batch of {prompts} "
                         "sequences; choose a divisor of it.")
    seq_len = prompt_len + response_len
    passes = 3 if reference else 2
    lengths = (None if response_lengths is None
               else _check_lengths(prompts, response_len, response_lengths))
    one = (forward(config, prompts, seq_len) if lengths is None
           else packed_forward(config, prompt_len, lengths))
    value = (forward(config, prompts, seq_len, value_positions=response_len) if lengths is None
             else packed_forward(config, prompt_len, lengths, critic=True))
    scoring = par("scoring", *([one] * (passes - 1)), value)  # the critic's head is a value's
    advantage = (gae_prefix_scan if prefix_scan else gae_scan)(prompts, response_len)
    return seq("PPO iteration", decode(config, prompts, prompt_len, response_len, lengths),
               scoring, advantage,
               _training(config, prompt_len, response_len, prompts, n_params, epochs,
                         minibatches, lengths, critic=True))
