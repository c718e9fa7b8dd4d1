"""A vision-language policy's images in the agent loops: one conversation's images, kept through every turn.

A row's prompt images come with it (``multi_modal_inputs``: ``pixel_values [n_patches, C*t*p*p]``,
``image_grid_thw [n_images, 3]``, made by the dataset from its ``images`` column). The loop renders the
prompt's ``<image>`` placeholders as image parts, the chat template writes one ``<|image_pad|>`` for each,
and each pad is repeated to its image's token count (``t * h * w / merge^2``), as the processor does. A
tool's images (the image parts of its tool message) go through the processor's image processor: their
tokens join the observation (mask 0) and their pixels are appended to the conversation's
``multi_modal_inputs``, which so holds every image of prompt + response in token order; each turn is
generated, and the conversation trained, with all of them.
"""

from __future__ import annotations

from typing import Any

from hybridflow.data.vision import expand_image_tokens, image_inputs, image_messages


def image_count(images: dict | None) -> int:
    """Images in a ``multi_modal_inputs`` dict (0 for None)."""
    return 0 if not images else len(images["image_grid_thw"])


def prompt_messages(row: dict) -> list[dict]:
    """The row's ``raw_prompt`` messages, each ``<image>`` an image part when the row has images."""
    messages, images = list(row["raw_prompt"]), row.get("multi_modal_inputs")
    if not image_count(images):
        return messages
    return image_messages(messages, image_count(images), row_index=row_index_of(row), image_key="images")


def with_image_tokens(processor, ids: list[int], images: dict | None, *, row_index: int) -> list[int]:
    """``ids`` (one ``<|image_pad|>`` per image, as the template writes them) with each pad repeated to its image's
    token count; ``ids`` unchanged without images."""
    if not image_count(images):
        return ids
    return expand_image_tokens(processor, ids, images["image_grid_thw"], row_index=row_index)


def message_images(messages: list[dict]) -> list[Any]:
    """The images of ``messages``' image parts (``{"type": "image", "image": PIL image}``), in order."""
    return [part["image"] for message in messages if isinstance(message.get("content"), list)
            for part in message["content"] if part.get("type") == "image" and "image" in part]


def observation_images(processor, messages: list[dict], *, row_index: int) -> dict | None:
    """Vision inputs of the images in ``messages`` (a tool's reply), or None when they hold none."""
    images = message_images(messages)
    return image_inputs(processor, images, row_index=row_index) if images and processor is not None else None


def collapse_image_tokens(ids: list[int], pad_id: int) -> list[int]:
    """``ids`` with each run of ``pad_id`` cut to one token: the chat template's own text of the images (the
    runs of two images are apart: each has its vision start and end tokens)."""
    return [token for i, token in enumerate(ids) if token != pad_id or i == 0 or ids[i - 1] != pad_id]


def row_index_of(row: dict) -> int:
    """The row's index in its file (its errors name it), 0 when unknown."""
    index = row.get("index")
    return index if isinstance(index, int) else 0
