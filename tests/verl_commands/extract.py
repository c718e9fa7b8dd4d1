"""Extract the launch command of verl's example and recipe scripts, verbatim, as test data.

    python tests/verl_commands/extract.py VERL_GIT_DIR RECIPE_GIT_DIR tests/verl_commands

writes ``commands.json`` (source script, module, arguments) and ``configs/*.yaml`` (the
recipes' Hydra configs their modules start from, copied unchanged).

Each script listed in ``SCRIPTS`` is read from the given commit of its git repository
(``git show``) and run by bash with the launchers (``python``, ``python3``, ``torchrun``,
``ray job submit --``) replaced by a shell function that records the arguments of the
``-m verl...`` / ``-m recipe...`` call and stops. So the shell does the variable and
arithmetic expansion exactly as it would for a verl user; nothing is hand-copied.
Positional arguments (``$1 $2`` of the SFT scripts) get ``SFT_SCRIPT_ARGS``; ``$HOME`` is
``/HOME``, a SLURM job has one node, ``conda`` does nothing. The tests then change only the
module prefix, the model path and the data paths (see ``test_verl_commands.py``).

VERL_GIT_DIR / RECIPE_GIT_DIR are git clones of github.com/volcengine/verl and
github.com/verl-project/verl-recipe (verl's ``recipe/`` submodule); each record names the
commit it was read from. Only ``git`` runs, no network: a bare mirror works as well as a clone (the
records at the top of ``commands.json`` were written from the mirrors that the ``fetch`` tool makes,
``/work/.mirror/volcengine+verl/repo`` and ``/work/.mirror/verl-project+verl-recipe/repo``). A script that
stamps the date into its names (``$(date ...)``) gives new names at each run: keep the committed records'
names when only other scripts were added.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

# (repository label, path inside it); the sample: GSM8K quickstart, ppo_trainer/, grpo_trainer/,
# sft/gsm8k/, DAPO, GSPO, CISPO, RLOO, ReMax, REINFORCE++, GPG and the LoRA tuning scripts.
SCRIPTS = [
    ("verl", "docs/start/quickstart.rst"),  # the GSM8K quickstart: its shell block
    ("verl", "examples/ppo_trainer/run_deepseek7b_llm.sh"),
    ("verl", "examples/ppo_trainer/run_deepseek7b_llm_sp2.sh"),
    ("verl", "examples/ppo_trainer/run_gemma.sh"),
    ("verl", "examples/ppo_trainer/run_qwen2-7b_seq_balance.sh"),
    ("verl", "examples/ppo_trainer/run_qwen2-7b_sglang_seq_balance.sh"),
    ("verl", "examples/ppo_trainer/run_qwen2-7b_rm.sh"),
    ("verl", "examples/ppo_trainer/run_qwen2-7b_rm_legacy.sh"),
    ("verl", "examples/ppo_trainer/run_qwen2-7b_rm_reward_loop_colocate.sh"),
    ("verl", "examples/ppo_trainer/run_qwen2.5-3b_rm_legacy.sh"),
    ("verl", "examples/grpo_trainer/run_deepseek7b_llm.sh"),
    ("verl", "examples/grpo_trainer/run_deepseek7b_llm_math.sh"),
    ("verl", "examples/grpo_trainer/run_deepseek7b_llm_seq_balance.sh"),
    ("verl", "examples/grpo_trainer/run_qwen2-7b.sh"),
    ("verl", "examples/grpo_trainer/run_qwen2-7b_math.sh"),
    ("verl", "examples/grpo_trainer/run_qwen2-7b_seq_balance.sh"),
    ("verl", "examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh"),
    ("verl", "examples/grpo_trainer/run_qwen3-8b.sh"),
    ("verl", "examples/sft/gsm8k/run_deepseek_6b7.sh"),
    ("verl", "examples/sft/gsm8k/run_gemma_2b.sh"),
    ("verl", "examples/sft/gsm8k/run_gemma_7b.sh"),
    ("verl", "examples/sft/gsm8k/run_qwen_05_peft.sh"),
    ("verl", "examples/sft/gsm8k/run_qwen_05_sp2.sh"),
    ("verl", "examples/cispo_trainer/run_cispo_qwen2_5_0_5b_gsm8k.sh"),
    ("verl", "examples/gspo_trainer/test_gspo_3b_math.sh"),
    ("verl", "examples/gpg_trainer/run_qwen2-7b_math.sh"),
    ("verl", "examples/rloo_trainer/run_qwen2-7b.sh"),
    ("verl", "examples/remax_trainer/run_qwen2.5-3b_seq_balance.sh"),
    ("verl", "examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh"),
    ("verl", "examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf_baseline.sh"),
    ("verl", "examples/tuning/0.5b/qwen2-0.5b_grpo-lora_1_h100_fsdp_vllm.sh"),
    ("verl", "examples/tuning/3b/qwen2-3b_grpo-lora_1_h100_fsdp_vllm.sh"),
    ("verl", "examples/tuning/7b/qwen2-7b_grpo_2_h800_fsdp_vllm.sh"),
    ("recipe", "dapo/test_dapo_7b.sh"),
    ("recipe", "dapo/test_dapo_7b_math.sh"),
    ("recipe", "dapo/run_dapo_qwen2.5_32b.sh"),
    ("recipe", "entropy/7b_clip_cov.sh"),
    # issue 37: verl 0.9's dialect. The new SFT trainer (engine=fsdp, engine.*, data.messages_key, pad_mode)
    ("recipe", "char_count/train_sft.sh"),
    ("recipe", "open_math_reasoning/run_sft_qwen3_8b.sh"),
    ("verl", "examples/sft/gsm8k/run_qwen_05_sp2_liger.sh"),
    ("verl", "examples/sft/gsm8k/run_seed_oss_36b_sft.sh"),
    ("verl", "examples/sft/multiturn/run_qwen_05_sp2.sh"),
    ("recipe", "retool/run_qwen2_7b_sft.sh"),
    # one-step-off and fully async recipes: split placement and partial rollout from verl's keys alone
    ("verl", "verl/experimental/one_step_off_policy/shell/dapo_7b_math_fsdp2_4_12.sh"),
    ("verl", "verl/experimental/one_step_off_policy/shell/dapo_7b_math_fsdp2_64_64.sh"),
    ("verl", "verl/experimental/one_step_off_policy/shell/dapo_7b_math_fsdp2_colocate.sh"),
    ("verl", "verl/experimental/one_step_off_policy/shell/dapo_7b_math_fsdp2_sglang_4_12.sh"),
    ("verl", "verl/experimental/one_step_off_policy/shell/dapo_7b_math_fsdp2_sglang_colocate.sh"),
    ("verl", "verl/experimental/one_step_off_policy/shell/grpo_0.6b_gsm8k_fsdp2_2_6.sh"),
    ("verl", "verl/experimental/one_step_off_policy/shell/grpo_0.6b_gsm8k_fsdp2_sglang_2_6.sh"),
    ("verl", "verl/experimental/one_step_off_policy/shell/grpo_3b_gsm8k_fsdp2_2_6.sh"),
    ("verl", "verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_4_4.sh"),
    ("verl", "verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_4_12.sh"),
    ("verl", "verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_8_8.sh"),
    ("verl", "verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_16_16.sh"),
    ("verl", "verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_32_32.sh"),
    ("verl", "verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_64_64_mis.sh"),
    ("verl", "verl/experimental/fully_async_policy/shell/dapo_30b_a3b_base_math_fsdp.sh"),
    # warn-only keys: checkpoint_engine, trace, global_profiler, multi_stage_wake_up; over_sample_rate
    ("verl", "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn.sh"),
    ("verl", "examples/sglang_multiturn/run_qwen3-4b_gsm8k_multiturn.sh"),
    ("verl", "examples/sglang_multiturn/run_qwen3_4b_dapo_multiturn.sh"),
    ("verl", "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_tool_agent_mlflow.sh"),
    ("verl", "examples/ppo_trainer/run_qwen2-7b_rm_seq_balance_nsys.sh"),
    ("recipe", "dapo/run_dapo_qwen2.5_7b_npu.sh"),
    # the reward model's own pool (reward_model.enable_resource_pool, n_gpus_per_node, nnodes)
    ("recipe", "fapo/run_fapo_7b.sh"),
    # more of verl HEAD's examples and recipes
    ("verl", "examples/gmpo_trainer/test_dapo_7b_math.sh"),
    ("verl", "examples/gmpo_trainer/run_qwen2_5-7b_math.sh"),
    ("verl", "examples/otb_trainer/run_qwen2_5-7b.sh"),
    ("verl", "examples/rollout_correction/run_with_rollout_corr.sh"),
    ("verl", "examples/rollout_correction/run_with_rollout_corr_multi_rs.sh"),
    ("verl", "examples/remax_trainer/run_qwen2.5-7b_seq_balance.sh"),
    ("verl", "examples/ppo_trainer/run_qwen2-7b_rm_seq_balance.sh"),
    ("verl", "examples/ppo_trainer/run_qwen2.5-32b.sh"),
    ("verl", "examples/tuning/1.5b/qwen2-1.5b_grpo-lora_1_h100_fsdp_vllm.sh"),
    ("verl", "examples/tuning/14b/qwen2-14b_grpo-lora_2_h100_fsdp_vllm.sh"),
    ("verl", "examples/tuning/70b/qwen2-70b_grpo_32_h800_fsdp_vllm.sh"),
    # PRIME (python -m recipe.prime.main_prime): the implicit PRM trained online
    ("recipe", "prime/run_prime_qwen.sh"),
    ("recipe", "prime/run_prime_qwen_code.sh"),
    # vision-language RL (issue 36): Qwen2.5-VL on geo3k, data.image_key
    ("verl", "examples/grpo_trainer/run_qwen2_5_vl-7b.sh"),
    ("verl", "examples/grpo_trainer/run_qwen2_5_vl-7b_freeze_vision.sh"),
    ("verl", "examples/grpo_trainer/run_qwen2_5_vl-7b_lora.sh"),
    ("verl", "examples/grpo_trainer/run_qwen2_5_vl-7b-sglang.sh"),
    ("verl", "examples/grpo_trainer/run_qwen2_5_vl-7b_seq_balance.sh"),
    # issue 51: verl's newest vision-language scripts. Qwen3-VL SFT on pokemon captions (verl 0.9's sft_trainer with
    # engine=fsdp optim=fsdp; SP_SIZE=2 and PAD_MODE=no_padding by default) and multi-turn VL GRPO with the geo3k tool
    ("verl", "examples/sft/vlm/run_qwen3_vl_2b.sh"),
    ("verl", "examples/sglang_multiturn/geo3k/run_qwen2.5-3b_geo3k_multiturn.sh"),
    # issue 60: the GVPO recipe (python -m recipe.gvpo.gvpo_main_ppo): loss_mode=gvpo with actor.gvpo_beta
    ("recipe", "gvpo/run_qwen2-7b_math_gvpo.sh"),
    # Megatron: refused in one line that says so (test_verl_commands.EXPECTED_ERRORS)
    ("verl", "examples/grpo_trainer/run_qwen2-7b_math_megatron.sh"),
    ("verl", "verl/experimental/one_step_off_policy/shell/dapo_7b_math_megatron_4_12.sh"),
]
RECIPE_CONFIGS = {
    "recipe.dapo.main_dapo": "dapo/config/dapo_trainer.yaml",
    "recipe.entropy.main_entropy": "entropy/config/entropy_trainer.yaml",
    "recipe.prime.main_prime": "prime/config/prime_trainer.yaml",
    "recipe.gvpo.gvpo_main_ppo": "gvpo/config/gvpo_trainer.yaml",
}
"""Recipe module -> the YAML its ``@hydra.main(config_name=...)`` loads (in verl-recipe)."""
VERL_CONFIGS = {
    "verl.experimental.one_step_off_policy.main_ppo": "verl/experimental/one_step_off_policy/config/"
                                                      "one_step_off_ppo_trainer.yaml",
    "verl.experimental.fully_async_policy.fully_async_main": "verl/experimental/fully_async_policy/config/"
                                                             "fully_async_ppo_trainer.yaml",
}
"""verl module -> the YAML its ``@hydra.main`` loads (in verl)."""
REPO = "/REPO/"
"""A path the script builds from its checkout (``$(pwd)/examples/...``): the file is copied to ``configs/``
and the argument names it as ``/CONFIGS/<file>`` (the test points that at its folder)."""
SFT_SCRIPT_ARGS = ["2", "/SAVE"]
"""``$1 $2`` of verl's SFT scripts: processes per node and the save path (other scripts take none)."""

