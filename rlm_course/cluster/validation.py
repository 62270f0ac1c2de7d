"""Does the simulator predict published runs it was not fitted to?

The figures of ``data/published/rl_systems.json`` (:mod:`rlm_course.cluster.published`) each
belong to a **family** of rates (a system: its engine, trainer and the software around them) and
are either part of the family's declared **calibration** set or a **prediction**:

* the rates of each family are fitted once on its calibration figures
  (:func:`rlm_course.cluster.calibration.calibrate`, ``python -m rlm_course validate
  --calibrate``) and stored in ``data/published/rates.json`` with the number of free parameters;
* every other figure is predicted with those rates, without refitting (:func:`validation_table`).

**What is compared.** A seconds figure (a step, a generation phase, a weight sync) is within
tolerance when ``|predicted / published - 1| <= 30%``; a speed-up (the ratio of two step figures
of the table, each simulated) when its **gain** ``speedup - 1`` is within 25% of the published
gain; a speed-up predicted on the wrong side of 1 is a **direction error**. Beside each figure a
**null model** shows what the simulator adds over arithmetic (:func:`null_model`): for a step or
a generation phase, the family's first calibration step scaled by the model FLOPs per device (a
family with a base, e.g. NeMo-RL on GB200, takes its base family's: the null model knows no
device); for a
speed-up, ``(G + T) / max(G, T)`` from the baseline's published generation ``G`` and training
``T`` seconds when given (perfect overlap), else the ratio of devices; for a weight sync, the
bytes over the network link (the ideal).

A figure that misses stays in the table with its reason (``reason`` in the data file).
"""

from __future__ import annotations

import math

from rlm_course.cluster.calibration import family_rates, fitted_workload, free_parameter_count
from rlm_course.cluster.published import (TOLERANCE, Predictor, check_figure, direction_error,
                                          error, load_document, load_figures, resolve, scenario,
                                          within)
from rlm_course.cost.architectures import get_spec
from rlm_course.cost.hardware import get_device
from rlm_course.cost.layouts import DoesNotFit
from rlm_course.cost.phases import Rates, pass_flops


def _work_per_device(setup: dict) -> float | None:
    """Model FLOPs of a step per device: ``2 N_active`` per token of every sequence, times the
    passes (generation, scoring, ``3x`` for the update), over the devices."""
    spec = get_spec(setup["model"])
    if isinstance(setup["mean_response"], str):  # fitted, not published: no null model
        return None
    tokens = setup["prompts"] * setup["group_size"] * (setup["prompt_len"] + setup["mean_response"])
    return 2 * spec.params(active=True) * tokens * 5 / setup["gpus"]


def null_model(fig: dict, figures: dict[str, dict], reference: dict | None) -> float | None:
    """The arithmetic a practitioner would do without a simulator (see the module docstring), or
    ``None`` where it has nothing to say."""
    what = fig["what"]
    if what == "speedup":
        base, target = figures[fig["baseline"]], figures[fig["target"]]
        stages = base.get("published_stages") or {}
        if "generation" in stages and "update" in stages:
            g, t = stages["generation"], stages["update"] + stages.get("scoring", 0.0)
            return (g + t) / max(g, t)
        return target["setup"]["gpus"] / base["setup"]["gpus"]
    if what == "sync_seconds":
        s = fig["setup"]
        spec, device = get_spec(s["model"]), get_device(s["device"])
        return 2 * spec.params() / device.inter_node_bandwidth
    if reference is None or reference["id"] == fig["id"]:
        return None
    work, base = _work_per_device(fig["setup"]), _work_per_device(reference["setup"])
    if work is None or base is None:
        return None
    value = reference["published"] * work / base
    if what == "generation_seconds":
        share = (reference.get("published_stages") or {}).get("generation")
        return share / reference["published"] * value if share else None
    return value


