"""The implicit PRM worker: its CE loss on a real forward against hand-computed values, and a gradient that does not
depend on how a mini-batch is cut into micro-batches (each micro-batch's loss is its share of the mini-batch mean)."""

import math

import pytest
import torch

from hybridflow.config import PPOConfig, load_config
from hybridflow.data.parallel import LOCAL
from hybridflow.trainer.roles.prime import build_prm_worker
from tests.controller.test_ray_group import RESPONSE, rollout_batch

LENGTHS = [6, 3, 5, 1, 6, 2, 4, 6]  # rollout_batch's response lengths
LABELS = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
OFFSET = 0.1  # log pi_phi - log pi_ref on every response token


def prm_and_batch(model_dir, micro: str):
    cfg = load_config(PPOConfig, [
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.n=2", "algorithm.adv_estimator=prime",
        "reward_model.mini_batch_size=4", f"reward_model.micro_batch_size_per_gpu={micro}",
        f"data.max_response_length={RESPONSE}", "reward_model.model.beta_train=0.05"])
    prm = build_prm_worker(LOCAL, cfg=cfg, total_steps=2).prm
    batch = rollout_batch()
    log_probs = prm.compute_prm_log_probs(batch, temperature=1.0)
    batch["ref_log_probs"] = log_probs - OFFSET * batch["response_mask"]
    batch["seq_score"] = torch.tensor(LABELS)
    return prm, batch


def update_recording_gradient(prm, batch) -> tuple[dict, list[torch.Tensor]]:
    grads, step = [], prm.state.step

    def record_then_step(*, loss_value):
        grads.extend(p.grad.detach().clone() for p in prm.model.parameters() if p.grad is not None)
        return step(loss_value=loss_value)

    prm.state.step = record_then_step
    return prm.update_prm(batch, temperature=1.0, step=1), grads


def test_ce_loss_of_the_first_update_by_hand(tiny_model_dir):
    metrics, _ = update_recording_gradient(*prm_and_batch(tiny_model_dir, "null"))
    # logits beta * sum_t q_t = 0.05 * 0.1 * length; BCE against the labels, mean over the 8 responses
    expected = 0.0
    for length, label in zip(LENGTHS, LABELS):
        z = 0.05 * OFFSET * length
        expected -= (label * math.log(1 / (1 + math.exp(-z))) + (1 - label) * math.log(1 / (1 + math.exp(z)))) / 8
    assert metrics["reward_model/dpo_loss"] == pytest.approx(expected, abs=1e-5)
    assert metrics["rm/lr"] > 0 and metrics["reward_model/grad_norm"] > 0


def test_micro_batch_cut_does_not_change_the_prm_gradient(tiny_model_dir):
    _, reference = update_recording_gradient(*prm_and_batch(tiny_model_dir, "null"))
    assert reference and any(g.abs().sum() > 0 for g in reference)
    for micro in ("1", "2"):
        _, grads = update_recording_gradient(*prm_and_batch(tiny_model_dir, micro))
        assert len(grads) == len(reference)
        for got, want in zip(grads, reference):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=f"micro-batch {micro}")
