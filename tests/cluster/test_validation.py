"""The simulator against real runs and published figures.

(a) The course's own GRPO and PPO iterations on this machine, with rates measured by
micro-benchmarks interleaved with them (rlm_course.cluster.realrun): the record's structure and
the simulation's stages; the 20% bound on seconds is a benchmark (`python -m rlm_course bench
realrun`), since a busy machine disturbs a timing.
(b) The published figures of data/published/rl_systems.json and the rates calibrated on them
(data/published/rates.json): every figure well formed, the calibration declared and stored, the
predictions made without refitting, the tolerances and null models computed as documented."""

import dataclasses
import json
import math

import pytest
import torch

from rlm_course.cluster import calibration, published, validation
from rlm_course.cluster.realrun import check_real_run, course_run_record
from rlm_course.cost.hardware import get_device
from rlm_course.cost.phases import Rates

DOC = published.load_document()
FIGURES = DOC["figures"]
BY_ID = {f["id"]: f for f in FIGURES}


@pytest.mark.slow
def test_a_course_run_record_is_simulated_stage_by_stage():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the measured run and its micro-benchmarks on one thread alike
    try:
        record = course_run_record("grpo", rounds=2)
    finally:
        torch.set_num_threads(threads)
    rows = check_real_run(record, tolerance=0.2)
    assert {r["stage"] for r in rows} == {"generation", "scoring", "training"}
    for r in rows:
        assert r["predicted"] > 0 and r["measured"] > 0
        assert r["ratio"] == pytest.approx(r["predicted"] / r["measured"])
        assert r["ok"] == (abs(r["ratio"] - 1) <= 0.2)
    json.dumps(record)  # a record is plain data: a multi-process run can write one to disk


def test_a_real_run_record_with_a_wrong_stage_is_flagged():
    record = {"model": {"spec": "llama-3-8b"}, "device": "H100-SXM-80GB", "gpus": 8,
              "algorithm": {"preset": "grpo", "minibatches": 2},
              "workload": {"prompts": 16, "group_size": 8, "prompt_len": 128, "response_len": 256},
              "trainer": {"dp": 8, "zero": 3}, "rates": {"intra_link": [3.4e-6, 450e9]},
              "measured": {"generation": 1e-3}}
    rows = check_real_run(record)
    assert rows[0]["stage"] == "generation" and not rows[0]["ok"] and rows[0]["ratio"] > 10
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        check_real_run({**record, "mode": "fast"})
    with pytest.raises(ValueError, match="unknown rate"):
        check_real_run({**record, "rates": {"decode_speed": 1.0}})


def test_every_figure_names_its_source_setup_and_assumptions():
    ids = set(BY_ID)
    assert len(ids) == len(FIGURES) >= 24  # no duplicate ids
    for fig in FIGURES:
        published.check_figure(fig, ids)
        assert fig["source"] and fig["assumptions"], fig["id"]
        assert fig["family"] in DOC["families"], fig["id"]
        if fig["what"] != "speedup":
            assert fig["verbatim"], fig["id"]
    predictions = [f for f in FIGURES if f["sample"] == "prediction"]
    assert len(predictions) >= len(FIGURES) / 2
    # a speed-up is the ratio of two figures of the file
    for fig in FIGURES:
        if fig["what"] == "speedup":
            base, target = BY_ID[fig["baseline"]], BY_ID[fig["target"]]
            assert fig["published"] == pytest.approx(base["published"] / target["published"],
                                                     rel=1e-3)
    assert all(item["why"] for item in DOC["excluded"])
    with pytest.raises(ValueError, match="what="):
        published.check_figure({**FIGURES[0], "what": "vibes"}, ids)
    with pytest.raises(ValueError, match="baseline"):
        published.check_figure({**FIGURES[0], "what": "speedup", "baseline": "nowhere"}, ids)
    # a setup's own rates are checked where the figure is, and the error names it
    first = FIGURES[0]
    bad = {**first, "setup": {**first["setup"], "rates": {"routing": "Sample"}}}
    with pytest.raises(ValueError, match=f"figure {first['id']}: setup.rates: Rates.routing="
                                         "'Sample': choose one of"):
        published.check_figure(bad, ids)


def test_every_step_figure_says_how_its_samples_reach_the_engines():
    # NeMo-RL's asynchronous GRPO refuses to start without its asynchronous engine ("Async GRPO
    # requires ... async_engine=true", nemo_rl/algorithms/grpo.py), which serves one sample a
    # call, each to the next engine; verl's fully-async trainer runs only on its agent loop.
    # Every step figure of both families names its routing and says why in its assumptions.
    for fig in FIGURES:
        setup = fig.get("setup", {})
        if fig["what"] != "step_seconds" or not fig["family"].startswith(("nemo-rl", "verl")):
            continue
        routing = setup["rates"]["routing"]
        assert f"routing {routing})" in fig["assumptions"], fig["id"]
        mode = setup.get("mode")
        asynchronous = isinstance(mode, dict) and mode.get("staleness", 0) > 0
        if fig["family"].startswith("nemo-rl") and asynchronous:
            assert routing == "sample", fig["id"]
        if fig["id"].startswith("verl-fa-") and fig["setup"].get("placement") == "disaggregated":
            assert routing == "sample", fig["id"]


