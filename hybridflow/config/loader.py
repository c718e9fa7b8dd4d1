"""Compose a config: schema defaults <- a user YAML file <- ``key=value`` overrides.

The override grammar is the part of Hydra's that verl users type:

* ``a.b=value``   set a known key (value parsed as YAML: numbers, bools, null, [lists], {dicts})
* ``+a.b=value``  add a key under a free-form dict (e.g. ``+actor_rollout_ref.model.override_config.x=1``);
  on a key the schema knows it behaves like ``a.b=value``
* ``++a.b=value`` same as ``+``
* ``~a.b``        delete a key from a free-form dict
* ``${x.y}``      interpolation, resolved after all overrides

Every key is checked against the dataclass schema first: an unknown key is an error that
names the nearest valid key, a value of the wrong type is an error that names the key,
the expected type and the value given. verl 0.9's ``reward.*`` spelling is accepted and
rewritten to the classic ``reward_model.*`` / ``custom_reward_function.*`` sections, on the
command line and in YAML files alike. ``_target_`` entries (Hydra's "instantiate this verl
class", e.g. ``algorithm.filter_groups._target_`` in verl's DAPO YAML) are dropped: the schema
decides what each section is.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import typing
from typing import Any, Iterable

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue, OmegaConfBaseException

from hybridflow.errors import ConfigError

# (prefix in verl 0.9 spelling, prefix in the schema); first match wins, longest first.
KEY_ALIASES: tuple[tuple[str, str], ...] = (
    ("reward.custom_reward_function.", "custom_reward_function."),
    ("reward.reward_model.model_path", "reward_model.model.path"),  # verl 0.9's reward-model spelling
    ("reward.reward_manager.name", "reward_model.reward_manager"),
    ("reward.reward_manager", "reward_model.reward_manager"),
    ("reward.reward_model.", "reward_model."),
    ("reward.", "reward_model."),
    ("actor_rollout_ref.model.torch_dtype", "actor_rollout_ref.model.dtype"),  # HF's name, in verl's CISPO example
    ("rollout.n", "actor_rollout_ref.rollout.n"),  # verl's fully async YAML repeats the samples per prompt here
    # verl-recipe's prime_trainer.yaml puts the wrap size directly under the PRM's fsdp_config
    ("reward_model.model.fsdp_config.min_num_params", "reward_model.model.fsdp_config.wrap_policy.min_num_params"),
    # verl 0.9's engine config repeats the role's strategy and Ulysses size inside fsdp_config
    *((f"{role}.fsdp_config.{name}", f"{owner}.{name}")
      for role, owner in (("actor_rollout_ref.actor", "actor_rollout_ref.actor"),
                          ("actor_rollout_ref.ref", "actor_rollout_ref.ref"), ("critic.model", "critic"))
      for name in ("strategy", "ulysses_sequence_parallel_size")),
    # verl 0.9's critic keeps its FSDP engine settings under critic.fsdp (critic.model.fsdp_config before)
    ("critic.fsdp.strategy", "critic.strategy"),
    ("critic.fsdp.ulysses_sequence_parallel_size", "critic.ulysses_sequence_parallel_size"),
    ("critic.fsdp.", "critic.model.fsdp_config."),
    # verl 0.9.1's engine config repeats these role switches inside fsdp_config (the same switch)
    *((f"actor_rollout_ref.{role}.fsdp_config.{name}", f"actor_rollout_ref.{role}.{name}")
      for role in ("actor", "ref")
      for name in ("entropy_checkpointing", "use_torch_compile", "entropy_from_logits_with_chunking")),
    # verl 0.9.1's prefix grouper computes a prompt shared by rollout.n responses once: the shared-prompt layout
    ("actor_rollout_ref.actor.use_prefix_grouper", "actor_rollout_ref.model.use_shared_prompt"),
    ("sandbox_fusion.", "reward_model.sandbox_fusion."),  # verl 0.9.1 moved the sandbox section to the top level
    ("actor_rollout_ref.rollout.nnodes", "rollout.nnodes"),  # verl 0.9.1's standalone rollout pool: split placement
    ("actor_rollout_ref.rollout.n_gpus_per_node", "rollout.n_gpus_per_node"),
)
HYDRA_TARGET = "_target_"
MEGATRON = ("Megatron-LM is not supported: hybridflow trains with FSDP2 only. Drop the *.megatron.* keys and set "
            "strategy=fsdp2; for long sequences use ulysses_sequence_parallel_size, and for models too big for one "
            "device FSDP2 shards them over trainer.n_gpus_per_node x trainer.nnodes ranks (fsdp_config.param_offload "
            "moves them to CPU)")
"""The one line a Megatron key or ``strategy=megatron`` gets (verl's tensor/pipeline parallel settings have no
FSDP2 counterpart here)."""

_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)$")


def canonical_key(key: str, aliases: tuple[tuple[str, str], ...] = ()) -> str:
    """Rewrite an aliased (verl 0.9) key to its schema spelling; ``aliases`` (a schema's own) are tried first."""
    for alias, target in (*aliases, *KEY_ALIASES):
        if key == alias.rstrip("."):
            return target.rstrip(".")
        if alias.endswith(".") and key.startswith(alias):
            return target + key[len(alias) :]
    return key


def is_hydra_target(key: str) -> bool:
    """``a.b._target_``: Hydra metadata naming a verl class, not a config value."""
    return key.rpartition(".")[2] == HYDRA_TARGET


# --------------------------------------------------------------------------- schema walk
def _unwrap_optional(tp: Any) -> Any:
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if len(args) == 1 else Any
    return tp


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: _unwrap_optional(hints[f.name]) for f in dataclasses.fields(cls)}


