"""sft_loss: hand-computed token-mean NLL with a global token count; splits add up to the full batch."""

import math

import pytest
import torch

from hybridflow.trainer.sft.loss import sft_loss


def _log_softmax(row, index):
    return row[index] - math.log(sum(math.exp(v) for v in row))


def test_hand_computed_token_mean_over_targets_only():
    logits = torch.tensor([[[2.0, 0.0, -1.0], [0.5, 0.5, 3.0], [1.0, -2.0, 0.0], [9.0, 9.0, 9.0]]])  # [1, 4, 3]
    input_ids = torch.tensor([[1, 0, 2, 1]])
    loss_mask = torch.tensor([[0, 1, 0, 1]])  # targets: token 1 (from logits[0]) and token 3 (from logits[2])
    loss, metrics = sft_loss(logits=logits, input_ids=input_ids, loss_mask=loss_mask, global_num_tokens=5)
    nll = -_log_softmax([2.0, 0.0, -1.0], 0) - _log_softmax([1.0, -2.0, 0.0], 1)
    assert loss.item() == pytest.approx(nll / 5, rel=1e-6)
    assert metrics["nll_sum"].item() == pytest.approx(nll, rel=1e-6)
    assert metrics["num_tokens"].item() == 2
    assert not metrics["nll_sum"].requires_grad


def test_masked_positions_cannot_leak_inf_or_nan():
    logits = torch.tensor([[[0.0, 0.0], [float("nan"), 0.0], [1.0, 0.0]]])
    loss, _ = sft_loss(logits=logits, input_ids=torch.tensor([[0, 1, 1]]), loss_mask=torch.tensor([[0, 1, 0]]),
                       global_num_tokens=1)
    assert loss.item() == pytest.approx(math.log(2.0), rel=1e-6)


def test_micro_batch_shares_sum_to_the_full_batch_loss_and_gradient():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, 11, generator=generator, requires_grad=True)
    input_ids = torch.randint(0, 11, (4, 6), generator=generator)
    loss_mask = (torch.rand(4, 6, generator=generator) > 0.4).long()
    loss_mask[:, 0] = 0
    total = int(loss_mask.sum())
    full, _ = sft_loss(logits=logits, input_ids=input_ids, loss_mask=loss_mask, global_num_tokens=total)
    (full_grad,) = torch.autograd.grad(full, logits)
    parts = [sft_loss(logits=logits[rows], input_ids=input_ids[rows], loss_mask=loss_mask[rows],
                      global_num_tokens=total)[0] for rows in (slice(0, 1), slice(1, 4))]
    (split_grad,) = torch.autograd.grad(sum(parts), logits)
    torch.testing.assert_close(sum(parts), full)
    torch.testing.assert_close(split_grad, full_grad)
