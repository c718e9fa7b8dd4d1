"""The experiment presets of the demo (research tooling, outside the package): the job as a calculator-calling
agent (``tools``), issue 21's GRPO recipe on a harder sum (``reasoning``), an SFT warm-up on worked sums before it
(``reasoning-sft``), and their plumbing on the tiny model (``-tiny``)::

    python benchmarks/demo_presets.py --preset tools [--out RUN] [key=value ...]

A preset is ``hybridflow.trainer.demo``'s (a model, a task, the overrides) plus an agent's tools and an SFT warm-up
(``demo_tools.py``). With a warm-up the held-out score is also measured on the base model first; with tools the
summary adds the share of held-out answers that called the tool.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_tools import (SFTWarmup, run_sft_warmup, tool_overrides, write_tool_config,  # noqa: E402
                        write_tool_rows, write_warmup_traces)
from recipe_ablation import WARMUP_SFT_OVERRIDES, WARMUP_TRACES  # noqa: E402

from hybridflow.config import PPOConfig, load_config  # noqa: E402
from hybridflow.data.preprocess import worked_sums  # noqa: E402
from hybridflow.data.preprocess.worked_sums import STEPS_INSTRUCTION  # noqa: E402
from hybridflow.errors import run_entry_point  # noqa: E402
from hybridflow.tools.config import load_tools  # noqa: E402
from hybridflow.trainer.demo import PRESETS as DEMO_PRESETS  # noqa: E402
from hybridflow.trainer.demo import (DemoPreset, before_after, demo_overrides, prepare_data, prepare_model,  # noqa: E402
                                     train_and_report)
from hybridflow.trainer.main_ppo import run_ppo  # noqa: E402


@dataclass(frozen=True)
class ExperimentPreset(DemoPreset):
    """A demo preset with an agent's tools and an SFT warm-up before GRPO."""

    tools: tuple[str, ...] = ()
    """Tool classes offered to the model (written to ``tools.yaml``); non-empty: tool-agent rows whose
    ``tools_kwargs`` name the first tool, and multi-turn rollouts."""
    system_prompt: str = ""
    """System message of the tool-agent rows (the tool schemas are added to it when rendered)."""
    warmup: SFTWarmup | None = None
    """SFT before GRPO, on tool-use traces or worked sums (the held-out numbers are then also measured on the
    base model)."""


# Issue 21: a harder task than the default's, with the arm that learned it best (docs/recipes.md, "The
# recipe"): the default's settings plus n = 8 samples a prompt and DAPO's dynamic sampling (each round
# generates 16 prompts' groups and keeps those whose scores differ, until 8 are found: the base model answers
# ~2 % of its samples right, so most groups of a plain batch teach nothing), no optimizer step on an
# exactly-zero gradient, 60 steps, and the checkpoint of the best validation kept. The held-out questions are
# kept as the task draws them (132 of 136 draws: repeats dropped) and dropped from training, so the held-out
# score measures the task itself, not only its hard questions.
PRESETS: dict[str, ExperimentPreset] = {}
PRESETS["reasoning"] = replace(
    ExperimentPreset(**vars(DEMO_PRESETS["default"])),
    task_config=("min_terms=2", "max_terms=3", "min_digits=1", "max_digits=2"),
    train_size=1024,
    test_size=136,
    test_as_drawn=True,
    overrides=tuple(o for o in DEMO_PRESETS["default"].overrides
                    if not o.startswith(("trainer.total_training_steps=", "actor_rollout_ref.rollout.n=")))
    # the engine's log-probs as docs/recipes.md measured the preset (the default demo decides by precision since)
    + ("actor_rollout_ref.actor.use_rollout_log_probs=True",
       "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.optim.skip_zero_grad_steps=True",
       "algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=score", "data.gen_batch_size=16",
       "trainer.total_training_steps=60", "trainer.keep_best_checkpoint=True"),
)

