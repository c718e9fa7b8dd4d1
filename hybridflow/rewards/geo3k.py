"""Geometry3K (``hiyouga/geometry3k``, verl's geo3k example) scorer: a format part and an accuracy part.

    score = (1 - format_score) * acc + format_score * format        (format_score = 0.1)

``format`` is 1 when the whole response is ``<think>...</think>`` followed by a ``\\boxed{...}`` answer
(the instruction verl's geo3k preprocess appends); ``acc`` is 1 when the last boxed answer (or the whole
response with ``use_boxed=False``) equals the ground truth: the same string after normalising spaces, or
equivalent by math-verify (``\\frac{1}{2}`` = ``0.5``; verl grades with mathruler, the same idea). The
registered scorer returns ``{"score", "format", "acc"}`` so both parts are logged as metrics.
"""

from __future__ import annotations

import re

from hybridflow.rewards.math import is_equivalent, last_boxed_content
from hybridflow.rewards.registry import register_scorer

GEO3K_SOURCES = ("hiyouga/geometry3k", "geo3k")
_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_reward(predict_str: str) -> float:
    """1.0 when ``predict_str`` is ``<think>...</think>...\\boxed{...}...`` as a whole, else 0.0."""
    return 1.0 if _FORMAT.fullmatch(predict_str) else 0.0


def _normalised(text: str) -> str:
    return re.sub(r"\s+", "", text).rstrip(".")


def acc_reward(predict_str: str, ground_truth: str, use_boxed: bool = True) -> float:
    """1.0 when the (last boxed) answer equals ``ground_truth`` (string or math-verify equivalence)."""
    answer = last_boxed_content(predict_str) if use_boxed else predict_str
    if answer is None:
        return 0.0
    if _normalised(answer) == _normalised(str(ground_truth)):
        return 1.0
    return 1.0 if is_equivalent(answer, str(ground_truth)) else 0.0


def weighted(acc: float, fmt: float, format_score: float = 0.1) -> float:
    return (1.0 - format_score) * acc + format_score * fmt


def compute_score(predict_str: str, ground_truth: str, use_boxed: bool = True, format_score: float = 0.1) -> float:
    """verl's ``geo3k.compute_score``: ``(1 - format_score) * acc + format_score * format``."""
    return weighted(acc_reward(predict_str, ground_truth, use_boxed), format_reward(predict_str), format_score)


@register_scorer(*GEO3K_SOURCES)
def score_geo3k(data_source, solution_str, ground_truth, extra_info=None) -> dict[str, float]:
    """The geo3k score with its two parts as metrics."""
    acc, fmt = acc_reward(solution_str, ground_truth), format_reward(solution_str)
    return {"score": weighted(acc, fmt), "acc": acc, "format": fmt}
