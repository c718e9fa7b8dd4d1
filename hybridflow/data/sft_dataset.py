"""SFT dataset: prompt/response columns or multi-turn messages -> ids + assistant loss mask.

Two row layouts, as in verl:

* single turn: ``prompt_key`` / ``response_key`` columns (nested keys with dots,
  ``extra_info.question``, or verl's ``prompt_dict_keys`` / ``response_dict_keys``);
  the prompt is a string (one user message) or a message list, the response a string;
* multi turn: ``messages_key`` names a column of chat messages (verl's
  ``data.multiturn.messages_key``, used when ``data.multiturn.enable``, or verl 0.9's
  ``data.messages_key``); rows with a ``messages`` column and no prompt column are read so
  without it, as verl 0.9's SFT trainer reads them (its default ``data.messages_key=messages``:
  ``examples/sft/vlm/run_qwen3_vl_2b.sh`` sets no key for its pokemon rows); an optional
  ``tools_key`` column holds the row's tool schemas (a list, or its JSON text), described to
  the model as the multi-turn rollout describes them (:func:`hybridflow.data.chat.with_tools`).

Both become one conversation rendered by the chat template; ``loss_mask`` is 1 on the
tokens of every assistant turn, their end-of-turn token included (see
:mod:`hybridflow.data.assistant_mask`). Convention: ``loss_mask[t] = 1`` means token
``t`` is a training target, predicted from tokens ``< t``; so the first token of a
sequence is never a target (there is nothing to predict it from), which also keeps
targets from crossing sequence boundaries when samples are packed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch

from hybridflow.data.assistant_mask import tokenize_with_assistant_mask
from hybridflow.data.chat import as_messages, validate_messages, with_tools
from hybridflow.data.files import get_path, read_nonempty_rows, require_columns, split_key
from hybridflow.data.padding import pad_sequences, pad_token_id_of, position_ids_from_mask
from hybridflow.data.rl_dataset import subsample
from hybridflow.data.truncation import check_truncation, truncate
from hybridflow.data.vision import refuse_videos, require_processor_for_images, tokenize_image_conversation
from hybridflow.errors import DataError

SFT_TRUNCATIONS = ("error", "left", "right")
VERL_MESSAGES_KEY = "messages"
"""verl 0.9's default ``data.messages_key``: the column its SFT trainer reads conversations from."""
PADDINGS = ("max_length", "longest")


class SFTDataset(torch.utils.data.Dataset):
    """``dataset[i]`` = ``{"input_ids": [L], "loss_mask": [L]}`` (unpadded long tensors); with a VLM's
    ``processor``, a row's images (``image_key``) add ``multi_modal_inputs`` (see :mod:`hybridflow.data.vision`); a row
    with videos (``video_key``) is refused.

    ``padding`` is 'max_length' (every batch ``[B, max_length]``) or 'longest' (dynamic:
    the longest sample of the batch); ``truncation`` is 'error' | 'left' (keep the end)
    | 'right' (keep the start) for conversations longer than ``max_length``.
    """

    def __init__(
        self,
        files: str | Sequence[str],
        tokenizer,
        *,
        prompt_key: str = "question",
        response_key: str = "answer",
        prompt_dict_keys: Sequence[str] | None = None,
        response_dict_keys: Sequence[str] | None = None,
        messages_key: str | None = None,
        tools_key: str | None = None,
        max_length: int = 1024,
        truncation: str = "error",
        padding: str = "longest",
        max_samples: int = -1,
        apply_chat_template_kwargs: dict | None = None,
        processor=None,
        image_key: str = "images",
        video_key: str = "videos",
    ):
        check_truncation(truncation, allowed=SFT_TRUNCATIONS, config_key="data.truncation")
        if padding not in PADDINGS:
            raise DataError(f"unknown SFT padding {padding!r}; choose one of {list(PADDINGS)}")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.truncation = truncation
        self.padding = padding
        self.template_kwargs = dict(apply_chat_template_kwargs or {})
        self.pad_token_id = pad_token_id_of(tokenizer)
        self.processor, self.image_key = processor, image_key
        rows = read_nonempty_rows(files)
        refuse_videos(rows, video_key=video_key, image_key=image_key)
        require_processor_for_images(rows, processor=processor, image_key=image_key)
        prompt_path = split_key(prompt_key, prompt_dict_keys)
        messages_key = messages_key or _verl_messages_layout(rows, prompt_column=prompt_path[0])
        if messages_key is not None:
            require_columns(rows, {messages_key: "data.multiturn.messages_key"}, source=f"data file(s) {files!r}")
            to_messages = partial(_multiturn_messages, key=messages_key)
            tools_of = partial(_row_tools, key=tools_key)
        else:
            tools_of = partial(_row_tools, key=None)  # single turn: no tools
            response_path = split_key(response_key, response_dict_keys)
            columns = {prompt_path[0]: "data.prompt_key", response_path[0]: "data.response_key"}
            require_columns(rows, columns, source=f"data file(s) {files!r}")
            to_messages = partial(_single_turn_messages, prompt_path=prompt_path, response_path=response_path)
        self.samples = [
            self._tokenize(to_messages(rows[i], row_index=i), tools=tools_of(rows[i], row_index=i), row_index=i,
                           images=rows[i].get(image_key))
            for i in subsample(len(rows), max_samples=max_samples, shuffle=False, seed=0)
        ]

    def _tokenize(
        self, messages: list[dict[str, Any]], *, tools: list[dict] | None, row_index: int, images=None
    ) -> dict[str, Any]:
        messages, template_kwargs = with_tools(self.tokenizer, messages, tools, template_kwargs=self.template_kwargs)
        vision = None
        if self.processor is not None:
            ids, mask, vision = tokenize_image_conversation(self.processor, messages, images, row_index=row_index,
                                                            image_key=self.image_key, template_kwargs=template_kwargs)
        else:
            ids, mask = tokenize_with_assistant_mask(
                self.tokenizer, messages, row_index=row_index, template_kwargs=template_kwargs
            )
        if vision is not None and len(ids) > self.max_length:  # a cut would drop image tokens the pixels need
            raise DataError(f"row {row_index}: the conversation with its image tokens is {len(ids)} tokens, longer "
                            f"than data.max_length={self.max_length}; raise data.max_length (conversations with "
                            "images are never truncated)")
        fix = "raise data.max_length or set data.truncation='left'|'right'"
        fit = partial(
            truncate,
            max_length=self.max_length,
            mode=self.truncation,
            row_index=row_index,
            what="conversation",
            limit_key="data.max_length",
            fix=fix,
        )
        ids, mask = fit(ids), fit(mask)
        mask[0] = 0  # the first token has no context to be predicted from
        sample = {"input_ids": torch.tensor(ids, dtype=torch.long), "loss_mask": torch.tensor(mask, dtype=torch.long)}
        if vision is not None:
            sample["multi_modal_inputs"] = vision
        return sample

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.samples[index]

    @property
    def collate_fn(self):
        """:func:`collate_sft` with this dataset's pad id and padding length."""
        pad_to = self.max_length if self.padding == "max_length" else None
        return partial(collate_sft, pad_token_id=self.pad_token_id, pad_to=pad_to)


