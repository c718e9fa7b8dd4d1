"""The GVPO case of ``make verl-diff`` (issue 60): hybridflow's ``loss_mode=gvpo`` against verl-recipe's own
``compute_policy_loss_gvpo`` (gvpo/gvpo_core_algos.py) on the same tensors.

    VERL_RECIPE_DIR=/path/to/verl-recipe python benchmarks/verl_diff_gvpo.py   # also: verl_diff.py --cases gvpo

verl-recipe is not a package: its file is read from a checkout or a bare mirror of github.com/verl-project/verl-recipe
(``VERL_RECIPE_DIR``; default the ``fetch`` tool's mirror, ``/work/.mirror/verl-project+verl-recipe/repo``) and
imported in the side venv, where verl 0.9.1 gives it what it imports. Random inputs per case (groups of n responses,
ragged masks, grouped rows in the recipe's order i // n or interleaved, on- and off-policy log-probs, centred
scores as the recipe's grpo gives or raw ones); both sides
compute the loss and its gradient in the log-probs. A case passes within 1e-6. Exit status 1 when one fails; with
no recipe checkout it says so and skips (status 0).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.append(ROOT) if ROOT not in sys.path else None

from hybridflow.algos import get_policy_loss  # noqa: E402

TOL = 1e-6
RECIPE_FILE = "gvpo/gvpo_core_algos.py"
DEFAULT_RECIPE_DIR = "/work/.mirror/verl-project+verl-recipe/repo"
CASES = {  # name -> (groups, n, beta, interleaved rows, off-policy, centred advantages)
    "n4_on_policy": (3, 4, 0.1, False, False, True),
    "n4_off_policy": (3, 4, 0.1, False, True, True),
    "n2_interleaved_beta1": (4, 2, 1.0, True, True, True),
    "n8_one_group": (1, 8, 0.05, False, True, True),
    "n4_raw_scores": (2, 4, 0.5, False, True, False),  # uncentred targets: the detached group mean shows
}


def make_case(groups: int, n: int, beta: float, interleaved: bool, off_policy: bool, centred: bool, *,
              seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    rows, width = groups * n, 6
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    mask = (torch.arange(width) < lengths[:, None]).float()
    old = -torch.rand(rows, width, generator=gen) * 3
    log_prob = old + (0.3 * torch.randn(rows, width, generator=gen) if off_policy else 0.0)
    group = torch.arange(rows) // n
    if interleaved:
        group = torch.arange(rows) % groups
    scores = torch.randint(0, 2, (rows,), generator=gen).float()
    means = torch.zeros(groups).index_add(0, group, scores) / n
    # grpo without std normalisation, as the recipe runs (or the raw scores)
    advantages = (scores - means[group] if centred else scores)[:, None] * mask
    return {"old_log_prob": old * mask, "log_prob": log_prob * mask, "advantages": advantages, "response_mask": mask,
            "beta": beta, "uid": group.float(), "n": n}


def make_inputs() -> dict:
    return {name: make_case(*spec, seed=i) for i, (name, spec) in enumerate(CASES.items())}


def ours(case: dict) -> dict:
    log_prob = case["log_prob"].clone().requires_grad_(True)
    loss, _ = get_policy_loss("gvpo")(old_log_prob=case["old_log_prob"], log_prob=log_prob,
                                      advantages=case["advantages"], response_mask=case["response_mask"],
                                      index=[str(int(u)) for u in case["uid"]], gvpo_beta=case["beta"],
                                      rollout_n=case["n"])
    loss.backward()
    return {"loss": loss.detach(), "grad": log_prob.grad}


def compare(verl: dict, mine: dict) -> float:
    return max((verl["loss"] - mine["loss"]).abs().item(), (verl["grad"] - mine["grad"]).abs().max().item())


def recipe_source(recipe_dir: str) -> str | None:
    """The text of the recipe's gvpo_core_algos.py from a checkout or a bare mirror (None: not there)."""
    path = os.path.join(recipe_dir, RECIPE_FILE)
    if os.path.exists(path):
        with open(path) as fh:
            return fh.read()
    result = subprocess.run(["git", "-C", recipe_dir, "show", f"HEAD:{RECIPE_FILE}"], capture_output=True, text=True)
    return result.stdout if result.returncode == 0 else None


def main(verl_python: str | None = None, recipe_dir: str | None = None) -> int:
    recipe_dir = recipe_dir or os.environ.get("VERL_RECIPE_DIR", DEFAULT_RECIPE_DIR)
    source = recipe_source(recipe_dir) if os.path.isdir(recipe_dir) else None
    if source is None:
        print(f"gvpo: SKIP (no verl-recipe checkout with {RECIPE_FILE} at {recipe_dir}; set VERL_RECIPE_DIR)")
        return 0
    if verl_python is None:
        from benchmarks.verl_diff import ensure_side_venv

        verl_python = ensure_side_venv()
    workdir = tempfile.mkdtemp(prefix="verl_diff_gvpo_")
    package = os.path.join(workdir, "recipe", "gvpo")
    os.makedirs(package)
    for init in (os.path.join(workdir, "recipe", "__init__.py"), os.path.join(package, "__init__.py")):
        open(init, "w").close()
    with open(os.path.join(package, "gvpo_core_algos.py"), "w") as fh:
        fh.write(source)
    inputs = make_inputs()
    torch.save(inputs, os.path.join(workdir, "inputs.pt"))
    side = os.path.join(ROOT, "benchmarks", "verl_diff_gvpo_verl_side.py")
    subprocess.run([verl_python, side, workdir, os.path.join(workdir, "inputs.pt"), os.path.join(workdir, "verl.pt")],
                   check=True, cwd=workdir)
    verl = torch.load(os.path.join(workdir, "verl.pt"))
    failed = 0
    print(f"{'gvpo case':<34} {'max diff':>9} result")
    for name, case in inputs.items():
        diff = compare(verl[name], ours(case))
        failed += diff > TOL
        print(f"{name:<34} {diff:>9.2e} {'PASS' if diff <= TOL else 'FAIL'}")
    shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