# ---------------------------------------------------------------------- checking a figure
def implied_update_hfu(fig: dict, fitted: dict[str, dict] | None = None) -> float | None:
    """The hardware FLOPs utilisation a step figure's published update time implies at the
    workload its setup describes: the update's hardware FLOPs (forward, backward and the
    recomputed forward of every trained sequence, :func:`~rlm_course.cost.phases.pass_flops`)
    over ``published update seconds x trainer devices x the device's dense peak``. ``None`` where
    the figure publishes no update time.

    It needs no rate, so it checks the *setup*, not the simulator: figures that share a workload
    should imply similar efficiencies for similar trainers, and none can imply more than 1 (a
    trainer cannot beat its device's peak). Where one implies far more than the others, its run
    did less work than the shared setup says (e.g. shorter responses), and no rate can make the
    simulator match both. ``fitted`` fills a fitted workload parameter such as an unpublished mean
    response length (default: the stored calibration's), so the value moves with that fit.

    Raises:
        ValueError: for a malformed figure (:func:`~rlm_course.cluster.published.check_figure`:
            a missing field, a published time that is not a positive, finite number) or setup,
            a family the calibration does not have, or a fitted parameter it does not have.
    """
    if not isinstance(fig, dict):
        raise ValueError(f"implied_update_hfu: fig={fig!r} must be a figure of "
                         "data/published/rl_systems.json (a dict; published.load_figures()).")
    if fig.get("what") == "speedup":  # a ratio of two steps: no update of its own
        return None
    check_figure(fig, set())
    update = (fig.get("published_stages") or {}).get("update")
    if fig["what"] != "step_seconds" or update is None:
        return None
    fitted = fitted_workload() if fitted is None else fitted
    if not isinstance(fitted, dict):
        raise ValueError(f"implied_update_hfu: fitted={fitted!r} must map families to their "
                         "fitted workload parameters (calibration.fitted_workload()).")
    if fig["family"] not in fitted and isinstance(fig["setup"].get("mean_response"), str):
        raise ValueError(f"figure {fig['id']}: family {fig['family']!r} has no fitted workload "
                         f"parameters (families: {', '.join(fitted) or 'none'}); give a family "
                         "of data/published/rates.json.")
    try:
        s = scenario(resolve(fig["setup"], fitted.get(fig["family"])), Rates())
    except (TypeError, KeyError, AttributeError) as err:
        raise ValueError(f"figure {fig['id']}: malformed setup ({type(err).__name__}: {err}); "
                         "see the setups of data/published/rl_systems.json.") from None
    flops = pass_flops(s.spec, s.config, s.workload.prompt_len, s.workload.lengths,
                       s.trainer_layout.recompute, s.engine_log_probs)
    trained = sum(v for stage, v in flops.items() if stage != "scoring")
    peak = s.cluster.device.peak_flops * s.rates.train_flops_factor
    return trained / (update * s.trainer_pool * peak)


