"""verl 0.9.1's keys (issue 60): the table in docs/configuration.md lists every key of the snapshot with its status,
and a refused key is one line naming its reason class, before anything loads."""

import pathlib

import pytest

from hybridflow.config import PPOConfig, SFTConfig, load_config
from hybridflow.config import verl_keys
from hybridflow.errors import ConfigError

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_snapshot_holds_verl_0_9_1_s_829_ppo_and_180_sft_keys():
    assert len(verl_keys.verl_keys("ppo")) == 829 and len(verl_keys.verl_keys("sft")) == 180
    assert "distillation.distillation_loss.loss_mode" in verl_keys.verl_keys("ppo")


def test_the_doc_table_is_generated_and_complete():
    text = DOCS.read_text()
    assert verl_keys.markdown_table() in text, (
        "docs/configuration.md is out of date: run python -m hybridflow.config.verl_keys --write docs/configuration.md")
    block = text[text.index(verl_keys.DOCS_BEGIN):text.index(verl_keys.DOCS_END)]
    for trainer in ("ppo", "sft"):
        for key in verl_keys.verl_keys(trainer):
            assert f"| `{key}` |" in block, key


@pytest.mark.parametrize("trainer,schema", [("ppo", PPOConfig), ("sft", SFTConfig)])
def test_refused_keys_of_every_reason_class_are_one_line(trainer, schema):
    base = ["actor_rollout_ref.model.path=/m"] if trainer == "ppo" else ["model.path=/m"]
    seen: dict[str, int] = {}
    for key in verl_keys.verl_keys(trainer):
        state, what = verl_keys.status(key, trainer)
        seen[what] = seen.get(what, 0) + 1
        if state != "refused" or seen[what] > 3:  # three keys of each reason class keep this test in seconds
            continue
        with pytest.raises(ConfigError) as err:
            load_config(schema, [*base, f"+{key}=1"])
        (line,) = str(err.value).splitlines()
        reason_class, nearest = verl_keys.refusal(key)
        assert what == f"{reason_class}: {nearest}"
        assert line.startswith(f"'{key}' (verl 0.9.1) is refused: {reason_class}; {nearest}"), line


@pytest.mark.parametrize("key,reason", [
    ("actor_rollout_ref.model.lora.rank", "Megatron-only"), ("transfer_queue.enable", "TransferQueue"),
    ("profiler.tool_config.npu.level", "Ascend NPU-only"), ("actor_rollout_ref.actor.fsdp_config.qat.enable",
                                                              "quantization not supported")])
def test_refusal_names_the_reason_class(key, reason):
    with pytest.raises(ConfigError, match=reason):
        load_config(PPOConfig, ["actor_rollout_ref.model.path=/m", f"{key}=1"])


def test_a_typo_still_gets_the_nearest_key():
    with pytest.raises(ConfigError, match="did you mean 'data.train_batch_size'"):
        load_config(PPOConfig, ["data.train_batch_sise=4"])
