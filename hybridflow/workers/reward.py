"""The reward worker: decode responses, score them, place each score on its last token.

A thin adapter between the batch record and a reward manager from hybridflow.rewards
(which knows nothing about tensors): it produces ``token_level_scores [B, T]`` and the
reward metrics (failed / timed-out scorer counts, extra per-sample metrics a scorer
returned in its dict).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from hybridflow.data.batch import Batch
from hybridflow.errors import DataError
from hybridflow.rewards import place_scores_on_last_token

logger = logging.getLogger(__name__)
WHERE_TO_LOOK = (
    "check the reward function (custom_reward_function.path, or the built-in scorer of that data_source) and "
    "the rows' reward_model.ground_truth; reward/num_failed counts failures per step"
)


def report_failures(result, *, stop_when_all_fail: bool) -> None:
    """One console line when samples of this step failed to score; an error when all of them did."""
    if not result.num_failed:
        return
    total = len(result.scores)
    first = result.failures[0] if result.failures else "no reason recorded"
    line = f"{result.num_failed} of {total} samples failed to score this step (first: {first})"
    if result.num_failed == total and total and stop_when_all_fail:
        raise DataError(
            f"every sample failed to score: {line}; {WHERE_TO_LOOK}. "
            "Set reward_model.stop_when_all_fail=false to train on failure_score instead"
        )
    logger.warning("reward: %s; they get reward_model.failure_score; %s", line, WHERE_TO_LOOK)


class RewardWorker:
    """Scoring of a generated batch: rule-based / user function through ``manager``, or, when
    ``model_scorer`` is given (``reward_model.enable``), a reward model — which then replaces the
    rule-based score, as in verl."""

    def __init__(
        self, *, manager, tokenizer, reward_fn_key: str = "data_source", model_scorer=None, stop_when_all_fail=True
    ):
        self.manager = manager
        self.stop_when_all_fail = stop_when_all_fail
        self.tokenizer = tokenizer
        self.reward_fn_key = reward_fn_key
        self.model_scorer = model_scorer

    def decode_responses(self, batch: Batch) -> list[str]:
        """Response text without padding or special tokens (what the scorer sees). In a multi-turn
        response the tool / user turns are part of it: its length is the attention over the response."""
        ids = batch["responses"]
        if "attention_mask" in batch:
            lengths = batch["attention_mask"][:, -ids.shape[1]:].sum(-1).tolist()
        else:
            lengths = batch["response_mask"].sum(-1).tolist()
        return [self.tokenizer.decode(ids[i, :n].tolist(), skip_special_tokens=True) for i, n in enumerate(lengths)]

    def compute_scores(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, dict[str, float], dict[str, list]]:
        """(token_level_scores [B, T], scores [B], metrics, per-sample extras) for ``batch``."""
        texts = self.decode_responses(batch)
        if self.model_scorer is not None:
            return self._model_scores(batch, texts)
        result = self.manager(
            texts,
            list(batch[self.reward_fn_key]),
            list(batch["ground_truth"]),
            [dict(e) if isinstance(e, dict) else e for e in batch["extra_info"]],
            response_lengths=batch["response_mask"].sum(-1).tolist(),
        )
        report_failures(result, stop_when_all_fail=self.stop_when_all_fail)
        scores = torch.tensor(result.scores, dtype=torch.float32)
        token_scores = place_scores_on_last_token(scores=scores, response_mask=batch["response_mask"])
        metrics = {"reward/num_failed": float(result.num_failed), "reward/num_timed_out": float(result.num_timed_out)}
        for key, values in result.extra.items():
            finite = [v for v in values if not np.isnan(v)]  # nan marks samples that did not report it
            if finite:
                metrics[f"reward/{key}/mean"] = float(np.mean(finite))
        return token_scores, scores, metrics, {"response_text": texts, **result.extra}

    def _model_scores(self, batch: Batch, texts: list[str]):
        context = {"ground_truths": list(batch["ground_truth"])} if getattr(self.model_scorer, "uses_ground_truth",
                                                                            False) else {}
        scores = self.model_scorer.score(prompts=list(batch["raw_prompt"]), responses=texts, **context)
        token_scores = place_scores_on_last_token(scores=scores, response_mask=batch["response_mask"])
        metrics = {"reward/model_score/mean": scores.mean().item(), **getattr(self.model_scorer, "last_metrics", {})}
        return token_scores, scores, metrics, {"response_text": texts}

    def close(self) -> None:
        self.manager.close()
