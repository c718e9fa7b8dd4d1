"""benchmarks/gpu_check.sh is what a lent GPU runs, once, with minutes to spare: every stage's command must be
right before the card is there. Its dry run lists the stages; each benchmark's flags parse with that script's own
parser, its shapes exist, and each pytest node it names exists."""

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.benchmarks.loader import BENCHMARKS, loaded_benchmark

SCRIPT = BENCHMARKS / "gpu_check.sh"
ROOT = BENCHMARKS.parent


def dry_run(**env: str) -> list[tuple[str, int, str]]:
    """``(stage, limit seconds, command)`` in the order the script runs them."""
    out = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "DRY_RUN": "1", "OUT": "/tmp/gpu_check_dry_run", **env}).stdout
    stages = re.findall(r"^([\w-]+)\t(\d+)\t(.*?)(?=^[\w-]+\t\d+\t|^=== done)", out, re.M | re.S)
    return [(name, int(limit), command.strip()) for name, limit, command in stages]


def default_stages() -> list[str]:
    return re.search(r'^ALL="([^"]+)"', SCRIPT.read_text(), re.M).group(1).split()


def test_the_dry_run_lists_every_stage_once_in_order():
    stages = dry_run()
    assert [name for name, _, _ in stages] == default_stages()
    # A stage written but left out of ALL would never run by default.
    assert re.findall(r"^stage ([\w-]+) ", SCRIPT.read_text(), re.M) == default_stages()
    assert all(limit > 0 for _, limit, _ in stages)
    assert [name for name, _, _ in dry_run(STAGES="update tests")] == ["tests", "update"]


def test_the_limits_comment_is_true_and_the_kernels_come_before_the_engine_stages():
    script = SCRIPT.read_text()
    comment = re.search(r"^# Limits ([\d + ]+) s", script, re.M).group(1)
    assert [int(limit) for limit in comment.split(" + ")] == [limit for _, limit, _ in dry_run()]
    order = default_stages()
    assert order.index("attn") < min(order.index(name) for name in order if name.startswith("rollout-"))


def test_the_budget_keeps_the_script_under_eight_minutes():
    budget = int(re.search(r"BUDGET=\$\{BUDGET_S:-(\d+)\}", SCRIPT.read_text()).group(1))
    assert budget <= 480


@pytest.mark.parametrize("stage", [name for name in default_stages() if name not in ("env",)])
def test_each_stage_command_is_valid(stage):
    command = shlex.split(dict((name, cmd) for name, _, cmd in dry_run())[stage])
    assert command[0] == "python3", command
    if command[1] == "-m":
        assert command[2] == "pytest"
        paths = [arg for arg in command[3:] if arg.startswith("tests")]
        assert paths, command
        for path in paths:
            file, _, node = path.partition("::")
            assert (ROOT / file).exists(), path
            if node:
                assert re.search(rf"^def {re.escape(node)}\(", (ROOT / file).read_text(), re.M), path
        return
    script = Path(command[1])
    assert script.parent.name == "benchmarks" and (ROOT / script).exists(), command
    with loaded_benchmark(script.stem) as module:
        args = module.parse_args(command[2:])  # a renamed flag is a SystemExit here, not on the card
    shape = getattr(args, "shape", None)
    if shape and script.stem in ("rollout", "vl_rollout"):
        with loaded_benchmark("model_shapes") as shapes:
            known = {**shapes.SHAPES, **getattr(shapes, "VL_SHAPES", {})}
        assert all(name in known for name in shape.split(",")), (shape, sorted(known))
