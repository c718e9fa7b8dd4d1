"""Sequence-level preference objectives of the actor: DPO / IPO over pairs (SPIN), SPPO per response.

Each objective turns one micro-batch into ``(loss, shares)`` for the actor's optimizer step (``ActorWorker.update_preference``). The math lives in
``hybridflow.algos.preference``; here the summed response log-probabilities ``[b]`` are
formed and matched with the batch's columns:

- ``dpo`` / ``ipo``: rows are pairs, chosen at even and rejected at odd positions
  (``[c0, r0, c1, r1, ...]``); needs ``ref_seq_log_prob [b]``. Micro-batches hold whole pairs.
- ``sppo``: one row per response; needs ``ref_seq_log_prob [b]`` and ``win_prob [b]``.

Losses (and metrics) are normalised by the mini-batch's global pair (or response) count, so
micro-batch shares add up to the mini-batch value at any micro-batch split or data-parallel size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from hybridflow.algos import dpo_loss, ipo_loss, masked_sum, sppo_loss
from hybridflow.data.batch import Batch
from hybridflow.workers.logprob import micro_batch_log_probs


def _shares(means: dict[str, float], *, items: int, global_items: float) -> dict[str, float]:
    """Micro-batch means as shares of the mini-batch mean: they add up exactly over micro-batches and ranks."""
    return {key: value * items / global_items for key, value in means.items()}


def _pair_loss(loss_fn) -> Callable:
    def objective(*, seq_log_probs: torch.Tensor, micro: Batch, global_rows: float, params: dict):
        ref = micro["ref_seq_log_prob"]
        loss, metrics = loss_fn(policy_chosen_logps=seq_log_probs[0::2], policy_rejected_logps=seq_log_probs[1::2],
                                ref_chosen_logps=ref[0::2], ref_rejected_logps=ref[1::2],
                                global_num_pairs=global_rows / 2, **params)
        # verl's SPIN metric names: actor/rewards_chosen, actor/rewards_margins, ...
        means = {key.replace("/", "_"): value for key, value in metrics.items()}
        return loss, {"dpo_loss": loss.item(), **_shares(means, items=len(micro) // 2, global_items=global_rows / 2)}
    return objective


def _sppo(*, seq_log_probs: torch.Tensor, micro: Batch, global_rows: float, params: dict):
    eta = params["eta"]
    loss, metrics = sppo_loss(policy_logps=seq_log_probs, ref_logps=micro["ref_seq_log_prob"],
                              win_prob=micro["win_prob"], eta=eta, global_num_pairs=global_rows)
    # verl's SPPO recipe name actor/log_ratio_mean; the size of the regression target |eta (P - 1/2)|
    means = {"log_ratio_mean": metrics["logratio/mean"],
             "target_abs_mean": (eta * (micro["win_prob"] - 0.5)).abs().mean().item()}
    return loss, {"sppo_loss": loss.item(), **_shares(means, items=len(micro), global_items=global_rows)}


@dataclass(frozen=True)
class PreferenceObjective:
    """A sequence-level loss and how many consecutive rows one of its items spans (2 = a pair)."""

    loss: Callable
    rows_per_item: int


OBJECTIVES = {
    "dpo": PreferenceObjective(loss=_pair_loss(dpo_loss), rows_per_item=2),
    "ipo": PreferenceObjective(loss=_pair_loss(ipo_loss), rows_per_item=2),
    "sppo": PreferenceObjective(loss=_sppo, rows_per_item=1),
}
"""Objective name -> spec; the trainers pick one by name (``algorithm.dpo_loss_type``: sigmoid = dpo)."""


def sequence_log_probs(model, micro: Batch, *, temperature: float, layout: str = "padded",
                       chunked_head: bool = False) -> torch.Tensor:
    """``[b]`` log pi(response | prompt): token log-probs summed over the response mask, in the
    actor's forward ``layout`` (padded / packed / shared_prompt: same values)."""
    log_probs, _ = micro_batch_log_probs(model, micro, temperature=temperature, calculate_entropy=False,
                                         layout=layout, chunked_head=chunked_head)
    return masked_sum(values=log_probs, mask=micro["response_mask"], dim=-1)


def preference_micro_loss(micro: Batch, *, model, objective: PreferenceObjective, params: dict,
                          counts: dict[str, float], temperature: float, layout: str = "padded",
                          chunked_head: bool = False):
    """(loss with gradient, shares of the mini-batch's loss and metrics, no per-micro-batch metrics)."""
    seq = sequence_log_probs(model, micro, temperature=temperature, layout=layout, chunked_head=chunked_head)
    loss, shares = objective.loss(seq_log_probs=seq, micro=micro, global_rows=counts["seqs"], params=params)
    shares["loss"] = loss.item()
    return loss, shares, {}
