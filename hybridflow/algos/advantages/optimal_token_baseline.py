"""Optimal token baselines (``optimal_token_baseline``, ``tir_optimal_token_baseline``).

verl 0.9's per-token variance-minimising baseline (after the optimal-baseline argument of
Greensmith et al., JMLR 2004, and OPO, arXiv 2505.23585, taken per timestep): the
gradient variance of token t grows with the squared score-function norm accumulated so
far, approximated from the sampling distribution pi (old log-probs) per token as::

    ||s_j||^2 ~ w_j = (1 - 2 pi_j(y_j) + sum_v pi_j(v)^2) [* rho_j^2 with rollout IS weights]
    W_it      = sum_{j <= t} m_ij w_ij                     (cumulative path variance) [B, T]
    G_it      = sum_{t' >= t} m_it' r_it'                  (return to go)             [B, T]
    B_gt      = sum_{i in g} m_it G_it W_it / (sum_{i in g} m_it W_it + eps)
    A_it      = (G_it - B_gt) m_it

Groups of one get B = 0 (A = G). If a group's longest response is unique and longer
than the runner-up, its baseline is 0 from the runner-up's length on (nobody else
predicts those steps). ``sum_pi_squared`` ``[B, T]`` comes from the actor's old-log-prob
pass (``actor.calculate_sum_pi_squared``).

``optimal_token_baseline`` aligns timesteps by position in the response;
``tir_optimal_token_baseline`` (tool-integrated reasoning) by the index among *valid*
tokens, so the model's k-th own token is compared across responses whatever tool
observations came before it; empty responses do not count as group members.
"""

from __future__ import annotations

import torch

from hybridflow.algos.advantages.groups import group_ids, group_sum
from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.registry import register_advantage



def sum_pi_squared_problems(setting) -> list[str]:
    """sum_v pi(v)^2 comes from the actor's old-log-prob pass: it must be asked for, and the pass must run."""
    name, problems = setting("algorithm.adv_estimator"), []
    if not setting("actor_rollout_ref.actor.calculate_sum_pi_squared"):
        problems.append(f"algorithm.adv_estimator={name} needs sum_v pi(v)^2 per token: set "
                        "actor_rollout_ref.actor.calculate_sum_pi_squared=True")
    if setting("algorithm.rollout_correction.bypass_mode") or setting("actor_rollout_ref.actor.use_rollout_log_probs"):
        problems.append(f"algorithm.adv_estimator={name} needs the old-log-prob pass; turn off "
                        "rollout_correction.bypass_mode / actor.use_rollout_log_probs")
    return problems


def path_variance(*, old_log_probs, sum_pi_squared, valid, rollout_is_weights=None) -> torch.Tensor:
    """W ``[B, T]``: cumulative sum over valid tokens of 1 - 2 pi(y_t) + sum_v pi(v)^2."""
    per_token = 1 - 2 * old_log_probs.exp() + sum_pi_squared
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights.square()
    return torch.where(valid, per_token, torch.zeros_like(per_token)).cumsum(dim=-1)


def unique_longest_tail(*, lengths: torch.Tensor, ids: torch.Tensor, members: torch.Tensor, width: int):
    """``[B, T]`` bool: the columns past the runner-up's length of a group's unique longest member."""
    num_groups = int(ids.max()) + 1
    lengths = torch.where(members, lengths, torch.full_like(lengths, -1))
    longest = lengths.new_full((num_groups,), -1).scatter_reduce(0, ids, lengths, reduce="amax")[ids]
    is_longest = members & (lengths == longest)
    n_longest = group_sum(values=is_longest.to(torch.float32), ids=ids)
    rest = torch.where(is_longest, torch.full_like(lengths, -1), lengths)
    runner_up = lengths.new_full((num_groups,), -1).scatter_reduce(0, ids, rest, reduce="amax")[ids]
    owner = is_longest & (n_longest == 1) & (runner_up >= 0)
    columns = torch.arange(width, device=lengths.device)[None, :]
    return owner[:, None] & (columns >= runner_up[:, None])