def test_the_stored_calibration_is_the_declared_one():
    stored = calibration.load_calibration()
    assert stored["command"] == "python -m rlm_course validate --calibrate"
    assert set(stored["families"]) == set(DOC["families"])
    for name, spec in DOC["families"].items():
        entry = stored["families"][name]
        declared = sorted(f["id"] for f in FIGURES
                          if f["family"] == name and f["sample"] == "calibration")
        assert sorted(entry["calibrated_on"]) == declared
        assert entry["free"] == spec["free"] and entry["tied"] == spec.get("tied", {})
        assert set(entry["workload"]) == set(spec.get("workload", {}))
        assert entry["data_points"] == sum(len(calibration.data_points(BY_ID[i]))
                                           for i in declared)
        assert entry["data_points"] >= len(entry["free"]) + len(entry["workload"])
        rates = calibration.family_rates(stored)[name]
        for rate, value in spec.get("fixed", {}).items():
            assert getattr(rates, rate) == value
        for rate, source in spec.get("tied", {}).items():
            assert getattr(rates, rate) == getattr(rates, source)
        if spec.get("base"):  # the base's fitted rates and workload, all but its own free rates
            assert entry["base"] == spec["base"]
            base = calibration.family_rates(stored)[spec["base"]]
            own = set(spec["free"]) | set(spec.get("tied", {})) | set(spec.get("fixed", {}))
            for field in dataclasses.fields(Rates):
                if field.name not in own:
                    assert getattr(rates, field.name) == getattr(base, field.name), field.name
            assert calibration.fitted_workload(stored)[name] == {
                **calibration.fitted_workload(stored)[spec["base"]], **entry["workload"]}
    assert calibration.free_parameter_count(stored) == sum(
        len(s["free"]) + len(s.get("workload", {})) for s in DOC["families"].values())
    assert isinstance(calibration.calibrated_rates(None), Rates)
    with pytest.raises(ValueError, match="no calibrated rates for family"):
        calibration.calibrated_rates("deepspeed-chat")
    with pytest.raises(ValueError, match="base family 'nemo-rl' must be calibrated first"):
        calibration.calibrate("nemo-rl-gb200", DOC["families"]["nemo-rl-gb200"], FIGURES)


