"""Plots of the course (matplotlib). Each function returns the figure and can save it."""

from __future__ import annotations

from pathlib import Path

import matplotlib

if matplotlib.get_backend().lower() not in ("agg",) and not matplotlib.is_interactive():
    try:  # headless CLI runs have no display; notebooks keep their inline backend
        import IPython  # noqa: F401

        if IPython.get_ipython() is None:
            matplotlib.use("Agg")
    except ImportError:
        matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STAGE_COLORS = {"generation": "#d95f02", "reward": "#e6ab02", "scoring": "#7570b3",
                "training": "#1b9e77"}


def plot_learning_curve(metrics: list[dict], path: str | Path | None = None,
                        accuracy_before: float | None = None, title: str = "GRPO"):
    """Two panels: accuracy (sampled, on training prompts; greedy, held out) and seconds per
    stage of each step."""
    steps = [m["step"] for m in metrics]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax1.plot(steps, [m["accuracy_train"] for m in metrics], alpha=0.35, color="gray",
             label="sampled (training prompts)")
    evals = [(m["step"], m["accuracy_eval"]) for m in metrics if "accuracy_eval" in m]
    if accuracy_before is not None:
        evals = [(0, accuracy_before)] + evals
    if evals:
        xs, ys = zip(*evals)
        ax1.plot(xs, ys, "o-", color="black", label="greedy, held-out")
    ax1.set(xlabel="GRPO step", ylabel="accuracy", ylim=(0, 1), title=title)
    ax1.legend(loc="upper left", fontsize=8)
    bottom = [0.0] * len(metrics)
    for stage, color in STAGE_COLORS.items():
        values = [m[f"seconds_{stage}"] for m in metrics]
        ax2.bar(steps, values, bottom=bottom, width=1.0, color=color, label=stage)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax2.set(xlabel="GRPO step", ylabel="seconds", title="time per step, by stage")
    ax2.set_ylim(0, 1.3 * max(bottom, default=1.0))
    ax2.legend(fontsize=8, ncol=4, loc="upper center")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return fig
