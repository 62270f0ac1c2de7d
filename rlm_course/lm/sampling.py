"""Batched generation with a KV cache, and per-token log-probabilities of given responses.

Generation is the *rollout* stage of an RL iteration: a prefill pass over the prompts, then one
decoding step per new token (autoregressive, so ``max_new_tokens`` sequential steps however many
sequences run in parallel). Scoring (:func:`response_log_probs`) is one full-sequence forward pass
over prompt + response, as the trainer and the frozen reference do it.

Layout of a rollout batch (``P`` prompt columns, left-padded; ``R`` response columns)::

    tokens          (batch, P + R)   <pad>..<bos> prompt | response <eos> <pad>..
    attention_mask  (batch, P + R)   True for real tokens (prompt and response up to <eos>)
    response_mask   (batch, R)       True for generated tokens up to and including <eos>
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from rlm_course.algorithms import MIN_TEMPERATURE
from rlm_course.lm.model import KVCache, TinyGPT
from rlm_course.utils import is_integer


@dataclass
class Rollout:
    """Output of :func:`generate`.

    Attributes:
        tokens: ``(batch, P + R)`` int64.
        attention_mask: ``(batch, P + R)`` bool.
        response_mask: ``(batch, R)`` bool.
        log_probs: ``(batch, R)`` float, log-probability of each sampled token under the sampling
            distribution (temperature and top-k applied); 0 where ``response_mask`` is False, and
            0 everywhere under greedy decoding (which samples nothing).
        prompt_len: ``P``.
    """

    tokens: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    log_probs: Tensor
    prompt_len: int

    @property
    def responses(self) -> Tensor:
        """``(batch, R)`` generated token ids (``<pad>`` after ``<eos>``)."""
        return self.tokens[:, self.prompt_len:]

    def response_lengths(self) -> Tensor:
        return self.response_mask.sum(-1)


def log_prob_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of log-probabilities, advantages and losses for a model computing in ``dtype``:
    float32 at least (bf16 and fp16 models score in float32; float64 models keep float64)."""
    return torch.promote_types(dtype, torch.float32)


def _filter_logits(logits: Tensor, temperature: float, top_k: int | None) -> Tensor:
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits


