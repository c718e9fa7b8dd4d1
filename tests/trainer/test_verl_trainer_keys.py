"""trainer.* keys verl users rely on, in a tiny end-to-end run: rollout / validation JSONL dumps,
validation samples in the trackers, per-role checkpoint rotation."""

import json
import re

from hybridflow.config import PPOConfig, load_config
from hybridflow.trainer.tracking.generations import pick_generations
from hybridflow.trainer.main_ppo import run_ppo
from tests.trainer.ppo_fixtures import base_overrides


def _digit_fraction(text: str) -> float:
    """The fixture's reward (tests/trainer/ppo_fixtures.py), recomputed from the dumped output."""
    text = text.strip()
    return sum(ch.isdigit() for ch in text) / len(text) if text else 0.0


def _jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_dumps_val_generations_and_rotation(tmp_path, tiny_model_dir):
    rollouts, validations = tmp_path / "rollouts", tmp_path / "validations"
    overrides = base_overrides(tmp_path, tiny_model_dir, estimator="gae", steps=3) + [
        f"trainer.rollout_data_dir={rollouts}", f"trainer.validation_data_dir={validations}",
        "trainer.log_val_generations=3", "trainer.test_freq=2", "trainer.val_before_train=True",
        "trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=2", "trainer.max_critic_ckpt_to_keep=1",
    ]
    run_ppo(load_config(PPOConfig, overrides))

    # rollout dumps: {step}.jsonl, 4 prompts x n=2 per step, verl's fields; the score is the reward of the output
    assert sorted(p.name for p in rollouts.iterdir()) == ["1.jsonl", "2.jsonl", "3.jsonl"]
    rows = _jsonl(rollouts / "2.jsonl")
    assert len(rows) == 8 and all(r["step"] == 2 for r in rows)
    assert {"input", "output", "gts", "score", "step", "length"} <= set(rows[0])  # length: the scorer's extra
    for row in rows:
        a, b = re.search(r"What is (\d+) \+ (\d+)\?", row["input"]).groups()  # the templated prompt's text
        assert row["gts"] == str(int(a) + int(b))
        assert abs(row["score"] - _digit_fraction(row["output"])) < 1e-6
        assert row["length"] == len(row["output"].strip())

    # validation: before training (step 0), at step 2 and at the last step; 4 prompts, greedy n=1
    assert sorted(p.name for p in validations.iterdir()) == ["0.jsonl", "2.jsonl", "3.jsonl"]
    val_rows = _jsonl(validations / "3.jsonl")
    assert len(val_rows) == 4 and all(abs(r["score"] - _digit_fraction(r["output"])) < 1e-6 for r in val_rows)
    logged = _jsonl(tmp_path / "ckpt" / "logs" / "val_generations.jsonl")
    assert [r["step"] for r in logged] == [0] * 3 + [2] * 3 + [3] * 3
    expected = pick_generations([r["input"] for r in val_rows], [r["output"] for r in val_rows],
                                [r["score"] for r in val_rows], 3)
    assert [(r["input"], r["output"], r["score"]) for r in logged[-3:]] == [(i, o, s) for i, o, s in expected]

    # rotation: the actor keeps 2 steps, the critic 1; step 1 is gone whole
    ckpt = tmp_path / "ckpt"
    assert sorted(p.name for p in ckpt.glob("global_step_*")) == ["global_step_2", "global_step_3"]
    assert (ckpt / "global_step_3" / "critic").is_dir() and (ckpt / "global_step_3" / "actor").is_dir()
    assert (ckpt / "global_step_2" / "actor").is_dir() and not (ckpt / "global_step_2" / "critic").exists()


def test_pick_generations_is_the_same_sample_whatever_the_order():
    inputs, outputs, scores = ["c", "a", "b", "d"], ["C", "A", "B", "D"], [3.0, 1.0, 2.0, 4.0]
    first = pick_generations(inputs, outputs, scores, 2)
    again = pick_generations(inputs[::-1], outputs[::-1], scores[::-1], 2)
    assert first == again and len(first) == 2
    assert all(i.upper() == o for i, o, _ in first)
