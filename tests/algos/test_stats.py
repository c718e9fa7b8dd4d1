import math

import torch

from hybridflow.algos.stats import masked_mean, masked_sum, masked_var, masked_whiten

VALUES = torch.tensor([[1.0, 2.0, 100.0], [4.0, -50.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 1]])
SELECTED = [1.0, 2.0, 4.0, 6.0]


def test_masked_sum_and_mean_ignore_masked_entries():
    assert masked_sum(values=VALUES, mask=MASK).item() == sum(SELECTED)
    assert masked_mean(values=VALUES, mask=MASK).item() == sum(SELECTED) / 4
    torch.testing.assert_close(masked_mean(values=VALUES, mask=MASK, dim=-1), torch.tensor([1.5, 5.0]))


def test_masked_var_is_unbiased_by_default():
    mean = sum(SELECTED) / 4
    biased = sum((v - mean) ** 2 for v in SELECTED) / 4
    assert math.isclose(masked_var(values=VALUES, mask=MASK, unbiased=False).item(), biased, rel_tol=1e-6)
    assert math.isclose(masked_var(values=VALUES, mask=MASK).item(), biased * 4 / 3, rel_tol=1e-6)


def test_masked_whiten_matches_formula_on_selected_entries():
    mean = sum(SELECTED) / 4
    std = math.sqrt(sum((v - mean) ** 2 for v in SELECTED) / 3 + 1e-8)
    whitened = masked_whiten(values=VALUES, mask=MASK)
    expected = torch.tensor([[(1 - mean) / std, (2 - mean) / std], [(4 - mean) / std, (6 - mean) / std]])
    torch.testing.assert_close(whitened[MASK.bool()], expected.flatten())
    unshifted = masked_whiten(values=VALUES, mask=MASK, shift_mean=False)
    torch.testing.assert_close(unshifted[MASK.bool()], expected.flatten() + mean)


def test_all_masked_and_single_entry_give_zero_not_nan():
    nothing = torch.zeros_like(MASK)
    assert masked_mean(values=VALUES, mask=nothing).item() == 0.0
    assert masked_var(values=VALUES, mask=nothing).item() == 0.0
    assert torch.equal(masked_mean(values=VALUES, mask=nothing, dim=-1), torch.zeros(2))
    one = torch.tensor([[0, 1, 0], [0, 0, 0]])
    assert masked_var(values=VALUES, mask=one).item() == 0.0
    assert torch.isfinite(masked_whiten(values=VALUES, mask=one)).all()
    assert masked_whiten(values=VALUES, mask=one)[0, 1].item() == 0.0


def test_nan_under_the_mask_does_not_leak():
    values = torch.tensor([[1.0, float("nan")], [float("inf"), 3.0]])
    mask = torch.tensor([[1, 0], [0, 1]])
    assert masked_mean(values=values, mask=mask).item() == 2.0
    assert masked_var(values=values, mask=mask).item() == 2.0  # (1 + 1) / (2 - 1)
