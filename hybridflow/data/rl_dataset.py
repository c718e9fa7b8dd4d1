"""RL prompt dataset: verl's parquet/jsonl rows -> templated, length-checked prompt ids.

Each row holds ``prompt`` (a list of chat messages), ``data_source``, ``ability``,
``reward_model = {style, ground_truth}`` and ``extra_info`` (verl's schema). The prompt
is rendered with the tokenizer's chat template (``add_generation_prompt=True``) and
tokenised once, up front: filtering overlong prompts needs every length anyway, and
``__getitem__`` then costs nothing. :func:`collate_prompts` left-pads a list of samples
into ``input_ids / attention_mask / position_ids`` of shape ``[B, P]`` plus per-sample
lists the reward stage needs.

With a VLM's ``processor``, a row's ``images`` (``image_key``; see :mod:`hybridflow.data.vision`) go
through the processor with the prompt: the prompt ids hold the expanded image tokens and the sample
carries ``multi_modal_inputs`` (``pixel_values``, ``image_grid_thw``), which collation keeps per row.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from hybridflow.data.chat import encode, render, validate_messages
from hybridflow.data.files import no_rows_message, read_rows, require_columns
from hybridflow.data.padding import pad_sequences, pad_token_id_of, position_ids_from_mask
from hybridflow.data.truncation import check_truncation, truncate
from hybridflow.data.patch_resize import resize_to_patches
from hybridflow.data.vision import load_image, process_image_prompt, refuse_videos, require_processor_for_images
from hybridflow.errors import DataError

logger = logging.getLogger(__name__)

RL_TRUNCATIONS = ("error", "left", "right", "middle")


def subsample(num_rows: int, *, max_samples: int, shuffle: bool, seed: int) -> list[int]:
    """Row ids to keep: all (``max_samples=-1``), the first N, or N drawn with ``seed``."""
    if max_samples < 0 or max_samples >= num_rows:
        return list(range(num_rows))
    if shuffle:
        return sorted(np.random.default_rng(seed).choice(num_rows, size=max_samples, replace=False).tolist())
    return list(range(max_samples))


class RLDataset(torch.utils.data.Dataset):
    """Prompts for rollout; ``dataset[i]`` is a dict with ``prompt_ids`` (unpadded) and the row's fields.

    Args mirror verl's ``data.*`` keys: ``prompt_key``, ``max_prompt_length``,
    ``filter_overlong_prompts`` (drop rows whose templated prompt is longer; the count
    is in ``num_filtered``), ``truncation`` ('error' | 'left' | 'right' | 'middle', for
    prompts still too long), ``max_samples`` (-1 = all; with ``shuffle`` a seeded random
    subset), ``return_raw_chat``, ``apply_chat_template_kwargs``, and for a VLM its ``processor`` and
    ``image_key`` (the column of each row's images); a row with videos in ``video_key`` is refused.
    """

    def __init__(
        self,
        files: str | Sequence[str],
        tokenizer,
        *,
        prompt_key: str = "prompt",
        max_prompt_length: int = 512,
        filter_overlong_prompts: bool = False,
        truncation: str = "error",
        max_samples: int = -1,
        shuffle: bool = False,
        seed: int = 1,
        return_raw_chat: bool = False,
        apply_chat_template_kwargs: dict | None = None,
        processor=None,
        image_key: str = "images",
        video_key: str = "videos",
        reward_fn_key: str = "data_source",
        image_patch_size: int | None = None,
    ):
        check_truncation(truncation, allowed=RL_TRUNCATIONS, config_key="data.truncation")
        self.tokenizer = tokenizer
        self.prompt_key = prompt_key
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.return_raw_chat = return_raw_chat
        self.template_kwargs = dict(apply_chat_template_kwargs or {})
        self.pad_token_id = pad_token_id_of(tokenizer)
        self.processor, self.image_key = processor, image_key
        # verl's data.image_patch_size: null = the processor's own
        self.image_patch_size = image_patch_size or getattr(getattr(processor, "image_processor", None), "patch_size",
                                                            14)
        rows = read_rows(files)
        require_columns(rows, {prompt_key: "data.prompt_key"}, source=f"data file(s) {files!r}")
        self.reward_fn_key = reward_fn_key
        check_row_fields(rows, reward_fn_key=reward_fn_key)
        refuse_videos(rows, video_key=video_key, image_key=image_key)
        require_processor_for_images(rows, processor=processor, image_key=image_key)
        row_ids = subsample(len(rows), max_samples=max_samples, shuffle=shuffle, seed=seed)
        prompts = [self._tokenize_prompt(rows[i], row_index=i) for i in row_ids]
        prompt_ids = [ids for ids, _ in prompts]
        self.filter_overlong_prompts = filter_overlong_prompts
        kept = list(range(len(row_ids)))
        if filter_overlong_prompts:
            counted = [self._filter_length(rows[i], ids, vision, row_index=i)
                       for i, (ids, vision) in zip(row_ids, prompts)]
            kept = self._drop_overlong(row_ids, counted)
        self.num_filtered = len(row_ids) - len(kept)
        if not kept:
            raise DataError(self._empty_message(num_rows=len(row_ids), files=files))
        if self.num_filtered:
            logger.warning(
                "dropped %d of %d prompts longer than data.max_prompt_length=%d",
                self.num_filtered,
                len(row_ids),
                max_prompt_length,
            )
        self.rows = [rows[row_ids[k]] for k in kept]
        self.row_ids = [row_ids[k] for k in kept]
        self.vision = [prompts[k][1] for k in kept]
        self.prompt_ids = [self._fit(prompt_ids[k], row_index=row_ids[k], has_images=prompts[k][1] is not None)
                           for k in kept]

    def _tokenize_prompt(self, row: dict[str, Any], *, row_index: int) -> tuple[list[int], dict | None]:
        """(prompt ids, the row's vision inputs or None)."""
        messages = validate_messages(row[self.prompt_key], row_index=row_index, config_key="data.prompt_key")
        if self.processor is not None:
            return process_image_prompt(self.processor, messages, row.get(self.image_key), row_index=row_index,
                                        image_key=self.image_key, template_kwargs=self.template_kwargs)
        return encode(
            self.tokenizer,
            render(self.tokenizer, messages, add_generation_prompt=True, template_kwargs=self.template_kwargs),
        ), None

    def _filter_length(self, row: dict[str, Any], ids: list[int], vision: dict | None, *, row_index: int) -> int:
        """The prompt length the overlong filter compares, as verl's RL dataset counts it: an image prompt on its
        images pre-resized by ``data.image_patch_size`` (``data/patch_resize.py``), any other its token count."""
        if vision is None:
            return len(ids)
        images = [resize_to_patches(load_image(image, row_index=row_index, position=k),
                                    image_patch_size=self.image_patch_size)
                  for k, image in enumerate(row[self.image_key])]
        messages = validate_messages(row[self.prompt_key], row_index=row_index, config_key="data.prompt_key")
        counted, _ = process_image_prompt(self.processor, messages, images, row_index=row_index,
                                          image_key=self.image_key, template_kwargs=self.template_kwargs)
        return len(counted)

    def _drop_overlong(self, row_ids: list[int], lengths: list[int]) -> list[int]:
        return [k for k in range(len(row_ids)) if lengths[k] <= self.max_prompt_length]

    def _fit(self, ids: list[int], *, row_index: int, has_images: bool = False) -> list[int]:
        if has_images and len(ids) > self.max_prompt_length and self.filter_overlong_prompts:
            raise DataError(f"row {row_index}: the overlong filter kept the prompt (its images counted at "
                            f"data.image_patch_size={self.image_patch_size}), but with the processor's own patch size "
                            f"it is {len(ids)} tokens, longer than data.max_prompt_length={self.max_prompt_length}; "
                            "set data.image_patch_size=null (the processor's) or raise max_prompt_length")
        if has_images and len(ids) > self.max_prompt_length:  # a cut would drop image tokens the pixels need
            raise DataError(f"row {row_index}: the prompt with its image tokens is {len(ids)} tokens, longer than "
                            f"data.max_prompt_length={self.max_prompt_length}; raise it or set "
                            "data.filter_overlong_prompts=True (prompts with images are never truncated)")
        fix = (
            "raise data.max_prompt_length, set data.filter_overlong_prompts=True, "
            "or data.truncation='left'|'right'|'middle'"
        )
        return truncate(
            ids,
            max_length=self.max_prompt_length,
            mode=self.truncation,
            row_index=row_index,
            what="prompt",
            limit_key="data.max_prompt_length",
            fix=fix,
        )

    def _empty_message(self, *, num_rows: int, files) -> str:
        if num_rows == 0:
            return no_rows_message(files)
        return (
            f"0 of {num_rows} rows left: {self.num_filtered} longer than "
            f"data.max_prompt_length={self.max_prompt_length} "
            "(set data.filter_overlong_prompts=False or raise max_prompt_length)"
        )

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def reward_inputs(self, key: str = "data_source") -> list[tuple[int, Any, Any]]:
        """``(row index in the files, row[key], reward_model.ground_truth)`` of every kept row."""
        return [
            (row_id, row.get(key), (row.get("reward_model") or {}).get("ground_truth"))
            for row_id, row in zip(self.row_ids, self.rows)
        ]

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = self.rows[index]
        extra_info = row.get("extra_info") or {}
        reward_model = row.get("reward_model") or {}
        sample = {
            "prompt_ids": self.prompt_ids[index],
            "data_source": row.get("data_source"),
            "ability": row.get("ability"),
            "reward_model": reward_model,
            "ground_truth": reward_model.get("ground_truth"),
            "extra_info": extra_info,
            "index": extra_info.get("index", self.row_ids[index]),
            "uid": str(self.row_ids[index]),
        }
        sample.setdefault(self.reward_fn_key, row.get(self.reward_fn_key))  # verl's data.reward_fn_key column
        if self.return_raw_chat:
            sample["raw_prompt"] = row[self.prompt_key]
        if self.processor is not None:
            sample["multi_modal_inputs"] = self.vision[index]
        sample["agent_name"] = row.get("agent_name") or None  # the agent loop of this row (multi-turn rollouts)
        return sample

    @property
    def collate_fn(self):
        """:func:`collate_prompts` bound to this tokenizer's pad id."""
        return partial(collate_prompts, pad_token_id=self.pad_token_id)


def check_row_fields(rows: Sequence[dict[str, Any]], *, reward_fn_key: str) -> None:
    """``reward_model`` / ``extra_info`` are dicts (not JSON text) and the ``data.reward_fn_key`` column exists:
    one line naming the row, the value and the fix (issue 61: tracebacks and a misleading line before)."""
    for index, row in enumerate(rows):
        for key, example in (("reward_model", "{'style': 'rule', 'ground_truth': '42'}"), ("extra_info", "{'index': 0}")):
            value = row.get(key)
            if value is not None and not isinstance(value, dict):
                raise DataError(
                    f"row {index}: {key} is a {type(value).__name__} ({str(value)[:60]!r}), expected a dict like "
                    f"{example}; write it to the parquet as a struct/dict column (json.loads a JSON string first)"
                )
        if reward_fn_key != "data_source" and reward_fn_key not in row:
            raise DataError(
                f"row {index} has no {reward_fn_key!r} column, which data.reward_fn_key={reward_fn_key} names (its "
                f"columns: {sorted(row)[:12]}); add the column or set data.reward_fn_key to one of them"
            )


PER_SAMPLE_KEYS = ("data_source", "ability", "reward_model", "ground_truth", "extra_info", "index", "uid", "raw_prompt",
                   "agent_name", "multi_modal_inputs")


def collate_prompts(
    samples: Sequence[dict[str, Any]], *, pad_token_id: int, pad_to: int | None = None
) -> dict[str, Any]:
    """Left-pad prompts into a batch.

    Returns ``input_ids [B, P]``, ``attention_mask [B, P]`` (1 on real tokens),
    ``position_ids [B, P]`` (cumsum(mask) - 1, clamped at 0), with ``P = pad_to`` or
    the longest prompt; ``raw_prompt_ids`` (unpadded id lists) and one list per
    field in ``PER_SAMPLE_KEYS`` present in the samples.
    """
    prompt_ids = [sample["prompt_ids"] for sample in samples]
    input_ids = pad_sequences(prompt_ids, pad_value=pad_token_id, side="left", length=pad_to)
    lengths = torch.tensor([len(ids) for ids in prompt_ids])
    width = input_ids.shape[1]
    attention_mask = (torch.arange(width).unsqueeze(0) >= (width - lengths).unsqueeze(1)).long()
    batch: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
        "raw_prompt_ids": [list(ids) for ids in prompt_ids],
    }
    for key in (*PER_SAMPLE_KEYS, *(k for k in samples[0] if k not in PER_SAMPLE_KEYS and k != "prompt_ids")):
        if key in samples[0]:
            batch[key] = [sample[key] for sample in samples]
    return batch
