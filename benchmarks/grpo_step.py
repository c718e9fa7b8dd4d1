"""One GRPO step, hybridflow against TRL's GRPOTrainer on the same work, interleaved in one run.

The same model (SmolLM2-135M-Instruct by default), the same prompts (a reasoning-gym task
in verl's parquet schema), batch (8 prompts x 4 samples), temperature 1, learning rate,
response limit, no KL, fp32, 2 threads. One optimizer step per generation on both sides:
hybridflow with ``actor.use_rollout_log_probs=True`` (the engine's log-probs are the old
policy's, no extra forward) and TRL with ``num_iterations=1`` (it skips the old log-prob
pass in that case too). Each framework runs ``--steps`` steps in its own process per
round; the first ``--warmup`` steps of every process are left out; the rounds
alternate which framework goes first, so both see the same machine load.

hybridflow runs in each requested forward layout (``--layouts``: ``padded``, ``packed``
= ``use_remove_padding``, ``shared`` = ``use_shared_prompt``; each with ``-chunked``: log-probs
from the hidden states in chunks, ``use_fused_kernels``), so the same run also gives the
ablation of the update's layout and head. The gradient norm of every step is printed per run:
the same generations give the same norms where two runs compute the same gradients.

Printed: seconds per step (median over the measured steps of all rounds), generated
tokens per second, ``timing_s/update_actor`` and ``timing_s/gen`` for hybridflow, the peak
resident memory of each process (``perf/max_memory_rss_gb``), and the
ratio TRL / hybridflow, with the CPU (model name, ISA) named. ``--frameworks trl-tuned`` adds TRL with the
CPU settings hybridflow gives itself (huge-page buffers, glibc keeping freed memory, the OpenMP wait policy
:mod:`hybridflow.omp` picks at start-up: environment variables any TRL user can set); plain ``trl`` runs
with the environment the script was launched with. The ratio is against the faster TRL run. The floor of the update
(6 x parameters x tokens the update needs / the measured fp32 matmul rate) is printed
beside the update time.

    pip install -e '.[bench]'              # TRL (not needed by anything else)
    python benchmarks/grpo_step.py --lengths 64,256 --steps 4 --rounds 2
    python benchmarks/grpo_step.py --model tiny --steps 2 --rounds 1   # smoke run
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

os.environ.setdefault("OMP_NUM_THREADS", "2")
# The environment as launched, before anything here imports hybridflow (whose import picks an OpenMP wait policy
# for its process): plain TRL gets the user's wait policy from it (hybridflow.omp.user_settings). Nothing imports
# hybridflow at module level: the TRL worker runs this file, and must load torch (so libgomp) first.
LAUNCH_ENV = dict(os.environ)

BATCH_PROMPTS, SAMPLES, LEARNING_RATE = 8, 4, 2e-5
LAYOUT_OVERRIDES = {
    "padded": ["actor_rollout_ref.model.use_shared_prompt=False"],
    "packed": ["actor_rollout_ref.model.use_remove_padding=True"],
    "shared": ["actor_rollout_ref.model.use_shared_prompt=True"],
}
CHUNKED_HEAD = ["actor_rollout_ref.model.use_fused_kernels=True"]
LAYOUT_OVERRIDES.update({f"{name}-chunked": [*overrides, *CHUNKED_HEAD]
                         for name, overrides in dict(LAYOUT_OVERRIDES).items()})


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), 'tiny', or a folder")
    parser.add_argument("--lengths", default="64,256", help="response limits (max new tokens), comma-separated")
    parser.add_argument("--steps", type=int, default=4, help="steps per process, --warmup of them left out")
    parser.add_argument("--warmup", type=int, default=1,
                        help="first steps of every process left out (the heap and caches grow over the first few)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--layouts", default="padded,shared", help="hybridflow forward layouts to run")
    parser.add_argument("--frameworks", default="hybridflow,trl",
                        help="of hybridflow, trl, trl-tuned (TRL with hybridflow's CPU allocator settings as env vars)")
    parser.add_argument("--precisions", default="fp32",
                        help="comma-separated fp32 / bf16 (issue 62): hybridflow's fsdp_config.mixed_precision and "
                             "rollout.dtype, TRL's bf16 switch (autocast over fp32 weights on a CPU)")
    parser.add_argument("--out", default=None, help="work folder (default: a temp dir)")
    parser.add_argument("--trl-worker", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ------------------------------------------------------------------------------ shared inputs
def prepare(args, out: str) -> tuple[str, str]:
    """(model folder, train parquet) shared by both frameworks."""
    if args.model == "tiny":
        from hybridflow.models.tiny import save_tiny_model

        model = save_tiny_model(os.path.join(out, "tiny_model"), arch="qwen2", seed=0)
    elif args.model == "default":
        from hybridflow.models.default_model import fetch_default_model

        model = fetch_default_model()
    else:
        model = args.model
    from hybridflow.data.preprocess import reasoning_gym

    paths = reasoning_gym.main(["--task", "chain_sum", "--size", "256", "--test_size", "8",
                                "--config", "min_terms=2", "--config", "max_terms=3",
                                "--config", "min_digits=1", "--config", "max_digits=2",
                                "--local_save_dir", os.path.join(out, "data")])
    return model, paths["train"]


# ------------------------------------------------------------------------------ hybridflow
PRECISION_OVERRIDES = {
    "fp32": ["actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32",
             "actor_rollout_ref.ref.fsdp_config.mixed_precision=fp32", "actor_rollout_ref.rollout.dtype=float32"],
    "bf16": ["actor_rollout_ref.actor.fsdp_config.mixed_precision=bf16",
             "actor_rollout_ref.ref.fsdp_config.mixed_precision=bf16", "actor_rollout_ref.rollout.dtype=bfloat16"],
}
"""hybridflow's keys per ``--precisions`` choice: compute dtype of the update (master weights stay fp32) and engine."""


