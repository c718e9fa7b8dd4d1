"""The async trainers: staleness 0 is main_ppo bit for bit; every prompt once; the staleness bound; IS weights;
checkpoint and resume (bitwise at staleness 0 after SIGKILL; no lost or repeated prompt when running ahead)."""

from __future__ import annotations

import pytest
import torch

from hybridflow.config import PPOConfig, load_config
from hybridflow.errors import HybridflowError
from hybridflow.trainer.loop.async_source import StalenessGate, async_training_steps
from hybridflow.trainer.loop.fit import Loop
from hybridflow.trainer.main_fully_async import async_parts
from hybridflow.trainer.main_ppo import ppo_parts
from hybridflow.trainer.roles.assembly import build_loop
from hybridflow.trainer.main_one_step_off import main as one_step_off_main
from tests.trainer.ppo_fixtures import base_overrides, hold_batch_2_until_the_sync
from tests.trainer.test_ppo_e2e import SLOW_REWARD, kill_after_step_2_and_resume


def actor_weights(trainer) -> dict[str, torch.Tensor]:
    model = trainer.w.actor.backend.worker.actor.model  # the local backend's rank-0 worker
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def build_async(cfg) -> Loop:
    return build_loop(cfg, parts=async_parts, count_steps=async_training_steps)


def record_training(trainer, record) -> None:
    """``record(batch)`` on each batch the update trains, before it trains (returns nothing)."""
    train = trainer.parts.update.train

    def recording(rollout, **kwargs):
        record(rollout.batch)
        return train(rollout, **kwargs)

    trainer.parts.update.train = recording


def trained_batches(trainer) -> list:
    """Run ``trainer`` to the end; the batches as the update trained them (after its rollout correction)."""
    seen, train = [], trainer.parts.update.train

    def recording(rollout, **kwargs):
        batch, updated = train(rollout, **kwargs)
        seen.append(batch)
        return batch, updated

    trainer.parts.update.train = recording
    trainer.fit()
    trainer.close()
    return seen


@pytest.mark.parametrize("threshold, per_sync, expected", [
    (0, 1, [1, 2, 3]),  # synchronous: batch k is generated after k syncs
    (1, 1, [2, 3, 4]),  # one step ahead
    (0.5, 4, [6, 10, 14]),  # (v + 1.5) * 4
    (0.1, 4, [4, 8, 12]),  # a fraction of a batch rounds down
])
def test_staleness_gate_by_hand(threshold, per_sync, expected):
    gate = StalenessGate(threshold, per_sync)
    assert [gate.allowed(version) for version in range(3)] == expected


def test_staleness_zero_equals_the_synchronous_loop_bitwise(tmp_path, tiny_model_dir):
    overrides = base_overrides(tmp_path / "sync", tiny_model_dir, steps=3)
    sync = build_loop(load_config(PPOConfig, overrides), parts=ppo_parts)
    sync_last = sync.fit()
    expected = actor_weights(sync)
    sync.close()
    trainer = build_async(load_config(PPOConfig, base_overrides(tmp_path / "async", tiny_model_dir, steps=3)
                                      + ["async_training.staleness_threshold=0"]))
    async_last = trainer.fit()
    got = actor_weights(trainer)
    trainer.close()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    assert async_last["critic/score/mean"] == sync_last["critic/score/mean"]
    assert async_last["fully_async/staleness/hist_0"] == 3


@pytest.mark.parametrize("threshold, trigger, require", [(1, 1, 1), (0.5, 2, 1), (1, 1, 2)])
def test_every_prompt_once_and_no_batch_older_than_the_threshold(tmp_path, tiny_model_dir, threshold, trigger,
                                                                 require):
    steps = 4 // require  # 16 rows / 4 prompts per batch: one epoch; require_batches batches per step
    cfg = load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir, steps=steps) + [
        f"async_training.staleness_threshold={threshold}", f"async_training.trigger_parameter_sync_step={trigger}",
        f"async_training.require_batches={require}"])
    trainer = build_async(cfg)
    source, sync = trainer.parts.source, trainer.parts.sync
    trained, queue_ages = [], []
    take = source.take

    def checked_take():
        with source.changed:
            queue_ages.extend(sync.version - item.version for item in source.queue)
        item = take()
        queue_ages.append(source.version_at_training(item) - item.version)
        return item

    def record(batch):
        assert len(batch) == require * 4 * cfg.actor_rollout_ref.rollout.n  # require_batches prompt batches
        trained.extend(row["index"] for row in batch["extra_info"][:: cfg.actor_rollout_ref.rollout.n])

    source.take = checked_take
    record_training(trainer, record)
    last = trainer.fit()
    trainer.close()
    assert sorted(trained) == list(range(16))
    assert max(queue_ages) <= 1 and min(queue_ages) >= 0
    assert max(queue_ages) == 1  # the rollouter did run ahead
    assert sum(v for k, v in last.items() if k.startswith("fully_async/staleness/hist_")) == steps * require


