"""Image rows (verl's multimodal schema) -> a VLM processor's prompt ids and per-row vision inputs.

A row holds ``images`` (``data.image_key``): a list whose entries are ``{"bytes": b"..."}`` (how a parquet
file written by ``datasets`` stores an image), ``{"path": "..."}`` or a path string, or a ``PIL.Image``.
Each ``<image>`` in the prompt's message text stands for the next image, in order (geo3k's problems
carry their own ``<image>``). The messages become content lists (``[{"type": "image"}, {"type": "text",
"text": ...}]``), the processor's chat template renders them, and the processor expands each image's
placeholder into one ``<|image_pad|>`` per merged patch and returns ``pixel_values [n_patches, D]`` and
``image_grid_thw [n_images, 3]`` (kept per row: rows have different patch counts).
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Sequence
from typing import Any

import torch

from hybridflow.data.assistant_mask import tokenize_with_assistant_mask
from hybridflow.data.chat import render
from hybridflow.errors import DataError

IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"


def load_image(image: Any, *, row_index: int, position: int = 0):
    """An RGB ``PIL.Image`` from a row's image entry (bytes dict, path dict, path string or PIL image).

    Bytes or a file that is not a readable image (corrupt, truncated, a text file, a decompression bomb past
    PIL's ``Image.MAX_IMAGE_PIXELS``) is a DataError naming the row, the entry and the fix."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    if isinstance(image, dict) and image.get("bytes") is not None:
        return _decode_image(io.BytesIO(image["bytes"]), what=f"{len(image['bytes'])} bytes", row_index=row_index,
                             position=position)
    path = image.get("path") if isinstance(image, dict) else image
    if isinstance(path, str) and os.path.isfile(os.path.expanduser(path)):
        return _decode_image(os.path.expanduser(path), what=f"file '{path}'", row_index=row_index, position=position)
    raise DataError(f"row {row_index}: an image entry must be {{'bytes': ...}}, {{'path': ...}}, an existing file "
                    f"path or a PIL image, got {type(image).__name__} {str(image)[:60]!r}; fix the data's image column")


def _decode_image(source, *, what: str, row_index: int, position: int):
    """``Image.open(source)`` decoded to RGB; what PIL refuses becomes one line (PIL raises OSError for corrupt,
    truncated or unidentified data, SyntaxError for some broken headers, DecompressionBombError past twice
    ``Image.MAX_IMAGE_PIXELS``)."""
    from PIL import Image

    try:
        with Image.open(source) as image:
            return image.convert("RGB")
    except Image.DecompressionBombError as err:
        raise DataError(f"row {row_index}: image {position} ({what}) is too large to decode safely ({err}); "
                        "downscale it, or drop the row") from None
    except (OSError, SyntaxError, ValueError) as err:
        raise DataError(f"row {row_index}: image {position} ({what}) is not a readable image ({err}); "
                        "re-encode it as PNG or JPEG, or drop the row") from None


def process_images(processor, text: str, images: Sequence[Any], *, row_index: int):
    """``processor(text=[text], images=...)`` of one row; an image the processor refuses (Qwen2-VL: an aspect
    ratio of 200 or more) is a DataError naming the row, the image sizes and the fix."""
    return _processed(processor, images, row_index=row_index, text=[text])


def image_inputs(processor, images: Sequence[Any], *, row_index: int) -> dict[str, torch.Tensor]:
    """``{"pixel_values" [n_patches, C*t*p*p], "image_grid_thw" [n_images, 3]}`` of ``images`` through the
    processor's image processor alone (images that come without text: a tool's reply); errors as
    :func:`process_images`."""
    out = _processed(processor.image_processor, images, row_index=row_index)
    return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


def _processed(processor, images: Sequence[Any], *, row_index: int, **text):
    pil = [load_image(image, row_index=row_index, position=i) for i, image in enumerate(images)]
    try:
        out = processor(images=pil, return_tensors="pt", **text)
    except ValueError as err:
        sizes = ", ".join(f"{im.width}x{im.height}" for im in pil)
        raise DataError(f"row {row_index}: the image processor refused the row's image(s) ({sizes}): {err}; resize or "
                        "pad the image(s) to a moderate aspect ratio, or drop the row") from None
    if "image_grid_thw" not in out:
        raise DataError(f"row {row_index}: images through {type(processor).__name__} are not supported: image rows "
                        "take a Qwen2-VL / Qwen2.5-VL processor (patch grids, image_grid_thw); use such a model, or "
                        "drop the image column to train on the text")
    return out


def require_processor_for_images(rows: Sequence[dict], *, processor, image_key: str) -> None:
    """Rows with images and a text model would train on the text alone: refused in one line."""
    if processor is not None:
        return
    for index, row in enumerate(rows):
        images = row.get(image_key)
        if images is not None and len(images):
            raise DataError(f"row {index} has images in {image_key!r}, but the model has no image processor "
                            "(preprocessor_config.json): point model.path at a vision-language model (e.g. "
                            "Qwen2.5-VL), or drop the image column")


def refuse_videos(rows: Sequence[dict], *, video_key: str, image_key: str) -> None:
    """Rows that carry videos (a non-empty ``video_key`` column) are refused in one line, before any model loads:
    read as text and images alone they would train without what the prompt asks about. verl's VL examples
    (geo3k and its Qwen2.5-VL / Qwen3-VL scripts) train on images; a video's sampled frames go in as images."""
    for index, row in enumerate(rows):
        videos = row.get(video_key)
        if videos is not None and len(videos):
            raise DataError(f"row {index} has {len(videos)} video(s) in {video_key!r}; videos are not supported: "
                            f"give the sampled frames as images ({image_key!r}, one '<image>' each in the prompt) "
                            f"or drop the {video_key!r} column")


def image_messages(messages: Sequence[dict], num_images: int, *, row_index: int, image_key: str) -> list[dict]:
    """``messages`` with every ``<image>`` of a text content split out as an ``{"type": "image"}`` part.

    The count of placeholders must equal the row's number of images (verl asserts the same)."""
    out, seen = [], 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str) and VIDEO_PLACEHOLDER in content:
            raise DataError(f"row {row_index}: the prompt has a '<video>' placeholder; videos are not supported yet "
                            "(images are: '<image>' with the row's images column)")
        if not isinstance(content, str) or IMAGE_PLACEHOLDER not in content:
            out.append(dict(message))
            continue
        parts = []
        for piece in re.split(f"({re.escape(IMAGE_PLACEHOLDER)})", content):
            if piece == IMAGE_PLACEHOLDER:
                parts.append({"type": "image"})
                seen += 1
            elif piece:
                parts.append({"type": "text", "text": piece})
        out.append({**message, "content": parts})
    if seen != num_images:
        raise DataError(f"row {row_index}: the prompt has {seen} '<image>' placeholder(s) but {image_key!r} holds "
                        f"{num_images} image(s); put one '<image>' in the prompt text per image")
    return out


