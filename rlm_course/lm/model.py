"""A tiny decoder-only transformer with a KV cache, in one readable file.

Pre-norm GPT-2 style blocks (LayerNorm -> causal self-attention -> residual, LayerNorm -> MLP ->
residual), learned absolute position embeddings, an untied language-model head. Attention uses
``torch.nn.functional.scaled_dot_product_attention`` (SDPA); on the CPU, full-sequence passes pad
the keys to the kernel's fast lengths (:func:`attention`).

Shapes used throughout: ``batch`` sequences, ``seq`` new tokens in this call, ``ctx`` keys
visible to them (cached + new), ``d_model`` width, ``n_head`` heads of width ``d_head``.

Padding convention: prompts are *left*-padded so that every sequence ends at the same column and
generation appends to the right. ``attention_mask`` marks real tokens (True) against padding
(False); positions are counted over real tokens only, so a left-padded prompt gets the same
positions, and therefore the same logits, as the unpadded one.

Sources: Radford et al. 2019 (GPT-2, pre-norm blocks); Vaswani et al. 2017 (attention);
Karpathy's nanoGPT for the layout.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from rlm_course.lm.attention import attention
from rlm_course.utils import plain_ints


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of :class:`TinyGPT`.

    Raises:
        ValueError: if a size is not a positive integer, or ``n_head`` does not divide
            ``d_model``.
    """

    vocab_size: int
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    max_seq_len: int = 64
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        plain_ints(self)  # numpy's integers: the checkpoint's config stays plain
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "max_seq_len", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name}={value!r}: must be a positive integer.")
        if self.d_model % self.n_head:
            raise ValueError(
                f"ModelConfig: n_head={self.n_head} does not divide d_model={self.d_model}; "
                f"pick n_head among the divisors of d_model (e.g. {_divisors(self.d_model)})."
            )

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head

    def to_dict(self) -> dict:
        return asdict(self)


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0 and k <= 16]


