"""Transformer architectures as numbers: parameters (total and active), KV-cache bytes and FLOPs
per token, for the tiny course model up to 70B dense and mixture-of-experts models.

A :class:`TransformerSpec` describes a decoder-only transformer with grouped-query attention
(``n_kv_head`` key/value heads shared by ``n_head`` query heads; MQA is ``n_kv_head = 1``, MHA
``n_kv_head = n_head``; Ainslie et al. 2023, arXiv:2305.13245), a GELU MLP (2 matrices) or a gated
SwiGLU MLP (3 matrices; Shazeer 2020, arXiv:2002.05202), and optionally a mixture of experts
(``n_experts`` MLPs per layer, ``experts_per_token`` of them active per token, plus
``n_shared_experts`` always active; a linear router; Fedus et al. 2021, arXiv:2101.03961), whose
first ``n_dense_layers`` layers may keep a dense MLP (DeepSeek-V3's first three). Multi-head
latent attention (MLA; DeepSeek-V2, arXiv:2405.04434, section 2.1) replaces the key/value
projections by a down-projection to a ``kv_lora_rank`` latent (plus a ``qk_rope_head_dim`` key
shared by every head, the decoupled RoPE) and up-projections to ``n_head`` keys of
``d_head + qk_rope_head_dim`` and values of ``v_head_dim``; the cache holds the latent only.

Conventions: a forward pass costs 2 FLOPs per parameter that takes part in a matmul for each
token (Kaplan et al. 2020, arXiv:2001.08361, section 2.1), plus attention
``4 x n_layer x n_head x d_head x context`` per token (``q k^T`` and ``softmax v`` over the full
score matrix: the forward third of PaLM's ``12 L H Q T``, Chowdhery et al. 2022, arXiv:2204.02311,
appendix B; causal kernels such as FlashAttention skip the masked half; under MLA
``2 x n_layer x n_head x (qk + v dims)``); embeddings are look-ups (no FLOPs) but the output head
is a matmul, tied or not. A decode step of MLA runs "absorbed" (DeepSeek-V2, appendix C; vLLM's
and SGLang's MLA decode kernels): the up-projections fold into the query and the output, and each
head scores and sums the cached latents themselves, ``2 x n_layer x n_head x (2 kv_lora_rank +
qk_rope_head_dim)`` FLOPs per key (:attr:`TransformerSpec.decode_flops_per_key`), 3.4x the
training kernel's for DeepSeek-V3.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from functools import cached_property

from rlm_course.lm.model import ModelConfig
from rlm_course.utils import check_amount, plain_ints, unknown_name


def kv_cache_bytes(n_layer: int, n_kv_head: int, d_head: int, tokens: int,
                   bytes_per_element: int = 2) -> int:
    """Bytes of the KV cache of ``tokens`` tokens: a key and a value vector of ``d_head`` elements
    for every layer and every key/value head (Pope et al. 2022, arXiv:2211.05102, section 3.1).

    E.g. Llama-3-8B (32 layers, 8 KV heads of 128, bf16): 128 KiB per token.

    Raises:
        ValueError: for a size that is not a finite number >= 0 (a count of layers, heads or
            elements that is not a whole number).
    """
    for name, value in (("n_layer", n_layer), ("n_kv_head", n_kv_head), ("d_head", d_head),
                        ("tokens", tokens), ("bytes_per_element", bytes_per_element)):
        check_amount(f"kv_cache_bytes: {name}", value)
        if name != "tokens" and value != int(value):
            raise ValueError(f"kv_cache_bytes: {name}={value!r} must be a whole number.")
    # BEGIN SOLUTION: two tensors (K and V) per layer, each n_kv_head x d_head elements per token
    return 2 * n_layer * n_kv_head * d_head * tokens * bytes_per_element
    # END SOLUTION


@dataclass(frozen=True)
class TransformerSpec:
    """A decoder-only transformer.

    Attributes:
        n_layer, d_model, n_head: depth, width, query heads; ``d_head`` defaults to
            ``d_model / n_head``.
        n_kv_head: key/value heads (GQA); default ``n_head``.
        d_ff: hidden width of the (dense, or each expert's) MLP.
        glu: gated MLP (SwiGLU: 3 matrices) instead of 2.
        vocab_size, tied_embeddings: the output head shares the input embedding when tied.
        qkv_bias, mlp_bias: linear biases (Qwen has qkv biases; GPT-2-style models have all).
        norm_params_per_layer: parameters of the norms of one layer (RMSNorm: ``2 d``;
            LayerNorm: ``4 d``); the final norm adds ``norm_params_per_layer // 2``.
        n_experts, experts_per_token, n_shared_experts: MoE layout (1, 1, 0 for a dense model).
        router_bias: the router adds a learned bias per expert to its scores (DeepSeek-V3's
            ``e_score_correction_bias``, its auxiliary-loss-free load balancing,
            arXiv:2412.19437 section 2.1.2): ``n_experts`` parameters a layer with experts.
        n_dense_layers, dense_d_ff: an MoE model's first ``n_dense_layers`` layers have one dense
            MLP of width ``dense_d_ff`` instead of experts (DeepSeek-V3's
            ``first_k_dense_replace: 3``, ``intermediate_size: 18432``).
        kv_lora_rank, q_lora_rank, qk_rope_head_dim, v_head_dim: multi-head latent attention
            (DeepSeek-V2/V3, arXiv:2405.04434 section 2.1; the names of their config.json), used
            when ``kv_lora_rank`` is given: keys and values come from a ``kv_lora_rank`` latent
            (and a ``qk_rope_head_dim`` RoPE key shared by every head) that is all the KV cache
            holds; queries from a ``q_lora_rank`` latent (``None``: straight from the input); a
            head's key is ``d_head + qk_rope_head_dim`` wide (``d_head`` is
            ``qk_nope_head_dim``), its value ``v_head_dim`` (default ``d_head``). Tensor
            parallelism cannot split the latent, so every TP rank holds and reads it whole
            (:attr:`kv_latent`, :meth:`kv_shards`); training's attention kernel runs on the
            up-projected heads (``n_kv_head`` must be ``n_head`` or left out).
        max_context: the released model's context window, tokens (``max_position_embeddings``
            of its config.json): the longest prompt plus response it runs; ``None``: no limit
            (:meth:`check_context`).
        source: where the configuration comes from.

    Raises:
        ValueError: for non-positive sizes, heads that do not divide the width, KV heads that do
            not divide the query heads, or more active experts than experts.
    """

    name: str
    n_layer: int
    d_model: int
    n_head: int
    d_ff: int
    vocab_size: int
    n_kv_head: int | None = None
    d_head: int | None = None
    glu: bool = True
    tied_embeddings: bool = False
    qkv_bias: bool = False
    mlp_bias: bool = False
    out_bias: bool = False
    norm_params_per_layer: int | None = None
    learned_positions: int = 0
    n_experts: int = 1
    experts_per_token: int = 1
    n_shared_experts: int = 0
    router_bias: bool = False
    n_dense_layers: int = 0
    dense_d_ff: int | None = None
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_rope_head_dim: int = 0
    v_head_dim: int | None = None
    max_context: int | None = None
    source: str = ""

    def __post_init__(self) -> None:
        plain_ints(self)  # numpy's integers too
        for name in ("n_layer", "d_model", "n_head", "d_ff", "vocab_size", "n_experts",
                     "experts_per_token"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{self.name}: {name}={value!r} must be a positive integer.")
        for name in ("n_shared_experts", "learned_positions", "n_dense_layers",
                     "qk_rope_head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{self.name}: {name}={value!r} must be an integer >= 0.")
        for name in ("n_kv_head", "d_head", "max_context", "dense_d_ff", "kv_lora_rank",
                     "q_lora_rank", "v_head_dim"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value <= 0):
                raise ValueError(f"{self.name}: {name}={value!r} must be a positive integer.")
        if self.norm_params_per_layer is not None and (
                not isinstance(self.norm_params_per_layer, int)
                or isinstance(self.norm_params_per_layer, bool) or self.norm_params_per_layer < 0):
            raise ValueError(f"{self.name}: norm_params_per_layer={self.norm_params_per_layer} "
                             "must be an integer >= 0.")
        if self.d_head is None and self.d_model % self.n_head:
            raise ValueError(f"{self.name}: n_head={self.n_head} does not divide "
                             f"d_model={self.d_model}; choose a divisor or give d_head.")
        if self.kv_heads <= 0 or self.n_head % self.kv_heads:
            raise ValueError(f"{self.name}: n_kv_head={self.n_kv_head} must divide "
                             f"n_head={self.n_head} (each KV head serves a group of query heads).")
        if self.experts_per_token > self.n_experts:
            raise ValueError(f"{self.name}: experts_per_token={self.experts_per_token} exceeds "
                             f"n_experts={self.n_experts}.")
        for flag in ("glu", "tied_embeddings", "qkv_bias", "mlp_bias", "out_bias"):
            if not isinstance(getattr(self, flag), bool):  # the string "False" is truthy
                raise ValueError(f"{self.name}: {flag}={getattr(self, flag)!r} must be True or "
                                 "False.")
        if not isinstance(self.router_bias, bool) or (self.router_bias and not self.is_moe):
            raise ValueError(f"{self.name}: router_bias={self.router_bias!r} must be True or False, "
                             "and True only for an MoE model (a router to bias).")
        if self.n_dense_layers and not self.is_moe:
            raise ValueError(f"{self.name}: n_dense_layers={self.n_dense_layers} describes an MoE "
                             "model's first layers without experts; a dense model has only "
                             "those: leave it out.")
        if self.n_dense_layers >= self.n_layer:
            raise ValueError(f"{self.name}: n_dense_layers={self.n_dense_layers} must be fewer "
                             f"than its {self.n_layer} layers (the rest have experts).")
        if (self.dense_d_ff is None) != (self.n_dense_layers == 0):
            raise ValueError(f"{self.name}: n_dense_layers={self.n_dense_layers} and "
                             f"dense_d_ff={self.dense_d_ff!r} go together: give both (DeepSeek-V3: "
                             "3 and 18432) or neither.")
        if self.kv_lora_rank is None and (self.q_lora_rank is not None or self.qk_rope_head_dim
                                          or self.v_head_dim is not None):
            raise ValueError(f"{self.name}: q_lora_rank, qk_rope_head_dim and v_head_dim describe "
                             "multi-head latent attention; give kv_lora_rank too (DeepSeek-V3: "
                             "512), or leave them out.")
        if self.kv_latent and self.d_head is None:
            raise ValueError(f"{self.name}: under multi-head latent attention d_head is a head's "
                             "qk_nope_head_dim (DeepSeek-V3: 128), not d_model / n_head; give it.")
        if self.kv_latent and self.kv_heads != self.n_head:
            raise ValueError(f"{self.name}: n_kv_head={self.n_kv_head}: under multi-head latent "
                             f"attention every one of the {self.n_head} heads has its own key "
                             "and value (up-projected from the latent); leave n_kv_head out.")

    def check_degree(self, axis: str, degree) -> None:
        """Check a parallel degree against this model: a positive integer (not a bool) for every
        ``axis``; ``tp`` must divide the query heads and divide, or be a multiple of, the
        key/value heads (of a model without a latent KV cache), ``pp`` be at most the layers, ``sp``
        (Ulysses) divide the key/value heads (an MLA model's: every head), ``ep`` divide the
        experts of an MoE model (1 for a dense one); ``dp`` and ``cp`` any positive count.

        Raises:
            ValueError: naming the axis, the value and what would fit.
        """
        if axis not in ("tp", "pp", "dp", "cp", "sp", "ep"):
            raise ValueError(f"axis={axis!r}: choose one of tp, pp, dp, cp, sp, ep.")
        if isinstance(degree, bool) or not isinstance(degree, numbers.Integral) or degree < 1:
            raise ValueError(f"{axis}={degree!r} must be a positive integer (1: no {axis}).")
        if axis == "tp" and self.n_head % degree:
            raise ValueError(f"tp={degree} does not divide {self.name}'s {self.n_head} attention "
                             f"heads; choose a divisor (e.g. {_largest_divisor(self.n_head, degree)}).")
        if (axis == "tp" and not self.kv_latent and self.kv_heads % degree
                and degree % self.kv_heads):
            # each rank holds whole KV heads: its share of them, or a copy of one (vLLM asserts
            # this; Megatron's divide() fails on it); 5 ranks cannot split 8 heads
            raise ValueError(f"tp={degree} splits {self.name}'s {self.kv_heads} key/value heads "
                             "unevenly (each rank holds whole KV heads, or copies of one); choose "
                             f"a divisor or a multiple of {self.kv_heads} that divides the "
                             f"{self.n_head} attention heads.")
        if axis == "sp" and self.kv_heads % degree:
            raise ValueError(f"sp={degree} does not divide {self.name}'s {self.kv_heads} key/value "
                             "heads; choose a divisor, or ring attention (cp).")
        if axis == "pp" and degree > self.n_layer:
            raise ValueError(f"pp={degree} exceeds {self.name}'s {self.n_layer} layers.")
        if axis == "ep" and degree > 1 and (not self.is_moe or self.n_experts % degree):
            raise ValueError(f"ep={degree}: {self.name} has {self.n_experts} expert(s); expert "
                             "parallelism needs an MoE model and a degree dividing its experts.")

    def allows(self, axis: str, degree: int) -> bool:
        """Whether :meth:`check_degree` accepts ``degree`` on ``axis`` (for a search that skips
        the degrees a model refuses)."""
        try:
            self.check_degree(axis, degree)
        except ValueError:
            return False
        return True

    def check_context(self, prompt_len: int, response_len: int, name=None) -> None:
        """Check that a ``prompt_len``-token prompt and a ``response_len``-token response budget
        fit the model's context window (:attr:`max_context`; tokens): a released model does not
        run past it (positions beyond the trained ones). ``name(key)`` is how the caller's user
        knows ``"prompt_len"`` and ``"max_response"`` (the CLI: ``--max-response``).

        Raises:
            ValueError: naming the tokens, the window and the fix; for a length that is not a
                whole number of tokens >= 0.
        """
        for label, value in (("prompt_len", prompt_len), ("response_len", response_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{self.name}: {label}={value!r} must be a whole number of "
                                 "tokens >= 0.")
        if self.max_context is None or prompt_len + response_len <= self.max_context:
            return
        name = name or {"prompt_len": "the prompts", "max_response": "the response budget"}.get
        room, tokens = self.max_context - prompt_len, prompt_len + response_len
        fix = (f"lower {name('max_response')} to at most {room:,} tokens" if room > 0
               else f"shorten {name('prompt_len')} to leave room for the responses within "
                    f"{self.max_context:,} tokens")
        longer = [s for s in SPECS.values() if s.max_context and s.max_context >= tokens
                  and abs(math.log(s.params() / self.params())) <= math.log(4)]
        if longer:  # the one nearest in size, within 4x of this model's parameters
            near = min(longer, key=lambda s: abs(math.log(s.params() / self.params())))
            fix += (f", or choose a model of similar size with a longer window (e.g. "
                    f"{near.name}, {near.max_context:,} tokens)")
        raise ValueError(
            f"{self.name} reads at most {self.max_context:,} tokens (its context window), but a "
            f"prompt of {prompt_len:,} plus a response budget of {response_len:,} is "
            f"{tokens:,}: {fix}.")

    # ---------------------------------------------------------------- shape helpers
    @property
    def head_dim(self) -> int:
        return self.d_head if self.d_head is not None else self.d_model // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 1

    @property
    def kv_latent(self) -> bool:
        """Multi-head latent attention: the KV cache is one compressed latent per token and layer
        shared by every head, held whole by every TP rank (:meth:`kv_shards`)."""
        return self.kv_lora_rank is not None

    @property
    def qk_head_dim(self) -> int:
        """A head's query and key width: ``d_head``, plus MLA's decoupled RoPE part."""
        return self.head_dim + self.qk_rope_head_dim

    @property
    def v_dim(self) -> int:
        """A head's value width: ``v_head_dim`` under MLA if given, else ``d_head``."""
        return self.v_head_dim if self.v_head_dim is not None else self.head_dim

    @property
    def moe_layers(self) -> int:
        """Layers with experts: all but the first ``n_dense_layers`` of an MoE model; 0 for a
        dense model."""
        return self.n_layer - self.n_dense_layers if self.is_moe else 0

    def kv_values_per_token(self) -> int:
        """Values one token adds to the attention kernel's keys and values in one layer, what
        ring attention passes around (training runs MLA on its up-projected heads):
        ``kv_heads x (qk_head_dim + v_dim)``; ``2 x kv_heads x d_head`` without MLA."""
        return self.kv_heads * (self.qk_head_dim + self.v_dim)

    # ---------------------------------------------------------------- parameters
    def attention_params(self, weights_only: bool = False) -> int:
        """Per layer: q and output projections (``d x H d_h``), k and v (``d x H_kv d_h``), and
        their biases unless ``weights_only``. Under MLA: the query's down- and up-projections
        (``d x r_q + r_q x H (d_h + d_rope)``), the latent's down-projection with the RoPE key
        (``d x (r_kv + d_rope)``), its up-projection to keys and values (``r_kv x H (d_h +
        d_v)``), the output (``H d_v x d``), and the two latents' norms unless ``weights_only``
        (DeepSeek-V3: 187.1M a layer)."""
        d = self.d_model
        if self.kv_latent:
            h, qk, rope, r = self.n_head, self.qk_head_dim, self.qk_rope_head_dim, self.kv_lora_rank
            rq = self.q_lora_rank
            query = d * h * qk if rq is None else d * rq + rq * h * qk
            params = query + d * (r + rope) + r * h * (self.head_dim + self.v_dim) + h * self.v_dim * d
            return params if weights_only else params + r + (rq or 0)
        q, kv = self.n_head * self.head_dim, self.kv_heads * self.head_dim
        params = d * q + 2 * d * kv + q * d
        if weights_only:
            return params
        if self.qkv_bias:
            params += q + 2 * kv
        if self.out_bias:
            params += d
        return params

    def mlp_params(self, weights_only: bool = False) -> int:
        """One MLP (a dense layer's, or one expert's), with biases unless ``weights_only``."""
        matrices = 3 if self.glu else 2
        params = matrices * self.d_model * self.d_ff
        if self.mlp_bias and not weights_only:
            params += (matrices - 1) * self.d_ff + self.d_model
        return params

    def dense_mlp_params(self, weights_only: bool = False) -> int:
        """The MLP of one of an MoE model's first ``n_dense_layers`` layers (width
        ``dense_d_ff``); 0 without them."""
        if not self.n_dense_layers:
            return 0
        matrices = 3 if self.glu else 2
        params = matrices * self.d_model * self.dense_d_ff
        if self.mlp_bias and not weights_only:
            params += (matrices - 1) * self.dense_d_ff + self.d_model
        return params

    def expert_params(self) -> int:
        """The routed experts' parameters, all layers (the part expert parallelism shards); 0 for
        a dense model."""
        return self.moe_layers * self.n_experts * self.mlp_params() if self.is_moe else 0

    def _norms(self) -> int:
        return 2 * self.d_model if self.norm_params_per_layer is None else self.norm_params_per_layer

    def layer_params(self, active: bool = False) -> int:
        """One layer: attention, MLP(s) (all experts, or only the active ones), router, norms;
        of an MoE model, a layer with experts (the largest)."""
        experts = (self.experts_per_token if active else self.n_experts) + self.n_shared_experts
        return self.attention_params() + experts * self.mlp_params() + self._router() + self._norms()

    def _router(self, weights_only: bool = False) -> int:
        """A layer's router: ``d_model x n_experts``, and its bias unless ``weights_only``."""
        if not self.is_moe:
            return 0
        return self.n_experts * (self.d_model + (self.router_bias and not weights_only))

    def _dense_layers_params(self, active: bool, weights_only: bool = False) -> int:
        """What the first ``n_dense_layers`` layers hold less than layers with experts would."""
        if not self.n_dense_layers:
            return 0
        experts = (self.experts_per_token if active else self.n_experts) + self.n_shared_experts
        moe = experts * self.mlp_params(weights_only) + self._router(weights_only)
        return self.n_dense_layers * (self.dense_mlp_params(weights_only) - moe)

    def embedding_params(self) -> int:
        """Input embedding (plus learned positions) and, when untied, the output head."""
        head = 0 if self.tied_embeddings else self.vocab_size * self.d_model
        return self.vocab_size * self.d_model + self.learned_positions * self.d_model + head

    def params(self, active: bool = False) -> int:
        """Total parameters, or those that process one token (``active``: MoE's routed experts
        count only ``experts_per_token`` times)."""
        final_norm = self._norms() // 2
        return (self.n_layer * self.layer_params(active) + self._dense_layers_params(active)
                + self.embedding_params() + final_norm)

    def matmul_params(self, active: bool = True) -> int:
        """Weights that take part in a matmul for one token (embedding look-ups, norms and biases
        excluded; the output head included, tied or not): the ``N`` of the ``2N`` rule."""
        experts = (self.experts_per_token if active else self.n_experts) + self.n_shared_experts
        per_layer = (self.attention_params(weights_only=True)
                     + experts * self.mlp_params(weights_only=True) + self._router(True))
        return (self.n_layer * per_layer + self._dense_layers_params(active, weights_only=True)
                + self.vocab_size * self.d_model)

    # ---------------------------------------------------------------- per token
    def kv_cache_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """Keys and values of one token in every layer:
        ``2 x n_layer x n_kv_head x d_head x bytes`` (:func:`kv_cache_bytes`); under MLA the
        latent and the RoPE key, ``n_layer x (kv_lora_rank + qk_rope_head_dim) x bytes``
        (DeepSeek-V3: 61 x 576 x 2 = 70,272 bytes)."""
        if self.kv_latent:
            return kv_cache_bytes(self.n_layer, 1, self.kv_lora_rank + self.qk_rope_head_dim, 1,
                                  bytes_per_element) // 2  # one latent, not a key and a value
        return kv_cache_bytes(self.n_layer, self.kv_heads, self.head_dim, 1, bytes_per_element)

    def kv_shards(self, tp: int) -> int:
        """Over how many of a ``tp``-way replica's devices the KV cache is split: ``min(tp,
        kv_heads)`` (Megatron and vLLM give each rank its query heads' KV heads; past the KV
        heads, ranks hold copies of the same head), 1 for a latent cache (:attr:`kv_latent`:
        every rank holds the whole latent, the reason SGLang runs DeepSeek's attention
        data-parallel). The KV bytes one device holds and reads per token are
        ``kv_cache_bytes_per_token() / kv_shards(tp)``.

        Raises:
            ValueError: for a ``tp`` that is not a positive integer.
        """
        if isinstance(tp, bool) or not (isinstance(tp, numbers.Integral) and tp >= 1):
            raise ValueError(f"tp={tp!r} must be a positive integer.")
        return 1 if self.kv_latent else min(int(tp), self.kv_heads)

    @cached_property
    def flop_terms(self) -> tuple[int, int]:
        """``(2 x matmul params (active), 2 x n_layer x n_head x (qk_head_dim + v_dim))``: a
        token's forward FLOPs are ``first + second x keys`` (:meth:`forward_flops_per_token`;
        the second is ``4 x n_layer x n_head x d_head`` without MLA); computed once per spec, as
        cost models call it for every sequence length."""
        return (2 * self.matmul_params(),
                2 * self.n_layer * self.n_head * (self.qk_head_dim + self.v_dim))

    @cached_property
    def decode_flops_per_key(self) -> int:
        """Attention FLOPs of a decode step per sequence and cached key: the forward's (the second
        of :attr:`flop_terms`), or under MLA the absorbed kernel's, each head scoring and summing
        the cached latents themselves, ``2 x n_layer x n_head x (2 kv_lora_rank +
        qk_rope_head_dim)`` (DeepSeek-V2, arXiv:2405.04434, appendix C; FlashMLA): 278,528 a
        layer for DeepSeek-V3, 3.4x its training kernel's 81,920."""
        if self.kv_latent:
            return (2 * self.n_layer * self.n_head
                    * (2 * self.kv_lora_rank + self.qk_rope_head_dim))
        return self.flop_terms[1]

    def forward_flops_per_token(self, context: int) -> int:
        """Forward FLOPs of one token attending over ``context`` positions:
        ``2 x matmul params (active) + 4 x n_layer x n_head x d_head x context`` (under MLA
        ``2 x n_layer x n_head x (qk_head_dim + v_dim)`` per key: the up-projected heads a
        teacher-forced pass runs; a decode step's absorbed kernel: :attr:`decode_flops_per_key`).

        Raises:
            ValueError: for a context that is not a finite number >= 0."""
        check_amount("forward_flops_per_token: context", context)
        per_token, per_key = self.flop_terms
        return per_token + per_key * context


def teacher_forced_flops(spec: TransformerSpec, seq_len: int, sequences: int,
                         value_positions: int | None = None, key_len: int | None = None) -> float:
    """Forward FLOPs of ``sequences`` full passes over ``seq_len`` tokens. A critic
    (``value_positions`` given) has no language-model head (``2 d V`` per token) but a scalar value
    head (``2 d``) on its ``value_positions`` response positions. ``key_len``: the keys each query
    is scored against (default ``seq_len``; more when the attention kernel runs over padded keys,
    :func:`rlm_course.lm.attention.attention_key_length`).

    Raises:
        ValueError: for a length, count or key length that is not a finite number >= 0.
    """
    for name, value in (("seq_len", seq_len), ("sequences", sequences),
                        ("key_len", 0 if key_len is None else key_len),
                        ("value_positions", 0 if value_positions is None else value_positions)):
        check_amount(name, value)
    keys = seq_len if key_len is None else key_len
    per_token, per_key = spec.flop_terms
    flops = per_token * seq_len + per_key * seq_len * keys
    if value_positions is not None:
        flops += 2 * spec.d_model * value_positions - 2 * spec.d_model * spec.vocab_size * seq_len
    return sequences * flops


def from_model_config(config: ModelConfig, name: str = "tiny") -> TransformerSpec:
    """The course's :class:`~rlm_course.lm.model.TinyGPT` as a spec (GELU MLP with biases, LayerNorm,
    learned positions, untied head, biases on every linear)."""
    return TransformerSpec(name=name, n_layer=config.n_layer, d_model=config.d_model,
                           n_head=config.n_head, d_ff=config.mlp_ratio * config.d_model,
                           vocab_size=config.vocab_size, glu=False, qkv_bias=True, mlp_bias=True,
                           out_bias=True, norm_params_per_layer=4 * config.d_model,
                           learned_positions=config.max_seq_len,
                           source="rlm_course.lm.model.TinyGPT")


_LLAMA3 = "Meta Llama 3 model card and config.json (Hugging Face meta-llama/Meta-Llama-3-{})"

SPECS: dict[str, TransformerSpec] = {
    "llama-3-8b": TransformerSpec("llama-3-8b", n_layer=32, d_model=4096, n_head=32, n_kv_head=8,
                                  d_ff=14336, vocab_size=128256, max_context=8192,
                                  source=_LLAMA3.format("8B")),
    "llama-3-70b": TransformerSpec("llama-3-70b", n_layer=80, d_model=8192, n_head=64, n_kv_head=8,
                                   d_ff=28672, vocab_size=128256, max_context=8192,
                                   source=_LLAMA3.format("70B")),
    "qwen2.5-7b": TransformerSpec("qwen2.5-7b", n_layer=28, d_model=3584, n_head=28, n_kv_head=4,
                                  d_ff=18944, vocab_size=152064, qkv_bias=True, max_context=131072,
                                  source="Qwen2.5 technical report, arXiv:2412.15115, Table 1; "
                                         "config.json of Qwen/Qwen2.5-7B"),
    "mixtral-8x7b": TransformerSpec("mixtral-8x7b", n_layer=32, d_model=4096, n_head=32,
                                    n_kv_head=8, d_ff=14336, vocab_size=32000, n_experts=8,
                                    experts_per_token=2, max_context=32768,
                                    source="Mixtral of Experts, Jiang et al. 2024, arXiv:2401.04088, "
                                           "Table 1; config.json of mistralai/Mixtral-8x7B-v0.1"),
    # the models of the published RL runs that chapter 14 plans and validates against
    "r1-distill-qwen-1.5b": TransformerSpec(
        "r1-distill-qwen-1.5b", n_layer=28, d_model=1536, n_head=12, n_kv_head=2, d_ff=8960,
        vocab_size=151936, qkv_bias=True, max_context=131072,
        source="config.json of deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B (Qwen2.5-Math-1.5B "
               "architecture, untied output head): 1.78B parameters"),
    "llama-3.1-8b": TransformerSpec(
        "llama-3.1-8b", n_layer=32, d_model=4096, n_head=32, n_kv_head=8, d_ff=14336,
        vocab_size=128256, max_context=131072,
        source="config.json of meta-llama/Llama-3.1-8B-Instruct (Llama 3's 8B architecture, "
               "longer RoPE context): 8.0B parameters"),
    "llama-3.1-70b": TransformerSpec(
        "llama-3.1-70b", n_layer=80, d_model=8192, n_head=64, n_kv_head=8, d_ff=28672,
        vocab_size=128256, max_context=131072,
        source="config.json of meta-llama/Llama-3.1-70B (Llama 3's 70B architecture, RoPE "
               "scaled to a 131,072-token context): 70.6B parameters"),
    "qwen3-4b": TransformerSpec(
        "qwen3-4b", n_layer=36, d_model=2560, n_head=32, n_kv_head=8, d_head=128, d_ff=9728,
        vocab_size=151936, norm_params_per_layer=2 * 2560 + 2 * 128, tied_embeddings=True,
        max_context=40960,
        source="config.json of Qwen/Qwen3-4B (36 layers, 32 query heads and 8 KV heads of 128, "
               "SwiGLU 9,728, QK-norm, head tied to the embedding): 4.0B parameters"),
    "qwen3-32b": TransformerSpec(
        "qwen3-32b", n_layer=64, d_model=5120, n_head=64, n_kv_head=8, d_head=128, d_ff=25600,
        vocab_size=151936, norm_params_per_layer=2 * 5120 + 2 * 128, max_context=40960,
        source="config.json of Qwen/Qwen3-32B (64 layers, 64 query heads and 8 KV heads of 128, "
               "SwiGLU 25,600, QK-norm, untied head): 32.8B parameters"),
    "qwen2.5-32b": TransformerSpec(
        "qwen2.5-32b", n_layer=64, d_model=5120, n_head=40, n_kv_head=8, d_ff=27648,
        vocab_size=152064, qkv_bias=True, max_context=131072,
        source="config.json of Qwen/Qwen2.5-32B (64 layers, 40 query and 8 KV heads, SwiGLU "
               "27,648, untied head): 32.8B parameters"),
    "qwen3-30b-a3b": TransformerSpec(
        "qwen3-30b-a3b", n_layer=48, d_model=2048, n_head=32, n_kv_head=4, d_head=128, d_ff=768,
        vocab_size=151936, n_experts=128, experts_per_token=8, max_context=40960,
        norm_params_per_layer=2 * 2048 + 2 * 128,  # two RMSNorms plus QK-norm
        source="config.json of Qwen/Qwen3-30B-A3B (48 layers, 128 experts of 768, 8 active, "
               "QK-norm): 30.5B parameters, 3.3B active"),
    "qwen3-235b-a22b": TransformerSpec(
        "qwen3-235b-a22b", n_layer=94, d_model=4096, n_head=64, n_kv_head=4, d_head=128,
        d_ff=1536, vocab_size=151936, n_experts=128, experts_per_token=8, max_context=40960,
        norm_params_per_layer=2 * 4096 + 2 * 128,
        source="config.json of Qwen/Qwen3-235B-A22B (94 layers, 128 experts of 1536, 8 active, "
               "QK-norm): 235B parameters, 22B active"),
    "deepseek-v3": TransformerSpec(
        "deepseek-v3", n_layer=61, d_model=7168, n_head=128, d_head=128, d_ff=2048,
        vocab_size=129280, n_experts=256, experts_per_token=8, n_shared_experts=1,
        router_bias=True, n_dense_layers=3, dense_d_ff=18432, kv_lora_rank=512, q_lora_rank=1536,
        qk_rope_head_dim=64, v_head_dim=128, max_context=163840,
        source="DeepSeek-V3 technical report, arXiv:2412.19437, and config.json of "
               "deepseek-ai/DeepSeek-V3: 61 layers of width 7168, the first 3 with a dense MLP "
               "of 18,432, the others 256 routed experts of 2,048 + 1 shared, 8 active; "
               "multi-head latent attention over 128 heads (q_lora_rank 1,536, kv_lora_rank 512, "
               "qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128), a routing bias "
               "per expert (e_score_correction_bias): 671B parameters, "
               "36.6B active with the output head (the multi-token-prediction module's 11.5B "
               "not counted)"),
}


def get_spec(name: str) -> TransformerSpec:
    """A named architecture of :data:`SPECS`, the name in any case (``Qwen2.5-7B`` as Hugging
    Face writes it is ``qwen2.5-7b``).

    Raises:
        ValueError: for an unknown name.
    """
    if not isinstance(name, str):
        raise ValueError(f"get_spec: name={name!r} must be an architecture's name, e.g. "
                         "'llama-3.1-8b'; choose one of " + ", ".join(SPECS) + ".")
    if name not in SPECS:
        same = [key for key in SPECS if key.lower() == name.lower()]
        if not same:
            raise ValueError(f"{unknown_name('architecture', name, SPECS)}, or build a "
                             "TransformerSpec.")
        name = same[0]
    return SPECS[name]


def _largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` that is at most ``at_most``."""
    return max(k for k in range(1, min(n, at_most) + 1) if n % k == 0)