def schema_keys(schema: type) -> dict[str, Any]:
    """All dotted keys of a dataclass schema -> their (Optional-unwrapped) type."""
    keys: dict[str, Any] = {}

    def walk(cls: type, prefix: str) -> None:
        for name, tp in _field_types(cls).items():
            full = prefix + name
            keys[full] = tp
            if dataclasses.is_dataclass(tp):
                walk(tp, full + ".")

    walk(schema, "")
    return keys


def _is_open(tp: Any) -> bool:
    """A free-form mapping (Dict[str, Any]) or Any: keys below it are not checked."""
    return tp is Any or typing.get_origin(tp) in (dict, typing.Dict)


def _open_ancestor(keys: dict[str, Any], key: str) -> str | None:
    parts = key.split(".")
    for i in range(1, len(parts)):
        prefix = ".".join(parts[:i])
        if prefix in keys and _is_open(keys[prefix]):
            return prefix
    return None


def suggest_key(keys: Iterable[str], key: str) -> str | None:
    """The valid key a user most likely meant: the same field name in another section,
    a close spelling in the same section, or a close spelling anywhere."""
    keys = list(keys)
    parent, _, last = key.rpartition(".")
    moved = [k for k in keys if k.rpartition(".")[2] == last]
    if moved:  # prefer the candidate nearest in the tree, then the shortest
        return max(moved, key=lambda k: (len(os.path.commonprefix([k, key]).split(".")), -len(k)))
    siblings = [k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(last, siblings, n=1, cutoff=0.6)
    if close:
        return f"{parent}.{close[0]}" if parent else close[0]
    close = difflib.get_close_matches(key, keys, n=1, cutoff=0.75)
    return close[0] if close else None


def check_key(keys: dict[str, Any], key: str, *, origin: str, verl_key: str | None = None) -> None:
    """Raise ConfigError if ``key`` is not in the schema (and not under a free-form dict); ``verl_key``: the key as
    the user spelled it, before verl 0.9's spellings were rewritten (a refused verl key is named as written)."""
    if key in keys or _open_ancestor(keys, key):
        return
    if "megatron" in key.split("."):
        raise ConfigError(f"'{key}': {MEGATRON}")
    from hybridflow.config.verl_refusals import refusal_line  # verl 0.9.1's keys, each with its reason

    refused = refusal_line(verl_key or key)
    if refused is not None:
        raise ConfigError(refused + (f" (from {origin})" if origin else ""))
    hint = suggest_key(keys, key)
    where = f" (from {origin})" if origin else ""
    did_you_mean = f"; did you mean '{hint}'?" if hint else "; run `hybridflow config show --doc` to list the keys"
    raise ConfigError(f"unknown config key '{key}'{where}{did_you_mean}")


def _type_name(tp: Any) -> str:
    if dataclasses.is_dataclass(tp):
        return f"a section ({tp.__name__})"
    if typing.get_origin(tp) in (list, typing.List):
        return "a list, e.g. [a,b]"
    if typing.get_origin(tp) in (dict, typing.Dict):
        return "a mapping, e.g. {k: v}"
    return getattr(tp, "__name__", str(tp))


# --------------------------------------------------------------------------- values
def parse_value(text: str) -> Any:
    """Parse an override value as YAML (Hydra-like): ``1e-6`` is a float, ``[a,b]`` a list."""
    if text == "":
        return ""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and _FLOAT_RE.match(value):
        return float(value)
    return value


def parse_override(item: str, aliases: tuple[tuple[str, str], ...] = ()) -> tuple[str, str, Any]:
    """``[+|++|~]key[=value]`` -> (op, key, value) with op in {'set', 'add', 'delete'}."""
    if item.startswith("~"):
        return "delete", canonical_key(item[1:].split("=", 1)[0], aliases), None
    if "=" not in item:
        raise ConfigError(f"override '{item}' has no '=': write key=value (e.g. data.train_batch_size=8)")
    key, value = item.split("=", 1)
    op = "add" if key.startswith("+") else "set"
    key = key.lstrip("+").strip()
    if not key:
        raise ConfigError(f"override '{item}' has an empty key")
    return op, canonical_key(key, aliases), parse_value(value)


def flatten(tree: dict, keys: dict[str, Any], prefix: str = "",
            aliases: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, Any]]:
    """Nested dict from a YAML file -> [(canonical dotted key, leaf value)]; free-form dicts stay whole.

    Keys are walked in the file's spelling and canonicalised whole (``reward.reward_kwargs.x`` ->
    ``reward_model.reward_kwargs.x``), so an aliased section name never leaves a stray dot."""
    items = []
    for name, value in tree.items():
        raw = prefix + str(name)
        full = canonical_key(raw, aliases)
        if is_hydra_target(full):
            continue
        tp = keys.get(full)
        if isinstance(value, dict) and not (tp is not None and _is_open(tp)) and value:
            items.extend(flatten(value, keys, raw + ".", aliases))
        else:
            items.append((full, value))
    return items