def token_baselines(*, returns, path_var, valid, ids, members) -> torch.Tensor:
    """B ``[B, T]``: the W-weighted group mean of the return at each column, 0 for groups of one
    member and on the unique longest member's unshared tail."""
    num_groups = int(ids.max()) + 1
    weight = torch.where(valid, path_var, torch.zeros_like(path_var))
    numerator = returns.new_zeros(num_groups, returns.shape[1]).index_add(0, ids, returns * weight)
    denominator = torch.zeros_like(numerator).index_add(0, ids, weight)
    baselines = (numerator / (denominator + 1e-8))[ids]
    count = group_sum(values=members.to(returns.dtype), ids=ids)
    tail = unique_longest_tail(lengths=valid.sum(dim=-1), ids=ids, members=members, width=returns.shape[1])
    return torch.where((count[:, None] > 1) & ~tail, baselines, torch.zeros_like(baselines))


def _inputs(*, token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared, rollout_is_weights):
    if sum_pi_squared is None or old_log_probs is None:
        raise AlgorithmError("optimal token baselines need the old log-probs and sum_v pi(v)^2 per token; "
                             "set actor_rollout_ref.actor.calculate_sum_pi_squared=True")
    valid = response_mask.bool()
    rewards = torch.where(valid, token_level_rewards, torch.zeros_like(token_level_rewards))
    returns = rewards.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    path_var = path_variance(old_log_probs=old_log_probs, sum_pi_squared=sum_pi_squared, valid=valid,
                             rollout_is_weights=rollout_is_weights)
    ids = group_ids(index=index, batch_size=len(returns), device=returns.device)
    return valid, returns, path_var, ids


@register_advantage("optimal_token_baseline", check=sum_pi_squared_problems)
@torch.no_grad()
def optimal_token_baseline_advantage(*, token_level_rewards, response_mask, index, old_log_probs=None,
                                     sum_pi_squared=None, rollout_is_weights=None, **_):
    """``(A [B, T], G [B, T])``, both 0 on masked tokens, timesteps aligned by position; see the module docstring."""
    valid, returns, path_var, ids = _inputs(
        token_level_rewards=token_level_rewards, response_mask=response_mask, index=index,
        old_log_probs=old_log_probs, sum_pi_squared=sum_pi_squared, rollout_is_weights=rollout_is_weights)
    members = torch.ones_like(ids, dtype=torch.bool)
    baselines = token_baselines(returns=returns, path_var=path_var, valid=valid, ids=ids, members=members)
    zeros = torch.zeros_like(returns)
    return torch.where(valid, returns - baselines, zeros), torch.where(valid, returns, zeros)


@register_advantage("tir_optimal_token_baseline", check=sum_pi_squared_problems)
@torch.no_grad()
def tir_optimal_token_baseline_advantage(*, token_level_rewards, response_mask, index, old_log_probs=None,
                                         sum_pi_squared=None, rollout_is_weights=None, **_):
    """``(A [B, T], G [B, T])``, both 0 on masked tokens, timesteps aligned by index among valid tokens."""
    valid, returns, path_var, ids = _inputs(
        token_level_rewards=token_level_rewards, response_mask=response_mask, index=index,
        old_log_probs=old_log_probs, sum_pi_squared=sum_pi_squared, rollout_is_weights=rollout_is_weights)
    # valid tokens first, in order: column k is then every response's k-th own token
    order = torch.argsort((~valid).to(torch.int8), dim=-1, stable=True)
    packed_valid = valid.gather(1, order)
    packed_returns = torch.where(packed_valid, returns.gather(1, order), torch.zeros_like(returns))
    baselines = token_baselines(returns=packed_returns, path_var=path_var.gather(1, order), valid=packed_valid,
                                ids=ids, members=valid.any(dim=-1))
    zeros = torch.zeros_like(returns)
    packed_advantages = torch.where(packed_valid, packed_returns - baselines, zeros)
    return torch.zeros_like(returns).scatter(1, order, packed_advantages), torch.where(valid, returns, zeros)
