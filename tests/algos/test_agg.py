import pytest
import torch

from hybridflow.algos import UnknownAlgorithmError, agg_loss, list_loss_agg_modes

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])  # third row: all padding


def _agg(mode, **kwargs):
    return agg_loss(loss_mat=LOSS, loss_mask=MASK, loss_agg_mode=mode, **kwargs).item()


def test_hand_computed_values_for_every_mode():
    # valid tokens: row0 -> 1, 2; row1 -> 4, 5, 6; row2 -> none (not a sequence)
    assert _agg("token-mean") == pytest.approx((1 + 2 + 4 + 5 + 6) / 5)
    assert _agg("token-sum") == pytest.approx(18.0)
    assert _agg("seq-mean-token-sum") == pytest.approx((3 + 15) / 2)
    assert _agg("seq-mean-token-mean") == pytest.approx((1.5 + 5.0) / 2)
    assert _agg("seq-mean-token-sum-norm") == pytest.approx((3 / 3 + 15 / 3) / 2)
    assert _agg("seq-mean-token-sum-norm", max_response_length=10) == pytest.approx((0.3 + 1.5) / 2)


def test_global_counts_replace_local_ones():
    assert _agg("token-mean", global_num_tokens=9) == pytest.approx(18 / 9)
    assert _agg("seq-mean-token-mean", global_num_seqs=4) == pytest.approx(6.5 / 4)


def test_all_masked_batch_gives_zero_loss_and_finite_grad():
    loss_mat = torch.randn(2, 4, requires_grad=True)
    for mode in list_loss_agg_modes():
        loss = agg_loss(loss_mat=loss_mat, loss_mask=torch.zeros(2, 4), loss_agg_mode=mode)
        (grad,) = torch.autograd.grad(loss, loss_mat)
        assert loss.item() == 0.0 and torch.equal(grad, torch.zeros(2, 4)), mode


def test_masked_nan_does_not_leak_into_loss_or_grad():
    loss_mat = torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]], requires_grad=True)
    mask = torch.tensor([[1, 0], [0, 1]])
    for mode in list_loss_agg_modes():
        loss = agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode=mode)
        (grad,) = torch.autograd.grad(loss, loss_mat)
        assert torch.isfinite(loss) and torch.isfinite(grad).all(), mode


def test_unknown_mode_names_the_choices():
    with pytest.raises(UnknownAlgorithmError, match="token-mean, token-sum"):
        _agg("token_mean")


def _random_batch(seed, batch=8, width=6):
    gen = torch.Generator().manual_seed(seed)
    loss_mat = torch.randn(batch, width, generator=gen)
    lengths = torch.tensor([0, 1, 6, 3, 2, 5, 4, 1])  # includes an all-masked and length-1 rows
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    return loss_mat, mask


def _global_kwargs(mask):
    return {
        "global_num_tokens": mask.sum().item(),
        "global_num_seqs": (mask.sum(-1) > 0).sum().item(),
        "max_response_length": 6,
    }


def _loss_and_grad(weights, loss_mat, mask, mode, kwargs):
    # a linear "model" so that the gradient is a real autograd path to parameters
    weights = weights.clone().requires_grad_(True)
    loss = agg_loss(loss_mat=loss_mat * weights, loss_mask=mask, loss_agg_mode=mode, **kwargs)
    (grad,) = torch.autograd.grad(loss, weights)
    return loss.detach(), grad


ALL_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def test_every_mode_is_listed():
    assert list_loss_agg_modes() == ALL_MODES


@pytest.mark.parametrize("mode", ALL_MODES)
def test_micro_batches_and_dp_shards_sum_to_the_full_batch(mode):
    loss_mat, mask = _random_batch(0)
    weights = torch.linspace(0.5, 1.5, 6)
    kwargs = _global_kwargs(mask)
    full_loss, full_grad = _loss_and_grad(weights, loss_mat, mask, mode, {"max_response_length": 6})
    # 2 data-parallel shards x 2 micro-batches each, uneven sizes, padded widths trimmed per micro-batch
    splits = [(0, 3), (3, 4), (4, 7), (7, 8)]
    total_loss, total_grad = torch.tensor(0.0), torch.zeros(6)
    for start, stop in splits:
        width = max(int(mask[start:stop].sum(-1).max()), 1)
        w = weights.clone()
        micro_loss, micro_grad = _loss_and_grad(
            w[:width], loss_mat[start:stop, :width], mask[start:stop, :width], mode, kwargs
        )
        total_loss += micro_loss
        total_grad[:width] += micro_grad
    torch.testing.assert_close(total_loss, full_loss)
    torch.testing.assert_close(total_grad, full_grad)


def test_without_global_counts_micro_batch_means_are_not_the_batch_mean():
    # documents why the counts are arguments: a mean of per-micro-batch means is biased
    loss_mat, mask = _random_batch(1)
    full = agg_loss(loss_mat=loss_mat, loss_mask=mask, loss_agg_mode="token-mean")
    halves = [
        agg_loss(loss_mat=loss_mat[rows], loss_mask=mask[rows], loss_agg_mode="token-mean")
        for rows in (slice(0, 2), slice(2, 8))
    ]
    assert not torch.isclose(sum(halves) / 2, full)


def test_zero_global_counts_give_zero_not_nan():
    for mode in list_loss_agg_modes():
        for zero in (0, torch.tensor(0.0)):  # a python count, or one all-reduced as a tensor
            counts = {"global_num_tokens": zero, "global_num_seqs": zero}
            loss = agg_loss(loss_mat=LOSS, loss_mask=torch.zeros(3, 3), loss_agg_mode=mode, **counts)
            assert loss.item() == 0.0, mode


def test_loss_scale_factor_takes_precedence_over_max_response_length():
    # seq-mean-token-sum-norm over the 2 non-empty rows: (3 / L + 15 / L) / 2
    assert _agg("seq-mean-token-sum-norm", max_response_length=5) == pytest.approx(18 / 5 / 2)
    assert _agg("seq-mean-token-sum-norm", max_response_length=5, loss_scale_factor=9.0) == pytest.approx(18 / 9 / 2)
    assert _agg("token-mean", loss_scale_factor=9.0) == pytest.approx(18 / 5)  # other modes ignore it