# Issue 21's harder configurations fell short of +25 held-out points with GRPO alone: the model answers a
# three-term sum in one token and never writes the intermediate sums, so an answer-only reward has nothing
# to reinforce them with. This preset takes three one-digit terms (4000 questions; the held-out draws that
# training also drew are dropped, leaving ~123 as hard as training), first fine-tunes on 256 worked sums of
# the training questions ("12 + 30 = 42", "42 - 5 = 37", "The final answer is 37."; data/preprocess/
# worked_sums.py, 16 steps at lr 5e-5), asks for the sum one term at a time, leaves 64 response tokens, then
# runs the reasoning preset's GRPO recipe. On three 1-digit terms GRPO keeps improving on the warm-up; on the
# reasoning preset's 2-3 terms of 1-2 digits it adds nothing after it (docs/recipes.md). The summary gives
# the base model's held-out score, the warmed-up model's and GRPO's
WORKED_SUMS_WARMUP = SFTWarmup(traces=WARMUP_TRACES, overrides=WARMUP_SFT_OVERRIDES)
PRESETS["reasoning-sft"] = replace(
    PRESETS["reasoning"],
    task_config=("min_terms=3", "max_terms=3", "min_digits=1", "max_digits=1"),
    test_size=168,
    test_as_drawn=False,
    instruction=STEPS_INSTRUCTION,
    warmup=WORKED_SUMS_WARMUP,
    overrides=tuple(o for o in PRESETS["reasoning"].overrides if not o.startswith("data.max_response_length="))
    + ("data.max_response_length=64",),
)
# its plumbing on the tiny random model (tests/trainer/test_demo.py)
PRESETS["reasoning-sft-tiny"] = replace(
    PRESETS["reasoning-sft"], model="tiny", train_size=32, test_size=8,
    warmup=SFTWarmup(traces=8, overrides=("data.train_batch_size=8", "data.micro_batch_size_per_gpu=8",
                                          "data.max_length=256", "optim.lr=1e-3", "trainer.total_epochs=1")),
    overrides=tuple(o for o in PRESETS["reasoning-sft"].overrides if not o.startswith("trainer.total_training_steps="))
    + ("trainer.total_training_steps=2",),
)

TOOL_TASK = ("min_terms=2", "max_terms=2", "min_digits=2", "max_digits=3", 'operators=["+","-","*"]',
             "allow_parentheses=false", "allow_negation=false")
PRESETS["tools"] = ExperimentPreset(
    model="smollm2-135m-instruct",
    task="basic_arithmetic",
    task_config=TOOL_TASK,
    system_prompt="You can use the calculator tool for arithmetic. Reply with only the final answer.",
    tools=("hybridflow.tools.calculator.CalculatorTool",),
    train_size=256,
    test_size=64,
    # SmolLM2-135M never calls the tool from its prompt alone (0 of 64 sampled answers): a short SFT first,
    # where one trace in 3 calls the tool and the others answer directly
    warmup=SFTWarmup(traces=64, tool_every=3,
                     overrides=("data.train_batch_size=8", "data.micro_batch_size_per_gpu=8", "data.max_length=512",
                                "optim.lr=5e-5", "trainer.total_epochs=1")),
    overrides=(
        "algorithm.adv_estimator=grpo",
        "data.train_batch_size=8",
        "data.max_prompt_length=384",
        "data.max_response_length=96",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        "actor_rollout_ref.rollout.multi_turn.stop_after_tool_call=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.optim.lr=2e-5",
        "actor_rollout_ref.actor.use_rollout_log_probs=True",
        "actor_rollout_ref.model.use_shared_prompt=True",
        "trainer.total_training_steps=20",
        "trainer.test_freq=10",
    ),
)
PRESETS["tools-tiny"] = replace(
    PRESETS["tools"], model="tiny", train_size=16, test_size=4,
    warmup=SFTWarmup(traces=4, overrides=("data.train_batch_size=4", "data.micro_batch_size_per_gpu=4",
                                          "data.max_length=512", "optim.lr=1e-3", "trainer.total_epochs=1")),
    overrides=tuple(o for o in PRESETS["tools"].overrides
                    if not o.startswith(("trainer.total_training_steps=", "actor_rollout_ref.actor.optim.lr=")))
    + ("trainer.total_training_steps=2", "actor_rollout_ref.actor.optim.lr=1e-3"),
)


TOOL_SHARE = "val-aux/tool_call_share@"


def prepare_rows(preset: ExperimentPreset, run_dir: str) -> tuple[str, str]:
    """train / test parquet: tool-agent rows with tools, else the demo's."""
    if not preset.tools:
        return prepare_data(preset, run_dir)
    tool = load_tools(os.path.join(run_dir, "tools.yaml"))[0].name
    return write_tool_rows(task=preset.task, task_config=preset.task_config, train_size=preset.train_size,
                           test_size=preset.test_size, tool=tool, system_prompt=preset.system_prompt,
                           out=os.path.join(run_dir, "data"))


