"""The work one native ``generate`` does, counted op by op: a load-proof A/B between two source trees.

Wall-clock A/Bs on a shared 2-core machine swing 20 % between runs of the same code. The ops a generate
dispatches (name and input shapes, from ``torch.profiler``) do not: two trees whose counts agree do the same
arithmetic on the same shapes, so a timing gap between them is the machine, not the code.

    python benchmarks/rollout_ops.py --trees /path/to/old /path/to/new          # the ops that differ from old
    python benchmarks/rollout_ops.py --trees . --shape tiny-llama --batch 4      # one tree: its op table

Each tree runs in its own process (``PYTHONPATH=<tree>``), the same random-init model and fixed workload as
``benchmarks/rollout.py --workload fixed`` (``ignore_eos``, seed 0), one thread.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trees", nargs="+", required=True, help="source trees (repository roots) to compare")
    parser.add_argument("--shape", default="smollm2-135m", help="benchmarks/model_shapes.py shape")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--top", type=int, default=20, help="differing ops to print")
    parser.add_argument("--count-only", metavar="OUT", help=argparse.SUPPRESS)  # the child: write counts to OUT
    return parser.parse_args(argv)


def count_ops(args) -> dict:
    """Run one generate under the profiler in this process; ops keyed by name and input shapes."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from model_shapes import random_model

    from hybridflow.rollout import SamplingParams
    from hybridflow.rollout.native import NativeEngine

    torch.set_num_threads(1)
    model = random_model(args.shape, dtype="float32", device="cpu")
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(args.batch)
    prompts = torch.randint(vocab, (args.batch, args.prompt_len), generator=generator).tolist()
    engine = NativeEngine(model, max_num_seqs=args.batch, max_model_len=args.prompt_len + args.max_tokens)
    params = SamplingParams(n=1, temperature=1.0, max_tokens=args.max_tokens, ignore_eos=True, seed=0)
    engine.generate(prompts[:2], SamplingParams(n=1, temperature=1.0, max_tokens=4, ignore_eos=True, seed=0))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        outputs = engine.generate(prompts, params)
    counts = collections.Counter(f"{event.name} {event.input_shapes}" for event in prof.events())
    return {"counts": dict(counts), "tokens": sum(len(o.token_ids) for o in outputs)}


def counts_of(tree: str, args) -> dict:
    """``count_ops`` in a child process that imports hybridflow from ``tree``."""
    tree = os.path.abspath(tree)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, os.path.abspath(__file__), "--trees", tree, "--shape", args.shape,
                   "--batch", str(args.batch), "--prompt-len", str(args.prompt_len),
                   "--max-tokens", str(args.max_tokens), "--count-only", out.name]
        env = dict(os.environ, PYTHONPATH=tree, OMP_NUM_THREADS="1")
        subprocess.run(command, check=True, env=env, cwd=tree, stdout=subprocess.DEVNULL)
        with open(out.name) as handle:
            return json.load(handle)


def differences(a: dict[str, int], b: dict[str, int]) -> list[tuple[str, int, int]]:
    """Ops whose counts differ, the largest difference first."""
    rows = [(key, a.get(key, 0), b.get(key, 0)) for key in sorted(set(a) | set(b)) if a.get(key, 0) != b.get(key, 0)]
    return sorted(rows, key=lambda row: -abs(row[2] - row[1]))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.count_only:
        with open(args.count_only, "w") as handle:
            json.dump(count_ops(args), handle)
        return
    runs = [counts_of(tree, args) for tree in args.trees]
    print(f"shape {args.shape}, batch {args.batch}, prompt {args.prompt_len}, {args.max_tokens} new tokens, 1 thread")
    for tree, run in zip(args.trees, runs):
        print(f"{tree}: {sum(run['counts'].values())} ops, {run['tokens']} tokens")
    if len(runs) == 1:
        for key, count in sorted(runs[0]["counts"].items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"{count:8d}  {key}")
        return
    for tree, run in zip(args.trees[1:], runs[1:]):  # each later tree against the first
        rows = differences(runs[0]["counts"], run["counts"])
        print(f"{len(rows)} op signatures differ between {args.trees[0]} and {tree}")
        for key, before, after in rows[: args.top]:
            print(f"{before:8d} -> {after:8d}  {key}")


if __name__ == "__main__":
    main()
