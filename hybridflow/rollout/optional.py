"""Whether an optional package (vLLM, SGLang, Triton) is installed, without importing it."""

from __future__ import annotations

import importlib.util


def package_installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None
