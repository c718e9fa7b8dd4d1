"""A conversation's images in the agent loops: the prompt's images go with every turn, a tool's images become
observation tokens (mask 0) and join the row's ``multi_modal_inputs`` in token order, and reach the training forward."""

from __future__ import annotations

import pytest
import torch

from hybridflow.agents import AgentContext, AgentLoopManager, MultiTurnSettings
from hybridflow.data.vision import image_token_counts, process_image_prompt
from hybridflow.rollout import SamplingParams
from tests.agents.scripted import ScriptedEngine
from tests.vision.conftest import solid_image
from tests.vision.picture_tools import PictureTool

CALL = '<tool_call>{"name": "show_picture", "arguments": {}}</tool_call>'
PROMPT = [{"role": "user", "content": "<image>What colour is it? Look closer."}]


def picture_row(processor, *, width: int = 84) -> dict:
    """A tool-agent row with one picture, as the dataset hands it to the rollout (``multi_modal_inputs``)."""
    _, images = process_image_prompt(processor, PROMPT, [solid_image(width, 56, "green")], row_index=0)
    return {"raw_prompt": PROMPT, "multi_modal_inputs": images, "extra_info": {}, "index": 0}


def run_loops(processor, rows, *, calls: int, colour: str = "red", count: int = 1, engine=None):
    """Each row's tool agent: ``calls`` turns that call ``show_picture`` (``count`` pictures of ``colour``), then an
    answer. Returns (outputs, the engine)."""
    tokenizer = processor.tokenizer

    def reply(text: str) -> str:
        return CALL if text.count("Here it is.") < calls else "It is green."

    engine = engine or ScriptedEngine(tokenizer, reply)
    context = AgentContext(tokenizer=tokenizer, settings=MultiTurnSettings(prompt_length=512, response_length=512),
                           tools={"show_picture": PictureTool({"colour": colour, "count": count})}, processor=processor)
    manager = AgentLoopManager(engine=engine, context=context, default_agent_loop="tool_agent")
    params = SamplingParams(n=1, max_tokens=512, stop_token_ids=[tokenizer.eos_token_id], seed=0)
    return manager.run(rows, params), engine


def test_images_are_counted_across_turns_and_every_turn_sees_them_all(tiny_vl):
    _, processor = tiny_vl
    row = picture_row(processor)
    prompt_grid = row["multi_modal_inputs"]["image_grid_thw"].clone()
    (out,), engine = run_loops(processor, [row], calls=2, count=2)
    images = out.multi_modal_inputs
    # the prompt's picture (84 x 56: 6 x 4 patches), then 2 + 2 of the tool's (56 x 56: 4 x 4 patches), in order
    assert images["image_grid_thw"].tolist() == [[1, 4, 6]] + [[1, 4, 4]] * 4
    assert images["pixel_values"].shape[0] == int(images["image_grid_thw"].prod(-1).sum())
    assert [len(call[0]["image_grid_thw"]) for call in engine.images] == [1, 3, 5]  # each turn, the images so far
    pad = processor.image_token_id
    counts = image_token_counts(processor, images["image_grid_thw"])
    assert sum(t == pad for t in out.prompt_ids) == counts[0] == 6
    assert sum(t == pad for t in out.response_ids) == sum(counts[1:]) == 16
    assert all(m == 0 for t, m in zip(out.response_ids, out.response_mask) if t == pad)  # observations: mask 0
    assert out.metrics["tool_errors"] == 0 and out.metrics["tokenization_mismatch"] == 0
    assert torch.equal(row["multi_modal_inputs"]["image_grid_thw"], prompt_grid)  # the row's own dict is untouched


def test_a_conversation_without_tool_images_keeps_the_prompt_s_and_text_rows_pass_none(tiny_vl):
    _, processor = tiny_vl
    row = picture_row(processor)
    text_row = {"raw_prompt": [{"role": "user", "content": "Say hi."}], "extra_info": {}}
    (with_image, text), engine = run_loops(processor, [row, text_row], calls=0)
    assert with_image.multi_modal_inputs is row["multi_modal_inputs"] and text.multi_modal_inputs is None
    assert engine.images == [[row["multi_modal_inputs"], None]]


def test_a_tool_image_for_a_text_policy_or_a_video_is_an_error_turn(tiny_tokenizer):
    from hybridflow.agents.tool_calls import ToolSession
    from hybridflow.tools import ToolResponse
    from hybridflow.tools.parsers import ParsedTurn, ToolCall

    class VideoTool(PictureTool):
        async def execute(self, instance_id, parameters, **kwargs):
            return ToolResponse(text="a clip", video=[[solid_image(56, 56)]]), 0.0, {}

    settings = MultiTurnSettings(prompt_length=64, response_length=64)
    session = ToolSession({"show_picture": PictureTool()}, None, settings)
    (message,) = asyncio_run(session.run_turn(ParsedTurn(content="", calls=[ToolCall("show_picture", {})])))
    assert "but the policy is a text model" in message["content"] and session.counts["tool_errors"] == 1
    session = ToolSession({"show_picture": VideoTool()}, None, settings, takes_images=True)
    (message,) = asyncio_run(session.run_turn(ParsedTurn(content="", calls=[ToolCall("show_picture", {})])))
    assert "videos from tools are not supported" in message["content"]


def asyncio_run(coroutine):
    import asyncio

    return asyncio.run(coroutine)


