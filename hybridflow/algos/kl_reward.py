"""The in-reward KL penalty of RLHF (``algorithm.use_kl_in_reward``).

Ouyang et al., "Training language models to follow instructions with human feedback"
(arXiv 2203.02155), eq. 2: every response token is charged the KL estimate::

    r_t = s_t - beta * KL_t(pi_old || pi_ref)        [B, T]

and the batch KL fed to the controller is the mean over samples of the per-sample
masked token mean.
"""

from __future__ import annotations

import torch

from hybridflow.algos.kl import kl_penalty
from hybridflow.algos.stats import masked_mean


def apply_kl_penalty(
    *,
    token_level_scores: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kl_penalty_type: str = "kl",
) -> tuple[torch.Tensor, float]:
    """Rewards ``[B, T]`` minus ``kl_coef`` times the masked KL estimate, and the batch KL.

    Returns:
        ``(token_level_rewards [B, T], current_kl)``; pass ``current_kl`` to the
        controller's ``update`` with ``n_steps = B``.
    """
    kld = kl_penalty(logprob=old_log_prob, ref_logprob=ref_log_prob, kl_penalty=kl_penalty_type)
    kld = kld * response_mask.to(kld.dtype)
    per_sample_kl = masked_mean(values=kld, mask=response_mask, dim=-1)
    return token_level_scores - kl_coef * kld, per_sample_kl.mean().item()
