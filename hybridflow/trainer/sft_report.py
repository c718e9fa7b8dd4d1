"""End-of-run report of an SFT run: a first / last / best table and loss / lr curves.

The shared ``summary.py`` / ``plots.py`` list PPO's headline metrics; SFT's are the
losses, so the same ``metric_series`` history walk is used with SFT's keys here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from hybridflow.trainer.summary import metric_series

History = Sequence[Mapping[str, float]]

# metric -> "best" rule (None: only first and last are meaningful)
SFT_HEADLINES = {"train/loss": min, "val/loss": min, "train/grad_norm": None, "train/lr": None,
                 "perf/tokens_per_s": max}
# file name -> (title, y label, metrics drawn)
SFT_CURVES = {"loss.png": ("Loss", "cross-entropy (nats/token)", ("train/loss", "val/loss")),
              "lr.png": ("Learning rate", "lr", ("train/lr",)),
              "grad_norm.png": ("Gradient norm", "pre-clip norm", ("train/grad_norm",))}


def sft_summary(history: History) -> str:
    """A plain-text table, one row per headline metric that was logged."""
    rows = [("metric", "first", "last", "best")]
    for key, best in SFT_HEADLINES.items():
        _, values = metric_series(history, key)
        if values:
            rows.append((key, f"{values[0]:.4g}", f"{values[-1]:.4g}", f"{best(values):.4g}" if best else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines + [f"steps {len(history)}"])


def _draw(title: str, ylabel: str, series: dict[str, tuple[list[int], list[float]]], path: str) -> None:
    figure = Figure(figsize=(6, 4), dpi=100, layout="tight")
    FigureCanvasAgg(figure)  # Agg canvas: no display, no pyplot global state
    axes = figure.add_subplot()
    for key, (steps, values) in series.items():
        axes.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=key)
    axes.set(title=title, xlabel="step", ylabel=ylabel)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.savefig(path)


def sft_plots(history: History, out_dir: str) -> list[str]:
    """One PNG per curve with data in ``out_dir``; returns the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for filename, (title, ylabel, keys) in SFT_CURVES.items():
        series = {key: metric_series(history, key) for key in keys}
        series = {key: points for key, points in series.items() if points[0]}
        if series:
            paths.append(os.path.join(out_dir, filename))
            _draw(title, ylabel, series, paths[-1])
    return paths
