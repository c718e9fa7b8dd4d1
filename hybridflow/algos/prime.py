"""PRIME (Cui et al. 2025, "Process Reinforcement through Implicit Rewards", arXiv 2502.01456): the math of
verl-recipe's ``recipe/prime`` (prime_core_algos.py, prime_dp_rm.py), pure tensors. Registered as the estimator
``prime`` (``algos/advantages/prime.py``); the trainer builds the implicit PRM for it (``needs_implicit_prm``).

Implicit process reward (Sec. 3.1): a PRM ``pi_phi`` initialised from the policy and a frozen reference give each
response token the reward ``r_t = beta * log(pi_phi(y_t | y_<t) / pi_ref(y_t | y_<t))``; the outcome score of the
response is ``sigma(beta * sum_t q_t)`` with ``q_t`` the log-ratio.

PRM loss (Sec. 3.2, the cross-entropy on outcome labels, verl's ``compute_ce_dpo_loss_rm``)::

    L_CE(phi) = -mean_i [ y_i log sigma(beta sum_t q_it) + (1 - y_i) log(1 - sigma(beta sum_t q_it)) ]

Advantages (Sec. 3.3, RLOO per reward source, then summed): with ``n`` samples a prompt and ``m_j`` the mean of
sample j's rewards over its masked tokens, each masked token reward of sample i becomes
``r_it * n / (n - 1) - sum_j m_j / (n - 1)`` (for a reward on the last token only: ``r_i - mean_{j != i} r_j``);
``A = whiten(sum_{s >= t} (c_dense r'^dense + c_outcome r'^outcome)_s)`` over the batch's response tokens.

Before the advantages the dense rewards take the recipe's ``reward_model.prime_granularity`` (``token``: as they are;
``whole``: their sum on the last response token) and ``reward_model.prime_norm`` (``batch_norm``: divided by the
largest ``|sum_{s >= t} r_s|`` over the batch, plus 1e-6; ``none``: unchanged).

Shapes: ``[B, T]`` response tokens, ``[B]`` per response; ``B`` = prompts x n, a prompt's samples consecutive.
"""

from __future__ import annotations

import torch

from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.stats import masked_whiten


def implicit_process_rewards(*, prm_log_probs: torch.Tensor, ref_log_probs: torch.Tensor,
                             response_mask: torch.Tensor, beta: float) -> torch.Tensor:
    """``[B, T]`` dense rewards ``beta * (log pi_phi - log pi_ref)`` on response tokens, 0 elsewhere."""
    return beta * (prm_log_probs - ref_log_probs) * response_mask


PRIME_GRANULARITIES = ("token", "whole")
PRIME_NORMS = ("batch_norm", "none")
PRM_UPDATES = ("before", "none")
"""``reward_model.model.update`` values that run: train then score (the recipe's default), or a frozen PRM."""


def implicit_prm_problems(setting) -> list[str]:
    """The implicit PRM's settings (the ``prime`` estimator's spec check, before any model loads): one line per
    problem, naming the fix."""
    problems = []
    update, loss_type = setting("reward_model.model.update"), setting("reward_model.model.loss_type")
    granularity, norm = setting("reward_model.prime_granularity"), setting("reward_model.prime_norm")
    if update not in PRM_UPDATES:
        problems.append(f"reward_model.model.update={update!r}: use before (train the PRM, then score) or "
                        "none (a frozen PRM); the recipe's after / reverse are not implemented")
    if loss_type != "ce":
        problems.append(f"reward_model.model.loss_type={loss_type!r}: only ce (the cross-entropy on the "
                        "outcome labels) is implemented, as in the recipe")
    if granularity not in PRIME_GRANULARITIES:
        problems.append(f"reward_model.prime_granularity={granularity!r}: use one of {', '.join(PRIME_GRANULARITIES)}")
    if norm not in PRIME_NORMS:
        problems.append(f"reward_model.prime_norm={norm!r}: use one of {', '.join(PRIME_NORMS)}")
    return problems + _prm_layout_problems(setting)


