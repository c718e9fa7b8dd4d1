"""Keys and values of finished sequences, kept so a later prompt that extends one is not re-prefilled.

In a multi-turn rollout each turn's prompt is the previous turn's prompt + what the model
generated + the observation; the first part was already computed when the previous turn was
decoded. The engine stores each finished sequence's KV under its token ids; a new prompt is
looked up by its longest stored prefix and only the rest is prefilled
(:meth:`LlamaFamilyDecoder.prefill_after`). Entries are evicted least-recently-used beyond a
token budget, and all of them are dropped when the weights change (they were computed with
the old ones).
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class PrefixCache:
    """Token-id tuples -> KV ``[layers, 2, KV, L, D]``, at most ``max_tokens`` tokens in all."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.entries: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()
        self.tokens = 0
        self.hits = 0
        self.reused_tokens = 0

    def store(self, token_ids: list[int], kv: torch.Tensor) -> None:
        key = tuple(token_ids)
        if not key or len(key) > self.max_tokens or key in self.entries:
            return
        self.entries[key] = kv
        self.tokens += len(key)
        while self.tokens > self.max_tokens:
            evicted, _ = self.entries.popitem(last=False)
            self.tokens -= len(evicted)

    def longest_prefix(self, token_ids: list[int]) -> tuple[int, torch.Tensor | None]:
        """(length, KV) of the longest entry that is a proper prefix of ``token_ids``; (0, None) if none.
        A proper prefix leaves at least one token to compute, whose logits start the completion."""
        best, best_key = 0, None
        for key in self.entries:
            if best < len(key) < len(token_ids) and tuple(token_ids[: len(key)]) == key:
                best, best_key = len(key), key
        if best_key is None:
            return 0, None
        self.entries.move_to_end(best_key)
        self.hits += 1
        self.reused_tokens += best
        return best, self.entries[best_key]

    def clear(self) -> None:
        self.entries.clear()
        self.tokens = 0