# --------------------------------------------------------------------------- compose
def _entry_schema(keys: dict[str, Any], key: str) -> tuple[str, str, type] | None:
    """(mapping key, entry name, entry dataclass) when ``key`` lies under a ``Dict[str, <dataclass>]`` entry
    (``distillation.teacher_models.t1.model_path``), else None."""
    prefix = _open_ancestor(keys, key)
    args = typing.get_args(keys[prefix]) if prefix else ()
    if len(args) != 2 or not dataclasses.is_dataclass(args[1]):
        return None
    return prefix, key[len(prefix) + 1:].split(".")[0], args[1]


def _add_typed_entry(cfg: DictConfig, keys: dict[str, Any], key: str, *, origin: str) -> None:
    """Create a missing entry of a ``Dict[str, <dataclass>]`` with its defaults (issue 60: Hydra's
    ``+distillation.teacher_models.t1.key=...``) and check the key below the entry against that dataclass."""
    typed = _entry_schema(keys, key)
    if typed is None:
        return
    prefix, entry, schema = typed
    rest = key[len(prefix) + len(entry) + 2:]
    if rest:
        check_key(schema_keys(schema), rest, origin=origin)
    mapping = OmegaConf.select(cfg, prefix)
    if entry not in mapping:
        mapping[entry] = OmegaConf.structured(schema)


