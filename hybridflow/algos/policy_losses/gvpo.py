"""GVPO: group variance policy optimisation (``loss_mode=gvpo``), as verl-recipe's ``gvpo`` recipe computes it.

Zhang et al., "GVPO: Group Variance Policy Optimization for Large Language Model Post-Training" (arXiv 2504.19599,
eq. 9): a mean-squared error between the centred implicit reward of each response and its centred task reward, over
the k = rollout.n responses of one prompt (its group, the batch's ``uid``)::

    r_i    = beta * sum_t m_it (log pi_theta(y_it) - log pi_old(y_it))        implicit reward          [B]
    rbar_g = mean_{j in g} sg(r_j)                                            its group mean, detached [G]
    a_i    = sum_t m_it A_it / |y_i|                                          R_i - mean_g R (grpo with
                                                                              norm_adv_by_std_in_grpo=False) [B]
    l_i    = 1/2 ((r_i - rbar_g(i)) - a_i)^2 / (k - 1)                                                 [B]
    loss   = b / N_seq * sum_{i in micro-batch} l_i

``beta`` is ``actor.gvpo_beta``. The recipe sums l_i over a micro-batch of b rows, scales by 1 / (gradient
accumulation steps) and FSDP averages the ranks: that is b / N_seq with N_seq the mini-batch's rows over all ranks
(``global_num_seqs``), so with one call (no global count) the loss is the recipe's ``compute_policy_loss_gvpo``.
The group mean needs every row of the group: each group must lie whole in the micro-batch (the recipe gathers
r over the data-parallel ranks instead; here the rows of a group stay on one rank, ``PolicyLossSpec.whole_groups``).
No importance ratio and no clip: ``loss_agg_mode`` and rollout-correction weights do not apply (refused by the
check). An empty response has a_i = 0 (the recipe divides by its zero length). Metrics: ``ppo_kl`` from the
log-ratio; the clip fractions are 0.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import torch

from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.policy_losses.common import LossAggregation, PolicyLossInputs, policy_loss_metrics
from hybridflow.algos.registry import register_policy_loss

ACTOR = "actor_rollout_ref.actor"


@dataclass(frozen=True)
class GVPOConfig:
    """GVPO's knobs: the KL weight beta of its objective and the group size k (rollout.n)."""

    gvpo_beta: float = 0.1
    rollout_n: int | None = None
    """Rows of one group; None: taken from the groups themselves (all must have the same size)."""


def gvpo_problems(setting) -> list[str]:
    """Settings the recipe's loss cannot run with, found before any model loads (one line each)."""
    problems = []
    beta, n = setting("actor_rollout_ref.actor.gvpo_beta"), setting("actor_rollout_ref.rollout.n")
    micro = setting("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")
    if beta is None or beta <= 0:
        problems.append(f"loss_mode=gvpo needs {ACTOR}.gvpo_beta > 0 (the recipe's 0.1), got {beta}")
    if n < 2:
        problems.append(f"loss_mode=gvpo compares the responses of one prompt: set actor_rollout_ref.rollout.n >= 2 "
                        f"(got {n})")
    if setting("actor_rollout_ref.actor.use_dynamic_bsz"):
        problems.append(f"loss_mode=gvpo keeps each prompt's rollout.n responses in one micro-batch, which a token "
                        f"budget does not: set {ACTOR}.use_dynamic_bsz=False (as the recipe asserts)")
    elif micro is not None and micro % n:
        problems.append(f"loss_mode=gvpo needs each prompt's rollout.n={n} responses in one micro-batch: make "
                        f"{ACTOR}.ppo_micro_batch_size_per_gpu={micro} a multiple of {n}")
    if setting("actor_rollout_ref.actor.shuffle"):
        problems.append(f"loss_mode=gvpo keeps each prompt's responses together: set {ACTOR}.shuffle=False")
    if setting("algorithm.rollout_correction.rollout_is"):
        problems.append("loss_mode=gvpo has no importance ratio to weight (the recipe ignores rollout IS weights): "
                        "set algorithm.rollout_correction.rollout_is=null")
    return problems


def group_rows(index, *, rollout_n: int | None) -> tuple[torch.Tensor, int]:
    """``(group of each row [B] as 0..G-1, k)`` from the rows' group ids; raises when a group is not whole."""
    if index is None:
        raise AlgorithmError("loss_mode=gvpo needs the group id of every row (the batch's uid column)")
    ids = [str(u) for u in np.asarray(index, dtype=object).tolist()]
    sizes = Counter(ids)
    k = rollout_n if rollout_n is not None else next(iter(sizes.values()))
    split = next((u for u, size in sizes.items() if size != k), None)
    if split is not None:
        raise AlgorithmError(f"loss_mode=gvpo: group {split!r} has {sizes[split]} of its {k} responses in this "
                             f"micro-batch; make actor.ppo_micro_batch_size_per_gpu a multiple of rollout.n={k} and "
                             "actor.ppo_mini_batch_size a multiple of the data-parallel size")
    if k < 2:
        raise AlgorithmError("loss_mode=gvpo needs at least 2 responses per prompt (rollout.n >= 2)")
    order = {u: g for g, u in enumerate(sizes)}
    return torch.tensor([order[u] for u in ids]), k


@register_policy_loss("gvpo", config=GVPOConfig, check=gvpo_problems, whole_groups=True,
                      knobs={"gvpo_beta": "actor_rollout_ref.actor.gvpo_beta",
                             "rollout_n": "actor_rollout_ref.rollout.n"})
def gvpo_policy_loss(inputs: PolicyLossInputs, config: GVPOConfig,
                     agg: LossAggregation) -> tuple[torch.Tensor, dict[str, float]]:
    """GVPO loss over ``[B, T]`` inputs and the rows' group ids ``inputs.index``; see the module docstring."""
    groups, k = group_rows(inputs.index, rollout_n=config.rollout_n)
    groups = groups.to(inputs.log_prob.device)
    mask = inputs.response_mask.to(inputs.log_prob.dtype)
    log_ratio = inputs.log_prob - inputs.old_log_prob  # 0 at masked positions (PolicyLossInputs.valid)
    reward = config.gvpo_beta * log_ratio.sum(dim=-1)
    count = int(groups.max()) + 1
    group_mean = torch.zeros(count, dtype=reward.dtype, device=reward.device).index_add(0, groups, reward.detach()) / k
    advantage = torch.where(mask > 0, inputs.advantages, 0.0).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    per_row = 0.5 * ((reward - group_mean[groups]) - advantage).square() / (k - 1)
    rows = per_row.shape[0]
    scale = 1.0 if agg.global_num_seqs is None else rows / agg.global_num_seqs
    return per_row.sum() * scale, policy_loss_metrics(log_ratio=log_ratio, response_mask=inputs.response_mask)
