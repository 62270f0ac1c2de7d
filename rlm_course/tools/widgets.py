"""Widget calculators (ipywidgets) over the tested pure functions of :mod:`rlm_course.cost.anatomy`,
:mod:`rlm_course.cost.workdepth`, :mod:`rlm_course.cost.architectures` and :mod:`rlm_course.cost.hardware`.

``RLStepCalculator().widget`` shows, for a model, an algorithm, a workload and a cluster, the
per-stage FLOPs, bytes, roofline time and shares of one iteration, its memory, and its work,
depth and parallelism. Every control can also be set from code (``calc.controls["devices"].value
= 8``); a setting that makes no sense shows its error message in the widget, never a traceback.
The architecture boxes show the selected model's sizes and can be edited only for ``custom``.
"""

from __future__ import annotations

import base64
import html
import io

import ipywidgets as widgets

from rlm_course.cost.anatomy import Workload, iteration_report
from rlm_course.cost.architectures import SPECS, TransformerSpec, from_model_config
from rlm_course.cost.hardware import get_device, load_catalog
from rlm_course.algorithms import PRESETS, preset

CUSTOM = "custom"
MAX_DEVICES = 100_000  # the calculator's largest cluster
#: The architecture boxes: a TransformerSpec's sizes, editable for a custom model only.
ARCHITECTURE_BOXES = ("n_layer", "d_model", "n_head", "n_kv_head", "d_ff")


def _fmt(x: float) -> str:
    for unit, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.3g}"


