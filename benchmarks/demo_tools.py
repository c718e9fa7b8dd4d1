"""The tool-use pieces of the ``tools`` demo preset (``demo_presets.py``): tool config, tool-agent rows, SFT warm-up.

    tools.yaml (the preset's tools) ──► rows: reasoning-gym questions as tool-agent rows
         │                                 (``agent_name: tool_agent``, ``extra_info.tools_kwargs``)
         ▼
    [base model, held-out greedy accuracy and tool-call share]             (only with a warm-up)
    SFT warm-up on synthetic traces: question ─► hermes call ─► the tool's real answer (masked) ─► answer
         ▼
    GRPO with multi-turn rollouts (multi_turn.* overrides, reward = the task's answer check)

A model too small to follow the tool format from its prompt alone (SmolLM2-135M never calls the
tool) first sees a few traces written in the exact format the tool agent parses, rendered with the
tool schemas as the rollout renders them (``data.multiturn.tools_key``). The trace's tool turn is
the configured tool's real ``execute`` output and, as at RL time, is not a training target.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from typing import Any

from hybridflow.config import SFTConfig, load_config
from hybridflow.data.files import read_rows
from hybridflow.data.preprocess import tool_use
from hybridflow.data.preprocess.common import write_splits
from hybridflow.errors import DataError
from hybridflow.rewards import final_answer
from hybridflow.tools.config import load_tools
from hybridflow.trainer.sft_trainer import build_trainer, make_tracking


@dataclass(frozen=True)
class SFTWarmup:
    """A short SFT before GRPO: on tool-use traces when the preset has tools, else on worked sums."""

    traces: int
    """How many training questions become traces (the first ones of the train split)."""
    tool_every: int = 1
    """With tools: every ``tool_every``-th trace calls the tool; the others answer directly (the same right answer,
    no tool turn). Above 1 the warmed-up model knows the format but mostly answers without the tool,
    so GRPO, rewarded for right answers only, has to find out that the tool pays."""
    overrides: tuple[str, ...] = field(default_factory=tuple)
    """SFT config overrides (batch size, learning rate, epochs)."""


def write_tool_config(run_dir: str, class_names: tuple[str, ...]) -> str:
    """``run_dir/tools.yaml`` listing the tools (built-ins need no schema: they carry their own)."""
    path = os.path.join(run_dir, "tools.yaml")
    with open(path, "w") as fh:
        fh.write("tools:\n" + "".join(f"  - class_name: {name}\n" for name in class_names))
    return path


def tool_overrides(tool_config: str) -> list[str]:
    """What every tools-preset run sets: multi-turn rollouts with the tools of ``tool_config``, scored by
    the task's answer check on the final answer (not on numbers a tool printed; rewards/final_answer.py)."""
    return ["actor_rollout_ref.rollout.multi_turn.enable=True",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
            f"custom_reward_function.path={final_answer.__file__}"]


def write_tool_rows(*, task: str, task_config: tuple[str, ...], train_size: int, test_size: int, tool: str,
                    system_prompt: str, out: str) -> tuple[str, str]:
    """Train/test parquet of tool-agent rows (the tool_use preprocess script over reasoning-gym)."""
    argv = ["--local_save_dir", out, "--tool", tool, "--system_prompt", system_prompt, "--", "reasoning_gym",
            "--task", task, "--size", str(train_size), "--test_size", str(test_size)]
    for item in task_config:
        argv += ["--config", item]
    paths = tool_use.main(argv)
    return paths["train"], paths["test"]


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """A hermes tool call, laid out as the tool system message shows it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


async def tool_answer(tool, arguments: dict[str, Any], create_kwargs: dict[str, Any]) -> str:
    """The tool's real reply to one call (create, execute, release)."""
    instance_id, _ = await tool.create(None, create_kwargs=create_kwargs)
    try:
        response, _, _ = await tool.execute(instance_id, arguments)
    finally:
        await tool.release(instance_id)
    return response if isinstance(response, str) else response.text


def calculator_trace(row: dict[str, Any], tool, *, index: int, use_tool: bool) -> dict[str, Any]:
    """One SFT row: the row's prompt, a call with the question's expression, the tool's reply, the answer
    (``use_tool=False``: the prompt and the answer alone)."""
    metadata = json.loads((row.get("extra_info") or {}).get("metadata") or "{}")
    expression = metadata.get("expression")
    if not expression:
        raise DataError(f"train row {index} has no extra_info.metadata.expression to write a calculator trace from; "
                        "use a reasoning-gym arithmetic task (basic_arithmetic, chain_sum) for the warm-up")
    arguments = {"expression": str(expression)}
    kwargs = ((row["extra_info"].get("tools_kwargs") or {}).get(tool.name) or {}).get("create_kwargs") or {}
    result = asyncio.run(tool_answer(tool, arguments, kwargs))
    prompt = list(row["prompt"].tolist() if hasattr(row["prompt"], "tolist") else row["prompt"])
    call = [{"role": "assistant", "content": call_text(tool.name, arguments)}, {"role": "tool", "content": result}]
    messages = [*prompt, *(call if use_tool else []), {"role": "assistant", "content": result}]
    return {"messages": messages, "tools": json.dumps([tool.get_openai_tool_schema()])}


def write_warmup_traces(train: str, tool_config: str, out: str, *, count: int, tool_every: int = 1) -> str:
    """``out/sft_traces.parquet``: traces of the first ``count`` training questions, every ``tool_every``-th
    through the calculator."""
    tools = {tool.name: tool for tool in load_tools(tool_config)}
    if "calculator" not in tools:
        raise DataError(f"the SFT warm-up writes calculator traces, but {tool_config} has no calculator tool")
    rows = read_rows(train)[:count]
    traces = [calculator_trace(row, tools["calculator"], index=i, use_tool=i % tool_every == 0)
              for i, row in enumerate(rows)]
    return write_splits({"sft_traces": traces}, out)["sft_traces"]


def run_sft_warmup(warmup: SFTWarmup, *, model: str, traces: str, out: str) -> str:
    """SFT ``model`` on ``traces`` into ``out``; returns the trained model's HF folder."""
    overrides = [f"model.partial_pretrain={model}", f"data.train_files={traces}", "data.multiturn.enable=True",
                 "data.multiturn.messages_key=messages", "data.multiturn.tools_key=tools",
                 "trainer.logger=[console,file]", f"trainer.default_local_dir={out}",
                 "trainer.project_name=hybridflow-demo", "trainer.experiment_name=sft-warmup", *warmup.overrides]
    print("[demo] SFT warm-up overrides:\n  " + "\n  ".join(overrides))
    cfg = load_config(SFTConfig, overrides)
    trainer = build_trainer(cfg)
    tracking = make_tracking(cfg)
    try:
        trainer.fit(tracking)
    finally:
        tracking.finish()
    return os.path.join(out, f"global_step_{trainer.global_step}", "model", "huggingface")