def _verl_messages_layout(rows: Sequence[dict], *, prompt_column: str) -> str | None:
    """:data:`VERL_MESSAGES_KEY` when the rows are verl 0.9 conversations (that column, no ``prompt_column``), else
    None (prompt/response rows; a missing prompt column is then the error that names data.prompt_key)."""
    columns = set(rows[0]) if rows else set()
    return VERL_MESSAGES_KEY if VERL_MESSAGES_KEY in columns and prompt_column not in columns else None


def _single_turn_messages(
    row, *, row_index: int, prompt_path: list[str], response_path: list[str]
) -> list[dict[str, Any]]:
    prompt = get_path(row, prompt_path, config_key="data.prompt_key", row_index=row_index)
    response = get_path(row, response_path, config_key="data.response_key", row_index=row_index)
    if not isinstance(response, str) or not response.strip():
        raise DataError(
            f"row {row_index}: response in data.response_key is {response!r}, not a non-empty string; fix or "
            "remove the row"
        )
    if isinstance(prompt, str) and not prompt.strip():
        raise DataError(f"row {row_index}: empty prompt in data.prompt_key; fix or remove the row")
    messages = as_messages(prompt, role="user", row_index=row_index, config_key="data.prompt_key")
    return messages + [{"role": "assistant", "content": response}]


def _multiturn_messages(row, *, row_index: int, key: str) -> list[dict[str, Any]]:
    messages = validate_messages(row[key], row_index=row_index, config_key="data.multiturn.messages_key")
    if not any(message["role"] == "assistant" for message in messages):
        raise DataError(
            f"row {row_index}: no assistant message in data.multiturn.messages_key, nothing to train on; remove the row"
        )
    return messages


def _row_tools(row, *, row_index: int, key: str | None) -> list[dict] | None:
    """The row's tool schemas from the ``key`` column (a list of OpenAI function schemas or its JSON
    text); None when there is no such column or it is empty."""
    value = row.get(key) if key else None
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else None
        except json.JSONDecodeError as error:
            raise DataError(f"row {row_index}: data.multiturn.tools_key column {key!r} is not valid JSON ({error}); "
                            "write a list of tool schemas (or its JSON text)") from None
    if hasattr(value, "tolist"):
        value = value.tolist()
    if value is None or (isinstance(value, list) and not value):
        return None
    if not isinstance(value, list) or not all(isinstance(tool, dict) for tool in value):
        raise DataError(f"row {row_index}: data.multiturn.tools_key column {key!r} must be a list of tool schemas "
                        f"like {{'type': 'function', 'function': {{'name': ...}}}}, got {str(value)[:80]}")
    return value


def collate_sft(
    samples: Sequence[dict[str, torch.Tensor]], *, pad_token_id: int, pad_to: int | None = None
) -> dict[str, torch.Tensor]:
    """Right-pad SFT samples: ``input_ids, attention_mask, position_ids, loss_mask``, all ``[B, T]``.

    ``T = pad_to`` (padding='max_length') or the longest sample (dynamic padding);
    padding has ``attention_mask = loss_mask = 0``.
    """
    ids = [sample["input_ids"].tolist() for sample in samples]
    input_ids = pad_sequences(ids, pad_value=pad_token_id, side="right", length=pad_to)
    attention_mask = pad_sequences(
        [[1] * len(seq) for seq in ids], pad_value=0, side="right", length=input_ids.shape[1]
    )
    loss_mask = pad_sequences(
        [sample["loss_mask"].tolist() for sample in samples], pad_value=0, side="right", length=input_ids.shape[1]
    )
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
        "loss_mask": loss_mask,
    }
