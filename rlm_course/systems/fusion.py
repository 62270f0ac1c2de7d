"""Stage fusion: score finished responses while the long tail is still decoding.

An iteration's experience preparation is generation, then scoring: the verifier's reward and the
log-probabilities under the policy (``pi_old``) and the frozen reference, forward passes over
every response. With long-tailed lengths most responses finish early and the workers that hold
them idle -- or decode a handful of stragglers one token at a time -- until the longest ends;
only then does scoring start (**unfused**).

**Fused** (RLHFuse's inter-stage fusion, Zhong et al. 2025, arXiv:2409.13221, section 4): when
most responses have finished, the unfinished ones *migrate* to fewer workers (here, all to the
first), which keep decoding them (re-prefilling their prompt and response so far, as a partial
rollout does), while the freed workers score the finished responses; the stragglers are scored
when they end. The migration point is a token count: after
``first_tokens`` decode steps every worker hands over what is left, ``first_tokens`` taken from
the previous iteration's lengths (a quantile, :func:`migration_point`; StreamRL predicts lengths
with a ranker for the same purpose). The two pipelines run on Ray workers in
:mod:`rlm_course.systems.pipelines` (:func:`~rlm_course.systems.pipelines.prepare_unfused`,
:func:`~rlm_course.systems.pipelines.prepare_fused`,
:func:`~rlm_course.systems.pipelines.fusion_experiment`); this module holds what they compute.

What fusion buys is the overlap of the tail's decoding with the scoring of everything else; what
it costs is the re-prefill of the migrated sequences. The responses that finished before the
migration point are the same tokens in both pipelines (same seeds, same first steps), so their
experience is the same; the migrated ones continue from another worker's sampler.
"""

from __future__ import annotations

import torch

from rlm_course.lm.sampling import response_log_probs
from rlm_course.systems.async_rl import rows_to_batch


def score_rows(trainer, rows: list) -> dict:
    """Experience of finished sequences (:class:`~rlm_course.systems.async_rl.InFlight`): the
    verifier's reward, and the per-token log-probabilities under ``trainer``'s policy and its
    reference (when it holds one), at the rollout temperature.

    Returns:
        ``{"index": [...], "reward": [...], "old_log_probs": [[...]], "ref_log_probs": [[...]]}``,
        one entry per row, the log-probabilities cut to each response's length.
    """
    batch = rows_to_batch(trainer, rows)
    rollout, t = batch.rollout, trainer.config.temperature
    with torch.no_grad():
        old = response_log_probs(trainer.policy, rollout.tokens, rollout.attention_mask,
                                 rollout.prompt_len, temperature=t)
        ref = (response_log_probs(trainer.reference, rollout.tokens, rollout.attention_mask,
                                  rollout.prompt_len, temperature=t)
               if trainer.reference is not None else None)
    lengths = [len(r.tokens) for r in rows]
    return {"index": [r.index for r in rows], "reward": batch.rewards.tolist(),
            "old_log_probs": [old[i, :n].tolist() for i, n in enumerate(lengths)],
            "ref_log_probs": ([ref[i, :n].tolist() for i, n in enumerate(lengths)]
                              if ref is not None else [[] for _ in rows]),
            "tokens": [r.tokens for r in rows]}


def merge_experience(parts: list[dict]) -> dict:
    """One experience from the parts several workers scored (:func:`score_rows`), in row order."""
    out = {k: [] for k in ("index", "reward", "old_log_probs", "ref_log_probs", "tokens")}
    for p in parts:
        for k in out:
            out[k] += p.get(k, [])
    order = sorted(range(len(out["index"])), key=out["index"].__getitem__)
    return {k: [v[i] for i in order] for k, v in out.items()}


def migration_point(lengths: list[int], quantile: float = 0.8) -> int:
    """The decode step after which the unfinished sequences migrate: the ``quantile`` of the
    previous iteration's response lengths (at least 1).

    Raises:
        ValueError: for no lengths or a quantile outside (0, 1).
    """
    if not lengths or not 0 < quantile < 1:
        raise ValueError(f"migration_point: need lengths and 0 < quantile={quantile} < 1.")
    ordered = sorted(lengths)
    return max(1, ordered[min(len(ordered) - 1, int(quantile * len(ordered)))])


def window_events(events: list, windows: list, kind: str, step: int) -> list:
    """The events of one pipeline's run of one iteration (``windows`` from
    :func:`rlm_course.systems.pipelines.fusion_experiment`), on a clock starting at its beginning."""
    from rlm_course.timeline import shifted

    for name, s, begin, end in windows:
        if name == kind and s == step:
            inside = [e for e in events if begin - 1e-3 <= e.start and e.end <= end + 1e-3]
            return sorted(shifted(inside, begin), key=lambda e: e.start)
    raise ValueError(f"no {kind} window for step {step}; the windows are "
                     f"{[(w[0], w[1]) for w in windows]}.")
