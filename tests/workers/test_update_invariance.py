"""update_policy's gradient does not depend on how a mini-batch is cut into micro-batches.

The policy loss is normalised by the mini-batch's global token / sequence counts (passed in, not
per micro-batch), so micro-batches of 1 row, of 2 rows, none (the whole mini-batch at once) and a
dynamic token budget accumulate the same gradient. This does not hold for clip_cov / kl_cov: they pick
the tokens to clip / penalise from covariance statistics of each call's own tokens, so a different cut
selects different tokens (the slow Ray test covers the data-parallel split for the vanilla loss).
"""

import pytest
import torch

from hybridflow.config import PPOConfig, load_config
from hybridflow.trainer.roles.builders import build_hybrid_engine
from hybridflow.data.parallel import LOCAL
from tests.controller.test_ray_group import RESPONSE, rollout_batch

CUTS = {"micro_1": ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"],
        "micro_2": ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"],
        "none": ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null"],
        "token_budget": ["actor_rollout_ref.actor.use_dynamic_bsz=True",
                         "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24"]}


def first_gradient(model_dir, cut: list[str], loss_agg_mode: str) -> list[torch.Tensor]:
    cfg = load_config(PPOConfig, [
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", f"data.max_response_length={RESPONSE}",
        f"actor_rollout_ref.actor.loss_agg_mode={loss_agg_mode}", *cut])
    actor = build_hybrid_engine(LOCAL, cfg=cfg, total_steps=2, with_rollout=False, with_reference=False).actor
    grads, step = [], actor.state.step

    def record_then_step(*, loss_value):
        grads.extend(p.grad.detach().clone() for p in actor.model.parameters() if p.grad is not None)
        return step(loss_value=loss_value)

    actor.state.step = record_then_step
    batch = rollout_batch()
    batch["old_log_probs"], _ = actor.compute_log_prob(batch, temperature=1.0)
    batch["old_log_probs"] = batch["old_log_probs"] + 0.05 * batch["response_mask"]  # ratios != 1
    actor.update_policy(batch, temperature=1.0, step=1)
    return grads


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_micro_batch_cut_does_not_change_the_gradient(tiny_model_dir, loss_agg_mode):
    reference = first_gradient(tiny_model_dir, CUTS["none"], loss_agg_mode)
    assert reference and any(g.abs().sum() > 0 for g in reference)
    for name in ("micro_1", "micro_2", "token_budget"):
        grads = first_gradient(tiny_model_dir, CUTS[name], loss_agg_mode)
        assert len(grads) == len(reference), name
        for got, want in zip(grads, reference):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=name)
