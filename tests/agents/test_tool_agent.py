"""The tool agent loop: masks over observation spans, tool errors and time-outs, turn limits, batching."""

from __future__ import annotations

import asyncio

import pytest

from hybridflow.agents import AgentContext, AgentLoopManager, MultiTurnSettings
from hybridflow.agents.chat import tokenization_matches
from hybridflow.rollout import SamplingParams
from hybridflow.tools import BaseTool, ToolResponse
from hybridflow.tools.answer_check import AnswerCheckTool
from hybridflow.tools.calculator import CalculatorTool
from tests.agents.scripted import ScriptedEngine

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'


def manager(tokenizer, reply, *, tools=(CalculatorTool(),), interactions=None, **settings):
    defaults = dict(prompt_length=1024, response_length=256, max_assistant_turns=5)
    ctx = AgentContext(tokenizer=tokenizer, settings=MultiTurnSettings(**{**defaults, **settings}),
                       tools={t.name: t for t in tools}, interactions=interactions or {})
    engine = ScriptedEngine(tokenizer, reply)
    return AgentLoopManager(engine=engine, context=ctx, default_agent_loop="tool_agent"), engine


def run(mgr, tokenizer, rows=None, n_rows=1):
    rows = rows or [{"raw_prompt": [{"role": "user", "content": "What is 6*7?"}], "extra_info": {}}] * n_rows
    params = SamplingParams(n=1, max_tokens=mgr.context.settings.response_length,
                            stop_token_ids=[tokenizer.eos_token_id], seed=0)
    return mgr.run(rows, params)


def call_then_answer(text: str) -> str:
    return "The answer is 42." if "<|im_start|>tool" in text else "Let me compute. " + CALL


