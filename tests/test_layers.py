"""The package layering of DESIGN.md ("Layers"): each package imports only the layers listed under it.

Every ``import hybridflow.X`` / ``from hybridflow.X import ...`` counts, also the ones inside functions
(a lazy import is still a dependency). ``hybridflow/errors.py``, ``hybridflow/cpu.py`` (thread and
allocator settings) and ``hybridflow/omp.py`` (OpenMP's wait policy) are the base every layer may use.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "hybridflow"
BASE = {"errors", "cpu", "omp"}
BELOW_TRAINER = {"algos", "config", "data", "rewards", "tools", "models", "rollout", "agents", "workers", "controller"}
ALLOWED = {
    "algos": set(),
    # validation asks the registered specs what an algorithm needs: algos/registry.py and the distillation losses'
    # registry (algos/distillation/__init__.py), nothing else of algos
    "config": {"algos.registry", "algos.distillation"},
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


def module_imports(path: pathlib.Path, modules: set[str]) -> set[str]:
    """The ``hybridflow`` modules (of ``modules``) that one file imports when it runs, lazy imports inside functions
    included; ``from package import module`` names the module, and imports under ``if TYPE_CHECKING:`` (annotations
    only) are left out."""
    tree = ast.parse(path.read_text())
    typing_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", None) == "TYPE_CHECKING" for node in ast.walk(block)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            named = {f"{node.module}.{alias.name}" for alias in node.names}
            found |= named if named <= modules else {node.module}
    return found & modules


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm): each holds an import circle."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return cycles


def test_no_module_imports_itself_through_others():
    """No import circle between hybridflow's modules (issue 46: rollout/native.py and rollout/request_queue.py
    imported each other): a circle makes the import order matter and hides which module is built on which."""
    files = {".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): path
             for path in PACKAGE.rglob("*.py")}
    graph = {name: module_imports(path, set(files)) - {name} for name, path in files.items()}
    assert import_cycles(graph) == []
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the finder works


def package_graph(*, annotations: bool) -> dict[str, set[str]]:
    """hybridflow's module import graph (``hybridflow.x.y`` -> the modules it imports), lazy imports included and,
    with ``annotations``, the ones under ``if TYPE_CHECKING:`` too."""
    files = {".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): path
             for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                named = {f"{node.module}.{alias.name}" for alias in node.names}
                found |= named if named <= set(files) else {node.module}
        graph[name] = (found & set(files) if annotations else module_imports(path, set(files))) - {name}
    return graph


def test_no_import_circle_even_through_annotations():
    """Issue 57: not even a type annotation closes a circle (the request queue knows its engine through the
    ``StepEngine`` protocol, the segment layout has a module of its own)."""
    assert import_cycles(package_graph(annotations=True)) == []


ROLLOUT_LAYERS = [
    # records, kernels and the pieces the engines are built of
    {"types", "optional", "host_copy", "sleep", "lanes", "weights", "architectures", "block_manager", "cuda_graphs",
     "triton_attention", "triton_mla", "triton_fused", "triton_moe", "triton_sampling", "cpu_kernels", "cpu_attention",
     "cpu_fused", "cpu_moe",  # issue 58: the routed experts as one C call
     "bf16_linear", "fp32_linear",  # issue 56: bf16 / fp32 projections at decode row counts as one C call
     "attention_variants", "packed_linear", "moe", "grouped_moe", "vision_prefill", "stopping", "kv_cache", "sampler",
     "config",
     "vllm_worker", "vllm_process", "vllm_venv"},  # and vLLM's worker extension, host process, side venv
    {"decoder", "weight_packing", "packed_prefill", "rotary", "mla"},  # the native engine's model forward
    {"generation_run", "scheduler"},   # a run's state, and the plan of one step over it
    {"model_runner", "kv_pool", "request_queue", "vllm_host"},  # executing a plan, its KV memory; requests over an
    # engine; vLLM's LLM behind the VLLMEngine (in this process or in its side venv)
    {"native", "hf", "vllm", "sglang"},  # the engines
    {"streaming", "engine", "vllm_partial"},  # sessions over an engine; the registry of engines
]
TRAINER_LAYERS = [
    {"tracking"},
    {"checkpoints", "entry", "sft"},  # sft's checkpoint uses checkpoints.ownership (issue 61)
    {"loop"},
    {"roles"},
    {"main_ppo", "main_dapo", "main_prime", "main_fully_async", "main_one_step_off", "main_spin", "main_sppo", "demo",
     "sft_trainer", "fsdp_sft_trainer", "main_eval", "main_generation_server"},
]
"""The sub-layers inside rollout/ and trainer/ (by module or sub-package), bottom first: a module imports only
its own layer and those below it."""


def sub_layer_violations(package: str, layers: list[set[str]]) -> dict[str, list[str]]:
    rank = {name: index for index, layer in enumerate(layers) for name in layer}
    prefix = f"hybridflow.{package}."

    def layer_of(module: str) -> int:
        part = module.removeprefix(prefix).split(".")[0]
        assert part in rank, f"{module} is in no sub-layer of {package}/: add it to the test's table"
        return rank[part]

    graph = package_graph(annotations=True)
    return {name: sorted(target for target in graph[name] if target.startswith(prefix)
                         and layer_of(target) > layer_of(name))
            for name in graph if name.startswith(prefix) and any(
                target.startswith(prefix) and layer_of(target) > layer_of(name) for target in graph[name])}


@pytest.mark.parametrize("package,layers", [("rollout", ROLLOUT_LAYERS), ("trainer", TRAINER_LAYERS)])
def test_no_module_imports_a_sub_layer_above_its_own(package, layers):
    assert sub_layer_violations(package, layers) == {}


def test_the_sub_layer_check_sees_an_upward_import():
    assert sub_layer_violations("trainer", [{"tracking", "sft", "checkpoints", "entry", "roles"}, {"loop"},
                                            {"main_ppo", "main_dapo", "main_prime", "main_fully_async",
                                             "main_one_step_off", "main_spin", "main_sppo", "demo", "sft_trainer",
                                             "fsdp_sft_trainer", "main_eval", "main_generation_server"}])  # roles.assembly imports loop.fit
