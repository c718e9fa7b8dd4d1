"""Scaling of one actor training step over a dp x sp grid of workers on this machine.

    python benchmarks/scaling.py [--rows 32] [--layers 4] [--hidden 256] [--repeats 3] [--nodes 2]

A step = old log-probs + one PPO update (one optimizer step) on a fixed batch, as the
trainer runs it. Backends: ``local`` (in-process, 1 worker), ``ray`` x1 and ``ray`` x2
(FSDP2 over gloo; on a GPU node, nccl). Each worker gets ``cores / workers`` threads,
so the 2-worker run uses the same cores as the 1-worker run: the efficiency is
T(1) / (2 x T(2)) at a fixed global batch (1.0 = perfect), and on a 2-core CPU it
mostly measures what sharding and gloo collectives cost.

The grid (padding-free rows, the layout sequence parallelism needs): ``dp x sp`` =
1 x 1, 2 x 1 and 1 x 2 workers, each against the 1-worker step of the same run
(``ratio`` = T(1 x 1) / T(dp x sp); 1.0 = as fast as one worker on all the cores).
``--nodes 2`` starts a local Ray cluster of 2 logical nodes (``ray.cluster_utils``) and
places multi-worker pools one worker per node.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def machine() -> str:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {gpu}, torch {torch.__version__}"


def config(model_dir: str, rows: int, *, sp: int = 1, packed: bool = False):
    from hybridflow.config import PPOConfig, load_config

    return load_config(PPOConfig, [
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.n=1",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={rows}", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4", "data.max_response_length=48",
        f"actor_rollout_ref.model.use_remove_padding={packed}", f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}",
    ])


def batch(rows: int, prompt: int = 16, response: int = 48):
    from hybridflow.data.batch import Batch

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 500, (rows, prompt + response), generator=gen)
    mask = torch.ones_like(ids)
    return Batch.from_dict(tensors={
        "prompts": ids[:, :prompt], "responses": ids[:, prompt:], "input_ids": ids, "attention_mask": mask,
        "position_ids": torch.arange(prompt + response).expand(rows, -1), "response_mask": mask[:, prompt:],
        "advantages": torch.randn(rows, response, generator=gen)})


def time_steps(group, data, repeats: int) -> float:
    """Median seconds of one step (after one warm-up step)."""
    times = []
    for step in range(repeats + 1):
        start = time.perf_counter()
        data["old_log_probs"], _ = group.compute_log_prob(data, temperature=1.0)
        group.update_policy(data, temperature=1.0, step=step + 1)
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--nodes", type=int, choices=(1, 2), default=1,
                        help="2: a local Ray cluster of 2 logical nodes, multi-worker pools spread over them")
    parser.add_argument("--skip-dp-table", action="store_true", help="only the dp x sp grid")
    parser.add_argument("--single-thread", action="store_true",
                        help="1 thread per worker everywhere (isolates DP scaling from intra-op threading)")
    args = parser.parse_args()

    import ray

    from hybridflow.trainer.roles.builders import build_hybrid_engine
    from hybridflow.models.tiny import save_tiny_model

    cores = os.cpu_count() or 1
    model_dir = save_tiny_model(tempfile.mkdtemp(), num_hidden_layers=args.layers, hidden_size=args.hidden,
                                intermediate_size=4 * args.hidden)
    factory = functools.partial(build_hybrid_engine, cfg=config(model_dir, args.rows), total_steps=100,
                                with_rollout=False, with_reference=False)
    data = batch(args.rows)
    print(f"machine: {machine()}")
    print(f"model: llama {args.layers} layers, hidden {args.hidden}; batch {args.rows} x 64 tokens")
    threads = 1 if args.single_thread else cores
    print(f"threads: {'1 per worker' if args.single_thread else f'{cores} / workers per worker'}")
    torch.set_num_threads(threads)
    connect(args.nodes, cores)
    if not args.skip_dp_table:
        dp_table(factory, data, args, cores)
    grid(model_dir, data, args, cores)
    ray.shutdown()


def connect(nodes: int, cores: int) -> None:
    """A local Ray: one node with every core, or ``nodes`` logical nodes sharing them."""
    import ray

    if nodes == 1:
        ray.init(address="local", num_cpus=cores, include_dashboard=False, log_to_driver=False)
        return
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cores / nodes, "include_dashboard": False})
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=cores / nodes)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)


def dp_table(factory, data, args, cores: int) -> None:
    """local x1, ray x1, ray x2 (padded rows) and the data-parallel efficiency."""
    from hybridflow.trainer.roles.groups import HybridEngineWorker
    from hybridflow.controller.worker_group import build_worker_group

    local = build_worker_group(factory, worker_cls=HybridEngineWorker, backend="local")
    results = {"local x1": time_steps(local, data, args.repeats)}
    for workers in (1, 2):
        group = build_worker_group(factory, worker_cls=HybridEngineWorker, backend="ray",
                                   pool=pool(workers, args, cores))
        results[f"ray x{workers}"] = time_steps(group, data, args.repeats)
        group.shutdown()
    print("| backend | workers | step time (s) | tokens/s |")
    print("|---|---|---|---|")
    for name, seconds in results.items():
        print(f"| {name.split()[0]} | {name.split()[1][1:]} | {seconds:.3f} | {args.rows * 64 / seconds:.0f} |")
    efficiency = results["ray x1"] / (2 * results["ray x2"])
    print(f"data-parallel efficiency (ray x1 -> x2, same cores): {efficiency:.2f}")


def pool(workers: int, args, cores: int):
    from hybridflow.controller.resources import ResourcePool

    nnodes = args.nodes if workers % args.nodes == 0 else 1
    cpus = 1.0 if args.single_thread else cores / max(workers, args.nodes)
    return ResourcePool(nnodes=nnodes, procs_per_node=workers // nnodes, cpus_per_proc=cpus)


GRID = ((1, 1), (2, 1), (1, 2))
"""(dp, sp) pairs; 1 x 1 is the reference of the ratio column."""


def grid(model_dir: str, data, args, cores: int) -> None:
    """The dp x sp grid on padding-free rows, each with the same-run ratio to one worker."""
    from hybridflow.trainer.roles.builders import build_hybrid_engine
    from hybridflow.trainer.roles.groups import HybridEngineWorker
    from hybridflow.controller.worker_group import build_worker_group

    times = {}
    for dp, sp in GRID:
        factory = functools.partial(build_hybrid_engine, cfg=config(model_dir, args.rows, sp=sp, packed=True),
                                    total_steps=100, with_rollout=False, with_reference=False)
        group = build_worker_group(factory, worker_cls=HybridEngineWorker, backend="ray", ranks_per_shard=sp,
                                   pool=pool(dp * sp, args, cores))
        times[dp, sp] = time_steps(group, data, args.repeats)
        group.shutdown()
    print(f"\ndp x sp grid (padding-free rows, {args.nodes} node(s)):")
    print("| dp | sp | workers | step time (s) | tokens/s | ratio to 1 worker |")
    print("|---|---|---|---|---|---|")
    for (dp, sp), seconds in times.items():
        print(f"| {dp} | {sp} | {dp * sp} | {seconds:.3f} | {args.rows * 64 / seconds:.0f} | "
              f"{times[1, 1] / seconds:.2f} |")

if __name__ == "__main__":
    main()
