"""What a reward manager returns, and how a scorer's raw return value becomes a score.

A scorer (verl's ``compute_score``) may return a float, an int, a bool, or a dict with a
``'score'`` key whose other numeric entries are extra metrics. Anything else, a
non-finite number, an exception or a time-out is a *failure*: the sample gets the
manager's ``failure_score`` and is counted, so one bad row never kills a run but is
never silently scored either.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field


@dataclass
class RewardResult:
    """Scores of one batch of responses.

    Attributes:
        scores: ``[B]`` one float per response (``failure_score`` where scoring failed).
        extra: per-sample extra metrics, each list ``[B]``; a sample that did not report
            a metric (or failed) holds ``nan`` there so that means can skip it.
        num_failed: samples whose scorer raised, returned a non-finite / non-numeric
            value, or timed out (time-outs are counted here too).
        num_timed_out: samples whose scorer ran past the time-out.
        failures: short reasons of the first few failures, for the log.
    """

    scores: list[float]
    extra: dict[str, list[float]] = field(default_factory=dict)
    num_failed: int = 0
    num_timed_out: int = 0
    failures: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SampleScore:
    """One sample's outcome: ``score`` is None exactly when ``failure`` says why."""

    score: float | None
    extras: dict[str, float] = field(default_factory=dict)
    failure: str | None = None
    timed_out: bool = False


MAX_ABS_SCORE = 1e16
"""The largest score magnitude a batch can train on: estimators square scores (group std, variance, whitening) in
float32 and sum them over the batch, and at 1e16 a million squared scores still sum below float32's 3.4e38. A
larger score (say 1e300, inf once in float32) turned the score mean inf and the loss NaN, and the update was
skipped; it is a failed sample instead."""


class ScoreValueError(ValueError):
    """A scorer returned something that is not a finite score."""


def _finite_float(value, *, what: str) -> float:
    """bool / int / float / numpy or 0-d torch scalar -> finite Python float."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if not isinstance(value, (bool, numbers.Real)):
        raise ScoreValueError(f"{what} is {type(value).__name__}, expected a number")
    value = float(value)
    if not math.isfinite(value):
        raise ScoreValueError(f"{what} is {value}")
    return value


def normalize_score(raw) -> tuple[float, dict[str, float]]:
    """Turn a scorer's return value into ``(score, extra_metrics)``.

    Dict entries other than ``'score'`` are kept as metrics only when they are numbers
    (bools become 0/1; strings, lists and non-finite numbers are dropped, since a metric
    must be averageable).

    Raises:
        ScoreValueError: the value (or ``raw['score']``) is not a finite number, is larger in
            magnitude than ``MAX_ABS_SCORE``, or a dict lacks ``'score'``.
    """
    if isinstance(raw, dict):
        if "score" not in raw:
            raise ScoreValueError(f"returned a dict without 'score' (keys: {sorted(raw)[:8]})")
        extras = {}
        for key, value in raw.items():
            if key == "score":
                continue
            try:
                extras[str(key)] = _finite_float(value, what=key)
            except ScoreValueError:
                continue
        return _bounded_score(raw["score"]), extras
    return _bounded_score(raw), {}


def _bounded_score(value) -> float:
    score = _finite_float(value, what="score")
    if abs(score) > MAX_ABS_SCORE:
        raise ScoreValueError(f"score is {score:g}, beyond +-{MAX_ABS_SCORE:g} (float32 training overflows)")
    return score


def score_sample(compute_score, args: tuple, kwargs: dict) -> SampleScore:
    """Call ``compute_score(*args, **kwargs)`` and normalise; any exception is a failure.

    ``args`` is ``(data_source, solution_str, ground_truth, extra_info)``; the failure
    reason names the data source so that the log says which scorer broke.
    """
    try:
        score, extras = normalize_score(compute_score(*args, **kwargs))
    except SystemExit as error:  # sys.exit() in a reward function ended the trainer with rc 0 before 
        reason = (f"{args[0]}: the reward function called sys.exit({error.code!r}); it must return a score "
                  "(counted as a failed reward)")  # fmt: skip
        return SampleScore(score=None, failure=reason[:300])
    except Exception as error:  # a scorer bug must not kill the run; it is counted instead
        reason = f"{args[0]}: {type(error).__name__}: {error}"
        return SampleScore(score=None, failure=reason[:300])
    return SampleScore(score=score, extras=extras)
