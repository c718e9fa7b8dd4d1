"""The generative reward model: judge prompt, score parsing, failures and time-outs, and a PPO step with it."""

from __future__ import annotations

import time

import pytest

from hybridflow.rewards.generative_judge import DEFAULT_PATTERN, GenerativeJudge, parse_score
from hybridflow.rollout import SamplingParams
from tests.agents.scripted import ScriptedEngine


@pytest.mark.parametrize("verdict, expected", [
    ("Good work. Score: 7", 0.7), ("Score: 3. On reflection, Score: 9", 0.9), ("Score: 15", 1.0),
    ("Score: -2", 0.0), ("Score: 7.5", 0.75), ("I cannot rate this.", None),
])
def test_parse_score_takes_the_last_rating_scaled_and_clipped(verdict, expected):
    assert parse_score(verdict, pattern=DEFAULT_PATTERN, scale=10.0) == expected


def judge(tokenizer, reply, **kwargs):
    params = SamplingParams(n=1, temperature=0.0, max_tokens=32, stop_token_ids=[tokenizer.eos_token_id])
    return GenerativeJudge(engine=ScriptedEngine(tokenizer, reply), tokenizer=tokenizer, sampling_params=params,
                           **kwargs)


def grade(text: str) -> str:
    """A judge that gives 10 when the graded answer equals the reference, 2 otherwise, and babbles for 'x'."""
    answer = text.split("Answer to grade: ")[1].split("\n")[0]
    reference = text.split("Reference answer: ")[1].split("\n")[0]
    if answer == "x":
        return "hmm"
    return "Score: 10" if answer == reference else "Score: 2"


def test_judge_scores_through_the_engine_and_counts_failures(tiny_tokenizer):
    j = judge(tiny_tokenizer, grade, failure_score=-1.0)
    prompts = [[{"role": "system", "content": "s"}, {"role": "user", "content": "6*7?"}]] * 3
    scores = j.score(prompts=prompts, responses=["42", "41", "x"], ground_truths=["42", "42", "42"])
    assert scores.tolist() == pytest.approx([1.0, 0.2, -1.0])
    assert j.last_metrics == {"reward/judge_failed": 1.0, "reward/judge_timed_out": 0.0}


def test_judge_prompt_holds_the_question_reference_and_response(tiny_tokenizer):
    j = judge(tiny_tokenizer, grade)
    ids = j.judge_prompt_ids(prompt=[{"role": "user", "content": "What is 6*7?"}], response="42", ground_truth="42")
    text = tiny_tokenizer.decode(ids)
    assert "Question: What is 6*7?\nReference answer: 42\nAnswer to grade: 42\n" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_judge_time_out_gives_failure_scores_and_the_next_call_waits(tiny_tokenizer):
    def slow(text):
        time.sleep(0.5)
        return "Score: 10"

    j = judge(tiny_tokenizer, slow, timeout_s=0.05, failure_score=0.0)
    scores = j.score(prompts=["q"], responses=["a"], ground_truths=["a"])
    assert scores.tolist() == [0.0] and j.last_metrics["reward/judge_timed_out"] == 1.0
    j.timeout_s = None
    assert j.score(prompts=["q"], responses=["a"], ground_truths=["a"]).tolist() == [1.0]


def test_ppo_step_with_a_generative_reward_model(tmp_path, tiny_model_dir):
    import json

    from hybridflow.config import PPOConfig, load_config
    from hybridflow.trainer.main_ppo import run_ppo
    from tests.trainer.ppo_fixtures import base_overrides

    overrides = base_overrides(tmp_path, tiny_model_dir, steps=1) + [
        "reward_model.enable=True", "reward_model.use_reward_loop=True", f"reward_model.model.path={tiny_model_dir}",
        "reward_model.rollout.response_length=8", "reward_model.failure_score=0.25", "trainer.logger=[file]"]
    run_ppo(load_config(PPOConfig, overrides))
    row = json.loads((tmp_path / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()[-1])
    # a random judge never writes 'Score: N': every sample gets the failure score
    assert row["reward/judge_failed"] == 8.0 and row["critic/score/mean"] == pytest.approx(0.25)


def test_a_judge_failing_on_every_sample_says_so_on_the_console(tiny_tokenizer, caplog):
    """Issue 37: it was silent (only the reward/judge_failed metric counted it)."""
    j = judge(tiny_tokenizer, lambda text: "I cannot rate this.", failure_score=0.0)
    for _ in range(2):
        j.score(prompts=["q", "q"], responses=["a", "b"], ground_truths=["a", "a"])
    lines = [r.getMessage() for r in caplog.records if "generative judge" in r.getMessage()]
    assert len(lines) == 2  # every call where no sample got a score
    assert "scored 2 of 2 samples as failures" in lines[0] and "score_pattern" in lines[0]
    assert "'I cannot rate this.'" in lines[0]


def test_some_judge_failures_are_said_once(tiny_tokenizer, caplog):
    j = judge(tiny_tokenizer, grade)
    for _ in range(3):
        j.score(prompts=["q", "q"], responses=["42", "x"], ground_truths=["42", "42"])
    lines = [r.getMessage() for r in caplog.records if "generative judge" in r.getMessage()]
    assert len(lines) == 1 and "scored 1 of 2 samples" in lines[0]