def test_importance_weights_correct_behaviour_to_proximal(tmp_path, tiny_model_dir):
    cfg = load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir, steps=3) + [
        "async_training.staleness_threshold=1", "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=2.0"])
    seen = trained_batches(build_async(cfg))
    for batch in seen:
        mask = batch["response_mask"].float()
        # truncated IS (verl's token level): min(exp(log pi_prox - log pi_behaviour), 2) on response tokens
        expected = torch.exp(batch["old_log_probs"] - batch["rollout_log_probs"]).clamp(max=2.0) * mask
        assert torch.allclose(batch["rollout_is_weights"] * mask, expected, atol=1e-6)
    # steps 2 and 3 were generated by weights one update older than the proximal ones: weights != 1
    mask = seen[-1]["response_mask"].float()
    assert not torch.allclose(seen[-1]["rollout_is_weights"] * mask, mask)


def test_behaviour_log_probs_as_the_old_policy(tmp_path, tiny_model_dir):
    cfg = load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir, steps=2) + [
        "async_training.staleness_threshold=1", "async_training.compute_prox_log_prob=False"])
    seen = trained_batches(build_async(cfg))
    assert all(torch.equal(b["old_log_probs"], b["rollout_log_probs"]) for b in seen)


@pytest.mark.parametrize("override, message", [
    (["async_training.require_batches=0"], "require_batches must be >= 1"),
    (["rollout.total_rollout_steps=1", "async_training.require_batches=2"],
     "total_rollout_steps=1 is smaller than async_training.require_batches=2: the trainer would run 0 steps"),
])
def test_unsupported_settings_are_one_clear_error(tmp_path, tiny_model_dir, override, message):
    with pytest.raises(HybridflowError, match=message):
        build_async(load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir) + override))


def test_one_step_off_entry_point_runs(tmp_path, tiny_model_dir):
    assert one_step_off_main(base_overrides(tmp_path, tiny_model_dir, steps=2)) == 0


# ---------------------------------------------------------------------------- checkpoint and resume
def test_resume_after_sigkill_at_staleness_zero_is_bitwise_equal(tmp_path, tiny_model_dir):
    reward = tmp_path / "slow_reward.py"
    reward.write_text(SLOW_REWARD)

    kill_after_step_2_and_resume(tmp_path, lambda root: base_overrides(root, tiny_model_dir, steps=4) + [
        f"custom_reward_function.path={reward}", "trainer.save_freq=2", "trainer.logger=[file]", "data.shuffle=True",
        "async_training.staleness_threshold=0"], module="hybridflow.trainer.main_fully_async")


def test_one_step_off_resume_after_sigkill_is_bitwise_equal(tmp_path, tiny_model_dir):
    """The batch generated during step 2 (with step 1's weights) is in the step-2 checkpoint, not
    regenerated after the resume with step 2's weights (which left max |delta| 3e-4 to 9e-4)."""
    reward = tmp_path / "slow_reward.py"
    reward.write_text(SLOW_REWARD)
    kill_after_step_2_and_resume(tmp_path, lambda root: base_overrides(root, tiny_model_dir, steps=4) + [
        f"custom_reward_function.path={reward}", "trainer.save_freq=2", "trainer.logger=[file]", "data.shuffle=True"],
        module="hybridflow.trainer.main_one_step_off")


def _recording(trainer, trained: list[int], n: int) -> None:
    record_training(trainer, lambda batch: trained.extend(row["index"] for row in batch["extra_info"][::n]))


