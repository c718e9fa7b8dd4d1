"""The generate-and-score stage every rollout source and the validation run: sampling seeds, the rollout,
ReMax's greedy baseline, the reward, over-sampling's aborted tail."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch

from hybridflow.algos import advantage_spec
from hybridflow.algos.over_sample import first_finished
from hybridflow.data.batch import Batch
from hybridflow.rollout import SamplingParams, sampling_params_from_rollout_config
from hybridflow.trainer.loop.parts import Run
from hybridflow.trainer.tracking.metrics import Timer


def prompts_to_batch(collated: dict[str, Any]) -> Batch:
    """The dataloader's dict (tensors + per-sample lists) as a Batch."""
    tensors = {k: v for k, v in collated.items() if isinstance(v, torch.Tensor)}
    non_tensors = {k: v for k, v in collated.items() if not isinstance(v, torch.Tensor)}
    return Batch.from_dict(tensors=tensors, non_tensors=non_tensors)


class PromptStream:
    """Prompt batches across epochs; the loader's position is what a checkpoint records (``dataloader``)."""

    def __init__(self, loader):
        self.loader = loader
        self._batches: Iterator[Batch] | None = None

    def __next__(self) -> Batch:
        if self._batches is None:  # started at the first batch: after a resume has restored the loader
            self._batches = self._epochs()
        return next(self._batches)

    def _epochs(self) -> Iterator[Batch]:
        while True:
            for collated in self.loader:
                yield prompts_to_batch(collated)

    def state_dict(self) -> dict[str, Any]:
        return {"dataloader": self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state["dataloader"])


class Generation:
    """Generate n responses per prompt and score them, seeded by (rollout.seed, step, attempt).

    ``partial``: a weight sync may pause the generate and its sequences continue with the new weights
    (the asynchronous source's partial rollouts)."""

    def __init__(self, run: Run, *, partial: bool = False):
        self.run, self.partial = run, partial
        self.w, self.rollout_cfg = run.workers, run.cfg.actor_rollout_ref.rollout

    def sampling_params(self, *, step: int, validate: bool, attempt: int = 0) -> SamplingParams:
        """Training or validation sampling, seeded by (seed, step, attempt) so resumed runs sample identically."""
        seed = int(np.random.SeedSequence([self.rollout_cfg.seed, step, attempt, int(validate)]).generate_state(1)[0])
        return sampling_params_from_rollout_config(self.rollout_cfg, validate=validate,
                                                   eos_token_id=self.run.stop_token_ids, seed=seed, logprobs=True)

    def rollout_and_score(self, prompts: Batch, *, step: int, timer: Timer, metrics: dict, attempt: int = 0) -> Batch:
        """Generate n responses per prompt, then score them (token_level_scores [B, T])."""
        device = self.run.device
        with timer("gen"):
            params = self.sampling_params(step=step, validate=False, attempt=attempt)
            batch = self.w.rollout.generate(prompts, params, **({"partial": True} if self.partial else {}))
            batch = batch.to(device)
        if advantage_spec(self.run.cfg.algorithm.adv_estimator).needs_greedy_baseline:
            with timer("gen_max"):
                batch["reward_baselines"] = self.greedy_baseline(prompts, step=step)
        with timer("reward"):
            batch["token_level_scores"], scores, reward_metrics, extras = self.w.reward.compute_scores(batch)
            batch["seq_score"] = scores.to(device)
            for key, values in extras.items():
                if key != "response_text":
                    batch[f"reward_extra/{key}"] = torch.tensor(values, dtype=torch.float32, device=device)
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

    def greedy_baseline(self, prompts: Batch, *, step: int) -> torch.Tensor:
        """ReMax's baseline (arXiv 2310.10505): the reward of the greedy response, repeated n times."""
        params = self.sampling_params(step=step, validate=False)
        greedy = SamplingParams(n=1, temperature=0.0, max_tokens=params.max_tokens,
                                stop_token_ids=params.stop_token_ids, logprobs=False,
                                repetition_penalty=params.repetition_penalty)  # the same policy, decoded greedily
        baseline_batch = self.w.rollout.generate(prompts, greedy)
        _, scores, _, _ = self.w.reward.compute_scores(baseline_batch)
        return scores.repeat_interleave(self.rollout_cfg.n).to(self.run.device)

    def generate_padded(self, prompts: Batch, params: SamplingParams) -> Batch:
        """Generate for any number of prompts: the validation set need not divide by the rollout group's
        data-parallel size, so copies of the last prompt fill the last shard and their samples are dropped."""
        count, shards = len(prompts), self.w.rollout.data_parallel_size
        padding = -count % shards
        if padding:
            prompts = Batch.concat([prompts, prompts.index_select([count - 1] * padding)])
        batch = self.w.rollout.generate(prompts, params)
        return batch.index_select(list(range(count * params.n))) if padding else batch