def run_hybridflow(*, model: str, train: str, length: int, steps: int, layout: str, out: str,
                   precision: str = "fp32") -> list[dict]:
    """Metrics rows of ``steps`` GRPO steps of ``python -m hybridflow.trainer.main_ppo``."""
    overrides = [
        f"actor_rollout_ref.model.path={model}", f"data.train_files={train}", f"data.val_files={train}",
        "algorithm.adv_estimator=grpo", f"data.train_batch_size={BATCH_PROMPTS}", "data.max_prompt_length=256",
        f"data.max_response_length={length}", f"actor_rollout_ref.rollout.n={SAMPLES}",
        "actor_rollout_ref.rollout.temperature=1.0", f"actor_rollout_ref.actor.ppo_mini_batch_size={BATCH_PROMPTS}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={BATCH_PROMPTS * SAMPLES}",
        f"actor_rollout_ref.actor.optim.lr={LEARNING_RATE}", "actor_rollout_ref.actor.use_rollout_log_probs=True",
        f"trainer.total_training_steps={steps}", "trainer.test_freq=-1", "trainer.val_before_train=False",
        "trainer.save_freq=-1", "trainer.logger=[file]", f"trainer.default_local_dir={out}",
        "reward_model.timeout_s=null", *LAYOUT_OVERRIDES[layout], *PRECISION_OVERRIDES[precision],
    ]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "run.log"), "w") as log:
        subprocess.run([sys.executable, "-m", "hybridflow.trainer.main_ppo", *overrides], check=True,
                       stdout=log, stderr=subprocess.STDOUT)
    with open(os.path.join(out, "logs", "metrics.jsonl")) as fh:
        return [json.loads(line) for line in fh]


def hybridflow_steps(rows: list[dict], warmup: int = 1) -> list[dict]:
    """Per measured step (after ``warmup``): seconds, generated tokens, update and generation seconds."""
    return [{"seconds": r["timing_s/step"], "gen_tokens": r["response_length/mean"] * BATCH_PROMPTS * SAMPLES,
             "update": r["timing_s/update_actor"], "grad_norm": r["actor/grad_norm"], "gen": r["timing_s/gen"], "rss_gb": r["perf/max_memory_rss_gb"],
             # tokens the update needs: every valid token, and with shared prompts each prompt once
             "update_tokens": r["perf/total_num_tokens"],
             "shared_tokens": r["perf/total_num_tokens"]
             - r["prompt_length/mean"] * BATCH_PROMPTS * (SAMPLES - 1)} for r in rows[warmup:]]


