"""``python -m hybridflow.model_merger merge --backend fsdp --local_dir .../global_step_N/actor --target_dir DIR``

verl's merger command line: turns an actor (or SFT) checkpoint directory into a plain
HF folder that ``AutoModelForCausalLM.from_pretrained`` loads, and a critic checkpoint
(``global_step_N/critic``) into a value-model folder: the backbone as an HF folder plus
``value_head.safetensors`` (``hybridflow.models.load_value_model`` reads it, and so does
``critic.model.path``). ``--backend fsdp`` reads the trainers' checkpoints: weights as DCP shards
in ``dcp/``, config and tokenizer in ``huggingface/``.
"""

from __future__ import annotations

import argparse
import os
import sys

from hybridflow.errors import ConfigError, run_entry_point
from hybridflow.models.sharded_checkpoint import merge_sharded_checkpoint


def merge(local_dir: str, target_dir: str) -> str:
    """Write the merged HF folder from a checkpoint directory (``dcp/`` + ``huggingface/``)."""
    if not os.path.isdir(local_dir):
        raise ConfigError(f"--local_dir '{local_dir}' does not exist; pass {{default_local_dir}}/global_step_N/actor")
    return merge_sharded_checkpoint(local_dir, target_dir)


def build_parser(prog: str = "python -m hybridflow.model_merger") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Checkpoint -> Hugging Face folder (verl's model_merger command line): an actor or SFT "
                    "checkpoint becomes a causal LM, a critic checkpoint a value model.",
        epilog="The trainers' keys and their meaning: hybridflow config show --doc")
    sub = parser.add_subparsers(dest="operation", required=True)
    merge_parser = sub.add_parser("merge", help="write a Hugging Face folder from a checkpoint")
    merge_parser.add_argument("--backend", choices=["fsdp"], default="fsdp")
    merge_parser.add_argument("--local_dir", required=True, help="global_step_N/actor (or critic) directory")
    merge_parser.add_argument("--target_dir", required=True, help="output folder")
    return parser


def run_from_args(argv: list[str], prog: str = "python -m hybridflow.model_merger") -> int:
    """Merge as the command line asks; ``prog`` names the command in usage lines (``hybridflow`` for ``hybridflow
    merge``)."""
    args = build_parser(prog).parse_args(argv)
    out = merge(args.local_dir, args.target_dir)
    print(f"wrote a Hugging Face model to {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_entry_point(run_from_args, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
