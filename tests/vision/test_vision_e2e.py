"""A tiny random Qwen2.5-VL on the synthetic shape-count task, end to end through the trainers' entry points:
SFT, and 2 GRPO steps with images (the vision tower frozen, or trained; also a tiny Qwen2-VL and Qwen3-VL)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from hybridflow.data.preprocess import shape_count


@pytest.fixture(scope="module")
def shape_rows(tmp_path_factory):
    return shape_count.main(["--size", "8", "--test_size", "2", "--local_save_dir",
                             str(tmp_path_factory.mktemp("shapes"))])


def read_metrics(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sft_on_images_lowers_the_loss(tmp_path, tiny_vl_dir, shape_rows):
    from hybridflow.trainer.sft_trainer import main

    code = main([f"model.partial_pretrain={tiny_vl_dir}", f"data.train_files={shape_rows['train']}",
                 f"data.val_files={shape_rows['test']}", "data.messages_key=messages", "data.train_batch_size=4",
                 "data.micro_batch_size_per_gpu=2", "data.max_length=128", "optim.lr=1e-3", "trainer.total_epochs=3",
                 f"trainer.default_local_dir={tmp_path}", "trainer.logger=[console,file]",
                 "use_remove_padding=True"])  # packing asked for: rows with images stay padded
    assert code == 0
    rows = [r for r in read_metrics(tmp_path / "logs" / "metrics.jsonl") if "train/loss" in r]
    assert len(rows) == 6 and rows[-1]["train/loss"] < rows[0]["train/loss"]
    exported = tmp_path / "global_step_6" / "model" / "huggingface"
    assert (exported / "processor_config.json").is_file()  # the saved model loads with its processor again


def grpo_args(tmp_path, model_dir, rows, *, freeze: bool) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={rows['train']}",
        f"data.val_files={rows['test']}", "data.train_batch_size=2", "data.max_prompt_length=64",
        "data.max_response_length=6", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.rollout.n=2", "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=True",
        # the random model never counts right (every advantage 0): the entropy bonus gives every step a gradient
        "actor_rollout_ref.actor.entropy_coeff=0.1",
        f"actor_rollout_ref.actor.freeze_vision_tower={freeze}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
        "trainer.total_training_steps=2", "trainer.save_freq=2", "trainer.logger=[console,file]",
        "trainer.val_before_train=True", "trainer.test_freq=2", f"trainer.default_local_dir={tmp_path}",
    ]


@pytest.mark.parametrize("arch, freeze", [("qwen2_5_vl", True), ("qwen2_5_vl", False), ("qwen2_vl", True),
                                          ("qwen3_vl", False)])
def test_grpo_two_steps_with_images(tmp_path, tiny_vl_dir, shape_rows, arch, freeze):
    from hybridflow.models.tiny import save_tiny_vl_model
    from hybridflow.trainer.main_ppo import main

    if arch != "qwen2_5_vl":
        tiny_vl_dir = save_tiny_vl_model(str(tmp_path / arch), arch=arch)
    assert main(grpo_args(tmp_path, tiny_vl_dir, shape_rows, freeze=freeze)) == 0
    metrics = read_metrics(tmp_path / "logs" / "metrics.jsonl")
    trained = [m for m in metrics if "actor/pg_loss" in m]
    assert [m["step"] for m in trained] == [1, 2]
    assert all(m["actor/grad_norm"] > 0 for m in trained)
    assert "val-core/hybridflow/shape_count/reward/mean@1" in metrics[-1]
    before = load_file(f"{tiny_vl_dir}/model.safetensors")
    after = load_file(str(tmp_path / "global_step_2" / "actor" / "huggingface" / "model.safetensors"))
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    vision = {name for name in before if name.split(".")[0] == "visual" or ".visual." in name}
    assert vision and changed - vision  # the language model trained
    assert (changed & vision == set()) == freeze


def test_what_a_vlm_run_cannot_do_yet_is_one_line(tmp_path, tiny_vl_dir, shape_rows, capsys):
    from hybridflow.trainer.main_ppo import main

    args = grpo_args(tmp_path, tiny_vl_dir, shape_rows, freeze=False)
    assert main(args + ["algorithm.adv_estimator=gae", f"critic.model.path={tiny_vl_dir}"]) == 2
    assert "a value model over images is not supported; use a critic-free estimator" in capsys.readouterr().err


def test_rows_with_videos_are_refused_in_one_line_before_a_model_loads(tmp_path, tiny_vl_dir, shape_rows, capsys,
                                                                     monkeypatch):
    import pandas as pd

    import hybridflow.trainer.roles.builders as builders
    from hybridflow.trainer.main_ppo import main

    rows = pd.read_parquet(shape_rows["train"])
    rows["videos"] = [[] for _ in range(len(rows))]
    rows.at[3, "videos"] = [rows.at[3, "images"][0]] * 2  # a clip of the row's own picture, as frames
    rows.to_parquet(tmp_path / "videos.parquet")
    load, loaded = builders.load_causal_lm, []
    monkeypatch.setattr(builders, "load_causal_lm", lambda *args, **kwargs: loaded.append(args) or load(*args, **kwargs))
    args = grpo_args(tmp_path, tiny_vl_dir, {**shape_rows, "train": str(tmp_path / "videos.parquet")}, freeze=True)
    assert main(args) == 2
    assert loaded == []
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert "row 3 has 2 video(s) in 'videos'; videos are not supported: give the sampled frames as images" in line


@pytest.mark.parametrize("arch, model_class", [("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration"),
                                               ("qwen3_vl", "Qwen3VLForConditionalGeneration")])
def test_a_vlm_checkpoint_merges_into_a_folder_that_loads_with_its_processor(tmp_path, tiny_vl_dir, shape_rows, arch,
                                                                            model_class):
    """model_merger over the actor's DCP shards: the HF folder is a VLM again (weights, config, processor)."""
    from hybridflow.model_merger import merge
    from hybridflow.models import load_causal_lm, load_tokenizer
    from hybridflow.models.tiny import save_tiny_vl_model
    from hybridflow.models.vision import load_processor
    from hybridflow.trainer.main_ppo import main

    if arch != "qwen2_5_vl":
        tiny_vl_dir = save_tiny_vl_model(str(tmp_path / arch), arch=arch)
    args = grpo_args(tmp_path, tiny_vl_dir, shape_rows, freeze=True)
    args = [a for a in args if "save_contents" not in a] + ["trainer.val_before_train=False"]
    assert main(args) == 0
    target = merge(str(tmp_path / "global_step_2" / "actor"), str(tmp_path / "merged"))
    model = load_causal_lm(target)
    processor = load_processor(target, tokenizer=load_tokenizer(target))
    assert type(model).__name__ == model_class
    assert processor is not None and processor.image_token_id == model.config.image_token_id
