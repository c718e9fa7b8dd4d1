"""Every registered estimator, called generically as the trainer does."""

import pytest
import torch

from hybridflow.algos import get_advantage, list_advantages

BUILTIN = [
    "gae", "grpo", "grpo_passk", "rloo", "remax", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo", "gpg",
]


def _batch():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([0, 1, 4, 2, 1, 3])  # an all-masked row and two length-1 responses
    mask = (torch.arange(4)[None, :] < lengths[:, None]).long()
    rewards = torch.zeros(6, 4)
    rewards[torch.arange(1, 6), lengths[1:] - 1] = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5])
    return {
        "token_level_rewards": rewards,
        "response_mask": mask,
        "index": ["p0", "p0", "p1", "p1", "p2", "p2"],
        "values": torch.randn(6, 4, generator=gen),
        "gamma": 0.99,
        "lam": 0.95,
        "reward_baselines": torch.tensor([0.0, 0.5, 0.5, 0.5, 1.0, 1.0]),
    }


def test_every_builtin_is_registered():
    assert set(BUILTIN) <= set(list_advantages())


@pytest.mark.parametrize("name", BUILTIN)
def test_shared_signature_shapes_finiteness_and_masking(name):
    batch = _batch()
    advantages, returns = get_advantage(name)(**batch, norm_adv_by_std_in_grpo=True, epsilon=1e-6)
    assert advantages.shape == returns.shape == (6, 4)
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()
    assert advantages[batch["response_mask"] == 0].abs().sum() == 0
    assert not advantages.requires_grad


SCORES = torch.tensor([1.0, 0.0, 0.25, 1.0, 0.5, 2.0])


def _full_groups(scores=SCORES):
    """Three groups of two, every response non-empty: group baselines are well defined."""
    lengths = torch.tensor([1, 4, 2, 1, 3, 2])
    mask = (torch.arange(4)[None, :] < lengths[:, None]).long()
    rewards = torch.zeros(6, 4)
    rewards[torch.arange(6), lengths - 1] = scores
    return {"token_level_rewards": rewards, "response_mask": mask, "index": [0, 0, 1, 1, 2, 2]}


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo", "reinforce_plus_plus_baseline", "grpo_passk", "gpg"])
def test_adding_a_constant_to_every_score_changes_nothing(name):
    batch = _full_groups()
    base, _ = get_advantage(name)(**batch)
    moved, _ = get_advantage(name)(**_full_groups(SCORES + 3.0))
    if name == "gpg":  # only alpha = B / #non-zero changes: 6/5 before (one zero score), 6/6 after
        torch.testing.assert_close(moved, base * 5 / 6, atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(moved, base, atol=1e-5, rtol=1e-5)


def test_grpo_is_invariant_to_scaling_the_scores():
    batch = _full_groups()
    base, _ = get_advantage("grpo")(**batch)
    scaled, _ = get_advantage("grpo")(**dict(batch, token_level_rewards=batch["token_level_rewards"] * 7.0))
    torch.testing.assert_close(scaled, base, atol=1e-4, rtol=1e-4)
