"""Log-probs and entropy straight from the final hidden states and the LM head's weight, in chunks.

For token ``i`` with hidden state ``h_i [H]``, head weight ``W [V, H]``, temperature ``tau`` and label ``y_i``:

    z_i      = W h_i / tau                                   [V]   (fp32)
    log p_i  = z_i[y_i] - logsumexp(z_i)
    H_i      = logsumexp(z_i) - sum_v p_iv z_iv              (entropy, nats)
    S_i      = sum_v p_iv^2                                  (collision probability, no gradient)

The ``[N, V]`` logits never exist at once: ``chunk_tokens`` rows of ``z`` are built, reduced to the
``[N]`` outputs and dropped. Backward recomputes each chunk's ``z`` and applies the closed forms

    d log p_i / d z_i = onehot(y_i) - p_i
    d H_i / d z_i     = -p_i * (z_i - sum_v p_iv z_iv)

then ``dL/dh = (dL/dz / tau) W`` and ``dL/dW = sum_i (dL/dz_i / tau) h_i^T`` chunk by chunk: one extra
head matmul per chunk (the recompute) for ``O(chunk_tokens x V)`` memory instead of ``O(N x V)``.
The matmuls run in the autocast dtype when autocast is on (bf16 on a GPU), the softmax math in fp32.
"""

from __future__ import annotations

import torch

CHUNK_ELEMENTS = {"cuda": 1 << 26}
"""Logit elements per chunk by device type: on a GPU 256 MiB per fp32 ``[chunk, V]`` buffer (441 tokens at
Qwen2.5's V = 151,936, big enough for efficient matmuls); elsewhere ``CPU_CHUNK_ELEMENTS``."""
CPU_CHUNK_ELEMENTS = 1 << 23
"""32 MiB per buffer: 170 tokens at SmolLM2's V = 49,152 (a CPU matmul is efficient at that size already)."""


def default_chunk_tokens(vocab_size: int, device_type: str) -> int:
    """Tokens per chunk: ``[chunk, V]`` fp32 buffers of ``CHUNK_ELEMENTS`` (at most two live at once)."""
    return max(1, CHUNK_ELEMENTS.get(device_type, CPU_CHUNK_ELEMENTS) // vocab_size)


def _matmul_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The autocast dtype of ``tensor``'s device when autocast is on there, else its own dtype."""
    device_type = tensor.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return tensor.dtype


def _softmax_dtype(tensor: torch.Tensor) -> torch.dtype:
    """fp32, or the tensor's dtype when it is wider."""
    return torch.promote_types(tensor.dtype, torch.float32)


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, *, temperature: float) -> torch.Tensor:
    """``z = h W^T / tau`` as fp32 (fp64 for fp64 inputs) ``[c, V]`` from ``hidden [c, H]`` and ``weight [V, H]``."""
    logits = hidden @ weight.T
    logits = logits.to(_softmax_dtype(logits))
    return logits.div_(temperature) if temperature != 1.0 else logits


def _row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sum_v a[i, v] b[i, v]`` ``[c]`` without a ``[c, V]`` product (a batched matmul)."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


