"""Simulated users (verl's interaction API) and custom agent loops from a config file."""

from __future__ import annotations

import pytest

from hybridflow.agents import AgentLoopOutput, load_agent_loop_config, load_interactions
from hybridflow.agents.interactions import AnswerFeedbackInteraction
from hybridflow.errors import ConfigError, DataError
from tests.agents.test_tool_agent import manager, run

ROW = {"raw_prompt": [{"role": "user", "content": "What is 6*7?"}],
       "extra_info": {"interaction_kwargs": {"name": "gsm8k", "ground_truth": "42"}}}


def wrong_then_right(text: str) -> str:
    return "#### 42" if "incorrect" in text else "#### 41"


def test_user_says_try_again_then_accepts_the_right_answer(tiny_tokenizer):
    users = {"gsm8k": AnswerFeedbackInteraction({"name": "gsm8k"})}
    mgr, _ = manager(tiny_tokenizer, wrong_then_right, tools=(), interactions=users)
    out = run(mgr, tiny_tokenizer, rows=[ROW])[0]
    assert out.extra_info["turn_scores"] == [0.0, 1.0]
    assert (out.metrics["assistant_turns"], out.metrics["user_turns"]) == (2, 1)  # the verdict "correct" ends it
    user_turn = "\n<|im_start|>user\nYour response is incorrect! You need to reflect on your answer and try again." \
                "<|im_end|>\n<|im_start|>assistant\n"
    masked = tiny_tokenizer.decode([t for t, m in zip(out.response_ids, out.response_mask) if m == 0])
    assert masked == user_turn
    assert users["gsm8k"].instances == {}  # finalize_interaction released it


def test_max_user_turns_bounds_a_user_that_never_accepts(tiny_tokenizer):
    users = {"gsm8k": AnswerFeedbackInteraction({"name": "gsm8k"})}
    mgr, _ = manager(tiny_tokenizer, lambda t: "#### 1", tools=(), interactions=users, max_assistant_turns=None,
                     max_user_turns=3)
    out = run(mgr, tiny_tokenizer, rows=[ROW])[0]
    assert (out.metrics["assistant_turns"], out.metrics["user_turns"]) == (4, 3)


def test_row_naming_an_unknown_interaction_is_a_data_error(tiny_tokenizer):
    users = {"gsm8k": AnswerFeedbackInteraction({"name": "gsm8k"})}
    mgr, _ = manager(tiny_tokenizer, wrong_then_right, tools=(), interactions=users)
    row = {**ROW, "extra_info": {"interaction_kwargs": {"name": "weather"}}}
    with pytest.raises(DataError, match="interaction_kwargs.name='weather'"):
        run(mgr, tiny_tokenizer, rows=[row])


def test_interaction_config_maps_verl_class_paths(tmp_path):
    path = tmp_path / "interaction.yaml"
    path.write_text("interaction:\n  - name: gsm8k\n    class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n"
                    "    config: {}\n")
    users = load_interactions(str(path))
    assert isinstance(users["gsm8k"], AnswerFeedbackInteraction) and users["gsm8k"].name == "gsm8k"
    path.write_text("interaction:\n  - name: a\n    class_name: no.Such\n")
    with pytest.raises(ConfigError, match="cannot import class_name 'no.Such'"):
        load_interactions(str(path))


class EchoLoop:
    """A custom loop: answers with a fixed token list, no engine call."""

    def __init__(self, context, token: int = 7):
        self.token = token

    async def run(self, row, generator):
        return AgentLoopOutput(prompt_ids=list(row["raw_prompt_ids"]), response_ids=[self.token], response_mask=[1],
                               response_logprobs=[0.0], finish_reason="stop", num_turns=2)


def test_custom_agent_loop_from_config_with_kwargs(tmp_path, tiny_tokenizer):
    path = tmp_path / "loops.yaml"
    path.write_text("- name: echo\n  _target_: tests.agents.test_interactions.EchoLoop\n  token: 11\n")
    kwargs = load_agent_loop_config(str(path))
    mgr, _ = manager(tiny_tokenizer, wrong_then_right)
    mgr.loop_kwargs = kwargs
    out = run(mgr, tiny_tokenizer, rows=[{"agent_name": "echo", "raw_prompt_ids": [1, 2]}])[0]
    assert out.response_ids == [11] and out.prompt_ids == [1, 2]
