"""Vision-language models (Qwen2-VL / Qwen2.5-VL): recognising one, its processor, its vision tower, and the
vision inputs of a forward.

A VLM's batch carries one ``multi_modal_inputs`` dict per row (verl's non-tensor column): ``pixel_values
[n_patches_i, C * t * p * p]`` and ``image_grid_thw [n_images_i, 3]`` of that row's images, since the
patch count differs by row. A forward over rows ``i = 1..b`` concatenates them in row order (the model
scatters the tower's output onto the ``<|image_pad|>`` tokens in that same order) and lets the model
compute its 3-D M-RoPE positions with its own ``get_rope_index`` from ``input_ids``, the image grids,
the modality of each token and the attention mask (so left padding and response tokens are placed as
HF places them).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Sequence

import torch

from hybridflow.errors import DataError

logger = logging.getLogger(__name__)

VISION_INPUT_KEYS = ("pixel_values", "image_grid_thw")
VISION_TOWER_NAMES = ("visual", "vision_tower", "vision_model")
"""What HF VLMs call their vision encoder module."""
"""The per-row entries of ``multi_modal_inputs`` a forward concatenates."""


def is_vision_language(config) -> bool:
    """A config with a vision tower and an image placeholder token (Qwen2-VL, Qwen2.5-VL, ...)."""
    return getattr(config, "vision_config", None) is not None and getattr(config, "image_token_id", None) is not None


def vision_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """The vision encoder of an HF VLM (``model.model.visual`` for Qwen2.5-VL), found under any wrapper
    (LoRA, FSDP); None for a text model."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in VISION_TOWER_NAMES:
            return module
    return None


def freeze_vision_tower(model: torch.nn.Module) -> int:
    """Stop training the vision tower (verl's ``actor.freeze_vision_tower``): its parameters get no
    gradients, so the optimizer never moves them. Returns how many parameters were frozen."""
    tower = vision_tower(model)
    if tower is None:
        logger.warning("actor_rollout_ref.actor.freeze_vision_tower=True: %s has no vision tower; nothing frozen",
                       type(model).__name__)
        return 0
    tower.requires_grad_(False)
    frozen = sum(p.numel() for p in tower.parameters())
    logger.info("the vision tower (%d parameters) is frozen", frozen)
    return frozen


VISION_TOKEN_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def vision_token_ids(config) -> list[int]:
    """A VLM config's vision special tokens (image / video pads, vision start / end): what a response must
    never hold. Empty for a text model."""
    if not is_vision_language(config):
        return []
    return sorted({int(getattr(config, key)) for key in VISION_TOKEN_KEYS if getattr(config, key, None) is not None})


def image_token_id(model: torch.nn.Module) -> int:
    return int(model.config.image_token_id)


def vision_forward_inputs(model: torch.nn.Module, rows: Sequence[dict | None] | None,
                          input_ids: torch.Tensor) -> dict:
    """Forward kwargs carrying the images of ``rows`` (one ``multi_modal_inputs`` dict or None per row of
    ``input_ids [b, L]``): ``pixel_values`` and ``image_grid_thw`` concatenated in row order, and
    ``mm_token_type_ids [b, L]`` (1 on image tokens) from which the model computes its 3-D positions.
    Rows without images add nothing; a batch without any image gets ``{}`` (a plain text forward).

    Raises:
        DataError: the image tokens of ``input_ids`` are not the images' ``sum_i t_i h_i w_i / merge^2``
            tokens (images lost on the way would otherwise be read as text, in silence).
    """
    if not is_vision_language(model.config):
        return {}
    present = [row for row in (() if rows is None else rows) if row and row.get("pixel_values") is not None]
    check_image_tokens(model, present, input_ids)
    if not present:
        return {}
    device = input_ids.device
    inputs = {key: torch.cat([torch.as_tensor(row[key]) for row in present]).to(device) for key in VISION_INPUT_KEYS}
    inputs["pixel_values"] = inputs["pixel_values"].to(next(vision_tower(model).parameters()).dtype)
    inputs["mm_token_type_ids"] = (input_ids == image_token_id(model)).int()
    return inputs


