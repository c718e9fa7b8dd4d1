"""SPIN / online DPO and SPPO trainers on a tiny model: one step against a hand computation,
verl recipe keys, end-to-end runs with validation and export, resume after SIGKILL."""

from __future__ import annotations

import copy
import json
import logging
import math

import pytest
import torch
import torch.nn.functional as F

from hybridflow.config import SPINConfig, SPPOConfig, load_config
from hybridflow.config.selfplay import resolve_legacy_micro_batch_sizes, warn_keys_without_effect
from hybridflow.errors import ConfigError
from hybridflow.trainer.main_spin import run_spin
from hybridflow.trainer.main_sppo import run_sppo
from hybridflow.trainer.roles.self_play import build_self_play_trainer
from hybridflow.trainer.loop.spin import SPIN
from hybridflow.trainer.loop.sppo import SPPO
from tests.trainer.ppo_fixtures import base_overrides


def self_play_overrides(tmp_path, model_dir: str, *, steps: int = 2) -> list[str]:
    """The PPO fixture's task and sizes without its PPO-only keys."""
    ppo_only = ("algorithm.adv_estimator", "critic.")
    return [o for o in base_overrides(tmp_path, model_dir, steps=steps) if not o.startswith(ppo_only)]


def read_metrics(root) -> list[dict]:
    return [json.loads(line) for line in (root / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------------------- one step by hand
def response_log_probs(model, batch) -> torch.Tensor:
    """``[B]`` sum of log pi(response token) from a plain HF forward (independent of hybridflow.workers)."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits.float()
    response_len = batch["responses"].shape[1]
    # the logit at column t predicts the token at column t + 1
    logp = F.log_softmax(logits[:, -response_len - 1:-1], dim=-1)
    token_logp = logp.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    return (token_logp * batch["response_mask"]).sum(-1)


class UpdateSpy:
    """Wraps the engine group's ``update_preference``: keeps the batch and the actor weights it started from."""

    def __init__(self, group):
        self.group, self.original = group, group.update_preference
        self.calls: list[tuple] = []
        group.update_preference = self

    def __call__(self, batch, **kwargs):
        weights = copy.deepcopy(self.group.backend.worker.actor.model.state_dict())
        metrics = self.original(batch, **kwargs)
        self.calls.append((batch, weights, metrics))
        return metrics


def hf_model(model_dir: str, weights: dict | None = None):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    if weights is not None:
        model.load_state_dict(weights)
    return model


def run_two_steps(cfg, method):
    """Step 1 moves the actor away from the reference (kept at the initial model); step 2 is checked."""
    trainer = build_self_play_trainer(cfg, method)
    spy = UpdateSpy(trainer.w.actor)
    trainer.fit()
    trainer.close()
    return trainer, spy.calls[-1]


ONE_MINI_BATCH = ["actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.ref_update_freq=-1",
                  "trainer.logger=[file]"]


def test_spin_step_is_the_dpo_loss_of_best_vs_worst_pairs_by_hand(tmp_path, tiny_model_dir):
    beta = 0.5
    cfg = load_config(SPINConfig, self_play_overrides(tmp_path, tiny_model_dir) + ONE_MINI_BATCH + [
        "actor_rollout_ref.rollout.n=3", f"actor_rollout_ref.actor.dpo_beta={beta}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"])  # micro-batches of 3 pairs (last one smaller)
    trainer, (pairs, weights, metrics) = run_two_steps(cfg, SPIN)
    # pair construction: consecutive (chosen, rejected) rows of the same prompt, chosen scored strictly higher
    uids, scores = list(pairs["uid"]), pairs["seq_score"]
    assert len(pairs) >= 2 and len(pairs) % 2 == 0
    assert uids[0::2] == uids[1::2] and len(set(uids[0::2])) == len(pairs) // 2
    assert (scores[0::2] > scores[1::2]).all()
    # the step's loss: -log sigmoid(beta [(pc - rc) - (pr - rr)]) averaged over pairs (DPO eq. 7)
    policy = response_log_probs(hf_model(tiny_model_dir, weights), pairs)
    ref = response_log_probs(hf_model(tiny_model_dir), pairs)
    h = (policy[0::2] - ref[0::2]) - (policy[1::2] - ref[1::2])
    assert metrics["actor/dpo_loss"] == pytest.approx(-F.logsigmoid(beta * h).mean().item(), rel=1e-5, abs=1e-6)
    assert metrics["actor/rewards_margins"] == pytest.approx((beta * h).mean().item(), rel=1e-4, abs=1e-6)
    assert metrics["actor/rewards_accuracies"] == pytest.approx((h > 0).float().mean().item())
    assert not torch.equal(policy, ref)  # step 1 did move the actor: the check is not the trivial log 2
    assert read_metrics(tmp_path)[-1]["train/num_pairs"] == len(pairs) // 2


def test_reference_refresh_makes_the_previous_iterate_the_opponent(tmp_path, tiny_model_dir):
    """ref_update_freq=1: at step 2 the reference is the actor after step 1, so over one optimizer step
    (log pi / pi_ref) = 0 for every response and the DPO loss is exactly log 2 (step 1 moved the actor)."""
    overrides = self_play_overrides(tmp_path, tiny_model_dir) + ONE_MINI_BATCH + ["trainer.ref_update_freq=1"]
    trainer, (pairs, weights, metrics) = run_two_steps(load_config(SPINConfig, overrides), SPIN)
    assert metrics["actor/dpo_loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert metrics["actor/rewards_margins"] == pytest.approx(0.0, abs=1e-6)
    moved = response_log_probs(hf_model(tiny_model_dir, weights), pairs)
    assert not torch.allclose(moved, response_log_probs(hf_model(tiny_model_dir), pairs))


def test_sppo_step_is_the_squared_win_rate_loss_by_hand(tmp_path, tiny_model_dir):
    eta, n = 2.0, 4
    cfg = load_config(SPPOConfig, self_play_overrides(tmp_path, tiny_model_dir) + ONE_MINI_BATCH + [
        f"actor_rollout_ref.rollout.n={n}", f"algorithm.sppo_eta={eta}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"])  # 16 rows in micro-batches of 3 (uneven)
    trainer, (batch, weights, metrics) = run_two_steps(cfg, SPPO)
    scores = batch["seq_score"].tolist()
    win = []  # P(y_i > pi | x) = mean over the group (itself included) of 1 / 0 / 1/2
    for i, s in enumerate(scores):
        group = scores[i // n * n: i // n * n + n]
        win.append(sum(1.0 if s > t else 0.5 if s == t else 0.0 for t in group) / n)
    assert batch["win_prob"].tolist() == pytest.approx(win)
    policy = response_log_probs(hf_model(tiny_model_dir, weights), batch)
    ref = response_log_probs(hf_model(tiny_model_dir), batch)
    expected = ((policy - ref) - eta * (torch.tensor(win) - 0.5)).square().mean().item()
    assert metrics["actor/sppo_loss"] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert metrics["actor/log_ratio_mean"] == pytest.approx((policy - ref).mean().item(), rel=1e-4, abs=1e-6)
    target = eta * (torch.tensor(win) - 0.5)
    assert metrics["actor/target_abs_mean"] == pytest.approx(target.abs().mean().item(), abs=1e-6)


# ---------------------------------------------------------------------------- learning (fast tier)
LEARNING = ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.rollout.n=8",
            "actor_rollout_ref.actor.optim.lr=1e-2", "trainer.logger=[file]"]


def score_curve(root) -> tuple[float, float, list[float]]:
    rows = read_metrics(root)
    curve = [round(r["critic/score/mean"], 2) for r in rows]
    return sum(curve[:3]) / 3, sum(curve[-3:]) / 3, curve


@pytest.mark.parametrize("name,knob", [("spin", "actor_rollout_ref.actor.dpo_beta=1.0"),
                                       ("sppo", "actor_rollout_ref.actor.sppo_eta=1.0")])
def test_self_play_learns_to_emit_digits(tmp_path, tiny_model_dir, name, knob):
    """Reward = fraction of digit characters (chance ~0.2): both methods must push it up within 30 steps."""
    schema, run = {"spin": (SPINConfig, run_spin), "sppo": (SPPOConfig, run_sppo)}[name]
    run(load_config(schema, self_play_overrides(tmp_path, tiny_model_dir, steps=20) + LEARNING + [knob]))
    first, last, curve = score_curve(tmp_path)
    print(name, "score per step:", curve)
    assert first < 0.5, curve
    assert last > 0.8, curve


# ---------------------------------------------------------------------------- keys of verl's recipes
SPIN_RECIPE_KEYS = [  # the keys of verl's recipe/spin/run_spin.sh (sizes scaled down)
    "actor_rollout_ref.actor.ppo_micro_batch_size=2", "actor_rollout_ref.rollout.log_prob_micro_batch_size=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size=4", "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.val_before_train=True", "trainer.test_freq=1", "+trainer.log_freq=2", "trainer.ref_update_freq=1",
    "trainer.save_freq=-1",
]


def test_recipe_keys_take_effect_or_warn(caplog):
    cfg = load_config(SPINConfig, ["actor_rollout_ref.model.path=/m"] + SPIN_RECIPE_KEYS)
    assert resolve_legacy_micro_batch_sizes(cfg, world_size=2) == []
    arr = cfg.actor_rollout_ref
    assert (arr.actor.ppo_micro_batch_size_per_gpu, arr.rollout.log_prob_micro_batch_size_per_gpu,
            arr.ref.log_prob_micro_batch_size_per_gpu) == (1, 2, 2)  # global sizes / 2 workers, as verl
    assert warn_keys_without_effect(cfg, SPINConfig, trainer="SPIN") == []  # the recipe's 0.001 = default
    cfg.algorithm.kl_ctrl.kl_coef, cfg.actor_rollout_ref.actor.entropy_coeff = 0.05, 0.01
    with caplog.at_level(logging.WARNING):
        assert warn_keys_without_effect(cfg, SPINConfig, trainer="SPIN") == [
            "algorithm.kl_ctrl.kl_coef", "actor_rollout_ref.actor.entropy_coeff"]
    assert "algorithm.kl_ctrl.kl_coef=0.05 has no effect in SPIN" in caplog.text
    both = load_config(SPINConfig, ["actor_rollout_ref.model.path=/m", "actor_rollout_ref.actor.ppo_micro_batch_size=2",
                                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"])
    assert "keep only ppo_micro_batch_size_per_gpu" in resolve_legacy_micro_batch_sizes(both, world_size=1)[0]
    with pytest.raises(ConfigError, match="unknown|Did you mean|not a"):
        load_config(SPINConfig, ["actor_rollout_ref.model.path=/m", "actor_rollout_ref.actor.sppo_eta=1"])


def test_spin_runs_the_recipe_command_with_validation_and_log_freq(tmp_path, tiny_model_dir):
    overrides = [o for o in self_play_overrides(tmp_path, tiny_model_dir, steps=4) if "micro_batch" not in o]
    run = run_spin(load_config(SPINConfig, overrides + SPIN_RECIPE_KEYS))
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 2, 4]  # validation before training, then every log_freq steps
    assert "val-core/digits/reward/mean@1" in rows[0] and "val-core/digits/reward/mean@1" in rows[-1]
    for key in ("actor/dpo_loss", "actor/rewards_chosen", "actor/rewards_rejected", "actor/rewards_margins",
                "actor/rewards_accuracies", "actor/grad_norm", "critic/score/mean", "timing_s/update_ref",
                "train/num_pairs"):
        assert key in rows[-1], key
    assert run.steps == 4


@pytest.mark.parametrize("bad,message", [
    (["actor_rollout_ref.rollout.n=1"], "rollout.n >= 2"),
    (["algorithm.dpo_loss_type=hinge"], "sigmoid, ipo"),
    (["actor_rollout_ref.model.lora_rank=4"], "ref_update_freq=-1"),
    (["actor_rollout_ref.actor.use_dynamic_bsz=True"], "whole pairs"),
    (["actor_rollout_ref.actor.dpo_beta=-0.1"], "dpo_beta=-0.1 must be > 0"),
])
def test_bad_spin_configs_name_the_fix(tmp_path, tiny_model_dir, bad, message):
    with pytest.raises(ConfigError, match=message):
        run_spin(load_config(SPINConfig, self_play_overrides(tmp_path, tiny_model_dir) + bad))


def test_sppo_eta_keys_must_agree(tmp_path, tiny_model_dir):
    overrides = self_play_overrides(tmp_path, tiny_model_dir) + ["algorithm.sppo_eta=2",
                                                                  "actor_rollout_ref.actor.sppo_eta=3"]
    with pytest.raises(ConfigError, match="set only one of them"):
        run_sppo(load_config(SPPOConfig, overrides))


# ---------------------------------------------------------------------------- CLI, export, resume
def test_cli_subcommands_and_export(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file

    from hybridflow.cli import main as cli_main
    from hybridflow.model_merger import merge

    for name in ("spin", "sppo"):
        root = tmp_path / name
        overrides = self_play_overrides(root, tiny_model_dir, steps=2) + [
            "trainer.save_freq=2", "trainer.ref_update_freq=2", "trainer.logger=[console,file,tensorboard]"]
        assert cli_main([name, *overrides]) == 0
        step = root / "ckpt" / "global_step_2"
        assert sorted(p.name for p in step.iterdir() if p.is_dir()) == ["actor", "ref"]
        out = merge(str(step / "actor"), str(root / "hf"))
        assert load_file(f"{out}/model.safetensors")  # a plain HF folder the merger wrote
        assert any((root / "ckpt" / "logs").rglob("events.out.tfevents*"))


SLOW_REWARD = '''
import time
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(0.1)  # slows each step so the test can kill the process mid-run
    return float(sum(ch.isdigit() for ch in solution_str)) / max(len(solution_str), 1)
'''


@pytest.mark.parametrize("name", ["spin", pytest.param("sppo", marks=pytest.mark.slow)])  # ~2 min each
def test_resume_after_sigkill_is_bitwise_equal(tmp_path, tiny_model_dir, name):
    """Killed after the step-2 checkpoint; step 3 must use the checkpointed reference (refreshed at step 2)."""
    from tests.trainer.test_ppo_e2e import kill_after_step_2_and_resume

    reward = tmp_path / "slow_reward.py"
    reward.write_text(SLOW_REWARD)

    def overrides(root):
        return self_play_overrides(root, tiny_model_dir, steps=4) + [
            f"custom_reward_function.path={reward}", "trainer.save_freq=2", "trainer.logger=[file]",
            "data.shuffle=True", "trainer.ref_update_freq=2"]

    straight, resumed = kill_after_step_2_and_resume(tmp_path, overrides, module=f"hybridflow.trainer.main_{name}",
                                                     components=("actor", "ref"))
    loss = "actor/dpo_loss" if name == "spin" else "actor/sppo_loss"
    straight_rows = {r["step"]: r[loss] for r in read_metrics(straight)}
    resumed_rows = {r["step"]: r[loss] for r in read_metrics(resumed)}
    assert resumed_rows[3] == straight_rows[3] and resumed_rows[4] == straight_rows[4]
    assert not math.isnan(straight_rows[4])


def test_spin_proper_pairs_the_dataset_answer_with_each_sample_by_hand(tmp_path, tiny_model_dir):
    """preference_source=ground_truth: rows [answer, sample_0, answer, sample_1] per prompt; the loss by hand."""
    from transformers import AutoTokenizer

    beta, n = 0.5, 2
    cfg = load_config(SPINConfig, self_play_overrides(tmp_path, tiny_model_dir) + ONE_MINI_BATCH + [
        "algorithm.preference_source=ground_truth", f"actor_rollout_ref.rollout.n={n}",
        f"actor_rollout_ref.actor.dpo_beta={beta}", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"])
    trainer, (pairs, weights, metrics) = run_two_steps(cfg, SPIN)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert len(pairs) == 4 * n * 2  # every sample of the 4 prompts is a rejected response
    for row in range(0, len(pairs), 2):
        chosen = pairs["responses"][row][pairs["response_mask"][row].bool()].tolist()
        assert chosen == (tok.encode(str(pairs["ground_truth"][row]), add_special_tokens=False) + [tok.eos_token_id])[:8]
        assert pairs["uid"][row] == pairs["uid"][row + 1]
    policy = response_log_probs(hf_model(tiny_model_dir, weights), pairs)
    ref = response_log_probs(hf_model(tiny_model_dir), pairs)
    h = (policy[0::2] - ref[0::2]) - (policy[1::2] - ref[1::2])
    assert metrics["actor/dpo_loss"] == pytest.approx(-F.logsigmoid(beta * h).mean().item(), rel=1e-5, abs=1e-6)


def test_shared_prompt_layout_reaches_the_preference_update(tmp_path, tiny_model_dir, monkeypatch):
    """``use_shared_prompt`` must shape the SPPO / SPIN update's forward too (it silently ran padded before)."""
    import hybridflow.workers.preference_update as preference_update

    layouts, original = [], preference_update.micro_batch_log_probs

    def recording(*args, **kwargs):
        layouts.append(kwargs.get("layout", "padded"))
        return original(*args, **kwargs)

    monkeypatch.setattr(preference_update, "micro_batch_log_probs", recording)
    overrides = self_play_overrides(tmp_path, tiny_model_dir, steps=1) + ONE_MINI_BATCH + [
        "actor_rollout_ref.model.use_shared_prompt=True"]
    run_sppo(load_config(SPPOConfig, overrides))
    assert layouts and set(layouts) == {"shared_prompt"}