def test_observation_tokens_are_masked_out_and_the_context_reads_as_the_template(tiny_tokenizer):
    tok = tiny_tokenizer
    mgr, _ = manager(tok, call_then_answer)
    out = run(mgr, tok)[0]
    turn1 = tok("Let me compute. " + CALL, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    observation = tok("\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    turn2 = tok("The answer is 42.", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert out.response_ids == turn1 + observation + turn2
    assert out.response_mask == [1] * len(turn1) + [0] * len(observation) + [1] * len(turn2)
    assert out.response_logprobs == [-0.5] * len(turn1) + [0.0] * len(observation) + [-0.5] * len(turn2)
    assert out.num_turns == 4  # prompt + assistant + tool + assistant (verl's count)
    assert out.metrics["tool_calls"] == 1 and out.metrics["tool_errors"] == 0
    assert out.metrics["tokenization_mismatch"] == 0.0
    assert out.extra_info["final_answer"] == "The answer is 42."  # the last turn, not the tool's "42"


def test_strict_sanity_check_catches_a_missing_newline_and_ignore_strippable_does_not(tiny_tokenizer):
    tok = tiny_tokenizer
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
                {"role": "tool", "content": "42"}, {"role": "assistant", "content": "done"}]
    good = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n" \
           "<|im_start|>assistant\ndone<|im_end|>"
    bad = good.replace("ok<|im_end|>\n<|im_start|>tool", "ok<|im_end|><|im_start|>tool")

    def check(text, mode):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        return tokenization_matches(tok, context_ids=ids, messages=messages, tool_schemas=[], template_kwargs={},
                                    mode=mode)

    assert check(good, "strict") and not check(bad, "strict")
    assert check(bad, "ignore_strippable") and check(bad, "disable")


def test_several_calls_in_one_turn_run_up_to_max_parallel_calls(tiny_tokenizer):
    two = CALL + CALL.replace("6*7", "2+2")

    def reply(text):
        return "done" if "<|im_start|>tool" in text else two

    out = run(manager(tiny_tokenizer, reply, max_parallel_calls=2)[0], tiny_tokenizer)[0]
    observed = tiny_tokenizer.decode([t for t, m in zip(out.response_ids, out.response_mask) if m == 0])
    assert "42" in observed and "4<|im_end|>" in observed and out.metrics["tool_calls"] == 2
    out = run(manager(tiny_tokenizer, reply, max_parallel_calls=1)[0], tiny_tokenizer)[0]
    observed = tiny_tokenizer.decode([t for t, m in zip(out.response_ids, out.response_mask) if m == 0])
    assert "42" in observed and "skipped" in observed
    assert out.metrics["tool_calls"] == 1 and out.metrics["tool_errors"] == 1


@pytest.mark.parametrize("bad_call, expected", [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>', "not valid JSON"),
    ('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "no tool named 'nope'"),
    ('<tool_call>{"name": "calculator", "arguments": {"expression": 1', "not closed"),
])
def test_malformed_calls_get_an_error_turn_not_a_crash(tiny_tokenizer, bad_call, expected):
    def reply(text):
        return "sorry" if "<|im_start|>tool" in text else bad_call

    out = run(manager(tiny_tokenizer, reply)[0], tiny_tokenizer)[0]
    observed = tiny_tokenizer.decode([t for t, m in zip(out.response_ids, out.response_mask) if m == 0])
    assert expected in observed and out.metrics["tool_errors"] == 1
    assert out.metrics["assistant_turns"] == 2  # the model got its error back and answered


class RaisingTool(BaseTool):
    default_schema = {"type": "function", "function": {"name": "calculator"}}

    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("disk on fire")


class HangingTool(BaseTool):
    default_schema = {"type": "function", "function": {"name": "calculator"}}

    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(30)
        return ToolResponse(text="late"), 0.0, {}


@pytest.mark.parametrize("tool, expected, timeouts", [(RaisingTool(), "RuntimeError: disk on fire", 0),
                                                      (HangingTool(), "did not answer within 0.05 s", 1)])
def test_tool_exceptions_and_time_outs_are_error_turns(tiny_tokenizer, tool, expected, timeouts):
    mgr, _ = manager(tiny_tokenizer, call_then_answer, tools=(tool,), tool_timeout_s=0.05)
    out = run(mgr, tiny_tokenizer)[0]
    observed = tiny_tokenizer.decode([t for t, m in zip(out.response_ids, out.response_mask) if m == 0])
    assert expected in observed
    assert out.metrics["tool_errors"] == 1 and out.metrics["tool_timeouts"] == timeouts


def always_call(text: str) -> str:
    return CALL


@pytest.mark.parametrize("limits, assistant_turns, user_turns", [
    ({"max_assistant_turns": 3}, 3, 2),
    ({"max_assistant_turns": None, "max_user_turns": 2}, 3, 2),
    ({"max_assistant_turns": 1}, 1, 0),
])
def test_turn_limits(tiny_tokenizer, limits, assistant_turns, user_turns):
    out = run(manager(tiny_tokenizer, always_call, **limits)[0], tiny_tokenizer)[0]
    assert (out.metrics["assistant_turns"], out.metrics["user_turns"]) == (assistant_turns, user_turns)
    assert out.extra_info["final_answer"] == ""  # it ended on a call: no answer


def test_length_budget_ends_the_conversation_within_response_length(tiny_tokenizer):
    out = run(manager(tiny_tokenizer, always_call, max_assistant_turns=None, response_length=60)[0],
              tiny_tokenizer)[0]
    assert len(out.response_ids) <= 60 and len(out.response_mask) == len(out.response_ids)
    assert out.response_mask[-1] == 1  # it never ends on an observation


def test_turns_of_concurrent_conversations_share_engine_calls(tiny_tokenizer, monkeypatch):
    from hybridflow.agents import generator

    # The batch waits for tool calls in flight up to TOOL_WAIT_S (ending as soon as none is left); on a loaded
    # machine a tool thread may not be scheduled within the 20 ms default, which splits the batch. The test is of
    # the batching, not of the scheduler: give it a wait no scheduler misses.
    monkeypatch.setattr(generator, "TOOL_WAIT_S", 10.0)
    mgr, engine = manager(tiny_tokenizer, call_then_answer)
    outs = run(mgr, tiny_tokenizer, n_rows=5)
    assert [o.metrics["assistant_turns"] for o in outs] == [2] * 5
    assert engine.batch_sizes == [5, 5]


def test_answer_check_tool_reward_reaches_extra_info(tiny_tokenizer):
    submit = '<tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": "42"}}</tool_call>'
    row = {"raw_prompt": [{"role": "user", "content": "6*7?"}],
           "extra_info": {"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "42"}}}}}
    mgr, _ = manager(tiny_tokenizer, lambda t: "ok" if "<|im_start|>tool" in t else submit, tools=(AnswerCheckTool(),))
    out = run(mgr, tiny_tokenizer, rows=[row])[0]
    assert out.extra_info["tool_rewards"] == {"calc_gsm8k_reward": 1.0}
    assert out.extra_info["tool_step_rewards"] == [0.0]
    mgr, _ = manager(tiny_tokenizer, lambda t: "no tool", tools=(AnswerCheckTool(),))
    assert run(mgr, tiny_tokenizer, rows=[row])[0].extra_info["tool_rewards"] == {}
