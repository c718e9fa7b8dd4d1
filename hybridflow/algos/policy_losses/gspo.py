"""GSPO: sequence-level importance ratio (``loss_mode=gspo``).

Zheng et al., "Group Sequence Policy Optimization" (arXiv 2507.18071): the GSPO objective in its
token-level form GSPO-token, which equals GSPO when all tokens of a
sequence share the advantage::

    s_i      = exp( 1/|y_i| sum_t log(pi_theta / pi_old)(y_i,t) )   (length-normalised)
    s_i,t    = sg[s_i] * pi_theta(y_i,t) / sg[pi_theta(y_i,t)]      (value s_i, per-token grad)
    l_i,t    = max(-A s_i,t, -A clip(s_i,t, 1 - eps_low, 1 + eps_high))
    loss     = agg(l)

The paper averages per sequence then over sequences: use
``loss_agg_mode="seq-mean-token-mean"`` and its small clip ranges (3e-4 / 4e-4).
"""

from __future__ import annotations

import torch

from hybridflow.algos.policy_losses.common import (
    ClipConfig,
    LossAggregation,
    PolicyLossInputs,
    clamp_log_ratio,
    clipped_surrogate,
    policy_loss_metrics,
)
from hybridflow.algos.registry import register_policy_loss


def sequence_log_ratio(
    *, log_prob: torch.Tensor, old_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """log s_i ``[B]``: the mean token log-ratio over each sequence's valid tokens."""
    mask = response_mask.to(log_prob.dtype)
    token_log_ratio = torch.where(mask > 0, log_prob - old_log_prob, torch.zeros_like(log_prob))
    return (token_log_ratio * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)


@register_policy_loss("gspo", config=ClipConfig)
def gspo_policy_loss(inputs: PolicyLossInputs, config: ClipConfig,
                     agg: LossAggregation) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO-token loss over ``[B, T]`` inputs; see the module docstring."""
    low, high = config.bounds()
    log_prob, old_log_prob = inputs.log_prob, inputs.old_log_prob
    seq_log_ratio = sequence_log_ratio(log_prob=log_prob, old_log_prob=old_log_prob,
                                       response_mask=inputs.response_mask)
    log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach()[:, None]
    ratio = clamp_log_ratio(log_ratio=log_ratio).exp()
    clip_loss, clipped = clipped_surrogate(ratio=ratio, advantages=inputs.advantages, clip_low=low, clip_high=high)
    # ppo_kl of the token log-ratios, unclamped (they are reported, not exponentiated)
    metrics = policy_loss_metrics(log_ratio=log_prob - old_log_prob, response_mask=inputs.response_mask,
                                  clipped=clipped)
    return agg(clip_loss, inputs=inputs), metrics
