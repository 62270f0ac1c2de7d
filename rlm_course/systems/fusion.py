"""Stage fusion: score finished responses while the long tail is still decoding.

An iteration's experience preparation is generation, then scoring: the verifier's reward and the
log-probabilities under the policy (``pi_old``) and the frozen reference, forward passes over
every response. With long-tailed lengths most responses finish early and the workers that hold
them idle -- or decode a handful of stragglers one token at a time -- until the longest ends;
only then does scoring start (**unfused**, :func:`prepare_unfused`).

**Fused** (RLHFuse's inter-stage fusion, Zhong et al. 2025, arXiv:2409.13221, section 4): when
most responses have finished, the unfinished ones *migrate* to fewer workers (here, all to the
first), which keep decoding them (re-prefilling their prompt and response so far, as a partial
rollout does), while the freed workers score the finished responses; the stragglers are scored
when they end (:func:`prepare_fused`). The migration point is a token count: after
``first_tokens`` decode steps every worker hands over what is left, ``first_tokens`` taken from
the previous iteration's lengths (a quantile, :func:`migration_point`; StreamRL predicts lengths
with a ranker for the same purpose).

What fusion buys is the overlap of the tail's decoding with the scoring of everything else; what
it costs is the re-prefill of the migrated sequences. The responses that finished before the
migration point are the same tokens in both pipelines (same seeds, same first steps), so their
experience is the same; the migrated ones continue from another worker's sampler.
"""

from __future__ import annotations

import statistics
import time

import torch

from rlm_course.lm.sampling import response_log_probs


def score_rows(trainer, rows: list) -> dict:
    """Experience of finished sequences (:class:`~rlm_course.systems.async_rl.InFlight`): the
    verifier's reward, and the per-token log-probabilities under ``trainer``'s policy and its
    reference (when it holds one), at the rollout temperature.

    Returns:
        ``{"index": [...], "reward": [...], "old_log_probs": [[...]], "ref_log_probs": [[...]]}``,
        one entry per row, the log-probabilities cut to each response's length.
    """
    from rlm_course.systems.async_rl import rows_to_batch

    batch = rows_to_batch(trainer, rows)
    rollout, t = batch["rollout"], trainer.config.temperature
    with torch.no_grad():
        old = response_log_probs(trainer.policy, rollout.tokens, rollout.attention_mask,
                                 rollout.prompt_len, temperature=t)
        ref = (response_log_probs(trainer.reference, rollout.tokens, rollout.attention_mask,
                                  rollout.prompt_len, temperature=t)
               if trainer.reference is not None else None)
    lengths = [len(r.tokens) for r in rows]
    return {"index": [r.index for r in rows], "reward": batch["rewards"].tolist(),
            "old_log_probs": [old[i, :n].tolist() for i, n in enumerate(lengths)],
            "ref_log_probs": ([ref[i, :n].tolist() for i, n in enumerate(lengths)]
                              if ref is not None else [[] for _ in rows]),
            "tokens": [r.tokens for r in rows]}


def _merge(parts: list[dict]) -> dict:
    out = {k: [] for k in ("index", "reward", "old_log_probs", "ref_log_probs", "tokens")}
    for p in parts:
        for k in out:
            out[k] += p.get(k, [])
    order = sorted(range(len(out["index"])), key=out["index"].__getitem__)
    return {k: [v[i] for i in order] for k, v in out.items()}


def _start(controller, workers, step: int) -> None:
    controller.call(workers, "fusion_start", step, per_worker=[
        {"share": k, "shares": len(workers)} for k in range(len(workers))], what="starting")


def prepare_unfused(controller, step: int, budget: int) -> tuple[float, dict]:
    """Generation on every worker until its last response ends, then scoring on every worker:
    returns ``(seconds, experience)`` (experience as :func:`score_rows`, all rows, in order)."""
    workers = controller.role_workers("rollout")
    _start(controller, workers, step)
    start = time.perf_counter()
    controller.call(workers, "fusion_generate", budget, what=f"generating step {step}")
    finished = controller.call(workers, "fusion_take_finished", what="collecting responses")
    parts = controller.call(workers, "fusion_score", per_worker=[{"rows": f} for f in finished],
                            what=f"scoring step {step}")
    return time.perf_counter() - start, _merge(parts)


