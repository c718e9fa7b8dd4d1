"""GDPO: group-normalise each reward component separately, then sum (``adv_estimator=gdpo``).

"GDPO: Group reward-Decoupled Normalization Policy Optimization" (arXiv 2601.05242): with
several rewards (format, accuracy, length, ...), GRPO normalises their sum, so a component
with a large spread drowns the others. GDPO normalises each component r^k within its
group first, as GRPO does, then takes a weighted sum and whitens it over the batch::

    A^k_i = (r^k_i - mean_g r^k) / (std_g r^k + eps)      (GRPO per component; no std
                                                           division when norm_adv_by_std_in_grpo=False)
    A_i   = sum_k w_k A^k_i                              (w = algorithm.gdpo_reward_weights, default 1)
    A     = whiten_batch(A_i on every valid token)       [B, T]

``reward_components`` ``{name: [B]}`` come from the reward function's dict
(``algorithm.gdpo_reward_keys``); without them the summed token-level reward is the single
component (verl's fallback), and GDPO is GRPO followed by batch whitening.

The spec below is everything the loop needs for it: the per-component scores it derives from the
batch's reward columns (``reward_components``), the weights it reads from the run config, and the
check that the keys are set, run before any model loads.
"""

from __future__ import annotations

import torch

from hybridflow.algos.advantages.grpo import grpo_group_baseline
from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.registry import register_advantage
from hybridflow.algos.stats import masked_whiten


def reward_components(batch, setting) -> dict[str, torch.Tensor] | None:
    """The per-component scores ``{key: [B]}`` of ``algorithm.gdpo_reward_keys``, from the batch's
    ``reward_extra/{key}`` columns (the reward function's dict; its ``score`` is the main score, ``seq_score``)."""
    keys = setting("algorithm.gdpo_reward_keys")
    if not keys:
        return None
    columns = {key: f"reward_extra/{key}" if key != "score" else "seq_score" for key in keys}
    missing = [key for key, column in columns.items() if column not in batch]
    if missing:
        raise AlgorithmError(f"algorithm.gdpo_reward_keys: the reward function returned no {missing}; return a "
                             "dict with these keys from compute_score, or fix gdpo_reward_keys")
    device = batch["token_level_rewards"].device
    return {key: batch[column].float().to(device) for key, column in columns.items()}


def reward_keys_problems(setting) -> list[str]:
    """GDPO without reward keys (verl requires them too), or weights that do not pair with them."""
    keys, weights = setting("algorithm.gdpo_reward_keys"), setting("algorithm.gdpo_reward_weights")
    if not keys:
        return ["algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the reward function's dict "
                "keys to normalise separately, e.g. [format_reward,accuracy_reward]"]
    if weights is not None and len(weights) != len(keys):
        return [f"algorithm.gdpo_reward_weights has {len(weights)} weights for {len(keys)} gdpo_reward_keys: "
                "give one weight per key, or null for all 1"]
    return []


@register_advantage("gdpo", knobs={"reward_weights": "algorithm.gdpo_reward_weights"},
                    inputs={"reward_components": reward_components}, check=reward_keys_problems)
@torch.no_grad()
def gdpo_advantage(
    *,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    reward_components: dict[str, torch.Tensor] | None = None,
    reward_weights: list[float] | None = None,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    **_,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled-normalisation advantage ``[B, T]``; returns equal the advantages."""
    mask = response_mask.to(token_level_rewards.dtype)
    components = list((reward_components or {"score": token_level_rewards.sum(dim=-1)}).values())
    weights = [1.0] * len(components) if reward_weights is None else list(reward_weights)
    if len(weights) != len(components):
        raise AlgorithmError(f"gdpo: {len(weights)} reward weights for {len(components)} reward components; "
                             "give algorithm.gdpo_reward_weights one weight per gdpo_reward_keys entry")
    combined = torch.zeros_like(token_level_rewards[:, 0])
    for weight, scores in zip(weights, components):
        combined = combined + weight * grpo_group_baseline(scores=scores.to(combined.dtype), index=index,
                                                           epsilon=epsilon, norm_by_std=norm_adv_by_std_in_grpo)
    advantages = masked_whiten(values=combined[:, None] * mask, mask=mask) * mask
    return advantages, advantages
