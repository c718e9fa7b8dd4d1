"""The record that flows between pipeline stages: per-sample tensors and per-sample objects.

This is hybridflow's equivalent of verl's ``DataProto``, kept deliberately small: three
dictionaries and the row operations the controller and workers need (select, union,
split for data-parallel dispatch, concat for collect, repeat for ``rollout.n``).

Column conventions used across the stages (``B`` samples, ``P`` prompt tokens,
``T`` response tokens, ``L = P + T``; prompts are left-padded, responses right-padded):

==========================  ==========  ==============================================
key                         shape       meaning
==========================  ==========  ==============================================
``prompts``                 ``[B, P]``  prompt token ids
``responses``               ``[B, T]``  generated token ids
``input_ids``               ``[B, L]``  ``cat(prompts, responses)``
``attention_mask``          ``[B, L]``  1 on real tokens, 0 on padding
``position_ids``            ``[B, L]``  positions that skip left padding
``response_mask``           ``[B, T]``  1 on response tokens that count in losses
``old_log_probs``           ``[B, T]``  behaviour-policy log-probs (actor, pre-update)
``ref_log_probs``           ``[B, T]``  reference-policy log-probs
``rollout_log_probs``       ``[B, T]``  the engine's log-probs of the sampled tokens
``values``                  ``[B, T]``  critic values
``token_level_scores``      ``[B, T]``  reward-function score (on the last token)
``token_level_rewards``     ``[B, T]``  scores minus the KL penalty
``advantages``/``returns``  ``[B, T]``  estimator outputs
==========================  ==========  ==============================================

Non-tensor columns are 1-D ``numpy`` arrays of length ``B`` (``dtype=object`` when built
from lists): ``raw_prompt``, ``data_source``, ``reward_model``, ``extra_info``, ``uid``.
Batch-level values (temperature, global token counts, metrics) travel as call arguments and
return values, not in the batch: nothing downstream has to look for them in two places.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
import torch

Column = torch.Tensor | np.ndarray


def _as_object_array(values: Sequence[Any] | np.ndarray) -> np.ndarray:
    """A 1-D object array of ``values``; element by element so lists of equal-length lists stay 1-D."""
    if isinstance(values, np.ndarray):
        return values
    array = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        array[i] = value
    return array


def _same_value(a: Any, b: Any) -> bool:
    """Equality that works for tensors, arrays and plain values (used to allow benign key overlaps)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.shape == b.shape and all(_same_value(x, y) for x, y in zip(a.ravel(), b.ravel()))
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):
        return a is b


