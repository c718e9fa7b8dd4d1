"""Datasets, collation, padding and packing; preprocess scripts in :mod:`hybridflow.data.preprocess`.

* :class:`~hybridflow.data.rl_dataset.RLDataset` + :func:`~hybridflow.data.rl_dataset.collate_prompts`
  — verl-schema prompt rows -> left-padded ``[B, P]`` prompt batches for rollout.
* :class:`~hybridflow.data.sft_dataset.SFTDataset` + :func:`~hybridflow.data.sft_dataset.collate_sft`
  — prompt/response or multi-turn rows -> ids with an assistant-token loss mask.
* :func:`~hybridflow.data.packing.pack_sequences` — padding-free packed rows with ``cu_seqlens``.
* :class:`~hybridflow.data.preference_dataset.PreferenceDataset` — chosen/rejected pairs for DPO.
* :class:`~hybridflow.data.dataloader.StatefulDataLoader` — batches whose position is checkpointed.

Names are imported lazily so the preprocess scripts do not pay for torch.
"""

import importlib

_EXPORTS = {
    "RLDataset": "rl_dataset",
    "collate_prompts": "rl_dataset",
    "SFTDataset": "sft_dataset",
    "collate_sft": "sft_dataset",
    "PreferenceDataset": "preference_dataset",
    "collate_preference": "preference_dataset",
    "pack_sequences": "packing",
    "block_causal_mask": "packing",
    "StatefulDataLoader": "dataloader",
    "read_rows": "files",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'hybridflow.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"hybridflow.data.{_EXPORTS[name]}"), name)
