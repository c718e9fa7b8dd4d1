"""The asynchronous trainers with ``rollout.name=vllm`` on a real vLLM (``make test-vllm``).

The rollouter thread generates on vLLM while the trainer updates, and a weight sync lands between two generates.
Each trained batch carries the weight version that generated it; the test keeps the actor's weights of every
version (version 0 at the start, version v right after the v-th sync) and recomputes, with an fp32 HF forward of
that version's weights, the log-probs of the tokens vLLM sampled: they agree within 1e-4 (vLLM's CPU fp32 kernels;
~1e-6 seen) for every batch, the stale ones included, so vLLM sampled each batch with exactly the weights it was
tagged with. An lr=3e-3 update moves them far past 1e-4 (with the sync's load skipped this test fails there), so
a sync that did not reach vLLM, or reached it a version late or early, fails here.
"""

import copy

import pytest
import torch

from hybridflow.config import PPOConfig, load_config
from hybridflow.models.logprob import compute_log_probs
from hybridflow.trainer.loop.async_source import async_training_steps
from hybridflow.trainer.main_fully_async import async_parts
from hybridflow.trainer.roles.assembly import build_loop
from tests.trainer.ppo_fixtures import base_overrides, hold_batch_2_until_the_sync
from tests.trainer.test_vllm_ppo import ON_VLLM, wide_model_dir  # noqa: F401 (the fixture)

pytestmark = pytest.mark.vllm

LOGPROB_TOL = 1e-4
LEARN_DIGITS = ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.rollout.n=8",
                "actor_rollout_ref.actor.optim.lr=3e-3"]


def actor_model(loop):
    return loop.w.actor.backend.worker.actor.model  # the local backend's rank-0 worker


class VersionRecorder:
    """The actor's weights at every weight version, and every trained batch with the version that generated it."""

    def __init__(self, loop):
        self.model = actor_model(loop)
        self.weights = [self.snapshot()]  # version 0: what vLLM started from
        self.trained: list[tuple[int, int, object]] = []  # (step, version, batch)
        source = loop.parts.source
        source.sync.on_new_version.append(lambda: self.weights.append(self.snapshot()))
        after_step = source.after_step

        def recording(rollout):
            for item in source.taken:
                self.trained.append((len(self.trained) + 1, item.version, item.batch))
            return after_step(rollout)

        source.after_step = recording

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {name: tensor.detach().float().clone() for name, tensor in self.model.state_dict().items()}

    def logprob_gaps(self, version: int, batch) -> torch.Tensor:
        """|vLLM's log-prob - an fp32 forward's with version ``version``'s weights| ``[B, T]`` (0 off the response)."""
        model = copy.deepcopy(self.model).float()
        model.load_state_dict(self.weights[version])
        with torch.no_grad():
            ours = compute_log_probs(model, input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                     position_ids=batch["position_ids"],
                                     response_length=batch["responses"].shape[1])[0]
        return (ours - batch["rollout_log_probs"]).abs() * batch["response_mask"]

    def largest_logprob_gap(self, version: int, batch) -> float:
        """max |vLLM's log-prob - an fp32 forward's with version ``version``'s weights| over the response tokens."""
        return self.logprob_gaps(version, batch).max().item()


