"""The published figures of open RL systems, and how the simulator predicts each one.

``data/published/rl_systems.json`` holds figures published by open RL systems (verl's
one-step-off and fully-async tables at every scale, NeMo-RL's performance tables across versions
and devices, verl's weight-sync and DeepSeek-V3 figures), each with its source, the verbatim row,
the **setup** the source and its recipe give (model, devices, batch, lengths, layouts, execution
mode) and the **assumptions** for what they leave open, said in words. Each figure belongs to a
**family** of rates (a system: its engine, trainer and the software around them) and is either
part of the family's declared **calibration** set or a **prediction**.

This module reads and checks the figures, turns a setup into the simulator's scenario
(:func:`scenario`), predicts a figure with given rates (:class:`Predictor`) and compares a
prediction with the published value (:func:`error`, :func:`within`, :func:`direction_error`).
:mod:`rlm_course.cluster.calibration` fits the rates on the calibration figures with it, and
:mod:`rlm_course.cluster.validation` predicts every other figure.

**What is compared.** A seconds figure (a step, a generation phase, a weight sync) is within
tolerance when ``|predicted / published - 1| <= 30%``; a speed-up (the ratio of two step figures
of the table, each simulated) when its **gain** ``speedup - 1`` is within 25% of the published
gain; a speed-up predicted on the wrong side of 1 is a **direction error**.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from rlm_course.cluster.simulator import MODES, Mode, Scenario, SimResult, algorithm, simulate
from rlm_course.cost.anatomy import Workload
from rlm_course.cost.architectures import get_spec
from rlm_course.cost.hardware import get_device
from rlm_course.cost.layouts import Layout
from rlm_course.cost.phases import Cluster, Rates, weight_sync
from rlm_course.utils import data_dir

#: Tolerances: on seconds, relative; on a speed-up, relative on its gain (speed-up - 1).
TOLERANCE = {"seconds": 0.30, "gain": 0.25}
#: What a figure may be.
WHAT = ("step_seconds", "generation_seconds", "sync_seconds", "speedup")
SAMPLES = ("calibration", "prediction")
#: Response lengths are rounded to this many levels when simulating figures (fewer events).
LENGTH_BUCKETS = 256


def figures_path() -> Path:
    return data_dir() / "published" / "rl_systems.json"


def load_document() -> dict:
    """The whole figures file: ``about``, ``families`` and ``figures``.

    Raises:
        ValueError: if the file is missing, not valid JSON or has no figures.
    """
    path = figures_path()
    try:
        doc = json.loads(path.read_text())
        doc["figures"]
    except (OSError, json.JSONDecodeError, KeyError) as err:
        raise ValueError(f"{path} is unreadable ({err}); restore it from git.") from None
    return doc


def load_figures() -> list[dict]:
    """The published figures (see the module docstring)."""
    return load_document()["figures"]


def figure(figure_id: str, figures: list[dict] | None = None) -> dict:
    """One figure by its ``id``.

    Raises:
        ValueError: for an unknown id (the message lists the known ones).
    """
    figures = load_figures() if figures is None else figures
    for f in figures:
        if f["id"] == figure_id:
            return f
    raise ValueError(f"unknown figure {figure_id!r}; known: {', '.join(f['id'] for f in figures)}.")


def _positive(value) -> bool:
    """A positive, finite real number (not a bool)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)


def check_figure(fig: dict, ids: set[str]) -> None:
    """Raise ``ValueError`` naming the figure and the field if ``fig`` is malformed."""
    name = fig.get("id", "?")
    for key in ("id", "system", "family", "sample", "what", "published", "source"):
        if key not in fig:
            raise ValueError(f"figure {name}: missing {key!r}.")
    if fig["what"] not in WHAT:
        raise ValueError(f"figure {name}: what={fig['what']!r}; choose one of {WHAT}.")
    if fig["sample"] not in SAMPLES:
        raise ValueError(f"figure {name}: sample={fig['sample']!r}; choose one of {SAMPLES}.")
    if not _positive(fig["published"]):
        raise ValueError(f"figure {name}: published={fig['published']!r} must be a positive, "
                         "finite number.")
    stages = fig.get("published_stages", {})
    if not (isinstance(stages, dict) and all(_positive(v) for v in stages.values())):
        raise ValueError(f"figure {name}: published_stages={stages!r} must map stages to "
                         "positive, finite seconds.")
    if fig["what"] == "speedup":
        for key in ("baseline", "target"):
            if fig.get(key) not in ids:
                raise ValueError(f"figure {name}: {key}={fig.get(key)!r} is not a figure of the file.")
    elif "setup" not in fig:
        raise ValueError(f"figure {name}: missing its 'setup'.")
    else:  # the setup's own rates (routing, transport, engine settings the source states)
        try:
            Rates.from_dict(fig["setup"].get("rates"))
        except ValueError as err:
            raise ValueError(f"figure {name}: setup.rates: {err}") from None


