"""Config: verl defaults, override grammar, error messages that name the fix, shipped YAMLs."""

import os

import pytest

from hybridflow.config import SCHEMAS, PPOConfig, SFTConfig, compose, load_config, render_yaml, split_config_args
from hybridflow.config.render import GENERATED_HEADER
from hybridflow.errors import ConfigError

MODEL = "actor_rollout_ref.model.path=/models/tiny"
SHIPPED_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "hybridflow", "config")


def test_defaults_follow_verl():
    cfg = load_config(PPOConfig, [MODEL])
    assert cfg.data.max_prompt_length == 512
    assert cfg.actor_rollout_ref.actor.clip_ratio == 0.2
    assert cfg.actor_rollout_ref.actor.loss_agg_mode == "token-mean"
    assert cfg.algorithm.adv_estimator == "gae"
    assert cfg.algorithm.gamma == 1.0 and cfg.algorithm.lam == 1.0
    assert cfg.algorithm.norm_adv_by_std_in_grpo is True
    assert cfg.algorithm.kl_ctrl.kl_coef == 0.001
    assert cfg.actor_rollout_ref.rollout.val_kwargs.temperature == 0
    assert cfg.custom_reward_function.name == "compute_score"


def test_interpolations_follow_their_source():
    cfg = load_config(PPOConfig, [MODEL, "data.max_response_length=64", "actor_rollout_ref.actor.ppo_epochs=3"])
    assert cfg.actor_rollout_ref.rollout.response_length == 64
    assert cfg.critic.ppo_epochs == 3
    assert cfg.critic.model.path == "/models/tiny"
    assert cfg.trainer.default_local_dir == "checkpoints/hybridflow/run"


def test_override_grammar():
    cfg = load_config(
        PPOConfig,
        [
            MODEL,
            "trainer.logger=[console,file]",
            "actor_rollout_ref.actor.optim.lr=1e-6",
            "+actor_rollout_ref.model.override_config.attn_implementation=eager",
            "data.train_files=[a.parquet,b.parquet]",
            "critic.optim.lr=${actor_rollout_ref.actor.optim.lr}",
            "trainer.total_training_steps=null",
        ],
    )
    assert cfg.trainer.logger == ["console", "file"]
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-6)
    assert cfg.actor_rollout_ref.model.override_config == {"attn_implementation": "eager"}
    assert cfg.data.train_files == ["a.parquet", "b.parquet"]
    assert cfg.critic.optim.lr == pytest.approx(1e-6)
    assert cfg.trainer.total_training_steps is None


def test_delete_from_free_form_dict():
    cfg = load_config(PPOConfig, [MODEL, "+reward_model.reward_kwargs.a=1", "+reward_model.reward_kwargs.b=2",
                                  "~reward_model.reward_kwargs.a"])
    assert cfg.reward_model.reward_kwargs == {"b": 2}
    with pytest.raises(ConfigError, match="only entries of free-form mappings can be deleted"):
        compose(PPOConfig, ["~algorithm.gamma"])


def test_verl_09_reward_spelling_is_accepted():
    cfg = load_config(PPOConfig, [MODEL, "reward.custom_reward_function.path=/r.py", "reward.reward_manager.name=parallel",
                                  "reward.num_workers=4", "+reward.reward_kwargs.x=1", "reward.reward_model.enable=True"])
    assert cfg.custom_reward_function.path == "/r.py"
    assert cfg.reward_model.reward_manager == "parallel"
    assert cfg.reward_model.num_workers == 4
    assert cfg.reward_model.reward_kwargs == {"x": 1}
    assert cfg.reward_model.enable is True


def test_misspelled_key_names_the_nearest():
    with pytest.raises(ConfigError) as err:
        compose(PPOConfig, ["algorithm.adv_estimater=grpo"])
    assert str(err.value) == (
        "unknown config key 'algorithm.adv_estimater' (from override 'algorithm.adv_estimater=grpo'); "
        "did you mean 'algorithm.adv_estimator'?"
    )


def test_key_in_wrong_section_names_the_right_one():
    with pytest.raises(ConfigError, match="did you mean 'actor_rollout_ref.actor.ppo_mini_batch_size'"):
        compose(PPOConfig, ["actor_rollout_ref.rollout.ppo_mini_batch_size=4"])


def test_plus_does_not_bypass_the_schema():
    with pytest.raises(ConfigError, match="unknown config key 'trainer.totl_epochs'.*'trainer.total_epochs'"):
        compose(PPOConfig, ["+trainer.totl_epochs=3"])


def test_wrong_type_names_key_expected_type_and_value():
    with pytest.raises(ConfigError) as err:
        compose(PPOConfig, ["algorithm.gamma=abc"])
    assert str(err.value) == "algorithm.gamma: expected float, got str 'abc' (from override 'algorithm.gamma=abc')"
    with pytest.raises(ConfigError, match=r"data.train_batch_size: expected int, got float 1.5"):
        compose(PPOConfig, ["data.train_batch_size=1.5"])
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.actor.use_kl_loss: expected bool, got str 'maybe'"):
        compose(PPOConfig, ["actor_rollout_ref.actor.use_kl_loss=maybe"])


def test_section_is_not_a_value():
    with pytest.raises(ConfigError, match="'actor_rollout_ref.actor' is a section, not a value"):
        compose(PPOConfig, ["actor_rollout_ref.actor=3"])


