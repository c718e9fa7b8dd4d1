"""Token sampling on the device: temperature, top-k, top-p, and the sampled log-probs.

For logits ``z`` ``[N, V]`` the sampling distribution is

    p = softmax(filter_top_p(filter_top_k(z / T)))

where the filters set the logits of removed tokens to ``-inf`` (Holtzman et al. 2020,
"The Curious Case of Neural Text Degeneration", for top-p). The returned log-prob of a
sampled token is ``log p[token]`` under this processed distribution (vLLM's
``processed_logprobs``). Greedy decoding (``T == 0``) takes ``argmax z`` and reports
``log softmax(z)[token]``.
"""

from __future__ import annotations

import torch

from hybridflow.rollout.types import SamplingParams


def filter_top_k(*, logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the ``top_k`` largest logits of each row ``[N, V]``; ``-1`` keeps all."""
    if top_k == -1 or top_k >= logits.shape[-1]:
        return logits
    kth_largest = torch.topk(logits, top_k, dim=-1).values[:, -1:]
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def filter_top_p(*, logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose total probability is >= ``top_p``.

    A token survives when the probability mass strictly before it (in descending
    order) is below ``top_p``, so the most likely token always survives.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    remove_sorted = mass_before >= top_p
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def processed_logits(*, logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``[N, V]`` fp32 logits of the sampling distribution (temperature, then top-k, then top-p)."""
    scaled = logits.float()
    if params.temperature != 1.0:  # dividing by 1 would cost a pass over [N, V] for nothing
        scaled = scaled / params.temperature
    return filter_top_p(logits=filter_top_k(logits=scaled, top_k=params.top_k), top_p=params.top_p)


def sample_tokens(
    *, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None,
    uniform: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of ``logits`` ``[N, V]``.

    Args:
        uniform: ``[N, 1]`` draws from ``U[0, 1)`` (:func:`draw_uniform`) to use instead of
            drawing from ``generator``; lets slices of one batch be sampled apart (in decode
            lanes) with the same numbers as the whole batch.

    Returns:
        ``(tokens [N] int64, logprobs [N] float32)``, both on the logits' device.
    """
    if params.greedy:
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        tokens = logits.argmax(dim=-1)
        return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)
    if uniform is None:
        uniform = draw_uniform(rows=logits.shape[0], generator=generator, device=logits.device)
    return _inverse_cdf_sample(logits=processed_logits(logits=logits, params=params), uniform=uniform)


def draw_uniform(*, rows: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """``[rows, 1]`` fp32 draws from ``U[0, 1)``, one per sampled row."""
    return torch.rand(rows, 1, generator=generator, device=device, dtype=torch.float32)


def _inverse_cdf_sample(*, logits: torch.Tensor, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One draw per row of ``softmax(logits)`` ``[N, V]`` by inverting its CDF at ``uniform`` ``[N, 1]``.

    With ``m = max z`` and ``w = exp(z - m)``, the token is the first index whose running
    sum of ``w`` exceeds ``u * sum(w)``, and its log-prob is ``z[token] - m - log sum(w)``.
    Four passes over ``[N, V]`` (max, subtract, exp, cumulative sum), where
    ``torch.multinomial`` draws an exponential variate per vocabulary entry, which on CPU
    costs more than a decode step's attention. ``right=True`` never selects a
    zero-probability (filtered, ``-inf``) token.
    """
    peak = logits.amax(dim=-1, keepdim=True)
    cdf = (logits - peak).exp_().cumsum_(dim=-1)
    total = cdf[:, -1:]
    tokens = torch.searchsorted(cdf, uniform * total, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)
    logprobs = logits.gather(-1, tokens[:, None]) - peak - total.log()
    return tokens, logprobs.squeeze(-1)
