import pytest
import torch

from hybridflow.algos import AlgorithmError, overlong_penalty


def test_linear_penalty_inside_the_buffer_by_hand():
    lengths = torch.tensor([0, 10, 12, 15, 16, 20, 25])
    penalty = overlong_penalty(
        response_lengths=lengths, max_response_length=20, overlong_buffer_len=8, penalty_factor=0.5
    )
    # expected length 12: 0 up to 12, then (12 - L) / 8 * 0.5, floor -0.5 past 20
    expected = [0.0, 0.0, 0.0, -3 / 8 * 0.5, -4 / 8 * 0.5, -8 / 8 * 0.5, -0.5]
    assert penalty.tolist() == pytest.approx(expected)


def test_buffer_must_fit_in_max_length():
    for bad in (0, 21):
        with pytest.raises(AlgorithmError, match="overlong_buffer.len"):
            overlong_penalty(response_lengths=torch.tensor([1]), max_response_length=20, overlong_buffer_len=bad)
