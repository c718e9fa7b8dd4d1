"""GMPO: the geometric mean of token ratios, clipped per token (``loss_mode=geo_mean``).

Zhao et al., "Geometric-Mean Policy Optimization" (arXiv 2507.20673), eq. 4: GRPO's
arithmetic mean of token ratios is dominated by outlier tokens; the geometric mean is
not. Per token the log-ratio is clipped pessimistically in the advantage's direction
(in log space, with the wider range the paper recommends, e.g. (-0.4, 0.4))::

    c_it  = sgn(A) * min(sgn(A) log rho_it, sgn(A) clip(log rho_it, -eps_low, eps_high))
    s_i   = exp( sum_t m_it c_it / |y_i| )                   (geometric mean ratio) [B]
    A_i   = sum_t m_it A_it / |y_i|                          (sequence advantage)   [B]
    loss  = sum_i -A_i s_i / N_seq

``eps`` are ``clip_ratio_low`` / ``clip_ratio_high`` applied to the *log*-ratio.
``loss_agg_mode`` is ignored (always a sequence mean, as the paper and verl). verl takes
``torch.mean`` over the rows of each micro-batch; we divide by ``global_num_seqs`` (the
mini-batch's sequence count, empty rows excluded) so the loss does not depend on the
micro-batch split; the two agree for one micro-batch with no empty rows. Rollout-correction
weights enter as their per-sequence geometric mean, as verl.
``pg_clipfrac`` / ``pg_clipfrac_lower``: tokens whose log-ratio left the range with A > 0 / A < 0.
"""

from __future__ import annotations

import torch

from hybridflow.algos.agg import agg_loss
from hybridflow.algos.policy_losses.common import (
    ClipConfig,
    LossAggregation,
    PolicyLossInputs,
    clamp_log_ratio,
    policy_loss_metrics,
)
from hybridflow.algos.registry import register_policy_loss

# floor inside log(w) so that a zero IS weight (IcePop) gives exp(-23) ~ 0, not log(0)
_LOG_WEIGHT_FLOOR = 1e-10


def _sequence_mean(*, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum_t m v / |y| per row ``[B]`` (0 for an empty row); masked entries are selected out."""
    return torch.where(mask > 0, values, torch.zeros_like(values)).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)


@register_policy_loss("geo_mean", config=ClipConfig)
def geo_mean_policy_loss(inputs: PolicyLossInputs, config: ClipConfig,
                         agg: LossAggregation) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO loss over ``[B, T]`` inputs; see the module docstring."""
    low, high = config.bounds()
    advantages = inputs.advantages
    mask = inputs.response_mask.to(inputs.log_prob.dtype)
    log_ratio = clamp_log_ratio(log_ratio=inputs.log_prob - inputs.old_log_prob)
    sign = torch.sign(advantages)
    clipped_log_ratio = log_ratio.clamp(-low, high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped_log_ratio)
    seq_ratio = _sequence_mean(values=pessimistic, mask=mask).exp()
    seq_advantage = _sequence_mean(values=advantages, mask=mask)
    seq_losses = -seq_advantage * seq_ratio
    if inputs.rollout_is_weights is not None:
        log_weights = torch.log(inputs.rollout_is_weights.detach() + _LOG_WEIGHT_FLOOR)
        seq_losses = seq_losses * _sequence_mean(values=log_weights, mask=mask).exp()
    # one "token" per sequence: seq-mean-token-sum is then sum_i l_i / N_seq, empty rows excluded
    non_empty = (mask.sum(dim=-1) > 0)[:, None]
    loss = agg_loss(loss_mat=seq_losses[:, None], loss_mask=non_empty, loss_agg_mode="seq-mean-token-sum",
                    global_num_seqs=agg.global_num_seqs)
    clipped = log_ratio != clipped_log_ratio
    metrics = policy_loss_metrics(log_ratio=log_ratio, response_mask=inputs.response_mask,
                                  clipped=clipped & (advantages > 0), clipped_lower=clipped & (advantages < 0))
    return loss, metrics
