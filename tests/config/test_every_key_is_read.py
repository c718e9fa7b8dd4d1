"""Every accepted config key either takes effect or is listed as compatibility-only.

The leaf walk uses a static scan of the package's attribute reads (tests/config/key_readers.py);
the scanner's own tests below show it tells sections apart and reports a key nothing reads.
"""

import dataclasses
import logging
import pathlib
import textwrap

import pytest

from hybridflow.config import PPOConfig, SFTConfig, load_config
from hybridflow.config import compat
from hybridflow.config.compat import COMPAT_ONLY
from hybridflow.config.loader import schema_keys
from hybridflow.config.ppo import TrainerConfig
from tests.config.key_readers import config_leaves, is_read, read_pairs, unread_leaves

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


@pytest.fixture(scope="module")
def pairs():
    return read_pairs()


@pytest.mark.parametrize("schema", [PPOConfig, SFTConfig], ids=["ppo", "sft"])
def test_every_leaf_is_read_by_code_or_listed_as_compatibility_only(schema, pairs):
    missing = [key for key in unread_leaves(schema, pairs) if key not in COMPAT_ONLY]
    assert not missing, (
        f"{len(missing)} {schema.__name__} keys are read by no code outside hybridflow/config and are not in "
        "COMPAT_ONLY (hybridflow/config/compat.py): make them work or list them with a reason:\n  "
        + "\n  ".join(missing))


def test_no_listed_key_is_read_by_code(pairs):
    stale = [key for schema in (PPOConfig, SFTConfig) for key in COMPAT_ONLY
             if key in config_leaves(schema) and key not in unread_leaves(schema, pairs)]
    assert not stale, f"these keys take effect now; remove them from COMPAT_ONLY: {stale}"


def test_every_listed_key_exists_in_a_schema():
    keys = set(schema_keys(PPOConfig)) | set(schema_keys(SFTConfig))
    assert sorted(set(COMPAT_ONLY) - keys) == []
    assert all(reason.strip() and "\n" not in reason for reason in COMPAT_ONLY.values())


def test_docs_list_the_table_as_generated():
    assert compat.markdown_table() in DOCS.read_text(), (
        "docs/configuration.md is out of date: run python -m hybridflow.config.compat --write docs/configuration.md")


# ------------------------------------------------------------------ the walk cannot pass vacuously
@dataclasses.dataclass
class _TrainerWithDummy(TrainerConfig):
    never_read_dummy_key: int = 0
    """A key no code reads."""


@dataclasses.dataclass
class _PPOWithDummy(PPOConfig):
    trainer: _TrainerWithDummy = dataclasses.field(default_factory=_TrainerWithDummy)


def test_a_key_no_code_reads_is_reported(pairs):
    assert "trainer.never_read_dummy_key" in unread_leaves(_PPOWithDummy, pairs)
    assert "trainer.total_epochs" not in unread_leaves(_PPOWithDummy, pairs)


def _scan(tmp_path, source: str):
    (tmp_path / "config").mkdir()
    (tmp_path / "worker.py").write_text(textwrap.dedent(source))
    return read_pairs(tmp_path)


def test_scanner_follows_aliases_and_constructor_arguments(tmp_path):
    found = _scan(tmp_path, """
        class Critic:
            def __init__(self, *, cfg):
                self.cfg = cfg
            def update(self):
                return self.cfg.cliprange_value

        def build(cfg):
            critic_cfg, device = cfg.critic, "cpu"
            src = cfg.rollout.val_kwargs if device else cfg.rollout
            knobs = {k: getattr(cfg.policy_loss, k) for k in KNOBS}
            return Critic(cfg=critic_cfg), src.top_p, critic_cfg.grad_clip

        KNOBS = ("clip_cov_ratio",)
    """)
    for key in ("critic.cliprange_value", "critic.grad_clip", "rollout.top_p", "val_kwargs.top_p",
                "actor.policy_loss.clip_cov_ratio"):
        assert is_read(key, found), key


