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
commit it was read from.
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
]
RECIPE_CONFIGS = {
    "recipe.dapo.main_dapo": "dapo/config/dapo_trainer.yaml",
    "recipe.entropy.main_entropy": "entropy/config/entropy_trainer.yaml",
}
"""Recipe module -> the YAML its ``@hydra.main(config_name=...)`` loads (in verl-recipe)."""
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
            return [a for a in fh.read().split("\0") if a]


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


def main(verl_dir: str, recipe_dir: str, out_dir: str) -> int:
    repos = {"verl": ("volcengine/verl", verl_dir), "recipe": ("verl-project/verl-recipe", recipe_dir)}
    commits = {label: subprocess.check_output(["git", "-C", d, "rev-parse", "HEAD"], text=True).strip()
               for label, (_, d) in repos.items()}
    commands = []
    for label, path in SCRIPTS:
        name, git_dir = repos[label]
        text = subprocess.check_output(["git", "-C", git_dir, "show", f"HEAD:{path}"], text=True)
        script_args = SFT_SCRIPT_ARGS if "/sft/" in path else []
        try:
            module, args = split_module(run_script(shell_text(path, text), script_args))
        except RuntimeError as err:
            raise RuntimeError(f"{path}: {err}") from err
        record = {"source": f"{name}@{commits[label][:12]}:{path}", "module": module, "args": args}
        if module in RECIPE_CONFIGS:
            record["config"] = "configs/" + os.path.basename(RECIPE_CONFIGS[module])
        commands.append(record)
    os.makedirs(os.path.join(out_dir, "configs"), exist_ok=True)
    for config in RECIPE_CONFIGS.values():
        text = subprocess.check_output(["git", "-C", recipe_dir, "show", f"HEAD:{config}"], text=True)
        header = f"# verl-project/verl-recipe@{commits['recipe'][:12]}:{config} (unchanged; see extract.py)\n"
        with open(os.path.join(out_dir, "configs", os.path.basename(config)), "w") as fh:
            fh.write(header + text)
    with open(os.path.join(out_dir, "commands.json"), "w") as fh:
        json.dump(commands, fh, indent=1)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
