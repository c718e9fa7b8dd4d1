import math

import pytest
import torch

from hybridflow.algos import dpo_loss, ipo_loss, sppo_loss

PC = torch.tensor([-10.0, -20.0])  # policy chosen
PR = torch.tensor([-12.0, -18.0])  # policy rejected
RC = torch.tensor([-11.0, -20.0])  # reference chosen
RR = torch.tensor([-11.0, -19.0])  # reference rejected
# h = (pc - rc) - (pr - rr): pair 0 -> 1 - (-1) = 2 ; pair 1 -> 0 - 1 = -1
PAIRS = {"policy_chosen_logps": PC, "policy_rejected_logps": PR, "ref_chosen_logps": RC, "ref_rejected_logps": RR}


def _log_sigmoid(x):
    return -math.log1p(math.exp(-x))


def test_dpo_sigmoid_loss_and_metrics_by_hand():
    loss, metrics = dpo_loss(**PAIRS, beta=0.5)
    assert loss.item() == pytest.approx(-(_log_sigmoid(1.0) + _log_sigmoid(-0.5)) / 2)
    assert metrics["rewards/chosen"] == pytest.approx(0.5 * (1 + 0) / 2)
    assert metrics["rewards/rejected"] == pytest.approx(0.5 * (-1 + 1) / 2)
    assert metrics["rewards/accuracies"] == pytest.approx(0.5)
    assert metrics["rewards/margins"] == pytest.approx(0.5 * (2 - 1) / 2)


def test_dpo_label_smoothing_and_gradient_sign():
    pc = PC.clone().requires_grad_(True)
    loss, _ = dpo_loss(**{**PAIRS, "policy_chosen_logps": pc}, beta=0.5, label_smoothing=0.1)
    expected = sum(-0.9 * _log_sigmoid(0.5 * h) - 0.1 * _log_sigmoid(-0.5 * h) for h in (2.0, -1.0)) / 2
    assert loss.item() == pytest.approx(expected)
    (grad,) = torch.autograd.grad(loss, pc)
    assert (grad < 0).all()  # raising the chosen log-prob lowers the loss


def test_dpo_is_finite_for_huge_margins():
    big = torch.tensor([1e4, -1e4])
    zeros = torch.zeros(2)
    loss, _ = dpo_loss(
        policy_chosen_logps=big, policy_rejected_logps=-big, ref_chosen_logps=zeros, ref_rejected_logps=zeros, beta=1.0
    )
    assert loss.item() == pytest.approx(2e4 / 2)  # -logsigmoid(-2e4) = 2e4, -logsigmoid(2e4) = 0


def test_ipo_squared_loss_by_hand():
    loss, _ = ipo_loss(**PAIRS, beta=0.25)
    assert loss.item() == pytest.approx(((2 - 2) ** 2 + (-1 - 2) ** 2) / 2)


def test_sppo_squared_loss_and_hard_label_equivalence():
    logps = torch.tensor([-10.0, -12.0])
    ref = torch.tensor([-11.0, -11.0])
    loss, _ = sppo_loss(policy_logps=logps, ref_logps=ref, win_prob=torch.tensor([0.8, 0.3]), eta=2.0)
    assert loss.item() == pytest.approx(((1 - 2 * 0.3) ** 2 + (-1 - 2 * (-0.2)) ** 2) / 2)
    beta = 0.5  # winner P=1, loser P=0, eta = 1/beta: (a - 1/(2 beta))^2 + (b + 1/(2 beta))^2
    hard, _ = sppo_loss(
        policy_logps=logps, ref_logps=ref, win_prob=torch.tensor([1.0, 0.0]), eta=1 / beta, global_num_pairs=1
    )
    assert hard.item() == pytest.approx((1 - 1) ** 2 + (-1 + 1) ** 2)


def test_global_num_pairs_makes_micro_batches_add_up():
    full, _ = dpo_loss(**PAIRS)
    parts = [dpo_loss(**{k: v[i : i + 1] for k, v in PAIRS.items()}, global_num_pairs=2)[0] for i in range(2)]
    torch.testing.assert_close(sum(parts), full)
