"""Load-time checks: every row's data_source has a scorer that can run, with the fields it needs."""

import pytest

from hybridflow.errors import DataError
from hybridflow.rewards import code_sandbox
from hybridflow.rewards.code_sandbox import SandboxUnavailableError
from hybridflow.rewards.registry import check_rows_scorable


def test_known_sources_with_ground_truth_pass():
    check_rows_scorable([(0, "openai/gsm8k", "4"), (1, "chain_sum", "7"), (2, "hybridflow/digits", None)],
                        files="data.train_files")


def test_misspelled_data_source_names_the_row_and_the_nearest_source():
    with pytest.raises(DataError, match=r"data.train_files, row 3: .*'openai/gsm8kk' \(did you mean 'openai/gsm8k'\?\)"):
        check_rows_scorable([(0, "openai/gsm8k", "4"), (3, "openai/gsm8kk", "2")], files="data.train_files")


def test_row_without_ground_truth_is_caught_at_load():
    with pytest.raises(DataError, match=r"data.val_files, row 5 \(data_source 'openai/gsm8k'\): reward_model.ground_truth is missing"):
        check_rows_scorable([(5, "openai/gsm8k", None)], files="data.val_files")


def test_code_rows_need_a_working_sandbox(monkeypatch):
    monkeypatch.setattr(code_sandbox, "bwrap_problem", lambda: "bubblewrap (bwrap) is not installed")
    monkeypatch.delenv(code_sandbox.ALLOW_UNSANDBOXED_ENV, raising=False)
    rows = [(0, "codecontests", '{"inputs": ["1"], "outputs": ["1"]}')]
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        check_rows_scorable(rows, files="data.train_files")
    monkeypatch.setenv(code_sandbox.ALLOW_UNSANDBOXED_ENV, "1")
    code_sandbox._warn_weak_mode.cache_clear()
    with pytest.warns(RuntimeWarning, match="allow_unsandboxed=true"):
        check_rows_scorable(rows, files="data.train_files")
