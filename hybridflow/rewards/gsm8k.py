"""GSM8K scorer (``openai/gsm8k``), with verl's semantics.

GSM8K solutions end in ``#### <number>`` (Cobbe et al., 2021, "Training Verifiers to
Solve Math Word Problems"). Like verl's ``reward_score/gsm8k.py``:

- only the **last 300 characters** of the response are searched (regexes over very
  long responses are slow, and the final answer sits at the end); a ``####`` answer
  earlier than that is not seen;
- ``method='strict'``: the answer is the number after the *last* ``#### `` (this also
  rewards the format); ``method='flexible'``: the answer is the last number anywhere;
- no number found -> 0; a number equal to the ground truth -> ``score``; a wrong
  number -> ``format_score``.

Differences from verl, all in normalisation before the string comparison: commas and
``$`` are stripped from both the answer and the ground truth (verl strips them only in
strict mode and only from the answer), strict mode allows ``#### $1,000``, and a
trailing sentence period (``... is 18.``) is dropped so that it does not turn a right
answer into a wrong one.
"""

from __future__ import annotations

import re

from hybridflow.rewards.registry import register_scorer

SOLUTION_CLIP_CHARS = 300
_STRICT = re.compile(r"#### \$?(-?[0-9.,]+)")
_FLEXIBLE = re.compile(r"(-?[0-9.,]+)")
_NOT_A_NUMBER = {"", ".", ",", "-"}


def _normalize(number: str) -> str:
    return number.replace(",", "").replace("$", "").rstrip(".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The final answer in ``solution_str`` (normalised), or None if there is none."""
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-SOLUTION_CLIP_CHARS:]
    pattern = _STRICT if method == "strict" else _FLEXIBLE
    for candidate in reversed(pattern.findall(tail)):
        number = _normalize(candidate)
        if number not in _NOT_A_NUMBER:
            return number
        if method == "strict":
            # strict takes the last '####' match only; a bad one is not skipped
            return None
    return None


def compute_score(
    solution_str: str, ground_truth: str, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """``score`` if the extracted answer equals ``ground_truth``, ``format_score`` if a
    number was extracted but is wrong, 0.0 if no number was found."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return float(score) if answer == _normalize(str(ground_truth).strip()) else float(format_score)


@register_scorer("openai/gsm8k", "gsm8k", keyword_args=("method", "format_score", "score"))
def score_row(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    return compute_score(solution_str, ground_truth, **kwargs)
