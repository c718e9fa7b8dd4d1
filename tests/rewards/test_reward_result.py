import math

import numpy as np
import pytest

from hybridflow.rewards.result import ScoreValueError, normalize_score, score_sample


@pytest.mark.parametrize(
    "raw, expected",
    [
        (1, (1.0, {})),
        (True, (1.0, {})),
        (np.float32(0.5), (0.5, {})),
        (-1e16, (-1e16, {})),  # MAX_ABS_SCORE itself
        ({"score": 0.5, "acc": True, "len": 3, "note": "text", "bad": math.inf}, (0.5, {"acc": 1.0, "len": 3.0})),
    ],
)
def test_normalize(raw, expected):
    assert normalize_score(raw) == expected


@pytest.mark.parametrize("raw", [math.nan, -math.inf, "1.0", None, {"acc": 1.0}, {"score": math.nan}, 1e300,
                                 {"score": -1.1e16}])
def test_normalize_rejects(raw):
    with pytest.raises(ScoreValueError):
        normalize_score(raw)


def test_score_sample_turns_exceptions_into_failures():
    def broken(data_source, solution_str, ground_truth, extra_info):
        raise KeyError("gt")

    sample = score_sample(broken, ("src", "a", "b", None), {})
    assert sample.score is None and "src: KeyError" in sample.failure and not sample.timed_out