STUBS = r"""
__record() {
  for a in "$@"; do if [ "$a" = "-m" ]; then printf '%s\0' "$@" > "$__DUMP"; exit 0; fi; done
  return 0
}
python() { __record "$@"; }
python3() { __record "$@"; }
torchrun() { __record "$@"; }
ray() { while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done; shift; "$@"; }
nvidia-smi() { return 0; }
huggingface-cli() { return 0; }
conda() { return 0; }
export -f __record python python3 torchrun ray nvidia-smi huggingface-cli conda
"""


def run_script(text: str, args: list[str]) -> list[str]:
    with tempfile.TemporaryDirectory() as work:
        dump = os.path.join(work, "argv")
        env = {"PATH": "/usr/bin:/bin", "HOME": "/HOME", "SLURM_JOB_NUM_NODES": "1", "__DUMP": dump}
        subprocess.run(["bash", "-c", STUBS + text, "script", *args], cwd=work, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30, check=False)
        if not os.path.exists(dump):
            raise RuntimeError("the script made no `-m verl...` call")
        with open(dump) as fh:
            return [a.replace(work + "/", REPO) for a in fh.read().split("\0") if a]


def shell_text(path: str, text: str) -> str:
    """A script as bash runs it; for a doc page, the indented shell block that launches ``-m verl``."""
    if not path.endswith(".rst"):
        return text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "-m verl." in line)
    block = []
    for line in lines[start:]:
        block.append(line.strip())
        if not line.rstrip().endswith("\\"):
            break
    return "\n".join(block) + "\n"