def test_override_without_equals():
    with pytest.raises(ConfigError, match="has no '='"):
        compose(PPOConfig, ["data.train_batch_size"])


def test_missing_model_path_is_named():
    with pytest.raises(ConfigError) as err:
        load_config(PPOConfig, [])
    assert "actor_rollout_ref.model.path is not set" in str(err.value)


def test_user_yaml_with_hydra_defaults(tmp_path):
    (tmp_path / "mine.yaml").write_text(
        "defaults:\n  - ppo_trainer\n  - _self_\n"
        "data:\n  train_batch_size: 16\nalgorithm:\n  adv_estimator: grpo\n"
        "actor_rollout_ref:\n  model:\n    path: /models/tiny\n    override_config:\n      dropout: 0.0\n"
    )
    config_file, overrides = split_config_args(["--config-path", str(tmp_path), "--config-name=mine", "data.train_batch_size=8"])
    cfg = load_config(PPOConfig, overrides, config_file)
    assert cfg.data.train_batch_size == 8  # command line wins over the file
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.actor_rollout_ref.model.override_config == {"dropout": 0.0}


def test_user_yaml_errors_name_the_file(tmp_path):
    (tmp_path / "bad.yaml").write_text("algorithm:\n  gama: 0.9\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'algorithm.gama' \(from bad.yaml\); did you mean 'algorithm.gamma'"):
        compose(PPOConfig, [], str(tmp_path / "bad.yaml"))
    (tmp_path / "broken.yaml").write_text("algorithm: [\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        compose(PPOConfig, [], str(tmp_path / "broken.yaml"))
    with pytest.raises(ConfigError, match="config 'nope.yaml' not found"):
        split_config_args(["--config-path", str(tmp_path), "--config-name", "nope"])
    with pytest.raises(ConfigError, match="does not exist"):
        compose(PPOConfig, [], str(tmp_path / "absent.yaml"))


def test_unknown_option_is_rejected():
    with pytest.raises(ConfigError, match="unknown option '--epochs'"):
        split_config_args(["--epochs", "3"])


@pytest.mark.parametrize("name,schema", sorted(SCHEMAS.items()))
def test_shipped_yaml_is_generated_from_the_schema(name, schema):
    path = os.path.join(SHIPPED_DIR, f"{name}_trainer.yaml")
    with open(path) as fh:
        shipped = fh.read()
    assert shipped == GENERATED_HEADER.format(module=name, name=name) + render_yaml(schema), (
        f"{path} is stale: run `hybridflow config dump {name} -o {path}`"
    )


def test_every_shipped_yaml_loads():
    names = sorted(f for f in os.listdir(SHIPPED_DIR) if f.endswith(".yaml"))
    assert "ppo_trainer.yaml" in names and "sft_trainer.yaml" in names
    for name in names:
        schema = SCHEMAS.get(name.removesuffix("_trainer.yaml"), PPOConfig)
        required = ["model.partial_pretrain=/m"] if schema is SFTConfig else [MODEL]
        cfg = load_config(schema, required, os.path.join(SHIPPED_DIR, name))
        assert cfg is not None


def test_sft_defaults_follow_verl():
    cfg = load_config(SFTConfig, ["model.partial_pretrain=/m"])
    assert cfg.data.prompt_key == "question" and cfg.data.response_key == "answer"
    assert cfg.optim.lr == pytest.approx(1e-5) and cfg.optim.lr_scheduler == "cosine"
    assert cfg.data.multiturn.messages_key == "messages"


def test_verl_09_reward_section_in_a_yaml_file_keeps_its_keys(tmp_path):
    """verl's DAPO recipe YAML: ``reward:`` with ``reward_manager.name`` and ``reward_kwargs``; Hydra's
    ``_target_`` entries name verl classes and are dropped; ``hydra:`` / ``defaults:`` are skipped."""
    (tmp_path / "dapo.yaml").write_text(
        "hydra:\n  searchpath: [file://verl/trainer/config]\n"
        "defaults:\n  - ppo_trainer\n  - _self_\n"
        "data:\n  gen_batch_size: ${data.train_batch_size}\n"
        "reward:\n  reward_manager:\n    name: dapo\n"
        "  reward_kwargs:\n    overlong_buffer_cfg:\n      enable: False\n      len: 0\n    max_resp_len: null\n"
        "algorithm:\n  filter_groups:\n    _target_: verl.trainer.config.FilterGroupsConfig\n    enable: False\n")
    cfg = load_config(PPOConfig, [MODEL, "data.train_batch_size=16"], str(tmp_path / "dapo.yaml"))
    assert cfg.reward_model.reward_manager == "dapo"
    assert cfg.reward_model.reward_kwargs == {"overlong_buffer_cfg": {"enable": False, "len": 0}, "max_resp_len": None}
    assert cfg.data.gen_batch_size == 16 and cfg.algorithm.filter_groups.enable is False
    assert load_config(PPOConfig, [MODEL, "algorithm.filter_groups._target_=x.Y"]).algorithm.filter_groups.enable is False


def test_hf_torch_dtype_spelling_sets_the_model_dtype():
    assert load_config(PPOConfig, [MODEL, "actor_rollout_ref.model.torch_dtype=bfloat16"]).actor_rollout_ref.model.dtype == "bfloat16"
