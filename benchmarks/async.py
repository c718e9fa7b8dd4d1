"""Synchronous vs one-step off-policy vs fully async GRPO on the same prompts, in one script.

Each mode runs ``--steps`` GRPO steps of SmolLM2-135M-Instruct (by default) on the same
reasoning-gym prompts (8 prompts x 4 samples, responses up to ``--length`` tokens, fp32,
temperature 1), in its own process, one after the other:

- ``sync``: ``python -m hybridflow.trainer.main_ppo`` (rollout, then update, every step);
- ``one_step_off``: ``python -m hybridflow.trainer.main_one_step_off`` (step k + 1's rollout runs in a
  thread while step k trains; weights synced after every update);
- ``fully_async``: ``python -m hybridflow.trainer.main_fully_async`` with
  ``async_training.staleness_threshold=--staleness``;
- ``fully_async_partial``: the same with ``async_training.partial_rollout=True`` (a weight sync pauses the
  running generate and its sequences continue with the new weights);
- ``fully_async_split``: fully async on ``trainer.backend=ray`` with split placement: one training process and
  one rollout process (``rollout.n_gpus_per_node=1``), one core each, weights passed by reference through
  Ray's object store.

Printed per mode: wall seconds of the run, steps per hour of wall time and its ratio to sync (the
goal's measure), median trainer seconds per step after the first
(``timing_s/step``: for the async modes the trainer's own step, generation overlapped), trained
tokens per second (``perf/total_num_tokens`` over the step time) and the reward curve
(``critic/score/mean`` per step), so learning per prompt can be compared.

    python benchmarks/async.py --length 256 --steps 8          # the measurement (SmolLM2-135M)
    python benchmarks/async.py --model tiny --length 16 --steps 3   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

BATCH_PROMPTS, SAMPLES, LEARNING_RATE = 8, 4, 2e-5
ENTRY_POINTS = {
    "sync": ("hybridflow.trainer.main_ppo", []),
    "one_step_off": ("hybridflow.trainer.main_one_step_off", []),
    "fully_async": ("hybridflow.trainer.main_fully_async", None),  # filled from --staleness
    "fully_async_partial": ("hybridflow.trainer.main_fully_async", ["async_training.partial_rollout=True"]),
    "fully_async_split": ("hybridflow.trainer.main_fully_async", [
        "trainer.backend=ray", "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1", "ray_kwargs.cpus_per_worker=1",
        "ray_kwargs.ray_init.num_cpus=2"]),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), 'tiny', or a folder")
    parser.add_argument("--length", type=int, default=256, help="response limit (max new tokens)")
    parser.add_argument("--steps", type=int, default=8, help="GRPO steps per mode")
    parser.add_argument("--staleness", type=float, default=1.0, help="fully_async staleness_threshold")
    parser.add_argument("--modes", default="sync,one_step_off,fully_async,fully_async_partial")
    parser.add_argument("--out", default=None, help="work folder (default: a temp dir)")
    return parser.parse_args(argv)


def prepare(model_arg: str, out: str) -> tuple[str, str]:
    """(model folder, train parquet) shared by every mode."""
    if model_arg == "tiny":
        from hybridflow.models.tiny import save_tiny_model

        model = save_tiny_model(os.path.join(out, "tiny_model"), arch="qwen2", seed=0)
    elif model_arg == "default":
        from hybridflow.models.default_model import fetch_default_model

        model = fetch_default_model()
    else:
        model = model_arg
    from hybridflow.data.preprocess import reasoning_gym

    paths = reasoning_gym.main(["--task", "chain_sum", "--size", "256", "--test_size", "8",
                                "--config", "min_terms=2", "--config", "max_terms=2",
                                "--config", "min_digits=1", "--config", "max_digits=1",
                                "--local_save_dir", os.path.join(out, "data")])
    return model, paths["train"]


def run_mode(mode: str, *, model: str, train: str, args, out: str) -> tuple[float, list[dict]]:
    """(wall seconds, metrics rows) of one mode's run."""
    module, extra = ENTRY_POINTS[mode]
    if module.endswith("fully_async"):
        extra = [f"async_training.staleness_threshold={args.staleness}", *(extra or [])]
    overrides = [
        f"actor_rollout_ref.model.path={model}", f"data.train_files={train}", f"data.val_files={train}",
        "algorithm.adv_estimator=grpo", f"data.train_batch_size={BATCH_PROMPTS}", "data.max_prompt_length=256",
        f"data.max_response_length={args.length}", f"actor_rollout_ref.rollout.n={SAMPLES}",
        "actor_rollout_ref.rollout.temperature=1.0", f"actor_rollout_ref.actor.ppo_mini_batch_size={BATCH_PROMPTS}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={BATCH_PROMPTS * SAMPLES}",
        f"actor_rollout_ref.actor.optim.lr={LEARNING_RATE}", "actor_rollout_ref.model.use_shared_prompt=True",
        f"trainer.total_training_steps={args.steps}", "trainer.test_freq=-1", "trainer.val_before_train=False",
        "trainer.save_freq=-1", "trainer.logger=[file]", f"trainer.default_local_dir={out}",
        "reward_model.timeout_s=null", *extra,
    ]
    os.makedirs(out, exist_ok=True)
    start = time.perf_counter()
    with open(os.path.join(out, "run.log"), "w") as log:
        subprocess.run([sys.executable, "-m", module, *overrides], check=True, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - start
    with open(os.path.join(out, "logs", "metrics.jsonl")) as fh:
        return wall, [json.loads(line) for line in fh]


def summarise(mode: str, wall: float, rows: list[dict]) -> dict:
    measured = rows[1:] or rows  # the first step warms up
    seconds = sum(r["timing_s/step"] for r in measured)
    return {"mode": mode, "wall_s": wall, "steps_per_hour": 3600 * len(rows) / wall,
            "step_s": statistics.median(r["timing_s/step"] for r in measured),
            "trained_tok_s": sum(r["perf/total_num_tokens"] for r in measured) / seconds,
            "scores": [round(r["critic/score/mean"], 3) for r in rows]}


def main(argv=None) -> int:
    args = parse_args(argv)
    from hybridflow.cpu import describe_cpu

    out = args.out or tempfile.mkdtemp(prefix="hybridflow-async-bench-")
    model, train = prepare(args.model, out)
    print(f"{describe_cpu()}; model {args.model}; {BATCH_PROMPTS} prompts x {SAMPLES} samples, "
          f"responses <= {args.length} tokens, {args.steps} steps")
    results = []
    for mode in args.modes.split(","):
        wall, rows = run_mode(mode, model=model, train=train, args=args, out=os.path.join(out, mode))
        results.append(summarise(mode, wall, rows))
    sync = next((r for r in results if r["mode"] == "sync"), None)
    # steps/hour from wall time (process start to exit, the same startup in every mode) is the goal's measure;
    # the trainer's step time leaves out the generation the async modes overlap.
    print(f"{'mode':<20}{'wall s':>9}{'steps/h':>9}{'vs sync':>9}{'step s':>9}{'trained tok/s':>15}  reward per step")
    for r in results:
        speedup = r["steps_per_hour"] / sync["steps_per_hour"] if sync else float("nan")
        print(f"{r['mode']:<20}{r['wall_s']:>9.1f}{r['steps_per_hour']:>9.1f}{speedup:>8.2f}x{r['step_s']:>9.2f}"
              f"{r['trained_tok_s']:>15.1f}  {r['scores']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
