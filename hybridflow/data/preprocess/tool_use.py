"""A tool-use dataset in verl's multi-turn schema, from GSM8K (a local file) or a reasoning-gym task (offline).

    python -m hybridflow.data.preprocess.tool_use --local_save_dir DIR [--tool calc_gsm8k_reward|calculator]
        [--system_prompt TEXT] [--interaction gsm8k] -- gsm8k --local_dataset_path GSM8K_FILE_OR_DIR
    python -m hybridflow.data.preprocess.tool_use --local_save_dir DIR -- reasoning_gym --task basic_arithmetic --size 1000
    python -m hybridflow.data.preprocess.tool_use --local_save_dir DIR --tool calc_geo3k_reward -- geo3k \
        --local_dataset_path GEOMETRY3K_DIR      # verl's geo3k_multiturn_w_tool.py rows (images kept)

Everything after ``--`` is the source script's command line (``hybridflow.data.preprocess.gsm8k``,
``.reasoning_gym`` or ``.geo3k``; its ``--local_save_dir`` is supplied). Each row of its output becomes a tool-agent
row: a system message that offers the tools, ``agent_name: tool_agent``, and in ``extra_info``
``tools_kwargs`` (the answer-check tool's ground truth, as verl's gsm8k_multiturn_w_tool.py writes it)
and, with ``--interaction NAME``, ``interaction_kwargs {name, query, ground_truth}``. The data source is
kept, so the final answer is still scored by the source's rule.
"""

from __future__ import annotations

import argparse
import importlib
import tempfile
from collections.abc import Sequence
from typing import Any

from hybridflow.data.files import read_rows
from hybridflow.data.preprocess.common import add_output_args, run_main, script_prog, write_splits
from hybridflow.errors import DataError

SOURCES = ("gsm8k", "reasoning_gym", "geo3k")
SYSTEM_PROMPT = {
    "calc_geo3k_reward": (  # verl's geo3k_multiturn_w_tool.py, word for word
        "You are a math expert. You are given a question and you need to solve it step by step. Reasoning step by "
        "step before any tool call. You should use the `calc_geo3k_reward` tool after step by step solving the "
        "question, before generate final answer at least once and refine your answer if necessary. "),
    "calc_gsm8k_reward": ("You are a math expert. Solve the problem step by step, then submit your answer with the "
                          "`calc_gsm8k_reward` tool before you write it after '####'."),
    "calculator": ("You are a math expert. Solve the problem step by step; use the `calculator` tool for arithmetic, "
                   "then write the final answer after '####'."),
}


def to_tool_row(row: dict[str, Any], *, tool: str, interaction: str | None,
                system_prompt: str | None = None) -> dict[str, Any]:
    """A verl single-turn row as a tool-agent row (the prompt gains the system message:
    ``system_prompt``, or the tool's default one)."""
    ground_truth = str(row["reward_model"]["ground_truth"])
    messages = [m for m in row["prompt"] if m["role"] != "system"]
    extra = dict(row.get("extra_info") or {})
    extra["tools_kwargs"] = {tool: {"create_kwargs": {"ground_truth": ground_truth}}}
    if interaction:
        extra["interaction_kwargs"] = {"name": interaction, "query": messages[-1]["content"], "ground_truth": ground_truth}
    system = SYSTEM_PROMPT[tool] if system_prompt is None else system_prompt
    return {**row, "prompt": [{"role": "system", "content": system}, *messages],
            "agent_name": "tool_agent", "extra_info": extra}


def source_splits(source_argv: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Run the source preprocess script into a temp dir and read its splits back."""
    if not source_argv or source_argv[0] not in SOURCES:
        raise DataError(f"after '--' name the source, one of {', '.join(SOURCES)}, then its own arguments")
    module = importlib.import_module(f"hybridflow.data.preprocess.{source_argv[0]}")
    with tempfile.TemporaryDirectory(prefix="hybridflow-tool-use-") as tmp:
        paths = module.main([*source_argv[1:], "--local_save_dir", tmp])
        return {split: read_rows(path) for split, path in paths.items()}


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(argv) if argv is not None else __import__("sys").argv[1:]
    own, source = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog=script_prog(__file__), description=__doc__.splitlines()[0])
    parser.add_argument("--tool", default="calc_gsm8k_reward", choices=sorted(SYSTEM_PROMPT),
                        help="the tool the system message offers (its ground truth goes in tools_kwargs)")
    parser.add_argument("--system_prompt", default=None,
                        help="the system message of every row (default: the tool's own, see SYSTEM_PROMPT)")
    parser.add_argument("--interaction", default=None, help="also write interaction_kwargs for this interaction name")
    add_output_args(parser)
    return parser.parse_args(own), source


def main(argv: Sequence[str] | None = None) -> dict[str, str]:
    """Write ``train.parquet`` and ``test.parquet``; returns split -> path."""
    args, source_argv = parse_args(argv)
    splits = {split: [to_tool_row(row, tool=args.tool, interaction=args.interaction,
                                          system_prompt=args.system_prompt) for row in rows]
              for split, rows in source_splits(source_argv).items()}
    return write_splits(splits, args.local_save_dir)


if __name__ == "__main__":
    run_main(main)
