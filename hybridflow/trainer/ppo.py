"""The PPO / GRPO training loop: one file, read top to bottom.

Dataflow of one step (the HybridFlow paper's Fig. 1, verl's ``RayPPOTrainer.fit``)::

    prompts ──► rollout.generate (n responses per prompt, engine log-probs; with multi_turn.enable each
                sample is a conversation run by its agent loop: tool/user tokens masked out of the loss)
            ──► reward.compute_scores (rule / custom function; score on the last response token)
            ──► actor.compute_log_prob (old log-probs, entropy)
            ──► reference.compute_ref_log_prob           (if a KL term is used)
            ──► critic.compute_values                    (gae only)
            ──► implicit_prm.update_prm, compute_prm_log_probs -> dense rewards   (prime only)
            ──► KL penalty in the reward (use_kl_in_reward)
            ──► rollout correction (IS weights / rejection, pi_old vs the engine's pi_rollout)
            ──► advantage estimator (registry) ──► PF-PPO resampling (use_pf_ppo)
            ──► critic.update_critic                     (gae only)
            ──► actor.update_policy                      (after critic_warmup steps)
            ──► rollout.sync_rollout_weights()          (actor -> engine in memory: no disk round trip)
            ──► metrics ──► tracking;  validation every test_freq;  checkpoint every save_freq

Deviations from verl, on purpose:
- Responses are padded to the longest response of the step, not to max_response_length
  (same results, less compute on CPU); ``response_length/clip_ratio`` still compares with
  max_response_length.
- Rollout sampling is seeded from (rollout.seed, step), so a resumed run samples exactly
  what an uninterrupted one would.
- The workers are plain objects called in-process; the Ray controller wraps the same
  methods in worker groups (hybridflow.controller).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from hybridflow.algos import (AdaptiveKLController, FixedKLController, advantage_spec, apply_kl_penalty, get_advantage,
                             masked_mean)
from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.over_sample import first_finished
from hybridflow.algos.pf_ppo import pf_ppo_resample
from hybridflow.algos.rollout_correction import rollout_correction
from hybridflow.data.balance import balance_batch
from hybridflow.config import config_value
from hybridflow.data.batch import Batch
from hybridflow.errors import CheckpointError, HybridflowError, WorkerDiedError
from hybridflow.rollout import SamplingParams, sampling_params_from_rollout_config
from hybridflow.trainer.best_checkpoint import BestCheckpoint, BestRecord, read_best_record, write_best_record
from hybridflow.trainer.checkpoint import find_resume_checkpoint, load_checkpoint, save_checkpoint
from hybridflow.trainer.generations import batch_samples, dump_generations, pick_generations
from hybridflow.trainer.prime_role import implicit_process_rewards
from hybridflow.trainer.metrics import (
    Timer,
    agent_metrics,
    data_metrics,
    memory_metrics,
    rollout_mismatch_metrics,
    throughput_metrics,
)
from hybridflow.workers.actor import ActorWorker
from hybridflow.workers.critic import CriticWorker
from hybridflow.workers.implicit_prm import ImplicitPRMWorker
from hybridflow.workers.reference import ReferenceWorker
from hybridflow.workers.reward import RewardWorker
from hybridflow.workers.rollout import RolloutWorker

logger = logging.getLogger(__name__)


@dataclass
class PPOWorkers:
    """The roles one PPO step drives: worker groups (``hybridflow.controller``) or plain workers,
    anything with the methods of the ``hybridflow.workers`` classes named in the annotations.
    With the hybrid engine, ``actor``, ``rollout`` and ``reference`` are the same group."""

    actor: "ActorWorker"
    rollout: "RolloutWorker"
    reward: RewardWorker
    reference: "ReferenceWorker | None" = None
    critic: "CriticWorker | None" = None
    implicit_prm: "ImplicitPRMWorker | None" = None
    """PRIME's implicit process reward model (``adv_estimator=prime``)."""


def build_kl_controller(kl_ctrl_cfg):
    """Fixed or adaptive (Ziegler et al. 2019) coefficient of the in-reward KL penalty."""
    if kl_ctrl_cfg.type == "adaptive":
        return AdaptiveKLController(init_kl_coef=kl_ctrl_cfg.kl_coef, target_kl=kl_ctrl_cfg.target_kl,
                                    horizon=kl_ctrl_cfg.horizon)
    return FixedKLController(kl_coef=kl_ctrl_cfg.kl_coef)


