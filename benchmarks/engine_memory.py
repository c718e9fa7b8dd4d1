"""Resident memory the native rollout engine adds to a trainer process, and after each weight sync.

Each variant runs in its own process (resident set sizes are per process): the trainer's model is
loaded and touched (its weights are resident in a trainer), then the engine is built on a private
copy the way the trainer builds it, then the trainer's weights are synced into it three times.

- ``shared``: the engine keeps the module's weights beside its fused / packed copies (``own_model=False``,
  what a user gets by handing their own model to ``NativeEngine``).
- ``own``: the engine owns its copy and drops the module's projection weights once packed
  (``own_model=True``, what the trainer builds).

Printed: GiB added to the resident set after the build and after each sync, and the floor (the fp32
bytes of one packed copy of every matrix, plus the embedding table the lookup reads when the LM head
is tied to it and packed separately).

    python benchmarks/engine_memory.py                  # SmolLM2-135M-Instruct
    python benchmarks/engine_memory.py --model tiny     # smoke run
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "2")


def resident_gib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


def measure(model_path: str, own: bool, syncs: int) -> None:
    from hybridflow.models import load_causal_lm
    from hybridflow.rollout.native import NativeEngine

    model = load_causal_lm(model_path, dtype="fp32")
    for param in model.parameters():
        param.data.add_(0)  # fault every page in: a trainer's weights are resident
    gc.collect()
    base = resident_gib()
    engine = NativeEngine(copy.deepcopy(model), None, own_model=own)
    gc.collect()
    print(f"  {'own' if own else 'shared':6s} build: +{resident_gib() - base:.3f} GiB", flush=True)
    for step in range(syncs):
        engine.load_weights(model.state_dict().items())
        gc.collect()
        print(f"  {'own' if own else 'shared':6s} sync {step + 1}: +{resident_gib() - base:.3f} GiB", flush=True)
    params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    embed = model.get_input_embeddings().weight.numel() if model.config.tie_word_embeddings else 0
    print(f"  floor: one fp32 packed copy of the {params / 1e6:.0f}M parameters, plus the embedding table the "
          f"lookup reads when the LM head is tied to it: {(params + embed) * 4 / 2**30:.3f} GiB")


def model_folder(name: str) -> str:
    if name == "tiny":
        from hybridflow.models.tiny import save_tiny_model

        return save_tiny_model(tempfile.mkdtemp(prefix="engine_memory_"))
    if name == "default":
        from hybridflow.models.default_model import fetch_default_model

        return fetch_default_model()
    return name


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), 'tiny', or a folder")
    parser.add_argument("--syncs", type=int, default=3)
    parser.add_argument("--variant", choices=["own", "shared"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.variant:
        measure(args.model, args.variant == "own", args.syncs)
        return
    from hybridflow.cpu import describe_cpu

    path = model_folder(args.model)
    print(f"cpu: {describe_cpu()}; model {path}")
    for variant in ("shared", "own"):
        subprocess.run([sys.executable, __file__, "--model", path, "--syncs", str(args.syncs), "--variant", variant],
                       check=True)


if __name__ == "__main__":
    main()
