"""The package layering of DESIGN.md ("Layers"): each package imports only the layers listed under it.

Every ``import hybridflow.X`` / ``from hybridflow.X import ...`` counts, also the ones inside functions
(a lazy import is still a dependency). ``hybridflow/errors.py`` and ``hybridflow/cpu.py`` (thread and
allocator settings) are the base every layer may use.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "hybridflow"
BASE = {"errors", "cpu"}
BELOW_TRAINER = {"algos", "config", "data", "rewards", "tools", "models", "rollout", "agents", "workers", "controller"}
ALLOWED = {
    "algos": set(),
    # validation asks the registered estimator specs (algos/registry.py) whether a critic is needed
    "config": {"algos"},
    "data": {"algos", "config"},
    "rewards": {"data", "algos", "config"},
    "tools": {"rewards", "data", "config"},
    "models": {"algos", "data", "config"},
    "rollout": {"models", "data", "config"},
    "agents": {"rollout", "tools", "rewards", "data", "config"},
    "workers": {"models", "rollout", "agents", "rewards", "algos", "data", "config"},
    "controller": {"data"},
    "trainer": BELOW_TRAINER,
}


def imported_packages(path: pathlib.Path) -> set[str]:
    """The ``hybridflow`` sub-packages (or top-level modules) that one file imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names if node.module == "hybridflow"]
        for name in names:
            parts = name.split(".")
            if parts[0] == "hybridflow" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_the_layers_below_it(package):
    offending = {}
    for path in sorted((PACKAGE / package).rglob("*.py")):
        upward = imported_packages(path) - ALLOWED[package] - BASE - {package}
        if upward:
            offending[str(path.relative_to(PACKAGE))] = sorted(upward)
    assert not offending, f"imports outside the layers DESIGN.md allows {package}/: {offending}"


def test_the_check_sees_a_lazy_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from hybridflow.models.loader import load_causal_lm\n    import hybridflow.rollout.engine\n")
    assert imported_packages(module) == {"models", "rollout"}