# ------------------------------------------------------------------------------ TRL
def trl_worker(spec_path: str) -> None:
    """Runs in its own process: TRL's GRPOTrainer for ``steps`` steps, step times to a JSON file."""
    import pandas as pd
    import torch  # loads libgomp before `import hybridflow` below could pick its wait policy for this process
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from hybridflow.rewards import default_compute_score

    with open(spec_path) as fh:
        spec = json.load(fh)
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    frame = pd.read_parquet(spec["train"])
    dataset = Dataset.from_list([{"prompt": [dict(m) for m in row["prompt"]], "data_source": row["data_source"],
                                  "ground_truth": row["reward_model"]["ground_truth"]} for _, row in frame.iterrows()])

    def reward(completions, data_source, ground_truth, **_):
        return [float(default_compute_score(source, c[0]["content"], truth))
                for c, source, truth in zip(completions, data_source, ground_truth)]

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.rows, self.start = [], None

        def on_step_begin(self, args, state, control, **kw):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.rows.append({"seconds": time.perf_counter() - self.start})

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs and self.rows:
                self.rows[-1]["gen_tokens"] = logs["completions/mean_length"] * BATCH_PROMPTS * SAMPLES

    config = GRPOConfig(
        output_dir=spec["out"], per_device_train_batch_size=BATCH_PROMPTS * SAMPLES, gradient_accumulation_steps=1,
        num_generations=SAMPLES, max_completion_length=spec["length"], temperature=1.0,
        learning_rate=LEARNING_RATE, lr_scheduler_type="constant", warmup_steps=0, beta=0.0, num_iterations=1,
        use_cpu=True, bf16=spec.get("precision") == "bf16", logging_steps=1, save_strategy="no", report_to="none", max_steps=spec["steps"],
        seed=0, dataloader_num_workers=0, max_grad_norm=1.0, disable_tqdm=True,
        # TRL at its fastest here: its default recomputes every layer in backward, which a 135M model never needs
        gradient_checkpointing=False,
    )
    times = StepTimes()
    GRPOTrainer(model=spec["model"], reward_funcs=reward, args=config, train_dataset=dataset,
                callbacks=[times]).train()
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # GiB, as hybridflow reports it
    with open(spec["result"], "w") as fh:
        json.dump([dict(row, rss_gb=peak) for row in times.rows], fh)


def plain_env() -> dict[str, str]:
    """Plain TRL: the environment the user launched this script with; this process imported hybridflow, which
    set torch's huge-page allocations and an OpenMP wait policy for itself (and so for its children)."""
    from hybridflow import omp

    env = {k: v for k, v in os.environ.items() if k not in (*omp.POLICY_VARS, omp.MARK)}
    return {**env, **omp.user_settings(LAUNCH_ENV), "THP_MEM_ALLOC_ENABLE": "0"}


def tuned_env() -> dict[str, str]:
    """``trl-tuned``: TRL's process with the CPU settings hybridflow applies to itself (torch's huge-page
    allocations, glibc keeping freed memory, the OpenMP wait policy it chose at start-up), set the way any TRL
    user could: environment variables."""
    from hybridflow.cpu import kept_heap_environment

    return {**os.environ, "THP_MEM_ALLOC_ENABLE": "1", **kept_heap_environment()}


def run_trl(*, model: str, train: str, length: int, steps: int, out: str, precision: str = "fp32",
            tuned: bool = False, warmup: int = 1) -> list[dict]:
    spec = {"model": model, "train": train, "length": length, "steps": steps, "out": out, "precision": precision,
            "result": os.path.join(out, "steps.json")}
    os.makedirs(out, exist_ok=True)
    spec_path = os.path.join(out, "spec.json")
    with open(spec_path, "w") as fh:
        json.dump(spec, fh)
    with open(os.path.join(out, "run.log"), "w") as log:
        subprocess.run([sys.executable, os.path.abspath(__file__), "--trl-worker", spec_path], check=True,
                       stdout=log, stderr=subprocess.STDOUT, env=tuned_env() if tuned else plain_env())
    with open(spec["result"]) as fh:
        return json.load(fh)[warmup:]


# ------------------------------------------------------------------------------ report
def matmul_rate_and_params(model_path: str, precisions: list[str]) -> tuple[dict[str, float], int]:
    """(this machine's steady matmul FLOP/s at each of ``precisions`` on a 2048x576 by 576x1536 product,
    SmolLM2-135M's MLP shape; the model's parameter count)."""
    import torch

    from hybridflow.models import load_causal_lm
    from rollout_floor import steady_matmul_flops

    params = sum(p.numel() for p in load_causal_lm(model_path, dtype="float32").parameters())
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    return {name: steady_matmul_flops(2048, 576, 1536, dtype=dtypes[name]) for name in precisions}, params


