"""verl-recipe's side of the GVPO differential (run by benchmarks/verl_diff_gvpo.py in ``.venv-verl``, verl 0.9.1):
the recipe's own ``compute_policy_loss_gvpo`` (its ``gvpo_core_algos.py``, imported from a verl-recipe checkout) on
the driver's inputs, in one gloo process with the ("ddp", "fsdp") device mesh its FSDP worker builds.

    python verl_diff_gvpo_verl_side.py RECIPE_PARENT INPUTS.pt OUTPUT.pt

``RECIPE_PARENT`` holds ``recipe/gvpo/gvpo_core_algos.py`` (the driver copies it there from the checkout).
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def run_case(case: dict, loss_fn, mesh) -> dict:
    log_prob = case["log_prob"].clone().requires_grad_(True)
    loss = loss_fn(old_log_prob=case["old_log_prob"], log_prob=log_prob, advantages=case["advantages"],
                   response_mask=case["response_mask"], beta=case["beta"], uid=case["uid"], device_mesh=mesh,
                   n=case["n"])
    loss.backward()
    return {"loss": loss.detach(), "grad": log_prob.grad}


def main() -> None:
    sys.path.insert(0, sys.argv[1])
    from recipe.gvpo.gvpo_core_algos import compute_policy_loss_gvpo

    dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("ddp", "fsdp"))
    inputs = torch.load(sys.argv[2])
    torch.save({name: run_case(case, compute_policy_loss_gvpo, mesh) for name, case in inputs.items()}, sys.argv[3])
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
