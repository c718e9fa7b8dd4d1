"""A tool that answers with pictures, a tiny Qwen2.5-VL that calls it, and rows that ask for it: the pieces of the
multi-turn vision-language tests (importable by class path from a tool config, also in a trainer subprocess)."""

from __future__ import annotations

from typing import Any

from hybridflow.tools.base import BaseTool, ToolResponse

SHOW_PICTURE = '<tool_call>{"name": "show_picture", "arguments": {}}</tool_call>'

PICTURE_TOOL_CONFIG = """
tools:
  - class_name: tests.vision.picture_tools.PictureTool
    config: {{colour: {colour}, count: {count}}}
"""


class PictureTool(BaseTool):
    """``show_picture()``: ``config.count`` solid pictures of ``config.colour`` (56 x 56 pixels: 4 image tokens
    each for the tiny processor) and a line of text."""

    default_schema = {"type": "function", "function": {
        "name": "show_picture", "description": "Show the picture again, closer.",
        "parameters": {"type": "object", "properties": {}}}}

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        from PIL import Image

        pictures = [Image.new("RGB", (56, 56), self.config.get("colour", "red"))
                    for _ in range(int(self.config.get("count", 1)))]
        return ToolResponse(text="Here it is.", image=pictures), 0.0, {}


def write_picture_tool_config(path, *, colour: str = "red", count: int = 1) -> str:
    path.write_text(PICTURE_TOOL_CONFIG.format(colour=colour, count=count))
    return str(path)


def picture_calling_vl_model_dir(path) -> str:
    """The tiny Qwen2.5-VL whose tokenizer has the whole ``show_picture`` call as one added token, biased towards it
    (as ``tests.trainer.test_agent_ppo.tool_calling_model_dir`` biases the text model): hidden dim 0 is a constant 0.2
    on text tokens (no decoder layer writes to it) and the call token's tied embedding holds 1.2 there."""
    import torch
    import transformers

    from hybridflow.models.tiny import VL_ARCHS, build_tiny_tokenizer, build_tiny_vl_processor, tiny_vl_config

    tokenizer = build_tiny_tokenizer()
    tokenizer.add_tokens([SHOW_PICTURE])
    processor = build_tiny_vl_processor(tokenizer)
    torch.manual_seed(0)
    model = getattr(transformers, VL_ARCHS["qwen2_5_vl"].model)(tiny_vl_config(processor.tokenizer)).float()
    model.generation_config.eos_token_id = processor.tokenizer.eos_token_id
    model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
    language = model.model.language_model
    with torch.no_grad():
        embed = language.embed_tokens.weight
        embed[:, 0] = 0.2
        embed[processor.tokenizer.convert_tokens_to_ids(SHOW_PICTURE), 0] = 1.2
        for layer in language.layers:
            layer.self_attn.o_proj.weight[0].zero_()
            layer.mlp.down_proj.weight[0].zero_()
    model.save_pretrained(path, safe_serialization=True)
    processor.save_pretrained(path)
    return str(path)


def picture_rows(count: int, *, colours=("red", "green", "blue", "yellow")) -> list[dict]:
    """verl-schema tool-agent rows, each with one picture (``<image>`` in its prompt) of a colour of its own."""
    from PIL import Image

    from hybridflow.data.vision import image_to_bytes

    return [{
        "prompt": [{"role": "user", "content": f"<image>What colour is picture {i}? Look closer with the tool."}],
        "images": [image_to_bytes(Image.new("RGB", (56 + 28 * (i % 2), 56), colours[i % len(colours)]))],
        "data_source": "picture_tool", "ability": "vision", "agent_name": "tool_agent",
        "reward_model": {"style": "rule", "ground_truth": colours[i % len(colours)]},
        "extra_info": {"index": i},
    } for i in range(count)]
