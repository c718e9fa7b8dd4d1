"""The actor: the trained policy. Log-probs of responses and PPO-style updates.

One ``update_policy`` call is one training step (verl's ``dp_actor.update_policy``):

    for epoch in range(ppo_epochs):
        for mini_batch in split(batch, ppo_mini_batch_size * rollout.n / dp_size):
            for micro_batch in split(mini_batch, ppo_micro_batch_size_per_gpu or token budget):
                loss = policy_loss(...) - entropy_coeff * H + kl_loss_coef * KL(pi || ref)
                backward(loss)            # normalised by the mini-batch's *global* token/seq count
            clip grad norm; skip the step if the loss or the norm is not finite; optimizer.step()
    lr_scheduler.step()

Global counts make the gradient independent of the micro-batch split and of the
data-parallel sharding (the losses in hybridflow.algos take them as arguments).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterator

import torch

from hybridflow.algos import agg_loss, get_policy_loss, kl_penalty, masked_mean
from hybridflow.data.batch import Batch
from hybridflow.models.fsdp import micro_batch_sync
from hybridflow.workers.distributed import DataParallel, LOCAL
from hybridflow.workers.logprob import batch_log_probs, micro_batch_log_probs
from hybridflow.workers.micro_batches import LogProbBatching, micro_batches, mini_batches, per_rank_micro_batch_size
from hybridflow.workers.optim import TrainState

POLICY_LOSS_KNOBS = ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef")


class ActorWorker:
    """Policy model + optimizer + LR schedule, configured by an ``ActorConfig`` section."""

    def __init__(self, *, state: TrainState, cfg, rollout_n: int, max_response_length: int,
                 log_prob: LogProbBatching | None = None, dp: DataParallel = LOCAL, seed: int = 0,
                 layout: str = "padded"):
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

    # ------------------------------------------------------------------ inference
    def compute_log_prob(self, batch: Batch, *, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Old log-probs ``[B, T]`` and entropy ``[B, T]`` of the rollout under the current weights."""
        return batch_log_probs(
            self.model, batch, temperature=temperature, micro_batch_size=self.log_prob.micro_batch_size,
            use_dynamic_bsz=self.log_prob.use_dynamic_bsz, max_token_len=self.log_prob.max_token_len,
            calculate_entropy=True, dp=self.dp, layout=self.layout, use_torch_compile=self.cfg.use_torch_compile,
        )

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (unsharded) weights for the rollout engine, by HF parameter name."""
        yield from self.model.state_dict().items()

    # ------------------------------------------------------------------ training
    def update_policy(self, batch: Batch, *, temperature: float, step: int) -> dict[str, float]:
        """One training step on ``batch`` (needs old_log_probs, advantages, response_mask)."""
        self.model.train()
        metrics: dict[str, list[float]] = defaultdict(list)
        mini_size = self.cfg.ppo_mini_batch_size * self.rollout_n // self.dp.world_size
        for epoch in range(self.cfg.ppo_epochs):
            for mini in mini_batches(batch, mini_size, shuffle=self.cfg.shuffle, seed=self.seed, step=step, epoch=epoch):
                self._optimizer_step(mini, temperature=temperature, metrics=metrics)
        self.state.scheduler.step()
        out = {f"actor/{k}": sum(v) / len(v) for k, v in metrics.items()}
        out["actor/lr"] = self.state.lr
        return out

    def _optimizer_step(self, mini: Batch, *, temperature: float, metrics: dict[str, list[float]]) -> None:
        counts = self.dp.global_counts(mini["response_mask"])
        self.state.zero_grad()
        # Micro-batch losses are shares of the mini-batch loss (global normalisation): sum them.
        sums: dict[str, float] = defaultdict(float)
        micros = micro_batches(mini, micro_batch_size=self.micro_batch_size,
                               use_dynamic_bsz=self.cfg.use_dynamic_bsz,
                               max_token_len=self.cfg.ppo_max_token_len_per_gpu, dp=self.dp)
        for index, micro in enumerate(micros):
            loss, shares, micro_metrics = self._micro_loss(micro, temperature=temperature, counts=counts)
            # FSDP averages gradients over ranks; the losses are already global sums, so undo the mean.
            # Gradients are reduced once, in the last micro-batch's backward.
            with micro_batch_sync(self.model, index=index, count=len(micros)):
                (loss * self.dp.world_size).backward()
            for key, value in shares.items():
                sums[key] += value
            for key, value in micro_metrics.items():
                metrics[key].append(value)
        for key, value in sums.items():
            metrics[key].append(float(self.dp.all_reduce_sum(torch.tensor(value))))
        metrics["grad_norm"].append(self.state.step(loss_value=sums["loss"]))

    def _micro_loss(self, micro: Batch, *, temperature: float, counts: dict[str, float]):
        use_entropy = self.cfg.entropy_coeff != 0
        # Without a recompute pass the entropy metric comes from this forward (detached if unused).
        report_entropy = use_entropy or self.cfg.use_rollout_log_probs
        log_prob, entropy = micro_batch_log_probs(self.model, micro, temperature=temperature,
                                                  calculate_entropy=report_entropy, layout=self.layout,
                                                  entropy_checkpointing=self.cfg.entropy_checkpointing,
                                                  use_torch_compile=self.cfg.use_torch_compile)
        mask = micro["response_mask"]
        agg = dict(loss_mask=mask, loss_agg_mode=self.cfg.loss_agg_mode, max_response_length=self.max_response_length,
                   global_num_tokens=counts["tokens"], global_num_seqs=counts["seqs"])
        pg_loss, metrics = self.policy_loss_fn(
            old_log_prob=micro["old_log_probs"], log_prob=log_prob, advantages=micro["advantages"],
            response_mask=mask, loss_agg_mode=self.cfg.loss_agg_mode, clip_ratio=self.cfg.clip_ratio,
            clip_ratio_low=self.cfg.clip_ratio_low, clip_ratio_high=self.cfg.clip_ratio_high,
            clip_ratio_c=self.cfg.clip_ratio_c, global_num_tokens=counts["tokens"], global_num_seqs=counts["seqs"],
            max_response_length=self.max_response_length,
            **{k: getattr(self.cfg.policy_loss, k) for k in POLICY_LOSS_KNOBS},
        )
        loss = pg_loss
        shares = {"pg_loss": pg_loss.item()}
        if report_entropy:
            metrics["entropy"] = masked_mean(values=entropy.detach(), mask=mask).item()
        if use_entropy:
            loss = loss - self.cfg.entropy_coeff * agg_loss(loss_mat=entropy, **agg)
        if self.cfg.use_kl_loss:
            kld = kl_penalty(logprob=log_prob, ref_logprob=micro["ref_log_prob"], kl_penalty=self.cfg.kl_loss_type)
            kl_term = agg_loss(loss_mat=kld, **agg)
            loss = loss + self.cfg.kl_loss_coef * kl_term
            shares["kl_loss"] = kl_term.item()
            metrics["kl_coef"] = self.cfg.kl_loss_coef
        shares["loss"] = loss.item()
        return loss, shares, metrics