def split_module(argv: list[str]) -> tuple[str, list[str]]:
    """Launcher argv -> (module after -m, the arguments after it)."""
    index = argv.index("-m")
    return argv[index + 1], argv[index + 2:]


def checkout_files(args: list[str], copies: set[str]) -> tuple[str | None, list[str]]:
    """(the ``--config-path/--config-name`` YAML inside the checkout or None, the other arguments with each
    checkout YAML named ``/CONFIGS/<file>``); ``copies`` collects the files to copy. Other checkout files
    (a reward function's ``.py``) stay ``/REPO/<path>``: the test points those keys at its own files."""
    path = name = None
    rest = []
    for arg in args:
        flag, _, value = arg.partition("=")
        if flag in ("--config-path", "--config-name"):
            path, name = (value, name) if flag == "--config-path" else (path, value)
            continue
        if REPO in value and value.endswith((".yaml", ".yml")):  # a tool / interaction config
            copies.add(value.split(REPO, 1)[1])
            arg = f"{flag}=/CONFIGS/{os.path.basename(value)}"
        rest.append(arg)
    if path is None or not path.startswith(REPO):
        return None, rest  # a module's own config folder: RECIPE_CONFIGS / VERL_CONFIGS name it
    name = name if name.endswith(".yaml") else name + ".yaml"
    config = os.path.join(path[len(REPO):], name)
    copies.add(config)
    return config, rest


