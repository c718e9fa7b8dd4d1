"""Tools and interactions that fail cannot take a run down (issue 38): each failure is a tool
message to the model (as verl does) and a count; every call has a deadline, blocking ones too;
bad tool configs are one line at start-up; a tool failing on every call is said on the console."""

from __future__ import annotations

import logging
import time

import pytest

from hybridflow.agents.interactions import BaseInteraction, load_interactions
from hybridflow.errors import ConfigError
from hybridflow.tools import BaseTool, ToolResponse
from hybridflow.tools.config import load_tools
from tests.agents.test_tool_agent import call_then_answer, manager, run

SCHEMA = {"type": "function", "function": {"name": "calculator"}}


def tool_returning(value):
    class Tool(BaseTool):
        default_schema = SCHEMA

        async def execute(self, instance_id, parameters, **kwargs):
            return value

    return Tool()


class RaisingCreate(BaseTool):
    default_schema = SCHEMA

    async def create(self, instance_id=None, **kwargs):
        raise KeyError("ground_truth")

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text="never"), 0.0, {}


class BlockingTool(BaseTool):
    """An ``async def`` that blocks the thread (time.sleep): wait_for on the event loop could never fire."""

    default_schema = SCHEMA

    async def execute(self, instance_id, parameters, **kwargs):
        time.sleep(3)
        return ToolResponse(text="late"), 0.0, {}


class SyncTool(BaseTool):
    """A plain ``def execute``: it runs (in its thread) like an async one."""

    default_schema = SCHEMA

    def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text="sync 42"), 0.5, {}


def observed(tokenizer, out) -> str:
    return tokenizer.decode([t for t, m in zip(out.response_ids, out.response_mask) if m == 0])


@pytest.mark.parametrize("tool, expected", [
    (tool_returning(7), "returned int 7"),
    (tool_returning({"text": "42"}), "returned dict"),
    (tool_returning((ToolResponse(text="42"), "high", {})), "the reward 'high', which is not a finite number"),
    (tool_returning((42, 0.0, {})), "the response 42"),
    (RaisingCreate(), "create() raised KeyError"),
], ids=["int", "dict", "reward-not-a-number", "response-not-text", "create-raises"])  # fmt: skip
def test_a_failing_tool_call_is_an_error_message_and_a_count(tiny_tokenizer, tool, expected):
    out = run(manager(tiny_tokenizer, call_then_answer, tools=(tool,))[0], tiny_tokenizer)[0]
    assert expected in observed(tiny_tokenizer, out)
    assert out.metrics["tool_errors"] == 1 and out.metrics["assistant_turns"] == 2  # the model answered after


def test_a_blocking_tool_is_stopped_at_its_deadline(tiny_tokenizer):
    start = time.monotonic()
    out = run(manager(tiny_tokenizer, call_then_answer, tools=(BlockingTool(),), tool_timeout_s=0.2)[0],
              tiny_tokenizer)[0]
    assert time.monotonic() - start < 2.5  # not the tool's 3 s
    assert "did not answer within 0.2 s" in observed(tiny_tokenizer, out) and out.metrics["tool_timeouts"] == 1


def test_a_synchronous_tool_runs(tiny_tokenizer):
    out = run(manager(tiny_tokenizer, call_then_answer, tools=(SyncTool(),))[0], tiny_tokenizer)[0]
    assert "sync 42" in observed(tiny_tokenizer, out) and out.metrics["tool_errors"] == 0
    assert out.extra_info["tool_step_rewards"] == [0.5]


class BadReward(BaseTool):
    default_schema = SCHEMA

    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text="42"), 0.0, {}

    async def calc_reward(self, instance_id, **kwargs):
        raise ValueError("no ground truth")


def test_calc_reward_that_raises_is_counted_said_and_has_no_reward(tiny_tokenizer, caplog):
    """Issue 50: the count alone was silent on the console (execute worked, so the tool never 'failed on all')."""
    with caplog.at_level(logging.WARNING):
        out = run(manager(tiny_tokenizer, call_then_answer, tools=(BadReward(),))[0], tiny_tokenizer)[0]
    assert out.extra_info["tool_rewards"] == {} and out.metrics["tool_errors"] == 1
    (line,) = [r.getMessage() for r in caplog.records if "calc_reward" in r.getMessage()]
    assert line == ("tool 'calculator calc_reward()' failed on all 1 of its calls in this batch (first: tool "
                    "calculator calc_reward() raised ValueError: no ground truth); its conversations get no reward "
                    "from the tool: fix the tool or multi_turn.tool_config_path")


