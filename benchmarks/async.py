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
  Ray's object store;
- ``sync_pair``: the bound of overlap on shared cores (issue 16): two ``sync`` runs at once, one thread
  each, their steps counted together. Every core is busy all the time at one-thread efficiency, the most
  a perfect overlap of generation and update can reach unless it also makes the work smaller: the
  only way async does that is filling the decode tail (few live sequences, each decode step still
  streaming every weight) with the next batch's sequences.

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
    parser.add_argument("--rounds", type=int, default=1, help="runs per mode (every other round in reverse order); "
                        "the table then has a line per run and one per mode over all its runs")
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


def mode_command(mode: str, *, model: str, train: str, args, out: str, extra_overrides=()) -> list[str]:
    """The command line of one mode's run, its metrics written under ``out``."""
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
        "reward_model.timeout_s=null", *(extra or []), *extra_overrides,
    ]
    return [sys.executable, "-m", module, *overrides]


def read_metrics(out: str) -> list[dict]:
    with open(os.path.join(out, "logs", "metrics.jsonl")) as fh:
        return [json.loads(line) for line in fh]


def launch(command: list[str], folder: str, env: dict | None = None) -> subprocess.Popen:
    """Start ``command`` with its output in ``folder``/run.log."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "run.log"), "w") as log:  # the child keeps its own copy of the handle
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def run_mode(mode: str, *, model: str, train: str, args, out: str) -> tuple[float, list[dict]]:
    """(wall seconds, metrics rows) of one mode's run."""
    if mode == "sync_pair":
        return run_pair(model=model, train=train, args=args, out=out)
    start = time.perf_counter()
    if launch(mode_command(mode, model=model, train=train, args=args, out=out), out).wait():
        raise SystemExit(f"the {mode} run failed; see {out}/run.log")
    return time.perf_counter() - start, read_metrics(out)


def run_pair(*, model: str, train: str, args, out: str) -> tuple[float, list[dict]]:
    """Two synchronous runs at once, one thread each (they sample with different seeds).

    Both cores stay busy all the time and every piece of work runs at one-thread efficiency, which is what a
    perfect overlap of generation and update on the same cores could at best achieve, so their combined
    steps per hour bound any async schedule here that does not also shorten the work itself (filling the
    decode tail with the next batch's sequences is the one way async does: see the module docstring).
    The rows returned are both runs' rows, so steps per hour counts the steps of the two."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    folders = [os.path.join(out, name) for name in ("a", "b")]
    start = time.perf_counter()
    procs = [launch(mode_command("sync", model=model, train=train, args=args, out=folder,
                                 extra_overrides=[f"actor_rollout_ref.rollout.seed={seed}"]), folder, env)
             for seed, folder in enumerate(folders, start=1)]
    if any([proc.wait() for proc in procs]):  # a list: wait for both before judging
        raise SystemExit(f"a sync_pair run failed; see {out}/a/run.log and {out}/b/run.log")
    return time.perf_counter() - start, read_metrics(folders[0]) + read_metrics(folders[1])


def summarise(name: str, mode: str, wall: float, rows: list[dict]) -> dict:
    """One line of the table: ``rows`` are the metrics of all runs of ``mode`` that took ``wall`` seconds."""
    measured = [r for r in rows if r["step"] > 1] or rows  # the first step of a run warms up
    seconds = sum(r["timing_s/step"] for r in measured)
    processes = 2 if mode == "sync_pair" else 1  # the pair's two runs train side by side
    return {"mode": name, "wall_s": wall, "steps_per_hour": 3600 * len(rows) / wall,
            "step_s": statistics.median(r["timing_s/step"] for r in measured),
            "gen_s": median_of(measured, "timing_s/gen"), "update_s": median_of(measured, "timing_s/update_actor"),
            "trained_tok_s": processes * sum(r["perf/total_num_tokens"] for r in measured) / seconds,
            "scores": [round(r["critic/score/mean"], 3) for r in rows]}


def median_of(rows: list[dict], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return statistics.median(values) if values else float("nan")


def main(argv=None) -> int:
    args = parse_args(argv)
    from hybridflow.cpu import describe_cpu

    out = args.out or tempfile.mkdtemp(prefix="hybridflow-async-bench-")
    model, train = prepare(args.model, out)
    print(f"{describe_cpu()}; model {args.model}; {BATCH_PROMPTS} prompts x {SAMPLES} samples, "
          f"responses <= {args.length} tokens, {args.steps} steps, {args.rounds} round(s)")
    modes, runs = args.modes.split(","), {}
    for round_ in range(args.rounds):
        # every other round runs the modes in reverse, so a drift in the machine's load favours none
        for mode in modes if round_ % 2 == 0 else modes[::-1]:
            folder = os.path.join(out, mode if args.rounds == 1 else f"{mode}.round{round_ + 1}")
            runs.setdefault(mode, []).append(run_mode(mode, model=model, train=train, args=args, out=folder))
    per_run = [summarise(f"{mode} #{k + 1}", mode, *run) for mode in modes for k, run in enumerate(runs[mode])]
    together = [summarise(mode, mode, sum(w for w, _ in runs[mode]), [r for _, rows in runs[mode] for r in rows])
                for mode in modes]
    print_table(per_run + together if args.rounds > 1 else together)
    return 0


def print_table(results: list[dict]) -> None:
    # steps/hour from wall time (process start to exit, the same startup in every mode) is the goal's measure;
    # the trainer's step time leaves out the generation the async modes overlap.
    sync = next((r for r in results if r["mode"] == "sync"), None)
    print(f"{'mode':<24}{'wall s':>9}{'steps/h':>9}{'vs sync':>9}{'step s':>9}{'gen s':>8}{'update s':>9}"
          f"{'trained tok/s':>15}  reward per step")
    for r in results:
        speedup = r["steps_per_hour"] / sync["steps_per_hour"] if sync else float("nan")
        print(f"{r['mode']:<24}{r['wall_s']:>9.1f}{r['steps_per_hour']:>9.1f}{speedup:>8.2f}x{r['step_s']:>9.2f}"
              f"{r['gen_s']:>8.2f}{r['update_s']:>9.2f}{r['trained_tok_s']:>15.1f}  {r['scores']}")


if __name__ == "__main__":
    sys.exit(main())