def test_a_rate_no_calibration_figure_exercises_is_borrowed_from_the_family_that_fits_it(
        tmp_path, monkeypatch):
    # verl's engines never span nodes and NeMo-RL's always capture CUDA graphs: each takes the
    # other's fitted value for the rate its own figures cannot see (not 0), the GB200 family
    # what its base borrows; and the premise is checked, not assumed
    stored = calibration.load_calibration()
    rates = calibration.family_rates(stored)
    fams = stored["families"]
    assert fams["verl"]["borrowed"] == {"cross_node_all_reduce_seconds": "nemo-rl"}
    assert rates["verl"].cross_node_all_reduce_seconds == \
        rates["nemo-rl"].cross_node_all_reduce_seconds > 0
    for name in ("nemo-rl", "nemo-rl-gb200"):
        assert fams[name]["borrowed"] == {"eager_layer_seconds": "verl"}
        assert rates[name].eager_layer_seconds == rates["verl"].eager_layer_seconds > 0
    assert "borrowed from nemo-rl" in calibration.describe(stored)
    plain = json.loads(json.dumps(fams))
    for entry in plain.values():  # as fitted, before lending
        for rate in entry.pop("borrowed", {}):
            del entry["rates"][rate]
    doc = json.loads(json.dumps(DOC))
    doc["families"]["verl"]["borrowed"] = {"decode_step_latency": "nemo-rl"}
    with pytest.raises(ValueError, match="both fits .* and borrows decode_step_latency"):
        calibration.lend(json.loads(json.dumps(plain)), doc)
    doc["families"]["verl"]["borrowed"] = {"cross_node_all_reduce_seconds": "nemo-rl"}
    doc["families"]["nemo-rl"]["borrowed"] = {"decode_sequence_latency": "verl"}
    with pytest.raises(ValueError, match="calibration figures exercise the borrowed"):
        calibration.lend(json.loads(json.dumps(plain)), doc)
    doc["families"]["nemo-rl"]["borrowed"] = {"eager_layer_seconds": "verl"}
    doc["families"]["verl"]["borrowed"] = {"micro_batch_seconds": "nemo-rl"}
    with pytest.raises(ValueError, match="does not fit it"):
        calibration.lend(json.loads(json.dumps(plain)), doc)
    doc["families"]["verl"]["borrowed"] = {"eager_layer_seconds": "nemo-rl"}
    with pytest.raises(ValueError, match="does not fit it"):  # nemo-rl borrows it itself
        calibration.lend(json.loads(json.dumps(plain)), doc)
    doc["families"]["verl"]["borrowed"] = ["cross_node_all_reduce_seconds", "nemo-rl"]
    with pytest.raises(ValueError, match="rate: lending family"):
        calibration.lend(json.loads(json.dumps(plain)), doc)
    doc = json.loads(json.dumps(DOC))  # a rate fixed by the borrower is not lent over it
    doc["families"]["verl"]["fixed"] = {"cross_node_all_reduce_seconds": 1e-5}
    with pytest.raises(ValueError, match="both fits .* and borrows cross_node"):
        calibration.lend(json.loads(json.dumps(plain)), doc)
    doc = json.loads(json.dumps(DOC))  # a base family's loan gives way to the family's own fit
    doc["families"]["nemo-rl-gb200"]["free"] = ["moe_decode_efficiency", "eager_layer_seconds"]
    fitted = json.loads(json.dumps(plain))
    fitted["nemo-rl-gb200"]["rates"]["eager_layer_seconds"] = 1e-3
    calibration.lend(fitted, doc)
    assert fitted["nemo-rl-gb200"]["rates"]["eager_layer_seconds"] == 1e-3
    assert "borrowed" not in fitted["nemo-rl-gb200"]
    doc = json.loads(json.dumps(DOC))
    doc["families"]["nemo-rl-gb200"]["base"] = "deepspeed-chat"
    with pytest.raises(ValueError, match="name another family of the file"):
        calibration.lend(json.loads(json.dumps(plain)), doc)
    # a rate the borrower already holds (from its base) is still tested at both ends of its
    # range: GB200's decode step latency is felt by its figures, so it cannot be borrowed
    doc = json.loads(json.dumps(DOC))
    doc["families"]["nemo-rl-gb200"]["borrowed"] = {"decode_step_latency": "nemo-rl"}
    with pytest.raises(ValueError, match="exercise the borrowed rate decode_step_latency"):
        calibration.lend(json.loads(json.dumps(plain)), doc)
    doc["families"]["nemo-rl-gb200"]["borrowed"] = {"bogus_rate": "nemo-rl"}
    with pytest.raises(ValueError, match="'bogus_rate', which is not a rate"):
        calibration.lend(json.loads(json.dumps(plain)), doc)
    doc["families"]["nemo-rl-gb200"]["borrowed"] = {"train_hfu": "deepspeed-chat"}
    with pytest.raises(ValueError, match="'deepspeed-chat', which is not a family"):
        calibration.lend(json.loads(json.dumps(plain)), doc)
    # the figures file and the rates file agree on the loans; an edit of one shows
    assert calibration.stale_loans(stored, DOC) == {}
    assert calibration.stale_loans(stored, doc) == {
        "nemo-rl-gb200": ({"eager_layer_seconds": "verl", "train_hfu": "deepspeed-chat"},
                          {"eager_layer_seconds": "verl"})}
    doc = json.loads(json.dumps(DOC))
    lent = json.loads(json.dumps(plain))
    calibration.lend(lent, doc)
    assert lent == fams
    # a stored loan that is not the lender's value is refused on loading
    bad = json.loads(json.dumps(stored))
    bad["families"]["verl"]["rates"]["cross_node_all_reduce_seconds"] = 9e-4
    path = tmp_path / "rates.json"
    path.write_text(json.dumps(bad))
    monkeypatch.setattr(calibration, "rates_path", lambda: path)
    with pytest.raises(ValueError, match="its lender nemo-rl .*one of the two was edited"):
        calibration.load_calibration()
    bad = json.loads(json.dumps(stored))  # a loan from a family that does not fit the rate
    bad["families"]["nemo-rl-gb200"]["borrowed"] = {"eager_layer_seconds": "nemo-rl"}
    bad["families"]["nemo-rl-gb200"]["rates"]["eager_layer_seconds"] = \
        bad["families"]["nemo-rl"]["rates"]["eager_layer_seconds"]
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="which does not fit it"):
        calibration.load_calibration()


