"""verl 0.9.1's side of the differential check (benchmarks/verl_diff.py): one actor update through verl's own
worker path, run in the side venv (.venv-verl) that holds verl; it never imports hybridflow.

    .venv-verl/bin/python benchmarks/verl_diff_verl_side.py CASE_DIR

reads CASE_DIR/case.json (``overrides``: verl keys on top of verl's ``ppo_trainer.yaml``; ``rows_per_prompt``)
and CASE_DIR/batch.pt (the shared GRPO batch, left-padded prompts + right-padded responses), builds
``ActorRolloutRefWorker(role="actor")`` (its ``TrainingWorker`` -> the FSDP2 engine -> ``losses.ppo_loss``)
in one gloo process on the CPU, runs ``update_actor`` on the batch as verl's ``RayPPOTrainer._update_actor``
hands it over, and writes CASE_DIR/verl.pt: the weights after the update, the gradients each optimizer step
applied (after clipping), the compute dtype the decoder layers saw, and the metrics.

verl has no CPU platform: a minimal one is registered here (device ``cpu``, backend ``gloo``) before the
engine modules import, since they read the device name at import time.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import types

import torch

from verl_diff import full, plain_name, record_applied_gradients, record_compute_dtype  # this folder; no hybridflow


class _CpuDeviceModule(types.ModuleType):
    """``torch.cpu`` with the ``torch.cuda`` calls verl makes on its device module (memory stats, caches,
    seeds) answered as a host without an accelerator would: no-ops and zeros."""

    def __init__(self):
        super().__init__("verl_cpu_device")

    def __getattr__(self, name):
        if hasattr(torch.cpu, name):
            return getattr(torch.cpu, name)
        if name in ("manual_seed", "manual_seed_all"):
            return torch.manual_seed
        if name == "mem_get_info":
            return lambda *args, **kwargs: (0, 1)
        if name == "get_device_name":
            return lambda *args, **kwargs: "CPU"
        return lambda *args, **kwargs: 0


CPU_PLATFORM = dict(
    device_name="cpu", vendor_name="cpu", device_module=_CpuDeviceModule(), is_available=True,
    current_device="cpu",  # verl hands it to Module.to(): a device, not an index, on a host
    device_count=1, communication_backend_name="gloo", visible_devices_envvar="CUDA_VISIBLE_DEVICES",
    ray_resource_name="CPU", ray_noset_envvars=[], is_ipc_supported=False, cudart=None)
"""What the CPU platform answers to each of verl's abstract platform members (properties and methods alike)."""


def cpu_platform_class(base: type) -> type:
    """A subclass of verl's ``PlatformBase`` answering every abstract member from ``CPU_PLATFORM``."""
    namespace = {}
    for name in base.__abstractmethods__:
        value = CPU_PLATFORM.get(name)
        if isinstance(getattr(base, name), property):
            namespace[name] = property(lambda self, v=value: v)
        else:
            namespace[name] = lambda self, *args, v=value, **kwargs: v
    return type("CpuPlatform", (base,), namespace)


def install_cpu_platform() -> None:
    """Select a ``cpu`` verl platform (verl 0.9.1 ships cuda, npu and rocm only)."""
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import set_platform

    set_platform(cpu_platform_class(PlatformBase)())
    # The FSDP engines are registered for cuda / npu only; they run on the CPU once the platform says cpu.
    os.environ.update(VERL_ENGINE_DEVICE="cuda", VERL_ENGINE_VENDOR="nvidia")


def compose_verl_config(overrides: list[str]):
    """verl's ``ppo_trainer.yaml`` with ``overrides``, as ``main_ppo`` composes it with Hydra."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def init_single_process_group() -> None:
    """World size 1 over gloo, on a free port (two checks may run at once)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("VERL_DIFF_PORT", port))
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)


def batch_tensordict(batch: dict, cfg, rows_per_prompt: int):
    """The batch as ``RayPPOTrainer._update_actor`` hands it to the worker: no-padding nested tensors plus
    the non-tensor settings (mini-batch size in rows, epochs, seed, shuffle, entropy)."""
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    actor = cfg.actor_rollout_ref.actor
    proto = DataProto.from_dict(tensors=batch, meta_info={
        "multi_turn": False, "temperature": cfg.actor_rollout_ref.rollout.temperature})
    td = left_right_2_no_padding(proto.to_tensordict())
    mini_batch_rows = actor.ppo_mini_batch_size * rows_per_prompt
    tu.assign_non_tensor(td, calculate_entropy=actor.calculate_entropy or actor.entropy_coeff != 0.0,
                         distillation_use_topk=False, distillation_only=False, global_batch_size=mini_batch_rows,
                         mini_batch_size=mini_batch_rows, epochs=actor.ppo_epochs, seed=actor.data_loader_seed,
                         dataloader_kwargs={"shuffle": actor.shuffle}, compute_loss=True)
    return td


def plain_metrics(metrics: dict) -> dict:
    out = {}
    for key, value in metrics.items():
        values = value if isinstance(value, list) else [value]
        values = [float(v.item() if hasattr(v, "item") else getattr(v, "value", v)) for v in values]
        out[key] = sum(values) / len(values)
    return out


def run(case_dir: str) -> None:
    with open(os.path.join(case_dir, "case.json")) as f:
        case = json.load(f)
    # The main venv's TRL is newer than verl 0.9.1 knows (its value-head patch imports a moved class); the
    # actor path does not use TRL, so verl is told it is absent.
    sys.modules["trl"] = None
    install_cpu_platform()
    init_single_process_group()
    torch.manual_seed(0)
    from verl.utils import tensordict_utils as tu
    from verl.utils.py_functional import rename_dict
    from verl.workers.engine_workers import ActorRolloutRefWorker

    cfg = compose_verl_config(case["overrides"])
    worker = ActorRolloutRefWorker(config=cfg.actor_rollout_ref, role="actor")
    worker.init_model()
    engine = worker.actor.engine
    applied = record_applied_gradients(engine.module, engine.optimizer)
    dtypes = record_compute_dtype(engine.module)
    batch = torch.load(os.path.join(case_dir, "batch.pt"))
    output = worker.update_actor(batch_tensordict(batch, cfg, case["rows_per_prompt"]))
    # named as RayPPOTrainer._update_actor names them
    metrics = rename_dict(plain_metrics(tu.get(output, "metrics")), "actor/")
    metrics["perf/mfu/actor"] = metrics.pop("actor/mfu")
    weights = {plain_name(n): full(p) for n, p in engine.module.named_parameters()}
    torch.save({"weights": weights, "applied": applied, "dtypes": sorted(set(dtypes)), "metrics": metrics},
               os.path.join(case_dir, "verl.pt"))


if __name__ == "__main__":
    run(sys.argv[1])
