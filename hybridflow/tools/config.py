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
    "verl.tools.geo3k_tool.Geo3kTool": "hybridflow.tools.answer_check.Geo3kAnswerCheckTool",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "hybridflow.tools.code_interpreter.CodeInterpreterTool",
}
"""verl tool classes and the built-in that has the same meaning."""
TOOL_METHODS = ("create", "execute", "calc_reward", "release")


def import_class(path: str, *, where: str):
    """``package.module.Class`` -> the class; a bad path, or a name that is not a class, is one error
    naming the entry."""
    module_name, _, class_name = str(path).rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except Exception as err:  # noqa: BLE001 - a module that fails at import is a config error too
        raise ConfigError(f"{where}: cannot import class_name {path!r} ({type(err).__name__}: {err}); write "
                          "module.path.ClassName of a class importable from PYTHONPATH") from err
    if not isinstance(found, type):
        raise ConfigError(f"{where}: class_name {path!r} is a {type(found).__name__}, not a class; name the class "
                          "(module.path.ClassName)")
    return found


def instantiate(cls, *, where: str, methods: tuple[str, ...], **kwargs):
    """``cls(**kwargs)``; a constructor that raises, or an object without ``methods``, is one error."""
    try:
        made = cls(**kwargs)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - user code: say which entry and why, no traceback
        raise ConfigError(f"{where}: {cls.__name__}(...) raised {type(err).__name__}: {err}; fix its config") from err
    missing = [name for name in methods if not callable(getattr(made, name, None))]
    if missing:
        raise ConfigError(f"{where}: {cls.__name__} has no method {', '.join(missing)}; it must provide "
                          f"{', '.join(methods)}")
    return made


def read_yaml(path: str, *, key: str) -> dict:
    from omegaconf import OmegaConf

    full = os.path.expanduser(str(path))
    if not os.path.isfile(full):
        raise ConfigError(f"{key}: file {path!r} does not exist; point {key} at a YAML file")
    try:
        loaded = OmegaConf.to_container(OmegaConf.load(full), resolve=True) or {}
    except Exception as err:  # noqa: BLE001 - yaml's and omegaconf's errors: one line, no traceback
        first = " ".join(str(err).split())[:200]
        raise ConfigError(f"{key}: {path} is not valid YAML ({type(err).__name__}: {first})") from err
    if not isinstance(loaded, (dict, list)):
        raise ConfigError(f"{key}: {path} must be a YAML mapping, not a {type(loaded).__name__}")
    return loaded


def load_tools(path: str, *, key: str = "actor_rollout_ref.rollout.multi_turn.tool_config_path") -> list[BaseTool]:
    """The tools listed under ``tools:`` in the YAML at ``path``, in order; names must be unique."""
    loaded = read_yaml(path, key=key)
    entries = loaded.get("tools") if isinstance(loaded, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{key}: {path} must hold a non-empty list under 'tools:' (each with class_name)")
    tools: list[BaseTool] = []
    for index, entry in enumerate(entries):
        where = f"{path}: tools[{index}]"
        if not isinstance(entry, dict) or "class_name" not in entry:
            raise ConfigError(f"{where} needs a class_name (e.g. hybridflow.tools.calculator.CalculatorTool)")
        class_path = VERL_CLASS_PATHS.get(entry["class_name"], entry["class_name"])
        cls = import_class(class_path, where=where)
        tool = instantiate(cls, where=where, methods=TOOL_METHODS, config=entry.get("config") or {},
                           tool_schema=entry.get("tool_schema"))
        if tool.name in {t.name for t in tools}:
            raise ConfigError(f"{where}: a second tool is named {tool.name!r}; tool names must be unique")
        tools.append(tool)
    return tools
