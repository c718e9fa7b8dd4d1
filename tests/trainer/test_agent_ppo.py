"""PPO / GRPO with multi-turn tool rollouts (``multi_turn.enable``): an end-to-end run and a learning run."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from hybridflow.config import PPOConfig, load_config
from hybridflow.trainer.main_ppo import run_ppo
from tests.trainer.ppo_fixtures import base_overrides

SUBMIT_42 = '<tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": "42"}}</tool_call>'

TOOL_CONFIG = """
tools:
  - class_name: verl.tools.gsm8k_tool.Gsm8kTool
    config: {type: native}
  - class_name: hybridflow.tools.calculator.CalculatorTool
"""

TOOL_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """1 only when the answer reached the answer-check tool and was right (the tool's calc_reward)."""
    return float((extra_info.get("tool_rewards") or {}).get("calc_gsm8k_reward", 0.0))
'''


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory):
    """The tiny model whose tokenizer has the whole answer-submitting call as one added token: a random
    model then emits it with chance ~1/vocab per position, so GRPO can find it and reinforce it."""
    from hybridflow.models.tiny import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokenizer.add_tokens([SUBMIT_42])
    model, _ = build_tiny_model(tokenizer=tokenizer, seed=0)
    path = tmp_path_factory.mktemp("tool_model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def tool_task(tmp_path, *, rows: int = 16) -> list[str]:
    records = [{
        "prompt": [{"role": "user", "content": f"What is {i} + {42 - i}? Check your answer with the tool."}],
        "data_source": "tool_use", "ability": "math", "agent_name": "tool_agent",
        "reward_model": {"style": "rule", "ground_truth": "42"},
        "extra_info": {"index": i, "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "42"}}}},
    } for i in range(rows)]
    train, test = tmp_path / "tool_train.parquet", tmp_path / "tool_test.parquet"
    pd.DataFrame(records).to_parquet(train)
    pd.DataFrame(records[:4]).to_parquet(test)
    (tmp_path / "tools.yaml").write_text(TOOL_CONFIG)
    (tmp_path / "tool_reward.py").write_text(TOOL_REWARD)
    return [f"data.train_files={train}", f"data.val_files={test}", "data.max_prompt_length=128",
            "actor_rollout_ref.rollout.multi_turn.enable=True",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp_path / 'tools.yaml'}",
            f"custom_reward_function.path={tmp_path / 'tool_reward.py'}"]


def metrics_rows(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]


def test_multi_turn_grpo_run_logs_verl_multi_turn_metrics(tmp_path, tool_model_dir):
    overrides = base_overrides(tmp_path, tool_model_dir, steps=2) + tool_task(tmp_path) + [
        "data.max_response_length=96", "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        "trainer.test_freq=2"]
    run_ppo(load_config(PPOConfig, overrides))
    row = metrics_rows(tmp_path)[-1]
    for key in ("num_turns/mean", "num_turns/max", "tool_call_counts/mean", "multi_turn/tool_errors/mean",
                "multi_turn/tokenization_mismatch/mean", "critic/score/mean", "actor/pg_loss"):
        assert key in row, key
    assert row["num_turns/min"] >= 2 and row["num_turns/max"] <= 6  # prompt + at most 3 assistant + 2 tool turns
    assert "val-core/tool_use/reward/mean@1" in row and 0.0 <= row["val-aux/tool_call_share@1"] <= 1.0


def test_grpo_learns_to_call_the_tool(tmp_path, tool_model_dir):
    """Reward 1 only when the right answer went through the tool: near 0 at the start, near 1 at the end."""
    overrides = base_overrides(tmp_path, tool_model_dir, steps=20) + tool_task(tmp_path) + [
        "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32", "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.optim.lr=1e-2", "trainer.logger=[file]", "data.max_response_length=8",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        "actor_rollout_ref.rollout.multi_turn.stop_after_tool_call=True"]
    run_ppo(load_config(PPOConfig, overrides))
    rows = metrics_rows(tmp_path)
    scores = [round(r["critic/score/mean"], 2) for r in rows]
    print("score per step:", scores, "tool calls per conversation:", [round(r["tool_call_counts/mean"], 2) for r in rows])
    assert sum(scores[:3]) / 3 < 0.1, scores
    assert sum(scores[-3:]) / 3 > 0.9, scores