def prompts_to_batch(collated: dict[str, Any]) -> Batch:
    """The dataloader's dict (tensors + per-sample lists) as a Batch."""
    tensors = {k: v for k, v in collated.items() if isinstance(v, torch.Tensor)}
    non_tensors = {k: v for k, v in collated.items() if not isinstance(v, torch.Tensor)}
    return Batch.from_dict(tensors=tensors, non_tensors=non_tensors)


def balance_over_shards(batch: Batch, *, group) -> dict[str, float]:
    """Reorder ``batch`` so each data shard of the actor ``group`` gets an equal token count (verl's
    ``balance_batch``). Shards, not ranks: the ranks of a sequence-parallel group share one shard, and
    balancing for the rank count would move the rows of a dp = 1 run into other mini-batches than sp = 1
    trains on. A plain worker (no group) is one shard: nothing to balance."""
    dp_size = getattr(group, "data_parallel_size", 1)
    return balance_batch(batch, dp_size=dp_size) if dp_size > 1 else {}


class PPOTrainer:
    """Drives the workers through ``total_steps`` PPO steps, validating and checkpointing."""

    def __init__(self, *, cfg, workers: PPOWorkers, train_loader, val_loader, tracking, tokenizer,
                 total_steps: int, device: torch.device, checkpoint_components: dict[str, Any],
                 stop_token_ids: list[int]):
        self.cfg = cfg
        self.w = workers
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.tracking = tracking
        self.tokenizer = tokenizer
        self.total_steps = total_steps
        self.device = device
        self.rollout_cfg = cfg.actor_rollout_ref.rollout
        self.kl_ctrl = build_kl_controller(cfg.algorithm.kl_ctrl)
        self.checkpoint_components = checkpoint_components
        self.stop_token_ids = stop_token_ids
        self.global_step = 0
        self.resumed_from = 0  # the step fit() resumed from
        self.best = BestCheckpoint.from_trainer_config(cfg.trainer)

    # ================================================================== the loop
    def fit(self) -> dict[str, float]:
        """Train to ``total_steps``; returns the last step's metrics (with the last validation)."""
        self.global_step = self.resumed_from = self.load_checkpoint()
        if self.global_step > 0:
            self.tracking.resume_at(self.global_step)
        last: dict[str, float] = {}
        if self.val_loader is not None and self.cfg.trainer.val_before_train and self.global_step == 0:
            last = self.validate()
            self.best.observe(last, step=0)  # the model before training is the score to beat
            self.tracking.log(last, step=0)
            if self.cfg.trainer.val_only:
                return last
        batches = self.prompt_batches()
        with self.tracking.progress(self.total_steps, initial_step=self.global_step):
            while self.global_step < self.total_steps:
                self.global_step += 1
                metrics = self.train_step_naming_failures(batches)
                validation, keep_as_best = self._maybe_validate()
                metrics.update(validation)
                # logged before the checkpoint: a run killed once the checkpoint is published has this step's row
                self.tracking.log(metrics, step=self.global_step)
                self._maybe_save(keep_as_best=keep_as_best)
                last = metrics
                if self.best.should_stop():
                    logger.warning("early stop at step %d: %d validations without a new best (%s)",
                                   self.global_step, self.best.patience, self.best.describe())
                    break
        return last

    def train_step_naming_failures(self, batches: Iterator[Batch]) -> dict[str, float]:
        """``train_step``; a worker process that dies is reported with the step and how to resume."""
        try:
            return self.train_step(batches, step=self.global_step)
        except WorkerDiedError as err:
            raise WorkerDiedError(
                f"training step {self.global_step}: {err}; rerun the same command to resume from the last "
                f"checkpoint in {self.cfg.trainer.default_local_dir} (trainer.save_freq={self.cfg.trainer.save_freq})"
            ) from err

    def prompt_batches(self) -> Iterator[Batch]:
        """Prompt batches across epochs (the loader's position is what a checkpoint records)."""
        while True:
            for collated in self.train_loader:
                yield prompts_to_batch(collated)

    def train_step(self, batches: Iterator[Batch], *, step: int) -> dict[str, float]:
        """One PPO step on the next batch of prompts; returns its metrics."""
        timer, metrics = Timer(), {}
        with timer("step"):
            batch = self.rollout_and_score(next(batches), step=step, timer=timer, metrics=metrics)
            if self.cfg.algorithm.filter_groups.enable:
                batch = self.keep_informative_groups(batch, batches, step=step, timer=timer, metrics=metrics)
            batch = self.train_on_batch(batch, step=step, timer=timer, metrics=metrics)
        return self.finish_step_metrics(metrics, batch=batch, timer=timer, step=step)

    def train_on_batch(self, batch: Batch, *, step: int, timer: Timer, metrics: dict) -> Batch:
        """Everything after the rollout: log-probs, advantages, updates and the weight sync (shared with
        the async trainers); returns the batch as trained (PF-PPO may resample it)."""
        temperature = self.rollout_cfg.temperature
        if self.cfg.trainer.balance_batch:
            metrics.update(balance_over_shards(batch, group=self.w.actor))
        with timer("old_log_prob"):
            metrics.update(self.old_log_probs(batch, temperature=temperature))
        if self.w.reference is not None:
            with timer("ref"):
                batch["ref_log_probs"] = self.w.reference.compute_ref_log_prob(batch, temperature=temperature)
        if self.w.critic is not None:
            with timer("values"):
                batch["values"] = self.w.critic.compute_values(batch)
        if self.w.implicit_prm is not None:
            with timer("prm"):
                metrics.update(implicit_process_rewards(self.w.implicit_prm, batch, cfg=self.cfg,
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
        if step > self.cfg.trainer.critic_warmup:
            with timer("update_actor"):
                metrics.update(self.w.actor.update_policy(batch, temperature=temperature, step=step))
            with timer("sync_weights"):
                self.sync_rollout_weights(step=step)
        return batch

    def sync_rollout_weights(self, *, step: int) -> None:
        """Copy the actor's weights into the rollout engine (the async trainers override when)."""
        self.push_weights_to_rollout()

    def push_weights_to_rollout(self, *, version: int | None = None) -> None:
        """Actor -> engine: in memory inside every rank of the hybrid engine, or, with the rollout in a pool of
        its own (split placement), gathered on the training ranks and read by every rollout rank from training
        rank 0's object in Ray's store (the driver passes only its reference).
        ``version`` (the async trainers' weight version) tags the tokens the engine samples with them."""
        if self.w.rollout is self.w.actor:
            self.w.actor.sync_rollout_weights(version)
        else:
            self.w.rollout.load_weights(self.w.actor.call_by_reference("rollout_weights"), version)

    def finish_step_metrics(self, metrics: dict, *, batch: Batch, timer: Timer, step: int) -> dict[str, float]:
        metrics.update(data_metrics(batch, max_response_length=self.cfg.data.max_response_length,
                                    use_critic=self.w.critic is not None))
        metrics.update(agent_metrics(batch))
        return self.step_metrics(metrics, batch=batch, timer=timer, step=step)

    def step_metrics(self, metrics: dict[str, float], *, batch: Batch, timer: Timer, step: int) -> dict[str, float]:
        """``metrics`` plus the timing, throughput, memory and progress ones every trainer reports."""
        metrics.update(timer.metrics())
        metrics.update(throughput_metrics(batch=batch, step_seconds=timer.timings["step"],
                                          num_workers=self.w.actor.world_size))
        metrics.update(memory_metrics())
        metrics["training/global_step"] = step
        metrics["training/epoch"] = self.train_loader.epoch
        return metrics

    # ================================================================== stages
    def rollout_and_score(self, prompts: Batch, *, step: int, timer: Timer, metrics: dict, attempt: int = 0) -> Batch:
        """Generate n responses per prompt, then score them (token_level_scores [B, T])."""
        with timer("gen"):
            batch = self.generate(prompts, self.sampling_params(step=step, validate=False, attempt=attempt))
            batch = batch.to(self.device)
        if advantage_spec(self.cfg.algorithm.adv_estimator).needs_greedy_baseline:
            with timer("gen_max"):
                batch["reward_baselines"] = self.greedy_baseline(prompts, step=step)
        with timer("reward"):
            batch["token_level_scores"], scores, reward_metrics, extras = self.w.reward.compute_scores(batch)
            batch["seq_score"] = scores.to(self.device)
            for key, values in extras.items():
                if key != "response_text":
                    batch[f"reward_extra/{key}"] = torch.tensor(values, dtype=torch.float32, device=self.device)
            metrics.update(reward_metrics)
        if self.rollout_cfg.over_sample_rate > 0:
            metrics.update(self.abort_late_samples(batch))
        return batch

    def abort_late_samples(self, batch: Batch) -> dict[str, float]:
        """rollout.over_sample_rate: the samples that would still be running when the first (1 - rate) of the batch
        finished are aborted; their tokens carry no loss (response_mask zeroed after scoring)."""
        keep = first_finished(response_lengths=batch["response_mask"].sum(-1),
                              over_sample_rate=self.rollout_cfg.over_sample_rate)
        batch["response_mask"] = batch["response_mask"] * keep[:, None].to(batch["response_mask"].dtype)
        return {"rollout/aborted_share": 1.0 - keep.float().mean().item()}

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """The training rollout (the async trainer's partial rollouts hand the engine over to weight syncs)."""
        return self.w.rollout.generate(prompts, params)

    def keep_informative_groups(self, batch: Batch, batches: Iterator[Batch], *, step: int, timer: Timer,
                                metrics: dict) -> Batch:
        """DAPO dynamic sampling (arXiv 2503.14476, Sec. 3.2): drop groups whose responses all get the same
        ``filter_groups.metric``, and sample more prompt batches until ``train_batch_size`` groups remain."""
        fg, n, wanted = self.cfg.algorithm.filter_groups, self.rollout_cfg.n, self.cfg.data.train_batch_size
        kept, num_groups, groups_seen, gen_batches = [], 0, 0, 1
        while True:
            informative = informative_rows(batch, metric=fg.metric, n=n)
            kept.append(batch.index_select(informative))
            num_groups += len(informative) // n
            groups_seen += len(batch) // n
            if num_groups >= wanted:
                break
            if 0 < fg.max_num_gen_batches <= gen_batches:
                raise HybridflowError(
                    f"algorithm.filter_groups: only {num_groups} of {wanted} prompt groups had varied "
                    f"{fg.metric} after {gen_batches} generation batches; raise max_num_gen_batches (0 = no limit)"
                    " or check the reward")
            batch = self.rollout_and_score(next(batches), step=step, timer=timer, metrics={}, attempt=gen_batches)
            gen_batches += 1
        metrics.update({"train/num_gen_batches": gen_batches, "train/num_informative_groups": num_groups})
        warn_if_filtering_is_costly(gen_batches=gen_batches, step=step, informative=num_groups, seen=groups_seen,
                                    metric=fg.metric)
        return Batch.concat(kept).index_select(list(range(wanted * n)))

    def old_log_probs(self, batch: Batch, *, temperature: float) -> dict[str, float]:
        """batch["old_log_probs"]: recomputed by the actor (and compared with the engine's), or the
        engine's own when ``actor.use_rollout_log_probs`` or ``rollout_correction.bypass_mode`` (one
        forward pass fewer per step)."""
        if self.cfg.actor_rollout_ref.actor.use_rollout_log_probs or self.cfg.algorithm.rollout_correction.bypass_mode:
            batch["old_log_probs"] = batch["rollout_log_probs"]
            return {}
        batch["old_log_probs"], entropy, *sum_pi_squared = self.w.actor.compute_log_prob(batch, temperature=temperature)
        if sum_pi_squared:
            batch["sum_pi_squared"] = sum_pi_squared[0]
        return {"actor/entropy": masked_mean(values=entropy, mask=batch["response_mask"]).item(),
                **rollout_mismatch_metrics(rollout_log_probs=batch["rollout_log_probs"],
                                           old_log_probs=batch["old_log_probs"], mask=batch["response_mask"])}

    def sampling_params(self, *, step: int, validate: bool, attempt: int = 0) -> SamplingParams:
        """Training or validation sampling, seeded by (seed, step, attempt) so resumed runs sample identically."""
        seed = int(np.random.SeedSequence([self.rollout_cfg.seed, step, attempt, int(validate)]).generate_state(1)[0])
        return sampling_params_from_rollout_config(self.rollout_cfg, validate=validate,
                                                   eos_token_id=self.stop_token_ids, seed=seed, logprobs=True)

    def greedy_baseline(self, prompts: Batch, *, step: int) -> torch.Tensor:
        """ReMax's baseline (arXiv 2310.10505): the reward of the greedy response, repeated n times."""
        params = self.sampling_params(step=step, validate=False)
        greedy = SamplingParams(n=1, temperature=0.0, max_tokens=params.max_tokens,
                                stop_token_ids=params.stop_token_ids, logprobs=False)
        baseline_batch = self.w.rollout.generate(prompts, greedy)
        _, scores, _, _ = self.w.reward.compute_scores(baseline_batch)
        return scores.repeat_interleave(self.rollout_cfg.n).to(self.device)

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

    # ================================================================== validation
    def generate_padded(self, prompts: Batch, params: SamplingParams) -> Batch:
        """Generate for any number of prompts: the validation set need not divide by the rollout group's
        data-parallel size, so copies of the last prompt fill the last shard and their samples are dropped."""
        count, shards = len(prompts), self.w.rollout.data_parallel_size
        padding = -count % shards
        if padding:
            prompts = Batch.concat([prompts, prompts.index_select([count - 1] * padding)])
        batch = self.w.rollout.generate(prompts, params)
        return batch.index_select(list(range(count * params.n))) if padding else batch

    def validate(self) -> dict[str, float]:
        """Generate on the validation set with ``val_kwargs``; reward mean@n per data source. The samples
        go to ``trainer.validation_data_dir`` and (``trainer.log_val_generations`` of them) to the trackers."""
        n, trainer = self.rollout_cfg.val_kwargs.n, self.cfg.trainer
        sources, lengths, tool_uses = [], [], []
        samples: dict[str, Any] = {"inputs": [], "outputs": [], "gts": [], "scores": [], "extras": {}}
        for collated in self.val_loader:
            prompts = prompts_to_batch(collated)
            batch = self.generate_padded(prompts, self.sampling_params(step=self.global_step, validate=True))
            _, batch["seq_score"], _, _ = self.w.reward.compute_scores(batch)
            for key, values in batch_samples(batch, self.tokenizer).items():
                if key != "extras":
                    samples[key].extend(values)
            sources.extend(batch[self.cfg.data.reward_fn_key])
            lengths.extend(batch["response_mask"].sum(-1).tolist())
            if "tool_call_counts" in batch:  # multi-turn: did the conversation call a tool at all
                tool_uses.extend(float(count > 0) for count in batch["tool_call_counts"])
        if trainer.validation_data_dir:
            dump_generations(trainer.validation_data_dir, self.global_step, **samples)
        if trainer.log_val_generations > 0:
            self.tracking.log_generations(pick_generations(samples["inputs"], samples["outputs"], samples["scores"],
                                                           trainer.log_val_generations), step=self.global_step)
        metrics = validation_metrics(scores=samples["scores"], sources=sources, lengths=lengths, n=n)
        if tool_uses:
            metrics[f"val-aux/tool_call_share@{n}"] = float(np.mean(tool_uses))
        return metrics

    def validation_every(self) -> int:
        """Steps between validations (trainer.test_freq)."""
        return self.cfg.trainer.test_freq

    def _maybe_validate(self) -> tuple[dict[str, float], bool]:
        """(validation metrics, whether this step is a new best to keep) on validation steps, else ({}, False)."""
        trainer, step = self.cfg.trainer, self.global_step
        test_freq = self.validation_every()
        due = test_freq > 0 and (step % test_freq == 0 or step >= self.total_steps)
        if self.val_loader is None or not due:
            return {}, False
        metrics = self.validate()
        return metrics, self.best.observe(metrics, step=step) and trainer.keep_best_checkpoint

    def _maybe_save(self, *, keep_as_best: bool) -> None:
        trainer, step = self.cfg.trainer, self.global_step
        last = step >= self.total_steps or self.best.should_stop()
        if keep_as_best or (trainer.save_freq > 0 and (step % trainer.save_freq == 0 or last)):
            path = self.save_checkpoint()
            if keep_as_best and path is not None:
                write_best_record(trainer.default_local_dir, BestRecord(
                    step=step, metric=self.best.metric_name, value=self.best.best_value, path=path))

    # ================================================================== checkpoints
    def save_checkpoint(self) -> str | None:
        """Save this step; a failed save stops the run unless ``trainer.stop_on_checkpoint_error=false``."""
        extra = self.checkpoint_extra()
        trainer = self.cfg.trainer
        # per role; other components (a self-play reference) follow the actor's limit
        limits = {"actor": trainer.max_actor_ckpt_to_keep, "critic": trainer.max_critic_ckpt_to_keep}
        try:
            return save_checkpoint(trainer.default_local_dir, self.global_step, self.checkpoint_components,
                                   extra=extra, max_to_keep={name: limits.get(name, trainer.max_actor_ckpt_to_keep)
                                                             for name in self.checkpoint_components},
                                   protect=self.protected_checkpoints())
        except CheckpointError as error:
            if trainer.stop_on_checkpoint_error:
                raise
            logger.warning("checkpoint of step %d not saved, training on as asked: %s", self.global_step, error)
            return None

    def checkpoint_extra(self) -> dict[str, Any]:
        """The trainer state beside the weights (``data.pt``): where the prompts continue, the KL
        coefficient, the step and the best-checkpoint record."""
        return {"dataloader": self.train_loader.state_dict(), "kl_coef": self.kl_ctrl.value,
                "global_step": self.global_step, "best": self.best.state_dict()}

    def restore_extra(self, extra: dict[str, Any]) -> None:
        """The inverse of :meth:`checkpoint_extra` on resume."""
        self.train_loader.load_state_dict(extra["dataloader"])
        self.kl_ctrl.value = extra.get("kl_coef", self.kl_ctrl.value)
        self.best.load_state_dict(extra.get("best", {}))

    def protected_checkpoints(self) -> tuple[str, ...]:
        """The best checkpoint (``trainer.keep_best_checkpoint``), which rotation never deletes."""
        record = read_best_record(self.cfg.trainer.default_local_dir) if self.cfg.trainer.keep_best_checkpoint else None
        return (record.path,) if record is not None else ()

    def load_checkpoint(self) -> int:
        """Resume per ``trainer.resume_mode``; returns the step to continue from (0 = fresh)."""
        trainer = self.cfg.trainer
        path = find_resume_checkpoint(trainer.default_local_dir, trainer.resume_mode, trainer.resume_from_path,
                                      components=tuple(self.checkpoint_components))
        if path is None:
            return 0
        step, extra = load_checkpoint(path, self.checkpoint_components)
        self.restore_extra(extra)
        self.push_weights_to_rollout()
        print(f"hybridflow: resumed from {path} at step {step}", flush=True)
        return step

    def close(self) -> None:
        """Stop reward worker processes, flush trackers, release worker groups."""
        self.w.reward.close()
        self.tracking.finish()
        groups = (self.w.actor, self.w.rollout, self.w.critic, self.w.implicit_prm)  # the rollout may have its own pool
        for group in {id(g): g for g in groups if hasattr(g, "shutdown")}.values():
            group.shutdown()


def informative_rows(batch: Batch, *, metric: str, n: int) -> list[int]:
    """Rows of the groups (n consecutive rows) whose ``metric`` is not constant."""
    values = {"score": batch["seq_score"], "seq_reward": batch["token_level_scores"].sum(-1)}.get(metric)
    if values is None:
        values = batch[f"reward_extra/{metric}"]  # a scorer's extra metric, e.g. DAPO's acc
    groups = values.float().reshape(-1, n)
    varied = (groups.max(dim=1).values - groups.min(dim=1).values) > 0
    return [g * n + i for g in varied.nonzero().flatten().tolist() for i in range(n)]


COSTLY_GEN_BATCHES = 4
"""Generation batches in one step past which dynamic sampling warns: each one is a whole rollout."""
_costly_filtering_warned = False


def warn_if_filtering_is_costly(*, gen_batches: int, step: int, informative: int, seen: int, metric: str) -> bool:
    """Warn once per process when a step needed more than ``COSTLY_GEN_BATCHES`` generation batches.
    Nothing else caps the cost (``max_num_gen_batches`` defaults to 0, no limit, as in verl): on a task the
    model almost never (or always) solves, a step takes many rollouts and the run looks stuck."""
    global _costly_filtering_warned
    if gen_batches <= COSTLY_GEN_BATCHES or _costly_filtering_warned:
        return False
    _costly_filtering_warned = True
    logger.warning(
        "dynamic sampling: step %d needed %d generation batches, only %d of %d prompt groups had varied %s; each "
        "batch is a whole rollout. The task may be too hard (or too easy) for the model: try an easier task, an "
        "SFT warm-up or a longer data.max_response_length, and cap the cost with "
        "algorithm.filter_groups.max_num_gen_batches (0 = no limit)", step, gen_batches, informative, seen, metric)
    return True


def validation_metrics(*, scores: list[float], sources: list[str], lengths: list[int], n: int) -> dict[str, float]:
    """``val-core/{data_source}/reward/mean@n`` (verl's name) and response length per source."""
    metrics: dict[str, float] = {}
    sources_arr, scores_arr, lengths_arr = np.asarray(sources), np.asarray(scores, dtype=float), np.asarray(lengths)
    for source in sorted(set(sources)):
        pick = sources_arr == source
        metrics[f"val-core/{source}/reward/mean@{n}"] = float(scores_arr[pick].mean())
        metrics[f"val-aux/{source}/response_length/mean@{n}"] = float(lengths_arr[pick].mean())
        if n > 1:
            best = scores_arr[pick].reshape(-1, n).max(axis=1)
            metrics[f"val-aux/{source}/reward/best@{n}/mean"] = float(best.mean())
    return metrics