class RLStepCalculator:
    """The anatomy and work-depth calculator of one RL iteration.

    Attributes:
        controls: ``{name: widget}``; ``widget``: the whole calculator; ``result``: the latest
            report of :func:`rlm_course.cost.anatomy.iteration_report` (None after an error);
        message: the error shown, or ``""``.
    """

    def __init__(self) -> None:
        from rlm_course.lm.tokenizer import CharTokenizer
        from rlm_course.rl.sft import default_model_config

        self.tiny = from_model_config(default_model_config(CharTokenizer()))
        int_box = lambda value, desc: widgets.BoundedIntText(  # noqa: E731
            value=value, min=-10**9, max=10**12, description=desc,
            style={"description_width": "8.5em"}, layout=widgets.Layout(width="19em"))
        dropdown = lambda options, value, desc: widgets.Dropdown(  # noqa: E731
            options=options, value=value, description=desc,
            style={"description_width": "8.5em"}, layout=widgets.Layout(width="19em"))
        self.controls = {
            "model": dropdown(["tiny", *SPECS, CUSTOM], "llama-3-8b", "model"),
            "n_layer": int_box(32, "layers"),
            "d_model": int_box(4096, "width"),
            "n_head": int_box(32, "heads"),
            "n_kv_head": int_box(8, "KV heads"),
            "d_ff": int_box(14336, "MLP width"),
            "algorithm": dropdown(list(PRESETS), "grpo", "algorithm"),
            "prompts": int_box(512, "prompts"),
            "group_size": int_box(16, "group size"),
            "minibatches": int_box(16, "gradient steps"),
            "prompt_len": int_box(512, "prompt tokens"),
            "response_len": int_box(2048, "response tokens"),
            "device": dropdown(list(load_catalog()), "H100-SXM-80GB", "device"),
            "devices": int_box(64, "devices"),
            "generation_tp": int_box(1, "generation TP"),
        }
        self.status = widgets.HTML()
        self.table = widgets.HTML()
        self.plot = widgets.HTML()
        self.result: dict | None = None
        self.message = ""
        self._showing_model = False
        for control in self.controls.values():
            control.observe(self._update, names="value")
        self._show_model_sizes()
        left = widgets.VBox([self.controls[k] for k in ("model", "n_layer", "d_model", "n_head",
                                                        "n_kv_head", "d_ff")])
        right = widgets.VBox([self.controls[k] for k in ("algorithm", "prompts", "group_size",
                                                         "minibatches", "prompt_len",
                                                         "response_len", "device", "devices",
                                                         "generation_tp")])
        self.widget = widgets.VBox([widgets.HBox([left, right]), self.status,
                                    widgets.HBox([self.table, self.plot])])
        self._update()

    def settings(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def spec(self) -> TransformerSpec:
        s = self.settings()
        if s["model"] == "tiny":
            return self.tiny
        if s["model"] != CUSTOM:
            return SPECS[s["model"]]
        return TransformerSpec("custom", n_layer=s["n_layer"], d_model=s["d_model"],
                               n_head=s["n_head"], n_kv_head=s["n_kv_head"], d_ff=s["d_ff"],
                               vocab_size=128256)

    def compute(self) -> dict:
        """The report for the current settings (raises ValueError for a bad one, naming the
        control by its label)."""
        s = self.settings()
        for name in ("prompts", "group_size", "minibatches", "prompt_len", "response_len",
                     "devices", "generation_tp"):
            if s[name] < 1:
                raise ValueError(f"{self.controls[name].description} {s[name]}: give 1 or more.")
        if s["devices"] > MAX_DEVICES:
            raise ValueError(f"devices {s['devices']:,}: the calculator prices clusters of up to "
                             f"{MAX_DEVICES:,} devices (the largest built hold about that many).")
        if s["devices"] % s["generation_tp"]:
            near = max(t for t in range(1, s["generation_tp"]) if s["devices"] % t == 0)
            raise ValueError(f"generation TP {s['generation_tp']} must divide devices "
                             f"{s['devices']} (whole replicas): e.g. generation TP {near}.")
        if s["minibatches"] > s["prompts"] * s["group_size"]:
            raise ValueError(f"gradient steps {s['minibatches']:,}: at most one per response, so at "
                             f"most prompts x group size = {s['prompts'] * s['group_size']:,}.")
        group, steps = s["group_size"], s["minibatches"]
        # the algorithm's parts and gradient steps; the sizes live in the workload (no laptop
        # batch limit here; the work-depth model checks that the steps divide the batch)
        config = preset(s["algorithm"], group_size=group, prompts_per_step=max(steps, 1),
                        minibatches=steps)
        workload = Workload(s["prompts"], group, s["prompt_len"], s["response_len"])
        spec = self.spec()
        if spec.learned_positions and workload.seq_len > spec.learned_positions:
            raise ValueError(f"the {spec.name} model has {spec.learned_positions} positions; "
                             f"prompt + response = {workload.seq_len} tokens do not fit: keep "
                             f"prompt tokens + response tokens at most {spec.learned_positions} "
                             "(e.g. 8 and 16, the course's addition task).")
        labels = {"prompt_len": "prompt tokens", "max_response": "response tokens"}
        spec.check_context(s["prompt_len"], s["response_len"], labels.get)
        return iteration_report(spec, config, workload, get_device(s["device"]), s["devices"],
                                s["generation_tp"])

    def _show_model_sizes(self) -> None:
        """Fill the architecture boxes with the selected model's sizes; only ``custom`` may edit
        them (a 70B model must not appear to have the 8B model's 32 layers)."""
        custom = self.controls["model"].value == CUSTOM
        self._showing_model = True
        try:
            if not custom:
                spec = self.spec()
                for name in ARCHITECTURE_BOXES:
                    self.controls[name].value = spec.kv_heads if name == "n_kv_head" else getattr(
                        spec, name)
            for name in ARCHITECTURE_BOXES:
                self.controls[name].disabled = not custom
        finally:
            self._showing_model = False

    def _update(self, change=None) -> None:
        if self._showing_model:
            return
        if change is not None and change.get("owner") is self.controls["model"]:
            self._show_model_sizes()
        try:
            self.result = self.compute()
            self.message = ""
        except ValueError as err:
            self.result, self.message = None, str(err)
            self.status.value = f"<b style='color:#b00020'>{html.escape(self.message)}</b>"
            self.table.value = self.plot.value = ""
            return
        r = self.result
        waves = ("" if r["decode_waves"] == 1 else
                 f" Each replica decodes in <b>{r['decode_waves']} waves</b>: the KV caches of all "
                 "its sequences do not fit beside its weights.")
        self.status.value = (
            f"one iteration: <b>{r['seconds']:.1f} s</b> (roofline bound).{waves} Work W = "
            f"{_fmt(r['work'])}FLOP, depth D = {_fmt(r['depth'])} operations, parallelism W/D = "
            f"{_fmt(r['parallelism'])}; generation alone: D = {_fmt(r['generation_depth'])} "
            f"({r['generation_depth'] / r['depth']:.0%} of the depth). Brent: with p processors "
            "at most W/p + D steps, a speedup of at most "
            + ", ".join(f"{r['work'] / (r['work'] / p + r['depth']):.3g} at p = {p:.0e}"
                        for p in (1e6, 1e9, 1e12)) + ".")
        cell = "style='padding:2px 10px;text-align:right'"
        rows = "".join(
            f"<tr><td style='padding:2px 10px'>{s}</td><td {cell}>{_fmt(v['flops'])}FLOP</td>"
            f"<td {cell}>{_fmt(v['bytes'])}B</td><td {cell}>{v['intensity']:.1f}</td>"
            f"<td {cell}>{v['seconds']:.2f}</td><td {cell}>{r['flop_shares'][s]:.0%}</td>"
            f"<td {cell}>{r['time_shares'][s]:.0%}</td></tr>"
            for s, v in r["stages"].items())
        memory = ", ".join(f"{k} {_fmt(v)}B" for k, v in r["memory"].items())
        head = "".join(f"<th {cell}>{h}</th>" for h in ("stage", "FLOPs", "bytes", "FLOP/B", "s",
                                                         "FLOP share", "time share"))
        self.table.value = (
            f"<table style='border-collapse:collapse'><tr>{head}</tr>{rows}</table>"
            f"<p>memory (whole job): {html.escape(memory)}</p>")
        self.plot.value = _shares_png(r)


def _shares_png(report: dict) -> str:
    """An ``<img>`` of each stage's share of FLOPs and of time (a PNG inside the HTML widget, so
    that it needs no Output widget)."""
    from matplotlib.figure import Figure  # no pyplot: the notebook's backend stays as it is

    stages = list(report["stages"])
    fig = Figure(figsize=(4.2, 2.4))
    ax = fig.subplots()
    x = range(len(stages))
    ax.bar([i - 0.2 for i in x], [report["flop_shares"][s] for s in stages], 0.4, label="FLOPs")
    ax.bar([i + 0.2 for i in x], [report["time_shares"][s] for s in stages], 0.4, label="time")
    ax.set_xticks(list(x), [s.replace(" update", "\nupdate") for s in stages], fontsize=7)
    ax.set_ylabel("share of the iteration", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    return f"<img src='data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}'/>"
