"""Preference pairs for DPO-family losses: (prompt, chosen, rejected) -> two token sequences.

The prompt is a string (one user message) or a message list; chosen and rejected are
strings (one assistant reply) or message lists (the turns that follow the prompt; a
list that repeats the prompt first, as full-conversation datasets do, is accepted and
the repeat dropped). Each side is rendered as prompt + reply with the chat template;
``loss_mask`` marks the reply's assistant tokens (as in SFT), and ``prompt_length`` is
the token count of the templated prompt with its generation prompt, shared by both
sides.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch

from hybridflow.data.assistant_mask import tokenize_with_assistant_mask
from hybridflow.data.chat import as_messages, encode, render
from hybridflow.data.files import read_nonempty_rows, require_columns
from hybridflow.data.padding import pad_sequences, pad_token_id_of
from hybridflow.data.rl_dataset import subsample
from hybridflow.data.truncation import check_truncation
from hybridflow.errors import DataError

PREFERENCE_TRUNCATIONS = ("error", "right")
SIDES = ("chosen", "rejected")


class PreferenceDataset(torch.utils.data.Dataset):
    """``dataset[i]`` has ``{chosen,rejected}_input_ids [L]``, ``{chosen,rejected}_loss_mask [L]``, ``prompt_length``.

    ``truncation='right'`` cuts the end of a reply to fit ``max_length``; a prompt that
    alone exceeds ``max_length`` is always an error (there would be no reply left).
    """

    def __init__(
        self,
        files: str | Sequence[str],
        tokenizer,
        *,
        prompt_key: str = "prompt",
        chosen_key: str = "chosen",
        rejected_key: str = "rejected",
        max_length: int = 1024,
        truncation: str = "error",
        max_samples: int = -1,
        apply_chat_template_kwargs: dict | None = None,
    ):
        check_truncation(truncation, allowed=PREFERENCE_TRUNCATIONS, config_key="data.truncation")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.truncation = truncation
        self.template_kwargs = dict(apply_chat_template_kwargs or {})
        self.pad_token_id = pad_token_id_of(tokenizer)
        self.keys = {"prompt": prompt_key, "chosen": chosen_key, "rejected": rejected_key}
        rows = read_nonempty_rows(files)
        require_columns(
            rows, {key: f"data.{name}_key" for name, key in self.keys.items()}, source=f"data file(s) {files!r}"
        )
        row_ids = subsample(len(rows), max_samples=max_samples, shuffle=False, seed=0)
        self.samples = [self._tokenize_pair(rows[i], row_index=i) for i in row_ids]

    def _tokenize_pair(self, row: dict[str, Any], *, row_index: int) -> dict[str, Any]:
        prompt = as_messages(row[self.keys["prompt"]], role="user", row_index=row_index, config_key="data.prompt_key")
        prompt_text = render(self.tokenizer, prompt, add_generation_prompt=True, template_kwargs=self.template_kwargs)
        prompt_length = len(encode(self.tokenizer, prompt_text))
        if prompt_length >= self.max_length:
            raise DataError(
                f"row {row_index}: prompt has {prompt_length} tokens, leaving no room for a reply within "
                f"data.max_length={self.max_length}; raise data.max_length or drop the row"
            )
        sample: dict[str, Any] = {"prompt_length": prompt_length}
        for side in SIDES:
            reply = _reply_messages(
                row[self.keys[side]], prompt=prompt, row_index=row_index, config_key=f"data.{side}_key"
            )
            ids, mask = tokenize_with_assistant_mask(
                self.tokenizer, prompt + reply, row_index=row_index, template_kwargs=self.template_kwargs
            )
            ids, mask = self._fit(ids, mask, row_index=row_index, side=side)
            sample[f"{side}_input_ids"] = torch.tensor(ids, dtype=torch.long)
            sample[f"{side}_loss_mask"] = torch.tensor(mask, dtype=torch.long)
        return sample

    def _fit(self, ids: list[int], mask: list[int], *, row_index: int, side: str) -> tuple[list[int], list[int]]:
        if len(ids) <= self.max_length:
            return ids, mask
        if self.truncation == "error":
            raise DataError(
                f"row {row_index}: {side} has {len(ids)} tokens, more than data.max_length={self.max_length}; "
                "raise data.max_length or set data.truncation='right'"
            )
        return ids[: self.max_length], mask[: self.max_length]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.samples[index]

    @property
    def collate_fn(self):
        return partial(collate_preference, pad_token_id=self.pad_token_id)


def _reply_messages(value: Any, *, prompt: list[dict], row_index: int, config_key: str) -> list[dict[str, Any]]:
    if isinstance(value, str) and not value.strip():
        raise DataError(f"row {row_index}: empty reply in {config_key}; fix or remove the row")
    reply = as_messages(value, role="assistant", row_index=row_index, config_key=config_key)
    if reply[: len(prompt)] == prompt:  # full-conversation format: the prompt is repeated
        reply = reply[len(prompt) :]
    if not any(message["role"] == "assistant" for message in reply):
        raise DataError(
            f"row {row_index}: {config_key} has no assistant message after the prompt; give the reply text or "
            "its messages"
        )
    return reply


def collate_preference(samples: Sequence[dict[str, Any]], *, pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad both sides to one width ``T`` (so they can be concatenated into ``[2B, T]``).

    Returns ``{chosen,rejected}_input_ids``, ``_attention_mask``, ``_loss_mask`` (``[B, T]``)
    and ``prompt_length [B]``.
    """
    width = max(sample[f"{side}_input_ids"].numel() for sample in samples for side in SIDES)
    batch = {"prompt_length": torch.tensor([sample["prompt_length"] for sample in samples])}
    for side in SIDES:
        ids = [sample[f"{side}_input_ids"].tolist() for sample in samples]
        batch[f"{side}_input_ids"] = pad_sequences(ids, pad_value=pad_token_id, side="right", length=width)
        batch[f"{side}_attention_mask"] = pad_sequences(
            [[1] * len(s) for s in ids], pad_value=0, side="right", length=width
        )
        batch[f"{side}_loss_mask"] = pad_sequences(
            [sample[f"{side}_loss_mask"].tolist() for sample in samples], pad_value=0, side="right", length=width
        )
    return batch
