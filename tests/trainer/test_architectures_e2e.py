"""A 2-step GRPO run with each architecture of the native engine's table: native rollout (no HF fallback),
the padding-free shared-prompt update, and for an MoE model that asks for it the router's auxiliary loss."""

from __future__ import annotations

import json

import pytest

from hybridflow.config import PPOConfig, load_config
from hybridflow.models.tiny import TINY_ARCHITECTURES, save_tiny_model
from hybridflow.trainer.main_ppo import run_ppo
from tests.trainer.ppo_fixtures import base_overrides


def grpo_metrics(tmp_path, arch: str, extra: list[str] = ()) -> list[dict]:
    model_dir = save_tiny_model(str(tmp_path / arch), arch=arch, seed=0)
    run_ppo(load_config(PPOConfig, base_overrides(tmp_path, model_dir) + list(extra)))
    path = tmp_path / "ckpt" / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("arch", [arch for arch in TINY_ARCHITECTURES if arch != "llama"])  # llama: test_ppo_e2e
def test_two_grpo_steps_run_natively(tmp_path, arch, recwarn):
    rows = grpo_metrics(tmp_path, arch)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["actor/grad_norm"] > 0 for r in rows)
    assert "actor/router_aux_loss" not in rows[-1]  # no MoE model here asks for it (output_router_logits off)
    assert not [str(w.message) for w in recwarn if "through HF generate" in str(w.message)]
    if arch in ("olmo2", "olmo3", "gpt_oss"):  # issue 58: the default layout samples and trains one function
        assert max(r["training/rollout_probs_diff_max"] for r in rows) <= 1e-6


def test_an_moe_model_with_output_router_logits_adds_the_router_loss(tmp_path):
    rows = grpo_metrics(tmp_path, "mixtral", ["+actor_rollout_ref.model.override_config.output_router_logits=True",
                                              "+actor_rollout_ref.model.override_config.router_aux_loss_coef=0.5"])
    for row in rows:
        assert row["actor/router_aux_loss"] >= 1.0  # E * sum_e f_e P_e >= 1, equality only when balanced
        assert row["actor/loss"] == pytest.approx(row["actor/pg_loss"] + 0.5 * row["actor/router_aux_loss"], rel=1e-5)


@pytest.mark.parametrize("arch", ["gemma2", "mixtral"])
def test_ppo_with_a_critic_of_the_same_architecture(tmp_path, arch):
    """The critic's value model shares the backbone (soft-capped / windowed attention, routed experts),
    through the packed shared-prompt forward; the router loss stays the actor's."""
    extra = ["critic.model.override_config.output_router_logits=True"] if arch == "mixtral" else []
    rows = grpo_metrics(tmp_path, arch, ["algorithm.adv_estimator=gae", *["+" + e for e in extra]])
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["critic/grad_norm"] > 0 and r["actor/grad_norm"] > 0 for r in rows)


def test_a_wrap_class_the_model_lacks_is_one_line_at_world_size_one(tmp_path, capsys):
    from hybridflow.trainer.main_ppo import main

    model_dir = save_tiny_model(str(tmp_path / "llama"), arch="llama", seed=0)
    overrides = base_overrides(tmp_path, model_dir) + [
        "actor_rollout_ref.actor.fsdp_config.wrap_policy.transformer_layer_cls_to_wrap=[Qwen2DecoderLayer]"]
    assert main(overrides) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert "transformer_layer_cls_to_wrap=['Qwen2DecoderLayer'] names no module of this model; its classes: " in last
    assert "LlamaDecoderLayer" in last
