"""Real verl commands through config loading and every pre-load check (no model loads).

``commands.json`` holds the launch commands of verl's example and recipe scripts, extracted
verbatim by ``extract.py`` (the shell expands each script; nothing is hand-copied; each entry
names its source script and commit). Only three things change, as they would for a user:
the module prefix (``verl.trainer.X`` -> ``hybridflow.trainer.X``; a recipe module -> main_ppo
started from the recipe's own YAML, as its ``@hydra.main`` does), the model paths (a tiny
model with a 32k context, like the 7B models these scripts name) and the data paths.

vLLM and SGLang are GPU packages: they are faked as installed, so the test checks that the
configs are accepted; the clear error when they are absent is tested separately. A command
that hybridflow rejects on purpose is listed in ``EXPECTED_ERRORS`` with the line it gets.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import math
import pathlib
import sys
import types

import pandas as pd
import pytest

from hybridflow.config import PPOConfig, SFTConfig, load_config, split_config_args
from hybridflow.errors import ConfigError

HERE = pathlib.Path(__file__).parent
COMMANDS = json.loads((HERE / "commands.json").read_text())

MODULES = {  # verl module -> (hybridflow module, trainer); a recipe module also starts from its YAML
    "verl.trainer.main_ppo": ("hybridflow.trainer.main_ppo", "ppo"),
    "verl.trainer.fsdp_sft_trainer": ("hybridflow.trainer.fsdp_sft_trainer", "sft"),
    "verl.trainer.sft_trainer": ("hybridflow.trainer.sft_trainer", "sft"),
    "recipe.dapo.main_dapo": ("hybridflow.trainer.main_dapo", "dapo"),
    "recipe.prime.main_prime": ("hybridflow.trainer.main_prime", "prime"),
    "recipe.entropy.main_entropy": ("hybridflow.trainer.main_ppo", "ppo"),
    "recipe.gvpo.gvpo_main_ppo": ("hybridflow.trainer.main_ppo", "ppo"),
    "verl.experimental.one_step_off_policy.main_ppo": ("hybridflow.trainer.main_one_step_off", "one_step_off"),
    "verl.experimental.fully_async_policy.fully_async_main": ("hybridflow.trainer.main_fully_async", "fully_async"),
}
MODEL_KEYS = ("actor_rollout_ref.model.path", "critic.model.path", "reward_model.model.path", "model.partial_pretrain",
              "model.path")
DATA_KEYS = ("data.train_files", "data.val_files")
REWARD_FUNCTION_KEY = "custom_reward_function.path"
"""A recipe's own reward function (``$(pwd)/recipe/...py``): pointed at a local file with its function's name."""

MEGATRON = "Megatron-LM is not supported: hybridflow trains with FSDP2 only"
EXPECTED_ERRORS: dict[str, str] = {  # script -> the error it gets
    "examples/grpo_trainer/run_qwen2-7b_math_megatron.sh": MEGATRON,
    "verl/experimental/one_step_off_policy/shell/dapo_7b_math_megatron_4_12.sh": MEGATRON,
    # verl floors the per-rank mini-batch (512 sequences over 12 ranks) and streams prompts one at a time to its
    # 64 rollout servers; hybridflow splits each batch evenly over ranks and says so before anything loads
    "verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_4_12.sh":
        "512 sequences",
    "verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_64_64_mis.sh":
        "data.train_batch_size=32 prompts cannot be split over the 64 rollout processes",
    # an Ascend NPU script: its checkpoint_engine key is accepted (warned), the device is the one thing refused
    "dapo/run_dapo_qwen2.5_7b_npu.sh": "trainer.device='npu' is not one of auto, cpu, cuda",
    # the ReTool recipe's dataset class (recipe/retool/retool.py) reshapes DAPO-Math rows: refused before load
    "examples/sglang_multiturn/run_qwen3_4b_dapo_multiturn.sh":
        "data.custom_cls (path='/REPO/recipe/retool/retool.py', name='CustomRLHFDataset'): a user dataset class is "
        "not supported",
}
VISION_LANGUAGE_ARCHS = {  # script -> the tiny VLM it runs with (a text model would not meet what a VLM is refused)
    "examples/sft/vlm/run_qwen3_vl_2b.sh": "qwen3_vl",
    "examples/sglang_multiturn/geo3k/run_qwen2.5-3b_geo3k_multiturn.sh": "qwen2_5_vl",
}
SEQUENCE_PARALLEL_SCRIPTS = (  # Ulysses sizes 2, 2, 4 and 8: accepted since issue 18
    "examples/ppo_trainer/run_deepseek7b_llm_sp2.sh", "examples/sft/gsm8k/run_qwen_05_sp2.sh",
    "dapo/test_dapo_7b_math.sh", "dapo/run_dapo_qwen2.5_32b.sh",
)
MULTI_TURN = "unknown config key 'actor_rollout_ref.rollout.multi_turn.format'"
PENDING_ELSEWHERE = {  # script -> the error it gets until the agents work (multi_turn keys) is merged
    "examples/ppo_trainer/run_qwen2-7b_seq_balance.sh": MULTI_TURN,
    "examples/grpo_trainer/run_qwen2-7b_seq_balance.sh": MULTI_TURN,
}


def script(command: dict) -> str:
    return command["source"].split(":", 1)[1]


@pytest.fixture(scope="module")
def local_files(tmp_path_factory):
    """A tiny model with a 32k context and a verl-schema parquet file."""
    from hybridflow.models.tiny import save_tiny_model

    root = tmp_path_factory.mktemp("verl_commands")
    model = save_tiny_model(str(root / "model"), max_position_embeddings=32768)
    row = {"prompt": [{"role": "user", "content": "1 + 1?"}], "data_source": "openai/gsm8k", "ability": "math",
           "reward_model": {"style": "rule", "ground_truth": "2"}, "extra_info": {"question": "1 + 1?", "answer": "2"},
           "messages": [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"}]}
    data = str(root / "data.parquet")
    pd.DataFrame([row] * 4).to_parquet(data)
    return model, data


@pytest.fixture(scope="module")
def vision_language_files(tmp_path_factory):
    """arch -> (a tiny VLM of that arch with a 32k context, shape-count image rows in verl's schema), built once each."""
    from hybridflow.data.preprocess import shape_count
    from hybridflow.models.tiny import save_tiny_vl_model

    root, built = tmp_path_factory.mktemp("verl_vl_commands"), {}

    def files(arch: str) -> tuple[str, str]:
        if arch not in built:
            data = shape_count.main(["--size", "4", "--test_size", "1", "--local_save_dir", str(root / "data")])
            built[arch] = (save_tiny_vl_model(str(root / arch), arch=arch, max_position_embeddings=32768),
                           data["train"])
        return built[arch]

    return files


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory):
    """A reward function file for the recipes that bring their own (any function name they ask for)."""
    path = tmp_path_factory.mktemp("reward") / "reward.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    return float(solution_str.strip() == ground_truth)\n\n\n"
                    "def __getattr__(name):\n    return compute_score\n")
    return str(path)