def prepare_fused(controller, step: int, budget: int, first_tokens: int) -> tuple[float, dict]:
    """Generation for ``first_tokens`` tokens on every worker; then the unfinished sequences
    migrate to the first worker, which decodes them to the end while the others score every
    finished response; then the stragglers are scored, split over the workers. Returns
    ``(seconds, experience)`` like :func:`prepare_unfused`.

    Raises:
        ValueError: for fewer than two workers (nothing to migrate to), or ``first_tokens < 1``.
    """
    workers = controller.role_workers("rollout")
    if len(workers) < 2:
        raise ValueError("stage fusion needs at least two workers: one to finish the tail, one "
                         "to score meanwhile.")
    if first_tokens < 1:
        raise ValueError(f"first_tokens={first_tokens} must be at least 1.")
    _start(controller, workers, step)
    start = time.perf_counter()
    controller.call(workers, "fusion_generate", first_tokens, what=f"generating step {step}")
    finished = controller.call(workers, "fusion_take_finished", what="collecting responses")
    stragglers = [row for rows in controller.call(workers[1:], "fusion_export",
                                                  what="migrating stragglers") for row in rows]
    tail = controller.submit(workers[0], "fusion_generate", budget, adopt=stragglers,
                             what=f"finishing the tail of step {step}")
    done_rows = [row for rows in finished for row in rows]
    scorers = workers[1:]
    shares = [done_rows[k::len(scorers)] for k in range(len(scorers))]
    scoring = [controller.submit(w, "fusion_score", rows=s, what=f"scoring step {step}")
               for w, s in zip(scorers, shares)]
    parts = controller.gather(scoring)
    controller.gather([tail])
    last = controller.call(workers[:1], "fusion_take_finished", what="collecting the tail")[0]
    split = [last[k::len(workers)] for k in range(len(workers))]
    parts += controller.call(workers, "fusion_score", per_worker=[{"rows": s} for s in split],
                             what=f"scoring the tail of step {step}")
    return time.perf_counter() - start, _merge(parts)


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


def fusion_experiment(controller, task, config, checkpoint, steps: int = 3,
                      quantile: float = 0.8, progress: bool = False) -> dict:
    """Step time of experience preparation, unfused against fused, on the same iterations
    (alternating, so that machine noise hits both alike), after one unfused warm-up iteration
    whose lengths give the migration point.

    Returns:
        ``{"unfused_seconds": [...], "fused_seconds": [...], "gain": median unfused / median
        fused, "first_tokens", "lengths": the warm-up's lengths, "same_early_rows": whether the
        responses that finished before the migration point are identical in both pipelines,
        "windows": [(pipeline, step, start, end)], "events": the timeline}`` (times in seconds
        from the first measured iteration; :func:`window_events` cuts one window out).
    """
    from tqdm.auto import tqdm

    from rlm_course.systems.async_rl import PipelineConfig, _spec
    from rlm_course.systems.timeline import relative

    workers = controller.role_workers("rollout")
    controller.call(workers, "rl_setup", per_worker=[
        {"spec": _spec(task, config, checkpoint, PipelineConfig())} for _ in workers],
        what="loading the models")
    budget = task.max_response_len + config.overlong_buffer
    _, warm = prepare_unfused(controller, 1, budget)
    lengths = [len(t) for t in warm["tokens"]]
    first = migration_point(lengths, quantile)
    controller.events()
    origin = time.time()
    unfused, fused, same, windows = [], [], True, []
    for step in tqdm(range(2, steps + 2), desc="unfused vs fused", disable=not progress):
        begin = time.time() - origin
        t_u, exp_u = prepare_unfused(controller, step, budget)
        middle = time.time() - origin
        t_f, exp_f = prepare_fused(controller, step, budget, first)
        windows += [("unfused", step, begin, middle), ("fused", step, middle, time.time() - origin)]
        unfused.append(t_u)
        fused.append(t_f)
        for tok_u, tok_f in zip(exp_u["tokens"], exp_f["tokens"]):
            if len(tok_u) <= first and tok_u != tok_f:
                same = False
    return {"unfused_seconds": unfused, "fused_seconds": fused,
            "gain": statistics.median(unfused) / statistics.median(fused),
            "first_tokens": first, "lengths": lengths, "same_early_rows": same,
            "windows": windows, "events": relative(controller.events(), origin)}


def window_events(events: list, windows: list, kind: str, step: int) -> list:
    """The events of one pipeline's run of one iteration (``windows`` from
    :func:`fusion_experiment`), on a clock starting at its beginning."""
    from rlm_course.systems.timeline import shifted

    for name, s, begin, end in windows:
        if name == kind and s == step:
            inside = [e for e in events if begin - 1e-3 <= e.start and e.end <= end + 1e-3]
            return sorted(shifted(inside, begin), key=lambda e: e.start)
    raise ValueError(f"no {kind} window for step {step}; the windows are "
                     f"{[(w[0], w[1]) for w in windows]}.")
