"""Colocated worker groups split each bundle of a placement group; one that would overfill it fails at once, in one
line (issue 37: the critic asked for half of bundles the actor filled, and Ray waited forever). No cluster needed."""

from types import SimpleNamespace

import pytest

pytest.importorskip("ray")

from hybridflow.controller.ray_backend import _claim_share, _release_share  # noqa: E402
from hybridflow.errors import ConfigError  # noqa: E402


def test_shares_of_a_bundle_sum_to_at_most_one():
    group = SimpleNamespace(id="pg-test-shares")
    _claim_share(group, 0.5, name="actor_rollout_ref")
    _claim_share(group, 0.5, name="critic")
    with pytest.raises(ConfigError) as err:
        _claim_share(group, 0.5, name="reward")
    (line,) = str(err.value).splitlines()
    assert ("'reward' asks for 0.5 of each bundle of a placement group already 1 used "
            "(actor_rollout_ref 0.5, critic 0.5)") in line
    _release_share(group, "critic")
    _claim_share(group, 0.5, name="reward")
    _release_share(group, "reward")
    _release_share(group, "actor_rollout_ref")


def test_a_full_share_leaves_no_room():
    group = SimpleNamespace(id="pg-test-full")
    _claim_share(group, 1.0, name="actor_rollout_ref")
    with pytest.raises(ConfigError, match="summing to at most 1"):
        _claim_share(group, 0.5, name="critic")
    _release_share(group, "actor_rollout_ref")
