"""GRPO with ``rollout.name=vllm`` on a real vLLM (``make test-vllm``; ``make vllm-smoke`` runs the smoke alone).

The tiny fp32 Llama has head_dim 64 (vLLM's CPU attention refuses 16). ``training/rollout_probs_diff_max``
compares vLLM's sampling probabilities with the trainer's recomputed ones: ~1e-9 when vLLM holds the trainer's
weights, ~1e-3 and up after one lr=1e-3 update it missed; the bound below (1e-4) sits between.
"""

import json

import pytest

from hybridflow.config import PPOConfig, load_config
from hybridflow.trainer.main_ppo import run_ppo
from tests.rollout.test_vllm_real import WIDE_HEADS
from tests.trainer.ppo_fixtures import base_overrides

pytestmark = pytest.mark.vllm

PROBS_DIFF_BOUND = 1e-4
ON_VLLM = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.dtype=float32", "trainer.logger=[file]"]


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory):
    from hybridflow.models.tiny import save_tiny_model

    return save_tiny_model(str(tmp_path_factory.mktemp("wide_tiny")), **WIDE_HEADS)


def metrics(root) -> list[dict]:
    return [json.loads(line) for line in (root / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]


def assert_vllm_holds_the_trainers_weights(rows: list[dict]) -> None:
    diffs = [row["training/rollout_probs_diff_max"] for row in rows]
    assert max(diffs) < PROBS_DIFF_BOUND, diffs


def test_smoke_two_grpo_steps_with_a_weight_sync_on_vllm(tmp_path, wide_model_dir):
    """Step 2 samples after step 1's update was synced into vLLM: its probabilities are the trainer's."""
    run_ppo(load_config(PPOConfig, base_overrides(tmp_path, wide_model_dir, steps=2) + ON_VLLM))
    rows = metrics(tmp_path)
    assert [row["step"] for row in rows] == [1, 2]
    assert_vllm_holds_the_trainers_weights(rows)
    assert rows[0]["actor/grad_norm"] > 0  # there was an update to sync


def test_grpo_learns_to_emit_digits_on_vllm(tmp_path, wide_model_dir):
    """tests/trainer/test_ppo_learning.py's run (60 steps, reward = share of digits) with vLLM rolling out."""
    overrides = base_overrides(tmp_path, wide_model_dir, steps=60) + ON_VLLM + [
        "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.optim.lr=3e-3"]
    run_ppo(load_config(PPOConfig, overrides))
    rows = metrics(tmp_path)
    scores = [row["critic/score/mean"] for row in rows]
    print("score per step:", [round(s, 2) for s in scores])
    assert sum(scores[:3]) / 3 < 0.5 and sum(scores[-3:]) / 3 > 0.9, scores
    assert_vllm_holds_the_trainers_weights(rows)


def test_multi_turn_tool_grpo_on_vllm(tmp_path):
    """The tool agent's conversations (tool calls answered between turns) decoded by vLLM, validated too."""
    from tests.trainer.test_agent_ppo import SUBMIT_42, tool_task
    from hybridflow.models.tiny import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokenizer.add_tokens([SUBMIT_42])
    model, _ = build_tiny_model(tokenizer=tokenizer, seed=0, **WIDE_HEADS)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    overrides = base_overrides(tmp_path, str(tmp_path / "model"), steps=2) + tool_task(tmp_path) + ON_VLLM + [
        "data.max_response_length=96", "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        "trainer.test_freq=2"]
    run_ppo(load_config(PPOConfig, overrides))
    row = metrics(tmp_path)[-1]
    assert row["num_turns/min"] >= 2 and row["num_turns/max"] <= 6
    assert "val-core/tool_use/reward/mean@1" in row and "tool_call_counts/mean" in row
    assert row["multi_turn/tokenization_mismatch/mean"] == 0


@pytest.mark.slow  # three vLLM starts (straight, killed, resumed): minutes on 2 cores
def test_run_killed_after_step_2_resumes_on_vllm(tmp_path, wide_model_dir):
    """SIGKILL once step 2's checkpoint is published (vLLM's process ends with its trainer), then resumed: the
    resumed run's vLLM starts from the checkpoint's weights (a sync before its first rollout), and step 4's
    weights and every step's scores equal the uninterrupted run's."""
    from tests.trainer.test_ppo_e2e import kill_after_step_2_and_resume

    straight, resumed = kill_after_step_2_and_resume(tmp_path, lambda root: base_overrides(
        root, wide_model_dir, steps=4) + ON_VLLM + ["trainer.save_freq=2", "data.shuffle=True"])
    a, b = metrics(straight), metrics(resumed)
    assert [row["step"] for row in b] == [1, 2, 3, 4]
    assert [row["critic/score/mean"] for row in a] == [row["critic/score/mean"] for row in b]
    assert_vllm_holds_the_trainers_weights(b)
