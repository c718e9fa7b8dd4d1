"""Issue 59: a hub id with no reachable hub is one line at once, naming the ways to get a model without a hub."""

import os
import subprocess
import sys
import time

import pytest

from hybridflow.errors import ModelError
from hybridflow.models import hub

REFUSED = "http://127.0.0.1:9"  # nothing listens on the discard port: unreachable on any machine


def test_no_hub_is_one_line_naming_the_offline_ways(tmp_path):
    from hybridflow.data.preprocess import reasoning_gym

    reasoning_gym.main(["--task", "chain_sum", "--size", "4", "--test_size", "2", "--local_save_dir", str(tmp_path)])
    env = dict(os.environ, HF_ENDPOINT=REFUSED, HF_HOME=str(tmp_path / "hf"), HYBRIDFLOW_DEBUG="")
    for offline in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # conftest sets them; this is a user without
        env.pop(offline, None)
    proc = subprocess.run([sys.executable, "-m", "hybridflow.trainer.main_ppo",
                           "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
                           f"data.train_files={tmp_path}/train.parquet", f"data.val_files={tmp_path}/test.parquet"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    for fix in ("hybridflow models fetch", "hybridflow models tiny", "local Hugging Face folder", "HF_HUB_OFFLINE=1"):
        assert fix in lines[0]


def test_probe_answers_within_its_bound(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", REFUSED)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    start = time.monotonic()
    with pytest.raises(ModelError, match="is a hub id, but the hub"):
        hub.ensure_hub_reachable("someone/some-model-that-is-not-cached")
    assert time.monotonic() - start <= 5.0


def test_a_cached_model_goes_offline_instead(monkeypatch, tmp_path):
    from huggingface_hub import constants

    snapshot = tmp_path / "models--org--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--org--cached" / "refs").mkdir()
    (tmp_path / "models--org--cached" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "ENDPOINT", REFUSED)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    hub.ensure_hub_reachable("org/cached")
    assert constants.HF_HUB_OFFLINE is True and os.environ["HF_HUB_OFFLINE"] == "1"


def test_local_folders_and_paths_are_never_probed(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "hub_reachable", lambda *a, **k: pytest.fail("probed a local path"))
    hub.ensure_hub_reachable(str(tmp_path))  # an existing folder
    hub.ensure_hub_reachable("/no/such/folder")  # a missing local path: validation says so, not the probe
    assert not hub.is_hub_id("./models/tiny") and hub.is_hub_id("Qwen/Qwen2.5-0.5B-Instruct")
