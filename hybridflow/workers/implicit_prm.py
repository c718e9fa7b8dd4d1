"""PRIME's implicit process reward model (Cui et al. 2025, arXiv 2502.01456): a causal LM ``pi_phi`` that starts as
the policy and learns from the outcome labels with the cross-entropy loss of ``hybridflow.algos.prime``.

Its dense rewards ``beta * log(pi_phi / pi_ref)`` use the policy's frozen reference, whose log-probs
(``batch["ref_log_probs"]``) the reference worker already computed; this worker only holds ``pi_phi``.
One ``update_prm`` call is one training step (verl-recipe's ``prime_dp_rm.update_rm``)::

    for epoch in range(1):
        for mini_batch in split(batch, reward_model.mini_batch_size * rollout.n / dp_size):
            for micro_batch in split(mini_batch, reward_model.micro_batch_size_per_gpu):
                L_CE(sigma(beta * sum_t (log pi_phi - log pi_ref)), outcome label) x rows / mini-batch rows
            clip grad norm (optim.grad_clip); optimizer.step()
    lr_scheduler.step()
"""

from __future__ import annotations

import functools
from collections import defaultdict

import torch

from hybridflow.algos.prime import implicit_prm_ce_loss
from hybridflow.data.batch import Batch
from hybridflow.data.parallel import DataParallel, LOCAL
from hybridflow.workers.logprob import batch_log_probs, micro_batch_log_probs
from hybridflow.workers.micro_batches import LogProbBatching
from hybridflow.workers.optim import TrainState
from hybridflow.workers.ppo_update import UpdateSchedule, averaged, optimizer_step, ppo_mini_batches


class ImplicitPRMWorker:
    """PRM model + optimizer + schedule: its response log-probs, and its CE update on the outcome labels."""

    def __init__(self, *, state: TrainState, schedule: UpdateSchedule, beta: float,
                 forward: LogProbBatching = LogProbBatching(), dp: DataParallel = LOCAL, seed: int = 0,
                 layout: str = "padded"):
        self.state = state
        self.model = state.model
        self.schedule = schedule
        self.beta = beta
        self.forward = forward
        self.dp = dp
        self.seed = seed
        self.layout = layout

    def compute_prm_log_probs(self, batch: Batch, *, temperature: float) -> torch.Tensor:
        """``log pi_phi`` ``[B, T]`` of the responses (no gradients), at the reference's temperature."""
        log_probs, _ = batch_log_probs(self.model, batch, temperature=temperature,
                                       micro_batch_size=self.forward.micro_batch_size,
                                       use_dynamic_bsz=self.forward.use_dynamic_bsz,
                                       max_token_len=self.forward.max_token_len, dp=self.dp, layout=self.layout)
        return log_probs

    def update_prm(self, batch: Batch, *, temperature: float, step: int) -> dict[str, float]:
        """One CE step over mini-batches (needs ref_log_probs, seq_score as the 0/1 label, response_mask)."""
        self.model.train()
        metrics: dict[str, list[float]] = defaultdict(list)
        for counts, micros in ppo_mini_batches(batch, schedule=self.schedule, dp=self.dp, seed=self.seed, step=step):
            loss_fn = functools.partial(self._micro_loss, temperature=temperature, counts=counts)
            optimizer_step(state=self.state, dp=self.dp, micros=micros, loss_fn=loss_fn, metrics=metrics,
                           loss_key="dpo_loss")
        self.state.scheduler.step()
        out = averaged(metrics, prefix="reward_model/")
        out["rm/lr"] = self.state.lr
        return out

    def _micro_loss(self, micro: Batch, *, temperature: float, counts: dict[str, float]):
        log_probs, _ = micro_batch_log_probs(self.model, micro, temperature=temperature, calculate_entropy=False,
                                             layout=self.layout)
        mean_loss = implicit_prm_ce_loss(log_ratios=log_probs - micro["ref_log_probs"],
                                         response_mask=micro["response_mask"], outcome=micro["seq_score"],
                                         beta=self.beta)
        loss = mean_loss * (len(micro) / counts["seqs"])  # the micro-batch's share of the mini-batch mean
        return loss, {"dpo_loss": loss.item()}, {}