class KVCache:
    """Keys and values of every layer for the positions already processed.

    Attributes:
        k, v: ``(n_layer, batch, n_head, max_len, d_head)`` preallocated buffers.
        length: number of positions filled so far (the next token is written at ``length``).

    Memory: ``2 * n_layer * batch * max_len * d_model * bytes_per_element`` bytes.
    """

    def __init__(self, config: ModelConfig, batch_size: int, max_len: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        if max_len > config.max_seq_len:
            raise ValueError(
                f"KVCache max_len={max_len} exceeds the model's max_seq_len={config.max_seq_len}; "
                "shorten the prompt or max_new_tokens, or build a model with a larger max_seq_len."
            )
        shape = (config.n_layer, batch_size, config.n_head, max_len, config.d_head)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


def attend_with_kv_cache(q: Tensor, k_new: Tensor, v_new: Tensor, k_cache: Tensor,
                         v_cache: Tensor, start: int, attn_mask: Tensor) -> Tensor:
    """Append this call's keys/values to the cache, then attend over everything cached.

    This is one decoding step when ``seq == 1`` (and the prefill when ``seq > 1``).

    Args:
        q, k_new, v_new: ``(batch, n_head, seq, d_head)`` for the ``seq`` newest tokens.
        k_cache, v_cache: ``(batch, n_head, max_len, d_head)``; positions ``[0, start)`` hold the
            keys/values of earlier tokens. Positions ``[start, start + seq)`` are written in place.
        start: index of the first new token in the cache.
        attn_mask: ``(batch, 1, seq, start + seq)`` bool, True where a query may see a key.

    Returns:
        ``(batch, n_head, seq, d_head)``: softmax(q k^T / sqrt(d_head) + mask) v over the
        ``start + seq`` visible keys (Vaswani et al. 2017, eq. 1).
    """
    # BEGIN SOLUTION: store the new keys/values in the caches at positions start.., then attend over every position filled so far (the mask tells SDPA what each query may see)
    end = start + q.shape[2]
    k_cache[:, :, start:end] = k_new
    v_cache[:, :, start:end] = v_new
    keys, values = k_cache[:, :, :end], v_cache[:, :, :end]
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=attn_mask)
    # END SOLUTION


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.d_head = config.n_head, config.d_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: Tensor, attn_mask: Tensor | None,
                cache: tuple[Tensor, Tensor, int] | None = None) -> Tensor:
        """x: ``(batch, seq, d_model)`` -> ``(batch, seq, d_model)``.

        ``attn_mask`` is None for a plain causal pass without padding (fast path).
        ``cache`` is ``(k_cache, v_cache, start)`` of this layer when decoding incrementally.
        """
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        # (batch, seq, d_model) -> (batch, n_head, seq, d_head)
        q, k, v = (z.view(b, t, self.n_head, self.d_head).transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            k_cache, v_cache, start = cache
            y = attend_with_kv_cache(q, k, v, k_cache, v_cache, start, attn_mask)
        else:
            y = attention(q, k, v, attn_mask)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.d_model, config.mlp_ratio * config.d_model)
        self.out = nn.Linear(config.mlp_ratio * config.d_model, config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: Tensor, attn_mask: Tensor | None, cache=None) -> Tensor:
        x = x + self.attn(self.ln1(x), attn_mask, cache)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Decoder-only transformer: ``tokens (batch, seq) -> logits (batch, seq, vocab)``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.max_seq_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: scale residual projections by depth
            if name.endswith(("attn.proj.weight", "mlp.out.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, tokens: Tensor, attention_mask: Tensor | None = None,
                cache: KVCache | None = None, *, positions: Tensor | None = None,
                attn_mask: Tensor | None = None) -> Tensor:
        """Logits ``(batch, seq, vocab_size)`` for each position; see :meth:`hidden_states`."""
        return self.head(self.hidden_states(tokens, attention_mask, cache, positions=positions,
                                            attn_mask=attn_mask))

    def hidden_states(self, tokens: Tensor, attention_mask: Tensor | None = None,
                      cache: KVCache | None = None, *, positions: Tensor | None = None,
                      attn_mask: Tensor | None = None) -> Tensor:
        """Final (normalised) hidden state of each position, before the language-model head.

        Args:
            tokens: ``(batch, seq)`` int64 token ids of the new tokens.
            attention_mask: ``(batch, ctx)`` bool, True for real tokens, where ``ctx`` counts the
                cached positions plus these ``seq``; None means no padding anywhere.
            cache: a :class:`KVCache`; when given, the new keys/values are appended at
                ``cache.length`` and ``cache.length`` advances by ``seq``.
            positions, attn_mask: ``(batch, seq)`` positions and the SDPA mask, when the caller
                already has them (a decoding loop keeps them up to date instead of recomputing
                them from the whole ``attention_mask`` at every step); by default both are
                derived from ``attention_mask``.

        Returns:
            ``(batch, seq, d_model)`` float hidden states.

        Raises:
            ValueError: if the sequence would exceed ``max_seq_len`` or the mask has the wrong shape.
        """
        b, t = tokens.shape
        start = cache.length if cache is not None else 0
        ctx = start + t
        if ctx > self.config.max_seq_len or (cache is not None and ctx > cache.max_len):
            limit = self.config.max_seq_len if cache is None else min(cache.max_len, self.config.max_seq_len)
            raise ValueError(f"sequence of {ctx} tokens exceeds the limit of {limit}; "
                             "shorten the input or build a larger model/cache.")
        if attention_mask is not None and tuple(attention_mask.shape) != (b, ctx):
            raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, expected "
                             f"(batch, cached + new) = {(b, ctx)}.")
        device = tokens.device
        if positions is None:
            if attention_mask is None:
                positions = torch.arange(start, ctx, device=device).expand(b, t)
            else:
                positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, start:ctx]
        mask = attn_mask
        if mask is None and (attention_mask is not None or cache is not None):
            mask = build_attention_mask(attention_mask, start, t, b, device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for i, block in enumerate(self.blocks):
            layer_cache = (cache.k[i], cache.v[i], start) if cache is not None else None
            x = block(x, mask, layer_cache)
        if cache is not None:
            cache.length = ctx
        return self.ln_f(x)

    # ---------------------------------------------------------------- counting
    def num_parameters(self, non_embedding: bool = False) -> int:
        """Number of parameters; ``non_embedding`` drops token and position embeddings."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel() + self.pos_emb.weight.numel()
        return n


def build_attention_mask(attention_mask: Tensor | None, start: int, seq: int, batch: int,
                         device: torch.device) -> Tensor:
    """Boolean SDPA mask ``(batch, 1, seq, start + seq)``: causal AND key-is-real.

    Query ``i`` (absolute position ``start + i``) sees key ``j`` when ``j <= start + i`` and key
    ``j`` is a real token. Every query also sees itself, so rows of padding queries are never
    empty (an all-False row would make SDPA return NaN); their outputs are ignored anyway.
    """
    ctx = start + seq
    q_pos = torch.arange(start, ctx, device=device)[:, None]
    k_pos = torch.arange(ctx, device=device)[None, :]
    causal = k_pos <= q_pos  # (seq, ctx)
    mask = causal.expand(batch, seq, ctx)
    if attention_mask is not None:
        mask = mask & attention_mask[:, None, :]
        mask = mask | (k_pos == q_pos)
    return mask[:, None]


def matmul_parameters(config: ModelConfig) -> int:
    """Parameters that take part in a matmul per token: ``12 d^2`` per layer plus ``d V`` head.

    Per layer: qkv ``3 d^2``, output projection ``d^2``, MLP ``2 * mlp_ratio * d^2`` (= ``8 d^2``).
    Biases, LayerNorms and embeddings are excluded: they are not matmuls (Kaplan et al. 2020,
    Table 1 convention).
    """
    d, r = config.d_model, config.mlp_ratio
    per_layer = 3 * d * d + d * d + 2 * r * d * d
    return config.n_layer * per_layer + d * config.vocab_size


def forward_flops(config: ModelConfig, seq_len: int, context_len: int | None = None,
                  batch: int = 1) -> int:
    """Analytic forward FLOPs of ``batch`` sequences of ``seq_len`` new tokens.

    ``FLOPs = batch * (2 * matmul_params * seq_len + 4 * n_layer * d_model * seq_len * ctx)``

    where ``ctx`` is the number of keys each query is scored against (``context_len``; defaults to
    ``seq_len``, a full-sequence pass). A matmul of ``(m, k) @ (k, n)`` costs ``2 m k n`` FLOPs
    (one multiply and one add). The attention term counts ``q k^T`` and ``softmax @ v`` over the
    full ``seq x ctx`` score matrix, as SDPA kernels compute it (no saving for the causal mask;
    the convention of ``torch.utils.flop_counter`` and Megatron's MFU accounting, Narayanan et al.
    2021, eq. 3). Softmax, norms, GELU and additions are ignored (well under 1% here).

    One KV-cache decoding step at context ``t`` is ``forward_flops(cfg, 1, t)``.

    Raises:
        ValueError: if a length or the batch is negative.
    """
    ctx = seq_len if context_len is None else context_len
    if seq_len < 0 or ctx < 0 or batch < 0:
        raise ValueError(f"forward_flops: seq_len={seq_len}, context_len={ctx}, batch={batch} "
                         "must be non-negative.")
    attention = 4 * config.n_layer * config.d_model * seq_len * ctx
    return batch * (2 * matmul_parameters(config) * seq_len + attention)
