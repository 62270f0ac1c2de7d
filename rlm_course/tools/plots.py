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


def finish_figure(fig, path):
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
    return finish_figure(fig, path)


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
    return finish_figure(fig, path)


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
    return finish_figure(fig, path)


COMM_COLORS = {"all-reduce": "#e7298a", "reduce-scatter": "#66a61e", "all-gather": "#1f78b4",
               "all-to-all": "#a6761d", "broadcast": "#666666", "send": "#e6ab02", "ring": "#e6ab02"}


def plot_rank_timeline(events, path: str | Path | None = None, title: str = "timeline per rank"):
    """Gantt chart of a simulated world's :class:`rlm_course.timeline.Event` s: one row per rank,
    compute in green, each collective in its own colour, labelled by name."""
    ranks = sorted({e.worker for e in events})
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(ranks) + 1.2))
    seen = set()
    for e in events:
        if e.stage == "compute":
            color, label = STAGE_COLORS["training"], "compute"
        else:
            key = next((k for k in COMM_COLORS if e.name.startswith(k)), "send")
            color, label = COMM_COLORS[key], e.name
        ax.barh(e.worker, e.end - e.start, left=e.start, color=color, edgecolor="white",
                label=None if label in seen else label)
        seen.add(label)
    ax.set(yticks=ranks, yticklabels=[f"rank {r}" for r in ranks], xlabel="seconds", title=title)
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return finish_figure(fig, path)


def plot_pipeline(timeline, path: str | Path | None = None, title: str = "pipeline schedule"):
    """Gantt chart of a :class:`rlm_course.parallel.pipeline.Timeline`: forwards light, backwards
    dark, each labelled with its micro-batch; the gaps are the bubble."""
    p = len(timeline.tasks)
    fig, ax = plt.subplots(figsize=(10, 0.5 * p + 1.2))
    for d, order in enumerate(timeline.tasks):
        for kind, mb, chunk, start, end in order:
            color = "#9ecae1" if kind == "F" else "#3182bd"
            ax.barh(d, end - start, left=start, color=color, edgecolor="white")
            ax.text((start + end) / 2, d, str(mb), ha="center", va="center", fontsize=6)
    ax.set(yticks=range(p), yticklabels=[f"device {d}" for d in range(p)], xlabel="time",
           title=f"{title} (bubble {timeline.bubble_fraction:.0%})")
    ax.invert_yaxis()
    return finish_figure(fig, path)


def plot_memory_per_rank(memory: dict[str, dict[str, float]], path: str | Path | None = None,
                         title: str = "model-state memory per rank"):
    """Stacked bars: ``{strategy: {part: bytes}}`` (e.g. parameters, gradients, Adam states)."""
    names = list(memory)
    parts = list(dict.fromkeys(k for m in memory.values() for k in m))
    fig, ax = plt.subplots(figsize=(6, 3))
    bottom = [0.0] * len(names)
    for part in parts:
        values = [memory[n].get(part, 0) / 1e3 for n in names]
        ax.bar(names, values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set(ylabel="kB per rank", title=title)
    ax.legend(fontsize=8)
    return finish_figure(fig, path)


TIMELINE_COLORS = {"generation": STAGE_COLORS["generation"], "scoring": STAGE_COLORS["scoring"],
                   "training": STAGE_COLORS["training"], "sync": "#e7298a", "reshard": "#1f78b4",
                   "evaluation": "#999999"}


def plot_timelines(runs: dict[str, list], path: str | Path | None = None,
                   title: str = "what every worker did", show_versions: bool = True):
    """Gantt charts of real runs side by side, one panel per run, one row per worker: each
    :class:`rlm_course.timeline.Event` a bar coloured by stage (generation, scoring,
    training, sync, ...), labelled with its policy version; gaps are idle time. ``runs``:
    ``{name: events}`` (times in seconds from the run's start); the panels share the time
    axis, so the runs' lengths compare at a glance."""
    names = list(runs)
    rows = [sorted({e.worker for e in runs[n]}) for n in names]
    heights = [max(1, len(r)) for r in rows]
    fig, axes = plt.subplots(len(names), 1, sharex=True, squeeze=False,
                             figsize=(10, 0.45 * sum(heights) + 0.9 * len(names) + 0.6),
                             gridspec_kw={"height_ratios": heights})
    seen = set()
    for ax, name, workers in zip(axes[:, 0], names, rows):
        y = {w: i for i, w in enumerate(workers)}
        for e in runs[name]:
            color = TIMELINE_COLORS.get(e.stage, "#cccccc")
            ax.barh(y[e.worker], e.end - e.start, left=e.start, color=color, edgecolor="white",
                    linewidth=0.5, label=None if e.stage in seen else e.stage)
            seen.add(e.stage)
            if show_versions and e.stage in ("generation", "training") and e.end - e.start > 0:
                ax.text((e.start + e.end) / 2, y[e.worker], f"v{e.version}", ha="center",
                        va="center", fontsize=6, clip_on=True)
        ax.set(yticks=range(len(workers)), yticklabels=workers)
        ax.set_title(name, fontsize=9, loc="left")
        ax.invert_yaxis()
    axes[-1, 0].set_xlabel("seconds since the start of the run")
    axes[0, 0].legend(fontsize=7, ncol=6, loc="lower right", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    return finish_figure(fig, path)


def plot_measured_vs_predicted(points: dict[str, tuple[list, list, list]],
                               path: str | Path | None = None, xlabel: str = "bytes",
                               ylabel: str = "seconds", title: str = "measured and predicted"):
    """Log-log lines: for each name, ``(x, measured, predicted)``: measured as dots, predicted as
    a line of the same colour."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, (xs, measured, predicted) in points.items():
        line, = ax.plot(xs, predicted, "-", label=f"{name}: predicted")
        ax.plot(xs, measured, "o", color=line.get_color(), label=f"{name}: measured")
    ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize=7)
    return finish_figure(fig, path)
