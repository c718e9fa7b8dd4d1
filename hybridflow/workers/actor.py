"""The actor: the trained policy. Log-probs of responses and PPO-style updates.

One ``update_policy`` call is one training step (verl's ``dp_actor.update_policy``):

    for epoch in range(ppo_epochs):
        for mini_batch in split(batch, ppo_mini_batch_size * rollout.n / dp_size):
            for micro_batch in split(mini_batch, ppo_micro_batch_size_per_gpu or token budget):
                loss = policy_loss(...) - entropy_coeff * H + kl_loss_coef * KL(pi || ref)
                backward(loss)            # normalised by the mini-batch's *global* token/seq count
            clip grad norm; skip the step if the loss or the norm is not finite; optimizer.step()
    lr_scheduler.step()

``update_preference`` runs the same optimizer step on a sequence-level preference
objective (SPIN's DPO over pairs, SPPO's squared loss; ``workers/preference_update.py``).

Global counts make the gradient independent of the micro-batch split and of the
data-parallel sharding (the losses in hybridflow.algos take them as arguments).
"""

from __future__ import annotations

import functools
from collections import defaultdict

import torch

from hybridflow.algos import agg_loss, get_policy_loss, kl_penalty, masked_mean
from hybridflow.data.batch import Batch
from hybridflow.workers.distributed import DataParallel, LOCAL
from hybridflow.workers.logprob import batch_log_probs, micro_batch_log_probs
from hybridflow.workers.micro_batches import LogProbBatching, micro_batches, per_rank_micro_batch_size
from hybridflow.workers.optim import TrainState
from hybridflow.workers.ppo_update import averaged, optimizer_step, ppo_mini_batches
from hybridflow.workers.preference_update import OBJECTIVES, preference_micro_loss

POLICY_LOSS_KNOBS = ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "dro_beta")
ACTOR_LOSS_KNOBS = ("tau_pos", "tau_neg")
BYPASS_KNOBS = ("loss_type", "rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
                "rollout_rs_threshold")


