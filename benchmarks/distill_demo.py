"""On-policy distillation on the demo's task: a teacher that knows it, a student that does not, held-out before -> after.

    python benchmarks/distill_demo.py [--preset default|tiny] [--out runs/distill-demo] [--steps 20] [key=value ...]

1. the demo preset's model and data (``hybridflow.trainer.demo``: SmolLM2-135M-Instruct on 2-term sums, or the
   tiny random model on the synthetic digits task);
2. the teacher: the same model SFT'd on the training questions' right answers (answer only, the prompt's format),
   so it knows the task; its held-out greedy score is measured (``trainer.val_only=True``);
3. the student: the untrained model, distilled from the teacher with verl 0.9.1's keys
   (``distillation.enabled=True``, ``teacher_models.teacher_model.model_path``, ``use_task_rewards=False``:
   no task reward reaches the loss, only the teacher's log-probs on the student's own samples);
4. the student's held-out greedy score before -> after (the task's reward, never seen by the loss).

Any extra ``key=value`` overrides the distillation run (``distillation.distillation_loss.loss_mode=k1`` ...).
Measured numbers: docs/benchmarks.md ("On-policy distillation on the demo's task").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from hybridflow.config import PPOConfig, SFTConfig, load_config
from hybridflow.data.files import read_rows
from hybridflow.data.preprocess.common import write_splits
from hybridflow.trainer.demo import PRESETS, before_after, demo_overrides, prepare_data, prepare_model
from hybridflow.trainer.main_ppo import run_ppo
from hybridflow.trainer.sft_trainer import build_trainer, make_tracking

# The teacher's SFT: every training question once or more, answer only (the demo's instruction asks for it)
TEACHER_SFT = {
    "default": ("data.train_batch_size=16", "data.micro_batch_size_per_gpu=16", "data.max_length=160",
                "optim.lr=5e-5", "trainer.total_epochs=3"),
    "tiny": ("data.train_batch_size=8", "data.micro_batch_size_per_gpu=8", "data.max_length=64",
             "optim.lr=3e-3", "trainer.total_epochs=15"),
}
# The student's distillation: verl's keys; the demo's GRPO settings otherwise (rollout.n, batch, lr)
DISTILL = ("distillation.enabled=True", "distillation.distillation_loss.use_task_rewards=False",
           "distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=32",
           "trainer.val_before_train=True")


def right_answer(row: dict, index: int) -> str:
    """The answer the teacher learns: the row's ground truth, or (synthetic digits task) the prompt's digit
    repeated (every character a digit: the task's full reward)."""
    truth = str((row.get("reward_model") or {}).get("ground_truth", "")).strip()
    if truth:
        return truth
    content = row["prompt"][0]["content"]
    return content.rstrip(".")[-1] * 6


def teacher_rows(train: str, out: str) -> str:
    """SFT rows (``messages``: the RL prompt, then the right answer) of every training question."""
    rows = []
    for i, row in enumerate(read_rows(train)):
        prompt = row["prompt"]
        messages = list(prompt.tolist() if hasattr(prompt, "tolist") else prompt)
        rows.append({"messages": [*messages, {"role": "assistant", "content": right_answer(row, i)}]})
    return write_splits({"teacher_sft": rows}, out)["teacher_sft"]


def train_teacher(preset: str, *, model: str, rows: str, out: str) -> str:
    """SFT ``model`` on ``rows``; the trained model's HF folder."""
    overrides = [f"model.partial_pretrain={model}", f"data.train_files={rows}", "data.multiturn.enable=True",
                 "data.multiturn.messages_key=messages", "trainer.logger=[console,file]",
                 f"trainer.default_local_dir={out}", "trainer.project_name=hybridflow-distill-demo",
                 "trainer.experiment_name=teacher-sft", *TEACHER_SFT[preset]]
    print("[distill-demo] teacher SFT overrides:\n  " + "\n  ".join(overrides))
    cfg = load_config(SFTConfig, overrides)
    trainer, tracking = build_trainer(cfg), make_tracking(cfg)
    try:
        trainer.fit(tracking)
    finally:
        tracking.finish()
    return os.path.join(out, f"global_step_{trainer.global_step}", "model", "huggingface")


def held_out(overrides: list[str]) -> tuple[str, float, float, list[dict]]:
    """Run PPO with ``overrides``; (metric, held-out before, after, history)."""
    run = run_ppo(load_config(PPOConfig, overrides))
    key, before, after = before_after(run.history)
    return key, before, after, run.history


def run(preset_name: str, run_dir: str, steps: int, extra: list[str]) -> dict:
    preset = PRESETS[preset_name]
    os.makedirs(run_dir, exist_ok=True)
    model = prepare_model(preset, run_dir)
    train, test = prepare_data(preset, run_dir)
    start = time.time()
    teacher = train_teacher(preset_name, model=model, rows=teacher_rows(train, os.path.join(run_dir, "data")),
                            out=os.path.join(run_dir, "teacher"))
    teacher_seconds = time.time() - start
    base = demo_overrides(preset, model=teacher, train=train, test=test, run_dir=os.path.join(run_dir, "teacher_val"))
    key, teacher_score, _, _ = held_out([*base, "trainer.val_only=True"])
    start = time.time()
    student = demo_overrides(preset, model=model, train=train, test=test, run_dir=os.path.join(run_dir, "student"))
    overrides = [*student, *DISTILL, f"distillation.teacher_models.teacher_model.model_path={teacher}",
                 f"trainer.total_training_steps={steps}", *extra]
    print("[distill-demo] distillation overrides:\n  " + "\n  ".join(overrides))
    key, before, after, history = held_out(overrides)
    result = {"preset": preset_name, "metric": key, "teacher": teacher_score, "student_before": before,
              "student_after": after, "steps": steps, "teacher_sft_s": round(teacher_seconds, 1),
              "distill_s": round(time.time() - start, 1),
              "val_curve": [(row["step"], row[key]) for row in history if key in row]}
    print(f"[distill-demo] held-out {key}: teacher {teacher_score:.3f}; student {before:.3f} -> {after:.3f} after "
          f"{steps} distillation steps ({result['distill_s'] / 60:.1f} min)")
    with open(os.path.join(run_dir, "result.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="default", choices=sorted(TEACHER_SFT))
    parser.add_argument("--out", default=None)
    parser.add_argument("--steps", type=int, default=20)
    args, extra = parser.parse_known_args(argv)
    out = args.out or os.path.join("runs", f"distill-demo-{args.preset}-{time.strftime('%Y%m%d-%H%M%S')}")
    run(args.preset, os.path.abspath(out), args.steps, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
