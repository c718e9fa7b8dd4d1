"""PF-PPO: policy filtration by reward-weighted resampling (``algorithm.use_pf_ppo``).

"Policy Filtration in RLHF to Fine-Tune LLM for Code Generation" (arXiv
2409.06957): a reward model is least reliable in the middle of its range, so train on the
responses whose rewards are more trustworthy. verl's form, which we follow, resamples
the batch with replacement (same size) with probability proportional to a weight of
each response's score r_i = sum_t token_level_scores_it::

    pow:         w_i = |r_i|^p                      (p = pf_ppo.weight_pow)
    max_min:     w_i = 1 if r_i is the batch's max or min score, else 0
    max_random:  w_i = 0.4 if r_i is the batch's max score, else 0.1
    P(i)         = (w_i + 1e-8) / sum_j (w_j + 1e-8)

The paper's filters (best-random, best-worst) select responses per prompt; verl applies
these weights over the whole batch, and so do we. verl resamples only when
``adv_estimator=gae`` (elsewhere the flag is silently ignored); hybridflow resamples for
every estimator, after advantages are computed, with a generator seeded per step.
"""

from __future__ import annotations

import torch

from hybridflow.algos.errors import AlgorithmError

PF_PPO_METHODS = ("pow", "max_min", "max_random")


def pf_ppo_weights(*, scores: torch.Tensor, reweight_method: str, weight_pow: float = 2.0) -> torch.Tensor:
    """Unnormalised sampling weights ``[B]`` of the sequence scores ``[B]`` (before the 1e-8 floor)."""
    if reweight_method == "pow":
        return scores.abs().pow(weight_pow)
    is_max = scores == scores.max()
    if reweight_method == "max_min":
        return (is_max | (scores == scores.min())).to(scores.dtype)
    if reweight_method == "max_random":
        return torch.where(is_max, 0.4, 0.1).to(scores.dtype)
    raise AlgorithmError(f"algorithm.pf_ppo.reweight_method={reweight_method!r}: use one of {', '.join(PF_PPO_METHODS)}")


def pf_ppo_resample(*, scores: torch.Tensor, reweight_method: str, weight_pow: float = 2.0,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Row indices ``[B]`` drawn with replacement with probability proportional to the weights."""
    weights = pf_ppo_weights(scores=scores.float().cpu(), reweight_method=reweight_method, weight_pow=weight_pow)
    return torch.multinomial(weights + 1e-8, len(scores), replacement=True, generator=generator)
