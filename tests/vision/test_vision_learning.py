"""The vision path learns: SFT of a tiny random Qwen2.5-VL on the shape-count task reads the pixels well enough
to count shapes on held-out images (each count is a quarter of the rows; the random model scores 0), and GRPO
improves an SFT checkpoint that reads its images."""

from __future__ import annotations

import json

import pytest

from hybridflow.data.preprocess import shape_count

VAL = "val-core/hybridflow/shape_count/reward/mean@1"


def shape_rows(tmp_path, *, test_size: int) -> dict[str, str]:
    return shape_count.main(["--size", "1024", "--test_size", str(test_size), "--max_shapes", "4",
                             "--local_save_dir", str(tmp_path / "data")])


def sft_checkpoint(tmp_path, model_dir, rows, *, epochs: int):
    """The HF folder after ``epochs`` SFT epochs (32 rows a step, lr 2e-3 decayed over the run)."""
    from hybridflow.trainer.sft_trainer import main as sft_main

    assert sft_main([f"model.partial_pretrain={model_dir}", f"data.train_files={rows['train']}",
                     f"data.val_files={rows['test']}", "data.messages_key=messages", "data.max_length=128",
                     "data.train_batch_size=32", "data.micro_batch_size_per_gpu=32", "optim.lr=2e-3",
                     f"trainer.total_epochs={epochs}", "trainer.save_freq=-1",
                     f"trainer.default_local_dir={tmp_path / 'sft'}", "trainer.logger=[console]"]) == 0
    return tmp_path / "sft" / f"global_step_{32 * epochs}" / "model" / "huggingface"


def run_grpo(folder, model_dir, rows, *extra: str) -> list[dict]:
    """``main_ppo`` (GRPO, 64-token prompts, 12-token answers) with ``extra`` overrides; its logged metrics."""
    from hybridflow.trainer.main_ppo import main as ppo_main

    assert ppo_main(["algorithm.adv_estimator=grpo", f"actor_rollout_ref.model.path={model_dir}",
                     f"data.train_files={rows['train']}", f"data.val_files={rows['test']}",
                     "data.max_prompt_length=64", "data.max_response_length=12", *extra,
                     f"trainer.default_local_dir={folder}", "trainer.logger=[console,file]"]) == 0
    return read_metrics(folder)


def read_metrics(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "logs" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_sft_on_images_learns_to_count_held_out_shapes(tmp_path, tiny_vl_dir):
    rows = shape_rows(tmp_path, test_size=64)
    trained = sft_checkpoint(tmp_path, tiny_vl_dir, rows, epochs=16)
    (metrics,) = run_grpo(tmp_path / "eval", trained, rows, "data.train_batch_size=8",
                          "actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.val_only=True")
    assert metrics[VAL] > 0.8  # measured 0.98 (63 of 64)


def mean_training_score(metrics: list[dict], steps: range) -> float:
    """``critic/score/mean`` (the sampled rollouts' reward, 256 a step) averaged over ``steps``."""
    by_step = {m["step"]: m["critic/score/mean"] for m in metrics if "critic/score/mean" in m}
    return sum(by_step[step] for step in steps) / len(steps)


@pytest.mark.slow
def test_grpo_improves_an_sft_checkpoint_that_reads_its_images(tmp_path, tiny_vl_dir):
    """10 SFT epochs give a checkpoint that reads its images (63 % greedy on 256 held-out images); 100 GRPO steps
    at rollout temperature 0.5 with a frozen vision tower and a 20-step lr warm-up raise the reward of its
    training rollouts and keep its held-out accuracy. docs/vision.md: why the image-blind 6-epoch checkpoint
    cannot be improved this way, the dip before, and why the held-out accuracy is not asked to rise."""
    rows = shape_rows(tmp_path, test_size=256)
    trained = sft_checkpoint(tmp_path, tiny_vl_dir, rows, epochs=10)
    metrics = run_grpo(tmp_path / "grpo", trained, rows, "data.train_batch_size=32", "actor_rollout_ref.rollout.n=8",
                       "actor_rollout_ref.rollout.temperature=0.5", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
                       "actor_rollout_ref.actor.optim.lr=5e-4", "actor_rollout_ref.actor.optim.lr_warmup_steps=20",
                       "actor_rollout_ref.actor.freeze_vision_tower=True", "trainer.total_training_steps=100",
                       "trainer.test_freq=100", "trainer.val_before_train=True", "trainer.save_freq=-1")
    before, after = metrics[0][VAL], [m for m in metrics if VAL in m][-1][VAL]
    early, late = mean_training_score(metrics, range(1, 21)), mean_training_score(metrics, range(81, 101))
    # Measured over 4 runs (rollout seeds 0, 1, 2 and seed 0 with ATEN_CPU_CAPABILITY=default, an AMD EPYC):
    # training reward +0.052 to +0.120 from the first 20 steps to the last 20; held-out -0.023 to +0.031 (and
    # +0.004 on an Intel Xeon, +0.074 on an AVX-512 EPYC): which way the held-out score moves is the sampling's
    # luck, so it is only asked not to fall; advantages of the wrong sign fail both.
    assert before < 0.7
    assert late > early + 0.025, f"training reward {early:.3f} over steps 1-20, {late:.3f} over 81-100"
    assert after > before - 0.05, f"held-out greedy accuracy {before:.3f} -> {after:.3f}"
