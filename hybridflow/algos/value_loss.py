"""Clipped value-function loss of PPO's critic (``critic.cliprange_value``).

Schulman et al., PPO (arXiv 1707.06347) as implemented in OpenAI baselines::

    V_clip = V_old + clip(V - V_old, -eps_v, eps_v)
    l_t    = 1/2 * max((V - R)^2, (V_clip - R)^2)           [B, T]
    loss   = agg(l)           (loss_agg_mode, see agg.py)

``vf_clipfrac`` is the fraction of valid tokens where the clipped term is larger.
"""

from __future__ import annotations

import torch

from hybridflow.algos.agg import agg_loss
from hybridflow.algos.stats import masked_mean


def value_loss(
    *,
    vpreds: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float | None,
    loss_agg_mode: str = "token-mean",
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    max_response_length: int | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Critic loss for predictions ``vpreds`` ``[B, T]`` given rollout-time ``values``.

    ``cliprange_value=None`` disables clipping (plain squared error). ``max_response_length`` and
    ``loss_scale_factor`` are the ``L`` of ``seq-mean-token-sum-norm`` (see agg.py).
    """
    unclipped = (vpreds - returns).square()
    if cliprange_value is None:
        clipped = unclipped
    else:
        vpreds_clipped = values + (vpreds - values).clamp(-cliprange_value, cliprange_value)
        clipped = (vpreds_clipped - returns).square()
    loss = 0.5 * agg_loss(
        loss_mat=torch.maximum(unclipped, clipped),
        loss_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        max_response_length=max_response_length,
        loss_scale_factor=loss_scale_factor,
    )
    clipfrac = masked_mean(values=(clipped > unclipped).float(), mask=response_mask)
    return loss, {"vf_clipfrac": clipfrac.item()}
