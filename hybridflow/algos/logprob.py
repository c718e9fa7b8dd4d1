"""Token log-probabilities and entropy from logits.

Both are computed in fp32 with a log-sum-exp so that large logits do not overflow, and
in chunks of rows so that at most ``chunk_size x V`` fp32 temporaries exist at once.
When the logits require grad, each chunk is checkpointed: backward recomputes the
chunk's softmax instead of keeping an fp32 copy of the whole ``[B, T, V]`` tensor alive
beside the logits (which autograd already holds).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

FUSED_CHUNK_ROWS = 32
"""Rows per chunk of :func:`logprob_and_entropy`: a chunk's fp32 temporaries (32 x 49,152 x 4 B = 6 MiB at a 49k
vocabulary) stay in the CPU's cache across the chunk's ~10 passes instead of streaming through memory on each (issue
62: the forward and backward of a [1404, 49152] bf16 head took 1.0 s at 32 rows against 3.4 s at 1,024, one thread);
the values do not depend on it (every op is per row)."""


def _chunked(
    fn: Callable[..., torch.Tensor], rows: torch.Tensor, *extra: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """Apply ``fn`` to ``chunk_size`` rows at a time and concatenate the ``[rows]`` results."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    use_checkpoint = torch.is_grad_enabled() and rows.requires_grad
    outputs = []
    for start in range(0, rows.shape[0], chunk_size):
        args = (rows[start : start + chunk_size], *(e[start : start + chunk_size] for e in extra))
        outputs.append(checkpoint(fn, *args, use_reentrant=False) if use_checkpoint else fn(*args))
    return torch.cat(outputs) if outputs else rows.new_zeros(0, dtype=torch.float32)


def _picked_logprob(rows: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    rows = rows.float()
    return rows.gather(-1, labels[:, None]).squeeze(-1) - torch.logsumexp(rows, dim=-1)


def _entropy(rows: torch.Tensor) -> torch.Tensor:
    rows = rows.float()
    return torch.logsumexp(rows, dim=-1) - (torch.softmax(rows, dim=-1) * rows).sum(-1)


def _sum_squared_probs(rows: torch.Tensor) -> torch.Tensor:
    return torch.softmax(rows.float(), dim=-1).square().sum(-1)


def logprobs_from_logits(*, logits: torch.Tensor, labels: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """log p(label) = z_label - logsumexp(z) under softmax(logits).

    Args:
        logits: ``[..., V]`` unnormalised scores (any float dtype).
        labels: ``[...]`` int64 token ids, same leading shape as ``logits``.
        chunk_size: rows of ``V`` processed at once.

    Returns:
        ``[...]`` float32 log-probabilities.
    """
    flat_logits = logits.reshape(-1, logits.shape[-1])
    out = _chunked(_picked_logprob, flat_logits, labels.reshape(-1), chunk_size=chunk_size)
    return out.reshape(labels.shape)


def entropy_from_logits(*, logits: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Entropy H = logsumexp(z) - sum softmax(z) * z of the categorical given by logits.

    Args:
        logits: ``[..., V]``.
        chunk_size: rows of ``V`` processed at once.

    Returns:
        ``[...]`` float32 entropies (nats).
    """
    out = _chunked(_entropy, logits.reshape(-1, logits.shape[-1]), chunk_size=chunk_size)
    return out.reshape(logits.shape[:-1])


def sum_pi_squared_from_logits(*, logits: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """sum_v softmax(z)_v^2, the collision probability of the categorical given by logits.

    The optimal token baselines' score-norm proxy (``1 - 2 pi(y) + sum_v pi(v)^2``) needs it.

    Args:
        logits: ``[..., V]``.
        chunk_size: rows of ``V`` processed at once.

    Returns:
        ``[...]`` float32 values in ``(0, 1]``.
    """
    out = _chunked(_sum_squared_probs, logits.reshape(-1, logits.shape[-1]), chunk_size=chunk_size)
    return out.reshape(logits.shape[:-1])


def logprob_and_entropy(*, logits: torch.Tensor, labels: torch.Tensor, calculate_entropy: bool,
                        chunk_size: int = FUSED_CHUNK_ROWS) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log p(label), entropy or None) of ``logits [..., V]`` in one pass, with a closed-form backward.

    Same values as :func:`logprobs_from_logits` and :func:`entropy_from_logits` (the same fp32 ops per chunk of
    rows); the backward recomputes each chunk's softmax from the kept logits (in their own dtype: bf16 logits keep
    no fp32 copy) and writes ``dz = g_lp (onehot - p) - g_H p (log p + H)`` directly, instead of differentiating
    through the fp32 casts, log-sum-exp and softmax of two checkpointed passes. Returns fp32 ``[...]`` tensors.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    flat = logits.reshape(-1, logits.shape[-1])
    log_probs, entropy = _LogprobEntropy.apply(flat, labels.reshape(-1).long(), calculate_entropy, chunk_size)
    return log_probs.reshape(labels.shape), entropy.reshape(labels.shape) if calculate_entropy else None


class _LogprobEntropy(torch.autograd.Function):
    """``rows [K, V]``, ``labels [K]`` -> (log p ``[K]``, entropy ``[K]``; zeros when not asked), fp32."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, labels: torch.Tensor, calculate_entropy: bool, chunk_size: int):
        log_probs = rows.new_empty(rows.shape[0], dtype=torch.float32)
        lse = torch.empty_like(log_probs)
        entropy = torch.zeros_like(log_probs)
        for start in range(0, rows.shape[0], chunk_size):
            part = slice(start, start + chunk_size)
            chunk = rows[part].float()
            lse[part] = torch.logsumexp(chunk, dim=-1)
            log_probs[part] = chunk.gather(-1, labels[part, None]).squeeze(-1) - lse[part]
            if calculate_entropy:
                entropy[part] = lse[part] - (torch.softmax(chunk, dim=-1) * chunk).sum(-1)
        ctx.save_for_backward(rows, labels, lse, entropy)
        ctx.chunk_size = chunk_size
        ctx.calculate_entropy = calculate_entropy
        ctx.mark_non_differentiable(lse)
        # An entropy only logged (entropy_coeff 0) gets None, not zeros to run three [K, V] passes over (issue 62).
        ctx.set_materialize_grads(False)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        rows, labels, lse, entropy = ctx.saved_tensors
        grad_rows = torch.empty_like(rows)
        with_entropy = ctx.calculate_entropy and grad_entropy is not None
        for start in range(0, rows.shape[0], ctx.chunk_size):
            part = slice(start, start + ctx.chunk_size)
            log_p = rows[part].to(torch.float32, copy=True).sub_(lse[part, None])
            probs = log_p.exp()
            if with_entropy:  # dH/dz_j = -p_j (log p_j + H), in log_p's storage
                grad = log_p.add_(entropy[part, None]).mul_(probs).mul_(-grad_entropy[part, None])
            else:
                grad = log_p.zero_()
            if grad_log_probs is not None:  # d log p_y / dz_j = [j = y] - p_j
                grad.addcmul_(probs, grad_log_probs[part, None], value=-1.0)
                grad.scatter_add_(-1, labels[part, None].long(), grad_log_probs[part, None].float())
            grad_rows[part] = grad
        return grad_rows, None, None, None
