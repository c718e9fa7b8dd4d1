import pytest
import torch

from hybridflow.rewards.placement import place_scores_on_last_token


def test_score_lands_on_last_valid_token():
    response_mask = torch.tensor(
        [
            [1, 1, 1, 0, 0],  # right padding: last valid at 2
            [1, 1, 1, 1, 1],  # full row: last at 4
            [0, 0, 0, 0, 0],  # all masked: nothing
            [0, 1, 1, 0, 0],  # left and right padding: last at 2
        ]
    )
    scores = torch.tensor([0.5, -1.0, 7.0, 2.0])
    expected = torch.zeros(4, 5)
    expected[0, 2], expected[1, 4], expected[3, 2] = 0.5, -1.0, 2.0
    out = place_scores_on_last_token(scores=scores, response_mask=response_mask)
    assert out.dtype == torch.float32
    assert torch.equal(out, expected)


def test_row_sums_equal_scores_when_rows_have_tokens():
    torch.manual_seed(0)
    lengths = torch.randint(1, 9, (6,))
    mask = (torch.arange(8)[None, :] < lengths[:, None]).long()
    scores = torch.randn(6)
    out = place_scores_on_last_token(scores=scores, response_mask=mask.bool())
    assert torch.allclose(out.sum(dim=1), scores)
    assert torch.equal((out != 0).long().sum(dim=1), torch.ones(6, dtype=torch.long))


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match=r"scores \[B\]"):
        place_scores_on_last_token(scores=torch.zeros(3), response_mask=torch.ones(2, 4))
