"""``actor_rollout_ref.rollout.free_cache_engine`` in a training run: the engine holds no KV cache through the
old log-probs, the update and the weight sync, and the run trains exactly as one that keeps the cache."""

from __future__ import annotations

import torch

from hybridflow.config import PPOConfig, load_config
from hybridflow.rollout.native import live_engines
from hybridflow.trainer.main_ppo import run_ppo
from hybridflow.trainer.tracking import metrics as tracking_metrics
from tests.trainer.ppo_fixtures import base_overrides
from tests.trainer.test_ppo_e2e import merged_weights, read_metrics


class HeldKV:
    """A phase observer: the most KV cache bytes the run's own native engines held during each phase (their high-water
    marks, reset as a phase starts)."""

    def __init__(self, engines_before: set[int]):
        self.before, self.held = engines_before, {}

    def engines(self):
        return [engine for engine in live_engines() if id(engine) not in self.before]

    def enter(self, name: str) -> None:
        for engine in self.engines():
            engine.reset_kv_high_water()

    def exit(self, name: str) -> None:
        held = sum(engine.kv_high_water for engine in self.engines())
        self.held[name] = max(self.held.get(name, 0), held)


def run(tmp_path, model_dir: str, *, free: bool) -> tuple[list[dict], dict, dict[str, int]]:
    """Two GRPO steps (KL loss, so the reference runs); the rows, the step-2 actor weights, the KV bytes per phase."""
    root = tmp_path / ("free" if free else "kept")
    overrides = base_overrides(root, model_dir, steps=2)
    observer = HeldKV({id(engine) for engine in live_engines()})
    tracking_metrics.PHASE_OBSERVERS.append(observer)
    try:
        run_ppo(load_config(PPOConfig, overrides + [f"actor_rollout_ref.rollout.free_cache_engine={free}",
                                                    "actor_rollout_ref.actor.use_kl_loss=True",
                                                    "trainer.save_freq=2", "trainer.logger=[file]"]))
    finally:
        tracking_metrics.PHASE_OBSERVERS.remove(observer)
    weights = merged_weights(root / "ckpt" / "global_step_2" / "actor", root / "merged")
    return read_metrics(root), weights, observer.held


def test_freeing_the_kv_cache_between_rollouts_trains_bit_for_bit_as_keeping_it(tmp_path, tiny_model_dir):
    freed_rows, freed_weights, freed_held = run(tmp_path, tiny_model_dir, free=True)
    kept_rows, kept_weights, kept_held = run(tmp_path, tiny_model_dir, free=False)
    # the release took effect: nothing held through the phases after the rollout, and it was held when kept
    for phase in ("old_log_prob", "ref", "update_actor", "sync_weights"):
        assert freed_held[phase] == 0, phase
        assert kept_held[phase] > 0, phase
    assert freed_held["gen"] > 0
    for freed, kept in zip(freed_rows, kept_rows, strict=True):
        trained = {k: v for k, v in kept.items() if not k.startswith(("timing_s/", "perf/"))}
        assert {k: freed.get(k) for k in trained} == trained
    assert freed_weights.keys() == kept_weights.keys()
    assert all(torch.equal(freed_weights[k], kept_weights[k]) for k in kept_weights)