@pytest.fixture
def gpu_engines_installed(monkeypatch):
    for name in ("vllm", "sglang"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        monkeypatch.setitem(sys.modules, name, module)


def localised(command: dict, model: str, data: str, reward: str | None = None) -> list[str]:
    """The command's arguments with model, data and reward-function paths pointing at local files, and the
    checkout's YAML files (``/CONFIGS/``) at the copies in configs/; the rest untouched."""
    args = []
    for arg in command["args"]:
        key, _, value = arg.partition("=")
        bare = key.lstrip("+")
        if bare in MODEL_KEYS:
            arg = f"{key}={model}"
        elif bare == REWARD_FUNCTION_KEY and reward is not None:
            arg = f"{key}={reward}"
        elif value.startswith("/CONFIGS/"):
            arg = f"{key}={HERE / 'configs' / value[len('/CONFIGS/'):]}"
        elif bare in DATA_KEYS:
            count = value.count(",") + 1 if value.startswith("[") else 1
            arg = f"{key}={data}" if count == 1 else f"{key}=[{','.join([data] * count)}]"
        args.append(arg)
    if "config" in command:
        args = ["--config-path", str(HERE / "configs"), "--config-name", command["config"].split("/")[-1], *args]
    return args


def preflight(trainer: str, argv: list[str]) -> None:
    """What the entry point runs before it loads a model: parse, compose, resolve, check."""
    config_file, overrides = split_config_args(argv)
    if trainer in ("ppo", "dapo"):
        from hybridflow.trainer.main_dapo import DAPO_DEFAULTS
        from hybridflow.trainer.main_ppo import preflight as ppo_preflight

        defaults = DAPO_DEFAULTS if trainer == "dapo" else ()
        ppo_preflight(load_config(PPOConfig, overrides, config_file, defaults=defaults))
    elif trainer == "prime":
        from hybridflow.trainer.main_ppo import preflight as ppo_preflight
        from hybridflow.trainer.main_prime import PRIME_DEFAULTS, recipe_meaning

        ppo_preflight(recipe_meaning(load_config(PPOConfig, overrides, config_file, defaults=PRIME_DEFAULTS)))
    elif trainer in ("one_step_off", "fully_async"):
        from hybridflow.trainer.main_fully_async import async_preflight
        from hybridflow.trainer.main_one_step_off import ONE_STEP_OFF

        defaults = ONE_STEP_OFF if trainer == "one_step_off" else ()
        async_preflight(load_config(PPOConfig, list(defaults) + overrides, config_file))
    else:
        from hybridflow.trainer.sft_trainer import preflight as sft_preflight

        sft_preflight(load_config(SFTConfig, overrides, config_file), world_size=1)


def test_the_sample_covers_the_issue_s_families():
    scripts = " ".join(script(c) for c in COMMANDS)
    for family in ("quickstart", "ppo_trainer/", "grpo_trainer/", "sft/gsm8k/", "dapo/", "gspo", "cispo", "rloo",
                   "remax", "reinforce_plus_plus", "gpg", "tuning/", "lora"):
        assert family in scripts, family
    assert len(COMMANDS) >= 35
    assert set(c["module"] for c in COMMANDS) <= set(MODULES)


def test_the_sample_covers_verl_0_9_s_dialect():
    """Issue 37: at least 30 more commands, in every category of the newer dialect (a category's keys may come from
    the YAML the command starts from: the fully async recipe's checkpoint_engine and partial_rollout)."""
    assert len(COMMANDS) >= 37 + 30
    text = "\n".join(" ".join(c["args"]) + " " + c.get("config", "") for c in COMMANDS)
    for needle in ("engine=fsdp", "engine.ulysses_sequence_parallel_size", "data.messages_key", "pad_mode",
                   "model.use_remove_padding", "rollout.n_gpus_per_node", "fully_async_ppo_trainer",
                   "one_step_off_ppo_trainer", "checkpoint_engine", "rollout.trace", "global_profiler",
                   "multi_stage_wake_up", "over_sample_rate", "enable_resource_pool", "reward_model.n_gpus_per_node",
                   ".megatron."):
        assert needle in text, needle
    modules = {c["module"] for c in COMMANDS}
    assert {"verl.trainer.sft_trainer", "verl.experimental.one_step_off_policy.main_ppo",
            "verl.experimental.fully_async_policy.fully_async_main"} <= modules


@pytest.mark.parametrize("command", COMMANDS, ids=script)
def test_verl_command_passes_the_pre_load_checks(command, local_files, vision_language_files, reward_file,
                                                 gpu_engines_installed):
    module, trainer = MODULES[command["module"]]
    assert importlib.util.find_spec(module) is not None, module
    arch = VISION_LANGUAGE_ARCHS.get(script(command))
    argv = localised(command, *(vision_language_files(arch) if arch else local_files), reward=reward_file)
    expected = EXPECTED_ERRORS.get(script(command))
    pending = PENDING_ELSEWHERE.get(script(command))
    if expected is None:
        try:
            preflight(trainer, argv)
        except ConfigError as err:
            if pending is None or pending not in str(err):
                raise
        return
    with pytest.raises(ConfigError) as err:
        preflight(trainer, argv)
    problems = str(err.value).splitlines()
    assert problems and all(expected in line for line in problems), problems  # nothing else is wrong


def test_verl_lora_sft_command_trains_end_to_end(tmp_path, local_files):
    """examples/sft/gsm8k/run_qwen_05_peft.sh, run as ``python -m hybridflow.trainer.fsdp_sft_trainer``:
    one epoch over 256 GSM8K-style rows is one step of verl's default train_batch_size=256."""
    import os
    import subprocess

    (command,) = [c for c in COMMANDS if script(c) == "examples/sft/gsm8k/run_qwen_05_peft.sh"]
    model, _ = local_files
    rows = [{"extra_info": {"question": f"what is {i} + 1?", "answer": f"#### {i + 1}"}} for i in range(256)]
    data = str(tmp_path / "gsm8k.parquet")
    pd.DataFrame(rows).to_parquet(data)
    args = [a.replace("/SAVE", str(tmp_path / "save")) for a in localised(command, model, data)]
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    result = subprocess.run([sys.executable, "-m", MODULES[command["module"]][0], *args], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "save" / "global_step_1" / "model").is_dir()


def test_verl_0_9_sft_trainer_command_trains_end_to_end(tmp_path, local_files):
    """verl-recipe's char_count/train_sft.sh (verl 0.9's ``verl.trainer.sft_trainer``: engine=fsdp, data.messages_key,
    data.pad_mode=no_padding), run as ``python -m hybridflow.trainer.sft_trainer``: 64 conversations with no
    prompt/response columns are one step of its train_batch_size=64, and the checkpoint is written."""
    import os
    import subprocess

    (command,) = [c for c in COMMANDS if script(c) == "char_count/train_sft.sh"]
    model, _ = local_files
    rows = [{"messages": [{"role": "user", "content": f"How many r in 'r{'r' * (i % 5)}'?"},
                          {"role": "assistant", "content": str(1 + i % 5)}]} for i in range(64)]
    data = str(tmp_path / "char_count.parquet")
    pd.DataFrame(rows).to_parquet(data)
    args = [a.replace("/HOME", str(tmp_path)) for a in localised(command, model, data)]
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    result = subprocess.run([sys.executable, "-m", MODULES[command["module"]][0], *args], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "experiments/char_count/models/sft/fsdp/global_step_1/model").is_dir()
    assert "data.use_dynamic_bsz=True is accepted for verl compatibility and has no effect" in result.stderr


def test_the_sequence_parallel_scripts_are_in_the_sample():
    """The scripts above pass the pre-load checks through the parametrised test; each really sets a size > 1."""
    for name in SEQUENCE_PARALLEL_SCRIPTS:
        (command,) = [c for c in COMMANDS if script(c) == name]
        sizes = [arg.rpartition("=")[2] for arg in command["args"] if "ulysses_sequence_parallel_size=" in arg]
        assert sizes and all(int(size) > 1 for size in sizes), (name, sizes)


VISION_LANGUAGE = [c for c in COMMANDS if "qwen2_5_vl-7b" in script(c)]


@pytest.mark.parametrize("command", VISION_LANGUAGE, ids=script)
def test_verl_vision_language_command_passes_the_pre_load_checks_with_a_vlm(command, tmp_path, gpu_engines_installed):
    """verl's Qwen2.5-VL geo3k scripts (data.image_key; freeze_vision_tower, LoRA without the vision tower, SGLang,
    dynamic batches) with a tiny Qwen2.5-VL of a 32k context and image rows in verl's schema: only the module
    prefix, the model and the data change."""
    from hybridflow.data.preprocess import shape_count
    from hybridflow.models.tiny import save_tiny_vl_model

    assert "data.image_key=images" in command["args"]
    model = save_tiny_vl_model(str(tmp_path / "vlm"), max_position_embeddings=32768)
    data = shape_count.main(["--size", "4", "--test_size", "1", "--local_save_dir", str(tmp_path / "data")])["train"]
    module, trainer = MODULES[command["module"]]
    preflight(trainer, localised(command, model, data))


QWEN3_VL_SFT = "examples/sft/vlm/run_qwen3_vl_2b.sh"


def test_verl_qwen3_vl_sft_sequence_parallel_default_is_refused_before_load_on_its_ranks(vision_language_files):
    """The script's SP_SIZE=2 (engine.ulysses_sequence_parallel_size=2) splits packed rows, and a VLM runs padded ones:
    over the script's torchrun --nproc-per-node=8 it is refused in one line from config.json, before the weights load.
    One process (a CPU debug run) trains whole sequences and warns, as it does for a text model."""
    from hybridflow.trainer.sft_trainer import preflight as sft_preflight

    (command,) = [c for c in COMMANDS if script(c) == QWEN3_VL_SFT]
    assert "engine.ulysses_sequence_parallel_size=2" in command["args"]
    config_file, overrides = split_config_args(localised(command, *vision_language_files("qwen3_vl")))
    cfg = load_config(SFTConfig, overrides, config_file)
    with pytest.raises(ConfigError) as err:
        sft_preflight(cfg, world_size=8)
    assert str(err.value) == ("ulysses_sequence_parallel_size=2: a vision-language model runs padded rows, which are "
                              "not split over ranks; set ulysses_sequence_parallel_size=1")
    sft_preflight(load_config(SFTConfig, overrides + ["engine.ulysses_sequence_parallel_size=1"], config_file),
                  world_size=8)


def pokemon_rows(count: int) -> list[dict]:
    """Rows as verl's examples/data_preprocess/pokemon.py writes them (llamafactory/pokemon-gpt4o-captions):
    ``messages`` whose user turn starts with ``<image>``, and ``images`` as ``datasets`` stores them."""
    from PIL import Image, ImageDraw

    from hybridflow.data.vision import image_to_bytes

    names = [("Pikachu", "yellow"), ("Bulbasaur", "green"), ("Charmander", "orange"), ("Squirtle", "blue")]
    rows = []
    for i in range(count):
        name, colour = names[i % len(names)]
        image = Image.new("RGB", (56, 56), "white")
        ImageDraw.Draw(image).ellipse((8, 8, 48, 48), fill=colour)
        rows.append({"messages": [{"role": "user", "content": "<image>Fill in the blank: this is a photo of a {}"},
                                  {"role": "assistant", "content": f"This is a photo of {name}, a {colour} Pokemon."}],
                     "images": [{**image_to_bytes(image), "path": None}]})
    return rows


def test_verl_qwen3_vl_sft_command_trains_end_to_end(tmp_path):
    """examples/sft/vlm/run_qwen3_vl_2b.sh (verl 0.9's sft_trainer: engine=fsdp optim=fsdp, no data.messages_key,
    pad_mode=no_padding, SP_SIZE=2) as ``python -m hybridflow.trainer.sft_trainer`` in one process, on a tiny Qwen3-VL
    and 96 pokemon-layout rows: one step per epoch of its train_batch_size=96. Besides the model and the data, only
    the logger (wandb is not installed here) and the epochs (3 of its 10) change. The loss goes down and the
    checkpoint's HF export loads as a Qwen3-VL with its processor."""
    import os
    import subprocess

    from hybridflow.models import load_causal_lm, load_tokenizer
    from hybridflow.models.tiny import save_tiny_vl_model
    from hybridflow.models.vision import load_processor

    (command,) = [c for c in COMMANDS if script(c) == QWEN3_VL_SFT]
    model = save_tiny_vl_model(str(tmp_path / "qwen3_vl"), arch="qwen3_vl", max_position_embeddings=32768)
    data = str(tmp_path / "pokemon.parquet")
    pd.DataFrame(pokemon_rows(96)).to_parquet(data)
    args = [a.replace("/HOME", str(tmp_path)) for a in localised(command, model, data)]
    args += ["trainer.logger=[console,file]", "trainer.total_epochs=3"]
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    result = subprocess.run([sys.executable, "-m", MODULES[command["module"]][0], *args], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "open_verl/sft/verl_sft_test/pokemon-qwen3-2b-fsdp-fsdp2-sp2-fsdp-1202a1"
    losses = [row["train/loss"] for row in map(json.loads, (run / "logs/metrics.jsonl").read_text().splitlines())
              if "train/loss" in row]
    assert len(losses) == 3 and all(map(math.isfinite, losses)) and losses[-1] < losses[0], losses
    exported = run / "global_step_3" / "model" / "huggingface"
    assert type(load_causal_lm(str(exported))).__name__ == "Qwen3VLForConditionalGeneration"
    assert load_processor(str(exported), tokenizer=load_tokenizer(str(exported))) is not None
