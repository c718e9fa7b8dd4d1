"""Shared pieces of the PPO end-to-end tests: a tiny model, a parquet task, a reward file."""

from __future__ import annotations

import os

import pandas as pd

REWARD_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Fraction of the response's characters that are digits: dense, learnable, checkable."""
    text = solution_str.strip()
    if not text:
        return 0.0
    return {"score": sum(ch.isdigit() for ch in text) / len(text), "length": float(len(text))}
'''


def write_task(directory: str, *, rows: int = 16) -> tuple[str, str]:
    """A verl-schema parquet pair (train, test) of short arithmetic prompts."""
    os.makedirs(directory, exist_ok=True)
    records = [
        {
            "prompt": [{"role": "user", "content": f"What is {i} + {i % 7}?"}],
            "data_source": "digits",
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i + i % 7)},
            "extra_info": {"index": i, "split": "train"},
        }
        for i in range(rows)
    ]
    train, test = os.path.join(directory, "train.parquet"), os.path.join(directory, "test.parquet")
    pd.DataFrame(records).to_parquet(train)
    pd.DataFrame(records[:4]).to_parquet(test)
    return train, test


def write_reward(directory: str) -> str:
    path = os.path.join(directory, "digits_reward.py")
    with open(path, "w") as fh:
        fh.write(REWARD_FILE)
    return path


def base_overrides(tmp_path, model_dir: str, *, estimator: str = "grpo", steps: int = 2) -> list[str]:
    train, test = write_task(str(tmp_path / "data"))
    reward = write_reward(str(tmp_path))
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={train}",
        f"data.val_files={test}",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.n=2",
        "critic.optim.lr=1e-3",
        f"algorithm.adv_estimator={estimator}",
        f"custom_reward_function.path={reward}",
        "reward_model.timeout_s=null",
        f"trainer.total_training_steps={steps}",
        "trainer.logger=[console,file]",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    ]


def hold_batch_2_until_the_sync(monkeypatch, session_class, loop, *, timeout: float) -> None:
    """Hold batch 2's generate after its second ``session_class.step`` until the weight sync asks for the engine (the
    rollout's handover), so that the sync lands inside it (a partial rollout's pause). Counted on the session itself:
    an id() is reused once batch 1's session is freed, and batch 2's would then never reach step 2 (a flake this had:
    the sync then landed after batch 2, not inside it)."""
    handover, step = loop.w.rollout.backend.worker.rollout.handover, session_class.step  # the engine's, local rank

    def held_step(session):
        session.steps_taken = getattr(session, "steps_taken", 0) + 1
        if loop.parts.source.generated == 1 and session.steps_taken == 2:  # batch 2, mid-generation
            with handover.cond:
                assert handover.cond.wait_for(handover.requested, timeout=timeout)
        return step(session)

    monkeypatch.setattr(session_class, "step", held_step)