def check_image_tokens(model: torch.nn.Module, rows: Sequence[dict], input_ids: torch.Tensor) -> None:
    """The image tokens of ``input_ids`` are the images' ``sum t h w / merge^2``; a text batch (no rows with images)
    needs none, and reads no merge size (a Gemma 3 tower has none: its text rows run as a text model's)."""
    expected = 0
    if rows:
        merge = model.config.vision_config.spatial_merge_size ** 2
        expected = sum(int(torch.as_tensor(row["image_grid_thw"]).prod(-1).sum()) // merge for row in rows)
    found = int((input_ids == image_token_id(model)).sum())
    if found != expected:
        raise DataError(f"the batch holds {found} image tokens but its images make {expected}: each row needs the "
                        "images of its prompt (multi_modal_inputs), and a prompt's text must not spell out "
                        "<|image_pad|> itself")


def image_only_processor(class_name: str, *, image_processor, tokenizer, chat_template: str | None = None):
    """The processor class ``class_name`` (say ``Qwen2_5_VLProcessor``) built for images only.

    transformers' Qwen-VL processors also need a video processor, and that needs torchvision; RL on
    images never calls it. The subclass (same name, so ``save_pretrained`` writes the real class) takes
    the image processor and the tokenizer alone.
    """
    import transformers

    base = getattr(transformers, class_name)

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        base.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    cls = _image_only_class(base, __init__)
    return cls(image_processor=image_processor, tokenizer=tokenizer, chat_template=chat_template)


@functools.cache
def _image_only_class(base, init):
    return type(base.__name__, (base,), {"__init__": init, "__module__": __name__})


PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
"""The files of a model folder that describe its image processor (either one is enough)."""


def has_processor(path: str) -> bool:
    """A model folder that ships an image processor."""
    folder = os.path.expanduser(str(path))
    return any(os.path.isfile(os.path.join(folder, name)) for name in PROCESSOR_FILES)


def _processor_class_name(folder: str) -> str:
    for name in PROCESSOR_FILES:
        try:
            with open(os.path.join(folder, name)) as handle:
                found = json.load(handle).get("processor_class")
        except (OSError, ValueError):
            continue
        if found:
            return found
    return "Qwen2_5_VLProcessor"


def load_processor(path: str, *, tokenizer, trust_remote_code: bool = False, call_kwargs: dict | None = None):
    """The model's processor around ``tokenizer`` (the policy's, with its chat template), or None when the
    folder has no image processor (a text model).

    Built for images only (:func:`image_only_processor`) from the folder's image processor and its
    ``processor_class``; the chat template is the tokenizer's (a Qwen-VL folder ships the same one).
    ``call_kwargs`` (verl's ``data.mm_processor_kwargs``) join every call: :class:`ProcessorWithCallKwargs`.
    """
    from transformers import AutoImageProcessor

    folder = os.path.expanduser(str(path))
    if not os.path.isdir(folder) or not has_processor(folder):
        return None
    image_processor = AutoImageProcessor.from_pretrained(folder, trust_remote_code=trust_remote_code)
    processor = image_only_processor(_processor_class_name(folder), image_processor=image_processor,
                                     tokenizer=tokenizer, chat_template=tokenizer.chat_template)
    return ProcessorWithCallKwargs(processor, call_kwargs) if call_kwargs else processor


class ProcessorWithCallKwargs:
    """A processor whose every call, and every call of its image processor (a tool's images go through that alone),
    gets ``call_kwargs`` (verl's ``data.mm_processor_kwargs``, e.g. ``{"max_pixels": 200704}``) under the call's own
    arguments, as verl passes them to its processor; everything else is the wrapped processor's."""

    def __init__(self, processor, call_kwargs: dict):
        self.wrapped, self.call_kwargs = processor, dict(call_kwargs)

    def __call__(self, *args, **kwargs):
        return self.wrapped(*args, **{**self.call_kwargs, **kwargs})

    @property
    def image_processor(self):
        return ProcessorWithCallKwargs(self.wrapped.image_processor, self.call_kwargs)

    def __getattr__(self, name: str):
        if name in ("wrapped", "call_kwargs"):  # not set yet (unpickling): no recursion through wrapped
            raise AttributeError(name)
        return getattr(self.wrapped, name)