def main(verl_dir: str, recipe_dir: str, out_dir: str) -> int:
    repos = {"verl": ("volcengine/verl", verl_dir), "recipe": ("verl-project/verl-recipe", recipe_dir)}
    commits = {label: subprocess.check_output(["git", "-C", d, "rev-parse", "HEAD"], text=True).strip()
               for label, (_, d) in repos.items()}
    commands, copies = [], {}
    for label, path in SCRIPTS:
        name, git_dir = repos[label]
        text = subprocess.check_output(["git", "-C", git_dir, "show", f"HEAD:{path}"], text=True)
        script_args = SFT_SCRIPT_ARGS if "/sft/" in path else []
        try:
            module, args = split_module(run_script(shell_text(path, text), script_args))
        except RuntimeError as err:
            raise RuntimeError(f"{path}: {err}") from err
        record = {"source": f"{name}@{commits[label][:12]}:{path}", "module": module}
        config, args = checkout_files(args, copies.setdefault(label, set()))
        record["args"] = args
        config = config or RECIPE_CONFIGS.get(module) or VERL_CONFIGS.get(module)
        if config:
            copies["recipe" if module in RECIPE_CONFIGS else label].add(config)
            record["config"] = "configs/" + os.path.basename(config)
        commands.append(record)
    os.makedirs(os.path.join(out_dir, "configs"), exist_ok=True)
    for label, files in copies.items():
        for config in sorted(files):
            source = label
            if label == "verl" and config.startswith("recipe/"):  # verl's recipe/ is the verl-recipe submodule
                source, config = "recipe", config[len("recipe/"):]
            name, git_dir = repos[source]
            text = subprocess.check_output(["git", "-C", git_dir, "show", f"HEAD:{config}"], text=True)
            header = f"# {name}@{commits[source][:12]}:{config} (unchanged; see extract.py)\n"
            with open(os.path.join(out_dir, "configs", os.path.basename(config)), "w") as fh:
                fh.write(header + text)
    with open(os.path.join(out_dir, "commands.json"), "w") as fh:
        json.dump(commands, fh, indent=1)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