def generate(model: TinyGPT, prompt_tokens: Tensor, prompt_mask: Tensor, max_new_tokens: int,
             eos_id: int, pad_id: int = 0, temperature: float = 1.0, top_k: int | None = None,
             greedy: bool = False, generator: torch.Generator | None = None,
             use_cache: bool = True) -> Rollout:
    """Sample up to ``max_new_tokens`` tokens for each prompt; a sequence stops at ``<eos>``.

    Args:
        prompt_tokens, prompt_mask: ``(batch, P)`` left-padded prompts and their real-token mask.
        temperature: softmax temperature (> 0); ignored when ``greedy``.
        eos_id: the token that ends a sequence (``tokenizer.eos_id``); -1: none, every sequence
            runs ``max_new_tokens`` (the benchmarks' fixed lengths).
        top_k: keep only the ``top_k`` most likely tokens before sampling (None: all); the
            rollout's log-probs are then those of the truncated distribution, which
            :func:`response_log_probs` (no top-k) does not score: RL runs sample without it.
        greedy: take the arg-max token (for evaluation).
        generator: a seeded ``torch.Generator`` for reproducible samples.
        use_cache: False recomputes the whole prefix at every step (the baseline that
            ``bench sampling`` compares with); the samples are the same.

    Returns:
        A :class:`Rollout` of ordinary tensors (the sampling runs under ``torch.inference_mode``,
        about 5% faster than ``no_grad`` at the course's sizes, the same samples bit for bit;
        the results are copied out of it, so a training step can save them for its backward).
        Generation ends early once every sequence has emitted ``<eos>``.

    Raises:
        ValueError: for a temperature that is not positive and finite (or so small that the
            logits divided by it overflow), a ``max_new_tokens`` that is not a positive integer,
            a ``top_k`` that is not None or a positive integer, an ``eos_id`` (but -1) or a
            prompt token outside the model's vocabulary, a prompt mask that is not a bool
            ``(batch, P)`` whose last column is real (prompts are left-padded), or a sequence
            longer than the model's ``max_seq_len``.
        FloatingPointError: if the model produces NaN or infinite logits.
    """
    vocab = model.config.vocab_size
    if not is_integer(max_new_tokens) or max_new_tokens <= 0:
        raise ValueError(f"generate: max_new_tokens={max_new_tokens!r} must be a positive "
                         "integer.")
    if top_k is not None and (not is_integer(top_k) or top_k < 1):
        raise ValueError(f"generate: top_k={top_k!r} must be a positive integer (or None: every "
                         "token).")
    if not is_integer(eos_id) or not -1 <= eos_id < vocab:
        raise ValueError(f"generate: eos_id={eos_id!r} must be a token id of the model's "
                         f"vocabulary (0..{vocab - 1}; tokenizer.eos_id), or -1 for every "
                         "sequence to run max_new_tokens (another id would never end one).")
    check_prompts(prompt_tokens, prompt_mask, vocab, "generate")
    if not greedy and not 0 < temperature < float("inf"):  # NaN fails too
        raise ValueError(f"generate: temperature={temperature} must be positive and finite (or "
                         "use greedy=True).")
    batch, prompt_len = prompt_tokens.shape
    total = prompt_len + max_new_tokens
    if total > model.config.max_seq_len:
        raise ValueError(f"generate: prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) = "
                         f"{total} exceeds max_seq_len={model.config.max_seq_len}.")
    # inference mode: no autograd bookkeeping (version counters, view tracking) on the hot
    # path; the clones returned below are made outside it, so they are ordinary tensors that
    # a training step may save for its backward
    with torch.inference_mode():
        device = prompt_tokens.device
        tokens = torch.full((batch, total), pad_id, dtype=torch.long, device=device)
        tokens[:, :prompt_len] = prompt_tokens
        attention_mask = torch.zeros((batch, total), dtype=torch.bool, device=device)
        attention_mask[:, :prompt_len] = prompt_mask
        dtype = next(model.parameters()).dtype
        log_probs = torch.zeros((batch, max_new_tokens), dtype=log_prob_dtype(dtype), device=device)
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        cache = (KVCache(model.config, batch, total, dtype=dtype, device=device) if use_cache
                 else None)

        was_training = model.training
        model.eval()
        try:
            logits = model(prompt_tokens, prompt_mask, cache)[:, -1]  # prefill
            # a decoding step's position is the count of real tokens before it, and its query may
            # see every real key so far: both kept up to date here instead of recomputed from the
            # whole mask
            positions = prompt_mask.sum(-1, keepdim=True)  # (batch, 1)
            steps = 0
            for t in range(max_new_tokens):
                pos = prompt_len + t
                if not torch.isfinite(logits).all():
                    raise FloatingPointError("generate: the policy's logits are not finite (NaN or "
                                             "inf): its weights have diverged; lower the learning "
                                             "rate.")
                if greedy:
                    next_token = logits.argmax(-1)
                    step_log_probs = log_probs.new_zeros(batch)
                else:
                    scaled = _filter_logits(logits.to(log_probs.dtype), temperature, top_k)
                    step_logp = F.log_softmax(scaled, dim=-1)
                    # finite logits over a temperature below the runs' floor can overflow (NaN
                    # here); above it they cannot, so the decode loop pays no extra check
                    if temperature < MIN_TEMPERATURE and bool(torch.isnan(step_logp).any()):
                        raise ValueError(f"generate: temperature={temperature} divides the logits "
                                         "past float range; sample at 1e-3 or more, or use "
                                         "greedy=True.")
                    next_token = torch.multinomial(step_logp.exp(), 1,
                                                   generator=generator).squeeze(-1)
                    step_log_probs = step_logp.gather(-1, next_token[:, None]).squeeze(-1)
                alive = ~finished
                tokens[:, pos] = torch.where(alive, next_token, pad_id)
                attention_mask[:, pos] = alive
                log_probs[:, t] = torch.where(alive, step_log_probs, 0.0)
                finished = finished | (next_token == eos_id)
                steps = t + 1
                if bool(finished.all()) or t == max_new_tokens - 1:
                    break
                if use_cache:
                    # (batch, 1, 1, ctx), a view: the prompt's real tokens keep every row non-empty
                    key_mask = attention_mask[:, None, None, :pos + 1]
                    logits = model(tokens[:, pos:pos + 1], attention_mask[:, :pos + 1], cache,
                                   positions=positions, attn_mask=key_mask)[:, -1]
                    positions = positions + 1
                else:
                    logits = model(tokens[:, :pos + 1], attention_mask[:, :pos + 1])[:, -1]
        finally:  # an error (diverged logits) leaves the model in the mode it was given in
            model.train(was_training)

    end = prompt_len + steps
    response_mask = attention_mask[:, prompt_len:end].clone()
    return Rollout(tokens[:, :end].clone(), attention_mask[:, :end].clone(), response_mask,
                   log_probs[:, :steps].clone(), prompt_len)