def _prm_layout_problems(setting) -> list[str]:
    """The PRM starts as the policy, and a prompt's samples stay in consecutive rows (leave-one-out baselines)."""
    problems, path, policy = [], setting("reward_model.model.path"), setting("actor_rollout_ref.model.path")
    if path not in (None, policy):
        problems.append(f"reward_model.model.path={path!r}: the implicit PRM starts as the policy and takes "
                        "its log-ratio to the policy's reference; leave it unset or set it to "
                        f"actor_rollout_ref.model.path ({policy!r})")
    n = setting("actor_rollout_ref.rollout.n")
    if n < 2:
        problems.append(f"PRIME's leave-one-out baselines need actor_rollout_ref.rollout.n >= 2 (got {n})")
    ranks = setting("trainer.nnodes") * setting("trainer.n_gpus_per_node")
    if setting("trainer.balance_batch") and setting("trainer.backend") == "ray" and ranks > 1:
        problems.append("PRIME needs each prompt's samples in consecutive rows, which balancing over ranks breaks: "
                        "set trainer.balance_batch=False (the recipe's setting)")
    return problems


def dense_reward_granularity(rewards: torch.Tensor, *, response_mask: torch.Tensor, granularity: str) -> torch.Tensor:
    """``[B, T]``: ``token`` keeps the per-token rewards; ``whole`` puts each response's sum on its last token."""
    if granularity not in PRIME_GRANULARITIES:
        raise AlgorithmError(f"reward_model.prime_granularity={granularity!r}: use one of {', '.join(PRIME_GRANULARITIES)}")
    if granularity == "token":
        return rewards
    return last_token_values(rewards.sum(-1), response_mask=response_mask)


def prime_batch_norm(rewards: torch.Tensor, *, norm: str) -> torch.Tensor:
    """``[B, T]``: ``batch_norm`` divides by ``max |reverse cumsum|`` over the batch (+1e-6); ``none`` is identity."""
    if norm not in PRIME_NORMS:
        raise AlgorithmError(f"reward_model.prime_norm={norm!r}: use one of {', '.join(PRIME_NORMS)}")
    if norm == "none":
        return rewards
    reverse_cumsum = rewards.flip(-1).cumsum(-1).flip(-1)
    return rewards / (reverse_cumsum.abs().max() + 1e-6)


def last_token_values(values: torch.Tensor, *, response_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: each ``values [B]`` on its response's last masked-in position, 0 elsewhere."""
    last = response_mask.sum(-1).long().clamp(min=1) - 1
    out = torch.zeros(response_mask.shape, dtype=values.dtype, device=values.device)
    out[torch.arange(len(values), device=values.device), last] = values
    return out


def implicit_prm_ce_loss(*, log_ratios: torch.Tensor, response_mask: torch.Tensor, outcome: torch.Tensor,
                         beta: float) -> torch.Tensor:
    """Scalar L_CE: the implicit outcome score ``sigma(beta * sum_t q_t)`` against the 0/1 ``outcome`` ``[B]``."""
    logits = beta * (log_ratios * response_mask).sum(dim=-1)
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, outcome.to(logits.dtype))


