"""The Ray backend at 2 workers (FSDP2 over gloo) against the local backend at 1.

Equivalence tolerance: fp32, atol 1e-5 on log-probs, losses and every weight after two
optimizer steps (the only differences are reduction orders of the sharded sums).
"""

from __future__ import annotations

import functools
import os
import sys
import threading

import pytest
import torch

pytestmark = pytest.mark.ray

ray = pytest.importorskip("ray")

from hybridflow.config import PPOConfig, load_config  # noqa: E402
from hybridflow.trainer.roles.builders import build_hybrid_engine  # noqa: E402
from hybridflow.controller.dispatch import Mode, dispatch  # noqa: E402
from hybridflow.controller.resources import ResourcePool, check_reachable  # noqa: E402
from hybridflow.trainer.roles.groups import HybridEngineWorker  # noqa: E402
from hybridflow.controller.worker_group import build_worker_group  # noqa: E402
from hybridflow.data.batch import Batch  # noqa: E402
from hybridflow.errors import ConfigError  # noqa: E402
from tests.adamw_weights import assert_adamw_weights_close  # noqa: E402

ATOL = 1e-5
ROWS, PROMPT, RESPONSE = 8, 5, 6


@pytest.fixture(scope="module")
def ray_cluster():
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # test-only worker classes
    yield
    ray.shutdown()


def ppo_config(model_dir: str) -> PPOConfig:
    # One mini-batch per step (ppo_mini_batch_size * n = all 8 rows): DP ranks then see the same
    # optimizer batches as one process; micro-batches of 2 rows exercise accumulation.
    return load_config(PPOConfig, [
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", f"data.max_response_length={RESPONSE}",
    ])


def rollout_batch(seed: int = 0) -> Batch:
    """8 left-padded prompts + right-padded responses with ragged lengths, and fixed advantages."""
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, 200, (ROWS, PROMPT), generator=gen)
    responses = torch.randint(3, 200, (ROWS, RESPONSE), generator=gen)
    prompt_mask = (torch.arange(PROMPT) >= torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]).unsqueeze(1)).long()
    response_mask = (torch.arange(RESPONSE) < torch.tensor([6, 3, 5, 1, 6, 2, 4, 6]).unsqueeze(1)).long()
    attention = torch.cat([prompt_mask, response_mask], dim=1)
    return Batch.from_dict(tensors={
        "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention, "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "response_mask": response_mask, "advantages": torch.randn(ROWS, 1, generator=gen).expand(ROWS, RESPONSE) * response_mask,
    })


LOSS_KEYS = ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm")


def two_steps(group) -> tuple[list[list[float]], list[torch.Tensor], dict]:
    batch, losses, old = rollout_batch(), [], []
    for step in (1, 2):
        batch["old_log_probs"], _ = group.compute_log_prob(batch, temperature=1.0)
        batch["ref_log_probs"] = group.compute_ref_log_prob(batch, temperature=1.0)
        old.append(batch["old_log_probs"])
        metrics = group.update_policy(batch, temperature=1.0, step=step)
        losses.append([metrics[key] for key in LOSS_KEYS])
    return losses, old, group.full_weights()


def groups(model_dir, local_only=False):
    factory = functools.partial(build_hybrid_engine, cfg=ppo_config(model_dir), total_steps=2, with_rollout=False)
    local = build_worker_group(factory, worker_cls=HybridEngineWorker, backend="local", name="actor")
    if local_only:
        return local
    remote = build_worker_group(factory, worker_cls=HybridEngineWorker, backend="ray", name="actor",
                                pool=ResourcePool(procs_per_node=2, cpus_per_proc=1.0))
    return local, remote


@pytest.mark.slow  # ~35 s: two model loads per rank and FSDP over gloo on 2 shared cores
def test_two_ray_workers_train_like_one_local_process(ray_cluster, tiny_model_dir, tmp_path):
    local, remote = groups(tiny_model_dir)
    local_losses, local_old, local_weights = two_steps(local)
    remote_losses, remote_old, remote_weights = two_steps(remote)
    assert remote.world_size == 2
    for a, b in zip(local_old, remote_old):
        torch.testing.assert_close(b, a, atol=ATOL, rtol=0)
    for local_step, remote_step in zip(local_losses, remote_losses):
        assert remote_step == pytest.approx(local_step, abs=ATOL)
    # Not vacuous: step 1 moved the policy away from the reference (KL > 0, new old-log-probs).
    assert local_losses[0][1] == pytest.approx(0.0, abs=1e-7) and local_losses[1][1] > 1e-4
    assert (local_old[1] - local_old[0]).abs().max() > 100 * ATOL
    # AdamW carries the reduction order's rounding of near-zero gradients up to lr/eps further (tests/adamw_weights.py)
    assert_adamw_weights_close(remote_weights, local_weights, atol=ATOL, lr=1e-2, steps=2)

    # Resume across world sizes: 2 ranks -> 1 process, and 1 process -> 2 ranks.
    remote.save_checkpoint(str(tmp_path / "from2"))
    fresh_local = groups(tiny_model_dir, local_only=True)
    fresh_local.load_checkpoint(str(tmp_path / "from2"))
    for name, tensor in fresh_local.full_weights().items():
        torch.testing.assert_close(tensor, remote_weights[name], atol=0, rtol=0, msg=name)
    local.save_checkpoint(str(tmp_path / "from1"))
    remote.load_checkpoint(str(tmp_path / "from1"))
    for name, tensor in remote.full_weights().items():
        torch.testing.assert_close(tensor, local_weights[name], atol=0, rtol=0, msg=name)
    # The optimizer state came along: one more identical step on both stays equal.
    batch = rollout_batch(seed=1)
    batch["old_log_probs"], _ = local.compute_log_prob(batch, temperature=1.0)
    batch["ref_log_probs"] = local.compute_ref_log_prob(batch, temperature=1.0)
    assert remote.update_policy(batch, temperature=1.0, step=3)["actor/kl_loss"] == pytest.approx(
        local.update_policy(batch, temperature=1.0, step=3)["actor/kl_loss"], abs=ATOL)
    remote.shutdown()


