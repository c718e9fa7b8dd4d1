"""The PPO / GRPO step, read top to bottom: the rollout source's samples in, the updated actor and critic out.

Dataflow of one step (the HybridFlow paper's Fig. 1, verl's ``RayPPOTrainer.fit``)::

    prompts ──► rollout.generate (n responses per prompt, engine log-probs; with multi_turn.enable each
                sample is a conversation run by its agent loop: tool/user tokens masked out of the loss)
            ──► reward.compute_scores (rule / custom function; score on the last response token)
            ──► actor.compute_log_prob (old log-probs, entropy)
            ──► reference.compute_ref_log_prob           (if a KL term is used)
            ──► teacher.compute_teacher_log_prob         (distillation.enabled: the teachers score the rollout)
            ──► critic.compute_values                    (gae only)
            ──► implicit_prm.update_prm, compute_prm_log_probs -> dense rewards   (prime only)
            ──► KL penalty in the reward (use_kl_in_reward)
            ──► rollout correction (IS weights / rejection, pi_old vs the engine's pi_rollout)
            ──► advantage estimator (registry) ──► PF-PPO resampling (use_pf_ppo)
            ──► critic.update_critic                     (gae only)
            ──► actor.update_policy                      (after critic_warmup steps)
            ──► weight sync (loop/weight_sync.py: actor -> engine in memory, no disk round trip)
            ──► metrics ──► tracking;  validation every test_freq;  checkpoint every save_freq

The first two stages are the rollout source's (``loop/sync_sources.py``, ``loop/async_source.py``), the last two
the loop's (``loop/fit.py``); :class:`PPOUpdate` is everything between.

Deviations from verl, on purpose:
- Responses are padded to the longest response of the step, not to max_response_length
  (same results, less compute on CPU); ``response_length/clip_ratio`` still compares with
  max_response_length.
- Rollout sampling is seeded from (rollout.seed, step), so a resumed run samples exactly
  what an uninterrupted one would.
- The workers are plain objects called in-process; the Ray controller wraps the same
  methods in worker groups (hybridflow.controller).
- ``behaviour_as_old`` (the asynchronous run's ``compute_prox_log_prob=False``): the engine's log-probs are the
  old policy, as with ``actor.use_rollout_log_probs``.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from hybridflow.algos import (advantage_spec, agg_loss, apply_kl_penalty, build_kl_controller, get_advantage,
                             policy_loss_spec, seq_norm_length)
from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.pf_ppo import pf_ppo_resample
from hybridflow.algos.prime import dense_prm_rewards, dpo_accuracy
from hybridflow.algos.rollout_correction import rollout_correction
from hybridflow.data.balance import balance_batch
from hybridflow.config import config_value
from hybridflow.data.batch import Batch
from hybridflow.errors import HybridflowError
from hybridflow.trainer.tracking.generations import batch_samples, dump_generations
from hybridflow.trainer.loop.parts import Rollout, Run
from hybridflow.trainer.tracking.metrics import Timer, agent_metrics, data_metrics, rollout_mismatch_metrics


def kl_controller(kl_ctrl_cfg):
    """The in-reward KL penalty's coefficient controller that ``algorithm.kl_ctrl`` names (algos' registry)."""
    return build_kl_controller(kl_ctrl_cfg.type, kl_coef=kl_ctrl_cfg.kl_coef, target_kl=kl_ctrl_cfg.target_kl,
                               horizon=kl_ctrl_cfg.horizon)


def balance_over_shards(batch: Batch, *, group, whole_groups: bool = False) -> dict[str, float]:
    """Reorder ``batch`` so each data shard of the actor ``group`` gets an equal token count (verl's
    ``balance_batch``). Shards, not ranks: the ranks of a sequence-parallel group share one shard, and
    balancing for the rank count would move the rows of a dp = 1 run into other mini-batches than sp = 1
    trains on. A plain worker (no group) is one shard: nothing to balance. ``whole_groups`` (a policy loss over
    prompt groups, GVPO) keeps the rows of one ``uid`` in one shard."""
    dp_size = getattr(group, "data_parallel_size", 1)
    if dp_size == 1:
        return {}
    return balance_batch(batch, dp_size=dp_size, groups=list(batch["uid"]) if whole_groups else None)


def prm_stage(prm, batch: Batch, *, cfg, temperature: float, step: int) -> dict[str, float]:
    """The PRIME stage: train the PRM on the step's outcome labels (``update=before``), then its dense rewards
    into ``batch["prm_rewards"]``; returns the ``reward_model/*`` metrics."""
    rm = cfg.reward_model
    labels = batch["seq_score"]
    if ((labels < 0) | (labels > 1)).any():
        raise HybridflowError(
            f"PRIME's implicit PRM learns from 0/1 outcome labels, but the reward scores span "
            f"[{labels.min().item():g}, {labels.max().item():g}]: return a score in [0, 1] from compute_score")
    metrics = prm.update_prm(batch, temperature=temperature, step=step) if rm.model.update == "before" else {}
    log_probs = prm.compute_prm_log_probs(batch, temperature=temperature).to(batch["ref_log_probs"].device)
    batch["prm_rewards"], reward_metrics = dense_prm_rewards(
        prm_log_probs=log_probs, ref_log_probs=batch["ref_log_probs"], response_mask=batch["response_mask"],
        beta=rm.model.beta_train, granularity=rm.prime_granularity, norm=rm.prime_norm)
    accuracy = dpo_accuracy(rewards=batch["prm_rewards"], outcome=labels, response_mask=batch["response_mask"],
                            n=cfg.actor_rollout_ref.rollout.n)
    return {**metrics, **reward_metrics, **accuracy}


def pre_update_entropy(entropy: torch.Tensor, response_mask: torch.Tensor, cfg) -> float:
    """verl's ``actor/entropy``: the old-log-prob pass's entropy ``[B, T]`` aggregated over the batch as the actor's
    loss is (``loss_agg_mode``; seq-mean-token-sum-norm divides by loss_scale_factor or max_response_length)."""
    actor = cfg.actor_rollout_ref.actor
    return agg_loss(loss_mat=entropy, loss_mask=response_mask, loss_agg_mode=actor.loss_agg_mode,
                    max_response_length=seq_norm_length(actor.loss_scale_factor, cfg.data.max_response_length)).item()


class PPOUpdate:
    """Log-probs, rewards and advantages, then the critic and actor updates, on one rollout."""

    def __init__(self, run: Run, *, behaviour_as_old: bool = False):
        self.run, self.cfg, self.w = run, run.cfg, run.workers
        self.device, self.tokenizer = run.device, run.tokenizer
        self.rollout_cfg = run.cfg.actor_rollout_ref.rollout
        self.kl_ctrl = kl_controller(run.cfg.algorithm.kl_ctrl)
        self.behaviour_as_old = behaviour_as_old
        self.whole_groups = policy_loss_spec(run.cfg.actor_rollout_ref.actor.policy_loss.loss_mode).whole_groups

    def train(self, rollout: Rollout, *, step: int, timer: Timer, metrics: dict) -> tuple[Batch, bool]:
        """Everything after the rollout: log-probs, advantages, updates; returns the batch as trained (PF-PPO may
        resample it) and whether the actor was updated (not during ``critic_warmup``)."""
        batch = rollout.batch
        temperature = self.rollout_cfg.temperature
        if self.cfg.trainer.balance_batch:
            metrics.update(balance_over_shards(batch, group=self.w.actor, whole_groups=self.whole_groups))
        with timer("old_log_prob"):
            metrics.update(self.old_log_probs(batch, temperature=temperature))
        if self.w.reference is not None:
            with timer("ref"):
                batch["ref_log_probs"] = self.w.reference.compute_ref_log_prob(batch, temperature=temperature)
        if self.w.teacher is not None:
            with timer("teacher"):
                self.teacher_scores(batch)
        if self.w.critic is not None:
            with timer("values"):
                batch["values"] = self.w.critic.compute_values(batch)
        if self.w.implicit_prm is not None:
            with timer("prm"):
                metrics.update(prm_stage(self.w.implicit_prm, batch, cfg=self.cfg,
                                                        temperature=temperature, step=step))
        with timer("adv"):
            metrics.update(self.compute_rewards_and_advantages(batch))
        if self.cfg.trainer.rollout_data_dir:
            with timer("dump_rollout_generations"):
                dump_generations(self.cfg.trainer.rollout_data_dir, step, **batch_samples(batch, self.tokenizer))
        if self.cfg.algorithm.use_pf_ppo:
            batch = self.pf_ppo_resample(batch, step=step)
        if self.w.critic is not None:
            with timer("update_critic"):
                metrics.update(self.w.critic.update_critic(batch, step=step))
        updated = step > self.cfg.trainer.critic_warmup
        if updated:
            with timer("update_actor"):
                metrics.update(self.w.actor.update_policy(batch, temperature=temperature, step=step))
        return batch, updated

    def step_metrics(self, batch: Batch) -> dict[str, float]:
        return {**data_metrics(batch, max_response_length=self.cfg.data.max_response_length,
                               use_critic=self.w.critic is not None), **agent_metrics(batch)}

    def state_dict(self) -> dict[str, Any]:
        return {"kl_coef": self.kl_ctrl.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.kl_ctrl.value = state.get("kl_coef", self.kl_ctrl.value)

    def old_log_probs(self, batch: Batch, *, temperature: float) -> dict[str, float]:
        """batch["old_log_probs"]: recomputed by the actor (and compared with the engine's), or the
        engine's own when ``actor.use_rollout_log_probs``, ``rollout_correction.bypass_mode`` or
        ``behaviour_as_old`` (one forward pass fewer per step)."""
        if (self.behaviour_as_old or self.cfg.actor_rollout_ref.actor.use_rollout_log_probs
                or self.cfg.algorithm.rollout_correction.bypass_mode):
            batch["old_log_probs"] = batch["rollout_log_probs"]
            return {}
        batch["old_log_probs"], entropy, *sum_pi_squared = self.w.actor.compute_log_prob(batch, temperature=temperature)
        if sum_pi_squared:
            batch["sum_pi_squared"] = sum_pi_squared[0]
        return {"actor/entropy": pre_update_entropy(entropy, batch["response_mask"], self.cfg),
                **rollout_mismatch_metrics(rollout_log_probs=batch["rollout_log_probs"],
                                           old_log_probs=batch["old_log_probs"], mask=batch["response_mask"])}

    def teacher_scores(self, batch: Batch) -> None:
        """The teachers' log-probs of the rollout into the batch: ``teacher_log_probs [B, T]``, or with a top-k
        loss ``teacher_topk_log_probs`` / ``teacher_topk_ids [B, T, K]`` (``hybridflow.workers.teacher``)."""
        scores = self.w.teacher.compute_teacher_log_prob(batch)
        if len(scores) == 1:
            batch["teacher_log_probs"] = scores[0]
        else:
            batch["teacher_topk_log_probs"], batch["teacher_topk_ids"] = scores

    def compute_rewards_and_advantages(self, batch: Batch) -> dict[str, float]:
        """token_level_rewards (with the KL penalty if configured), then advantages and returns."""
        algo, metrics = self.cfg.algorithm, {}
        if algo.use_kl_in_reward:
            batch["token_level_rewards"], current_kl = apply_kl_penalty(
                token_level_scores=batch["token_level_scores"], old_log_prob=batch["old_log_probs"],
                ref_log_prob=batch["ref_log_probs"], response_mask=batch["response_mask"],
                kl_coef=self.kl_ctrl.value, kl_penalty_type=algo.kl_penalty)
            metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": self.kl_ctrl.value}
            self.kl_ctrl.update(current_kl=current_kl, n_steps=len(batch))
        else:
            batch["token_level_rewards"] = batch["token_level_scores"]
        recomputed = not (self.cfg.actor_rollout_ref.actor.use_rollout_log_probs or algo.rollout_correction.bypass_mode)
        if recomputed and "rollout_log_probs" in batch:
            metrics.update(self.correct_rollout_mismatch(batch))
        optional = {key: batch[key] if key in batch else None
                    for key in ("values", "reward_baselines", "old_log_probs", "sum_pi_squared", "rollout_is_weights",
                                "prm_rewards")}
        try:  # an estimator's own inputs and knobs come from its spec (algos/registry.py: AdvantageSpec)
            own = advantage_spec(algo.adv_estimator).arguments(batch, functools.partial(config_value, self.cfg))
            batch["advantages"], batch["returns"] = get_advantage(algo.adv_estimator)(
                token_level_rewards=batch["token_level_rewards"], response_mask=batch["response_mask"],
                index=np.asarray(batch["uid"]), gamma=algo.gamma, lam=algo.lam,
                norm_adv_by_std_in_grpo=algo.norm_adv_by_std_in_grpo, **optional, **own)
        except AlgorithmError as err:  # inputs the run cannot give it (a reward key the function never returns)
            raise HybridflowError(str(err)) from err
        return metrics

    def correct_rollout_mismatch(self, batch: Batch) -> dict[str, float]:
        """Decoupled rollout correction (verl's ``algorithm.rollout_correction``): IS weights pi_old / pi_rollout
        into batch["rollout_is_weights"] and rejected tokens out of batch["response_mask"]; rollout_corr/* metrics."""
        corr = self.cfg.algorithm.rollout_correction
        weights, batch["response_mask"], metrics = rollout_correction(
            train_log_prob=batch["old_log_probs"], rollout_log_prob=batch["rollout_log_probs"],
            response_mask=batch["response_mask"], rollout_is=corr.rollout_is,
            rollout_is_threshold=corr.rollout_is_threshold, rollout_is_batch_normalize=corr.rollout_is_batch_normalize,
            rollout_rs=corr.rollout_rs, rollout_rs_threshold=corr.rollout_rs_threshold)
        if weights is not None:
            batch["rollout_is_weights"] = weights
        return metrics

    def pf_ppo_resample(self, batch: Batch, *, step: int) -> Batch:
        """PF-PPO (arXiv 2409.06957): the batch resampled with replacement by reward weight, seeded per step."""
        pf = self.cfg.algorithm.pf_ppo
        generator = torch.Generator().manual_seed(int(np.random.SeedSequence([self.cfg.trainer.seed, step])
                                                      .generate_state(1)[0]))
        # the seeded generator is a CPU one, so the [B] scores go to the CPU (a CUDA tensor would refuse it)
        scores = batch["token_level_scores"].sum(dim=-1).cpu()
        rows = pf_ppo_resample(scores=scores, reweight_method=pf.reweight_method, weight_pow=pf.weight_pow,
                               generator=generator)
        return batch.index_select(rows.tolist())
