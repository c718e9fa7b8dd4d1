"""Generated samples written where users read them: JSONL dumps and validation tables.

``trainer.rollout_data_dir`` / ``trainer.validation_data_dir`` get ``{step}.jsonl`` per step,
one line per sample in verl's format::

    {"input": prompt text, "output": response text, "gts": ground truth, "score": 0.0, "step": 3, ...}

plus one field per extra metric the scorer returned (``acc``, ...). ``trainer.log_val_generations``
picks that many validation samples, the same ones every time, for the trackers' tables.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hybridflow.data.batch import Batch


def _plain(value: Any) -> Any:
    """JSON-ready: numpy / torch scalars to Python numbers, everything else as is (or its str)."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def dump_generations(directory: str, step: int, *, inputs: Sequence[str], outputs: Sequence[str],
                     gts: Sequence[Any], scores: Sequence[float],
                     extras: Mapping[str, Sequence[Any]] | None = None) -> str:
    """Write ``{directory}/{step}.jsonl`` (verl's ``_dump_generations`` format); returns its path."""
    os.makedirs(directory, exist_ok=True)
    columns: dict[str, Sequence[Any]] = {"input": inputs, "output": outputs, "gts": gts, "score": scores,
                                         "step": [step] * len(inputs)}
    columns.update({k: v for k, v in (extras or {}).items() if len(v) == len(inputs) and k not in columns})
    path = os.path.join(directory, f"{step}.jsonl")
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(len(inputs)):
            row = {key: _plain(values[i]) for key, values in columns.items()}
            fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    return path


def decode_rows(tokenizer, ids: torch.Tensor, mask: torch.Tensor | None = None) -> list[str]:
    """Text of each row of ``ids [B, T]`` (only the tokens where ``mask`` is 1), special tokens dropped."""
    rows = ids.tolist() if mask is None else [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    return [tokenizer.decode(row, skip_special_tokens=True) for row in rows]


def batch_samples(batch: Batch, tokenizer) -> dict[str, list]:
    """input / output / gts / score and the scorer's extra metrics of a scored batch."""
    prompt_mask = batch["attention_mask"][:, : batch["prompts"].shape[1]]
    samples = {
        "inputs": decode_rows(tokenizer, batch["prompts"], prompt_mask),
        "outputs": decode_rows(tokenizer, batch["responses"], batch["response_mask"]),
        "gts": [_plain(g) for g in batch["ground_truth"]],
        "scores": batch["seq_score"].tolist(),
    }
    samples["extras"] = {key.removeprefix("reward_extra/"): batch[key].tolist()
                         for key in batch.keys() if key.startswith("reward_extra/")}
    return samples


def pick_generations(inputs: Sequence[str], outputs: Sequence[str], scores: Sequence[float],
                     count: int, seed: int = 42) -> list[tuple[str, str, float]]:
    """``count`` (input, output, score) samples, sorted by input then shuffled with a fixed seed, so
    every validation shows the same prompts and their answers can be compared across steps."""
    samples = sorted(zip(inputs, outputs, scores), key=lambda s: s[0])
    random.Random(seed).shuffle(samples)
    return samples[:count]
