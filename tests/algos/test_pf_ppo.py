"""PF-PPO reweighting (arXiv 2409.06957, in verl's batch-level form)."""

import pytest
import torch

from hybridflow.algos import AlgorithmError
from hybridflow.algos.pf_ppo import pf_ppo_resample, pf_ppo_weights

SCORES = torch.tensor([0.0, 1.0, 2.0, 2.0, -3.0, 0.5])


@pytest.mark.parametrize("method, expected", [
    ("pow", [0.0, 1.0, 4.0, 4.0, 9.0, 0.25]),          # |r|^2
    ("max_min", [0.0, 0.0, 1.0, 1.0, 1.0, 0.0]),       # ties at the max all count
    ("max_random", [0.1, 0.1, 0.4, 0.4, 0.1, 0.1]),
])
def test_weights_by_method(method, expected):
    torch.testing.assert_close(pf_ppo_weights(scores=SCORES, reweight_method=method, weight_pow=2.0),
                               torch.tensor(expected))


def test_resampling_keeps_the_size_and_follows_the_weights():
    scores = torch.tensor([0.0, 1.0, 2.0]).repeat(2000)
    rows = pf_ppo_resample(scores=scores, reweight_method="pow", weight_pow=2.0,
                           generator=torch.Generator().manual_seed(0))
    assert rows.shape == (6000,)
    drawn = scores[rows]
    assert (drawn == 0).float().mean().item() < 1e-3  # weight 1e-8
    assert (drawn == 2).float().mean().item() == pytest.approx(0.8, abs=0.03)  # 4 / (1 + 4)


def test_resampling_is_reproducible_with_a_seeded_generator():
    draw = lambda: pf_ppo_resample(scores=SCORES, reweight_method="max_random",  # noqa: E731
                                   generator=torch.Generator().manual_seed(7))
    assert torch.equal(draw(), draw())


def test_unknown_method_lists_the_choices():
    with pytest.raises(AlgorithmError, match="pow, max_min, max_random"):
        pf_ppo_weights(scores=SCORES, reweight_method="best")
