"""Rates calibrated once on a declared set of published figures, then used everywhere.

A **family** is one system's software on top of the hardware (verl with vLLM, NeMo-RL with vLLM
and Megatron-Core, AReaL with SGLang): what the roofline leaves out is mostly the software's, so
each family has its own :class:`~rlm_course.cost.phases.Rates`, the same on every device (the
device's own figures come from the catalog). Where the software itself runs differently on one
device, a family has a **base** (NeMo-RL on GB200 is NeMo-RL's rates, fitted on H100 runs, with
its fused-MoE decode fitted on GB200 runs): it takes the base family's fitted rates and fits only
its own free ones. ``data/published/rl_systems.json`` declares, per
family, which rates are **free** (fitted), which are **tied** to another (fitted as one), which
are **fixed** (a stated setting) and which are **borrowed**: a rate of the engine or of NCCL
rather than of the RL framework that none of the family's calibration figures exercises (verl's
calibration has no engine spanning nodes, NeMo-RL's none without CUDA graphs) takes the value
another family fitted, instead of 0 (:func:`lend`; it refuses a rate the borrower's own
calibration figures would feel); and it marks the family's **calibration** figures.
:func:`calibrate` fits the free rates on those figures only, minimising the sum of squared log
errors of every published seconds value they give (the step and, where published, its stages:
generation, scoring, update), by coordinate descent with a golden-section search per rate; the
result goes to ``data/published/rates.json`` with the command that made it
(``python -m rlm_course validate --calibrate``), the data points, the number of free
parameters and the rms log error of what it stored; :func:`rms_log_error` recomputes that error
with the model as it is, so a change to the cost model or to a figure made without fitting again
shows (:func:`stale_families`; ``validate`` warns, a test fails). Nothing else is fitted: every other figure is a prediction
(:mod:`rlm_course.cluster.validation`), and the planner plans with these rates
(:func:`calibrated_rates`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from rlm_course.cost.hardware import Device
from rlm_course.cost.phases import Rates
from rlm_course.utils import atomic_write_json, data_dir, is_real

#: The rates a family may fit: ``(low, high)`` bounds of the search, searched in log space. The
#: efficiencies stop where measured training stops: about 0.6 of peak counting recomputation
#: (Megatron-LM's 0.52 MFU on 3,072 A100s is about 0.55-0.6 HFU, arXiv:2104.04473); a fit that
#: wants more is compensating for something the model overprices.
FITTABLE = {
    "decode_step_latency": (1e-4, 0.2),
    "decode_sequence_latency": (1e-7, 1e-3),
    "eager_layer_seconds": (1e-6, 2e-3),
    "cross_node_all_reduce_seconds": (1e-6, 1e-3),
    "train_hfu": (0.02, 0.65),
    "forward_mfu": (0.02, 0.65),
    "moe_efficiency": (0.01, 1.0),
    "moe_decode_efficiency": (0.05, 1.0),
    "draft_acceptance": (0.3, 0.97),
    "decode_bandwidth": (0.05, 1.0),
    "micro_batch_seconds": (1e-4, 5.0),
    "optimizer_step_seconds": (1e-3, 60.0),
    "sync_tensor_seconds": (1e-6, 1e-2),
    "colocated_tensor_seconds": (1e-6, 1e-2),
    "sync_fixed_seconds": (1e-2, 120.0),
    "iteration_overhead": (1e-1, 600.0),
}
COMMAND = "python -m rlm_course validate --calibrate"
#: The family whose rates plan a run the user has not calibrated (NeMo-RL: vLLM and
#: Megatron-Core on H100s, the most figures), written into the rates file as its
#: ``default_family``; the file's value is the one used (:func:`default_family`).
DEFAULT_FAMILY = "nemo-rl"


def rates_path() -> Path:
    return data_dir() / "published" / "rates.json"


def load_calibration() -> dict:
    """``data/published/rates.json``: per family its fitted rates (and those it borrows, each
    the lender's value), the free parameters, the calibration figures and data points.

    Raises:
        ValueError: if the file is missing or unreadable (the message names the command that
            makes it).
    """
    path = rates_path()
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is unreadable ({err}); restore it from git or remake it with "
                         f"`{COMMAND}`.") from None
    families = data.get("families") if isinstance(data, dict) else None
    if not (isinstance(families, dict)
            and all(isinstance(e, dict) and isinstance(e.get("rates"), dict)
                    for e in families.values())):
        raise ValueError(f"{path} is not a calibration (it needs \"families\": {{family: "
                         f"{{\"rates\": {{...}}}}}}); restore it from git (git checkout -- "
                         f"data/published/rates.json) or remake it with `{COMMAND}`.")
    default = data.get("default_family", DEFAULT_FAMILY)
    if not (isinstance(default, str) and default in families):
        raise ValueError(f"{path}: \"default_family\" is {default!r}, not one of its families "
                         f"({', '.join(families) or 'none'}); name one of them, restore the file "
                         f"from git (git checkout -- data/published/rates.json) or remake it "
                         f"with `{COMMAND}`.")
    for name, entry in families.items():
        problem = _entry_problem(entry)
        loans = {} if problem else entry.get("borrowed", {})
        for rate, lender in loans.items():  # a loan is the lender's value
            if problem:
                break
            if lender not in families:
                problem = f"borrows {rate} from {lender!r}, which is not a family of the file"
            elif lender == name or rate in entry["free"] or not _fits(families[lender], rate):
                problem = (f"borrows {rate} from {lender!r}, which does not fit it (a loan comes "
                           "from another family's free or tied rates)")
            elif entry["rates"][rate] != families[lender]["rates"].get(rate,
                                                                        getattr(Rates(), rate)):
                problem = (f"holds {rate} = {entry['rates'][rate]!r} and its lender {lender} "
                           f"{families[lender]['rates'].get(rate)!r}: a loan is the lender's "
                           "value, so one of the two was edited")
        if problem:
            raise ValueError(f"{path}: family {name!r} {problem}; restore it from git (git "
                             f"checkout -- data/published/rates.json) or remake it with "
                             f"`{COMMAND}`.")
    return data


def _is_number(value) -> bool:
    return is_real(value) and math.isfinite(value)


def _entry_problem(entry: dict) -> str | None:
    """What is wrong with one family's entry of the rates file (None: nothing): the fields
    :func:`describe`, :func:`fitted_workload` and the validation read, each of its kind."""
    free, workload = entry.get("free"), entry.get("workload", {})
    if not (isinstance(free, list) and all(isinstance(k, str) for k in free)):
        return "needs \"free\": a list of the names of its fitted rates"
    missing = [k for k in free if k not in entry["rates"]]
    if missing:
        return (f"lists {', '.join(missing)} in \"free\" but has no value for "
                f"{'it' if len(missing) == 1 else 'them'} in \"rates\"")
    try:
        Rates.from_dict(entry["rates"])
    except (TypeError, ValueError) as err:
        return f"has a bad rate ({str(err).rstrip('.')})"
    if not (isinstance(workload, dict) and all(_is_number(v) for v in workload.values())):
        return "needs \"workload\" (if any): {parameter: number}"
    if not (isinstance(entry.get("calibrated_on"), list)
            and all(isinstance(f, str) for f in entry["calibrated_on"])):
        return "needs \"calibrated_on\": a list of figure ids"
    borrowed = entry.get("borrowed", {})
    if not (isinstance(borrowed, dict) and all(isinstance(k, str) and isinstance(v, str)
                                               and k in entry["rates"]
                                               for k, v in borrowed.items())):
        return (f"has \"borrowed\": {borrowed!r}; it needs {{rate: lending family}} (if any), "
                "each rate in \"rates\"")
    points = entry.get("data_points")
    if not (isinstance(points, int) and not isinstance(points, bool) and points >= 0):
        return "needs \"data_points\": a whole number"
    if not (_is_number(entry.get("rms_log_error")) and entry["rms_log_error"] >= 0):
        return "needs \"rms_log_error\": a number >= 0"
    return None


def family_rates(calibration: dict | None = None) -> dict[str, Rates]:
    """``{family: Rates}`` of the stored calibration."""
    calibration = load_calibration() if calibration is None else calibration
    return {name: Rates.from_dict(entry["rates"])
            for name, entry in calibration["families"].items()}


def fitted_workload(calibration: dict | None = None) -> dict[str, dict]:
    """``{family: {workload parameter: value}}`` of the stored calibration (e.g. the mean
    response length of runs that do not publish it)."""
    calibration = load_calibration() if calibration is None else calibration
    families = calibration["families"]
    return {name: {**families.get(entry.get("base"), {}).get("workload", {}),
                   **entry.get("workload", {})}
            for name, entry in families.items()}


def default_family(calibration: dict | None = None) -> str:
    """The family whose rates plan a run when none is named: the rates file's
    ``default_family`` (:data:`DEFAULT_FAMILY` in a file without one)."""
    calibration = load_calibration() if calibration is None else calibration
    return calibration.get("default_family", DEFAULT_FAMILY)


def device_family(device: Device | str | None, calibration: dict | None = None) -> str:
    """The family whose rates plan a run on ``device``: a family built on the default family
    (its ``base``) and declared for that device in the figures file (``"device"``: NeMo-RL on
    GB200 is ``nemo-rl-gb200``), else the default family (:func:`default_family`)."""
    from rlm_course.cluster.published import load_document

    calibration = load_calibration() if calibration is None else calibration
    default = default_family(calibration)
    name = device.name if isinstance(device, Device) else device
    for family, spec in load_document()["families"].items():
        if (isinstance(spec, dict) and name is not None and spec.get("device") == name
                and spec.get("base") == default and family in calibration["families"]):
            return family
    return default


def calibrated_rates(which: str | Device | None = None) -> Rates:
    """The calibrated rates of a family (by name), or, for a device, of the family declared for
    it (:func:`device_family`: NeMo-RL on GB200 is ``nemo-rl-gb200``), else of the rates file's
    default family (:func:`default_family`; the device's peak, memory and links come from the
    catalog).

    ``which``: a family's name (in any case), a Device, a catalog device's name (in any case),
    or None (the default family).

    Raises:
        ValueError: for an unknown family or device name (the message lists the known families),
            or an argument of another kind.
    """
    from rlm_course.cost.hardware import load_catalog

    calibration = load_calibration()
    rates = family_rates(calibration)
    if which is not None and not isinstance(which, (str, Device)):
        raise ValueError(f"calibrated_rates: which={which!r} must be a family's name (e.g. "
                         f"{default_family(calibration)!r}), a Device or None.")
    if isinstance(which, str) and which not in rates:
        same = [family for family in rates if family.lower() == which.lower()]
        devices = {key.lower(): device for key, device in load_catalog().items()}
        if same:
            which = same[0]
        elif which.lower() in devices:  # a device's name: the family declared for it
            which = devices[which.lower()]
    name = which if isinstance(which, str) else device_family(which, calibration)
    if name not in rates:
        raise ValueError(f"no calibrated rates for family {name!r} in {rates_path()}; known: "
                         f"{', '.join(rates) or 'none'}. Give a known family, or restore the file "
                         f"from git or remake it with `{COMMAND}`.")
    return rates[name]


def free_parameter_count(calibration: dict | None = None) -> int:
    """Free parameters fitted over all families (a tied pair counts once)."""
    calibration = load_calibration() if calibration is None else calibration
    return sum(len(entry["free"]) + len(entry.get("workload", {}))
               for entry in calibration["families"].values())


# ---------------------------------------------------------------------- fitting
def data_points(fig: dict) -> dict[str, float]:
    """The published seconds a calibration figure gives: its value (``step``, ``generation`` or
    ``sync``) and, for a step, its published stages (``generation``, ``scoring``, ``update``)."""
    key = {"step_seconds": "step", "generation_seconds": "generation",
           "sync_seconds": "sync"}[fig["what"]]
    points = {key: fig["published"]}
    if fig["what"] == "step_seconds":
        points.update({k: v for k, v in (fig.get("published_stages") or {}).items()
                       if k in ("generation", "scoring", "update") and v})
    return points


def _loss(figures: list[dict], rates: Rates, family: str, fitted: dict | None = None) -> float:
    from rlm_course.cluster.published import Predictor

    predictor = Predictor(figures, {family: rates}, {family: fitted or {}})
    total = 0.0
    for fig in figures:
        points = data_points(fig)
        predicted = {"step": None}
        if fig["what"] == "step_seconds":
            predicted = {"step": predictor.predict(fig), **predictor.stages(fig)}
        else:
            predicted = {next(iter(points)): predictor.predict(fig)}
        for key, published in points.items():
            value = max(predicted[key], 1e-9)
            total += math.log(value / published) ** 2
    return total


def _golden(f, lo: float, hi: float, rounds: int = 12) -> float:
    """The minimiser of a unimodal ``f`` on ``[lo, hi]`` (golden-section search)."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(rounds):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    return (a + b) / 2


def calibrate(family: str, spec: dict, figures: list[dict], sweeps: int = 2,
              progress=None, base: dict | None = None) -> dict:
    """Fit ``family``'s free rates on its calibration figures (see the module docstring).

    ``spec`` is the family's entry of the figures file: ``free`` (rates to fit), ``tied``
    (``{rate: free rate}`` fitted as one), ``fixed`` (``{rate: value}``), ``workload``
    (``{name: [low, high]}``: workload parameters the family's figures leave unpublished and
    name instead of a value, e.g. a mean response length, fitted with the rates), ``start``
    (``{rate or name: value}`` where the search begins), ``base`` (the name of the family whose
    fitted rates and workload it starts from and keeps, all but its own free rates).

    ``base``: that family's calibration (what this function returned for it), required when
    ``spec`` names one.

    Returns:
        ``{"rates": {rate: value} (the non-default ones), "free": [...], "tied": {...},
        "workload": {name: value}, "calibrated_on": [figure ids], "data_points": n,
        "rms_log_error": x}``, and ``"base": name`` for a family with a base.

    Raises:
        ValueError: for an unknown rate, no calibration figure, fewer data points than free
            parameters, or a base family that is not given.
    """
    free, tied = list(spec.get("free", [])), dict(spec.get("tied", {}))
    bounds = {**FITTABLE, **{k: tuple(v) for k, v in spec.get("workload", {}).items()}}
    names = free + list(spec.get("workload", {}))
    for name in free + list(tied):
        if name not in FITTABLE:
            raise ValueError(f"family {family}: {name!r} is not a rate that can be fitted; "
                             f"choose among {', '.join(FITTABLE)}.")
    mine = [f for f in figures if f["family"] == family and f["sample"] == "calibration"]
    if not mine:
        raise ValueError(f"family {family}: no calibration figure; mark one sample='calibration'.")
    points = sum(len(data_points(f)) for f in mine)
    if points < len(names):
        raise ValueError(f"family {family}: {len(names)} free parameters but only {points} "
                         "published values to fit them on; declare more calibration figures or "
                         "fix rates.")
    if spec.get("base") is not None and base is None:
        raise ValueError(f"family {family}: its base family {spec['base']!r} must be calibrated "
                         "first; pass its calibration as base.")
    inherited = dict(base["rates"]) if base is not None else {}
    inherited_workload = dict(base.get("workload", {})) if base is not None else {}
    workload_names = set(spec.get("workload", {}))
    values = {**inherited, **spec.get("fixed", {}), **spec.get("start", {})}

    def rates_of(values: dict) -> Rates:
        full = {k: v for k, v in values.items() if k not in workload_names}
        for name, source in tied.items():
            full[name] = full[source]
        return Rates.from_dict(full)

    def loss_of(values: dict) -> float:
        return _loss(mine, rates_of(values), family,
                     {**inherited_workload, **{k: values[k] for k in workload_names}})

    for name in names:
        values.setdefault(name, getattr(Rates(), name, None) or bounds[name][0])
    best = loss_of(values)
    for sweep in range(sweeps):
        for name in names:
            lo, hi = bounds[name]

            def f(log_x: float) -> float:
                return loss_of({**values, name: math.exp(log_x)})

            x = math.exp(_golden(f, math.log(lo), math.log(hi)))
            loss = loss_of({**values, name: x})
            if loss < best:
                values[name], best = x, loss
            if progress:
                progress(f"{family}: sweep {sweep + 1}/{sweeps}, {name} = {values[name]:.4g}, "
                         f"rms log error {math.sqrt(best / points):.3f}")
    final = rates_of(values)
    default = Rates()
    stored = {k: v for k, v in final.to_dict().items() if v != getattr(default, k)}
    workload = {k: round(values[k], 1) for k in sorted(workload_names)}
    # the error of what is stored (the workload rounded as written), so that the file describes
    # itself exactly and rms_log_error() can tell when the model has moved since
    error = _loss(mine, final, family, {**inherited_workload, **workload})
    out = {"rates": stored, "free": free, "tied": tied, "workload": workload,
           "calibrated_on": [f["id"] for f in mine], "data_points": points,
           "rms_log_error": math.sqrt(error / points)}
    if base is not None:
        out["base"] = spec["base"]
    return out


def rms_log_error(family: str, calibration: dict | None = None) -> float:
    """The rms log error that ``family``'s stored rates and fitted workload give **now** on its
    calibration figures. Equal to the stored ``rms_log_error`` while the cost model, the figures
    and the rates are those the calibration was made with; a change to any of them (a new term in
    the simulator, an edited setup) moves it, and the stored rates were then fitted to another
    model: remake them with ``python -m rlm_course validate --calibrate``.

    Raises:
        ValueError: for a family the calibration does not hold.
    """
    from rlm_course.cluster.published import load_document

    calibration = load_calibration() if calibration is None else calibration
    if family not in calibration["families"]:
        raise ValueError(f"no calibrated family {family!r}; known: "
                         f"{', '.join(calibration['families'])}.")
    entry = calibration["families"][family]
    by_id = {f["id"]: f for f in load_document()["figures"]}
    missing = [i for i in entry["calibrated_on"] if i not in by_id]
    if missing:
        raise ValueError(f"calibration figure(s) {', '.join(missing)} of {family} are not in the "
                         f"figures file any more; remake the rates with `{COMMAND}`.")
    figures = [by_id[i] for i in entry["calibrated_on"]]
    points = sum(len(data_points(f)) for f in figures)
    loss = _loss(figures, family_rates(calibration)[family], family,
                 fitted_workload(calibration)[family])
    return math.sqrt(loss / points)


def stale_families(calibration: dict | None = None, rel: float = 1e-6) -> dict[str, tuple]:
    """``{family: (stored, now)}`` for every family whose stored rms log error is not what its
    rates give now (:func:`rms_log_error`): the model or the figures changed after the rates
    were fitted."""
    calibration = load_calibration() if calibration is None else calibration
    out = {}
    for name, entry in calibration["families"].items():
        now, stored = rms_log_error(name, calibration), entry["rms_log_error"]
        if not math.isclose(now, stored, rel_tol=rel):
            out[name] = (stored, now)
    return out


def check_families(doc: dict) -> None:
    """Check the ``families`` of the figures file before anything is fitted: each an object whose
    ``free`` is a list of rate names, whose ``tied``, ``fixed``, ``start``, ``workload`` and
    ``borrowed`` are objects (``tied`` and ``borrowed`` naming rates and families, ``workload``
    bounds ``[low, high]``), whose ``base`` (if any) names another family.

    Raises:
        ValueError: naming the family, the field, its value and the form to write.
    """
    families = doc.get("families") if isinstance(doc, dict) else None
    if not (isinstance(families, dict) and families):
        raise ValueError(f"the figures file's \"families\" is {families!r}; write an object "
                         "{name: {\"free\": [...], ...}}.")
    for name, spec in families.items():
        if not isinstance(spec, dict):
            raise ValueError(f"family {name}: its entry is {spec!r}; write an object with "
                             "\"free\": [rates] (and \"tied\", \"fixed\", \"start\", "
                             "\"workload\", \"borrowed\", \"base\" as needed).")
        free = spec.get("free", [])
        if not (isinstance(free, list) and all(isinstance(r, str) for r in free)):
            raise ValueError(f"family {name}: \"free\" is {free!r}; write a list of rate "
                             "names, e.g. [\"decode_step_latency\"].")
        forms = {"tied": "{rate: free rate}", "fixed": "{rate: value}",
                 "start": "{rate or workload name: value}", "workload": "{name: [low, high]}",
                 "borrowed": "{rate: lending family}"}
        for key, form in forms.items():
            value = spec.get(key, {})
            if not isinstance(value, dict):
                raise ValueError(f"family {name}: \"{key}\" is {value!r}; write an object "
                                 f"{form}.")
        for key in ("tied", "borrowed"):
            bad = {k: v for k, v in spec.get(key, {}).items() if not isinstance(v, str)}
            if bad:
                raise ValueError(f"family {name}: \"{key}\" has {bad!r}; each value names a "
                                 f"{'rate' if key == 'tied' else 'family'}.")
        for bound_name, bounds in spec.get("workload", {}).items():
            if not (isinstance(bounds, list) and len(bounds) == 2
                    and all(_is_number(b) for b in bounds) and 0 < bounds[0] < bounds[1]):
                raise ValueError(f"family {name}: workload bounds {bound_name!r}: {bounds!r}; "
                                 "write [low, high] with 0 < low < high, e.g. [300, 6000].")
        base = spec.get("base")
        if base is not None and not (isinstance(base, str) and base in families
                                     and base != name):
            raise ValueError(f"family {name}: \"base\" is {base!r}; name another family of "
                             f"the file ({', '.join(n for n in families if n != name)}).")


def _fits(entry: dict, rate: str) -> bool:
    """Whether a family fits ``rate`` (among its ``free`` or ``tied`` rates), by its entry in
    the figures file or in the rates file (both write them alike)."""
    return rate in entry.get("free", []) or rate in entry.get("tied", {})


def fitting_family(family: str, rate: str, calibration: dict | None = None) -> str | None:
    """The family that fitted ``rate`` for ``family`` in the rates file: itself, or the base it
    inherits the rate from (an entry lists its own ``free`` and ``tied`` rates and names its
    ``base``); None if none did (the rate is :class:`~rlm_course.cost.phases.Rates`'s default
    or borrowed)."""
    families = (load_calibration() if calibration is None else calibration)["families"]
    seen = set()
    while family in families and family not in seen:
        seen.add(family)
        if _fits(families[family], rate):
            return family
        family = families[family].get("base")
    return None


def _own_rates(spec: dict) -> set[str]:
    """The rates a family's figures-file entry fits, ties or fixes itself."""
    tied = spec.get("tied", {})
    return set(spec.get("free", [])) | set(tied) | set(tied.values()) | set(spec.get("fixed", {}))


def declared_loans(doc: dict, name: str) -> dict[str, str]:
    """``{rate: lender}`` that family ``name`` borrows by the figures file (checked by
    :func:`check_families`): its own ``borrowed`` over its base's, less the rates it fits, ties
    or fixes itself (:func:`_own_rates`)."""
    specs = doc["families"]
    chain = [name]
    while specs[chain[-1]].get("base") is not None:
        base = specs[chain[-1]]["base"]
        if base not in specs or base in chain:
            raise ValueError(f"family {chain[-1]}: its base {base!r} is not another family of "
                             "the figures file, or the bases form a cycle.")
        chain.append(base)
    fits = _own_rates(specs[name])
    wanted: dict[str, str] = {}
    for member in reversed(chain):  # the family's own entries over its base's
        for rate, lender in specs[member].get("borrowed", {}).items():
            if member == name or rate not in fits:  # a family's own fit beats its base's loan
                wanted[rate] = lender
    return wanted


def stale_loans(calibration: dict | None = None, doc: dict | None = None) -> dict[str, tuple]:
    """``{family: (declared, stored)}`` for every family whose loans in the figures file
    (:func:`declared_loans`) are not those its rates file holds: the file was edited after the
    rates were made."""
    from rlm_course.cluster.published import load_document

    calibration = load_calibration() if calibration is None else calibration
    doc = load_document() if doc is None else doc
    check_families(doc)
    out = {}
    for name, entry in calibration["families"].items():
        declared = declared_loans(doc, name) if name in doc["families"] else {}
        if declared != entry.get("borrowed", {}):
            out[name] = (declared, entry.get("borrowed", {}))
    return out


def lend(families: dict[str, dict], doc: dict) -> None:
    """Give each family the rates it borrows (its figures-file entry's ``borrowed``: ``{rate:
    lending family}``, and those of its base family, unless it fits the rate itself): the
    lender's fitted value, written into the borrower's ``rates`` with ``"borrowed": {rate:
    lender}`` beside them. The check that the borrower's calibration figures do not feel a rate
    reads the figures from the figures file (:func:`rms_log_error`), one rate at a time.

    Args:
        families: ``{family: calibration}`` as :func:`calibrate` returned them; changed in place.
        doc: the figures file (:func:`rlm_course.cluster.published.load_document`): its
            ``families`` declare what each borrows.

    Raises:
        ValueError: for a ``borrowed`` entry that is not ``{rate: family}``, a family or base the
            figures file does not declare (or a cycle of bases), a lender that does not fit the
            rate (it is not among its ``free`` or ``tied`` rates), a rate the borrower fits,
            ties or fixes itself, or a rate one of the borrower's calibration figures exercises
            (its rms log error moves with the rate: fit it there instead).
    """
    check_families(doc)
    specs = doc["families"]
    for name in list(families):
        if name not in specs:
            raise ValueError(f"family {name} is calibrated but the figures file does not declare "
                             "it; remake the rates with `" + COMMAND + "`.")
        fits = _own_rates(specs[name])
        wanted = declared_loans(doc, name)
        for rate, lender in wanted.items():
            if rate not in FITTABLE:
                raise ValueError(f"family {name} borrows {rate!r}, which is not a rate a family "
                                 f"fits; choose among {', '.join(FITTABLE)}.")
            if lender not in families or not isinstance(specs.get(lender), dict):
                raise ValueError(f"family {name} borrows {rate} from {lender!r}, which is not a "
                                 f"family of the figures file ({', '.join(families)}).")
            if lender == name or not _fits(specs[lender], rate):
                raise ValueError(f"family {name} borrows {rate} from {lender!r}, which does not "
                                 f"fit it; name a family whose \"free\" (or \"tied\") rates list "
                                 f"{rate}.")
            if rate in fits:
                raise ValueError(f"family {name} both fits (free, tied or fixed) and borrows "
                                 f"{rate}; keep one.")
        if not wanted:
            continue
        entry = families[name]
        value = {r: families[l]["rates"].get(r, getattr(Rates(), r)) for r, l in wanted.items()}
        for rate in wanted:  # one at a time, at both ends of the rate's range: felt or not
            low, high = ({**entry, "rates": {**entry["rates"], rate: bound}}
                         for bound in FITTABLE[rate])
            at_low = rms_log_error(name, {"families": {**families, name: low}})
            at_high = rms_log_error(name, {"families": {**families, name: high}})
            if not math.isclose(at_low, at_high, rel_tol=1e-9):
                raise ValueError(f"family {name}: its calibration figures exercise the borrowed "
                                 f"rate {rate} (rms log error {at_low:.4f} at {FITTABLE[rate][0]:g}, "
                                 f"{at_high:.4f} at {FITTABLE[rate][1]:g}); make it free and fit it "
                                 "instead.")
        families[name] = {**entry, "rates": {**entry["rates"], **value}, "borrowed": dict(wanted)}


def calibrate_all(progress=None) -> dict:
    """Calibrate every family of the figures file, give each the rates it borrows
    (:func:`lend`) and write ``data/published/rates.json``.

    Returns:
        the written document.
    """
    from rlm_course.cluster.published import load_document

    doc = load_document()
    check_families(doc)  # before minutes of fitting
    families: dict[str, dict] = {}
    pending = dict(doc["families"])
    while pending:  # a base family before the families built on it
        ready = [n for n, spec in pending.items()
                 if spec.get("base") is None or spec["base"] in families]
        if not ready:
            raise ValueError(f"families {', '.join(pending)}: each \"base\" must name another "
                             "family of the figures file, without a cycle.")
        for name in ready:
            spec = pending.pop(name)
            families[name] = calibrate(name, spec, doc["figures"], progress=progress,
                                       base=families.get(spec.get("base")))
    families = {name: families[name] for name in doc["families"]}
    lend(families, doc)
    out = {"about": "Rates per family of RL systems, fitted once on the calibration figures of "
                    "data/published/rl_systems.json (rlm_course.cluster.calibration); every other "
                    "figure is predicted with them, and the planner plans with them.",
           "command": COMMAND, "default_family": DEFAULT_FAMILY, "families": families}
    atomic_write_json(rates_path(), out)
    return out


def describe(calibration: dict | None = None) -> str:
    """One line per family: its fitted rates, data points and free parameters, and the rates it
    borrows."""
    calibration = load_calibration() if calibration is None else calibration
    lines = []
    for name, entry in calibration["families"].items():
        fitted = ", ".join([f"{k} {entry['rates'][k]:.3g}" for k in entry["free"]
                            if k in entry["rates"]]
                           + [f"{k} {v:,.0f}" for k, v in entry.get("workload", {}).items()])
        count = len(entry["free"]) + len(entry.get("workload", {}))
        borrowed = "".join(f"; {k} {entry['rates'][k]:.3g} borrowed from {lender}"
                           for k, lender in (entry.get("borrowed") or {}).items())
        lines.append(f"{name}: {fitted} ({count} free on {entry['data_points']} "
                     f"published values of {len(entry['calibrated_on'])} figures, rms log error "
                     f"{entry['rms_log_error']:.3f}){borrowed}")
    if any(entry.get("borrowed") for entry in calibration["families"].values()):
        lines.append("(borrowed: a rate of the engine or of NCCL that none of the family's "
                     "calibration figures exercises, taken from the family that fits it; not "
                     "counted among the free parameters; why: \"borrowed_why\" in "
                     "data/published/rl_systems.json)")
    return "\n".join(lines)