def check_prompts(prompt_tokens: Tensor, prompt_mask: Tensor, vocab: int, where: str) -> None:
    """Refuse prompts :func:`generate` would misread.

    Raises:
        ValueError: for tokens that are not a 2-D integer tensor of ids below ``vocab``, a mask
            that is not a bool tensor of their shape, or a last column that is not real in every
            row (left padding: generation continues from the last column).
    """
    if not (isinstance(prompt_tokens, Tensor) and prompt_tokens.dim() == 2
            and not prompt_tokens.is_floating_point() and prompt_tokens.dtype != torch.bool):
        shape = tuple(prompt_tokens.shape) if isinstance(prompt_tokens, Tensor) else None
        raise ValueError(f"{where}: prompt_tokens must be a (batch, P) tensor of token ids (got "
                         f"{type(prompt_tokens).__name__} {shape or ''}); "
                         "tokenizer.encode_prompts([...]) makes one.")
    if not (isinstance(prompt_mask, Tensor) and prompt_mask.dtype == torch.bool
            and prompt_mask.shape == prompt_tokens.shape):
        what = (f"{prompt_mask.dtype} {tuple(prompt_mask.shape)}"
                if isinstance(prompt_mask, Tensor) else type(prompt_mask).__name__)
        raise ValueError(f"{where}: prompt_mask must be a bool tensor of the prompts' shape "
                         f"{tuple(prompt_tokens.shape)} (got {what}); use the mask "
                         "tokenizer.encode_prompts returns, or mask.bool().")
    if prompt_tokens.numel() and (int(prompt_tokens.min()) < 0
                                  or int(prompt_tokens.max()) >= vocab):
        raise ValueError(f"{where}: prompt token ids span {int(prompt_tokens.min())}.."
                         f"{int(prompt_tokens.max())}, outside the model's vocabulary of {vocab}: "
                         "encode with the tokenizer the model was built for.")
    if prompt_mask.shape[1] == 0 or not bool(prompt_mask[:, -1].all()):
        raise ValueError(f"{where}: every prompt's last column must be a real token (prompts are "
                         "left-padded, and generation continues from the last column); "
                         "tokenizer.encode_prompts pads them so.")


