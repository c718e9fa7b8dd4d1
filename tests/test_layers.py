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
    # validation asks the registered estimator specs whether a critic is needed: algos/registry.py, nothing else
    # of algos
    "config": {"algos.registry"},
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


MODULES = {"cli": {"trainer", "config"}}
"""Top-level modules and what they may import: the command dispatches to the trainers' entry points, and runs the
tools (models tiny / fetch, preprocess, merge) as ``python -m`` would, by module name."""


def imported_packages(path: pathlib.Path) -> set[str]:
    """The ``hybridflow`` sub-packages (or top-level modules) that one file imports, each also as ``package.module``
    when a module inside it is named (``algos`` and ``algos.registry`` for ``from hybridflow.algos.registry ...``)."""
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
                found.add(".".join(parts[1:3]) if len(parts) > 2 else parts[1])
    return found


def outside(imported: set[str], allowed: set[str]) -> set[str]:
    """The imports a layer may not make: a package is allowed whole, a ``package.module`` alone or by its package."""
    return {name for name in imported if name not in allowed and name.split(".")[0] not in allowed}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_the_layers_below_it(package):
    offending = {}
    for path in sorted((PACKAGE / package).rglob("*.py")):
        upward = outside(imported_packages(path), ALLOWED[package] | BASE | {package})
        if upward:
            offending[str(path.relative_to(PACKAGE))] = sorted(upward)
    assert not offending, f"imports outside the layers DESIGN.md allows {package}/: {offending}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_top_level_module_imports_only_its_layers(module):
    upward = outside(imported_packages(PACKAGE / f"{module}.py"), MODULES[module] | BASE)
    assert not upward, f"{module}.py imports outside the layers DESIGN.md allows it: {sorted(upward)}"


def test_the_check_sees_a_lazy_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from hybridflow.models.loader import load_causal_lm\n    import hybridflow.rollout.engine\n")
    assert imported_packages(module) == {"models.loader", "rollout.engine"}
    assert outside(imported_packages(module), {"models"}) == {"rollout.engine"}


def test_config_may_read_the_algorithm_registry_and_nothing_else_of_algos():
    allowed = ALLOWED["config"] | BASE | {"config"}
    assert outside({"algos.registry", "config.loader", "errors"}, allowed) == set()
    assert outside({"algos", "algos.errors"}, allowed) == {"algos", "algos.errors"}
