"""End-to-end PPO / GRPO runs on a tiny model: every estimator, metrics, resume after SIGKILL, export."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from hybridflow.algos import list_advantages
from hybridflow.config import PPOConfig, load_config
from hybridflow.errors import ConfigError
from hybridflow.trainer.main_ppo import main, run_ppo
from tests.trainer.ppo_fixtures import base_overrides

VERL_METRICS = [
    "critic/score/mean", "critic/score/max", "critic/score/min", "critic/rewards/mean", "critic/advantages/mean",
    "critic/returns/mean", "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy",
    "actor/grad_norm", "actor/lr", "response_length/mean", "response_length/max", "response_length/min",
    "response_length/clip_ratio", "prompt_length/mean", "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob",
    "timing_s/adv", "timing_s/update_actor", "timing_s/step", "perf/total_num_tokens", "perf/time_per_step",
    "perf/throughput", "training/rollout_probs_diff_mean",
]


def read_metrics(tmp_path) -> list[dict]:
    path = tmp_path / "ckpt" / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_grpo_run_logs_verl_metric_names(tmp_path, tiny_model_dir):
    run_ppo(load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir)))
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    missing = [name for name in VERL_METRICS if name not in rows[-1]]
    assert not missing, missing
    assert (tmp_path / "ckpt" / "plots" / "reward.png").exists()


def test_ppo_with_critic_and_kl(tmp_path, tiny_model_dir):
    overrides = base_overrides(tmp_path, tiny_model_dir, estimator="gae") + [
        "algorithm.use_kl_in_reward=True", "algorithm.kl_ctrl.type=adaptive",
        "actor_rollout_ref.actor.use_kl_loss=True", "trainer.test_freq=2",
    ]
    run_ppo(load_config(PPOConfig, overrides))
    last = read_metrics(tmp_path)[-1]
    for name in ("critic/vf_loss", "critic/vf_explained_var", "critic/values/mean", "timing_s/values",
                 "timing_s/update_critic", "timing_s/ref", "actor/kl_loss", "actor/reward_kl_penalty",
                 "val-core/digits/reward/mean@1"):
        assert name in last, name


# what an estimator needs beyond the base run (the reward file returns {"score", "length"})
ESTIMATOR_OVERRIDES = {
    "optimal_token_baseline": ["actor_rollout_ref.actor.calculate_sum_pi_squared=True"],
    "tir_optimal_token_baseline": ["actor_rollout_ref.actor.calculate_sum_pi_squared=True"],
    "gdpo": ["algorithm.gdpo_reward_keys=[score,length]", "algorithm.gdpo_reward_weights=[1.0,0.5]"],
}


@pytest.mark.parametrize("estimator", sorted(set(list_advantages()) - {"gae", "grpo"}))
def test_every_estimator_runs_a_step(tmp_path, tiny_model_dir, estimator):
    overrides = base_overrides(tmp_path, tiny_model_dir, estimator=estimator, steps=1)
    run_ppo(load_config(PPOConfig, overrides + ESTIMATOR_OVERRIDES.get(estimator, [])))
    last = read_metrics(tmp_path)[-1]
    assert torch.isfinite(torch.tensor(last["actor/pg_loss"]))


def test_bad_model_path_is_one_line(tmp_path, tiny_model_dir, capsys):
    overrides = base_overrides(tmp_path, tiny_model_dir) + [f"actor_rollout_ref.model.path={tmp_path / 'nope'}"]
    assert main(overrides) == 2
    assert f"actor_rollout_ref.model.path: model folder '{tmp_path / 'nope'}' does not exist" in capsys.readouterr().err


def test_unknown_estimator_lists_registered(tmp_path, tiny_model_dir):
    overrides = base_overrides(tmp_path, tiny_model_dir, estimator="grpoo")
    with pytest.raises(ConfigError, match="grpo"):
        run_ppo(load_config(PPOConfig, overrides))


# ---------------------------------------------------------------------------- resume after SIGKILL
SLOW_REWARD = '''
import time
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(0.15)  # slows each step so the test can kill the process mid-run
    return float(sum(ch.isdigit() for ch in solution_str)) / max(len(solution_str), 1)
'''


def _run_cli(overrides: list[str], *, kill_after_checkpoint: str | None = None,
             module: str = "hybridflow.trainer.main_ppo") -> int:
    cmd = [sys.executable, "-m", module, *overrides]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    if kill_after_checkpoint is None:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()[-3000:]
        return proc.returncode
    deadline = time.time() + 600
    while not os.path.exists(kill_after_checkpoint) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc.returncode


def kill_after_step_2_and_resume(tmp_path, overrides, *, module: str = "hybridflow.trainer.main_ppo",
                                 components=("actor",)) -> tuple:
    """Run ``overrides(root)`` (4 steps, save_freq=2) straight through, and again killed with SIGKILL once
    the step-2 checkpoint is published, then resumed; returns (straight root, resumed root) after checking
    that each ``component``'s step-4 weights are bitwise equal."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _run_cli(overrides(straight), module=module)
    tracker = resumed / "ckpt" / "latest_checkpointed_iteration.txt"
    assert _run_cli(overrides(resumed), kill_after_checkpoint=str(tracker), module=module) == -signal.SIGKILL
    assert tracker.read_text().strip() == "2"
    assert not (resumed / "ckpt" / "global_step_4").exists()
    _run_cli(overrides(resumed), module=module)
    for component in components:
        a = merged_weights(straight / "ckpt" / "global_step_4" / component, tmp_path / f"a_{component}")
        b = merged_weights(resumed / "ckpt" / "global_step_4" / component, tmp_path / f"b_{component}")
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), (component, key)
    return straight, resumed


