"""Scoring failures are loud: one console line per step, and an error when a whole step fails."""

import logging
import math

import pytest

from hybridflow.errors import DataError
from hybridflow.rewards import RewardManager
from hybridflow.workers.reward import report_failures

BAD_RETURNS = {
    "raises": RuntimeError("scorer bug"),
    "nan": math.nan,
    "inf": math.inf,
    "string": "1.0",
    "none": None,
    "dict without score": {"acc": 1.0},
    "absurd": 1e300,  # issue 50: inf in float32, the loss NaN and the update skipped in silence
    "absurd negative": {"score": -1e17},
}


def scorer(data_source, solution_str, ground_truth, extra_info=None):
    value = BAD_RETURNS.get(solution_str, 1.0)
    if isinstance(value, Exception):
        raise value
    return value


def score(responses, sources=None):
    manager = RewardManager(scorer)
    sources = sources or ["custom"] * len(responses)
    return manager(responses, sources, ["1"] * len(responses), [{}] * len(responses))


@pytest.mark.parametrize("kind", sorted(BAD_RETURNS))
def test_each_bad_return_is_counted_and_printed(kind, caplog):
    result = score([kind, "fine", "fine"])
    assert result.num_failed == 1 and result.scores == [0.0, 1.0, 1.0]
    with caplog.at_level(logging.WARNING):
        report_failures(result, stop_when_all_fail=True)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("reward: 1 of 3 samples failed to score this step (first: custom: ")
    assert "custom_reward_function.path" in line and "reward/num_failed" in line


def test_misspelled_data_source_fails_every_sample_and_stops():
    manager = RewardManager()  # the built-in scorers, routed by data_source
    result = manager(["4", "5"], ["openai/gsm8kk"] * 2, ["4", "4"], [{}, {}])
    assert result.num_failed == 2
    with pytest.raises(DataError, match=r"every sample failed to score: 2 of 2 .*did you mean 'openai/gsm8k'"):
        report_failures(result, stop_when_all_fail=True)


def test_all_failed_only_warns_when_asked_to_keep_going(caplog):
    result = score(["nan", "raises"])
    with caplog.at_level(logging.WARNING):
        report_failures(result, stop_when_all_fail=False)
    assert len(caplog.records) == 1 and "2 of 2 samples failed" in caplog.records[0].getMessage()


def test_no_failure_prints_nothing(caplog):
    with caplog.at_level(logging.WARNING):
        report_failures(score(["fine", "fine"]), stop_when_all_fail=True)
    assert caplog.records == []