def _assign(cfg: DictConfig, keys: dict[str, Any], key: str, value: Any, *, origin: str,
            verl_key: str | None = None) -> None:
    check_key(keys, key, origin=origin, verl_key=verl_key)
    _add_typed_entry(cfg, keys, key, origin=origin)
    tp = keys.get(key)
    if dataclasses.is_dataclass(tp) and not isinstance(value, dict):
        raise ConfigError(f"'{key}' is a section, not a value: set one of its keys, e.g. {key}.<name>=...")
    try:
        OmegaConf.update(cfg, key, value, merge=True, force_add=_open_ancestor(keys, key) is not None)
    except OmegaConfBaseException as err:
        expected = _type_name(tp) if tp is not None else "a value"
        raise ConfigError(
            f"{key}: expected {expected}, got {type(value).__name__} {value!r} (from {origin})"
        ) from err


def _delete(cfg: DictConfig, keys: dict[str, Any], key: str) -> None:
    parent, _, last = key.rpartition(".")
    if _open_ancestor(keys, key) is None:
        raise ConfigError(f"~{key}: only entries of free-form mappings can be deleted; set {key}=null instead")
    node = OmegaConf.select(cfg, parent)
    if node is None or last not in node:
        raise ConfigError(f"~{key}: there is no such entry to delete")
    del node[last]


def read_yaml_file(path: str) -> dict:
    """Load a user YAML config; Hydra ``defaults`` lists naming shipped configs are skipped."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file '{path}' does not exist (check --config-path/--config-name)")
    try:
        with open(path) as fh:
            tree = yaml.safe_load(fh) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"config file '{path}' is not valid YAML: {str(err).splitlines()[0]}") from err
    if not isinstance(tree, dict):
        raise ConfigError(f"config file '{path}' must hold a mapping of sections, not {type(tree).__name__}")
    tree.pop("defaults", None)
    tree.pop("hydra", None)
    return tree


def _is_group_choice(schema: type, key: str, value: Any) -> bool:
    """``engine=fsdp``: a Hydra config-group choice (``schema.CONFIG_GROUPS``), not a value. The one choice
    hybridflow has is accepted (it is the schema's default); Megatron, or any other, is refused in one line."""
    choices = getattr(schema, "CONFIG_GROUPS", {}).get(key)
    if choices is None:
        return False
    if value == "megatron":
        raise ConfigError(f"{key}={value}: {MEGATRON}")
    if value not in choices:
        raise ConfigError(f"{key}={value!r}: the config group {key} has only {', '.join(choices)} in hybridflow")
    return True


def compose(schema: type, overrides: Iterable[str] = (), config_file: str | None = None,
            defaults: Iterable[str] = ()) -> DictConfig:
    """Defaults of ``schema`` <- ``defaults`` (a recipe's overrides) <- ``config_file`` <- ``overrides``;
    interpolations left unresolved.

    A schema may declare ``KEY_ALIASES`` (its own verl spellings, tried before the shared ones) and
    ``CONFIG_GROUPS`` (Hydra group choices such as ``engine=fsdp``) as class attributes."""
    cfg = OmegaConf.structured(schema)
    keys = schema_keys(schema)
    aliases = getattr(schema, "KEY_ALIASES", ())
    for item in defaults:
        _, key, value = parse_override(item)
        _assign(cfg, keys, key, value, origin=f"the recipe's default '{item}'")
    if config_file:
        for key, value in flatten(read_yaml_file(config_file), keys, aliases=aliases):
            if not _is_group_choice(schema, key, value):
                _assign(cfg, keys, key, value, origin=os.path.basename(config_file))
    for item in overrides:
        op, key, value = parse_override(item)
        if is_hydra_target(key) or (op != "delete" and _is_group_choice(schema, key, value)):
            continue
        verl_key, key = item.split("=", 1)[0].lstrip("+~").strip(), canonical_key(key, aliases)
        if op == "delete":
            _delete(cfg, keys, key)
        else:
            _assign(cfg, keys, key, value, origin=f"override '{item}'", verl_key=verl_key)
    return cfg


def to_object(cfg: DictConfig) -> Any:
    """Resolve interpolations and build the dataclass instances; missing values are named."""
    try:
        return OmegaConf.to_object(cfg)
    except MissingMandatoryValue as err:
        key = getattr(err, "full_key", "") or "?"
        raise ConfigError(f"{key} is not set: pass {key}=... on the command line or in your YAML") from err
    except InterpolationResolutionError as err:
        key = getattr(err, "full_key", "") or "?"
        raise ConfigError(f"{key}: cannot resolve interpolation ({str(err).splitlines()[0]})") from err


def load_config(schema: type, overrides: Iterable[str] = (), config_file: str | None = None,
                defaults: Iterable[str] = ()) -> Any:
    """Compose and resolve: the typed config object a trainer runs with. Compatibility-only keys
    set to a non-default value are named once each (``hybridflow.config.compat``); ``strategy=megatron`` is refused
    first, in one line for every key that sets it (a key following it by interpolation is not named again)."""
    from hybridflow.config.compat import megatron_keys, warn_compat_keys

    cfg = compose(schema, overrides, config_file, defaults)
    megatron = megatron_keys(cfg, schema)
    if megatron:
        raise ConfigError(f"{', '.join(megatron)}=megatron: {MEGATRON}")
    resolved = to_object(cfg)
    warn_compat_keys(cfg, schema)
    return resolved


# --------------------------------------------------------------------------- command line
SHIPPED_CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))
_PATH_FLAGS = ("--config-path", "-cp")
_NAME_FLAGS = ("--config-name", "-cn")
_FILE_FLAGS = ("--config",)


