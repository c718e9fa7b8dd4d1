"""Import a script of benchmarks/ as a module, for the tests of its arithmetic and its tiny runs."""

import contextlib
import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@contextlib.contextmanager
def loaded_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module, registered in ``sys.modules`` while in use (dataclasses look their
    module up there) and removed after."""
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]