def test_the_figures_files_families_are_checked_before_any_fitting():
    for edit, message in ((lambda f: f.update({"nemo-rl-gb200": ["x"]}), "write an object with"),
                          (lambda f: f["verl"].update({"free": "decode_step_latency"}),
                           "write a list of rate"),
                          (lambda f: f["verl"].update({"tied": ["a"]}), "{rate: free rate}"),
                          (lambda f: f["verl"]["workload"].update(
                              {"verl-dapo-7b-mean-response": 300}), r"\[low, high\]"),
                          (lambda f: f["nemo-rl-gb200"].update({"base": ["nemo-rl"]}),
                           "name another family"),
                          (lambda f: f["verl"].update({"borrowed": {"train_hfu": 3}}),
                           "each value names a family")):
        doc = json.loads(json.dumps(DOC))
        edit(doc["families"])
        with pytest.raises(ValueError, match=message):
            calibration.check_families(doc)
    with pytest.raises(ValueError, match="families"):
        calibration.check_families({"families": ["verl"]})
    calibration.check_families(DOC)


def test_a_device_plans_with_the_family_declared_for_it():
    # NeMo-RL on GB200 plans with the GB200 family (its MoE decode fitted on GB200 runs), any
    # other device with the default family
    assert calibration.device_family(get_device("GB200-NVL72-186GB")) == "nemo-rl-gb200"
    assert calibration.device_family(get_device("H100-SXM-80GB")) == "nemo-rl"
    assert calibration.calibrated_rates(get_device("GB200-NVL72-186GB")) == \
        calibration.calibrated_rates("nemo-rl-gb200")


def test_the_stored_rates_are_the_models_fit():
    # The stored rms log error is what the stored rates give now: the simulator, the figures and
    # the rates have not moved apart since `python -m rlm_course validate --calibrate` wrote them.
    # A change to the cost model or to a calibration figure's setup fails here until the rates
    # are remade; predictions with rates fitted to another model would not be out of sample of
    # anything.
    stored = calibration.load_calibration()
    assert calibration.stale_families(stored) == {}, (
        "the cost model or the figures changed after the rates were fitted: run "
        "`python -m rlm_course validate --calibrate` and commit data/published/rates.json")
    entry = stored["families"]["nemo-rl"]
    assert calibration.rms_log_error("nemo-rl", stored) == pytest.approx(entry["rms_log_error"],
                                                                         rel=1e-9)
    # a rate moved by hand (or a model that moved) is caught, for that family only
    moved = json.loads(json.dumps(stored))
    moved["families"]["nemo-rl"]["rates"]["decode_step_latency"] *= 2
    now = calibration.rms_log_error("nemo-rl", moved)
    assert now > 1.5 * entry["rms_log_error"]
    gone = json.loads(json.dumps(stored))
    gone["families"]["verl"]["calibrated_on"].append("no-such-figure")
    with pytest.raises(ValueError, match="no-such-figure of verl are not in the figures file any "
                                         "more; remake the rates with `python -m rlm_course "
                                         "validate --calibrate`"):
        calibration.rms_log_error("verl", gone)
    with pytest.raises(ValueError, match="no calibrated family 'areal'; known: verl, nemo-rl"):
        calibration.rms_log_error("areal", stored)


def test_tolerances_null_models_and_direction_errors():
    seconds = {"what": "step_seconds", "published": 100.0}
    assert published.within(seconds, 129.0) and not published.within(seconds, 131.0)
    assert not published.within(seconds, math.nan)
    gain = {"what": "speedup", "published": 2.0}
    assert published.error(gain, 1.8) == pytest.approx(-0.2)  # a gain of 0.8 against 1.0
    assert published.within(gain, 1.76) and not published.within(gain, 1.7)
    assert published.direction_error(gain, 0.95) and not published.direction_error(gain, 1.05)
    # the null model of a speed-up whose baseline publishes its stages: perfect overlap
    fig = BY_ID["verl-fa-7b-speedup-32"]
    stages = BY_ID[fig["baseline"]]["published_stages"]
    g, t = stages["generation"], stages["scoring"] + stages["update"]
    assert validation.null_model(fig, BY_ID, None) == pytest.approx((g + t) / max(g, t))


def test_predictions_without_refitting():
    """A handful of figures across kinds, predicted with the stored rates: the simulator is run
    with the family's rates and fitted workload, never re-calibrated (the full table is notebook
    14's and `python -m rlm_course validate`'s)."""
    ids = ["verl-ckptengine-qwen3-235b-a22b-64x64-off", "nemo-rl-refit-nccl-reshard-h100-qwen330b-bf16",
           "nemo-rl-v0.6-h100-bf16-grpo-qwen3-235b-onpolicy-256"]
    figures = [BY_ID[i] for i in ids]
    before = calibration.load_calibration()
    rows = validation.validation_table(figures=figures)
    assert calibration.load_calibration() == before  # predicting never rewrites the rates
    for row, fig in zip(rows, figures):
        assert row["sample"] == "prediction" and row["published"] == fig["published"]
        assert math.isfinite(row["predicted"]) and row["predicted"] > 0
        assert row["error"] == pytest.approx(row["predicted"] / fig["published"] - 1)
    result = validation.summary(rows)
    assert result["out_of_sample_total"] == 3
    assert result["free_parameters"] == calibration.free_parameter_count()


