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

def _finish(fig, path):
    """Lay out ``fig``; save and close it when ``path`` is given (a CLI run), else return it."""
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return fig


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
    ax1.set(xlabel="step", ylabel="accuracy", ylim=(0, 1), title=title)
    ax1.legend(loc="upper left", fontsize=8)
    bottom = [0.0] * len(metrics)
    for stage, color in STAGE_COLORS.items():
        values = [m[f"seconds_{stage}"] for m in metrics]
        ax2.bar(steps, values, bottom=bottom, width=1.0, color=color, label=stage)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax2.set(xlabel="step", ylabel="seconds", title="time per step, by stage")
    ax2.set_ylim(0, 1.3 * max(bottom, default=1.0))
    ax2.legend(fontsize=8, ncol=4, loc="upper center")
    return _finish(fig, path)


def plot_eval_curves(curves: dict[str, list[list[tuple[int, float]]]], path: str | Path | None = None,
                     title: str = "held-out greedy accuracy"):
    """One line per algorithm: the mean over seeds of ``(step, accuracy)`` curves, with the range
    over seeds shaded. ``curves``: ``{name: [curve of seed 0, curve of seed 1, ...]}``."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, runs in curves.items():
        steps = [s for s, _ in runs[0]]
        values = [[a for _, a in run] for run in runs]
        mean = [sum(col) / len(col) for col in zip(*values)]
        line, = ax.plot(steps, mean, "o-", ms=3, label=f"{name} ({len(runs)} seeds)")
        if len(runs) > 1:
            ax.fill_between(steps, [min(c) for c in zip(*values)], [max(c) for c in zip(*values)],
                            color=line.get_color(), alpha=0.12)
    ax.set(xlabel="step", ylabel="accuracy", title=title, ylim=(0, 1))
    ax.legend(fontsize=8, ncol=2)
    return _finish(fig, path)


def plot_stage_seconds(stage_seconds: dict[str, dict[str, float]], path: str | Path | None = None,
                       title: str = "seconds per step, by stage"):
    """Stacked horizontal bars: ``{name: {stage: seconds per step}}``."""
    names = list(stage_seconds)
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(names) + 1.2))
    left = [0.0] * len(names)
    for stage, color in STAGE_COLORS.items():
        values = [stage_seconds[n].get(stage, 0.0) for n in names]
        ax.barh(names, values, left=left, color=color, label=stage)
        left = [a + b for a, b in zip(left, values)]
    ax.invert_yaxis()
    ax.set(xlabel="seconds per step", title=title)
    ax.legend(fontsize=8, ncol=4, loc="lower right")
    return _finish(fig, path)
