"""Token-wise covariance of advantage and log-probability (arXiv 2505.22617).

Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models": the entropy change of a softmax policy under policy gradient is driven by
Cov(log pi(y_t), A_t); the few tokens with the largest covariance collapse entropy.
Clip-Cov and KL-Cov both pick tokens by the centred product, estimated over the valid
tokens of the call::

    cov_t = (A_t - mean(A)) * (log pi_theta(y_t) - mean(log pi_theta))     [B, T]
"""

from __future__ import annotations

import torch

from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.stats import masked_mean


def check_token_ratio(*, name: str, ratio: float) -> None:
    """Clip-Cov's / KL-Cov's fraction of tokens to act on must be positive."""
    if ratio <= 0:
        raise AlgorithmError(f"{name} must be > 0, got {ratio} (a small fraction such as 2e-4)")


def covariance_token_count(*, ratio: float, num_valid: int) -> int:
    """k = max(1, floor(ratio * N)): how many of the N valid tokens Clip-Cov / KL-Cov act on."""
    return max(int(ratio * num_valid), 1)


@torch.no_grad()
def token_covariance(*, advantages: torch.Tensor, log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """cov_t ``[B, T]`` (detached); means over the valid tokens of ``response_mask``."""
    centred_advantages = advantages - masked_mean(values=advantages, mask=response_mask)
    centred_log_prob = log_prob - masked_mean(values=log_prob, mask=response_mask)
    return centred_advantages * centred_log_prob
