"""verl 0.9.1's ``main_generation_server`` on a tiny model: rollout.n responses per row of data.train_files, written
with a ``responses`` column to +data.output_path, then scored by main_eval."""

from __future__ import annotations

import pandas as pd
import pytest

from hybridflow.errors import ConfigError
from hybridflow.trainer import main_eval
from hybridflow.trainer.main_generation_server import main
from tests.trainer.ppo_fixtures import write_reward, write_task


def command(tmp_path, model_dir, *extra):
    train, _ = write_task(str(tmp_path / "data"), rows=5)
    return [f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={train}", "data.prompt_key=prompt",
            "actor_rollout_ref.rollout.name=native", f"+data.output_path={tmp_path / 'out' / 'gen.parquet'}", *extra]


def responses(tmp_path):
    return pd.read_parquet(tmp_path / "out" / "gen.parquet")


def test_n_sampled_responses_per_row_then_scored_by_main_eval(tmp_path, tiny_model_dir):
    assert main(command(tmp_path, tiny_model_dir, "actor_rollout_ref.rollout.n=3",
                        "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.response_length=5")) == 0
    frame = responses(tmp_path)
    assert len(frame) == 5 and list(frame["data_source"]) == ["digits"] * 5  # the input rows, in order
    assert all(len(row) == 3 for row in frame["responses"])
    from hybridflow.config import PPOConfig, load_config
    from hybridflow.trainer.main_generation_server import sampling_params, split_output_path

    cfg = load_config(PPOConfig, split_output_path(command(tmp_path, tiny_model_dir, "actor_rollout_ref.rollout.n=3",
                                                           "actor_rollout_ref.rollout.top_p=0.5",
                                                           "actor_rollout_ref.rollout.response_length=5"))[1])
    params = sampling_params(cfg, [7])
    assert (params.n, params.top_p, params.max_tokens, params.top_k, params.stop_token_ids) == (3, 0.5, 5, -1, [7])
    scores = main_eval.evaluate(main_eval.load_config(main_eval.EvalConfig, [
        f"data.path={tmp_path / 'out' / 'gen.parquet'}", f"custom_reward_function.path={write_reward(str(tmp_path))}"]))
    assert list(scores) == ["test_score/digits"] and 0.0 <= scores["test_score/digits"] <= 1.0


def test_greedy_is_the_same_answer_each_run(tmp_path, tiny_model_dir):
    greedy = ("actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.rollout.response_length=4")
    main(command(tmp_path / "a", tiny_model_dir, *greedy))
    main(command(tmp_path / "b", tiny_model_dir, *greedy))
    first, second = responses(tmp_path / "a")["responses"], responses(tmp_path / "b")["responses"]
    assert [list(r) for r in first] == [list(r) for r in second] and all(len(r) == 1 for r in first)


@pytest.mark.parametrize("extra,fragment", [
    (("actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.rollout.n=2"), "1 when temperature=0"),
    (("data.prompt_key=question",), "data.prompt_key='question' is not a column"),
])
def test_bad_requests_are_one_line(tmp_path, tiny_model_dir, extra, fragment):
    from hybridflow.trainer.main_generation_server import generate, split_output_path
    from hybridflow.config import PPOConfig, load_config

    output, rest = split_output_path(command(tmp_path, tiny_model_dir, *extra))
    with pytest.raises(ConfigError, match=fragment):
        generate(load_config(PPOConfig, rest), output)


def test_output_path_is_required(tmp_path, tiny_model_dir):
    from hybridflow.trainer.main_generation_server import split_output_path

    with pytest.raises(ConfigError, match="exactly one \\+data.output_path"):
        split_output_path(command(tmp_path, tiny_model_dir)[:-1])