# ---------------------------------------------------------------------- the table
def validation_table(rates: dict[str, Rates] | None = None,
                     figures: list[dict] | None = None,
                     fitted: dict[str, dict] | None = None) -> list[dict]:
    """Predict every figure with the families' calibrated rates and fitted workload parameters
    (default: those stored in ``data/published/rates.json``) and compare.

    Returns:
        one row per figure: ``id, system, family, sample, what, published, predicted, null,
        error, null_error, within, direction_error, reason, source``.

    Raises:
        ValueError: for a malformed figure or a family without calibrated rates.
    """
    figures = load_figures() if figures is None else figures
    ids = {f["id"] for f in figures}
    for f in figures:
        check_figure(f, ids)
    if rates is None:
        rates, fitted = family_rates(), fitted_workload()
    predictor = Predictor(figures, rates, fitted)
    by_id = {f["id"]: f for f in figures}
    bases = {name: spec.get("base") for name, spec in load_document()["families"].items()}

    def root(family: str) -> str:
        seen = set()
        while bases.get(family) and family not in seen:
            seen.add(family)
            family = bases[family]
        return family

    references = {}
    for f in figures:  # a family's null-model reference: its root family's first calibration step
        if (f["sample"] == "calibration" and f["what"] == "step_seconds"
                and root(f["family"]) == f["family"]):
            references.setdefault(f["family"], f)
    rows = []
    for f in figures:
        refused = ""
        try:
            predicted = predictor.predict(f)
        except DoesNotFit as err:  # the memory model refuses a layout that ran: a miss
            predicted, refused = math.nan, str(err)
        null = null_model(f, by_id, references.get(root(f["family"])))
        rows.append({"id": f["id"], "system": f["system"], "family": f["family"],
                     "sample": f["sample"], "what": f["what"], "published": f["published"],
                     "predicted": predicted, "null": null, "error": error(f, predicted),
                     "null_error": None if null is None else error(f, null),
                     "within": within(f, predicted), "refused": refused,
                     "null_within": None if null is None else within(f, null),
                     "direction_error": direction_error(f, predicted),
                     "reason": f.get("reason", "") or (f"refused: {refused}" if refused else ""),
                     "source": f["source"]})
    return rows


def summary(rows: list[dict], free_parameters: int | None = None) -> dict:
    """The counts the table ends with: out-of-sample hits and total, the null model's hits on the
    same figures, direction errors, in-sample hits, and the free parameters fitted."""
    out = [r for r in rows if r["sample"] == "prediction"]
    inside = [r for r in rows if r["sample"] == "calibration"]
    nulls = [r for r in out if r["null_within"] is not None]
    return {"out_of_sample_hits": sum(r["within"] for r in out),
            "out_of_sample_total": len(out),
            "out_of_sample_share": (sum(r["within"] for r in out) / len(out)) if out else 0.0,
            "null_hits": sum(r["null_within"] for r in nulls), "null_total": len(nulls),
            "simulator_hits_where_null_applies": sum(r["within"] for r in nulls),
            "direction_errors": sum(r["direction_error"] for r in rows),
            "in_sample_hits": sum(r["within"] for r in inside), "in_sample_total": len(inside),
            "free_parameters": (free_parameter_count() if free_parameters is None
                                else free_parameters),
            "figures": len(rows)}


def format_validation(rows: list[dict]) -> str:
    """The table: figure, in or out of sample, predicted, published, null model, error (on the
    gain for a speed-up), within tolerance; below it the misses, one line per reason with the
    figures it explains."""
    from rlm_course.utils import format_table

    def value(r, v):
        if v is None:
            return "-"
        return f"{v:.2f}x" if r["what"] == "speedup" else f"{v:,.3g} s"

    def pct(v):
        return "-" if v is None else f"{v:+.0%}".replace("-0%", "+0%")  # a tiny miss, no sign

    table = [[r["id"], "in" if r["sample"] == "calibration" else "out", value(r, r["predicted"]),
              value(r, r["published"]), value(r, r["null"]),
              ("gain " if r["what"] == "speedup" else "") + pct(r["error"]), pct(r["null_error"]),
              ("yes" if r["within"] else "NO") + (" (direction)" if r["direction_error"] else "")]
             for r in rows]
    lines = [format_table(table, ["figure", "sample", "predicted", "published", "null model",
                                  "error", "null error", "within"]),
             f"within tolerance: |error| <= {TOLERANCE['seconds']:.0%} on seconds, "
             f"<= {TOLERANCE['gain']:.0%} on a speed-up's gain (speed-up - 1)"]
    by_reason: dict[str, list[str]] = {}  # one line per reason, with every figure it explains
    for r in rows:
        if not r["within"]:
            by_reason.setdefault(r["reason"] or "no reason recorded", []).append(r["id"])
    if by_reason:
        lines.append("misses, by reason:")
        lines += [f" - {', '.join(ids)}: {reason}" for reason, ids in by_reason.items()]
    return "\n".join(lines)
