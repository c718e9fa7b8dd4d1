"""verl-recipe's GVPO command (gvpo/run_qwen2-7b_math_gvpo.sh, extracted into commands.json) trains on a tiny model:
the recipe's keys as written, started from its own YAML, with only the module prefix, the model / data / reward
paths, the engine (vllm -> native: no GPU), the GPU count and the sizes (1024 prompts of 1k tokens -> 4 tiny ones)
changed. Its pg_loss is GVPO's, computed by hand from the step's dumped scores."""

from __future__ import annotations

import json

import pytest

from hybridflow.trainer.main_ppo import main
from tests.trainer.ppo_fixtures import write_task
from tests.verl_commands.test_verl_commands import COMMANDS, localised, script

RECIPE = "gvpo/run_qwen2-7b_math_gvpo.sh"
# a reward with spread inside each group (the tiny model never answers right): GVPO's targets are centred scores
REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" \
         "    return float(len(solution_str) % 3)\n"


def recipe_command(tmp_path, model: str) -> list[str]:
    (command,) = [c for c in COMMANDS if script(c) == RECIPE]
    train, _ = write_task(str(tmp_path / "data"))
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD)
    changed = {"data.train_batch_size": "4", "data.max_prompt_length": "64", "data.max_response_length": "8",
               "actor_rollout_ref.actor.ppo_mini_batch_size": "4", "actor_rollout_ref.rollout.name": "native",
               "actor_rollout_ref.rollout.tensor_model_parallel_size": "1", "trainer.n_gpus_per_node": "1",
               "trainer.logger": "['console','file']", "trainer.total_epochs": "1"}
    args = [arg if arg.partition("=")[0] not in changed else f"{arg.partition('=')[0]}={changed[arg.partition('=')[0]]}"
            for arg in localised(command, model, train)]
    assert {a.partition("=")[0] for a in args} >= set(changed)  # every change replaces one of the recipe's keys
    return args + ["trainer.total_training_steps=1", "trainer.val_before_train=False",
                   f"trainer.default_local_dir={tmp_path / 'ckpt'}", f"trainer.rollout_data_dir={tmp_path / 'gen'}",
                   f"custom_reward_function.path={reward}"]


def test_the_gvpo_recipe_trains_with_gvpo_s_loss(tmp_path, tiny_model_dir):
    args = recipe_command(tmp_path, tiny_model_dir)
    assert "actor_rollout_ref.actor.policy_loss.loss_mode=gvpo" in args and "actor_rollout_ref.rollout.n=4" in args
    assert main(args) == 0
    (row,) = [json.loads(line) for line in (tmp_path / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]
    scores = [json.loads(line)["score"] for line in (tmp_path / "gen" / "1.jsonl").read_text().splitlines()]
    assert len(scores) == 16
    # one mini-batch of 16 rows in one micro-batch of 16 (the recipe's ppo_micro_batch_size_per_gpu): pi = pi_old, so
    # r_i = 0 and l_i = 1/2 (s_i - mean of its group)^2 / (n - 1), summed (b / N_seq = 1)
    expected = 0.0
    for start in range(0, 16, 4):
        group = scores[start:start + 4]
        expected += sum(0.5 * (s - sum(group) / 4) ** 2 / 3 for s in group)
    assert expected > 0
    assert row["actor/pg_loss"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