def _take_flag(argv: list[str], i: int) -> tuple[str, str, int]:
    """argv[i] is ``--flag=value`` or ``--flag value`` -> (flag, value, next index)."""
    arg = argv[i]
    if "=" in arg and arg.startswith("-"):
        flag, value = arg.split("=", 1)
        return flag, value, i + 1
    if i + 1 >= len(argv):
        raise ConfigError(f"{arg} needs a value")
    return arg, argv[i + 1], i + 2


def split_config_args(argv: list[str]) -> tuple[str | None, list[str]]:
    """Separate Hydra-style ``--config-path DIR --config-name NAME`` (or ``--config FILE``)
    from the ``key=value`` overrides. Returns (config file or None, overrides)."""
    path = name = file = None
    overrides: list[str] = []
    i = 0
    while i < len(argv):
        head = argv[i].split("=", 1)[0]
        if head in _PATH_FLAGS + _NAME_FLAGS + _FILE_FLAGS:
            flag, value, i = _take_flag(argv, i)
            path = value if flag in _PATH_FLAGS else path
            name = value if flag in _NAME_FLAGS else name
            file = value if flag in _FILE_FLAGS else file
            continue
        if argv[i].startswith("-"):
            raise ConfigError(f"unknown option '{argv[i]}': pass config values as key=value")
        overrides.append(argv[i])
        i += 1
    return file or _resolve_config_name(path, name), overrides


ENTRY_MODULE_DIR = os.path.join(os.path.dirname(SHIPPED_CONFIG_DIR), "trainer")
"""The folder of every ``python -m hybridflow.trainer.*`` entry module: Hydra resolves a relative ``--config-path``
against the entry module's folder, not the working directory."""