def _pad_columns(value: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """``value`` with ``left`` / ``right`` zero columns added along dim 1 (any trailing dims kept)."""
    if left == right == 0:
        return value
    return torch.nn.functional.pad(value, (0, 0) * (value.dim() - 2) + (left, right))


def _aligned_column(key: str, value: torch.Tensor, *, prompt: tuple[int, int], response: tuple[int, int]):
    """One column padded from (prompt width p, response width t) to (P, T); masks pad with 0 (padding)."""
    (p, P), (t, T) = prompt, response
    if value.dim() < 2:
        return value
    width = value.shape[1]
    if width == p + t:  # input_ids, attention_mask, position_ids: [left pad | prompt | response | right pad]
        return torch.cat([_pad_columns(value[:, :p], P - p, 0), _pad_columns(value[:, p:], 0, T - t)], dim=1)
    if key.startswith("prompt") and width == p:
        return _pad_columns(value, P - p, 0)
    if width == t:
        return _pad_columns(value, 0, T - t)
    raise ValueError(f"Batch.concat: column {key!r} has width {width}, neither the prompt ({p}), the response "
                     f"({t}) nor the sequence ({p + t}) width, so rollouts of different widths cannot be aligned")


def _common_widths(batches: Sequence[Batch]) -> Sequence[Batch]:
    """Rollout batches (with ``prompts`` and ``responses``) padded to one prompt and one response width."""
    if not all("prompts" in b and "responses" in b for b in batches):
        return batches
    P = max(b["prompts"].shape[1] for b in batches)
    T = max(b["responses"].shape[1] for b in batches)
    if all(b["prompts"].shape[1] == P and b["responses"].shape[1] == T for b in batches):
        return batches
    aligned = []
    for b in batches:
        widths = dict(prompt=(b["prompts"].shape[1], P), response=(b["responses"].shape[1], T))
        tensors = {k: _aligned_column(k, v, **widths) for k, v in b.tensors.items()}
        aligned.append(Batch(tensors, dict(b.non_tensors)))
    return aligned


def _index_tensor(indices: Sequence[int] | np.ndarray | torch.Tensor, size: int) -> torch.Tensor:
    """Normalise integer or boolean-mask indices to an int64 CPU tensor, bounds-checked against ``size``."""
    index = torch.as_tensor(np.asarray(indices) if not isinstance(indices, torch.Tensor) else indices)
    if index.dtype == torch.bool:
        if index.shape != (size,):
            raise ValueError(f"boolean mask has shape {tuple(index.shape)}; expected ({size},)")
        index = index.nonzero().squeeze(-1)
    index = index.to(device="cpu", dtype=torch.int64).reshape(-1)
    if index.numel() and (index.min() < -size or index.max() >= size):
        raise IndexError(f"index out of range for a batch of {size} samples: {index.tolist()}")
    return index


class Batch:
    """``B`` samples as aligned columns: ``tensors`` (leading dim ``B``), ``non_tensors`` (length ``B``).

    Every operation returns a new ``Batch`` (columns are shared, not copied, where
    indexing allows) except ``batch[key] = value`` and ``pop``. Columns
    are written only through ``batch[key] = value``, which checks the length; the
    ``tensors`` / ``non_tensors`` properties are read-only views.
    """

    def __init__(
        self,
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Sequence[Any] | np.ndarray] | None = None,
    ):
        self._tensors: dict[str, torch.Tensor] = {}
        self._non_tensors: dict[str, np.ndarray] = {}
        for key, value in (tensors or {}).items():
            self._set_tensor(key, value)
        for key, value in (non_tensors or {}).items():
            self._set_non_tensor(key, value)

    @classmethod
    def from_dict(
        cls,
        *,
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Sequence[Any] | np.ndarray] | None = None,
    ) -> Batch:
        """Build a batch from column dictionaries; lists become 1-D object arrays."""
        return cls(tensors=tensors, non_tensors=non_tensors)

    # ---- columns -------------------------------------------------------------------

    @property
    def tensors(self) -> Mapping[str, torch.Tensor]:
        """Read-only view of the tensor columns (write with ``batch[key] = tensor``)."""
        return MappingProxyType(self._tensors)

    @property
    def non_tensors(self) -> Mapping[str, np.ndarray]:
        """Read-only view of the per-sample object columns (write with ``batch[key] = list``)."""
        return MappingProxyType(self._non_tensors)

    def keys(self) -> list[str]:
        return [*self._tensors, *self._non_tensors]

    def __len__(self) -> int:
        for column in (*self._tensors.values(), *self._non_tensors.values()):
            return len(column)
        return 0

    def __contains__(self, key: str) -> bool:
        return key in self._tensors or key in self._non_tensors

    def __getitem__(self, key: str) -> Column:
        if key in self._tensors:
            return self._tensors[key]
        if key in self._non_tensors:
            return self._non_tensors[key]
        raise KeyError(f"batch has no column {key!r}; columns: {self.keys()}")

    def __setitem__(self, key: str, value: torch.Tensor | Sequence[Any] | np.ndarray) -> None:
        if isinstance(value, torch.Tensor):
            self._non_tensors.pop(key, None)
            self._set_tensor(key, value)
        else:
            self._tensors.pop(key, None)
            self._set_non_tensor(key, value)

    def _check_length(self, key: str, length: int) -> None:
        others = [k for k in self.keys() if k != key]
        if others and length != len(self[others[0]]):
            raise ValueError(
                f"column {key!r} has {length} rows but the batch has {len(self[others[0]])} "
                f"(from {others[0]!r}); every column needs the same leading dimension B"
            )

    def _set_tensor(self, key: str, value: torch.Tensor) -> None:
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            raise TypeError(f"tensor column {key!r} must be a tensor with a leading batch dim, got {value!r}")
        self._check_length(key, value.shape[0])
        self._tensors[key] = value

    def _set_non_tensor(self, key: str, value: Sequence[Any] | np.ndarray) -> None:
        array = _as_object_array(value)
        if array.ndim == 0:
            raise TypeError(f"non-tensor column {key!r} must be a sequence of length B; pass scalars as arguments")
        self._check_length(key, array.shape[0])
        self._non_tensors[key] = array

    # ---- whole-column operations ---------------------------------------------------

    def _from_columns(self, columns: Mapping[str, Column]) -> Batch:
        tensors = {k: v for k, v in columns.items() if isinstance(v, torch.Tensor)}
        non_tensors = {k: v for k, v in columns.items() if not isinstance(v, torch.Tensor)}
        return Batch(tensors, non_tensors)

    def select(self, keys: Iterable[str]) -> Batch:
        """A batch with only ``keys`` (tensor or non-tensor)."""
        return self._from_columns({key: self[key] for key in keys})

    def pop(self, keys: Iterable[str]) -> Batch:
        """Remove ``keys`` from this batch and return them as a new batch."""
        keys = list(keys)
        popped = self.select(keys)
        for key in keys:
            self._tensors.pop(key, None)
            self._non_tensors.pop(key, None)
        return popped

    def union(self, other: Batch) -> Batch:
        """Columns of both batches; a key present in both must hold equal values."""
        if self.keys() and other.keys() and len(self) != len(other):
            raise ValueError(f"cannot union batches of {len(self)} and {len(other)} samples")
        columns: dict[str, Column] = {key: self[key] for key in self.keys()}
        for key in other.keys():
            if key in columns and not _same_value(columns[key], other[key]):
                raise ValueError(f"union: column {key!r} differs between the two batches")
            columns[key] = other[key]
        return self._from_columns(columns)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """Move every tensor column to ``device``; non-tensors are shared."""
        moved = {k: v.to(device, non_blocking=non_blocking) for k, v in self._tensors.items()}
        return Batch(moved, self._non_tensors)

    # ---- row operations ------------------------------------------------------------

    def index_select(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> Batch:
        """Rows ``indices`` (ints or a ``[B]`` bool mask) in that order; use a permutation to reorder."""
        index = _index_tensor(indices, len(self))
        columns: dict[str, Column] = {k: v[index.to(v.device)] for k, v in self._tensors.items()}
        columns.update({k: v[index.numpy()] for k, v in self._non_tensors.items()})
        return self._from_columns(columns)

    def repeat(self, n: int, interleave: bool = True) -> Batch:
        """Each sample ``n`` times: ``[a, a, b, b]`` when ``interleave`` (GRPO groups), else ``[a, b, a, b]``."""
        if n < 1:
            raise ValueError(f"repeat count must be >= 1, got {n}")
        order = torch.arange(len(self))
        index = order.repeat_interleave(n) if interleave else order.repeat(n)
        return self.index_select(index)

    def split_by_sizes(self, sizes: Sequence[int]) -> list[Batch]:
        """Consecutive pieces of ``sizes[i]`` samples each (uneven data-parallel dispatch)."""
        if sum(sizes) != len(self) or any(size < 0 for size in sizes):
            raise ValueError(f"split sizes {list(sizes)} must be >= 0 and sum to the batch size {len(self)}")
        bounds = np.cumsum([0, *sizes])
        return [self.index_select(torch.arange(int(lo), int(hi))) for lo, hi in zip(bounds[:-1], bounds[1:])]

    def split(self, chunk_size: int) -> list[Batch]:
        """Pieces of ``chunk_size`` samples; like ``torch.split``, the last piece may be smaller."""
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        full, rest = divmod(len(self), chunk_size)
        return self.split_by_sizes([chunk_size] * full + ([rest] if rest else []))

    def chunk(self, n: int) -> list[Batch]:
        """``n`` equal pieces; ``len(self)`` must be divisible by ``n`` (see ``split_by_sizes`` otherwise)."""
        if n < 1 or len(self) % n:
            raise ValueError(
                f"cannot chunk a batch of {len(self)} samples into {n} equal pieces; "
                f"make the batch size a multiple of {n} or use split_by_sizes"
            )
        return self.split_by_sizes([len(self) // n] * n)

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Stack batches with identical keys along B. Rollouts of different widths (each generate call pads to
        its own longest prompt and response) are first padded to the widest: prompt-side columns on the
        left, response-side ones on the right, ``[B, P + T]`` ones on both sides (``_common_widths``)."""
        if not batches:
            raise ValueError("Batch.concat needs at least one batch")
        keys = batches[0].keys()
        for i, batch in enumerate(batches[1:], start=1):
            if sorted(batch.keys()) != sorted(keys):
                raise ValueError(f"Batch.concat: batch {i} has keys {batch.keys()}, batch 0 has {keys}")
        batches = _common_widths(batches)
        first = batches[0]
        tensors = {k: torch.cat([b[k] for b in batches]) for k in first._tensors}
        non_tensors = {k: np.concatenate([b[k] for b in batches]) for k in first._non_tensors}
        return Batch(tensors, non_tensors)

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {list(v.shape)} {str(v.dtype)[len('torch.'):]}" for k, v in self._tensors.items())
        non_tensors = ", ".join(f"{k}: [{len(v)}] {v.dtype}" for k, v in self._non_tensors.items())
        return f"Batch(B={len(self)}, tensors={{{tensors}}}, non_tensors={{{non_tensors}}})"