def test_the_validate_command_ends_with_its_counts_as_json(capsys, monkeypatch):
    from rlm_course.cli import main

    subset = [BY_ID[i] for i in ("verl-ckptengine-qwen3-30b-a3b-16x16-off",
                                 "verl-ckptengine-qwen3-235b-a22b-64x64-off")]
    monkeypatch.setattr(validation, "load_figures", lambda: subset)
    # (whether the stored rates are the model's fit is test_the_stored_rates_are_the_models_fit's)
    monkeypatch.setattr(calibration, "stale_families", lambda: {"verl": (0.19, 0.25)})
    monkeypatch.setattr(calibration, "stale_loans",
                        lambda: {"verl": ({}, {"cross_node_all_reduce_seconds": "nemo-rl"})})
    assert main(["validate"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert ("warning: verl's rates no longer give the error they were fitted with (rms log error "
            "0.1900 stored, 0.2500 now)") in "\n".join(lines)
    assert ("warning: verl borrows nothing by the figures file but "
            "{'cross_node_all_reduce_seconds': 'nemo-rl'} in the rates file") in "\n".join(lines)
    assert "remake the rates with `python -m rlm_course validate --calibrate`" in "\n".join(lines)
    result = json.loads(lines[-1])
    assert {"out_of_sample_hits", "out_of_sample_total", "free_parameters",
            "direction_errors"} <= set(result)
    assert result["out_of_sample_total"] == 1 and result["in_sample_total"] == 1
    assert any(line.startswith("verl:") for line in lines)  # the families' fitted rates
    assert any("null model" in line for line in lines)
    # the free parameters beside the published values they are fitted on (a figure can publish
    # a step and its stages): 22 parameters on 21 figures read as more parameters than data
    points = sum(e["data_points"] for e in calibration.load_calibration()["families"].values())
    assert points > calibration.free_parameter_count()
    assert (f"{calibration.free_parameter_count()} free parameters fitted on {points} published "
            "values of 1 calibration figure (a figure") in lines[-2]


def test_implied_update_hfu_is_the_update_flops_over_what_the_devices_could_do():
    from rlm_course.cost.architectures import get_spec, teacher_forced_flops
    from rlm_course.cost.hardware import get_device

    fitted = calibration.fitted_workload()
    fig = BY_ID["verl-fa-7b-colocate-32"]
    setup = published.resolve(fig["setup"], fitted["verl"])
    work = published.workload(setup)
    spec, device = get_spec(setup["model"]), get_device(setup["device"])
    # DAPO, one epoch, recomputation: forward + backward + the recomputed forward, 4x a forward
    flops = 4 * sum(teacher_forced_flops(spec, setup["prompt_len"] + t, 1) for t in work.lengths)
    expected = flops / (fig["published_stages"]["update"] * 32 * device.peak_flops)
    hfu = validation.implied_update_hfu(fig, fitted)
    assert hfu == pytest.approx(expected, rel=1e-9) and 0.3 < hfu < 1  # a colocated run: plausible
    # half the devices in the same time imply twice the efficiency; twice the time, half of it
    async16 = BY_ID["verl-fa-7b-fullyasync-16-16"]
    ratio = validation.implied_update_hfu(async16, fitted) / hfu
    assert ratio == pytest.approx(32 / 16 * fig["published_stages"]["update"]
                                  / async16["published_stages"]["update"], rel=1e-9)
    nemo = BY_ID["nemo-rl-v0.6-h100-bf16-grpo-deepseekv3-onpolicy-256"]
    assert validation.implied_update_hfu(nemo, fitted) is None  # no update time published
    assert validation.implied_update_hfu(BY_ID["verl-fa-7b-speedup-32"], fitted) is None


def test_the_misses_are_listed_once_per_reason_with_every_figure_it_explains():
    def row(fid, within, reason=""):
        return {"id": fid, "sample": "prediction", "what": "step_seconds", "published": 10.0,
                "predicted": 10.0 if within else 20.0, "null": None,
                "error": 0.0 if within else 1.0,
                "null_error": None, "within": within, "direction_error": False, "reason": reason}

    text = validation.format_validation([row("a", False, "same cause"), row("b", True),
                                         row("c", False, "same cause"), row("d", False)])
    misses = text.split("misses, by reason:\n")[1].splitlines()
    assert misses == [" - a, c: same cause", " - d: no reason recorded"]
    assert "misses" not in validation.format_validation([row("b", True)])
    # the tolerance the "within" column applies is said under the table
    assert ("within tolerance: |error| <= 30% on seconds, <= 25% on a speed-up's gain "
            "(speed-up - 1)") in text.splitlines()


def test_implied_update_hfu_refuses_a_figure_it_cannot_read():
    import copy

    fitted = calibration.fitted_workload()
    base = BY_ID["verl-fa-7b-colocate-32"]
    for update in (-1, 0, float("nan"), float("inf"), True, "12"):
        fig = copy.deepcopy(base)
        fig["published_stages"]["update"] = update
        with pytest.raises(ValueError, match="published_stages=.* positive, finite seconds"):
            validation.implied_update_hfu(fig, fitted)
    for key in ("what", "family", "published"):
        fig = {k: v for k, v in base.items() if k != key}
        with pytest.raises(ValueError, match=f"figure verl-fa-7b-colocate-32: missing '{key}'"):
            validation.implied_update_hfu(fig, fitted)
    with pytest.raises(ValueError, match="missing its 'setup'"):
        validation.implied_update_hfu({k: v for k, v in base.items() if k != "setup"}, fitted)
    for bad in (None, [], "verl-fa-7b-colocate-32"):
        with pytest.raises(ValueError, match="must be a figure of data/published"):
            validation.implied_update_hfu(bad, fitted)
    with pytest.raises(ValueError, match="fitted=\\[\\] must map families"):
        validation.implied_update_hfu(base, [])
    with pytest.raises(ValueError, match="family 'nope' has no fitted workload parameters"):
        validation.implied_update_hfu({**base, "family": "nope"}, fitted)
    with pytest.raises(ValueError, match="malformed setup"):
        validation.implied_update_hfu({**base, "setup": {**base["setup"], "gpus": "32"}}, fitted)


def test_a_rates_file_of_the_wrong_shape_says_how_to_restore_it(tmp_path, monkeypatch):
    for text in ("{}", "[]", '{"families": {"verl": 3}}'):
        path = tmp_path / "rates.json"
        path.write_text(text)
        monkeypatch.setattr(calibration, "rates_path", lambda: path)
        with pytest.raises(ValueError, match="is not a calibration .* restore it from git"):
            calibration.calibrated_rates("verl")
    monkeypatch.undo()
    stored = json.loads(calibration.rates_path().read_text())
    verl = stored["families"]["verl"]
    for change, message in (({"free": "abc"}, '"free": a list of the names'),
                            ({"free": ["no_such_rate"]},
                             'lists no_such_rate in "free" but has no value for it in "rates"'),
                            ({"rates": {k: v for k, v in verl["rates"].items()
                                        if k != "train_hfu"}},
                             'lists train_hfu in "free" but has no value for it in "rates"'),
                            ({"rates": {**verl["rates"], "train_hfu": "abc"}},
                             "has a bad rate .Rates.train_hfu='abc' must be a number"),
                            ({"rates": {**verl["rates"], "train_hfu": float("nan")}},
                             "has a bad rate .Rates.train_hfu=nan must be a fraction"),
                            ({"rates": {**verl["rates"], "bogus_rate": 1.0}},
                             "has a bad rate .unknown rate.s. bogus_rate"),
                            ({"workload": [1]}, '"workload"'),
                            ({"workload": {"mean_response": "long"}}, '"workload"'),
                            ({"calibrated_on": None}, '"calibrated_on"'),
                            ({"data_points": 2.5}, '"data_points"'),
                            ({"rms_log_error": "x"}, '"rms_log_error"')):
        path = tmp_path / "rates.json"
        path.write_text(json.dumps({**stored, "families": {**stored["families"],
                                                           "verl": {**verl, **change}}}))
        monkeypatch.setattr(calibration, "rates_path", lambda: path)
        message = message if message.startswith(("lists", "has")) else f"needs {message}"
        with pytest.raises(ValueError, match=f"family 'verl' {message}.* restore it"):
            calibration.describe()
        with pytest.raises(ValueError, match=f"rates.json: family 'verl' {message}"):
            calibration.calibrated_rates("nemo-rl")  # the file is refused whole
    path.write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(ValueError, match="rates.json is unreadable .*utf-8.* restore it from git"):
        calibration.load_calibration()
    with pytest.raises(ValueError, match="no calibrated rates for family 'nope' in .*rates.json; "
                                         "known: verl, nemo-rl|known: nemo-rl, verl"):
        monkeypatch.undo()
        calibration.calibrated_rates("nope")


def test_the_rates_files_default_family_plans_a_run_that_names_none(tmp_path, monkeypatch):
    stored = json.loads(calibration.rates_path().read_text())
    assert calibration.default_family() == stored["default_family"] == "nemo-rl"
    path = tmp_path / "rates.json"
    monkeypatch.setattr(calibration, "rates_path", lambda: path)
    path.write_text(json.dumps({**stored, "default_family": "verl"}))
    verl = calibration.calibrated_rates("verl")
    assert calibration.default_family() == "verl"
    assert calibration.calibrated_rates(None) == verl
    assert calibration.calibrated_rates(get_device("H100-SXM-80GB")) == verl
    assert verl != calibration.calibrated_rates("nemo-rl")
    # a file without the field falls back to the constant
    path.write_text(json.dumps({k: v for k, v in stored.items() if k != "default_family"}))
    assert calibration.default_family() == calibration.DEFAULT_FAMILY
    for bad in ("nope", 3, None):
        path.write_text(json.dumps({**stored, "default_family": bad}))
        with pytest.raises(ValueError, match=f"\"default_family\" is {bad!r}, not one of its "
                                             "families .* restore the file from git"):
            calibration.calibrated_rates(None)


def test_a_sync_figures_data_parallel_degree_counts_context_parallelism():
    """64 trainer GPUs at tp 4 x pp 4 x cp 2 hold 2 data-parallel ranks, not 4 (the sync
    priced a 128-device trainer); degrees that do not make the trainer's GPUs are refused."""
    from rlm_course.cluster.calibration import family_rates
    from rlm_course.cluster.published import sync_seconds

    rates = family_rates()["nemo-rl"]
    base = {"model": "qwen3-235b-a22b", "device": "H100-SXM-80GB", "trainer_gpus": 64,
            "rollout_gpus": 64, "generation_tp": 32, "placement": "disaggregated",
            "rates": {"sync_transport": "broadcast"}}
    lay = {"tp": 4, "pp": 4, "cp": 2, "ep": 16, "zero": 1}
    derived = sync_seconds({**base, "trainer": lay}, rates)
    assert derived == sync_seconds({**base, "trainer": {**lay, "dp": 2}}, rates)
    with pytest.raises(ValueError, match="holds 128 devices, not the setup's trainer_gpus=64"):
        sync_seconds({**base, "trainer": {**lay, "dp": 4}}, rates)


def test_every_nemo_rl_table_row_agrees_with_its_setup():
    # NeMo-RL's performance tables (v0.4-v0.7) give, per row: the GPUs, the samples a step
    # generates (G-GBS) and trains per optimizer step (T-GBS), the generation TP, the training
    # [TP, CP, EP, PP], the mean generated length and the step; each figure's setup says the same
    rows = [f for f in FIGURES if f["family"].startswith("nemo-rl") and f["what"] == "step_seconds"
            and f["verbatim"].lstrip().startswith("|")]
    assert len(rows) >= 60
    number = lambda cell: float(cell.replace(",", ""))  # noqa: E731
    mismatched = []
    for fig in rows:
        cells = [c.strip() for c in fig["verbatim"].strip().strip("|").split("|")]
        if cells[0] in ("GRPO", "DAPO"):  # v0.5 on name the algorithm first
            assert cells[0].lower() == fig["setup"]["algorithm"], fig["id"]
            cells = cells[1:]
        _, _, max_len, mean, gpus, g_gbs, t_gbs, gen, train, _, step = cells[:11]
        setup, trainer = fig["setup"], fig["setup"]["trainer"]
        assert fig["published"] == number(step), fig["id"]
        assert setup["gpus"] == number(gpus), fig["id"]
        assert setup["mean_response"] == number(mean), fig["id"]
        assert setup["prompts"] * setup["group_size"] == number(g_gbs), fig["id"]
        assert setup["algorithm_overrides"]["minibatches"] == number(g_gbs) // number(t_gbs), \
            fig["id"]
        assert setup["max_response"] + setup["prompt_len"] == number(max_len), fig["id"]
        assert gen == f"[{setup['generation_tp']},1]", fig["id"]
        # v0.7's DeepSeek-V3 recipes generate with its multi-token-prediction draft, one token
        # ahead (speculative_config: deepseek_mtp, num_speculative_tokens 1); no other row drafts
        drafts = setup["rates"].get("speculative_tokens", 0)
        if fig["id"].startswith("nemo-rl-v0.7-") and setup["model"] == "deepseek-v3":
            assert drafts == 1 and "deepseek_mtp" in fig["assumptions"], fig["id"]
        else:
            assert drafts == 0, fig["id"]
        layout = train.strip("[]").split(",")
        if len(layout) == 5 and [int(x) for x in layout[:4]] != [trainer.get(k, 1) for k in
                                                                 ("tp", "cp", "ep", "pp")]:
            # a table's layout that its recipe contradicts: the setup follows the recipe, and
            # the assumptions quote the table's layout and say why
            assert f"table prints the training layout {train}" in fig["assumptions"], fig["id"]
            mismatched.append(fig["id"])
    # training at the family's rate but where the trainer lacks a fusion its calibration runs
    # have: v0.3's and v0.4's Qwen3 rows, built by NeMo's and Megatron-Bridge's Qwen3 configs with
    # bias_activation_fusion off (NeMo-RL sets it on from v0.5: PR #1241, "~25% speedup"); FP8
    # rows train at twice the bf16 peak
    old = [f for f in FIGURES if f["system"] in ("NeMo-RL v0.3", "NeMo-RL v0.4")
           and f["what"] == "step_seconds"]
    assert len(old) == 14  # v0.3's blog: 4 rows, v0.4's table: 10
    for fig in rows + [f for f in old if f not in rows]:
        factor = fig["setup"].get("rates", {}).get("train_flops_factor", 1.0)
        if fig in old and fig["setup"]["model"].startswith("qwen3"):
            assert factor == 0.8 and "bias_activation_fusion" in fig["assumptions"], fig["id"]
        else:
            assert factor == (2.0 if "-fp8-" in fig["id"] else 1.0), fig["id"]
    # v0.6's DeepSeek-V3 rows on 512 H100s and 256 GB200s repeat the 256/128-GPU rows' layout
    # (v0.7's table gives EP 32, as the recipes set); its GB200 Qwen3-30B-A3B one-step-off row
    # puts EP 16 on an 8-GPU trainer
    assert sorted(mismatched) == ["nemo-rl-v0.6-gb200-bf16-grpo-deepseekv3-onpolicy-256",
                                  "nemo-rl-v0.6-gb200-bf16-grpo-qwen3-30b3a-1stepoff-16",
                                  "nemo-rl-v0.6-h100-bf16-grpo-deepseekv3-onpolicy-512"]


def test_each_nemo_rl_refit_uses_the_transport_its_version_ran():
    # up to v0.7.0 NeMo-RL's non-colocated refit was broadcast_weights_for_collective ->
    # packed_broadcast_producer(src=0): rank 0's whole tensors packed into buckets; the
    # shard-to-shard nccl_reshard refit came after v0.7.0 (e40aa046e, 2026-07-28)
    nemo = [f for f in FIGURES if f["family"].startswith("nemo-rl")]
    async_rows = [f for f in nemo if f["what"] == "step_seconds"
                  and f["setup"].get("placement") == "disaggregated"]
    assert len(async_rows) == 35
    for fig in async_rows + [BY_ID["nemo-rl-refit-nccl-broadcast-dsv3-bf16"]]:
        assert fig["setup"]["rates"]["sync_transport"] == "packed", fig["id"]
    reshard = [f for f in nemo if f["system"] == "NeMo-RL (nccl_reshard refit)"]
    assert len(reshard) == 5 and all(f["setup"]["rates"]["sync_transport"] == "sharded"
                                     for f in reshard)
    # v0.3.0's refit gathered over TP before its pipeline broadcast (gather_params); later
    # versions export with Megatron-Bridge, which broadcasts each rank's shard
    whole = {f["id"] for f in FIGURES
             if f.get("setup", {}).get("rates", {}).get("sync_pipeline_whole")}
    assert whole == {f["id"] for f in nemo if f["system"].startswith("NeMo-RL v0.3")}
    assert len(whole) == 5


def test_rates_and_figures_are_found_in_any_case_and_bad_ones_refused_by_name():
    gb200 = get_device("GB200-NVL72-186GB")
    # a family in any case, a device by its name as by its Device (the family declared for it)
    assert calibration.calibrated_rates("VERL") == calibration.calibrated_rates("verl")
    assert calibration.calibrated_rates("gb200-nvl72-186gb") == \
        calibration.calibrated_rates(gb200) == calibration.calibrated_rates("nemo-rl-gb200")
    with pytest.raises(ValueError, match=r"which=5 must be a family's name \(e.g. 'nemo-rl'\)"):
        calibration.calibrated_rates(5)
    predictor = published.Predictor(published.load_figures(), calibration.family_rates(),
                                    calibration.fitted_workload())
    with pytest.raises(ValueError, match="unknown figure 'verl-oso-7b-fsdp2-colocate' "
                                         r"\(did you mean 'verl-oso-7b-fsdp2-colocate-sync'\?\)"):
        predictor.predict("verl-oso-7b-fsdp2-colocate")
    with pytest.raises(ValueError, match="unknown figure 'bogus'"):
        predictor.simulated("bogus")
    # a figure by its id is the figure
    fig = predictor.figure("verl-oso-fsdp2-speedup")
    assert predictor.predict("verl-oso-fsdp2-speedup") == predictor.predict(fig)
    with pytest.raises(ValueError, match=r"rates must be \{family: Rates\}, not a Rates"):
        published.Predictor(published.load_figures(), calibration.calibrated_rates("verl"))
    with pytest.raises(ValueError, match="a published speed-up of 1 has no gain"):
        published.error({"id": "x", "what": "speedup", "published": 1.0}, 1.2)
