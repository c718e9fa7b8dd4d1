"""MATH-style scorer: the last ``\\boxed{...}`` checked with math-verify.

MATH (Hendrycks et al., 2021, "Measuring Mathematical Problem Solving With the MATH
Dataset") asks for the final answer in ``\\boxed{}``. We take the *last* boxed
expression of the response (braces may nest: ``\\boxed{\\frac{1}{2}}``), and let
math-verify decide equivalence with the ground truth (``\\frac{1}{2}`` = ``0.5``,
``\\{1,2\\}`` = ``\\{2,1\\}``, ...). No boxed answer -> 0.0.

math-verify bounds its own parse / compare time with ``signal.alarm``, which only
works on a process's main thread; elsewhere we pass ``parsing_timeout=None`` /
``timeout_seconds=None`` and the reward manager's time-out is the bound.
"""

from __future__ import annotations

import threading

from hybridflow.rewards.registry import register_scorer

MATH_DATA_SOURCES = (
    "lighteval/MATH",
    "DigitalLearningGmbH/MATH-lighteval",
    "HuggingFaceH4/MATH-500",
    "math",
    "math_dapo",
    "aime24",
    "aime25",
)
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_MATH_VERIFY_TIMEOUT_S = 5


def last_boxed_content(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces matched; None if
    there is none or its braces never close."""
    start = max(text.rfind(command + "{") for command in _BOX_COMMANDS)
    if start < 0:
        return None
    open_at = text.index("{", start)
    depth = 0
    for position in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[position], 0)
        if depth == 0:
            return text[open_at + 1 : position]
    return None


def _signal_timeout() -> int | None:
    on_main = threading.current_thread() is threading.main_thread()
    return _MATH_VERIFY_TIMEOUT_S if on_main else None


def is_equivalent(answer: str, ground_truth: str) -> bool:
    """math-verify equivalence of two LaTeX answers (without ``$`` or ``\\boxed``)."""
    from math_verify import parse, verify

    timeout = _signal_timeout()
    gold = parse(f"${ground_truth}$", parsing_timeout=timeout)
    predicted = parse(f"${answer}$", parsing_timeout=timeout)
    if not gold or not predicted:
        return False
    return bool(verify(gold, predicted, timeout_seconds=timeout))


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if the last boxed answer of ``solution_str`` equals ``ground_truth``, else 0.0.

    ``ground_truth`` may itself be given boxed (``\\boxed{5}``) or bare (``5``).
    """
    answer = last_boxed_content(solution_str)
    if answer is None:
        return 0.0
    gold = last_boxed_content(str(ground_truth)) or str(ground_truth)
    return 1.0 if is_equivalent(answer, gold) else 0.0


@register_scorer(*MATH_DATA_SOURCES)
def score_row(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    return compute_score(solution_str, ground_truth, **kwargs)
