"""Training curves as PNG files: reward, response length, KL, entropy and validation score vs step.

Drawn with matplotlib's object API on the Agg canvas (no pyplot global state, no display),
so it is safe at the end of a run on a headless machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from hybridflow.trainer.tracking.summary import VALIDATION_PREFIX, metric_series
from hybridflow.trainer.tracking.trackers import METRICS_FILE

History = Sequence[Mapping[str, float]]


@dataclass(frozen=True)
class Curve:
    """One figure: its file name, title, y label and the metric keys it draws (a function of the history)."""

    filename: str
    title: str
    ylabel: str
    keys: Callable[[History], list[str]]


def fixed_keys(*names: str) -> Callable[[History], list[str]]:
    """``Curve.keys`` for a curve that always draws the metrics ``names``."""
    return lambda history: list(names)


def _validation_keys(history: History) -> list[str]:
    return sorted({key for row in history for key in row if key.startswith(VALIDATION_PREFIX)})


# PPO's curves, the default set; other trainers pass their own (``curves=``).
CURVES = (
    Curve("reward.png", "Training reward", "critic/score/mean", fixed_keys("critic/score/mean")),
    Curve("response_length.png", "Response length", "tokens", fixed_keys("response_length/mean")),
    Curve("kl.png", "KL divergence", "KL (nats)", fixed_keys("actor/ppo_kl", "actor/kl_loss", "critic/kl")),
    Curve("entropy.png", "Policy entropy", "entropy (nats)", fixed_keys("actor/entropy")),
    Curve("val_score.png", "Validation score", "score", _validation_keys),
)


DASHES = ("-", "--", ":", "-.")


def grouped_styles(labels: Sequence[str]) -> dict[str, dict[str, str]]:
    """A colour per label's first word (the arm in ``"dynamic s2"``) and a dash per label within it (the seed),
    so a figure of arms x seeds reads by colour. Empty (matplotlib's colour cycle) when no two labels share one."""
    groups: dict[str, list[str]] = {}
    for label in labels:
        groups.setdefault(label.split(" ", 1)[0], []).append(label)
    if all(len(members) == 1 for members in groups.values()):
        return {}
    return {label: {"color": f"C{colour}", "linestyle": DASHES[place % len(DASHES)]}
            for colour, members in enumerate(groups.values()) for place, label in enumerate(members)}


def _draw(
    curve: Curve, series: Mapping[str, tuple[Sequence[float], list[float]]], path: str, *, xlabel: str = "step",
    styles: Mapping[str, Mapping[str, str]] | None = None,
) -> None:
    figure = Figure(figsize=(6, 4), dpi=100, layout="tight")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for key, (steps, values) in series.items():
        axes.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=key,
                  **(styles or {}).get(key, {}))
    axes.set_title(curve.title)
    axes.set_xlabel(xlabel)
    if xlabel == "step":
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    axes.set_ylabel(curve.ylabel)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.savefig(path)


def plot_curves(history: History, out_dir: str, *, curves: Sequence[Curve] = CURVES) -> list[str]:
    """Write one PNG per curve that has data into ``out_dir``; returns their paths (curves without data are skipped)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for curve in curves:
        series = {key: metric_series(history, key) for key in curve.keys(history)}
        series = {key: points for key, points in series.items() if points[0]}
        if series:
            path = os.path.join(out_dir, curve.filename)
            _draw(curve, series, path)
            paths.append(path)
    return paths


def read_history(run_dir: str) -> list[dict[str, float]]:
    """A finished run's per-step metrics: ``<run_dir>/logs/metrics.jsonl`` (the ``file`` logger)."""
    path = os.path.join(run_dir, "logs", METRICS_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: runs need trainer.logger=[console,file] to be compared")
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


STEP_TIME = "timing_s/step"


def training_minutes(history: History) -> dict[int, float]:
    """Step -> minutes of training up to the end of that step: the sum of ``timing_s/step`` (validation and
    start-up excluded, so runs on one machine compare by the work they did, not by when they were evaluated)."""
    minutes, total = {0: 0.0}, 0.0
    for row in history:
        if STEP_TIME in row:
            total += float(row[STEP_TIME]) / 60
            minutes[int(row["step"])] = total
    return minutes


def comparison_series(runs: Mapping[str, History], metric: str, *, x: str = "step"
                      ) -> dict[str, tuple[list[float], list[float]]]:
    """Label -> (x, values) of ``metric``: x is the step, or (``x="minutes"``) the training minutes of
    ``training_minutes`` at that step."""
    series = {label: metric_series(history, metric) for label, history in runs.items()}
    if x == "step":
        return series
    timed = {}
    for label, (steps, values) in series.items():
        clock = training_minutes(runs[label])
        points = [(clock[step], value) for step, value in zip(steps, values) if step in clock]
        timed[label] = ([minutes for minutes, _ in points], [value for _, value in points])
    return timed


def plot_comparison(runs: Mapping[str, History], metric: str, path: str, *, title: str = "", x: str = "step") -> str:
    """One metric of several runs on one figure (a line per run, labelled by the mapping's keys; runs whose labels
    share a first word share a colour, ``grouped_styles``), against the step or the training minutes
    (``comparison_series``)."""
    _draw(Curve(os.path.basename(path), title or metric, metric, fixed_keys()), comparison_series(runs, metric, x=x),
          path, xlabel="training minutes" if x == "minutes" else "step", styles=grouped_styles(list(runs)))
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hybridflow.trainer.tracking.plots LABEL=RUN_DIR ... --metric KEY -o out.png``."""
    parser = argparse.ArgumentParser(description="compare one metric of several runs (their logs/metrics.jsonl)")
    parser.add_argument("runs", nargs="+", help="LABEL=RUN_DIR (a trainer.default_local_dir)")
    parser.add_argument("--metric", required=True, help="e.g. val-core/basic_arithmetic/reward/mean@1")
    parser.add_argument("--title", default="")
    parser.add_argument("--x", choices=("step", "minutes"), default="step",
                        help="the x axis: the step, or the training minutes (the sum of timing_s/step)")
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args(argv)
    runs = dict(item.rsplit("=", 1) for item in args.runs)  # labels may hold "=" (n=8), folders rarely do
    plot_comparison({label: read_history(d) for label, d in runs.items()}, args.metric, args.output, title=args.title,
                    x=args.x)
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
