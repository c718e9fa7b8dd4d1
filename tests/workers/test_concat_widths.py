"""Rollouts of different widths (two generate calls, or two ranks) concatenated: the alignment padding
changes no log-prob of a real token (padded and packed forward layouts)."""

from __future__ import annotations

import pytest
import torch

from hybridflow.data.batch import Batch
from hybridflow.data.parallel import LOCAL
from hybridflow.trainer.roles.builders import build_hybrid_engine
from tests.workers.test_verl_worker_keys import _batch, _cfg


def _rollout(*, rows: int, prompt: int, response: int) -> Batch:
    batch = _batch(rows=rows, prompt=prompt, response=response)
    batch["prompts"] = batch["input_ids"][:, :prompt]
    return batch


@pytest.mark.parametrize("packed", [False, True])
def test_alignment_padding_leaves_log_probs_unchanged(tiny_model_dir, packed):
    cfg = _cfg(tiny_model_dir, f"actor_rollout_ref.model.use_remove_padding={packed}")
    actor = build_hybrid_engine(LOCAL, cfg=cfg, total_steps=2, with_rollout=False, with_reference=False).actor
    a, b = _rollout(rows=4, prompt=3, response=4), _rollout(rows=4, prompt=5, response=2)
    both = Batch.concat([a, b])
    assert both["input_ids"].shape == (8, 9)  # P = 5, T = 4
    alone_a, alone_b = (actor.compute_log_prob(x, temperature=1.0)[0] for x in (a, b))
    together = actor.compute_log_prob(both, temperature=1.0)[0]
    mask = both["response_mask"].bool()
    torch.testing.assert_close(together[:4][mask[:4]], alone_a[a["response_mask"].bool()], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(together[4:, :2][mask[4:, :2]], alone_b[b["response_mask"].bool()], rtol=1e-5,
                               atol=1e-5)
