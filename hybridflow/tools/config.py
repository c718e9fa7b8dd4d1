"""Tool-config YAML (verl's format) -> tool objects.

    tools:
      - class_name: hybridflow.tools.calculator.CalculatorTool   # import path of a BaseTool subclass
        config: {}                                               # passed to the constructor
        tool_schema:                                             # OpenAI function schema (optional for built-ins)
          type: function
          function: {name: calculator, description: ..., parameters: {...}}

verl's own class paths (``verl.tools.gsm8k_tool.Gsm8kTool``) map to the built-ins, so a verl
tool config runs unchanged.
"""

from __future__ import annotations

import importlib
import os

from hybridflow.errors import ConfigError
from hybridflow.tools.base import BaseTool

VERL_CLASS_PATHS = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "hybridflow.tools.answer_check.AnswerCheckTool",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "hybridflow.tools.code_interpreter.CodeInterpreterTool",
}
"""verl tool classes and the built-in that has the same meaning."""


def import_class(path: str, *, where: str):
    """``package.module.Class`` -> the class; a bad path is one error naming the entry."""
    module_name, _, class_name = str(path).rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ConfigError(f"{where}: cannot import class_name {path!r} ({err}); write module.path.ClassName "
                          "of a class importable from PYTHONPATH") from err


def read_yaml(path: str, *, key: str) -> dict:
    from omegaconf import OmegaConf

    full = os.path.expanduser(str(path))
    if not os.path.isfile(full):
        raise ConfigError(f"{key}: file {path!r} does not exist; point {key} at a YAML file")
    return OmegaConf.to_container(OmegaConf.load(full), resolve=True) or {}


def load_tools(path: str, *, key: str = "actor_rollout_ref.rollout.multi_turn.tool_config_path") -> list[BaseTool]:
    """The tools listed under ``tools:`` in the YAML at ``path``, in order; names must be unique."""
    entries = read_yaml(path, key=key).get("tools")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{key}: {path} must hold a non-empty list under 'tools:' (each with class_name)")
    tools: list[BaseTool] = []
    for index, entry in enumerate(entries):
        where = f"{path}: tools[{index}]"
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ConfigError(f"{where} needs a class_name (e.g. hybridflow.tools.calculator.CalculatorTool)")
        class_path = VERL_CLASS_PATHS.get(entry["class_name"], entry["class_name"])
        cls = import_class(class_path, where=where)
        tool = cls(config=entry.get("config") or {}, tool_schema=entry.get("tool_schema"))
        if tool.name in {t.name for t in tools}:
            raise ConfigError(f"{where}: a second tool is named {tool.name!r}; tool names must be unique")
        tools.append(tool)
    return tools
