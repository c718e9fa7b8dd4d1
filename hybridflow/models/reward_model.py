"""Sequence-classification reward models: one scalar score per sequence.

The score is read at the last non-pad token (HF's ``ForSequenceClassification`` heads
find it from ``config.pad_token_id``), so the config must know the pad id.
"""

from __future__ import annotations

import torch

from hybridflow.models.loader import load_checked_weights, load_config, resolve_dtype


def load_reward_model(
    path: str,
    *,
    dtype: str | torch.dtype = "float32",
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
    override_config: dict | None = None,
    pad_token_id: int | None = None,
):
    """An ``AutoModelForSequenceClassification`` with one label (the reward), in eval mode."""
    from transformers import AutoModelForSequenceClassification

    config = load_config(path, trust_remote_code=trust_remote_code, override_config=override_config)
    config.num_labels = 1
    if pad_token_id is not None:
        config.pad_token_id = pad_token_id
    # a causal LM checkpoint has no ``score`` head: it starts fresh, as reward-model training expects
    model = load_checked_weights(AutoModelForSequenceClassification, path, config=config, dtype=resolve_dtype(dtype),
                                 attn_implementation=attn_implementation, trust_remote_code=trust_remote_code,
                                 new_heads=("score.",))
    return model.eval()