def test_scanner_counts_the_dotted_keys_of_algorithm_specs(tmp_path):
    found = _scan(tmp_path, """
        def check(setting):
            return setting("algorithm.gdpo_reward_keys")

        register(name, knobs={"dro_beta": "actor_rollout_ref.actor.policy_loss.dro_beta"})
        other(knobs={"x": "critic.grad_clip"}, note="trainer.total_epochs")
    """)
    for key in ("algorithm.gdpo_reward_keys", "actor_rollout_ref.actor.policy_loss.dro_beta", "critic.grad_clip"):
        assert is_read(key, found), key
    assert not is_read("trainer.total_epochs", found)  # a string that is no spec's read


def test_scanner_tells_sections_apart(tmp_path):
    found = _scan(tmp_path, """
        class Actor:
            def __init__(self, *, cfg):
                self.cfg = cfg
            def split(self):
                return self.cfg.shuffle

        class Critic:
            def __init__(self, *, cfg):
                self.cfg = cfg
            def split(self):
                return self.cfg.ppo_epochs

        def build(cfg):
            return Actor(cfg=cfg.actor), Critic(cfg=cfg.critic), cfg.reward_model.enable
    """)
    assert is_read("actor.shuffle", found) and is_read("critic.ppo_epochs", found)
    assert not is_read("critic.shuffle", found)
    assert not is_read("actor.ppo_epochs", found)
    assert not is_read("critic.enable", found)


# ------------------------------------------------------------------ the warning
@pytest.fixture
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(compat, "_warned", set())


def _load(*overrides):
    return load_config(PPOConfig, ["actor_rollout_ref.model.path=/m", *overrides])


def test_a_compat_key_set_warns_once_naming_key_and_reason(caplog, fresh_warnings):
    with caplog.at_level(logging.WARNING, logger="hybridflow.config.compat"):
        _load("actor_rollout_ref.model.use_liger=true")
        _load("actor_rollout_ref.model.use_liger=true")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["actor_rollout_ref.model.use_liger=True is accepted for verl compatibility and has no effect: "
                     + COMPAT_ONLY["actor_rollout_ref.model.use_liger"]]


def test_defaults_and_followed_interpolations_do_not_warn(caplog, fresh_warnings):
    with caplog.at_level(logging.WARNING, logger="hybridflow.config.compat"):
        _load("actor_rollout_ref.model.use_liger=false")  # the default, written out
        _load("actor_rollout_ref.actor.strategy=fsdp2")  # ref.strategy follows it: one line, not two
    assert [r.getMessage().split("=")[0] for r in caplog.records] == ["actor_rollout_ref.actor.strategy"]


def test_sft_compat_keys_warn_too(caplog, fresh_warnings):
    with caplog.at_level(logging.WARNING, logger="hybridflow.config.compat"):
        load_config(SFTConfig, ["model.path=/m", "data.balance_dp_token=true"])
    assert [r.getMessage().split("=")[0] for r in caplog.records] == ["data.balance_dp_token"]


def _fields_by_class():
    """(dataclass, field) -> (its docstring, every dotted key of it in PPOConfig and SFTConfig)."""
    from hybridflow.config.docs import field_docs
    from hybridflow.config.loader import _field_types

    fields: dict = {}

    def walk(cls, prefix):
        for name, tp in _field_types(cls).items():
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{prefix}{name}.")
            else:
                doc, keys = fields.setdefault((cls, name), (field_docs(cls).get(name, ""), []))
                keys.append(prefix + name)

    walk(PPOConfig, "")
    walk(SFTConfig, "")
    return fields


def test_docstrings_say_compatibility_only_exactly_for_the_listed_keys():
    """A field whose every key is listed says so; a field some section uses for real (FSDPConfig's
    offload keys are compatibility-only for the reward model only) must not claim "no effect"."""
    for (cls, name), (doc, keys) in _fields_by_class().items():
        listed = [key in COMPAT_ONLY for key in keys]
        assert doc.startswith("Compatibility-only") == all(listed), f"{cls.__name__}.{name} ({keys}): {doc!r}"
        assert "no effect" not in doc.lower() or all(listed), f"{cls.__name__}.{name}: {doc!r}"
