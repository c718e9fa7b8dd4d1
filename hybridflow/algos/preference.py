"""Pairwise and self-play preference losses (SPIN / online DPO, IPO, SPPO).

Inputs are summed response log-probabilities ``[B]`` (one entry per pair or sample);
``h`` is the policy-vs-reference log-ratio margin of a pair::

    h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))

==========  ===============================================================  ===========
loss        per pair / sample                                                paper
==========  ===============================================================  ===========
dpo         -(1 - s) log sigmoid(beta h) - s log sigmoid(-beta h)            2305.18290
ipo         (h - 1 / (2 beta))^2                                             2310.12036
sppo        (log pi(y) - log pi_ref(y) - eta (P(y > pi_ref) - 1/2))^2        2405.00675
==========  ===============================================================  ===========

(``s`` is label smoothing, the conservative DPO of Mitchell 2023.) Each loss is the sum
over entries divided by ``global_num_pairs`` (default: the local count), so micro-batch
losses add up to the batch loss. Metrics follow TRL's names.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _mean(*, losses: torch.Tensor, global_num_pairs: float | None) -> torch.Tensor:
    count = global_num_pairs if global_num_pairs is not None else max(losses.numel(), 1)
    return losses.sum() / count


def _pair_metrics(*, beta: float, chosen_logratio: torch.Tensor, rejected_logratio: torch.Tensor) -> dict[str, float]:
    """TRL's ``rewards/*`` of the implicit reward r = beta (log pi - log pi_ref) ``[B]``, detached."""
    chosen_reward, rejected_reward = beta * chosen_logratio.detach(), beta * rejected_logratio.detach()
    return {
        "rewards/chosen": chosen_reward.mean().item(),
        "rewards/rejected": rejected_reward.mean().item(),
        "rewards/accuracies": (chosen_reward > rejected_reward).float().mean().item(),
        "rewards/margins": (chosen_reward - rejected_reward).mean().item(),
    }


def dpo_loss(
    *,
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    global_num_pairs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO sigmoid loss (Rafailov et al., arXiv 2305.18290, eq. 7); inputs ``[B]``."""
    chosen_logratio = policy_chosen_logps - ref_chosen_logps
    rejected_logratio = policy_rejected_logps - ref_rejected_logps
    logits = beta * (chosen_logratio - rejected_logratio)
    # logsigmoid is exact for large |logits| where log(sigmoid(.)) underflows to -inf.
    losses = -(1 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    metrics = _pair_metrics(beta=beta, chosen_logratio=chosen_logratio, rejected_logratio=rejected_logratio)
    return _mean(losses=losses, global_num_pairs=global_num_pairs), metrics


def ipo_loss(
    *,
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    global_num_pairs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """IPO squared loss (Azar et al., arXiv 2310.12036, tau = ``beta``); inputs ``[B]``.

    The paper uses log-probabilities averaged over tokens; pass those if you want it.
    """
    chosen_logratio = policy_chosen_logps - ref_chosen_logps
    rejected_logratio = policy_rejected_logps - ref_rejected_logps
    losses = (chosen_logratio - rejected_logratio - 1 / (2 * beta)).square()
    metrics = _pair_metrics(beta=beta, chosen_logratio=chosen_logratio, rejected_logratio=rejected_logratio)
    return _mean(losses=losses, global_num_pairs=global_num_pairs), metrics


def sppo_loss(
    *,
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    win_prob: torch.Tensor,
    eta: float,
    global_num_pairs: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SPPO squared loss (Wu et al., arXiv 2405.00675); inputs ``[B]``.

    ``win_prob`` is the estimated P(y beats the current policy pi_ref). With a winner
    (P = 1) and a loser (P = 0) per pair and ``eta = 1 / beta`` this is TRL's
    ``sppo_hard``: (a - 1/(2 beta))^2 + (b + 1/(2 beta))^2.
    """
    logratio = policy_logps - ref_logps
    losses = (logratio - eta * (win_prob - 0.5)).square()
    metrics = {"logratio/mean": logratio.detach().mean().item()}
    return _mean(losses=losses, global_num_pairs=global_num_pairs), metrics
