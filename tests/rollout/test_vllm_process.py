"""The vLLM host process's log folder (issue 56): removed after a clean run, kept (and its path said) after a failed
call, e.g. an engine core that died while the host itself stops cleanly. The real host module runs in a child of
this interpreter; no vLLM is needed, as no engine is built."""

import os
import shutil
import sys
from pathlib import Path

import pytest

from hybridflow.errors import RolloutError
from hybridflow.rollout.vllm_process import VLLMProcess

ROOT = str(Path(__file__).resolve().parents[2])


def host() -> VLLMProcess:
    return VLLMProcess(sys.executable, env={"PYTHONPATH": ROOT})


def test_a_clean_run_leaves_no_folder():
    process = host()
    process.close()
    assert process.proc.returncode == 0 and not os.path.exists(process.workdir)


def test_a_failed_call_keeps_the_log_after_a_clean_stop(caplog):
    process = host()
    with pytest.raises(RolloutError, match="vLLM failed in max_model_len"):
        process.call("max_model_len")  # before init: the host has no engine
    with caplog.at_level("WARNING", logger="hybridflow.rollout.vllm_process"):
        process.close()
    assert process.proc.returncode == 0  # the host stopped cleanly ...
    assert os.path.isfile(process.log_path)  # ... and the log is still there to read
    assert f"vLLM's log kept at {process.log_path} (the call max_model_len failed)" in caplog.text
    shutil.rmtree(process.workdir)
