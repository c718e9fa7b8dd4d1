"""Bad inputs a new user tried (issue 61): each is one line naming the value and the fix, before anything is lost."""

import asyncio
import json
import os
from types import SimpleNamespace

import pandas as pd
import pytest

from hybridflow.config import PPOConfig, load_config
from hybridflow.config.validate import validate_ppo_config
from hybridflow.data.chat import render
from hybridflow.data.rl_dataset import RLDataset
from hybridflow.errors import ConfigError, DataError, ModelError
from hybridflow.rewards.result import score_sample

ROW = {"prompt": [{"role": "user", "content": "What is 2 + 2?"}], "data_source": "digits", "ability": "math",
       "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {"index": 0}}  # fmt: skip


def dataset(tmp_path, tokenizer, rows, **kwargs):
    path = tmp_path / "rows.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return RLDataset(str(path), tokenizer=tokenizer, max_prompt_length=64, **kwargs)


def one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


def test_a_reward_function_that_exits_is_a_failed_reward_not_the_end_of_the_run():
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        raise SystemExit(0)  # what sys.exit(0) does

    result = score_sample(compute_score, ("digits", "4", "4", None), {})
    assert result.score is None and "called sys.exit(0)" in result.failure and "digits" in result.failure


@pytest.mark.parametrize("key", ["reward_model", "extra_info"])
def test_a_json_string_column_is_named_with_the_fix(tmp_path, tiny_tokenizer, key):
    row = dict(ROW, **{key: json.dumps(ROW[key])})
    with pytest.raises(DataError) as refused:
        dataset(tmp_path, tiny_tokenizer, [row])
    message = one_line(refused)
    assert f"row 0: {key} is a str" in message and "json.loads" in message


def test_a_reward_fn_key_column_that_is_missing_is_named(tmp_path, tiny_tokenizer):
    with pytest.raises(DataError) as refused:
        dataset(tmp_path, tiny_tokenizer, [ROW], reward_fn_key="source")
    message = one_line(refused)
    assert "no 'source' column" in message and "data.reward_fn_key=source" in message and "data_source" in message


def test_the_reward_fn_key_column_reaches_the_batch(tmp_path, tiny_tokenizer):
    rows = [dict(ROW, source="mine")]
    data = dataset(tmp_path, tiny_tokenizer, rows, reward_fn_key="source")
    assert data.collate_fn([data[0]])["source"] == ["mine"]


def test_binary_prompt_content_is_not_called_empty(tmp_path, tiny_tokenizer):
    row = dict(ROW, prompt=[{"role": "user", "content": b"What is 2 + 2?"}])
    with pytest.raises(DataError) as refused:
        dataset(tmp_path, tiny_tokenizer, [row])
    message = one_line(refused)
    assert "binary content" in message and "empty" not in message and "decode" in message


def test_a_tokenizer_without_a_chat_template_is_named(tiny_tokenizer):
    template, tiny_tokenizer.chat_template = tiny_tokenizer.chat_template, None
    try:
        with pytest.raises(DataError) as refused:
            render(tiny_tokenizer, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    finally:
        tiny_tokenizer.chat_template = template
    assert "no chat template" in one_line(refused) and "apply_chat_template_kwargs.chat_template" in str(refused.value)


def test_a_model_folder_without_tokenizer_files_is_named(tmp_path, tiny_model_dir):
    from hybridflow.models.loader import TOKENIZER_FILES, load_tokenizer

    folder = tmp_path / "model"
    folder.mkdir()
    for name in os.listdir(tiny_model_dir):
        if name not in TOKENIZER_FILES and not name.startswith(("special_tokens", "merges", "added_tokens")):
            os.symlink(os.path.join(tiny_model_dir, name), folder / name)
    with pytest.raises(ModelError) as refused:
        load_tokenizer(str(folder))
    assert "has no tokenizer files" in one_line(refused) and "data.tokenizer" in str(refused.value)


def test_interaction_kwargs_as_a_string_is_named():
    from hybridflow.agents.tool_agent import ToolAgentLoop

    loop = SimpleNamespace(context=SimpleNamespace(interactions={"quiz": object()}))
    row = {"extra_info": {"interaction_kwargs": '{"name": "quiz"}'}}
    with pytest.raises(DataError) as refused:
        asyncio.run(ToolAgentLoop.start_interaction(loop, row, SimpleNamespace(row_index=3)))
    message = one_line(refused)
    assert "row 3: extra_info.interaction_kwargs is a str" in message and "json.loads" in message


@pytest.mark.parametrize("name", ["max_assistant_turns", "max_user_turns"])
def test_zero_turns_is_refused_not_read_as_no_limit(tmp_path, tiny_model_dir, name):
    from tests.trainer.ppo_fixtures import base_overrides

    key = f"actor_rollout_ref.rollout.multi_turn.{name}"
    with pytest.raises(ConfigError, match=rf"{key}=0 would allow no turn.*null for no limit"):
        validate_ppo_config(load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir) + [f"{key}=0"]))
