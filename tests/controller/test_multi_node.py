"""Multi-node placement on a local Ray cluster of 2 logical nodes (``ray.cluster_utils.Cluster``:
two raylets on this machine, 1 CPU each).

- A tiny GRPO run (sampling on) over 2 nodes x 1 worker equals the same run over 1 node x 2
  workers: the ranks, their prompt shards and their seeds are the same, only the placement
  and the gloo links differ. Tolerance fp32, atol 1e-5 on per-step losses and final weights.
- Ulysses over the two nodes (dp 1 x sp 2, padding-free, greedy) against one local process: per-step
  with a reward that leaves a real policy gradient and two mini-batches per step, per-step losses and
  final weights match at 1e-5 (this caught the trainer balancing rows for 2 ranks of a dp = 1 group).
- Removing one node mid-run gives the error that names the rank, its node and the step
  (seen: "training step 2: worker group 'actor_rollout_ref': rank 0 (pid ... on ..., node 0 of
  2, Ray node id ...) died during generate(); ...");
  rerunning the same command on a repaired cluster resumes from the last checkpoint and ends
  with the weights of the uninterrupted run.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

pytestmark = [pytest.mark.ray, pytest.mark.slow]
ray = pytest.importorskip("ray")

from hybridflow.config import PPOConfig, load_config  # noqa: E402
from hybridflow.errors import WorkerDiedError  # noqa: E402
from hybridflow.trainer.main_ppo import run_ppo  # noqa: E402
from tests.controller.test_ppo_ray import ATOL, assert_same_weights, losses, weights  # noqa: E402
from tests.trainer.ppo_fixtures import REWARD_FILE, base_overrides  # noqa: E402

STEPS = 3


@pytest.fixture(scope="module")
def cluster():
    import os

    from ray.cluster_utils import Cluster

    os.environ["RAY_AUTH_MODE"] = "disabled"
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def overrides(root, model_dir, cluster, *, nnodes: int, per_node: int, steps: int = STEPS, extra=()) -> list[str]:
    return base_overrides(root, model_dir, steps=steps) + [
        "actor_rollout_ref.actor.use_kl_loss=True", "trainer.save_freq=1", "trainer.logger=[file]",
        "trainer.backend=ray", f"ray_kwargs.ray_init.address={cluster.address}", "ray_kwargs.cpus_per_worker=0.5",
        f"trainer.nnodes={nnodes}", f"trainer.n_gpus_per_node={per_node}", *extra]


def test_two_nodes_equal_one_node_and_a_lost_node_resumes(tmp_path, tiny_model_dir, cluster):
    one_node, two_nodes, broken = tmp_path / "one_node", tmp_path / "two_nodes", tmp_path / "broken"
    run_ppo(load_config(PPOConfig, overrides(one_node, tiny_model_dir, cluster, nnodes=1, per_node=2)))
    run_ppo(load_config(PPOConfig, overrides(two_nodes, tiny_model_dir, cluster, nnodes=2, per_node=1)))
    assert losses(two_nodes) == pytest.approx(losses(one_node), abs=ATOL)
    assert len(losses(one_node)) == STEPS and len(set(losses(one_node))) > 1  # sampled, learning
    assert_same_weights(weights(two_nodes, STEPS), weights(one_node, STEPS))

    # Lose the second node once step 1's checkpoint is published: its rank dies mid-run.
    worker_node = [node for node in cluster.worker_nodes][0]
    tracker = broken / "ckpt" / "latest_checkpointed_iteration.txt"

    def remove_when_step_1_is_saved():
        while not tracker.exists():
            time.sleep(0.05)
        cluster.remove_node(worker_node, allow_graceful=False)

    killer = threading.Thread(target=remove_when_step_1_is_saved, daemon=True)
    killer.start()
    # The same scores, slower: each step then outlasts the node's removal, so the run cannot finish first.
    slow_reward = broken / "slow_reward.py"
    broken.mkdir(parents=True, exist_ok=True)
    slow_reward.write_text(REWARD_FILE + "\nimport time\n_score = compute_score\n\n"
                           "def compute_score(*args, **kwargs):\n    time.sleep(0.5)\n    return _score(*args, **kwargs)\n")
    args = overrides(broken, tiny_model_dir, cluster, nnodes=2, per_node=1,
                     extra=[f"custom_reward_function.path={slow_reward}"])
    with pytest.raises(WorkerDiedError) as err:
        run_ppo(load_config(PPOConfig, args))
    killer.join()
    message = str(err.value)
    # Which rank sits on the removed node is Ray's choice (STRICT_SPREAD orders nothing): the message names
    # the rank, its node by bundle index and Ray node id, and the step.
    assert "training step " in message and "died during" in message, message
    assert f"Ray node id {worker_node.node_id[:12]}" in message and " of 2, " in message, message
    assert "rerun the same command to resume" in message

    cluster.add_node(num_cpus=1)  # the node comes back (or a replacement joins)
    cluster.wait_for_nodes()
    run_ppo(load_config(PPOConfig, args))
    assert_same_weights(weights(broken, STEPS), weights(two_nodes, STEPS))


def test_sequence_parallel_over_two_nodes_equals_one_process(tmp_path, tiny_model_dir, cluster):
    # Greedy single samples (REINFORCE++ advantages): both runs generate the same responses, so only the
    # sequence-parallel forward and backward can differ. The digits reward scores every greedy response of
    # the tiny model 0, which leaves no policy gradient, only the KL term between a policy and its identical
    # reference: a gradient at rounding level, whose signs AdamW (m / sqrt(v)) turns into +-lr updates, so
    # two summation orders then disagree by ~lr on most weights. A reward that varies with the prompt's answer
    # and the response gives a real gradient, and the comparison then tests the code.
    reward = tmp_path / "varied_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return (sum(map(ord, str(ground_truth))) + sum(map(ord, solution_str))) % 5 / 4\n")
    packed = ["actor_rollout_ref.model.use_remove_padding=True", "actor_rollout_ref.rollout.n=1",
              "actor_rollout_ref.rollout.do_sample=False", "algorithm.adv_estimator=reinforce_plus_plus",
              f"custom_reward_function.path={reward}"]
    local = base_overrides(tmp_path / "local", tiny_model_dir, steps=2) + [
        "actor_rollout_ref.actor.use_kl_loss=True", "trainer.save_freq=2", "trainer.logger=[file]", *packed]
    run_ppo(load_config(PPOConfig, local))
    spread = overrides(tmp_path / "sp", tiny_model_dir, cluster, nnodes=2, per_node=1, steps=2, extra=[
        *packed, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "trainer.save_freq=2"])
    run_ppo(load_config(PPOConfig, spread))
    assert losses(tmp_path / "sp") == pytest.approx(losses(tmp_path / "local"), abs=ATOL)
    assert all(loss != 0 for loss in losses(tmp_path / "local"))  # a real policy gradient in every step
    # Step 2's loss already depends on step 1's update.
    assert_same_weights(weights(tmp_path / "sp", 2), weights(tmp_path / "local", 2))
