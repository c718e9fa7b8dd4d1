"""Distillation teachers (verl 0.9.1's ``distillation.teacher_models``): frozen causal LMs that score the
student's rollouts, as the reference policy does.

For each row the teacher routed to it (``teacher_key``'s value; one teacher takes every row) runs one no-grad
forward over prompt + response at temperature 1 (verl's teacher scores prompt log-probs, which ignore the
sampling temperature) and gives either

- ``teacher_log_probs [B, T]``: log q(y_t | prefix) of the student's sampled tokens (estimator losses), or
- ``teacher_topk_log_probs``, ``teacher_topk_ids`` ``[B, T, K]``: its K most likely next tokens at each response
  position and their log-probs (``forward_kl_topk``).

Zeros where there is no response token. The teacher must share the student's tokenizer (checked at load).
"""

from __future__ import annotations

import torch

from hybridflow.data.batch import Batch
from hybridflow.errors import HybridflowError
from hybridflow.workers.logprob import batch_log_probs
from hybridflow.workers.micro_batches import micro_batches, pad_right, trimmed_inputs


@torch.no_grad()
def topk_log_probs(model, micro: Batch, *, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(top-k log-probs ``[b, T, k]``, their token ids ``[b, T, k]``) of the next token at each response position
    of one micro-batch (padded layout; the all-pad columns trimmed, as the log-prob forward does)."""
    inputs, resp_len = trimmed_inputs(micro)
    length = inputs["input_ids"].shape[1]
    keep = torch.arange(length - resp_len - 1, length - 1, device=inputs["input_ids"].device)
    logits = model(**inputs, use_cache=False, logits_to_keep=keep).logits
    values, ids = torch.log_softmax(logits.float(), dim=-1).topk(k, dim=-1)
    width = micro["responses"].shape[1]
    return pad_right(values, width), pad_right(ids, width)


class TeacherWorker:
    """Frozen teachers by routing key; ``route_by`` the row field that picks one (None: the single teacher)."""

    def __init__(self, *, teachers: dict[str, torch.nn.Module], route_by: str | None = None, topk: int | None = None,
                 micro_batch_size: int | None = None):
        self.teachers, self.route_by, self.topk = teachers, route_by, topk
        self.micro_batch_size = micro_batch_size
        for model in teachers.values():
            model.eval()
            for param in model.parameters():
                param.requires_grad_(False)

    def routes(self, batch: Batch) -> dict[str, list[int]]:
        """{teacher key: row indices} of ``batch``; a row whose field names no teacher is an error."""
        if self.route_by is None:
            return {next(iter(self.teachers)): list(range(len(batch)))}
        rows: dict[str, list[int]] = {}
        for index, value in enumerate(batch[self.route_by]):
            if value not in self.teachers:
                raise HybridflowError(f"distillation.teacher_key={self.route_by}: row {index} has {value!r}, which no "
                               f"teacher's key names (teachers: {', '.join(self.teachers)})")
            rows.setdefault(value, []).append(index)
        return rows

    def compute_teacher_log_prob(self, batch: Batch) -> tuple[torch.Tensor, ...]:
        """``(teacher_log_probs [B, T],)``, or with ``topk`` ``(teacher_topk_log_probs, teacher_topk_ids)``
        ``[B, T, K]`` each; see the module docstring."""
        parts: list[tuple[list[int], tuple[torch.Tensor, ...]]] = []
        for key, rows in self.routes(batch).items():
            sub = batch if len(rows) == len(batch) else batch.index_select(rows)
            parts.append((rows, self._score(self.teachers[key], sub)))
        if len(parts) == 1 and len(parts[0][0]) == len(batch):
            return parts[0][1]
        outs = [torch.zeros((len(batch), *piece.shape[1:]), dtype=piece.dtype, device=piece.device)
                for piece in parts[0][1]]
        for rows, pieces in parts:
            for out, piece in zip(outs, pieces):
                out[torch.tensor(rows, device=out.device)] = piece
        return tuple(outs)

    def _score(self, model, batch: Batch) -> tuple[torch.Tensor, ...]:
        """This teacher's scores of ``batch``, zero off the response tokens."""
        mask = batch["response_mask"].bool()
        if not self.topk:
            log_probs, _ = batch_log_probs(model, batch, temperature=1.0, micro_batch_size=self.micro_batch_size)
            return (log_probs.masked_fill(~mask, 0.0),)
        pieces = [topk_log_probs(model, micro, k=self.topk)
                  for micro in micro_batches(batch, micro_batch_size=self.micro_batch_size)]
        return tuple(torch.cat(part).masked_fill(~mask[..., None], 0) for part in zip(*pieces))
