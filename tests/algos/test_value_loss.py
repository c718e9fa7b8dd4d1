import pytest
import torch

from hybridflow.algos import value_loss

VALUES = torch.tensor([[1.0, 1.0, 0.0], [2.0, 0.0, 0.0]])
RETURNS = torch.tensor([[2.0, 0.0, 0.0], [2.5, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_clipped_value_loss_by_hand():
    vpreds = torch.tensor([[1.5, 0.9, 100.0], [3.0, 0.0, 0.0]], requires_grad=True)
    loss, metrics = value_loss(vpreds=vpreds, values=VALUES, returns=RETURNS, response_mask=MASK, cliprange_value=0.2)
    # token (0,0): V=1.5 -> clipped 1.2: max(0.25, 0.64) = 0.64 (clipped larger)
    # token (0,1): V=0.9 -> inside: 0.81 both
    # token (1,0): V=3.0 -> clipped 2.2: max(0.25, 0.09) = 0.25 (unclipped larger)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.81 + 0.25) / 3)
    assert metrics["vf_clipfrac"] == pytest.approx(1 / 3)
    (grad,) = torch.autograd.grad(loss, vpreds)
    # clipped token has no gradient; others 0.5 * 2 (V - R) / 3
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.9 / 3, 0.0], [0.5 / 3, 0.0, 0.0]]))


def test_no_clip_is_half_mse():
    vpreds = torch.tensor([[1.5, 0.9, 0.0], [3.0, 0.0, 0.0]])
    loss, metrics = value_loss(vpreds=vpreds, values=VALUES, returns=RETURNS, response_mask=MASK, cliprange_value=None)
    assert loss.item() == pytest.approx(0.5 * (0.25 + 0.81 + 0.25) / 3)
    assert metrics["vf_clipfrac"] == 0.0


def test_all_masked_is_zero_and_global_tokens_split_micro_batches():
    vpreds = torch.randn(2, 3)
    loss, metrics = value_loss(
        vpreds=vpreds, values=VALUES, returns=RETURNS, response_mask=torch.zeros(2, 3), cliprange_value=0.2
    )
    assert loss.item() == 0.0 and metrics["vf_clipfrac"] == 0.0
    full, _ = value_loss(vpreds=vpreds, values=VALUES, returns=RETURNS, response_mask=MASK, cliprange_value=0.2)
    parts = [
        value_loss(
            vpreds=vpreds[r], values=VALUES[r], returns=RETURNS[r], response_mask=MASK[r],
            cliprange_value=0.2, global_num_tokens=3,
        )[0]
        for r in (slice(0, 1), slice(1, 2))
    ]
    torch.testing.assert_close(sum(parts), full)


def test_loss_scale_factor_replaces_the_length_of_seq_mean_token_sum_norm_issue_13():
    """verl's critic.loss_scale_factor: 1/2 * sum_i (sum_t m l) / L / N_seq with L the factor."""
    vpreds = torch.tensor([[1.0, 2.0, 9.0], [0.0, 1.0, 1.0]])
    returns = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])  # row 1: a multi-turn observation at t1
    kwargs = dict(vpreds=vpreds, values=vpreds, returns=returns, response_mask=mask, cliprange_value=None,
                  loss_agg_mode="seq-mean-token-sum-norm", max_response_length=3)
    # squared errors on valid tokens: row 0 -> 1 + 4, row 1 -> 1 + 4
    by_length, _ = value_loss(**kwargs)
    assert by_length.item() == pytest.approx(0.5 * (5 / 3 + 5 / 3) / 2)
    scaled, _ = value_loss(**kwargs, loss_scale_factor=10.0)
    assert scaled.item() == pytest.approx(0.5 * (5 / 10 + 5 / 10) / 2)
