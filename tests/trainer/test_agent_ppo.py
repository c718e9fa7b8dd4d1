"""PPO / GRPO with multi-turn tool rollouts (``multi_turn.enable``): an end-to-end run and a learning run."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from hybridflow.config import PPOConfig, load_config
from hybridflow.trainer.main_ppo import run_ppo
from tests.trainer.ppo_fixtures import base_overrides

SUBMIT_42 = '<tool_call>{"name": "calc_gsm8k_reward", "arguments": {"answer": "42"}}</tool_call>'

TOOL_CONFIG = """
tools:
  - class_name: verl.tools.gsm8k_tool.Gsm8kTool
    config: {type: native}
  - class_name: hybridflow.tools.calculator.CalculatorTool
"""

TOOL_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """1 only when the answer reached the answer-check tool and was right (the tool's calc_reward)."""
    return float((extra_info.get("tool_rewards") or {}).get("calc_gsm8k_reward", 0.0))
'''


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory):
    """The tiny model whose tokenizer has the whole answer-submitting call as one added token: a random
    model then emits it with chance ~1/vocab per position, so GRPO can find it and reinforce it."""
    from hybridflow.models.tiny import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokenizer.add_tokens([SUBMIT_42])
    model, _ = build_tiny_model(tokenizer=tokenizer, seed=0)
    path = tmp_path_factory.mktemp("tool_model")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def tool_task(tmp_path, *, rows: int = 16) -> list[str]:
    records = [{
        "prompt": [{"role": "user", "content": f"What is {i} + {42 - i}? Check your answer with the tool."}],
        "data_source": "tool_use", "ability": "math", "agent_name": "tool_agent",
        "reward_model": {"style": "rule", "ground_truth": "42"},
        "extra_info": {"index": i, "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "42"}}}},
    } for i in range(rows)]
    train, test = tmp_path / "tool_train.parquet", tmp_path / "tool_test.parquet"
    pd.DataFrame(records).to_parquet(train)
    pd.DataFrame(records[:4]).to_parquet(test)
    (tmp_path / "tools.yaml").write_text(TOOL_CONFIG)
    (tmp_path / "tool_reward.py").write_text(TOOL_REWARD)
    return [f"data.train_files={train}", f"data.val_files={test}", "data.max_prompt_length=128",
            "actor_rollout_ref.rollout.multi_turn.enable=True",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp_path / 'tools.yaml'}",
            f"custom_reward_function.path={tmp_path / 'tool_reward.py'}"]


def metrics_rows(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]


def test_multi_turn_grpo_run_logs_verl_multi_turn_metrics(tmp_path, tool_model_dir):
    overrides = base_overrides(tmp_path, tool_model_dir, steps=2) + tool_task(tmp_path) + [
        "data.max_response_length=96", "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        "trainer.test_freq=2"]
    run_ppo(load_config(PPOConfig, overrides))
    row = metrics_rows(tmp_path)[-1]
    for key in ("num_turns/mean", "num_turns/max", "tool_call_counts/mean", "multi_turn/tool_errors/mean",
                "multi_turn/tokenization_mismatch/mean", "critic/score/mean", "actor/pg_loss"):
        assert key in row, key
    assert row["num_turns/min"] >= 2 and row["num_turns/max"] <= 6  # prompt + at most 3 assistant + 2 tool turns
    assert "val-core/tool_use/reward/mean@1" in row and 0.0 <= row["val-aux/tool_call_share@1"] <= 1.0


def test_grpo_learns_to_call_the_tool(tmp_path, tool_model_dir):
    """Reward 1 only when the right answer went through the tool: near 0 at the start, near 1 at the end."""
    overrides = base_overrides(tmp_path, tool_model_dir, steps=20) + tool_task(tmp_path) + [
        "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32", "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.optim.lr=1e-2", "trainer.logger=[file]", "data.max_response_length=8",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        "actor_rollout_ref.rollout.multi_turn.stop_after_tool_call=True"]
    run_ppo(load_config(PPOConfig, overrides))
    rows = metrics_rows(tmp_path)
    scores = [round(r["critic/score/mean"], 2) for r in rows]
    print("score per step:", scores, "tool calls per conversation:", [round(r["tool_call_counts/mean"], 2) for r in rows])
    assert sum(scores[:3]) / 3 < 0.1, scores
    assert sum(scores[-3:]) / 3 > 0.9, scores


# ---------------------------------------------------------------------------- resume after SIGKILL
def tool_calling_model_dir(path) -> str:
    """The tiny model with a bias towards the answer-submitting call token, so conversations have tool turns
    from the first step: hidden dim 0 is a constant (every embedding holds 0.2 there and no layer writes to it),
    and the call token's tied embedding holds 1.2 there, which lifts its logit wherever the model is."""
    from hybridflow.models.tiny import build_tiny_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokenizer.add_tokens([SUBMIT_42])
    model, _ = build_tiny_model(tokenizer=tokenizer, seed=0)
    with torch.no_grad():
        embed = model.model.embed_tokens.weight
        embed[:, 0] = 0.2
        embed[tokenizer.convert_tokens_to_ids(SUBMIT_42), 0] = 1.2
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0].zero_()
            layer.mlp.down_proj.weight[0].zero_()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


PAST_A_BLOCK = 2
"""Every prompt of :func:`resumable_tool_run` is this many tokens past a whole KV block: a prefix-cache hit then
prefills a 2-row chunk, whose CPU matmul sums in another order than the whole prompt's."""


def resumable_tool_run(root, model: str, *, steps: int, every: int) -> list[str]:
    """A multi-turn tool GRPO run that validates and checkpoints every ``every`` steps, so the uninterrupted run's
    engine holds the validation conversations' blocks when the next step's rollout starts. Validation sees every
    training prompt; the prompts (with the tools described, as the tool agent renders them) are padded to one
    length, :data:`PAST_A_BLOCK` tokens past a whole block; the loss reads the engine's log-probs."""
    from transformers import AutoTokenizer

    from hybridflow.agents.chat import render_prompt
    from hybridflow.rollout.block_manager import BLOCK_SIZE
    from hybridflow.tools.config import load_tools

    root.mkdir(parents=True, exist_ok=True)
    task = tool_task(root, rows=8)
    tokenizer = AutoTokenizer.from_pretrained(model)
    schemas = [tool.tool_schema for tool in load_tools(str(root / "tools.yaml"))]
    rows = pd.read_parquet(root / "tool_train.parquet")
    lengths = [len(render_prompt(tokenizer, list(p), tool_schemas=schemas, template_kwargs={})) for p in rows["prompt"]]
    target = -(-(max(lengths) - PAST_A_BLOCK) // BLOCK_SIZE) * BLOCK_SIZE + PAST_A_BLOCK
    rows["prompt"] = [[{**m, "content": m["content"] + " 7" * (target - n)} for m in p]  # " 7" is one token
                      for n, p in zip(lengths, rows["prompt"])]
    rows.to_parquet(root / "tool_train.parquet")
    rows.to_parquet(root / "tool_test.parquet")
    return base_overrides(root, model, steps=steps) + task + [
        "data.max_response_length=48", "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        "actor_rollout_ref.rollout.multi_turn.stop_after_tool_call=True",
        "actor_rollout_ref.actor.use_rollout_log_probs=True", f"trainer.test_freq={every}",
        f"trainer.save_freq={every}", "trainer.logger=[file]", "data.shuffle=True"]


def assert_same_steps(before: list[dict], after: list[dict]) -> None:
    """Every metric of every step equal, bit for bit (times and memory aside), in a run whose conversations had
    tool turns from the first step and whose prompts were all :data:`PAST_A_BLOCK` tokens past a whole block."""
    from hybridflow.rollout.block_manager import BLOCK_SIZE

    assert before[0]["tool_call_counts/mean"] > 0
    assert before[0]["prompt_length/min"] == before[0]["prompt_length/max"]
    assert before[0]["prompt_length/max"] % BLOCK_SIZE == PAST_A_BLOCK
    assert [row["step"] for row in after] == [row["step"] for row in before]
    for a, b in zip(before, after):
        same = {key for key in a if not key.startswith(("timing_s/", "perf/"))}
        assert {key: a[key] for key in same} == {key: b[key] for key in same}, a["step"]


def test_multi_turn_tool_run_resumed_from_a_checkpoint_is_bit_for_bit(tmp_path):
    """The fast variant: a 2-step run, and a second one resumed from a copy of its step-1 checkpoint (as if
    killed right after it was published), in this process: step 2's metrics and weights are the same."""
    from tests.trainer.test_ppo_e2e import resume_from_a_step_1_copy

    model = tool_calling_model_dir(tmp_path / "model")
    straight, resumed = resume_from_a_step_1_copy(
        tmp_path, lambda root: resumable_tool_run(root, model, steps=2, every=1))
    assert_same_steps(metrics_rows(straight), metrics_rows(resumed))


@pytest.mark.slow
def test_multi_turn_tool_run_resumes_bit_for_bit_after_sigkill(tmp_path):
    """Killed with SIGKILL after step 2's checkpoint (where it validated) and resumed: step 4's weights (checked
    by kill_after_step_2_and_resume) and every step's metrics equal the uninterrupted run's."""
    from tests.trainer.test_ppo_e2e import kill_after_step_2_and_resume

    model = tool_calling_model_dir(tmp_path / "model")
    straight, resumed = kill_after_step_2_and_resume(
        tmp_path, lambda root: resumable_tool_run(root, model, steps=4, every=2))
    assert_same_steps(metrics_rows(straight), metrics_rows(resumed))


def _kill_while_writing(overrides: list[str], root, step: int, written: str = "") -> int:
    """Start the run and SIGKILL it while ``global_step_{step}`` is being written: once its temp folder (and in
    it ``written``, when given) exists."""
    import os
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "hybridflow.trainer.main_ppo", *overrides],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.time() + 600
    pattern = f"global_step_{step}.tmp-*/{written}".rstrip("/")
    while not list((root / "ckpt").glob(pattern)) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return proc.returncode


@pytest.mark.slow
@pytest.mark.parametrize("written", ["", "actor/dcp", "data.pt"], ids=["at-the-start", "in-the-actor", "in-data.pt"])
def test_multi_turn_tool_run_killed_while_writing_a_checkpoint_resumes_bit_for_bit(tmp_path, written):
    """Killed while step 3's checkpoint is being written (issue 61 saw 5.6e-9 there), at its start, while the
    actor's shards are written and while data.pt is, then resumed from step 2: step 4's weights and every step's
    metrics equal the uninterrupted run's."""
    import signal

    from tests.trainer.test_ppo_e2e import _run_cli, merged_weights

    model = tool_calling_model_dir(tmp_path / "model")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _run_cli(resumable_tool_run(straight, model, steps=4, every=1))
    killed = _kill_while_writing(resumable_tool_run(resumed, model, steps=4, every=1), resumed, 3, written)
    assert killed == -signal.SIGKILL
    assert (resumed / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert not (resumed / "ckpt" / "global_step_3").exists()
    _run_cli(resumable_tool_run(resumed, model, steps=4, every=1))
    a = merged_weights(straight / "ckpt" / "global_step_4" / "actor", tmp_path / "a")
    b = merged_weights(resumed / "ckpt" / "global_step_4" / "actor", tmp_path / "b")
    assert [key for key in a if not torch.equal(a[key], b[key])] == []
    assert_same_steps(metrics_rows(straight), metrics_rows(resumed))
