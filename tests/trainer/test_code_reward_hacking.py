"""A GRPO run on a code task whose policy has learned to exit before the tests (issue 38).

The rollout engine is scripted: of each prompt's two samples, one is a right ``add`` and one a
wrong ``add`` that calls ``exit()`` before the asserts would run (the hack that scored 1.0 when
the asserts were appended to the program). The sandbox's harness must give the hack 0: the
step's mean score is 0.5 (one right sample in two), its minimum 0.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from hybridflow.config import PPOConfig, load_config
from hybridflow.rewards import code_sandbox
from hybridflow.rollout import ENGINES, Completion
from hybridflow.trainer.main_ppo import run_ppo

RIGHT = "```python\ndef add(a, b):\n    return a + b\n```"
EXIT_EARLY = "```python\ndef add(a, b):\n    return a - b\nexit()\n```"


class ExitEarlyPolicy:
    """Sample ``k`` of each prompt is ``RIGHT`` when k is even, ``EXIT_EARLY`` when odd."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompt_token_ids, params):
        out = []
        for index in range(len(prompt_token_ids)):
            for k in range(params.n):
                text = RIGHT if k % 2 == 0 else EXIT_EARLY
                tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
                out.append(Completion(token_ids=tokens, logprobs=[-0.5] * len(tokens), finish_reason="stop",
                                      prompt_index=index))
        return out

    def load_weights(self, named_tensors):
        pass


def write_code_task(directory) -> str:
    truth = json.dumps({"asserts": ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]})
    rows = [{"prompt": [{"role": "user", "content": f"Write add(a, b) in Python. ({i})"}],
             "data_source": "codecontests", "ability": "code",
             "reward_model": {"style": "rule", "ground_truth": truth}, "extra_info": {"index": i}}
            for i in range(4)]  # fmt: skip
    path = directory / "code.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return str(path)


def test_grpo_gives_no_reward_for_exiting_before_the_tests(tmp_path, tiny_model_dir, monkeypatch):
    policy = lambda model, tokenizer=None, **kwargs: ExitEarlyPolicy(tokenizer)  # noqa: E731
    monkeypatch.setitem(ENGINES, "test-exit-early-policy", policy)
    if not code_sandbox.sandbox_available():
        monkeypatch.setenv(code_sandbox.ALLOW_UNSANDBOXED_ENV, "1")
    data = write_code_task(tmp_path)
    overrides = [
        f"actor_rollout_ref.model.path={tiny_model_dir}", f"data.train_files={data}", f"data.val_files={data}",
        "data.train_batch_size=2", "data.max_prompt_length=64", "data.max_response_length=48",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.name=test-exit-early-policy", "actor_rollout_ref.rollout.n=2",
        "algorithm.adv_estimator=grpo", "reward_model.timeout_s=null", "trainer.total_training_steps=1",
        "trainer.logger=[file]", "trainer.val_before_train=False", "trainer.test_freq=-1",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    ]  # fmt: skip
    run_ppo(load_config(PPOConfig, overrides))
    [row] = [json.loads(line) for line in (tmp_path / "ckpt" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert row["critic/score/mean"] == pytest.approx(0.5)
    assert row["critic/score/min"] == 0.0 and row["critic/score/max"] == 1.0