def process_image_prompt(processor, messages: Sequence[dict], images: Sequence[Any], *, row_index: int,
                         image_key: str = "images", template_kwargs: dict | None = None,
                         add_generation_prompt: bool = True) -> tuple[list[int], dict[str, torch.Tensor] | None]:
    """(prompt ids with the image tokens expanded, ``{"pixel_values", "image_grid_thw"}`` or None without
    images) of one row, through ``processor``'s chat template and image processor."""
    images = list(images) if images is not None else []
    messages = image_messages(messages, len(images), row_index=row_index, image_key=image_key)
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **(template_kwargs or {}))
    if not images:
        return processor.tokenizer(text, add_special_tokens=False)["input_ids"], None
    out = process_images(processor, text, images, row_index=row_index)
    vision = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
    return out["input_ids"][0].tolist(), vision


def tokenize_image_conversation(processor, messages: Sequence[dict], images: Sequence[Any], *, row_index: int,
                                image_key: str = "images", template_kwargs: dict | None = None,
                                ) -> tuple[list[int], list[int], dict[str, torch.Tensor] | None]:
    """(ids, assistant mask, vision inputs or None) of an SFT conversation with images.

    The assistant mask is found on the template's own rendering (one ``<|image_pad|>`` per image, see
    :mod:`hybridflow.data.assistant_mask`); each image's pad then expands to its ``n_i = t * h * w /
    merge^2`` tokens, all 0 in the mask (image tokens are never targets), exactly as the processor
    expands the ids."""
    images = list(images) if images is not None else []
    messages = image_messages(messages, len(images), row_index=row_index, image_key=image_key)
    ids, mask = tokenize_with_assistant_mask(processor.tokenizer, messages, row_index=row_index,
                                             template_kwargs=template_kwargs)
    if not images:
        return ids, mask, None
    text = render(processor.tokenizer, messages, add_generation_prompt=False, template_kwargs=template_kwargs)
    out = process_images(processor, text, images, row_index=row_index)
    counts = iter(image_token_counts(processor, out["image_grid_thw"]))
    pad_id = processor.image_token_id
    expanded = [m for token, m in zip(ids, mask) for m in ([0] * next(counts) if token == pad_id else [m])]
    expanded_ids = out["input_ids"][0].tolist()
    if len(expanded) != len(expanded_ids):  # the processor and the template disagree on the image placeholders
        raise DataError(f"row {row_index}: the chat template's image placeholders do not match the processor's "
                        "image token; use the model's own chat template")
    return expanded_ids, expanded, {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


def image_token_counts(processor, image_grid_thw: torch.Tensor) -> list[int]:
    """Tokens of each image (``t * h * w / merge^2``) of ``image_grid_thw [n_images, 3]``: how many ``<|image_pad|>``
    the processor writes for it."""
    merge = processor.image_processor.merge_size ** 2
    return (torch.as_tensor(image_grid_thw).prod(-1) // merge).tolist()


def expand_image_tokens(processor, ids: Sequence[int], image_grid_thw: torch.Tensor, *, row_index: int) -> list[int]:
    """``ids`` rendered by the chat template (one ``<|image_pad|>`` per image) with each image's pad repeated to its
    :func:`image_token_counts`, as the processor expands them: ``[L] -> [L + sum_i (n_i - 1)]``."""
    counts, pad = image_token_counts(processor, image_grid_thw), processor.image_token_id
    if sum(token == pad for token in ids) != len(counts):
        raise DataError(f"row {row_index}: the text holds {sum(token == pad for token in ids)} image placeholder(s) for "
                        f"{len(counts)} image(s); use the model's own chat template")
    counts = iter(counts)
    return [t for token in ids for t in ([pad] * next(counts) if token == pad else [token])]


def append_images(inputs: dict[str, torch.Tensor] | None, new: dict[str, torch.Tensor] | None
                  ) -> dict[str, torch.Tensor] | None:
    """One conversation's vision inputs with ``new`` images after the ones it had (token order): ``pixel_values``
    and ``image_grid_thw`` concatenated along dim 0; a new dict (the n samples of a prompt share the old one)."""
    if not new:
        return inputs
    if not inputs:
        return dict(new)
    return {key: torch.cat([torch.as_tensor(inputs[key]), torch.as_tensor(new[key])]) for key in ("pixel_values",
                                                                                                 "image_grid_thw")}


def image_to_bytes(image, format: str = "PNG") -> dict[str, bytes]:
    """``{"bytes": ...}`` of a PIL image: the row entry a parquet file stores (as ``datasets`` writes it)."""
    buffer = io.BytesIO()
    image.save(buffer, format=format)
    return {"bytes": buffer.getvalue()}
