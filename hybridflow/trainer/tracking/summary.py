"""End-of-run summary: first / last / best of the headline metrics, steps, wall time and throughput.

``history`` is ``Tracking.history``: one ``{"step": N, metric: value, ...}`` dict per logged step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

BestRule = Callable[[Sequence[float]], float] | None
"""How "best" is chosen from a metric's values (``max``, ``min``); None: no meaningful best, only first/last."""

# PPO's headline metrics, the default table; other trainers pass their own (``headlines=``).
HEADLINE_METRICS: dict[str, BestRule] = {
    "critic/score/mean": max,
    "response_length/mean": None,
    "actor/entropy": None,
    "actor/ppo_kl": None,
    "actor/pg_loss": None,
}
VALIDATION_PREFIX = "val-core/"  # validation metrics: higher is better


def metric_series(history: Sequence[Mapping[str, float]], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of ``key`` over the steps where it was logged with a finite value."""
    points = [(int(row["step"]), float(row[key])) for row in history if key in row and math.isfinite(row[key])]
    return [s for s, _ in points], [v for _, v in points]


def _best_rule(key: str, headlines: Mapping[str, BestRule]) -> BestRule:
    return max if key.startswith(VALIDATION_PREFIX) else headlines.get(key)


def _summary_rows(
    history: Sequence[Mapping[str, float]], headlines: Mapping[str, BestRule]
) -> list[tuple[str, str, str, str]]:
    keys = list(headlines) + sorted({k for row in history for k in row if k.startswith(VALIDATION_PREFIX)})
    rows = []
    for key in keys:
        _, values = metric_series(history, key)
        if values:
            best = _best_rule(key, headlines)
            rows.append((key, f"{values[0]:.4g}", f"{values[-1]:.4g}", f"{best(values):.4g}" if best else "-"))
    return rows


def _totals_line(history: Sequence[Mapping[str, float]]) -> str:
    """Steps, wall time (sum of ``timing_s/step``) and tokens/s (``perf/total_num_tokens`` over that time)."""
    steps = [int(row["step"]) for row in history]
    _, step_times = metric_series(history, "timing_s/step")
    _, tokens = metric_series(history, "perf/total_num_tokens")
    wall = sum(step_times)
    line = f"steps {len(steps)} ({min(steps)}..{max(steps)})"
    if step_times:
        line += f" | wall time {wall:.1f} s"
    if tokens and wall > 0:
        line += f" | {sum(tokens) / wall:.1f} tokens/s"
    return line


def summary_table(
    history: Sequence[Mapping[str, float]], *, headlines: Mapping[str, BestRule] = HEADLINE_METRICS
) -> str:
    """A plain-text table (one row per headline metric present) followed by a totals line.

    ``headlines`` maps each metric to its best rule (default: PPO's); ``val-core/`` metrics
    are always added, best = max.
    """
    if not history:
        return "no steps logged"
    rows = [("metric", "first", "last", "best"), *_summary_rows(history, headlines)]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join([*lines, _totals_line(history)])
