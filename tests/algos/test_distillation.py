"""On-policy distillation losses (verl 0.9.1's distillation_loss), against values computed by hand."""

import math

import pytest
import torch

from hybridflow.algos.distillation import (DistillationObjective, distillation_loss_spec, get_distillation_loss,
                                           list_distillation_losses)
from hybridflow.algos.distillation.combine import combined_loss, distillation_term
from hybridflow.algos.errors import AlgorithmError

LN2 = math.log(2.0)


def test_registered_names_and_specs_are_verl_s():
    assert list_distillation_losses() == sorted(["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3",
                                                 "forward_kl_topk"])
    assert distillation_loss_spec("forward_kl_topk").use_topk
    assert not distillation_loss_spec("k3").use_topk


@pytest.mark.parametrize("mode,expected", [
    ("k1", LN2), ("kl", LN2), ("abs", LN2), ("k2", LN2 ** 2 / 2), ("mse", LN2 ** 2 / 2),
    # k3 = exp(-d) + d - 1 with d = log p - log q = log 2
    ("k3", 0.5 + LN2 - 1), ("low_var_kl", 0.5 + LN2 - 1)])
def test_reverse_kl_estimators(mode, expected):
    student = torch.tensor([[math.log(0.5)]])
    teacher = torch.tensor([[math.log(0.25)]])
    loss, extra = get_distillation_loss(mode)(loss_mode=mode, student_log_probs=student, teacher_log_probs=teacher)
    assert loss.shape == (1, 1) and extra == {}
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_forward_kl_topk_by_hand():
    # position 0: teacher top-2 (0.5, 0.25), student (0.25, 0.25): 0.5 ln 2 + 0
    # position 1: teacher 0.1, student 0.4: 0.1 ln(0.25) < 0, clamped to 0 (top-k mass < 1)
    teacher = torch.log(torch.tensor([[[0.5, 0.25], [0.1, 1e-9]]]))
    student = torch.log(torch.tensor([[[0.25, 0.25], [0.4, 1e-9]]]))
    loss, extra = get_distillation_loss("forward_kl_topk")(student_topk_log_probs=student,
                                                            teacher_topk_log_probs=teacher)
    assert loss.shape == (1, 2)
    assert loss[0, 0].item() == pytest.approx(0.5 * LN2, abs=1e-6)
    assert loss[0, 1].item() == 0.0
    assert extra["student_mass"][0, 0].item() == pytest.approx(0.5, abs=1e-6)
    assert extra["teacher_mass"][0, 0].item() == pytest.approx(0.75, abs=1e-6)


def test_forward_kl_topk_log_prob_min_clamp():
    teacher = torch.log(torch.tensor([[[0.5]]]))
    student = torch.log(torch.tensor([[[0.05]]]))
    fn = get_distillation_loss("forward_kl_topk")
    plain, _ = fn(student_topk_log_probs=student, teacher_topk_log_probs=teacher)
    clamped, _ = fn(student_topk_log_probs=student, teacher_topk_log_probs=teacher, log_prob_min_clamp=-1.0)
    assert plain.item() == pytest.approx(0.5 * math.log(10), abs=1e-5)
    assert clamped.item() == pytest.approx(0.5 * (math.log(0.5) + 1.0), abs=1e-5)  # student's log-prob -> -1


PER_TOKEN = torch.tensor([[1.0, 3.0], [5.0, 7.0]])
MASK = torch.tensor([[1, 1], [1, 0]])


def term(objective, per_token=PER_TOKEN, log_prob=None, **kwargs):
    log_prob = torch.zeros(2, 2) if log_prob is None else log_prob
    return distillation_term(objective, per_token, log_prob=log_prob, old_log_prob=torch.zeros(2, 2),
                             response_mask=MASK, loss_agg_mode="token-mean", **kwargs)


def test_supervised_term_is_the_aggregated_loss_and_clamp_applies():
    loss, metrics = term(DistillationObjective())
    assert loss.item() == pytest.approx(3.0)  # (1 + 3 + 5) / 3
    assert metrics["loss_min"] == 1.0 and metrics["loss_max"] == 5.0  # valid tokens only, before clamping
    clamped, _ = term(DistillationObjective(loss_max_clamp=2.0))
    assert clamped.item() == pytest.approx((1 + 2 + 2) / 3)
    by_seq, _ = distillation_term(DistillationObjective(), PER_TOKEN, log_prob=torch.zeros(2, 2),
                                  old_log_prob=torch.zeros(2, 2), response_mask=MASK,
                                  loss_agg_mode="seq-mean-token-mean")
    assert by_seq.item() == pytest.approx((2.0 + 5.0) / 2)


def test_policy_gradient_term_uses_minus_the_loss_as_advantage():
    # at log_prob = old_log_prob the vanilla loss is -A = l per token; its gradient in log_prob is l / N,
    # whereas the supervised k1 loss (log p - log q) would have gradient 1 / N
    log_prob = torch.zeros(2, 2, requires_grad=True)
    loss, metrics = term(DistillationObjective(use_policy_gradient=True, loss_mode="k1"), log_prob=log_prob)
    assert loss.item() == pytest.approx(3.0)
    loss.backward()
    assert torch.allclose(log_prob.grad, torch.tensor([[1.0, 3.0], [5.0, 0.0]]) / 3)
    assert "pg_clipfrac" in metrics


def test_policy_gradient_clips_with_the_distillation_s_own_ratios():
    # A = -l < 0 and ratio e^-0.5 < 1 - 0.2: PPO's max(-A r, -A clip(r)) takes the clipped term (clip fraction 1);
    # with clip_ratio_low=0.9 the ratio is inside the range (clip fraction 0)
    low = torch.full((2, 2), -0.5)
    _, narrow = term(DistillationObjective(use_policy_gradient=True, loss_mode="k1"), log_prob=low)
    _, wide = term(DistillationObjective(use_policy_gradient=True, loss_mode="k1", clip_ratio_low=0.9,
                                         clip_ratio_high=0.9), log_prob=low)
    assert narrow["pg_clipfrac"] == pytest.approx(1.0) and wide["pg_clipfrac"] == pytest.approx(0.0)


def test_task_rewards_on_and_off():
    task, dist = torch.tensor(10.0), torch.tensor(3.0)
    assert combined_loss(DistillationObjective(distillation_loss_coef=0.5), task_loss=task,
                         distill_loss=dist).item() == pytest.approx(11.5)
    # without task rewards the coefficient is 1 and the task's loss is dropped (verl)
    assert combined_loss(DistillationObjective(use_task_rewards=False, distillation_loss_coef=0.5), task_loss=task,
                         distill_loss=dist).item() == pytest.approx(3.0)


def test_k1_backpropagated_and_other_policy_losses_are_refused():
    with pytest.raises(AlgorithmError, match="use_policy_gradient=True"):
        DistillationObjective(loss_mode="k1")
    with pytest.raises(AlgorithmError, match="only vanilla"):
        DistillationObjective(use_policy_gradient=True, policy_loss_mode="gspo")
