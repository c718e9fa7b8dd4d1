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
    *, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of ``logits`` ``[N, V]``.

    Returns:
        ``(tokens [N] int64, logprobs [N] float32)``, both on the logits' device.
    """
    if params.greedy:
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        tokens = logits.argmax(dim=-1)
    else:
        log_probs = torch.log_softmax(processed_logits(logits=logits, params=params), dim=-1)
        tokens = _inverse_cdf_sample(probs=log_probs.exp(), generator=generator)
    return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)


def _inverse_cdf_sample(*, probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of ``probs`` ``[N, V]`` from one uniform number per row.

    ``torch.multinomial`` draws an exponential variate per vocabulary entry, which on
    CPU costs more than a decode step's attention; the inverse CDF needs a cumulative
    sum and a binary search. ``right=True`` never selects a zero-probability token.
    """
    cdf = torch.cumsum(probs, dim=-1)
    uniform = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=cdf.dtype)
    tokens = torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).squeeze(-1)
    return tokens.clamp_(max=probs.shape[-1] - 1)