class ActorWorker:
    """Policy model + optimizer + LR schedule, configured by an ``ActorConfig`` section."""

    def __init__(self, *, state: TrainState, cfg, rollout_n: int, max_response_length: int,
                 log_prob: LogProbBatching | None = None, dp: DataParallel = LOCAL, seed: int = 0,
                 rollout_correction=None, layout: str = "padded"):
        self.state = state
        self.layout = layout
        self.model = state.model
        self.cfg = cfg
        self.rollout_n = rollout_n
        self.max_response_length = max_response_length
        self.log_prob = log_prob or LogProbBatching(use_dynamic_bsz=cfg.use_dynamic_bsz,
                                                    max_token_len=cfg.ppo_max_token_len_per_gpu)
        self.micro_batch_size = per_rank_micro_batch_size(cfg.ppo_micro_batch_size_per_gpu, cfg.ppo_micro_batch_size,
                                                          dp.world_size)
        self.dp = dp
        self.seed = seed
        self.policy_loss_fn = get_policy_loss(cfg.policy_loss.loss_mode)
        self.loss_knobs = {**{k: getattr(cfg.policy_loss, k) for k in POLICY_LOSS_KNOBS},
                           **{k: getattr(cfg, k) for k in ACTOR_LOSS_KNOBS}}
        if rollout_correction is not None and rollout_correction.bypass_mode:
            # verl's bypass mode: the loss itself compares pi_theta with the engine's pi_rollout
            self.policy_loss_fn = get_policy_loss("bypass_mode")
            self.loss_knobs.update({k: getattr(rollout_correction, k) for k in BYPASS_KNOBS})
        # seq-mean-token-sum-norm's divisor: loss_scale_factor when set, as verl's agg_loss
        self.norm_length = cfg.loss_scale_factor if cfg.loss_scale_factor is not None else max_response_length

    # ------------------------------------------------------------------ inference
    def compute_log_prob(self, batch: Batch, *, temperature: float) -> tuple[torch.Tensor, ...]:
        """Old log-probs ``[B, T]`` and entropy ``[B, T]`` of the rollout under the current weights; with
        ``calculate_sum_pi_squared`` a third element, sum_v pi(v)^2 ``[B, T]``."""
        return batch_log_probs(
            self.model, batch, temperature=temperature, micro_batch_size=self.log_prob.micro_batch_size,
            use_dynamic_bsz=self.log_prob.use_dynamic_bsz, max_token_len=self.log_prob.max_token_len,
            calculate_entropy=True, calculate_sum_pi_squared=self.cfg.calculate_sum_pi_squared, dp=self.dp,
            layout=self.layout, use_torch_compile=self.cfg.use_torch_compile,
        )

    # ------------------------------------------------------------------ training
    def update_policy(self, batch: Batch, *, temperature: float, step: int) -> dict[str, float]:
        """One training step on ``batch`` (needs old_log_probs, advantages, response_mask)."""
        self.model.train()
        metrics: dict[str, list[float]] = defaultdict(list)
        for counts, micros in ppo_mini_batches(batch, cfg=self.cfg, rows_per_prompt=self.rollout_n, dp=self.dp,
                                               seed=self.seed, step=step, micro_batch_size=self.micro_batch_size):
            loss_fn = functools.partial(self._micro_loss, temperature=temperature, counts=counts)
            optimizer_step(state=self.state, dp=self.dp, micros=micros, loss_fn=loss_fn, metrics=metrics)
        return self._finish_step(metrics)

    def update_preference(self, batch: Batch, *, objective: str, params: dict, rows_per_prompt: int,
                          temperature: float, step: int) -> dict[str, float]:
        """One training step of a sequence-level preference objective (``workers/preference_update``).

        Mini-batches of ``ppo_mini_batch_size`` prompts (``rows_per_prompt`` rows each: 2 per SPIN
        pair, rollout.n for SPPO) x ``ppo_epochs``, in row order (pairs stay whole);
        micro-batches of ``ppo_micro_batch_size_per_gpu`` items (pairs for DPO, as verl's recipe).
        """
        spec = OBJECTIVES[objective]
        self.model.train()
        metrics: dict[str, list[float]] = defaultdict(list)
        mini_size = max(self.cfg.ppo_mini_batch_size * rows_per_prompt // self.dp.world_size, spec.rows_per_item)
        micro_size = self.cfg.ppo_micro_batch_size_per_gpu
        for _epoch in range(self.cfg.ppo_epochs):
            for mini in batch.split(mini_size):
                counts = self.dp.global_counts(mini["response_mask"])
                micros = micro_batches(mini, micro_batch_size=micro_size and micro_size * spec.rows_per_item,
                                       use_dynamic_bsz=self.cfg.use_dynamic_bsz and spec.rows_per_item == 1,
                                       max_token_len=self.cfg.ppo_max_token_len_per_gpu, dp=self.dp)
                loss_fn = functools.partial(preference_micro_loss, model=self.model, objective=spec, params=params,
                                            counts=counts, temperature=temperature, layout=self.layout)
                optimizer_step(state=self.state, dp=self.dp, micros=micros, loss_fn=loss_fn, metrics=metrics)
        return self._finish_step(metrics)

    def _finish_step(self, metrics: dict[str, list[float]]) -> dict[str, float]:
        self.state.scheduler.step()
        out = averaged(metrics, prefix="actor/")
        out["actor/lr"] = self.state.lr
        return out

    def _micro_loss(self, micro: Batch, *, temperature: float, counts: dict[str, float]):
        use_entropy = self.cfg.entropy_coeff != 0
        # Without a recompute pass the entropy metric comes from this forward (detached if unused).
        report_entropy = use_entropy or self.cfg.use_rollout_log_probs
        log_prob, entropy = micro_batch_log_probs(self.model, micro, temperature=temperature,
                                                  calculate_entropy=report_entropy, layout=self.layout,
                                                  entropy_checkpointing=self.cfg.entropy_checkpointing,
                                                  use_torch_compile=self.cfg.use_torch_compile)
        mask = micro["response_mask"]
        agg = dict(loss_mask=mask, loss_agg_mode=self.cfg.loss_agg_mode, max_response_length=self.norm_length,
                   global_num_tokens=counts["tokens"], global_num_seqs=counts["seqs"])
        pg_loss, metrics = self.policy_loss_fn(
            old_log_prob=micro["old_log_probs"], log_prob=log_prob, advantages=micro["advantages"],
            response_mask=mask, loss_agg_mode=self.cfg.loss_agg_mode, clip_ratio=self.cfg.clip_ratio,
            clip_ratio_low=self.cfg.clip_ratio_low, clip_ratio_high=self.cfg.clip_ratio_high,
            clip_ratio_c=self.cfg.clip_ratio_c, global_num_tokens=counts["tokens"], global_num_seqs=counts["seqs"],
            max_response_length=self.norm_length,
            rollout_is_weights=micro["rollout_is_weights"] if "rollout_is_weights" in micro else None,
            **self.loss_knobs,
        )
        loss = pg_loss
        shares = {"pg_loss": pg_loss.item()}
        if report_entropy:
            metrics["entropy"] = masked_mean(values=entropy.detach(), mask=mask).item()
        if use_entropy:
            loss = loss - self.cfg.entropy_coeff * agg_loss(loss_mat=entropy, **agg)
        if self.cfg.use_kl_loss:
            kld = kl_penalty(logprob=log_prob, ref_logprob=micro["ref_log_probs"], kl_penalty=self.cfg.kl_loss_type)
            kl_term = agg_loss(loss_mat=kld, **agg)
            loss = loss + self.cfg.kl_loss_coef * kl_term
            shares["kl_loss"] = kl_term.item()
            metrics["kl_coef"] = self.cfg.kl_loss_coef
        shares["loss"] = loss.item()
        return loss, shares, metrics
