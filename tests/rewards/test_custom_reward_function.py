import pickle
import textwrap

import pytest

from hybridflow.errors import ConfigError
from hybridflow.rewards.custom import load_reward_function


def _write(tmp_path, source, name="reward.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


GOOD = """
    def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
        return float(solution_str == ground_truth) + bonus

    def other(data_source, solution_str, ground_truth, extra_info):
        return 0.5
"""


def test_loads_default_and_named_function(tmp_path):
    path = _write(tmp_path, GOOD)
    assert load_reward_function(path)("src", "a", "a", None) == 1.0
    assert load_reward_function(path, name="other")("src", "a", "b", None) == 0.5


def test_reward_kwargs_are_passed_and_survive_pickling(tmp_path):
    fn = load_reward_function(_write(tmp_path, GOOD), reward_kwargs={"bonus": 0.25})
    assert fn("src", "a", "a", None) == 1.25
    assert pickle.loads(pickle.dumps(fn))("src", "a", "b", None) == 0.25


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_reward_function(str(tmp_path / "nope.py"))


def test_syntax_error_shows_the_line(tmp_path):
    path = _write(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info)\n    return 1\n")
    with pytest.raises(ConfigError) as error:
        load_reward_function(path)
    assert "line 1" in str(error.value) and "def compute_score(data_source" in str(error.value)


def test_missing_function_lists_callables(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_reward_function(_write(tmp_path, GOOD), name="score_fn")
    assert "'score_fn'" in str(error.value) and "compute_score, other" in str(error.value)


def test_wrong_signature(tmp_path):
    path = _write(tmp_path, "def compute_score(solution_str, ground_truth):\n    return 1.0\n")
    with pytest.raises(ConfigError, match="lacks data_source, extra_info"):
        load_reward_function(path)


def test_var_keyword_signature_is_accepted(tmp_path):
    path = _write(tmp_path, "def compute_score(**kwargs):\n    return len(kwargs)\n")
    fn = load_reward_function(path)
    assert fn(data_source="s", solution_str="a", ground_truth="b", extra_info=None) == 4