class _LinearLogProbs(torch.autograd.Function):
    """(log p ``[N]``, entropy ``[N]``, sum p^2 ``[N]``) of ``hidden [N, H]`` under ``weight [V, H]``."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature, chunk_tokens, want_entropy, want_sum_sq):
        dtype = _matmul_dtype(hidden)
        w = weight.to(dtype)
        n = hidden.shape[0]
        log_p, lse, mean_z, entropy, sum_sq = (hidden.new_zeros(n, dtype=_softmax_dtype(hidden)) for _ in range(5))
        for start in range(0, n, chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            z = _chunk_logits(hidden[rows].to(dtype), w, temperature=temperature)
            lse[rows] = torch.logsumexp(z, dim=-1)
            log_p[rows] = z.gather(-1, labels[rows, None]).squeeze(-1) - lse[rows]
            if want_entropy or want_sum_sq:
                p = (z - lse[rows, None]).exp_()
                mean_z[rows] = _row_dot(p, z)
                entropy[rows] = lse[rows] - mean_z[rows]
                if want_sum_sq:
                    sum_sq[rows] = _row_dot(p, p)
        ctx.save_for_backward(hidden, weight, labels, lse, mean_z)
        ctx.settings = (temperature, chunk_tokens, dtype)
        ctx.mark_non_differentiable(sum_sq)
        ctx.set_materialize_grads(False)  # an output nobody used gets None, not a [N] of zeros to multiply
        return log_p, entropy, sum_sq

    @staticmethod
    def backward(ctx, grad_log_p, grad_entropy, _grad_sum_sq):
        hidden, weight, labels, lse, mean_z = ctx.saved_tensors
        temperature, chunk_tokens, dtype = ctx.settings
        w = weight.to(dtype)
        grad_hidden = torch.zeros_like(hidden)
        grad_weight = torch.zeros(weight.shape, dtype=_softmax_dtype(weight), device=weight.device)
        for start in range(0, hidden.shape[0], chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            h = hidden[rows].to(dtype)
            z = _chunk_logits(h, w, temperature=temperature)
            grad_z = _grad_logits(z=z, lse=lse[rows], labels=labels[rows], mean_z=mean_z[rows],
                                  grad_log_p=_rows_or_none(grad_log_p, rows),
                                  grad_entropy=_rows_or_none(grad_entropy, rows))
            grad_z = (grad_z.div_(temperature) if temperature != 1.0 else grad_z).to(dtype)
            grad_hidden[rows] = (grad_z @ w).to(hidden.dtype)
            grad_weight += grad_z.T @ h
        return grad_hidden, grad_weight.to(weight.dtype), None, None, None, None, None


def _rows_or_none(tensor: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    return None if tensor is None else tensor[rows]


def _grad_logits(*, z, lse, labels, mean_z, grad_log_p, grad_entropy) -> torch.Tensor:
    """dL/dz ``[c, V]`` = g_logp (onehot(y) - p) - g_H p (z - E_p[z]) (module docstring), built in ``z``'s
    storage (``z`` is consumed) plus at most one more ``[c, V]`` buffer."""
    if grad_entropy is None:
        grad_z = z.sub_(lse[:, None]).exp_().mul_(-grad_log_p[:, None])  # -g_logp p
    else:
        p = (z - lse[:, None]).exp_()
        grad_z = z.sub_(mean_z[:, None]).mul_(p).mul_(-grad_entropy[:, None])  # -g_H p (z - E_p[z])
        if grad_log_p is not None:
            grad_z.sub_(p.mul_(grad_log_p[:, None]))
    if grad_log_p is not None:
        grad_z.scatter_add_(-1, labels[:, None], grad_log_p[:, None])
    return grad_z


def linear_log_probs(*, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                     calculate_entropy: bool = False, calculate_sum_pi_squared: bool = False,
                     chunk_tokens: int | None = None) -> tuple:
    """(log p ``[...]``, entropy ``[...]`` or None, sum_v p_v^2 ``[...]`` or None) of ``labels`` under
    ``softmax(hidden @ weight.T / temperature)``, all fp32, without the ``[..., V]`` logits.

    Args:
        hidden: ``[..., H]`` final hidden states (after the last norm), one per predicted token.
        weight: ``[V, H]`` the LM head's weight (bias-free head).
        labels: ``[...]`` int64 token ids.
        chunk_tokens: rows of logits built at once (default :func:`default_chunk_tokens` for the device).
    """
    if chunk_tokens is None:
        chunk_tokens = default_chunk_tokens(weight.shape[0], hidden.device.type)
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    flat = hidden.reshape(-1, hidden.shape[-1])
    log_p, entropy, sum_sq = _LinearLogProbs.apply(flat, weight, labels.reshape(-1), temperature, chunk_tokens,
                                                   calculate_entropy, calculate_sum_pi_squared)
    shape = labels.shape
    return (log_p.reshape(shape), entropy.reshape(shape) if calculate_entropy else None,
            sum_sq.reshape(shape) if calculate_sum_pi_squared else None)