def evaluate_base_model(overrides: list[str], out: str) -> list[dict]:
    """Held-out validation of the model in ``overrides`` alone (``trainer.val_only``), logged under ``out``."""
    print("[demo] held-out validation of the base model (before the SFT warm-up)")
    only = ["trainer.val_only=True", "trainer.val_before_train=True", f"trainer.default_local_dir={out}",
            f"trainer.validation_data_dir={os.path.join(out, 'generations')}"]
    return run_ppo(load_config(PPOConfig, overrides + only)).history


def warm_up(preset: ExperimentPreset, *, model: str, train: str, run_dir: str) -> str:
    """The preset's SFT warm-up; returns the warmed-up model folder. With tools its traces call the tool;
    without, they are worked sums (one operation a line, then the answer: data/preprocess/worked_sums.py)."""
    out, data = os.path.join(run_dir, "sft"), os.path.join(run_dir, "data")
    if preset.tools:
        traces = write_warmup_traces(train, os.path.join(run_dir, "tools.yaml"), data, count=preset.warmup.traces,
                                     tool_every=preset.warmup.tool_every)
    else:
        traces = worked_sums.main(["--rows", train, "--count", str(preset.warmup.traces), "--split", "sft_traces",
                                   "--local_save_dir", data])["sft_traces"]
    return run_sft_warmup(preset.warmup, model=model, traces=traces, out=out)


def report_extras(history: list[dict], *, base: list[dict] | None) -> dict:
    """Print the tool-call share before -> after and the base model's score; returns them."""
    result = {}
    share_key, share_before, share_after = before_after(history, TOOL_SHARE)
    if share_key:
        result.update(tool_share_before=share_before, tool_share_after=share_after)
        print(f"[demo] held-out answers that called a tool ({share_key}): {share_before:.3f} -> {share_after:.3f}")
    if base is not None:
        key, result["base"], _ = before_after(base)
        share = ""
        if share_key:
            _, result["tool_share_base"], _ = before_after(base, TOOL_SHARE)
            share = f", tool-call share {result['tool_share_base']:.3f}"
        print(f"[demo] base model before the SFT warm-up: {key} {result['base']:.3f}{share} (the GRPO 'before' "
              "above is after the warm-up)")
    return result


def run_experiment(preset_name: str, run_dir: str, extra_overrides: list[str]) -> dict:
    """Prepare, (warm up,) train, report. Returns the demo's result plus 'tool_share_before' / 'tool_share_after'
    with tools, 'base' with a warm-up (and 'tool_share_base' with both)."""
    preset = PRESETS[preset_name]
    os.makedirs(run_dir, exist_ok=True)
    print(f"[demo] preset {preset_name}: model {preset.model}, task {preset.task}, run folder {run_dir}")
    if preset.tools:
        write_tool_config(run_dir, preset.tools)
    model = prepare_model(preset, run_dir)
    train, test = prepare_rows(preset, run_dir)
    start = time.time()
    agent = tuple(tool_overrides(os.path.join(run_dir, "tools.yaml"))) if preset.tools else ()

    def overrides_for(model_path: str) -> list[str]:
        return demo_overrides(preset, model=model_path, train=train, test=test, run_dir=run_dir,
                              agent=agent) + extra_overrides

    base = None
    if preset.warmup is not None:
        base = evaluate_base_model(overrides_for(model), os.path.join(run_dir, "base"))
        model = warm_up(preset, model=model, train=train, run_dir=run_dir)
    run, result = train_and_report(overrides_for(model), start=start)
    return {**result, **report_extras(run.history, base=base), "run_dir": run_dir}


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/demo_presets.py", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--out", default=None, help="run folder (default: runs/demo-<preset>-<time>)")
    args, overrides = parser.parse_known_args(argv)
    run_dir = args.out or os.path.join("runs", f"demo-{args.preset}-{time.strftime('%Y%m%d-%H%M%S')}")
    run_experiment(args.preset, os.path.abspath(run_dir), overrides)
    return 0


if __name__ == "__main__":
    sys.exit(run_entry_point(_main, sys.argv[1:]))
