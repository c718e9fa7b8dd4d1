"""verl's reward keys reach the right place: ``reward_model.reward_kwargs`` the manager,
``custom_reward_function.reward_kwargs`` the scoring function; bad ones fail before loading."""

import pytest

from hybridflow.config import PPOConfig, load_config
from hybridflow.errors import ConfigError
from hybridflow.trainer.main_ppo import check_registered_names
from hybridflow.trainer.roles.reward import build_reward_worker

MODEL = "actor_rollout_ref.model.path=/m"
DAPO_SCRIPT_KEYS = [  # as in verl's DAPO / GSPO scripts (recipe/dapo/test_dapo_7b_math.sh)
    "reward_model.reward_manager=dapo",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
    "+reward_model.reward_kwargs.overlong_buffer_cfg.log=False",
    "+reward_model.reward_kwargs.max_resp_len=8",
]


def manager_of(tokenizer, *overrides):
    cfg = load_config(PPOConfig, [MODEL, "reward_model.timeout_s=null", "data.max_response_length=16", *overrides])
    check_registered_names(cfg)
    return build_reward_worker(cfg, tokenizer).manager


def test_dapo_reward_kwargs_configure_the_manager_not_the_scorer(tiny_tokenizer):
    manager = manager_of(tiny_tokenizer, *DAPO_SCRIPT_KEYS)
    # L_max = max_resp_len = 8 (not data.max_response_length = 16), L_cache = 4 (DAPO Eq. 13):
    # |y| = 2 <= 4: no penalty; |y| = 6: (8 - 4 - 6) / 4 = -0.5; |y| = 8: -1.0
    result = manager(["#### 2", "#### 2", "#### 3"], ["openai/gsm8k"] * 3, ["2", "2", "2"], [None] * 3,
                     response_lengths=[2, 6, 8])
    assert result.num_failed == 0  # the GSM8K scorer never saw overlong_buffer_cfg
    assert result.scores == [1.0, 0.5, -1.0]
    assert result.extra["acc"] == [1.0, 1.0, 0.0] and result.extra["overlong_reward"] == [0.0, -0.5, -1.0]


def test_dapo_yaml_interpolated_buffer_is_read(tiny_tokenizer):
    """verl's entropy recipe YAML writes ``overlong_buffer_cfg: ${reward_model.overlong_buffer}``."""
    manager = manager_of(tiny_tokenizer, "reward_model.reward_manager=dapo",
                         "+reward_model.reward_kwargs.overlong_buffer_cfg=${reward_model.overlong_buffer}",
                         "reward_model.overlong_buffer.enable=True", "reward_model.overlong_buffer.len=8")
    assert manager.enable_overlong_buffer and manager.overlong_buffer_len == 8 and manager.max_response_length == 16


def test_scoring_function_kwargs_go_through_custom_reward_function(tmp_path, tiny_tokenizer):
    scorer = tmp_path / "score.py"
    scorer.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n"
                      "    return float(solution_str == ground_truth) + bonus\n")
    manager = manager_of(tiny_tokenizer, f"custom_reward_function.path={scorer}",
                         "+custom_reward_function.reward_kwargs.bonus=0.25")
    assert manager(["a", "b"], ["x", "x"], ["a", "a"], [None, None]).scores == [1.25, 0.25]


def test_manager_arguments_the_manager_does_not_take_fail_before_loading():
    cfg = load_config(PPOConfig, [MODEL, "+reward_model.reward_kwargs.max_resp_len=8", "+reward_model.reward_kwargs.bonus=1"])
    with pytest.raises(ConfigError) as err:
        check_registered_names(cfg)
    assert str(err.value).splitlines() == [
        "reward_model.reward_kwargs.max_resp_len is not an argument of the 'naive' reward manager (it takes: none); "
        "keyword arguments of the scoring function go in custom_reward_function.reward_kwargs.max_resp_len",
        "reward_model.reward_kwargs.bonus is not an argument of the 'naive' reward manager (it takes: none); "
        "keyword arguments of the scoring function go in custom_reward_function.reward_kwargs.bonus"]


def test_unknown_manager_and_bad_buffer_fail_before_loading():
    with pytest.raises(ConfigError, match=r"reward_model.reward_manager='primo' is not one of dapo, gdpo, naive, parallel, prime"):
        check_registered_names(load_config(PPOConfig, [MODEL, "reward_model.reward_manager=primo"]))
    with pytest.raises(ConfigError, match=r"dapo overlong buffer length 0 must be in \(0, max_resp_len=512\]"):
        check_registered_names(load_config(PPOConfig, [MODEL, "reward_model.reward_manager=dapo",
                                                       "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True"]))


def test_prime_manager_is_built_with_its_pool(tiny_tokenizer):
    manager = manager_of(tiny_tokenizer, "reward_model.reward_manager=prime", "reward_model.num_workers=2",
                         "reward_model.timeout_s=5")
    try:
        assert manager(["#### 2", "#### 3"], ["openai/gsm8k"] * 2, ["2", "2"], [None] * 2).scores == [1.0, 0.0]
        assert manager.pool.num_workers == 2
    finally:
        manager.close()