@pytest.mark.parametrize("mode", [
    ["async_training.staleness_threshold=1", "async_training.trigger_parameter_sync_step=1"],  # one-step-off
    ["async_training.staleness_threshold=1", "async_training.trigger_parameter_sync_step=2"],  # fully async
], ids=["one_step_off", "fully_async_sync_every_2"])
def test_async_grpo_learns_on_vllm_and_each_batch_was_sampled_with_its_version(tmp_path, wide_model_dir, mode):
    """verl's one-step-off and fully async recipes on vLLM: the digits task is learnt (the reward rises past 0.8
    from below 0.5) while batches are trained a version after the weights that sampled them, and vLLM sampled
    every batch with its version's weights (see the module docstring)."""
    cfg = load_config(PPOConfig, base_overrides(tmp_path, wide_model_dir, steps=60) + ON_VLLM + LEARN_DIGITS + mode
                      + ["actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32"])
    loop = build_loop(cfg, parts=async_parts, count_steps=async_training_steps)
    recorder = VersionRecorder(loop)
    try:
        loop.fit()
    finally:
        loop.close()
    every = cfg.async_training.trigger_parameter_sync_step
    stale = [(step, version) for step, version, _ in recorder.trained if version < (step - 1) // every]
    assert len(recorder.trained) == 60 and len(stale) >= 30, stale  # mostly trained a version late
    gaps = [recorder.largest_logprob_gap(version, batch) for _, version, batch in recorder.trained]
    print("log-prob gap per batch:", [f"{gap:.1e}" for gap in gaps])
    assert max(gaps) < LOGPROB_TOL, gaps
    rewards = [float(batch["token_level_scores"].sum(-1).mean()) for _, _, batch in recorder.trained]
    print("reward per step:", [round(r, 2) for r in rewards])
    assert sum(rewards[:3]) / 3 < 0.5 and sum(rewards[-3:]) / 3 > 0.8, rewards


def test_one_step_off_killed_after_step_2_resumes_bitwise_on_vllm(tmp_path, wide_model_dir):
    """SIGKILL once step 2's checkpoint is published (the batch generated during step 2, with step 1's weights, is
    in it); the resumed run's vLLM starts from the checkpoint's weights and trains that batch first: step 4's
    weights and every step's score equal the uninterrupted run's."""
    import json

    from tests.trainer.test_ppo_e2e import SLOW_REWARD, kill_after_step_2_and_resume

    reward = tmp_path / "slow_reward.py"
    reward.write_text(SLOW_REWARD)
    straight, resumed = kill_after_step_2_and_resume(tmp_path, lambda root: base_overrides(
        root, wide_model_dir, steps=4) + ON_VLLM + [f"custom_reward_function.path={reward}", "trainer.save_freq=2",
                                                   "data.shuffle=True"], module="hybridflow.trainer.main_one_step_off")

    def scores(root):
        lines = (root / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()
        return [(row["step"], row["critic/score/mean"]) for row in map(json.loads, lines)]

    assert [step for step, _ in scores(resumed)] == [1, 2, 3, 4]
    assert scores(straight) == scores(resumed)


def switch_points(first: torch.Tensor, last: torch.Tensor, length: int) -> range:
    """The tokens ``k`` where a row's log-probs may switch from its first version's (tokens < k, gaps ``first``) to
    its last version's (tokens >= k, gaps ``last``) within the tolerance; empty if there is none."""
    good_first, good_last = (first[:length] < LOGPROB_TOL).tolist(), (last[:length] < LOGPROB_TOL).tolist()
    k0 = next((i for i, ok in enumerate(good_first) if not ok), length)  # the first version's prefix ends by k0
    k1 = length - next((i for i, ok in enumerate(reversed(good_last)) if not ok), length)  # the last's from k1
    return range(k1, k0 + 1)


def test_fully_async_partial_rollout_on_vllm_continues_paused_rows_with_the_new_weights(tmp_path, wide_model_dir,
                                                                                        monkeypatch):
    """async_training.partial_rollout=True on vLLM (staleness 1, a sync every step). Batch 2's generate is held after
    2 vLLM steps until the sync asks for the engine, so the sync lands inside it: its rows still running are aborted
    and resubmitted with their tokens so far. Every prompt is trained once, and each row's vLLM log-probs are those
    of an fp32 HF forward of its first version's weights up to a token and of its last version's from there (within
    1e-4), the rows that spanned the sync switching after at least one token."""
    from hybridflow.rollout.vllm_partial import VLLMPartialSession

    cfg = load_config(PPOConfig, base_overrides(tmp_path, wide_model_dir, steps=4) + ON_VLLM + [
        "async_training.staleness_threshold=1", "async_training.partial_rollout=True",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32", "actor_rollout_ref.actor.optim.lr=3e-3"])
    loop = build_loop(cfg, parts=async_parts, count_steps=async_training_steps)
    recorder = VersionRecorder(loop)
    hold_batch_2_until_the_sync(monkeypatch, VLLMPartialSession, loop, timeout=600)
    try:
        loop.fit()
    finally:
        loop.close()
    n = cfg.actor_rollout_ref.rollout.n
    trained = sorted(row["index"] for _, _, batch in recorder.trained for row in batch["extra_info"][::n])
    assert trained == list(range(len(trained))) and len(recorder.trained) == 4
    switched = []
    for _, _, batch in recorder.trained:
        first, last = batch["rollout_first_version"], batch["rollout_last_version"]
        gaps = {v: recorder.logprob_gaps(v, batch) for v in set(first.tolist()) | set(last.tolist())}
        for row, length in enumerate(batch["response_mask"].sum(-1).tolist()):
            a, b = int(first[row]), int(last[row])
            ks = switch_points(gaps[a][row], gaps[b][row], length)
            assert len(ks), (row, a, b, gaps[a][row][:length], gaps[b][row][:length])
            if a != b:  # spanned a sync: at least one token of each version
                switched.append(ks)
                assert b == a + 1 and ks.start < length and ks.stop > 1, (ks, length, a, b)
    print("switch points of the rows that spanned a sync:", switched)
    assert switched  # the sync landed inside batch 2