def config_dir(path: str, filename: str) -> str:
    """Where ``--config-path=path`` points, by Hydra's rule : an absolute path is itself; a relative one
    is under the entry module's folder, where ``config`` is the shipped configs (verl's ``verl/trainer/config`` and
    the fully-async / recipe ``config`` folders beside their entry modules) when they hold ``filename``; a relative
    folder that is not there is read from the working directory (a user's own configs)."""
    path = os.path.expanduser(path)
    if os.path.isabs(path):
        return path
    if os.path.normpath(path) == "config" and os.path.isfile(os.path.join(SHIPPED_CONFIG_DIR, filename)):
        return SHIPPED_CONFIG_DIR
    beside_entry = os.path.join(ENTRY_MODULE_DIR, path)
    return beside_entry if os.path.isdir(beside_entry) else path


def _resolve_config_name(path: str | None, name: str | None) -> str | None:
    if name is None:
        if path is not None:
            raise ConfigError("--config-path given without --config-name: name the YAML file too")
        return None
    filename = name if name.endswith((".yaml", ".yml")) else name + ".yaml"
    base = config_dir(path, filename) if path else SHIPPED_CONFIG_DIR
    full = os.path.join(base, filename)
    if not os.path.isfile(full):
        shipped = sorted(f[:-5] for f in os.listdir(SHIPPED_CONFIG_DIR) if f.endswith(".yaml"))
        raise ConfigError(f"config '{filename}' not found in '{base}' (shipped configs: {', '.join(shipped)})")
    return full


HELP_FLAGS = ("-h", "--help")
TRAINER_USAGE = """\
usage: {prog} [--config-path DIR --config-name NAME] [--debug] key=value ...

{summary}

  key=value        set a config key, e.g. data.train_batch_size=8 (values parse as YAML: 1e-6, [a,b], null)
  +key=value       add an entry under a free-form mapping (override_config, engine_kwargs, ...)
  ~key             delete such an entry
  --config-path DIR --config-name NAME
                   start from a YAML file (verl's Hydra flags; --config FILE also works)
  --debug          show the full traceback of an error

Every key, its default and its meaning: hybridflow config show{trainer_flag} --doc
The resolved config of a command line:  hybridflow config show{trainer_flag} key=value ...
"""


def help_requested(argv: list[str]) -> bool:
    """``-h`` / ``--help`` anywhere before a ``key=value`` that could hold it as a value."""
    return any(arg in HELP_FLAGS for arg in argv)


def trainer_usage(prog: str, summary: str, trainer: str) -> str:
    """The ``--help`` text of a trainer entry point (``trainer``: ppo or sft)."""
    trainer_flag = "" if trainer == "ppo" else f" --trainer {trainer}"
    return TRAINER_USAGE.format(prog=prog, summary=summary, trainer_flag=trainer_flag)


def run_from_config_args(args: list[str], *, schema: type, run, trainer: str, prog: str, summary: str,
                         defaults: tuple[str, ...] = (), adapt=None) -> int:
    """What every trainer entry point does with its command line: ``--help`` prints its usage; else
    ``[--config-path D --config-name N] key=value ...`` is loaded into ``schema`` (``defaults``, a recipe's settings,
    go before the YAML file's and the user's keys; ``adapt(cfg) -> cfg``, a recipe's reading of its keys, runs on the
    loaded config) and handed to ``run``."""
    if help_requested(args):
        print(trainer_usage(prog, summary, trainer), end="")
        return 0
    config_file, overrides = split_config_args(args)
    cfg = load_config(schema, overrides, config_file, defaults=defaults)
    run(adapt(cfg) if adapt is not None else cfg)
    return 0


def config_value(cfg: Any, key: str) -> Any:
    """The value at a dotted key of a resolved config (``config_value(cfg, "algorithm.gdpo_reward_keys")``): how an
    algorithm's spec reads the run config (``functools.partial(config_value, cfg)`` is its ``setting``)."""
    for name in key.split("."):
        cfg = getattr(cfg, name)
    return cfg
