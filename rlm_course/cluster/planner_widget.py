"""The planner (:mod:`rlm_course.cluster.planner`) in ipywidgets: choose a model, a device, a
cluster size, an algorithm and a workload, press **Plan**, and read the best plans and why the
others lose (the text ``python -m rlm_course plan`` prints).

Every control can be set from code (``w.controls["gpus"].value = 128``) and :meth:`PlannerWidget.run`
plans without the button; a setting that makes no sense (0 GPUs, a GPU count no layout fits, a
mean response longer than its budget) shows the planner's error message, never a traceback and
never a silently corrected value; when no layout fits, the message gives the smallest GPU count
that does (:func:`~rlm_course.cluster.planner.smallest_fitting_gpus`). Planning a large cluster
takes seconds to a minute, hence the button rather than a live update: once a control changes
after a plan, the answer on screen is greyed and marked stale (:data:`STALE`) until Plan is
pressed again.
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from rlm_course.cost.anatomy import Workload
from rlm_course.cost.architectures import SPECS, get_spec
from rlm_course.cost.hardware import get_device, load_catalog
from rlm_course.algorithms import PRESETS
from rlm_course.cluster.planner import Plan, check_group, check_settings, format_plan, plan
from rlm_course.cluster.simulator import algorithm

#: What an answer whose settings have changed since it was planned starts with.
STALE = "settings changed: press Plan to update"


class PlannerWidget:
    """Controls, a **Plan** button and the planner's answer.

    Attributes:
        controls: ``{name: widget}``; ``widget``: the whole front-end; ``result``: the latest
            :class:`~rlm_course.cluster.planner.Plan` (None after an error); ``message``: the
            error shown, or ``""``; ``output``: the HTML on screen; ``stale``: True once a
            control has changed since the answer on screen was made (it is then greyed and
            starts with :data:`STALE`).
    """

    def __init__(self) -> None:
        style = {"description_width": "9em"}
        box = widgets.Layout(width="21em")

        def dropdown(options, value, desc):
            return widgets.Dropdown(options=options, value=value, description=desc, style=style,
                                    layout=box)

        def number(value, desc, kind=widgets.IntText):
            # unbounded: a value out of range reaches run(), which says what is wrong with it
            # (a bounded box would silently clamp 0 GPUs to 1)
            return kind(value=value, description=desc, style=style, layout=box)

        accelerators = [d for d in load_catalog() if d != "this-machine"]
        self.controls = {
            "model": dropdown(list(SPECS), "llama-3.1-70b", "model"),
            "device": dropdown(accelerators, "H100-SXM-80GB", "device"),
            "gpus": number(64, "GPUs"),
            "algorithm": dropdown(list(PRESETS), "grpo", "algorithm"),
            "minibatches": number(16, "minibatches"),
            "prompts": number(256, "prompts"),
            "group_size": number(16, "group size"),
            "prompt_len": number(512, "prompt tokens"),
            "mean_response": number(4000.0, "mean response", widgets.FloatText),
            "sigma": number(0.8, "length sigma", widgets.FloatText),
            "max_response": number(16384, "max response"),
            "top": number(4, "plans shown"),
        }
        self.button = widgets.Button(description="Plan", button_style="primary")
        self.button.on_click(lambda _: self.run())
        self.html = widgets.HTML()
        self.result: Plan | None = None
        self.message = ""
        self.output = ""
        self.stale = False
        for control in self.controls.values():
            control.observe(self._changed, names="value")
        left = widgets.VBox([self.controls[k] for k in ("model", "device", "gpus", "algorithm",
                                                        "minibatches", "top")])
        right = widgets.VBox([self.controls[k] for k in ("prompts", "group_size", "prompt_len",
                                                         "mean_response", "sigma", "max_response")])
        self.widget = widgets.VBox([widgets.HBox([left, right]), self.button, self.html])

    def _changed(self, change) -> None:
        """A control changed: an answer on screen no longer matches the settings."""
        if self.output and not self.stale:
            self.stale = True
            self.output = (f"<div style='color:#888'><p><b>{STALE}</b></p>"
                           f"<div style='opacity:0.5'>{self.output}</div></div>")
            self.html.value = self.output

    def run(self) -> Plan | None:
        """Plan with the current settings; show the answer (or the error) and return it."""
        v = {k: c.value for k, c in self.controls.items()}
        labels = {k: c.description for k, c in self.controls.items()}
        try:
            check_settings(v, lambda key: labels[key], get_spec(v["model"]).max_context)
            check_group(v["algorithm"], v["group_size"], lambda key: labels[key])
            get_spec(v["model"]).check_context(v["prompt_len"], v["max_response"],
                                               lambda key: labels[key])
            workload = Workload.long_tailed(v["prompts"], v["group_size"], v["prompt_len"],
                                            v["mean_response"], v["sigma"], v["max_response"])
            result = plan(get_spec(v["model"]),
                          algorithm(v["algorithm"], minibatches=v["minibatches"],
                                    group_size=v["group_size"]), workload,
                          get_device(v["device"]), v["gpus"])
        except ValueError as err:
            self.result, self.message = None, str(err)
            self.output = f"<p style='color:#b00'>{html.escape(self.message)}</p>"
        else:
            self.result, self.message = result, ""
            self.output = f"<pre>{html.escape(format_plan(result, v['top']))}</pre>"
        self.stale = False
        self.html.value = self.output
        return self.result
