"""Multi-turn rollouts of a vision-language policy with a tool that answers with pictures: 2 GRPO steps through
``python -m hybridflow.trainer.main_ppo``, and a resumed run that reproduces the uninterrupted one bit for bit."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.vision.picture_tools import picture_calling_vl_model_dir, picture_rows, write_picture_tool_config

VARIED_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Differs between the samples of a prompt (GRPO gets advantages): the response's length, folded."""
    return (len(solution_str) % 5) / 4
'''


@pytest.fixture(scope="module")
def picture_model(tmp_path_factory) -> str:
    return picture_calling_vl_model_dir(tmp_path_factory.mktemp("picture_vl"))


def multi_turn_vl_args(root, model: str, *, steps: int, every: int) -> list[str]:
    """A GRPO run whose conversations show a picture, call ``show_picture`` (a picture back) and answer."""
    root.mkdir(parents=True, exist_ok=True)
    rows = pd.DataFrame(picture_rows(8))
    rows.to_parquet(root / "train.parquet")
    rows.to_parquet(root / "test.parquet")
    (root / "reward.py").write_text(VARIED_REWARD)
    return [
        f"actor_rollout_ref.model.path={model}", f"data.train_files={root / 'train.parquet'}",
        f"data.val_files={root / 'test.parquet'}", "data.train_batch_size=4", "data.max_prompt_length=128",
        "data.max_response_length=48", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.n=2", "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.entropy_coeff=0.1",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={write_picture_tool_config(root / 'tools.yaml')}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        "actor_rollout_ref.rollout.multi_turn.stop_after_tool_call=True",
        f"custom_reward_function.path={root / 'reward.py'}", "reward_model.timeout_s=null",
        f"trainer.total_training_steps={steps}", f"trainer.save_freq={every}", f"trainer.test_freq={every}",
        "trainer.logger=[file]", "trainer.val_before_train=False", "data.shuffle=True", f"trainer.default_local_dir={root / 'ckpt'}",
    ]


def metrics_rows(root) -> list[dict]:
    return [json.loads(x) for x in (root / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]


def test_multi_turn_vl_grpo_with_a_picture_tool_runs_two_steps(tmp_path, picture_model):
    from hybridflow.trainer.main_ppo import main

    assert main(multi_turn_vl_args(tmp_path, picture_model, steps=2, every=2)) == 0
    rows = metrics_rows(tmp_path)
    trained = [row for row in rows if "actor/pg_loss" in row]
    assert [row["step"] for row in trained] == [1, 2]
    assert all(row["actor/grad_norm"] > 0 for row in trained)
    assert all(row["tool_call_counts/mean"] > 0.5 for row in trained)  # pictures went back to the model
    assert all(row["multi_turn/tool_errors/mean"] == 0 for row in trained)
    assert all(row["multi_turn/tokenization_mismatch/mean"] == 0 for row in trained)
    assert "val-core/picture_tool/reward/mean@1" in rows[-1]


def assert_same_steps(before: list[dict], after: list[dict]) -> None:
    """Every metric of every step equal, bit for bit (times and memory aside)."""
    assert before[0]["tool_call_counts/mean"] > 0
    assert [row["step"] for row in after] == [row["step"] for row in before]
    for a, b in zip(before, after):
        same = {key for key in a if not key.startswith(("timing_s/", "perf/"))}
        assert {key: a[key] for key in same} == {key: b[key] for key in same}, a["step"]


def test_multi_turn_vl_run_resumed_from_a_checkpoint_is_bit_for_bit(tmp_path, picture_model):
    """A 2-step run, and a second one resumed from a copy of its step-1 checkpoint (as if killed right after it was
    published), in this process: step 2's metrics and weights are the same."""
    from tests.trainer.test_ppo_e2e import resume_from_a_step_1_copy

    straight, resumed = resume_from_a_step_1_copy(
        tmp_path, lambda root: multi_turn_vl_args(root, picture_model, steps=2, every=1))
    assert_same_steps(metrics_rows(straight), metrics_rows(resumed))


@pytest.mark.slow
def test_multi_turn_vl_run_resumes_bit_for_bit_after_sigkill(tmp_path, picture_model):
    """Killed with SIGKILL after step 2's checkpoint and resumed: step 4's weights (checked by
    kill_after_step_2_and_resume) and every step's metrics equal the uninterrupted run's."""
    from tests.trainer.test_ppo_e2e import kill_after_step_2_and_resume

    straight, resumed = kill_after_step_2_and_resume(
        tmp_path, lambda root: multi_turn_vl_args(root, picture_model, steps=4, every=2))
    assert_same_steps(metrics_rows(straight), metrics_rows(resumed))