@pytest.mark.parametrize("swap", ["prompt", "tool"])
def test_the_training_forward_reads_the_tool_s_picture(vl_arch, swap):
    """The same conversation tokens with the tool's picture red or blue: the log-probs after the picture change, the
    ones before it do not (swapping the prompt's picture changes them from the start); Qwen2.5-VL, Qwen2-VL and
    Qwen3-VL."""
    from hybridflow.data.rl_dataset import collate_prompts
    from hybridflow.trainer.loop.generation import prompts_to_batch
    from hybridflow.workers.logprob import batch_log_probs
    from hybridflow.workers.rollout import RolloutWorker

    model, processor = vl_arch

    def batch(tool_colour: str, prompt_width: int):
        row = picture_row(processor, width=prompt_width)
        sample = {"prompt_ids": [0], "raw_prompt": row["raw_prompt"], "multi_modal_inputs": row["multi_modal_inputs"],
                  "extra_info": {}, "index": 0}
        prompts = prompts_to_batch(collate_prompts([sample], pad_token_id=processor.tokenizer.pad_token_id))
        worker = RolloutWorker(engine=None, pad_token_id=processor.tokenizer.pad_token_id)
        worker.agent_loops = AgentLoopManager(engine=ScriptedEngine(processor.tokenizer, lambda text: (
            CALL if "Here it is." not in text else "It is green.")), context=AgentContext(
                tokenizer=processor.tokenizer, settings=MultiTurnSettings(prompt_length=512, response_length=512),
                tools={"show_picture": PictureTool({"colour": tool_colour})}, processor=processor),
            default_agent_loop="tool_agent")
        return worker.run_agent_loops(prompts, SamplingParams(n=1, max_tokens=512, seed=0,
                                                              stop_token_ids=[processor.tokenizer.eos_token_id]))

    base = batch("red", 84)
    other = batch("blue", 84) if swap == "tool" else batch("red", 112)
    assert torch.equal(base["responses"], other["responses"]) or swap == "prompt"
    a, b = (batch_log_probs(model, x, temperature=1.0, micro_batch_size=None)[0] for x in (base, other))
    pad = processor.image_token_id
    first_tool_image = base["responses"][0].tolist().index(pad)
    assert base["response_mask"][0, first_tool_image] == 0
    real = base["response_mask"][0].bool()
    after = real & (torch.arange(real.shape[0]) > first_tool_image)
    assert not torch.allclose(a[0, after], b[0, after])
    before = real & (torch.arange(real.shape[0]) < first_tool_image)
    assert torch.equal(a[0, before], b[0, before]) == (swap == "tool")


def test_verl_s_geo3k_multi_turn_rows_and_tool_config_run_through_the_tool_agent(tmp_path, tiny_vl):
    """Geometry3K rows as verl's geo3k_multiturn_w_tool.py writes them (``tool_use ... -- geo3k``), read by the RL
    dataset with the processor, run the tool agent with verl's geo3k tool config unchanged: the picture goes with
    every turn and the submitted answer is scored by the geo3k tool."""
    import pathlib

    import pandas as pd

    from hybridflow.data.preprocess import tool_use
    from hybridflow.data.rl_dataset import RLDataset
    from hybridflow.data.vision import image_to_bytes
    from hybridflow.tools.config import load_tools

    _, processor = tiny_vl
    source = tmp_path / "geometry3k"
    source.mkdir()
    for split in ("train", "test"):
        pd.DataFrame([{"images": [image_to_bytes(solid_image(84, 56))], "problem": "<image>Find x.", "answer": "36"}]
                     ).to_parquet(source / f"{split}-00000-of-00001.parquet")
    paths = tool_use.main(["--local_save_dir", str(tmp_path / "out"), "--tool", "calc_geo3k_reward", "--", "geo3k",
                           "--local_dataset_path", str(source)])
    dataset = RLDataset(paths["train"], processor.tokenizer, processor=processor, return_raw_chat=True)
    sample = dataset[0]
    assert sample["agent_name"] == "tool_agent" and "`calc_geo3k_reward` tool" in sample["raw_prompt"][0]["content"]
    assert sample["extra_info"]["tools_kwargs"] == {"calc_geo3k_reward": {"create_kwargs": {"ground_truth": "36"}}}
    config = pathlib.Path(__file__).parents[1] / "verl_commands" / "configs" / "geo3k_tool_config.yaml"
    (tool,) = load_tools(str(config))
    submit = '<tool_call>{"name": "calc_geo3k_reward", "arguments": {"answer": "36"}}</tool_call>'
    engine = ScriptedEngine(processor.tokenizer, lambda text: "x is 36." if "reward=1.0" in text else submit)
    context = AgentContext(tokenizer=processor.tokenizer, settings=MultiTurnSettings(prompt_length=512,
                           response_length=256), tools={tool.name: tool}, processor=processor)
    manager = AgentLoopManager(engine=engine, context=context, default_agent_loop="tool_agent")
    (out,) = manager.run([sample], SamplingParams(n=1, max_tokens=256, seed=0,
                                                   stop_token_ids=[processor.tokenizer.eos_token_id]))
    assert out.extra_info["tool_rewards"] == {"calc_geo3k_reward": 1.0} and out.extra_info["final_answer"] == "x is 36."
    assert [call[0] for call in engine.images] == [sample["multi_modal_inputs"]] * 2  # both turns saw the picture
    assert out.multi_modal_inputs is sample["multi_modal_inputs"] and out.metrics["tokenization_mismatch"] == 0