def test_a_tool_failing_on_every_call_is_said_on_the_console(tiny_tokenizer, caplog):
    mgr, _ = manager(tiny_tokenizer, call_then_answer, tools=(tool_returning(7),))
    with caplog.at_level(logging.WARNING):
        run(mgr, tiny_tokenizer, n_rows=3)
    lines = [r.getMessage() for r in caplog.records if "failed on all" in r.getMessage()]
    assert lines == [lines[0]] and "tool 'calculator' failed on all 3 of its calls" in lines[0]


class RaisingUser(BaseInteraction):
    async def generate_response(self, instance_id, messages, **kwargs):
        raise RuntimeError("judge offline")


class WrongShapeUser(BaseInteraction):
    async def generate_response(self, instance_id, messages, **kwargs):
        return False, "try again", "great", {}


def user_returning(reply):
    class User(BaseInteraction):
        async def generate_response(self, instance_id, messages, **kwargs):
            return reply

    return User({"name": "u"})


@pytest.mark.parametrize("user, said", [
    (RaisingUser({"name": "u"}), "generate_response() raised RuntimeError: judge offline"),
    (WrongShapeUser({"name": "u"}), "the reward 'great', which is not a finite number"),
    (user_returning((False, None, 0.0, {})), "the user's turn is a NoneType, not a str"),  # was sent as "None"
    (user_returning((False, {"content": "hi"}, 0.0, {})), "the user's turn is a dict, not a str"),
    (user_returning(None), "generate_response returned 'None': cannot unpack"),  # ended the conversation unsaid
], ids=["raises", "score-not-a-number", "text-none", "text-dict", "returns-none"])  # fmt: skip
def test_an_interaction_that_fails_ends_its_conversation_not_the_run(tiny_tokenizer, user, said, caplog):
    row = {"raw_prompt": [{"role": "user", "content": "hi"}], "extra_info": {"interaction_kwargs": {"name": "u"}}}
    mgr, _ = manager(tiny_tokenizer, lambda text: "an answer", tools=(), interactions={"u": user})
    with caplog.at_level(logging.WARNING):
        out = run(mgr, tiny_tokenizer, rows=[row])[0]
    assert out.metrics["interaction_errors"] == 1 and out.metrics["assistant_turns"] == 1
    assert "None" not in tiny_tokenizer.decode(out.response_ids)
    (line,) = [r.getMessage() for r in caplog.records if "interaction u" in r.getMessage()]
    assert said in line and line.endswith("its conversations end there: fix the tool or multi_turn.tool_config_path")


def test_an_interaction_that_ends_with_no_text_is_no_failure(tiny_tokenizer):
    row = {"raw_prompt": [{"role": "user", "content": "hi"}], "extra_info": {"interaction_kwargs": {"name": "u"}}}
    mgr, _ = manager(tiny_tokenizer, lambda text: "an answer", tools=(),
                     interactions={"u": user_returning((True, None, 1.0, {}))})
    out = run(mgr, tiny_tokenizer, rows=[row])[0]
    assert out.metrics["interaction_errors"] == 0 and out.metrics["assistant_turns"] == 1


def write(tmp_path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


class ExplodingTool(BaseTool):
    default_schema = SCHEMA

    def __init__(self, config=None, tool_schema=None):
        raise RuntimeError("needs an API key")


class NotATool:
    def __init__(self, config=None, tool_schema=None):
        self.name = "not_a_tool"


@pytest.mark.parametrize("text, message", [
    ("tools:\n  - class_name: [unclosed", "is not valid YAML"),
    ("just a string", "non-empty list under 'tools:'"),
    ("tools:\n  - class_name: hybridflow.tools.calculator.evaluate", "is a function, not a class"),
    ("tools:\n  - class_name: tests.agents.test_failing_tools.ExplodingTool",
     "ExplodingTool(...) raised RuntimeError: needs an API key"),
    ("tools:\n  - class_name: tests.agents.test_failing_tools.NotATool", "has no method create, execute"),
], ids=["yaml", "not-a-mapping", "function", "constructor-raises", "not-a-tool"])  # fmt: skip
def test_bad_tool_configs_are_one_line_at_start_up(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_tools(write(tmp_path, text))


def test_bad_interaction_configs_are_one_line_at_start_up(tmp_path):
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_interactions(write(tmp_path, "interaction: [{"))
    with pytest.raises(ConfigError, match="is a function, not a class"):
        load_interactions(write(tmp_path, "interaction:\n  - class_name: hybridflow.tools.calculator.evaluate"))
