"""Issue 57: no string comparison of an algorithm, loss, estimator, KL penalty or controller, reward manager or engine
name outside ``algos/`` (where they are registered) and ``rollout/engine.py`` (the engine registry): the rest of the
package asks a registry or a spec, so adding one touches its own module only."""

from __future__ import annotations

import ast
import pathlib

from hybridflow.algos import list_advantages, list_kl_penalties, list_policy_losses
from hybridflow.algos.kl_controllers import KL_CONTROLLERS
from hybridflow.rewards import list_reward_managers
from hybridflow.rollout.engine import list_engines

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "hybridflow"
OWNERS = ("algos/", "rollout/engine.py")
KNOWN: dict[str, set[str]] = {}
"""The comparisons left, each with its reason (none now)."""


def registered_names() -> set[str]:
    return {*list_advantages(), *list_policy_losses(), *list_kl_penalties(), *KL_CONTROLLERS, *list_reward_managers(),
            *list_engines()}


def compared_names(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """``(line, name)`` of every registered name compared with ``==`` / ``!=`` / ``in``, or assigned to a variable."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            for side in [node.left, *node.comparators]:
                items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                found += [(node.lineno, item.value) for item in items
                          if isinstance(item, ast.Constant) and item.value in names]
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value in names
              and any(isinstance(target, ast.Name) for target in node.targets)):
            found.append((node.lineno, node.value.value))  # a branch's choice (a recipe setting a key is a choice)
    return found


def test_no_registered_name_is_compared_outside_its_registry():
    names, offending = registered_names(), {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(OWNERS):
            continue
        hits = compared_names(ast.parse(path.read_text()), names)
        if {name for _, name in hits} - KNOWN.get(relative, set()):
            offending[relative] = hits
    assert offending == {}


def test_the_check_sees_a_comparison_and_an_assignment():
    tree = ast.parse('if loss_mode != "vanilla" or name in ("dapo", "x"):\n    mode = "bypass_mode"\nok = a == "cpu"\n')
    assert sorted(compared_names(tree, {"vanilla", "dapo", "bypass_mode"})) == [(1, "dapo"), (1, "vanilla"),
                                                                         (2, "bypass_mode")]
