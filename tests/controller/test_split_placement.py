"""Split placement: the rollout engine in a Ray process of its own, the actor in another (verl's one-step-off /
fully async layout). The only path from the trained weights to the engine is the sync through the driver; at
staleness 0 every batch is generated after the previous update's sync, so the engine's sampling log-probs
must equal the trainer's recomputation (``training/rollout_log_probs_diff_mean``: ~1e-7 when the weights
arrive, 0.16 at lr 1e-2 when they do not)."""

from __future__ import annotations

import functools
import json
import sys
import threading
import time

import pytest
import torch

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")

from hybridflow.config import PPOConfig, load_config  # noqa: E402
from hybridflow.controller.dispatch import Mode, dispatch  # noqa: E402
from hybridflow.controller.resources import ResourcePool  # noqa: E402
from hybridflow.controller.worker_group import build_worker_group  # noqa: E402
from hybridflow.data.batch import Batch  # noqa: E402
from hybridflow.data.padding import pad_sequences, position_ids_from_mask  # noqa: E402
from hybridflow.models import load_causal_lm  # noqa: E402
from hybridflow.rollout import SamplingParams  # noqa: E402
from hybridflow.trainer.main_fully_async import main as fully_async_main  # noqa: E402
from hybridflow.trainer.roles.builders import build_rollout_worker, policy_tokenizer  # noqa: E402
from hybridflow.trainer.roles.groups import RolloutGroupWorker  # noqa: E402
from tests.controller.test_ppo_ray import ray_session  # noqa: E402,F401 (module-scoped, autouse)
from tests.trainer.ppo_fixtures import base_overrides  # noqa: E402

SPLIT = ["trainer.backend=ray", "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1",
         "ray_kwargs.cpus_per_worker=0.5", "ray_kwargs.ray_init.num_cpus=2"]


@pytest.mark.parametrize("partial", [False, True])
def test_the_rollout_process_generates_with_the_trained_weights(tmp_path, tiny_model_dir, partial):
    """``partial``: the rollout actors run two calls at once and the syncs carry weight versions; at staleness 0
    no generate is running at a sync, so the engine must still sample with exactly the trained weights."""
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=3) + SPLIT + [
        "actor_rollout_ref.actor.optim.lr=1e-2", "async_training.staleness_threshold=0", "trainer.logger=[file]",
        f"async_training.partial_rollout={partial}"]
    assert fully_async_main(overrides) == 0
    rows = [json.loads(x) for x in (tmp_path / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["actor/grad_norm"] > 0, row["step"]  # the policy moves: a stale engine would show
        assert row["training/rollout_log_probs_diff_mean"] < 1e-4, row["step"]
        assert ("fully_async/partial/resumed_samples" in row) == partial



# ---------------------------------------------------------------------------- partial rollouts over Ray
class HeldRolloutWorker(RolloutGroupWorker):
    """The split pool's worker, whose partial generate stops after 2 decode steps until a weight sync asks for
    the engine (so the sync lands inside it, deterministically), and says when it got there."""

    def __init__(self, *, rollout, wait_s: float):
        super().__init__(rollout=rollout)
        self.reached = threading.Event()
        self._hold_streaming_sessions(wait_s)

    def _hold_streaming_sessions(self, wait_s: float) -> None:
        from hybridflow.rollout.streaming import StreamingSession

        step, handover, steps = StreamingSession.step, self.rollout.handover, [0]

        def held_step(session):  # this actor process only
            steps[0] += 1
            if steps[0] == 2:
                self.reached.set()
                with handover.cond:
                    handover.cond.wait_for(handover.requested, timeout=wait_s)
            return step(session)

        StreamingSession.step = held_step

    @dispatch(Mode.ONE_TO_ALL, collect="first")
    def wait_until_held(self, timeout_s: float) -> bool:
        return self.reached.wait(timeout_s)


def held_rollout_worker(dp, *, cfg, wait_s: float) -> HeldRolloutWorker:
    return HeldRolloutWorker(rollout=build_rollout_worker(dp, cfg=cfg).rollout, wait_s=wait_s)


def _prompt_batch(tokenizer) -> Batch:
    ids = [list(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                               return_dict=True)["input_ids"]) for q in ("1+1?", "two plus 3?")]
    mask = pad_sequences([[1] * len(x) for x in ids], pad_value=0, side="left")
    batch = Batch({"input_ids": pad_sequences(ids, pad_value=tokenizer.pad_token_id, side="left"),
                   "attention_mask": mask, "position_ids": position_ids_from_mask(mask)})
    batch["raw_prompt_ids"] = ids
    return batch


def test_a_weight_sync_pauses_a_generate_running_in_the_rollout_actor(tmp_path, tiny_model_dir):
    """Split placement with partial rollouts: the rollout actor runs the weight sync in a second thread while
    its generate is paused between two decode steps; the sequences then finish with the new version."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test-only worker class
    cfg = load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir) + SPLIT[:-1] + [
        "async_training.partial_rollout=True"])
    group = build_worker_group(functools.partial(held_rollout_worker, cfg=cfg, wait_s=30.0),
                               worker_cls=HeldRolloutWorker, backend="ray", name="rollout", concurrency=2,
                               pool=ResourcePool(procs_per_node=1, cpus_per_proc=1.0), ray_num_cpus=2)
    other = {name: p.detach() + 0.05 * torch.randn_like(p) for name, p in load_causal_lm(tiny_model_dir).named_parameters()}
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=True)
    results, started = [], time.monotonic()
    try:
        generate = threading.Thread(target=lambda: results.append(
            group.generate(_prompt_batch(policy_tokenizer(cfg)), params, True)))
        generate.start()
        assert group.wait_until_held(60.0)
        group.load_weights(other, 1)
        generate.join(timeout=120)
    finally:
        group.shutdown()
    assert time.monotonic() - started < 30, "the sync waited for the generate instead of pausing it"
    (batch,) = results
    assert batch["rollout_first_version"].tolist() == [0, 0]
    assert batch["rollout_last_version"].tolist() == [1, 1]
