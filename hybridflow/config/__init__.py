"""Typed config with verl's keys: dataclass schemas, YAML/override composition, validation.

>>> from hybridflow.config import PPOConfig, load_config
>>> cfg = load_config(PPOConfig, ["actor_rollout_ref.model.path=/models/tiny", "algorithm.adv_estimator=grpo"])
"""

from hybridflow.config.loader import compose, config_value, load_config, split_config_args, to_object
from hybridflow.config.ppo import PPOConfig
from hybridflow.config.render import render_resolved, render_yaml
from hybridflow.config.sft import SFTConfig
from hybridflow.config.spin import SPINConfig
from hybridflow.config.sppo import SPPOConfig
from hybridflow.config.validate import (critic_enabled, implicit_prm_enabled, reference_enabled, split_placement,
                                        validate_ppo_config, validate_sft_config)

SCHEMAS = {"ppo": PPOConfig, "sft": SFTConfig, "spin": SPINConfig, "sppo": SPPOConfig}
"""Trainer name -> its config schema (``hybridflow config show --trainer sft``)."""

__all__ = [
    "PPOConfig",
    "SFTConfig",
    "SPINConfig",
    "SPPOConfig",
    "SCHEMAS",
    "compose",
    "config_value",
    "critic_enabled",
    "implicit_prm_enabled",
    "split_placement",
    "reference_enabled",
    "load_config",
    "render_resolved",
    "render_yaml",
    "split_config_args",
    "to_object",
    "validate_ppo_config",
    "validate_sft_config",
]
