"""The actor: the trained policy. Log-probs of responses and PPO-style updates.

One ``update_policy`` call is one training step (verl's ``dp_actor.update_policy``):

    for epoch in range(ppo_epochs):
        for mini_batch in split(batch, ppo_mini_batch_size * rollout.n / dp_size):
            for micro_batch in split(mini_batch, ppo_micro_batch_size_per_gpu or token budget):
                loss = policy_loss(...) - entropy_coeff * H + kl_loss_coef * KL(pi || ref)
                       (+ router_aux_loss_coef * L_aux for an MoE model with output_router_logits)
                backward(loss)            # normalised by the mini-batch's *global* token/seq count
            clip grad norm; skip the step if the loss or the norm is not finite; optimizer.step()
    lr_scheduler.step()

``update_preference`` runs the same optimizer step on a sequence-level preference
objective (SPIN's DPO over pairs, SPPO's squared loss; ``workers/preference_update.py``).

Global counts make the gradient independent of the micro-batch split and of the
data-parallel sharding (the losses in hybridflow.algos take them as arguments).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from hybridflow.algos import agg_loss, get_policy_loss, kl_penalty
from hybridflow.algos.distillation import (DistillationObjective, distillation_loss_spec,
                                           get_distillation_loss)
from hybridflow.algos.distillation.combine import combined_loss, distillation_term
from hybridflow.data.batch import Batch
from hybridflow.data.parallel import DataParallel, LOCAL
from hybridflow.models.router_aux import record_router_logits
from hybridflow.workers.logprob import batch_log_probs, micro_batch_log_probs
from hybridflow.workers.micro_batches import LogProbBatching
from hybridflow.workers.optim import TrainState
from hybridflow.workers.ppo_update import UpdateSchedule, averaged, optimizer_step, ppo_mini_batches
from hybridflow.workers.preference_update import OBJECTIVES, preference_micro_loss


@dataclass(frozen=True)
class PolicyObjective:
    """What the actor minimises on a micro-batch (the role builder maps verl's actor keys onto it):

        loss = policy_loss(loss_mode; clip ratios, knobs) - entropy_coeff * H + kl_loss_coef * KL(pi || ref)

    plus ``router_aux_loss_coef * L_aux`` where the model is a mixture of experts whose config sets
    ``output_router_logits`` (``hybridflow.models.router_aux``; logged as ``actor/router_aux_loss``).
    """

    loss_mode: str = "vanilla"
    """Registered policy loss (``hybridflow.algos.get_policy_loss``); ``bypass_mode`` compares with pi_rollout."""
    knobs: dict = field(default_factory=dict)
    """Extra keyword arguments of that loss (clip-cov ratios, GPG/SAPO temperatures, bypass thresholds)."""
    loss_agg_mode: str = "token-mean"
    """How token losses become one number (``algos/agg.py``)."""
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0
    """Dual-clip bound for negative advantages (Ye et al. 2020)."""
    norm_length: int | None = None
    """``seq-mean-token-sum-norm``'s divisor (loss_scale_factor, else the max response length)."""
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "low_var_kl"
    calculate_entropy: bool = False
    """verl's ``actor.calculate_entropy``: compute the entropy in the training forward and log it as
    ``actor/entropy_loss`` even when entropy_coeff is 0 (verl logs it whenever the entropy is computed)."""
    report_entropy: bool = False
    """No recompute pass gives the pre-update ``actor/entropy`` (the engine's log-probs are the old ones): take it
    from the training forward instead, aggregated as the loss is."""
    # on-policy distillation (verl 0.9.1's distillation.distillation_loss)
    distillation: DistillationObjective | None = None
    """The distillation term and how it joins the loss above (``algos/distillation/combine.py``); needs the
    teacher's ``teacher_log_probs`` (or top-k) columns in the batch."""


class ActorWorker:
    """Policy model + optimizer + LR schedule, told explicitly what to minimise and how to walk a batch."""

    def __init__(self, *, state: TrainState, schedule: UpdateSchedule, objective: PolicyObjective,
                 log_prob: LogProbBatching = LogProbBatching(), dp: DataParallel = LOCAL, seed: int = 0,
                 layout: str = "padded", use_torch_compile: bool = False, entropy_checkpointing: bool = False,
                 calculate_sum_pi_squared: bool = False, chunked_head: bool = False):
        self.state = state
        self.model = state.model
        self.schedule = schedule
        self.objective = objective
        self.policy_loss_fn = get_policy_loss(objective.loss_mode)
        self.log_prob = log_prob
        self.dp = dp
        self.seed = seed
        self.layout = layout
        self.use_torch_compile = use_torch_compile
        self.entropy_checkpointing = entropy_checkpointing
        self.calculate_sum_pi_squared = calculate_sum_pi_squared
        self.chunked_head = chunked_head

    # ------------------------------------------------------------------ inference
    def compute_log_prob(self, batch: Batch, *, temperature: float) -> tuple[torch.Tensor, ...]:
        """Old log-probs ``[B, T]`` and entropy ``[B, T]`` of the rollout under the current weights; with
        ``calculate_sum_pi_squared`` a third element, sum_v pi(v)^2 ``[B, T]``."""
        return batch_log_probs(
            self.model, batch, temperature=temperature, micro_batch_size=self.log_prob.micro_batch_size,
            use_dynamic_bsz=self.log_prob.use_dynamic_bsz, max_token_len=self.log_prob.max_token_len,
            calculate_entropy=True, calculate_sum_pi_squared=self.calculate_sum_pi_squared, dp=self.dp,
            layout=self.layout, use_torch_compile=self.use_torch_compile, chunked_head=self.chunked_head,
        )

    # ------------------------------------------------------------------ training
    def update_policy(self, batch: Batch, *, temperature: float, step: int) -> dict[str, float]:
        """One training step on ``batch`` (needs old_log_probs, advantages, response_mask)."""
        self.model.train()
        metrics: dict[str, list[float]] = defaultdict(list)
        for counts, micros in ppo_mini_batches(batch, schedule=self.schedule, dp=self.dp, seed=self.seed, step=step):
            loss_fn = functools.partial(self._micro_loss, temperature=temperature, counts=counts)
            optimizer_step(state=self.state, dp=self.dp, micros=micros, loss_fn=loss_fn, metrics=metrics)
        return self._finish_step(metrics)

    def update_preference(self, batch: Batch, *, objective: str, params: dict, rows_per_prompt: int,
                          temperature: float, step: int) -> dict[str, float]:
        """One training step of a sequence-level preference objective (``workers/preference_update``).

        The actor's schedule with ``rows_per_prompt`` rows per prompt (2 per SPIN pair, rollout.n for
        SPPO), in row order (pairs stay whole); micro-batch sizes count items (pairs for DPO, as verl's
        recipe), and only one-row items may use the token budget.
        """
        spec = OBJECTIVES[objective]
        self.model.train()
        metrics: dict[str, list[float]] = defaultdict(list)
        schedule = dataclasses.replace(self.schedule, rows_per_prompt=rows_per_prompt, shuffle=False,
                                       item_rows=spec.rows_per_item)
        loss_fn = functools.partial(preference_micro_loss, model=self.model, objective=spec, params=params,
                                    temperature=temperature, layout=self.layout, chunked_head=self.chunked_head)
        for counts, micros in ppo_mini_batches(batch, schedule=schedule, dp=self.dp, seed=self.seed, step=step):
            optimizer_step(state=self.state, dp=self.dp, micros=micros,
                           loss_fn=functools.partial(loss_fn, counts=counts), metrics=metrics)
        return self._finish_step(metrics)

    def _finish_step(self, metrics: dict[str, list[float]]) -> dict[str, float]:
        self.state.scheduler.step()
        out = averaged(metrics, prefix="actor/")
        out["actor/lr"] = self.state.lr
        return out

    def _micro_loss(self, micro: Batch, *, temperature: float, counts: dict[str, float]):
        obj = self.objective
        use_entropy = obj.entropy_coeff != 0
        calculate_entropy = use_entropy or obj.calculate_entropy or obj.report_entropy
        distill = obj.distillation
        topk = distill is not None and distillation_loss_spec(distill.loss_mode).use_topk
        with record_router_logits(self.model) as router:  # None unless an MoE model gives a router loss
            log_prob, entropy, *student_topk = micro_batch_log_probs(
                self.model, micro, temperature=temperature, calculate_entropy=calculate_entropy, layout=self.layout,
                entropy_checkpointing=self.entropy_checkpointing, use_torch_compile=self.use_torch_compile,
                chunked_head=self.chunked_head, gather_ids=micro["teacher_topk_ids"] if topk else None)
        mask = micro["response_mask"]
        agg = dict(loss_mask=mask, loss_agg_mode=obj.loss_agg_mode, max_response_length=obj.norm_length,
                   global_num_tokens=counts["tokens"], global_num_seqs=counts["seqs"])
        pg_loss, metrics = self.policy_loss_fn(
            old_log_prob=micro["old_log_probs"], log_prob=log_prob, advantages=micro["advantages"],
            response_mask=mask, loss_agg_mode=obj.loss_agg_mode, clip_ratio=obj.clip_ratio,
            clip_ratio_low=obj.clip_ratio_low, clip_ratio_high=obj.clip_ratio_high,
            clip_ratio_c=obj.clip_ratio_c, global_num_tokens=counts["tokens"], global_num_seqs=counts["seqs"],
            max_response_length=obj.norm_length,
            rollout_is_weights=micro["rollout_is_weights"] if "rollout_is_weights" in micro else None,
            index=micro["uid"] if "uid" in micro else None, **obj.knobs,
        )
        loss = pg_loss
        shares = {"pg_loss": pg_loss.item()}
        if calculate_entropy:
            # this micro-batch's share of the mini-batch's aggregate entropy: summed over micro-batches like the loss
            entropy_term = agg_loss(loss_mat=entropy, **agg)
            if use_entropy:
                loss = loss - obj.entropy_coeff * entropy_term
            if use_entropy or obj.calculate_entropy:
                shares["entropy_loss"] = entropy_term.item()  # verl's actor/entropy_loss
            if obj.report_entropy:
                shares["entropy"] = entropy_term.item()
        if obj.use_kl_loss:
            kld = kl_penalty(logprob=log_prob, ref_logprob=micro["ref_log_probs"], kl_penalty=obj.kl_loss_type)
            kl_term = agg_loss(loss_mat=kld, **agg)
            loss = loss + obj.kl_loss_coef * kl_term
            shares["kl_loss"] = kl_term.item()
            metrics["kl_coef"] = obj.kl_loss_coef
        if distill is not None:
            loss = self._with_distillation(micro, distill, task_loss=loss, log_prob=log_prob, agg=agg,
                                           student_topk=student_topk, shares=shares, metrics=metrics)
        if router is not None:
            # This micro-batch's share of the mini-batch's sequence-weighted mean of L_aux.
            aux_term = router.loss() * micro["responses"].shape[0] / counts["seqs"]
            loss = loss + router.coef * aux_term
            shares["router_aux_loss"] = aux_term.item()
        shares["loss"] = loss.item()
        return loss, shares, metrics

    def _with_distillation(self, micro: Batch, distill: DistillationObjective, *, task_loss, log_prob, agg: dict,
                           student_topk: list, shares: dict, metrics: dict) -> torch.Tensor:
        """The micro-batch loss with the distillation term joined ; its share and metrics recorded."""
        per_token, extra = get_distillation_loss(distill.loss_mode)(
            loss_mode=distill.loss_mode, student_log_probs=log_prob,
            teacher_log_probs=micro["teacher_log_probs"] if "teacher_log_probs" in micro else None,
            student_topk_log_probs=student_topk[-1] if student_topk else None,
            teacher_topk_log_probs=micro["teacher_topk_log_probs"] if student_topk else None,
            log_prob_min_clamp=distill.log_prob_min_clamp)
        mask = agg["loss_mask"]
        term, term_metrics = distillation_term(
            distill, per_token, log_prob=log_prob, old_log_prob=micro["old_log_probs"], response_mask=mask,
            loss_agg_mode=agg["loss_agg_mode"], global_num_tokens=agg["global_num_tokens"],
            global_num_seqs=agg["global_num_seqs"], max_response_length=agg["max_response_length"],
            rollout_is_weights=micro["rollout_is_weights"] if "rollout_is_weights" in micro else None)
        shares["distillation/loss"] = term.item()
        valid = mask.bool()
        for name, value in extra.items():  # top-k masses: the micro-batch's mean over valid tokens
            metrics[f"distillation/{name}"] = value[valid].mean().item() if valid.any() else 0.0
        metrics.update({f"distillation/{name}": value for name, value in term_metrics.items()})
        return combined_loss(distill, task_loss=task_loss, distill_loss=term)