def response_log_probs(model: TinyGPT, tokens: Tensor, attention_mask: Tensor, prompt_len: int,
                       with_entropy: bool = False,
                       temperature: float = 1.0) -> Tensor | tuple[Tensor, Tensor]:
    """Log-probability of every response token under ``model``, in one forward pass.

    The logits are divided by the rollout's ``temperature`` first, so the scores are those of the
    distribution the tokens were sampled from (as veRL and OpenRLHF score them): the ratio, the KL
    and the policy gradient of an RL step then all belong to that distribution. (Scoring a
    temperature-0.7 sample at temperature 1 is off by up to a nat and a half per token.)

    Args:
        tokens, attention_mask: ``(batch, P + R)`` as in :class:`Rollout`.
        prompt_len: ``P``; the logits at column ``P - 1 + t`` predict response token ``t``.
        with_entropy: also return the entropy of each predictive distribution.
        temperature: the sampling temperature of the rollout (> 0).

    Returns:
        ``log_probs (batch, R)`` (and ``entropy (batch, R)`` in nats). Positions outside the
        response mask hold values of padding; mask them out.

    Raises:
        ValueError: for a temperature that is not positive and finite, or a ``prompt_len`` that
            is not an integer with at least one prompt and one response column (1 <= P < P + R).
    """
    width = tokens.shape[1] if isinstance(tokens, Tensor) and tokens.dim() == 2 else None
    if not is_integer(prompt_len) or width is None or not 1 <= prompt_len < width:
        raise ValueError(f"response_log_probs: prompt_len={prompt_len!r} must be an integer in "
                         f"1..{'P + R - 1' if width is None else width - 1} for tokens "
                         f"{tuple(tokens.shape) if isinstance(tokens, Tensor) else tokens!r} "
                         "(the Rollout's prompt_len).")
    if not (0 < temperature < float("inf")):
        raise ValueError(f"response_log_probs: temperature={temperature} must be positive and "
                         "finite (the one the rollout was sampled at).")
    logits = model(tokens, attention_mask)[:, prompt_len - 1:-1]  # (batch, R, vocab)
    logits = logits.to(log_prob_dtype(logits.dtype))
    if temperature != 1.0:
        logits = logits / temperature
    logp = F.log_softmax(logits, dim=-1)
    targets = tokens[:, prompt_len:]
    token_logp = logp.gather(-1, targets[..., None]).squeeze(-1)
    if not with_entropy:
        return token_logp
    entropy = -(logp.exp() * logp).sum(-1)
    return token_logp, entropy


def select_rollouts(rollout: Rollout, rows: Tensor) -> Rollout:
    """The rollouts of ``rows`` (an index or bool tensor over the batch)."""
    return Rollout(rollout.tokens[rows], rollout.attention_mask[rows], rollout.response_mask[rows],
                   rollout.log_probs[rows], rollout.prompt_len)


def concat_rollouts(rollouts: list[Rollout], pad_id: int) -> Rollout:
    """One :class:`Rollout` from several (e.g. DAPO's generation rounds): prompts are left-padded
    and responses right-padded to the widest of them. Padding is masked out, and positions come
    from the attention mask, so every row scores exactly as it did in its own batch.

    Raises:
        ValueError: for an empty list.
    """
    if not rollouts:
        raise ValueError("concat_rollouts: nothing to concatenate.")
    if len(rollouts) == 1:
        return rollouts[0]
    prompt_len = max(r.prompt_len for r in rollouts)
    response_len = max(r.response_mask.shape[1] for r in rollouts)
    parts = {"tokens": [], "attention_mask": [], "response_mask": [], "log_probs": []}
    for r in rollouts:
        left, right = prompt_len - r.prompt_len, response_len - r.response_mask.shape[1]
        parts["tokens"].append(F.pad(r.tokens, (left, right), value=pad_id))
        parts["attention_mask"].append(F.pad(r.attention_mask, (left, right), value=False))
        parts["response_mask"].append(F.pad(r.response_mask, (0, right), value=False))
        parts["log_probs"].append(F.pad(r.log_probs, (0, right), value=0.0))
    return Rollout(*(torch.cat(parts[k]) for k in ("tokens", "attention_mask", "response_mask",
                                                  "log_probs")), prompt_len)
