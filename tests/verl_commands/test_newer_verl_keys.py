"""Keys of verl's newest examples and of verl-recipe (issue 49): each works, or is refused before anything loads
in one line that says what to do. The keys are the real scripts' (named in each test); paths point at local files."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from hybridflow.config import PPOConfig, load_config, split_config_args
from hybridflow.data.files import read_rows
from hybridflow.errors import ConfigError, DataError
from tests.verl_commands.test_verl_commands import (COMMANDS, gpu_engines_installed, local_files, localised,  # noqa: F401
                                                    preflight, reward_file, script)

# verl's examples/ppo_trainer (Intel GPU e2e, verl HEAD): the critic's FSDP engine settings under critic.fsdp
CRITIC_FSDP = ["algorithm.adv_estimator=gae", "critic.optim.lr=1e-5", "critic.model.use_remove_padding=False",
               "+critic.model.override_config.attn_implementation=sdpa", "critic.model.enable_gradient_checkpointing=True",
               "critic.ppo_micro_batch_size_per_gpu=1", "critic.fsdp.param_offload=True",
               "critic.fsdp.optimizer_offload=True", "critic.fsdp.reshard_after_forward=True"]
# verl's curriculum sampler (trainer/config data.sampler, its tests' RandomCurriculumSampler)
SAMPLER = ["data.sampler.class_path=pkg://tests.utils.dataset.test_create_rl_sampler_on_cpu",
           "data.sampler.class_name=RandomCurriculumSampler", "data.dataloader_num_workers=0"]
CUSTOM_DATASET = ["data.custom_cls.path=/workspace/my_dataset.py", "data.custom_cls.name=CustomRLHFDataset"]


def ppo_args(local_files, *extra: str) -> list[str]:
    model, data = local_files
    return [f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}", f"data.train_files={data}",
            f"data.val_files={data}", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            *extra]


def test_the_critic_fsdp_section_sets_the_critic_s_offload(local_files):
    preflight("ppo", ppo_args(local_files, *CRITIC_FSDP))
    fsdp = load_config(PPOConfig, ppo_args(local_files, *CRITIC_FSDP)).critic.model.fsdp_config
    assert fsdp.param_offload is True and fsdp.optimizer_offload is True and fsdp.reshard_after_forward is True


@pytest.mark.parametrize("keys, names", [(SAMPLER, ["data.sampler", "drop data.sampler"]),
                                         (CUSTOM_DATASET, ["data.custom_cls", "drop data.custom_cls"])],
                         ids=["sampler", "custom_cls"])
def test_user_sampler_and_dataset_classes_are_refused_in_one_line(local_files, keys, names):
    with pytest.raises(ConfigError) as err:
        preflight("ppo", ppo_args(local_files, *keys))
    (line,) = str(err.value).splitlines()
    assert all(name in line for name in names), line


def rows(n: int, start: int = 0) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"{i} + 1?"}], "data_source": "openai/gsm8k",
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)}} for i in range(start, start + n)]


def test_a_folder_of_parquet_files_is_read_in_name_order(tmp_path, local_files):
    folder = tmp_path / "train"
    folder.mkdir()
    pd.DataFrame(rows(2, start=3)).to_parquet(folder / "part-1.parquet")
    pd.DataFrame(rows(3)).to_parquet(folder / "part-0.parquet")
    (folder / "README.md").write_text("not data")
    got = read_rows(str(folder))
    assert [r["reward_model"]["ground_truth"] for r in got] == ["1", "2", "3", "4", "5"]
    preflight("ppo", ppo_args(local_files, f"data.train_files={folder}"))


def test_a_datasets_save_to_disk_folder_is_read(tmp_path):
    import datasets

    datasets.Dataset.from_list(rows(3)).save_to_disk(str(tmp_path / "train"))
    got = read_rows(str(tmp_path / "train"))
    assert [r["prompt"][0]["content"] for r in got] == ["0 + 1?", "1 + 1?", "2 + 1?"]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows(1))}).save_to_disk(str(tmp_path / "splits"))
    with pytest.raises(DataError, match=r"holds several splits \(train\); point data.train_files .* at one of them"):
        read_rows(str(tmp_path / "splits"))


def test_a_folder_without_data_says_what_to_pass(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DataError, match="holds no .parquet / .jsonl file .* point data.train_files / data.val_files "
                                        "at the files"):
        read_rows(str(tmp_path))


def test_main_fully_async_finds_the_recipe_yaml_by_verl_s_name(local_files, gpu_engines_installed):  # noqa: F811
    """``--config-name fully_async_ppo_trainer`` resolves to the shipped recipe YAML; verl's
    dapo_7b_math_fsdp2_4_4.sh passes the pre-load checks from it."""
    from hybridflow.config.loader import SHIPPED_CONFIG_DIR

    recipe_yaml = os.path.join(SHIPPED_CONFIG_DIR, "fully_async_ppo_trainer.yaml")
    config_file, _ = split_config_args(["--config-name", "fully_async_ppo_trainer"])
    assert config_file == recipe_yaml
    model, _ = local_files
    cfg = load_config(PPOConfig, [f"actor_rollout_ref.model.path={model}"], recipe_yaml)
    assert cfg.async_training.staleness_threshold == 0.1 and cfg.async_training.trigger_parameter_sync_step == 4
    assert cfg.async_training.partial_rollout and cfg.actor_rollout_ref.actor.use_rollout_log_probs
    assert cfg.actor_rollout_ref.rollout.n == 4 and cfg.rollout.total_rollout_steps == 100
    (command,) = [c for c in COMMANDS if script(c).endswith("fully_async_policy/shell/dapo_7b_math_fsdp2_4_4.sh")]
    verl_yaml_dropped = {key: value for key, value in command.items() if key != "config"}
    preflight("fully_async", ["--config-name", "fully_async_ppo_trainer", *localised(verl_yaml_dropped, *local_files)])


def test_vision_language_multi_turn_passes_the_pre_load_checks(tmp_path, local_files):
    """Multi-turn rollouts of a vision-language policy run (tests/vision/test_vision_multi_turn.py): no refusal."""
    from hybridflow.models.tiny import save_tiny_model

    vl_model = save_tiny_model(str(tmp_path / "vl"), arch="qwen2_5_vl")
    _, data = local_files
    preflight("ppo", [f"actor_rollout_ref.model.path={vl_model}", f"data.train_files={data}",
                      f"data.val_files={data}", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                      "actor_rollout_ref.rollout.multi_turn.enable=True"])


def prime_data(**overrides):
    from types import SimpleNamespace

    keys = dict(filter_accuracy=True, accuracy_lower_bound=0.2, accuracy_upper_bound=0.8, filter_truncate=True,
                max_response_length=4, oversample_factor=2.0)
    return SimpleNamespace(**{**keys, **overrides})


def scored_groups():
    """4 groups of n=2: accuracies 1.0, 0.5, 0.5 (a response of 3 tokens = max_response_length - 1), 0.5."""
    import torch

    from hybridflow.data.batch import Batch

    lengths = torch.tensor([1, 2, 2, 1, 3, 1, 2, 2])
    return Batch.from_dict(tensors={"seq_score": torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0]),
                                    "response_mask": (torch.arange(4) < lengths.unsqueeze(1)).long(),
                                    "row": torch.arange(8)})


@pytest.mark.parametrize("data, wanted, rows", [
    (prime_data(), 2, [2, 3, 6, 7]),                      # groups 1 and 3 pass
    (prime_data(), 3, [2, 3, 6, 7, 0, 1]),                # then the first failing group, in generation order
    (prime_data(filter_truncate=False), 2, [2, 3, 4, 5]),  # group 2's 3-token response no longer fails it
    (prime_data(filter_accuracy=False, filter_truncate=False), 2, [0, 1, 2, 3]),  # oversampling alone
], ids=["both", "fill-up", "accuracy-only", "oversample-only"])
def test_prime_s_filter_keeps_the_passing_groups_first(data, wanted, rows):
    from hybridflow.trainer.loop.sync_sources import AccuracyFilter

    metrics = {}
    kept = AccuracyFilter(data, n=2, wanted=wanted)(scored_groups(), None, step=1, metrics=metrics)
    assert kept["row"].tolist() == rows
    assert metrics["train/prime_groups_seen"] == 4


def test_prime_recipe_command_generates_an_oversampled_batch(local_files, reward_file,
                                                             gpu_engines_installed):  # noqa: F811
    """verl-recipe's prime/run_prime_qwen.sh (its YAML: filter_accuracy, bounds 0.2 / 0.8, oversample_factor 4,
    filter_truncate): the loader draws train_batch_size x 4 prompts and the step filters them."""
    from hybridflow.config.validate import generation_batch_size
    from hybridflow.trainer.main_ppo import group_selection
    from hybridflow.trainer.main_prime import PRIME_DEFAULTS, recipe_meaning
    from hybridflow.trainer.loop.sync_sources import AccuracyFilter

    (command,) = [c for c in COMMANDS if script(c) == "prime/run_prime_qwen.sh"]
    argv = localised(command, *local_files, reward=reward_file)
    preflight("prime", argv)
    config_file, overrides = split_config_args(argv)
    cfg = recipe_meaning(load_config(PPOConfig, overrides, config_file, defaults=PRIME_DEFAULTS))
    assert cfg.data.filter_accuracy and cfg.data.oversample_factor == 4.0
    assert generation_batch_size(cfg.data) == 4 * cfg.data.train_batch_size
    selection = group_selection(cfg)
    assert isinstance(selection, AccuracyFilter) and selection.wanted == cfg.data.train_batch_size
    with pytest.raises(ConfigError, match="both pick the groups to train on: keep one"):
        preflight("prime", argv + ["algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=acc"])
