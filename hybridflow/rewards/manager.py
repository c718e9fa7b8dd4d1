"""Reward managers: score a batch of decoded responses with a scorer, robustly.

All managers share one call signature, independent of the trainer's batch record::

    manager(responses, data_sources, ground_truths, extra_infos, response_lengths=None) -> RewardResult

and one failure policy: a sample whose scorer raises, returns a non-finite or
non-numeric value, or runs past ``timeout_s`` gets ``failure_score`` and is counted
in ``num_failed`` (time-outs also in ``num_timed_out``).

- ``naive``: one sample after another. Without ``timeout_s`` the scorer runs in this
  process; with it, the scorer runs in one persistent worker process that is killed
  and replaced when a sample overruns -- a thread cannot be stopped, and
  ``signal.alarm`` cannot interrupt C code or work off the main thread, so only a
  process really bounds the time.
- ``parallel``: ``num_workers`` such processes at once (:class:`ScoringPool`); the same
  :class:`RewardManager`, registered with ``num_workers=4, timeout_s=30`` as defaults.
- ``prime``: verl's process-pool manager (PRIME's), the same pool. verl's waits 300 s for the
  whole batch and scores every sample 0 on a time-out; here each sample has its own
  ``timeout_s``, so one hung program costs only its own score.
- ``dapo``: ``naive`` plus DAPO's overlong penalty on response length (Yu et al.,
  2025, "DAPO", Sec. 3.4), computed by :func:`hybridflow.algos.overlong.overlong_penalty`.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import torch

from hybridflow.algos.overlong import overlong_penalty
from hybridflow.errors import ConfigError
from hybridflow.rewards.registry import default_compute_score
from hybridflow.rewards.result import RewardResult, SampleScore, score_sample
from hybridflow.rewards.worker_pool import DEFAULT_PRELOAD, ScoringPool

_MANAGERS: dict[str, type] = {}
MAX_FAILURE_REPORTS = 5


def register_reward_manager(name: str):
    """Class decorator: make a manager buildable as ``reward_model.reward_manager=name``."""

    def decorate(cls):
        _MANAGERS[name] = cls
        return cls

    return decorate


def list_reward_managers() -> list[str]:
    """Registered manager names (``reward_model.reward_manager`` values)."""
    return sorted(_MANAGERS)


def build_reward_manager(name: str, **kwargs):
    """Instantiate the manager registered as ``name`` with ``kwargs``."""
    if name not in _MANAGERS:
        raise ConfigError(f"unknown reward_manager {name!r}; choose one of: {', '.join(sorted(_MANAGERS))}")
    return _MANAGERS[name](**kwargs)


def _bind(compute_score: Callable | None, reward_kwargs: dict | None) -> Callable:
    fn = compute_score or default_compute_score
    # functools.partial of a module-level function pickles, so it can go to workers.
    return functools.partial(fn, **reward_kwargs) if reward_kwargs else fn


def _tasks(data_sources, responses, ground_truths, extra_infos) -> list[tuple[tuple, dict]]:
    columns = (data_sources, responses, ground_truths, extra_infos)
    if len({len(column) for column in columns}) != 1:
        raise ValueError(f"reward inputs differ in length: {[len(column) for column in columns]}")
    return [((source, response, truth, info), {}) for source, response, truth, info in zip(*columns)]


def collect(samples: list[SampleScore], *, failure_score: float) -> RewardResult:
    """Assemble per-sample outcomes into a :class:`RewardResult` (nan = metric not reported)."""
    names = sorted({name for sample in samples for name in sample.extras})
    failed = [sample for sample in samples if sample.failure is not None]
    return RewardResult(
        scores=[failure_score if sample.score is None else sample.score for sample in samples],
        extra={name: [sample.extras.get(name, math.nan) for sample in samples] for name in names},
        num_failed=len(failed),
        num_timed_out=sum(sample.timed_out for sample in failed),
        failures=[sample.failure for sample in failed[:MAX_FAILURE_REPORTS]],
    )


class RewardManager:
    """Scores a batch with ``compute_score``; ``num_workers`` killable processes when set.

    ``num_workers=None`` (``naive``): in this process, or in one killable worker process when
    ``timeout_s`` is set. ``num_workers=k`` (``parallel`` / ``prime``): ``k`` worker processes,
    a sample past ``timeout_s`` has its worker killed and replaced.
    """

    def __init__(
        self,
        compute_score: Callable | None = None,
        *,
        reward_kwargs: dict | None = None,
        failure_score: float = 0.0,
        num_workers: int | None = None,
        timeout_s: float | None = None,
        mp_context: str = "spawn",
        preload: tuple[str, ...] = DEFAULT_PRELOAD,
    ):
        self.compute_score = _bind(compute_score, reward_kwargs)
        self.failure_score = failure_score
        self.pool = None
        if num_workers is not None or timeout_s is not None:
            self.pool = ScoringPool(num_workers=1 if num_workers is None else num_workers, timeout_s=timeout_s,
                                    mp_context=mp_context, preload=preload)

    def score(self, tasks: list[tuple[tuple, dict]]) -> list[SampleScore]:
        if self.pool is not None:
            return self.pool.map(self.compute_score, tasks)
        return [score_sample(self.compute_score, args, kwargs) for args, kwargs in tasks]

    def __call__(self, responses, data_sources, ground_truths, extra_infos, response_lengths=None) -> RewardResult:
        samples = self.score(_tasks(data_sources, responses, ground_truths, extra_infos))
        return collect(samples, failure_score=self.failure_score)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


_MANAGERS["naive"] = RewardManager
# verl 0.9's GDPO examples name a gdpo manager that keeps each reward component of the function's dict; every
# manager here keeps them (reward_extra_info), and algorithm.gdpo_reward_keys picks the ones GDPO normalises.
_MANAGERS["gdpo"] = RewardManager
_MANAGERS["parallel"] = _MANAGERS["prime"] = functools.partial(RewardManager, num_workers=4, timeout_s=30.0)


@register_reward_manager("dapo")
class DapoRewardManager:
    """``naive`` scores plus DAPO's soft overlong punishment.

    With ``L_max = max_response_length`` and ``L_cache = overlong_buffer_len``, a
    response of length ``|y|`` gets ``min(0, (L_max - L_cache - |y|) / L_cache) *
    penalty_factor`` added to its score (0 up to ``L_max - L_cache``, -penalty_factor
    at ``L_max``). Extra metrics: ``acc`` (the score before the penalty) and
    ``overlong_reward`` (the penalty added), verl's names.
    """

    def __init__(
        self,
        compute_score: Callable | None = None,
        *,
        max_response_length: int,
        overlong_buffer_len: int,
        penalty_factor: float = 1.0,
        enable_overlong_buffer: bool = True,
        **naive_kwargs: Any,
    ):
        if enable_overlong_buffer and not 0 < overlong_buffer_len <= max_response_length:
            raise ConfigError(
                f"overlong_buffer.len must be in (0, max_response_length={max_response_length}], got "
                f"{overlong_buffer_len}; set reward_model.overlong_buffer.len"
            )
        self.naive = RewardManager(compute_score, **naive_kwargs)
        self.max_response_length = max_response_length
        self.overlong_buffer_len = overlong_buffer_len
        self.penalty_factor = penalty_factor
        self.enable_overlong_buffer = enable_overlong_buffer

    def _penalties(self, response_lengths: list[int]) -> list[float]:
        penalty = overlong_penalty(
            response_lengths=torch.as_tensor(response_lengths, dtype=torch.float32),
            max_response_length=self.max_response_length,
            overlong_buffer_len=self.overlong_buffer_len,
            penalty_factor=self.penalty_factor,
        )
        return penalty.tolist()

    def __call__(self, responses, data_sources, ground_truths, extra_infos, response_lengths=None) -> RewardResult:
        result = self.naive(responses, data_sources, ground_truths, extra_infos)
        if not self.enable_overlong_buffer:
            return result
        if response_lengths is None or len(response_lengths) != len(responses):
            raise ValueError("the dapo reward manager needs response_lengths, one per response")
        penalties = self._penalties(list(response_lengths))
        result.extra["acc"] = list(result.scores)
        result.extra["overlong_reward"] = penalties
        result.scores = [score + penalty for score, penalty in zip(result.scores, penalties)]
        return result

    def close(self) -> None:
        self.naive.close()
