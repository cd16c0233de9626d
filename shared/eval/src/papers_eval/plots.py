"""PNG plots with matplotlib's Agg backend (no display needed)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from papers_eval.stats import pareto_front  # noqa: E402


def line_plot(
    path: str | os.PathLike,
    x: Sequence[float],
    series: Mapping[str, Sequence[float]],
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    logx: bool = False,
    bands: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None,
) -> Path:
    """One line per method over a shared x axis; optional (low, high) bands per method."""
    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=120)
    for name, ys in series.items():
        (line,) = ax.plot(x, ys, marker="o", markersize=3, label=name)
        if bands and name in bands:
            lo, hi = bands[name]
            ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    if logx:
        ax.set_xscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=8)
    return _save(fig, path)


def pareto_plot(
    path: str | os.PathLike,
    points: Mapping[str, tuple[float, float]],
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
) -> Path:
    """Scatter of (cost, score) per method with the Pareto front drawn through it."""
    names = list(points)
    costs = [points[n][0] for n in names]
    scores = [points[n][1] for n in names]
    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=120)
    ax.scatter(costs, scores, s=18)
    for name, c, s in zip(names, costs, scores, strict=True):
        ax.annotate(name, (c, s), fontsize=7, xytext=(3, 3), textcoords="offset points")
    front = pareto_front(costs, scores)
    ax.plot([costs[i] for i in front], [scores[i] for i in front], "--", color="gray", lw=1)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _save(fig, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
