"""Validation: generate on the validation set with ``val_kwargs``, score, report reward mean@n per data source."""

from __future__ import annotations

from typing import Any

import numpy as np

from hybridflow.trainer.tracking.generations import batch_samples, dump_generations, pick_generations
from hybridflow.trainer.loop.generation import Generation, prompts_to_batch


def validate(generation: Generation, *, step: int, tracking) -> dict[str, float]:
    """Generate on the validation set with ``val_kwargs``; reward mean@n per data source. The samples
    go to ``trainer.validation_data_dir`` and (``trainer.log_val_generations`` of them) to the trackers."""
    run = generation.run
    n, trainer = generation.rollout_cfg.val_kwargs.n, run.cfg.trainer
    sources, lengths, tool_uses = [], [], []
    samples: dict[str, Any] = {"inputs": [], "outputs": [], "gts": [], "scores": [], "extras": {}}
    for collated in run.val_loader:
        prompts = prompts_to_batch(collated)
        batch = generation.generate_padded(prompts, generation.sampling_params(step=step, validate=True))
        _, batch["seq_score"], _, _ = run.workers.reward.compute_scores(batch)
        for key, values in batch_samples(batch, run.tokenizer).items():
            if key != "extras":
                samples[key].extend(values)
        sources.extend(batch[run.cfg.data.reward_fn_key])
        lengths.extend(batch["response_mask"].sum(-1).tolist())
        if "tool_call_counts" in batch:  # multi-turn: did the conversation call a tool at all
            tool_uses.extend(float(count > 0) for count in batch["tool_call_counts"])
    if trainer.validation_data_dir:
        dump_generations(trainer.validation_data_dir, step, **samples)
    if trainer.log_val_generations > 0:
        tracking.log_generations(pick_generations(samples["inputs"], samples["outputs"], samples["scores"],
                                                  trainer.log_val_generations), step=step)
    metrics = validation_metrics(scores=samples["scores"], sources=sources, lengths=lengths, n=n)
    if tool_uses:
        metrics[f"val-aux/tool_call_share@{n}"] = float(np.mean(tool_uses))
    return metrics


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