def summarise(name: str, steps: list[dict]) -> dict:
    out = {"name": name, "seconds": statistics.median(s["seconds"] for s in steps)}
    out["tok_s"] = statistics.median(s.get("gen_tokens", float("nan")) / s["seconds"] for s in steps)
    for key in ("update", "gen", "update_tokens", "shared_tokens", "rss_gb"):
        if all(key in s for s in steps):
            out[key] = statistics.median(s[key] for s in steps)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.trl_worker:
        trl_worker(args.trl_worker)
        return 0
    from hybridflow import omp
    from hybridflow.cpu import describe_cpu

    out = args.out or tempfile.mkdtemp(prefix="grpo-step-")
    model, train = prepare(args, out)
    frameworks = args.frameworks.split(",")
    layouts = args.layouts.split(",")
    precisions = args.precisions.split(",")
    if args.warmup >= args.steps:
        raise SystemExit(f"--warmup {args.warmup} leaves no measured step of --steps {args.steps}: raise --steps")
    print(f"cpu: {describe_cpu()}, {os.cpu_count()} cores, OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}, "
          f"load average {os.getloadavg()[0]:.2f}")
    users = omp.user_settings(LAUNCH_ENV)
    print(f"OpenMP: hybridflow and trl-tuned: {omp.choice}; trl: "
          + (", ".join(f"{k}={v}" for k, v in users.items()) or "libgomp's default (spins ~300000 iterations)"))
    print(f"model {model}; {BATCH_PROMPTS} prompts x {SAMPLES} samples; {args.steps} steps per process "
          f"(first {args.warmup} dropped) x {args.rounds} rounds")
    for length in map(int, args.lengths.split(",")):
        results: dict[str, list[dict]] = {}
        for round_index in range(args.rounds):
            runs = [(f"{trl}/{p}", None, p) for trl in ("trl", "trl-tuned") if trl in frameworks
                    for p in precisions]
            runs += [(f"hybridflow/{layout}/{p}", layout, p) for layout in layouts for p in precisions
                     ] if "hybridflow" in frameworks else []
            for name, layout, precision in (runs if round_index % 2 == 0 else runs[::-1]):
                folder = os.path.join(out, f"{name.replace('/', '-')}-{length}-r{round_index}")
                started = time.perf_counter()
                if layout is None:
                    steps = run_trl(model=model, train=train, length=length, steps=args.steps, out=folder,
                                    precision=precision, tuned=name.startswith("trl-tuned"), warmup=args.warmup)
                else:
                    steps = hybridflow_steps(run_hybridflow(model=model, train=train, length=length,
                                                            steps=args.steps, layout=layout, out=folder,
                                                            precision=precision), args.warmup)
                results.setdefault(name, []).extend(steps)
                print(f"  [{length} tokens, round {round_index}] {name}: {time.perf_counter() - started:.0f} s "
                      f"for {args.steps} steps", flush=True)
        report(length, [summarise(name, steps) for name, steps in results.items()], model)
        for name, steps in results.items():
            if all("grad_norm" in s for s in steps):
                print(f"{name}: actor/grad_norm per measured step " + ", ".join(f"{s['grad_norm']:.6g}" for s in steps))
    return 0


def report(length: int, rows: list[dict], model: str) -> None:
    print(f"\nresponses <= {length} tokens")
    print("| run | s/step | gen tok/s | update s | gen s | peak RSS GiB | best TRL / this |")
    print("|---|---|---|---|---|---|---|")
    trl = min((r["seconds"] for r in rows if r["name"].startswith("trl")), default=None)  # TRL at its best
    for r in rows:
        ratio = f"{trl / r['seconds']:.2f}x" if trl else "-"
        print(f"| {r['name']} | {r['seconds']:.1f} | {r['tok_s']:.1f} | {r.get('update', float('nan')):.1f} | "
              f"{r.get('gen', float('nan')):.1f} | {r.get('rss_gb', float('nan')):.2f} | {ratio} |")
    hybrid = [r for r in rows if "update_tokens" in r]
    if not hybrid:
        return
    rates, params = matmul_rate_and_params(model, list(dict.fromkeys(r["name"].rsplit("/", 1)[-1] for r in hybrid)))
    print(f"\nupdate floor = 6 x {params / 1e6:.0f}M parameters x tokens / the matmul rate of the run's precision "
          "(2048x576 @ 576x1536 at the steady clock, best of 5 after 1 s of warm-up, measured now: "
          + ", ".join(f"{name} {rate / 1e9:.1f}" for name, rate in rates.items()) + " GFLOP/s)")
    for r in hybrid:
        rate = rates[r["name"].rsplit("/", 1)[-1]]
        full, shared = (6 * params * r[k] / rate for k in ("update_tokens", "shared_tokens"))
        print(f"{r['name']}: update {r['update']:.1f} s = {6 * params * r['update_tokens'] / r['update'] / 1e9:.1f} "
              f"GFLOP/s over all {r['update_tokens']:.0f} valid tokens; floor {full:.1f} s "
              f"({100 * full / r['update']:.0f} %), {shared:.1f} s with each prompt once "
              f"({100 * shared / r['update']:.0f} %)")


if __name__ == "__main__":
    sys.exit(main())
