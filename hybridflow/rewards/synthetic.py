"""A synthetic, trivially learnable task for smoke runs: ``hybridflow/digits``.

Score = the fraction of the response's characters that are digits (ground truth unused).
A random tiny model starts near 0.15; a working RL loop pushes it above 0.9 in a few
dozen steps, which makes it the CI-size check that learning happens at all.
"""

from __future__ import annotations

from hybridflow.rewards.registry import register_scorer

DIGITS_SOURCE = "hybridflow/digits"


@register_scorer(DIGITS_SOURCE, needs_ground_truth=False)
def digits_fraction(data_source, solution_str, ground_truth=None, extra_info=None) -> float:
    text = solution_str.strip()
    return sum(ch.isdigit() for ch in text) / len(text) if text else 0.0