def resume_from_a_step_1_copy(tmp_path, overrides) -> tuple:
    """Run ``overrides(root)`` (2 steps, save_freq=1) straight through in this process, and again resumed from a
    copy of its step-1 checkpoint (as if killed right after it was published); returns (straight root, resumed
    root) after checking that the actor's step-2 weights are bitwise equal."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_ppo(load_config(PPOConfig, overrides(straight)))
    config = load_config(PPOConfig, overrides(resumed))
    (resumed / "ckpt" / "logs").mkdir(parents=True)
    shutil.copytree(straight / "ckpt" / "global_step_1", resumed / "ckpt" / "global_step_1")
    (resumed / "ckpt" / "latest_checkpointed_iteration.txt").write_text("1")
    first_step = (straight / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()[0]
    (resumed / "ckpt" / "logs" / "metrics.jsonl").write_text(first_step + "\n")
    run_ppo(config)
    a = merged_weights(straight / "ckpt" / "global_step_2" / "actor", tmp_path / "a")
    b = merged_weights(resumed / "ckpt" / "global_step_2" / "actor", tmp_path / "b")
    assert all(torch.equal(a[key], b[key]) for key in a)
    return straight, resumed


def test_resume_after_sigkill_is_bitwise_equal(tmp_path, tiny_model_dir):
    reward = tmp_path / "slow_reward.py"
    reward.write_text(SLOW_REWARD)
    kill_after_step_2_and_resume(tmp_path, lambda root: base_overrides(root, tiny_model_dir, steps=4) + [
        f"custom_reward_function.path={reward}", "trainer.save_freq=2", "trainer.logger=[file]", "data.shuffle=True"])
    # the resumed run's log holds each step once, as the uninterrupted one does
    assert [row["step"] for row in read_metrics(tmp_path / "resumed")] == [1, 2, 3, 4]


def merged_weights(actor_dir, out_dir) -> dict:
    from hybridflow.model_merger import merge

    merge(str(actor_dir), str(out_dir))
    return load_file(out_dir / "model.safetensors")


# ---------------------------------------------------------------------------- export
def test_merged_export_generates_like_the_trained_model(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.model_merger import main as merger_main
    from hybridflow.trainer.main_ppo import ppo_parts
    from hybridflow.trainer.roles.assembly import build_loop

    cfg = load_config(PPOConfig, base_overrides(tmp_path, tiny_model_dir, steps=2) + ["trainer.save_freq=2"])
    trainer = build_loop(cfg, parts=ppo_parts)
    trainer.fit()
    actor_dir = tmp_path / "ckpt" / "global_step_2" / "actor"
    assert merger_main(["merge", "--backend", "fsdp", "--local_dir", str(actor_dir),
                        "--target_dir", str(tmp_path / "hf")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True,
                                     return_tensors="pt", return_dict=True)
    trained = trainer.w.actor.backend.worker.actor.model.eval()  # the local backend's rank-0 worker
    ours = trained.generate(**prompt, max_new_tokens=12, do_sample=False)
    theirs = exported.generate(**prompt, max_new_tokens=12, do_sample=False)
    assert torch.equal(ours, theirs)
    for (name, a), (_, b) in zip(trained.state_dict().items(), exported.state_dict().items()):
        assert torch.equal(a, b), name


# ---------------------------------------------------------------------------- bad inputs
BAD_REWARD = '''
import math, time
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    i = int(extra_info["index"])
    if i % 4 == 0:
        raise RuntimeError("scorer bug")
    if i % 4 == 1:
        return math.nan
    if i % 4 == 2:
        time.sleep(60)  # hangs: must be cut by reward_model.timeout_s
    return 1.0
'''


def test_raising_hanging_and_nan_scorers_do_not_stop_the_run(tmp_path, tiny_model_dir, caplog):
    reward = tmp_path / "bad_reward.py"
    reward.write_text(BAD_REWARD)
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=1) + [
        f"custom_reward_function.path={reward}", "reward_model.timeout_s=2", "reward_model.reward_manager=parallel",
        "reward_model.num_workers=2", "data.shuffle=False"]
    start = time.time()
    with caplog.at_level("WARNING", logger="hybridflow.workers.reward"):
        run_ppo(load_config(PPOConfig, overrides))
    assert time.time() - start < 60
    (line,) = [r.getMessage() for r in caplog.records if r.name == "hybridflow.workers.reward"]
    assert line.startswith("reward: 6 of 8 samples failed to score this step (first: ")
    last = read_metrics(tmp_path)[-1]
    # 4 prompts x n=2: indices 0, 1, 2, 3 -> 2 raised + 2 NaN + 2 timed out, 2 scored 1.0
    assert last["reward/num_failed"] == 6
    assert last["reward/num_timed_out"] == 2
    assert last["critic/score/mean"] == pytest.approx(2 / 8)


def test_unreadable_data_file_is_one_line(tmp_path, tiny_model_dir, capsys):
    overrides = base_overrides(tmp_path, tiny_model_dir)
    bad = tmp_path / "broken.parquet"
    bad.write_bytes(b"this is not parquet")
    assert main(overrides + [f"data.train_files={bad}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0]


def test_torn_checkpoint_falls_back_to_the_previous_good_one(tmp_path, tiny_model_dir):
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=2) + ["trainer.save_freq=1"]
    run_ppo(load_config(PPOConfig, overrides))
    root = tmp_path / "ckpt"
    # a crash while writing step 3: its folder exists without the completion marker; the tracker still says 2
    torn = root / "global_step_3"
    torn.mkdir()
    (torn / "actor").mkdir()
    (root / "latest_checkpointed_iteration.txt").write_text("3")
    resumed = load_config(PPOConfig, overrides[:-1] + ["trainer.total_training_steps=3", "trainer.save_freq=1"])
    from hybridflow.trainer.main_ppo import ppo_parts
    from hybridflow.trainer.roles.assembly import build_loop

    trainer = build_loop(resumed, parts=ppo_parts)
    assert trainer.load_checkpoint() == 2


# ---------------------------------------------------------------------------- DAPO
def test_dapo_dynamic_sampling_keeps_only_informative_groups(tmp_path, tiny_model_dir):
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=2) + [
        "algorithm.filter_groups.enable=True", "algorithm.filter_groups.metric=score",
        "algorithm.filter_groups.max_num_gen_batches=8", "data.train_batch_size=2", "data.gen_batch_size=3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.clip_ratio_high=0.28", "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.rollout.temperature=1.0"]
    run_ppo(load_config(PPOConfig, overrides))
    last = read_metrics(tmp_path)[-1]
    assert last["train/num_informative_groups"] >= 2
    assert last["train/num_gen_batches"] >= 1


def test_informative_rows_drops_constant_groups():
    from hybridflow.data.batch import Batch
    from hybridflow.trainer.loop.sync_sources import informative_rows

    batch = Batch.from_dict(tensors={"seq_score": torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0]),
                                     "token_level_scores": torch.zeros(6, 2)})
    assert informative_rows(batch, metric="score", n=2) == [2, 3]
    assert informative_rows(batch, metric="seq_reward", n=2) == []


def dapo_scores_batch(scores: list[float]):
    from hybridflow.data.batch import Batch

    return Batch.from_dict(tensors={"seq_score": torch.tensor(scores), "token_level_scores": torch.zeros(len(scores), 2)},
                           non_tensors={"row": list(range(len(scores)))})


def test_dapo_all_equal_groups_trigger_another_generation_round():
    """A first batch whose groups all have equal scores keeps nothing and makes the loop generate again;
    only groups with varied scores reach the update (the e2e run above cannot tell these apart)."""
    from types import SimpleNamespace

    from hybridflow.trainer.loop.sync_sources import keep_informative_groups

    n, wanted = 2, 2
    first = dapo_scores_batch([1.0, 1.0, 0.0, 0.0, 1.0, 1.0])  # three constant groups
    later = iter([dapo_scores_batch([0.0, 1.0, 1.0, 1.0, 0.5, 0.0])])
    generated = []

    def generate_more(attempt):
        generated.append(attempt)
        return next(later)

    metrics = {}
    kept = keep_informative_groups(first, generate_more, n=n, wanted=wanted, step=1, metrics=metrics,
                                   filter_groups=SimpleNamespace(metric="score", max_num_gen_batches=0))
    assert generated == [1] and metrics == {"train/num_gen_batches": 2, "train/num_informative_groups": 2}
    groups = kept["seq_score"].view(-1, n)
    assert len(kept) == wanted * n and bool((groups.max(dim=1).values > groups.min(dim=1).values).all())
    assert torch.equal(kept["seq_score"], torch.tensor([0.0, 1.0, 0.5, 0.0]))


def test_dapo_warns_once_when_a_step_needs_many_generation_batches(monkeypatch, caplog):
    """Five constant batches before a mixed one: six generation batches, past the threshold of four. The
    warning names the step, the informative fraction and the cap to set, and comes once per process."""
    from types import SimpleNamespace

    import hybridflow.trainer.loop.sync_sources as sync_sources

    monkeypatch.setattr(sync_sources, "_costly_filtering_warned", False)
    n, wanted = 2, 1

    def run(step):
        constant = [dapo_scores_batch([1.0, 1.0, 0.0, 0.0]) for _ in range(5)]
        batches = iter([*constant[1:], dapo_scores_batch([0.0, 1.0, 1.0, 1.0])])
        metrics = {}
        sync_sources.keep_informative_groups(
            constant[0], lambda attempt: next(batches), n=n, wanted=wanted, step=step, metrics=metrics,
            filter_groups=SimpleNamespace(metric="score", max_num_gen_batches=0))
        return metrics

    with caplog.at_level("WARNING", logger="hybridflow.trainer.loop.sync_sources"):
        assert run(7)["train/num_gen_batches"] == 6
        run(8)
    warnings = [r.getMessage() for r in caplog.records if "dynamic sampling" in r.getMessage()]
    assert len(warnings) == 1
    assert "step 7 needed 6 generation batches, only 1 of 12 prompt groups had varied score" in warnings[0]
    assert "algorithm.filter_groups.max_num_gen_batches" in warnings[0]
    monkeypatch.setattr(sync_sources, "_costly_filtering_warned", False)
    assert not sync_sources.warn_if_filtering_is_costly(gen_batches=4, step=1, informative=0, seen=8, metric="score")


# ---------------------------------------------------------------------------- reward model
def test_reward_model_scores_replace_rule_scores(tmp_path, tiny_model_dir):
    from transformers import AutoModelForSequenceClassification

    from hybridflow.models.tiny import build_tiny_tokenizer, tiny_config

    tok = build_tiny_tokenizer()
    config = tiny_config("llama", vocab_size=len(tok), num_labels=1, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_config(config)
    rm.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=1) + [
        "reward_model.enable=True", f"reward_model.model.path={tmp_path / 'rm'}"]
    run_ppo(load_config(PPOConfig, overrides))
    last = read_metrics(tmp_path)[-1]
    assert last["reward/model_score/mean"] == pytest.approx(last["critic/score/mean"], abs=1e-6)
    assert last["critic/score/max"] != last["critic/score/min"]  # a real model, not a constant


# ---------------------------------------------------------------------------- LoRA
def test_grpo_with_lora_trains_only_the_adapter_and_exports_merged(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from hybridflow.model_merger import merge
    from hybridflow.models.lora import is_lora_model
    from hybridflow.trainer.main_ppo import ppo_parts
    from hybridflow.trainer.roles.assembly import build_loop

    overrides = base_overrides(tmp_path, tiny_model_dir, steps=2) + [
        "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.optim.lr=1e-2", "trainer.save_freq=2"]
    trainer = build_loop(load_config(PPOConfig, overrides), parts=ppo_parts)
    hybrid = trainer.w.actor.backend.worker
    assert is_lora_model(hybrid.actor.model)
    assert hybrid.reference.model is hybrid.actor.model  # the reference is the actor with the adapter off
    base_before = {k: v.clone() for k, v in hybrid.actor.model.state_dict().items() if "lora_" not in k}
    trainer.fit()
    trainer.close()
    state = hybrid.actor.model.state_dict()
    for key, value in base_before.items():
        assert torch.equal(state[key], value), key  # base weights frozen
    last = read_metrics(tmp_path)[-1]
    assert last["actor/kl_loss"] > 0  # the adapter moved the policy away from the reference
    merge(str(tmp_path / "ckpt" / "global_step_2" / "actor"), str(tmp_path / "hf"))
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    decoder = hybrid.rollout.engine.decoder
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    with torch.no_grad():
        expected = hybrid.actor.model(input_ids=ids).logits
        torch.testing.assert_close(exported(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-4)
        # the rollout engine got the merged weights after the last update
        torch.testing.assert_close(decoder.prefill(ids[0])[0], expected[0, -1], rtol=1e-4, atol=1e-4)


def test_rollout_log_probs_as_old_log_probs(tmp_path, tiny_model_dir):
    """The bypass mode skips the recompute pass; the first update is then exactly on-policy."""
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=1) + [
        "actor_rollout_ref.actor.use_rollout_log_probs=True", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]
    run_ppo(load_config(PPOConfig, overrides))
    last = read_metrics(tmp_path)[-1]
    assert "timing_s/old_log_prob" in last and "actor/entropy" in last
    assert "training/rollout_probs_diff_mean" not in last
    assert abs(last["actor/ppo_kl"]) < 1e-5  # engine and trainer agree: ratio 1 before the first step
    with pytest.raises(ConfigError, match="use_rollout_log_probs=True needs rollout.top_p=1"):
        run_ppo(load_config(PPOConfig, overrides + ["actor_rollout_ref.rollout.top_p=0.9"]))


def test_padding_free_and_shared_prompt_runs_equal_the_padded_run(tmp_path, tiny_model_dir, monkeypatch):
    """One PPO step (actor, critic, reference, old log-probs) in each forward layout: the same rollout
    gives the same losses, entropy, KL and gradient norms within fp32 rounding."""
    import hybridflow.workers.critic as critic_module
    import hybridflow.workers.logprob as logprob_module

    packed_rows = []  # (role, shares prompts) of every packed forward, to prove the layout was used

    def spy(role, real):
        def wrapper(model, packed, **kwargs):
            packed_rows.append((role, len(packed.bounds) < packed.shape[0]))
            return real(model, packed, **kwargs)
        return wrapper

    monkeypatch.setattr(logprob_module, "packed_log_probs", spy("actor", logprob_module.packed_log_probs))
    monkeypatch.setattr(critic_module, "packed_forward_inputs", spy("critic", critic_module.packed_forward_inputs))

    def first_step(name: str, extra: list[str]) -> dict:
        overrides = base_overrides(tmp_path / name, tiny_model_dir, estimator="gae", steps=1) + [
            "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.entropy_coeff=0.01"] + extra
        run_ppo(load_config(PPOConfig, overrides))
        return read_metrics(tmp_path / name)[0]

    padded = first_step("padded", ["actor_rollout_ref.model.use_shared_prompt=False",
                                   "critic.model.use_shared_prompt=False"])
    assert packed_rows == []
    layouts = {
        "packed": ["actor_rollout_ref.model.use_remove_padding=True", "critic.model.use_remove_padding=True",
                   "actor_rollout_ref.model.use_shared_prompt=False", "critic.model.use_shared_prompt=False"],
        "shared_default": [],
    }
    for name, extra in layouts.items():
        packed_rows.clear()
        got = first_step(name, extra)
        assert {role for role, _ in packed_rows} == {"actor", "critic"}
        assert any(shared for _, shared in packed_rows) == name.startswith("shared")
        assert got["critic/score/mean"] == padded["critic/score/mean"]  # the same rollout
        for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm", "critic/vf_loss",
                    "critic/grad_norm", "critic/values/mean", "training/rollout_probs_diff_mean"):
            assert got[key] == pytest.approx(padded[key], rel=1e-4, abs=1e-6), (name, key)