# ---------------------------------------------------------------------- building a scenario
_WORKLOADS: dict[str, Workload] = {}  # a workload depends on its setup only, not on the rates


def resolve(setup: dict, fitted: dict | None) -> dict:
    """``setup`` with its fitted values filled in: a ``mean_response`` given as a name is a
    workload parameter the family's calibration fitted (``fitted[name]``), the mean response
    length of runs that do not publish it.

    Raises:
        ValueError: for a name the calibration does not know.
    """
    value = setup.get("mean_response")
    if not isinstance(value, str):
        return setup
    if not fitted or value not in fitted:
        raise ValueError(f"mean_response {value!r} is a fitted workload parameter the stored "
                         "calibration does not have; run python -m rlm_course validate --calibrate.")
    return {**setup, "mean_response": fitted[value]}


def workload(setup: dict) -> Workload:
    """The figure's batch: ``prompts x group_size`` responses after ``prompt_len``-token prompts,
    log-normal lengths (``sigma``, ``group_share`` of the log-variance shared by a group) whose
    mean *after* the ``max_response`` cap is ``mean_response``
    (:meth:`~rlm_course.cost.anatomy.Workload.long_tailed`)."""
    keys = ("prompts", "group_size", "prompt_len", "mean_response", "sigma", "max_response",
            "seed", "group_share", "weight_bytes")
    key = json.dumps([setup.get(k) for k in keys])
    if key not in _WORKLOADS:
        _WORKLOADS[key] = Workload.long_tailed(
            setup["prompts"], setup["group_size"], setup["prompt_len"], setup["mean_response"],
            setup["sigma"], setup["max_response"], seed=setup.get("seed", 0),
            group_share=setup.get("group_share", 0.0), mean_after_cap=True,
            weight_bytes=setup.get("weight_bytes", 2))
    return _WORKLOADS[key]