def test_resume_while_running_ahead_trains_every_prompt_once(tmp_path, tiny_model_dir):
    """Staleness 1: at the interruption the rollouter holds a generated, untrained batch; the checkpoint
    stores it and the resumed run trains it first."""
    cfg = load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir, steps=4) + [
        "async_training.staleness_threshold=1", "trainer.save_freq=2", "data.shuffle=True"])
    n = cfg.actor_rollout_ref.rollout.n
    first, trained_first, queued_at_stop = build_async(cfg), [], []
    _recording(first, trained_first, n)
    train_step = first.train_step

    source = first.parts.source

    def stop_at_step_3(*, step):
        if step == 3:
            with source.changed:  # wait until the rollouter has run ahead: step 3's batch is generated
                source.changed.wait_for(lambda: source.queue)
                queued_at_stop.extend(source.queue)
            raise KeyboardInterrupt("stopped")
        return train_step(step=step)

    first.train_step = stop_at_step_3
    with pytest.raises(KeyboardInterrupt):
        first.fit()
    first.close()
    assert len(trained_first) == 8 and queued_at_stop  # 2 steps x 4 prompts trained; a batch was waiting
    resumed, trained_resumed = build_async(cfg), []
    _recording(resumed, trained_resumed, n)
    last = resumed.fit()
    resumed.close()
    assert sorted(trained_first + trained_resumed) == list(range(16))  # one epoch, each prompt once
    queued = [row["index"] for row in queued_at_stop[0].batch["extra_info"][::n]]
    assert trained_resumed[:4] == queued  # the stored batch is trained first
    assert sum(v for k, v in last.items() if k.startswith("fully_async/staleness/hist_")) == 4
    assert last["fully_async/count/current_param_version"] == 4


# ---------------------------------------------------------------------------- partial rollout
def test_partial_rollout_pauses_at_a_sync_and_trains_every_prompt_once(tmp_path, tiny_model_dir, monkeypatch):
    """Staleness 1: the second batch is generating while step 1 ends. Its generate is held after 2 decode steps
    until the weight sync asks for the engine, so the sync lands inside it: the responses still decoding
    continue with version 1 and every prompt is still trained once."""
    from hybridflow.rollout.streaming import StreamingSession

    cfg = load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir, steps=4) + [
        "async_training.staleness_threshold=1", "async_training.partial_rollout=True"])
    trainer, trained, spans = build_async(cfg), [], []
    n = cfg.actor_rollout_ref.rollout.n
    hold_batch_2_until_the_sync(monkeypatch, StreamingSession, trainer, timeout=60)

    def record(batch):
        trained.extend(row["index"] for row in batch["extra_info"][::n])
        spans.append((batch["rollout_first_version"].tolist(), batch["rollout_last_version"].tolist()))

    record_training(trainer, record)
    last = trainer.fit()
    trainer.close()
    assert sorted(trained) == list(range(16))
    first, last_versions = spans[1]  # batch 2 started with version 0 and was finished by version 1
    assert set(first) == {0} and 1 in last_versions
    assert all(f <= l for f, l in zip(*spans[1]))
    assert last["fully_async/count/current_param_version"] == 4
    assert torch.isfinite(torch.tensor(last["actor/pg_loss"]))  # it trained (at temperature 0 every loss was NaN)


def test_partial_rollout_where_it_cannot_act_is_refused_before_loading(tmp_path, tiny_model_dir, monkeypatch):
    """Issue 50: the HF engine, native multi-turn, or Ray without a rollout pool of its own cannot pause
    mid-generate: async_training.partial_rollout=True there is one line before any model loads (issue 37 made it a
    warning; only vLLM / SGLang, which verl's fully async YAML pairs with it, keep the warning: test_verl09_keys)."""
    import hybridflow.trainer.main_ppo as main_ppo
    from hybridflow.trainer.main_fully_async import async_preflight

    monkeypatch.setattr(main_ppo, "build_loop", lambda cfg, **_: pytest.fail("loaded before checking"))
    refused = {"actor_rollout_ref.rollout.name=hf": "the hf engine cannot pause",
               "actor_rollout_ref.rollout.multi_turn.enable=True": "the native engine in multi-turn cannot pause",
               "trainer.backend=ray": "on Ray only a rollout pool of its own"}
    for override, reason in refused.items():
        cfg = load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir) + [
            "async_training.partial_rollout=True", override])
        with pytest.raises(HybridflowError) as err:
            async_preflight(cfg)
        assert str(err.value).startswith(f"async_training.partial_rollout=True cannot act here ({reason}")
        assert "set async_training.partial_rollout=False" in str(err.value) and "\n" not in str(err.value)
    async_preflight(load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir) + [
        "async_training.partial_rollout=True"]))  # native single-turn, local: it acts
