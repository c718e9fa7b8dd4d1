"""The synthetic visual task's verifier: ``hybridflow/shape_count`` (how many shapes does the image show?).

The rows come from ``python -m hybridflow.data.preprocess.shape_count`` (PIL-drawn images, offline). The
answer is the last ``\\boxed{...}`` of the response when it has one, else its last integer; the score is
1.0 when that integer equals the ground truth (the number of shapes drawn), else 0.0.
"""

from __future__ import annotations

import re

from hybridflow.rewards.math import last_boxed_content
from hybridflow.rewards.registry import register_scorer

SHAPE_COUNT_SOURCE = "hybridflow/shape_count"
_INTEGER = re.compile(r"-?\d+")


MAX_DIGITS = 9
"""Longer numbers are no count of shapes: they score 0 instead of reaching ``int()`` (which refuses more than
4,300 digits, and a policy can write that many)."""


def extract_count(text: str) -> int | None:
    """The integer a response answers with: the one integer inside its last ``\\boxed{}`` (a box holding several,
    ``\\boxed{2, 3}``, hedges and answers nothing), else its last integer; None if none."""
    boxed = last_boxed_content(text)
    found = _INTEGER.findall(boxed if boxed is not None else text)
    if not found or (boxed is not None and len(found) > 1) or len(found[-1].lstrip("-")) > MAX_DIGITS:
        return None
    return int(found[-1])


@register_scorer(SHAPE_COUNT_SOURCE)
def score_shape_count(data_source, solution_str, ground_truth, extra_info=None) -> float:
    answer = extract_count(solution_str)
    return 1.0 if answer is not None and answer == int(ground_truth) else 0.0
