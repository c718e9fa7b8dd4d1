"""Render a config as commented YAML: each key preceded by its field docstring.

Used for ``hybridflow config show --doc`` and to generate the shipped reference files
(``ppo_trainer.yaml``, ``sft_trainer.yaml``) from the dataclasses, so the YAML can never
drift from the schema (a test regenerates and compares them).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hybridflow.config.docs import field_docs
from hybridflow.config.loader import _field_types

GENERATED_HEADER = (
    "# Generated from hybridflow/config/{module}.py by `hybridflow config dump {name}`; do not edit.\n"
    "# Every key with its default and meaning. Override any of them on the command line (key=value)\n"
    "# or in your own YAML (--config-path DIR --config-name NAME).\n"
)


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text[:-4].strip() if text.endswith("\n...") else text.removesuffix("...").strip()


def _render(cls: type, tree: dict, indent: int, with_docs: bool, lines: list[str]) -> None:
    docs = field_docs(cls)
    types = _field_types(cls)
    pad = "  " * indent
    for name, value in tree.items():
        tp = types.get(name)
        if with_docs and name in docs:
            lines.append(f"{pad}# {docs[name]}")
        if dataclasses.is_dataclass(tp) and isinstance(value, dict):
            lines.append(f"{pad}{name}:")
            _render(tp, value, indent + 1, with_docs, lines)
        else:
            lines.append(f"{pad}{name}: {_scalar(value)}")


def render_yaml(schema: type, cfg: DictConfig | None = None, *, with_docs: bool = True) -> str:
    """YAML text of ``cfg`` (default: the schema's defaults), documented field by field."""
    cfg = cfg if cfg is not None else OmegaConf.structured(schema)
    tree = OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
    lines: list[str] = []
    _render(schema, tree, 0, with_docs, lines)
    return "\n".join(lines) + "\n"


def _resolve_leniently(node: DictConfig) -> dict:
    """Resolve each value on its own; one that is (or points to) a missing value shows as ???."""
    out = {}
    for key in node.keys():
        try:
            value = node[key]
        except OmegaConfBaseException:
            out[key] = "???"
            continue
        if isinstance(value, DictConfig):
            out[key] = _resolve_leniently(value)
        else:
            out[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return out


def render_resolved(cfg: DictConfig) -> str:
    """Plain YAML with interpolations resolved (values still missing show as ???)."""
    return yaml.safe_dump(_resolve_leniently(cfg), sort_keys=False, default_flow_style=None, width=100)
