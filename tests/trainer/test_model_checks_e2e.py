"""The model checks through the PPO entry point: one ``hybridflow: error:`` line and exit code 2, before training."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from hybridflow.models.tiny import save_tiny_model
from hybridflow.trainer.main_ppo import main
from tests.trainer.ppo_fixtures import base_overrides


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("hybridflow: error:")]


def _edited_config(tiny_model_dir, tmp_path, name: str, **fields) -> str:
    """A copy of the tiny checkpoint whose config.json has ``fields`` changed (the weights untouched)."""
    folder = tmp_path / name
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return str(folder)


def _bert_over_llama(tiny_model_dir, tmp_path) -> str:
    return _edited_config(tiny_model_dir, tmp_path, "bert_config", model_type="bert", architectures=["BertForMaskedLM"])


@pytest.mark.slow
def test_bert_config_over_llama_weights_stops_the_cli_with_one_line(tmp_path, tiny_model_dir):
    """``python -m hybridflow.trainer.main_ppo``: before the fix the run trained a random BERT and exited 0."""
    overrides = base_overrides(tmp_path, _bert_over_llama(tiny_model_dir, tmp_path), steps=1)
    done = subprocess.run([sys.executable, "-m", "hybridflow.trainer.main_ppo", *overrides], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    [error] = _error_lines(done.stderr)
    assert "weights of the 'bert' model" in error and "restore the original config.json" in error


def test_bert_config_over_llama_weights_stops_before_training(tmp_path, tiny_model_dir, capsys):
    assert main(base_overrides(tmp_path, _bert_over_llama(tiny_model_dir, tmp_path), steps=1)) == 2
    [error] = _error_lines(capsys.readouterr().err)
    assert "weights of the 'bert' model" in error and "restore the original config.json" in error


def test_resuming_another_model_size_stops_with_one_line(tmp_path, tiny_model_dir, capsys):
    # the same model path, its weights replaced by a larger model's (another path is refused before: ownership)
    model = str(tmp_path / "model")
    shutil.copytree(tiny_model_dir, model)
    overrides = base_overrides(tmp_path, model, steps=1) + ["trainer.save_freq=1"]
    assert main(overrides) == 0
    shutil.rmtree(model)
    save_tiny_model(model, hidden_size=128)
    resumed = overrides + ["trainer.total_training_steps=2"]
    capsys.readouterr()
    assert main(resumed) == 2
    [error] = _error_lines(capsys.readouterr().err)
    assert "global_step_1/actor/dcp holds a model of another size" in error
    assert "trainer.start_over=true" in error  # resume_mode=disable is refused in a folder with checkpoints


def test_hidden_size_disagreeing_with_the_weights_stops_with_one_line(tmp_path, tiny_model_dir, capsys):
    folder = _edited_config(tiny_model_dir, tmp_path, "wider_config", hidden_size=128)
    assert main(base_overrides(tmp_path, folder, steps=1)) == 2
    [error] = _error_lines(capsys.readouterr().err)
    assert "do not fit its config.json" in error and "hidden_size=128" in error


def _foo_config(tiny_model_dir, tmp_path) -> str:
    return _edited_config(tiny_model_dir, tmp_path, "foo_config", model_type="foo", architectures=["FooForCausalLM"])


def test_unknown_model_type_stops_with_one_line(tmp_path, tiny_model_dir, capsys):
    assert main(base_overrides(tmp_path, _foo_config(tiny_model_dir, tmp_path), steps=1)) == 2
    [error] = _error_lines(capsys.readouterr().err)
    assert "model_type 'foo'" in error and "trust_remote_code" in error


def test_unknown_model_type_of_a_generative_judge_stops_with_one_line(tmp_path, tiny_model_dir, capsys):
    judge = ["reward_model.enable=True", "reward_model.use_reward_loop=True",
             f"reward_model.model.path={_foo_config(tiny_model_dir, tmp_path)}"]
    assert main(base_overrides(tmp_path, tiny_model_dir, steps=1) + judge) == 2
    [error] = _error_lines(capsys.readouterr().err)
    assert "foo_config/config.json has model_type 'foo'" in error


def test_a_tokenizer_larger_than_the_model_s_vocab_stops_before_training(tmp_path, tiny_model_dir, tiny_tokenizer,
                                                                        capsys):
    """Issue 50: data.tokenizer with 8 tokens more than the embedding's 512 rows was an index error in the first
    forward; now one line before any weight loads."""
    import copy

    larger = copy.deepcopy(tiny_tokenizer)
    larger.add_tokens([f"<extra_{i}>" for i in range(8)])
    larger.save_pretrained(tmp_path / "larger_tokenizer")
    overrides = base_overrides(tmp_path, tiny_model_dir, steps=1) + [f"data.tokenizer={tmp_path / 'larger_tokenizer'}"]
    assert main(overrides) == 2
    [error] = _error_lines(capsys.readouterr().err)
    assert error == (f"hybridflow: error: the model in {tiny_model_dir} has vocab_size=512 embedding rows but the "
                     f"tokenizer (data.tokenizer={tmp_path / 'larger_tokenizer'}) has 520 tokens: ids 512..519 would "
                     "index past the embedding; use the model's own tokenizer, or resize the model's embeddings "
                     "(model.resize_token_embeddings(len(tokenizer)) and save it)")
    assert not (tmp_path / "ckpt" / "global_step_1").exists()