def leave_one_out(*, rewards: torch.Tensor, reward_mask: torch.Tensor, n: int) -> torch.Tensor:
    """``[B, T]``: RLOO of one reward source over each prompt's ``n`` consecutive samples (masked tokens only)."""
    if n < 2 or rewards.shape[0] % n:
        raise AlgorithmError(f"PRIME's leave-one-out needs n >= 2 samples a prompt and B a multiple of n "
                             f"(got n={n}, B={rewards.shape[0]})")
    mask = reward_mask.to(rewards.dtype)
    means = (rewards * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # m_j [B]
    baseline = means.view(-1, n).sum(-1, keepdim=True).expand(-1, n).reshape(-1) / (n - 1)
    return (rewards * n / (n - 1) - baseline[:, None]) * mask


def prime_advantages(*, dense_rewards: torch.Tensor, outcome_scores: torch.Tensor, response_mask: torch.Tensor,
                     n: int, dense_coef: float, outcome_coef: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) ``[B, T]``: RLOO of the dense rewards and of the outcome score (on the last response
    token), weighted, summed, returns as reverse cumulative sums, advantages whitened over the batch."""
    mask = response_mask.bool()
    outcome = last_token_values(outcome_scores.to(dense_rewards.dtype), response_mask=response_mask)
    outcome_mask = last_token_values(torch.ones_like(outcome_scores, dtype=torch.bool), response_mask=response_mask)
    total = dense_coef * leave_one_out(rewards=dense_rewards, reward_mask=mask, n=n) + \
        outcome_coef * leave_one_out(rewards=outcome, reward_mask=outcome_mask, n=n)
    returns = (total * response_mask).flip(-1).cumsum(-1).flip(-1)
    return masked_whiten(values=returns, mask=response_mask), returns


def dense_prm_rewards(*, prm_log_probs: torch.Tensor, ref_log_probs: torch.Tensor, response_mask: torch.Tensor,
                      beta: float, granularity: str, norm: str) -> tuple[torch.Tensor, dict[str, float]]:
    """(dense rewards ``[B, T]`` as the advantages read them, metrics): the implicit process rewards at
    ``granularity``, normalised by ``norm``; ``reward_model/reward`` is their mean sum per response and
    ``reward_model/raw_reward`` the mean summed log-ratio (the recipe's metric names)."""
    rewards = implicit_process_rewards(prm_log_probs=prm_log_probs, ref_log_probs=ref_log_probs,
                                       response_mask=response_mask, beta=beta)
    rewards = prime_batch_norm(dense_reward_granularity(rewards, response_mask=response_mask,
                                                        granularity=granularity), norm=norm)
    raw = ((prm_log_probs - ref_log_probs) * response_mask).sum(-1)
    return rewards, {"reward_model/reward": rewards.sum(-1).mean().item(), "reward_model/raw_reward": raw.mean().item()}


def dpo_accuracy(*, rewards: torch.Tensor, outcome: torch.Tensor, response_mask: torch.Tensor, n: int) -> dict[str, float]:
    """The recipe's PRM accuracies (its ``compute_dpo_accuracy`` / ``compute_dpo_abs_accuracy``): ``dpo_acc``, over
    each prompt's sample pairs (i < j), the share whose summed dense rewards order them as the outcomes do, weighted
    by ``|y_i - y_j|`` (0.5 for a prompt whose outcomes are all equal), averaged over prompts; ``dpo_acc_abs``, the
    share of responses with ``sign(sum_t r_t) == sign(2 y - 1)``."""
    sums = (rewards * response_mask).sum(-1)
    score_diff = (sums.view(-1, n, 1) - sums.view(-1, 1, n))  # [G, n, n]: s_i - s_j
    outcome_diff = (outcome.view(-1, n, 1) - outcome.view(-1, 1, n)).to(sums.dtype)
    upper = torch.ones(n, n, dtype=torch.bool, device=sums.device).triu(diagonal=1)
    weight = outcome_diff.abs() * upper
    agree = ((score_diff > 0) == (outcome_diff > 0)).to(sums.dtype)
    total = weight.sum((1, 2))
    per_prompt = torch.where(total > 0, (agree * weight).sum((1, 2)) / total.clamp(min=1e-12),
                             torch.full_like(total, 0.5))
    absolute = (torch.sign(sums) == torch.sign(outcome.to(sums.dtype) * 2 - 1)).float().mean()
    return {"reward_model/dpo_acc": per_prompt.mean().item(), "reward_model/dpo_acc_abs": absolute.item()}
