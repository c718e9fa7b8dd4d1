"""PPO's clipped surrogate with clip-higher and dual-clip (``loss_mode=vanilla``).

Schulman et al., PPO (arXiv 1707.06347), eq. 7, with the decoupled bounds of DAPO's
clip-higher (Yu et al., arXiv 2503.14476) and the dual clip of Ye et al. (arXiv
1912.09729) for negative advantages. With rho = pi_theta / pi_old per token::

    l_clip = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high))
    l      = min(l_clip, -A c)   if A < 0        (c = clip_ratio_c > 1)
             l_clip              otherwise
    loss   = agg(l)                                (loss_agg_mode, see agg.py)

Metrics (masked token means): ``pg_clipfrac`` (clipped term chosen), ``pg_clipfrac_lower``
(dual clip active), ``ppo_kl`` = mean(log pi_old - log pi_theta) (the k1 estimate).
"""

from __future__ import annotations

import torch

from hybridflow.algos.agg import agg_loss
from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.policy_losses.common import clamped_log_ratio, clip_range
from hybridflow.algos.registry import register_policy_loss
from hybridflow.algos.stats import masked_mean


@register_policy_loss("vanilla")
def vanilla_policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    max_response_length: int | None = None,
    **_,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped PPO loss over ``[B, T]`` inputs; see the module docstring."""
    if clip_ratio_c <= 1.0:
        raise AlgorithmError(
            f"clip_ratio_c must be > 1 for the dual clip, got {clip_ratio_c}; set actor.clip_ratio_c=3.0"
        )
    low, high = clip_range(clip_ratio=clip_ratio, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)
    log_ratio = clamped_log_ratio(log_prob=log_prob, old_log_prob=old_log_prob)
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - low, 1 + high)
    clip_loss = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * clip_ratio_c
    losses = torch.where(advantages < 0, torch.minimum(clip_loss, dual_bound), clip_loss)
    loss = agg_loss(
        loss_mat=losses,
        loss_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        max_response_length=max_response_length,
    )
    lower_clipped = (clip_loss > dual_bound) & (advantages < 0)
    metrics = {
        "pg_clipfrac": masked_mean(values=(clipped > unclipped).float(), mask=response_mask).item(),
        "pg_clipfrac_lower": masked_mean(values=lower_clipped.float(), mask=response_mask).item(),
        "ppo_kl": masked_mean(values=-log_ratio.detach(), mask=response_mask).item(),
    }
    return loss, metrics