class Crasher:
    """A worker whose rank ``rank`` exits without a word, as an OOM-killed process would."""

    def __init__(self, dp):
        self.dp = dp

    @dispatch(Mode.ONE_TO_ALL)
    def step(self, *, crash_rank: int) -> int:
        if self.dp.rank == crash_rank:
            os._exit(1)
        return self.dp.rank

    @dispatch(Mode.ONE_TO_ALL)
    def fail(self) -> None:
        raise ConfigError("bad key x; use y")


def test_dead_worker_is_named_with_rank_and_method(ray_cluster):
    from hybridflow.controller.ray_backend import WorkerDiedError

    group = build_worker_group(Crasher, worker_cls=Crasher, backend="ray", name="crasher",
                               pool=ResourcePool(procs_per_node=2, cpus_per_proc=0.5))
    assert group.step(crash_rank=-1) == [0, 1]
    with pytest.raises(WorkerDiedError, match=r"'crasher': rank 1 \(pid \d+ on .*\) died during step\(\)"):
        group.step(crash_rank=1)


def test_user_error_in_a_rank_comes_back_as_itself(ray_cluster):
    group = build_worker_group(Crasher, worker_cls=Crasher, backend="ray", name="crasher",
                               pool=ResourcePool(procs_per_node=2, cpus_per_proc=0.5))
    with pytest.raises(ConfigError, match="bad key x; use y"):
        group.fail()


def test_cluster_too_small_says_what_it_has_and_what_was_asked(ray_cluster):
    with pytest.raises(ConfigError, match=r"has CPU=2 but 8 workers .* ask for CPU=8"):
        build_worker_group(Crasher, worker_cls=Crasher, backend="ray",
                           pool=ResourcePool(nnodes=2, procs_per_node=4, cpus_per_proc=1.0))


def test_unreachable_cluster_fails_fast_with_the_fix():
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ConfigError, match="cannot reach the Ray cluster.*ray start --head"):
        check_reachable(f"127.0.0.1:{port}", timeout_s=2.0)


class WeightSource:
    """Each rank holds different 'weights': what comes back shows whose copy travelled."""

    def __init__(self, dp):
        self.dp = dp

    @dispatch(Mode.ONE_TO_ALL, collect="first")
    def weights(self) -> dict:
        if self.dp.rank > 0:  # cannot be pickled: the other ranks' copies must stay where they were made
            return {"w": torch.full((4,), float(self.dp.rank + 1)), "lock": threading.Lock()}
        return {"w": torch.full((4,), 1.0)}

    @dispatch(Mode.ONE_TO_ALL)
    def ranks(self) -> int:
        return self.dp.rank


class WeightSink:
    def __init__(self, dp):
        self.dp = dp

    @dispatch(Mode.ONE_TO_ALL)
    def load(self, named) -> tuple[str, float]:
        return type(named).__name__, float(named["w"].sum())


def test_a_kept_result_goes_from_group_to_group_without_the_driver_holding_it(ray_cluster):
    """Split placement's weight sync: training rank 0's result stays in the object store, the driver holds a
    reference only, every rank of the other group reads rank 0's copy itself, and rank 1's copy goes nowhere."""
    pool = ResourcePool(procs_per_node=2, cpus_per_proc=0.5)
    source = build_worker_group(WeightSource, worker_cls=WeightSource, backend="ray", name="source", pool=pool)
    sink = build_worker_group(WeightSink, worker_cls=WeightSink, backend="ray", name="sink", pool=pool)
    try:
        handle = source.call_by_reference("weights")
        assert isinstance(handle, ray.ObjectRef)
        assert sink.load(handle) == [("dict", 4.0), ("dict", 4.0)]  # rank 0's weights (1.0 x 4) on both ranks
        with pytest.raises(ValueError, match="collected as 'list'.*collect='first'"):
            source.call_by_reference("ranks")
    finally:
        source.shutdown()
        sink.shutdown()


def test_in_one_process_the_kept_result_is_the_value_itself():
    source = build_worker_group(WeightSource, worker_cls=WeightSource, backend="local")
    sink = build_worker_group(WeightSink, worker_cls=WeightSink, backend="local")
    handle = source.call_by_reference("weights")
    assert torch.equal(handle["w"], torch.ones(4))
    assert sink.load(handle) == [("dict", 4.0)]


def test_packed_tensors_come_back_equal_in_dtype_shape_and_value():
    from hybridflow.controller.ray_backend import PackedTensor, pack_tensors, unpack_tensors

    weights = {"bf16": torch.randn(3, 5).to(torch.bfloat16), "scalar": torch.tensor(2.5),
               "strided": torch.arange(12.0).reshape(3, 4).t(), "flag": torch.tensor([True, False])}
    packed = pack_tensors(weights)
    assert all(isinstance(p, PackedTensor) for p in packed.values())
    back = unpack_tensors(packed)
    for name, tensor in weights.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
    assert pack_tensors({"mixed": torch.ones(1), "other": 1}) == {"mixed": torch.ones(1), "other": 1}
