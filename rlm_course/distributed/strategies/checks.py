"""Equal to one device: tolerances from :mod:`rlm_course.numerics`, the ranks' results merged
and compared with the reference; the timing summary."""

from __future__ import annotations

from rlm_course.numerics import adam_tolerance, relative_error, reorder_tolerance
from rlm_course.distributed.strategies.setup import (STRATEGIES, Setup, reference)
from rlm_course.distributed.strategies.formulas import predicted_sent


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