def scenario(setup: dict, rates: Rates) -> Scenario:
    """The :class:`~rlm_course.cluster.simulator.Scenario` of a figure's ``setup`` at ``rates``
    (the setup's own ``rates`` entries, settings the source states such as ``max_batch``, on top).

    Raises:
        ValueError: for an unknown model, device, preset or mode, or inconsistent settings.
    """
    spec, device = get_spec(setup["model"]), get_device(setup["device"])
    config = algorithm(setup["algorithm"], **setup.get("algorithm_overrides", {}))
    gpus = setup["gpus"]
    placement = setup.get("placement", "colocated")
    rollout = setup.get("rollout_gpus")
    pool = gpus if placement == "colocated" else gpus - rollout
    lay = dict(setup.get("trainer", {}))
    lay.setdefault("dp", pool // (lay.get("tp", 1) * lay.get("pp", 1) * lay.get("cp", 1)))
    mode = setup.get("mode", "sync")
    mode = MODES[mode] if isinstance(mode, str) else Mode(**mode)
    return Scenario(spec, config, workload(setup), Cluster(device, gpus), placement=placement,
                    rollout_gpus=rollout, generation_tp=setup.get("generation_tp", 1),
                    trainer=Layout(**lay), mode=mode,
                    rates=Rates.from_dict(setup.get("rates"), rates),
                    offload_trainer=setup.get("offload_trainer", False),
                    engine_log_probs=setup.get("engine_log_probs", False),
                    oversample=setup.get("oversample", 1.0),
                    offload_reference=setup.get("offload_reference", False))


def sync_seconds(setup: dict, rates: Rates) -> float:
    """A weight-sync figure's seconds: :func:`rlm_course.cost.phases.weight_sync` from the
    setup's trainer to its rollout pool.

    Raises:
        ValueError: if the trainer layout's devices (tp x pp x cp x dp) are not its
            ``trainer_gpus``.
    """
    spec, device = get_spec(setup["model"]), get_device(setup["device"])
    lay = dict(setup["trainer"])
    gpus = setup["trainer_gpus"]
    lay.setdefault("dp", gpus // (lay.get("tp", 1) * lay.get("pp", 1) * lay.get("cp", 1)))
    if Layout(**lay).devices != gpus:
        raise ValueError(f"trainer layout {Layout(**lay).describe()} holds "
                         f"{Layout(**lay).devices} devices, not the setup's trainer_gpus={gpus}; "
                         "give degrees whose product is the trainer's GPUs.")
    rates = Rates.from_dict(setup.get("rates"), rates)
    tp = setup.get("generation_tp", 1)
    return weight_sync(spec, device, setup.get("placement", "disaggregated"), tp,
                       setup["rollout_gpus"] // tp, Layout(**lay), rates,
                       weight_bytes=setup.get("weight_bytes", 2)).seconds


class Predictor:
    """Predictions of figures at given rates per family (and the families' fitted workload
    parameters, ``{family: {name: value}}``), each simulation done once."""

    def __init__(self, figures: list[dict], rates: dict[str, Rates],
                 fitted: dict[str, dict] | None = None) -> None:
        if not (isinstance(rates, dict) and all(isinstance(r, Rates) for r in rates.values())):
            raise ValueError(f"Predictor: rates must be {{family: Rates}}, not a "
                             f"{type(rates).__name__}; e.g. "
                             "rlm_course.cluster.calibration.family_rates().")
        if isinstance(figures, (str, dict)) or not all(isinstance(f, dict) and "id" in f
                                                       for f in figures):
            raise ValueError("Predictor: figures must be a list of figure dicts, e.g. "
                             "rlm_course.cluster.published.load_figures().")
        self.figures = {f["id"]: f for f in figures}
        self.rates = rates
        self.fitted = fitted or {}
        self.results: dict[str, SimResult | float] = {}

    def family_rates(self, fig: dict) -> Rates:
        try:
            return self.rates[fig["family"]]
        except KeyError:
            raise ValueError(f"figure {fig['id']}: no calibrated rates for family "
                             f"{fig['family']!r}; run python -m rlm_course validate "
                             "--calibrate.") from None

    def simulated(self, fig_id: str) -> SimResult | float:
        """The simulation of a step or generation figure (its SimResult), or a sync figure's
        seconds."""
        if fig_id not in self.results:
            fig = self.figure(fig_id)
            rates = self.family_rates(fig)
            setup = resolve(fig["setup"], self.fitted.get(fig["family"]))
            if fig["what"] == "sync_seconds":
                self.results[fig_id] = sync_seconds(setup, rates)
            else:
                self.results[fig_id] = simulate(scenario(setup, rates),
                                                length_buckets=LENGTH_BUCKETS)
        return self.results[fig_id]

    def figure(self, fig_id: str) -> dict:
        """The figure ``fig_id``.

        Raises:
            ValueError: for an id that is not a figure's (the message names a close one).
        """
        if not isinstance(fig_id, str) or fig_id not in self.figures:
            from rlm_course.utils import unknown_name

            raise ValueError(f"{unknown_name('figure', fig_id, self.figures)}.")
        return self.figures[fig_id]

    def predict(self, fig: dict | str) -> float:
        """The predicted value of ``fig`` (a figure, or its id; seconds, or a speed-up)."""
        if not isinstance(fig, dict):
            fig = self.figure(fig)
        what = fig["what"]
        if what == "speedup":
            return (self.predict(self.figures[fig["baseline"]])
                    / self.predict(self.figures[fig["target"]]))
        result = self.simulated(fig["id"])
        if what == "sync_seconds":
            return result
        if what == "generation_seconds":
            return result.stages.get("generation", 0.0)
        return result.step_seconds

    def stages(self, fig: dict) -> dict[str, float]:
        """A step figure's simulated seconds under the names published breakdowns use:
        ``generation``, ``scoring``, ``update`` (policy and critic)."""
        st = self.simulated(fig["id"]).stages
        return {"generation": st.get("generation", 0.0), "scoring": st.get("scoring", 0.0),
                "update": st.get("policy update", 0.0) + st.get("critic update", 0.0)}


# ---------------------------------------------------------------------- errors and null models
def error(fig: dict, predicted: float, published: float | None = None) -> float:
    """The signed relative error the tolerance applies to: on the gain for a speed-up,
    ``(predicted - 1) / (published - 1) - 1``; on the value otherwise."""
    published = fig["published"] if published is None else published
    if fig["what"] == "speedup":
        if published == 1:
            raise ValueError(f"figure {fig.get('id', '?')}: a published speed-up of 1 has no "
                             "gain to measure an error on; give its two steps as seconds "
                             "figures instead.")
        return (predicted - 1) / (published - 1) - 1
    return predicted / published - 1


def within(fig: dict, predicted: float) -> bool:
    limit = TOLERANCE["gain" if fig["what"] == "speedup" else "seconds"]
    return math.isfinite(predicted) and abs(error(fig, predicted)) <= limit + 1e-12


def direction_error(fig: dict, predicted: float) -> bool:
    """A speed-up predicted on the other side of 1 than published."""
    return (fig["what"] == "speedup" and math.isfinite(predicted)
            and (predicted - 1) * (fig["published"] - 1) < 0)
