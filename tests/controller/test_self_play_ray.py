"""SPPO and SPIN on the Ray backend at 2 workers (FSDP2 over gloo): the preference update, the reference
refresh and the reference checkpoint run on sharded ranks.

No comparison with the local backend: sampled rollouts differ between 1 and 2 workers (each rank
samples its own shard), and with greedy rollouts every response of a prompt is the same, so
neither method has a preference to learn from.
"""

from __future__ import annotations


import pytest
import torch

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")

from hybridflow.config import SPINConfig, SPPOConfig, load_config  # noqa: E402
from hybridflow.trainer.main_spin import run_spin  # noqa: E402
from hybridflow.trainer.main_sppo import run_sppo  # noqa: E402
from tests.controller.test_ppo_ray import RAY, ray_session, weights  # noqa: E402,F401 (ray_session: autouse)
from tests.trainer.test_self_play import read_metrics, self_play_overrides  # noqa: E402


def overrides(root, model_dir, *, steps: int, extra=()) -> list[str]:
    return self_play_overrides(root, model_dir, steps=steps) + RAY + [
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "trainer.ref_update_freq=2", "trainer.save_freq=1", "trainer.logger=[file]", *extra]


def test_sppo_refreshes_and_checkpoints_the_sharded_reference(tmp_path, tiny_model_dir):
    """The reference checkpointed at step 2 is exactly the actor checkpointed at step 1 (refreshed at step 2)."""
    run_sppo(load_config(SPPOConfig, overrides(tmp_path, tiny_model_dir, steps=2)))
    ckpt = tmp_path / "ckpt"
    (ckpt / "global_step_2" / "actor").rename(ckpt / "global_step_2" / "policy")
    (ckpt / "global_step_2" / "ref").rename(ckpt / "global_step_2" / "actor")
    reference_at_2, actor_at_1 = weights(tmp_path, 2), weights(tmp_path, 1)
    assert actor_at_1.keys() == reference_at_2.keys()
    for key in actor_at_1:
        assert torch.equal(actor_at_1[key], reference_at_2[key]), key
    assert all(r["actor/sppo_loss"] >= 0 for r in read_metrics(tmp_path))


@pytest.mark.slow  # the Ray path of SPIN differs from SPPO's (above) only by the pair cut
def test_spin_on_two_ray_workers_trains_whole_pairs(tmp_path, tiny_model_dir):
    run_spin(load_config(SPINConfig, overrides(tmp_path, tiny_model_dir, steps=2,
                                               extra=["actor_rollout_ref.rollout.n=3"])))
    rows = read_metrics(tmp_path)
    assert all(r["train/num_pairs"] % 2 == 0 for r in rows)  # cut to a multiple of the 2 workers
    assert any(r["train/num_pairs"] > 0 and r["actor/dpo_loss"] > 0 for r in rows)
