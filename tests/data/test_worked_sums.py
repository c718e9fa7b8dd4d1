"""The worked-sum SFT rows (data/preprocess/worked_sums.py): traces computed by hand, checked against the
ground truth, and scored right by the reward the RL run uses."""

import json

import pyarrow.parquet as pq
import pytest

from hybridflow.data.preprocess import reasoning_gym as rg_script
from hybridflow.data.preprocess import worked_sums
from hybridflow.errors import DataError
from hybridflow.rewards.reasoning_gym import compute_score


@pytest.mark.parametrize(
    "expression,trace,value",
    [
        ("4 + 3 + 3", "4 + 3 = 7\n7 + 3 = 10\nThe final answer is 10.", 10),
        ("2 - 6 + 3", "2 - 6 = -4\n-4 + 3 = -1\nThe final answer is -1.", -1),
        ("12 + 30 - 5", "12 + 30 = 42\n42 - 5 = 37\nThe final answer is 37.", 37),
        ("99 - 28", "99 - 28 = 71\nThe final answer is 71.", 71),
        ("-7 - 8", "-7 - 8 = -15\nThe final answer is -15.", -15),
        ("7", "The final answer is 7.", 7),
    ],
)
def test_worked_trace_writes_the_running_sum(expression, trace, value):
    assert worked_sums.worked_trace(expression) == (trace, value)


@pytest.mark.parametrize("expression", ["3 * 4", "(1 + 2)", "1 + 2 +", "", "1 + x"])
def test_worked_trace_refuses_what_is_not_a_chain_of_sums(expression):
    with pytest.raises(DataError, match="expression"):
        worked_sums.worked_trace(expression)


def rl_row(expression, truth):
    return {"prompt": [{"role": "user", "content": f"{expression} = ?"}],
            "reward_model": {"ground_truth": truth},
            "extra_info": {"metadata": json.dumps({"expression": expression})}}


def test_worked_row_keeps_the_prompt_and_checks_the_ground_truth():
    row = worked_sums.worked_row(rl_row("5 + 9 - 1", "13"), index=0)
    assert row == {"messages": [{"role": "user", "content": "5 + 9 - 1 = ?"},
                                {"role": "assistant", "content": "5 + 9 = 14\n14 - 1 = 13\nThe final answer is 13."}]}
    with pytest.raises(DataError, match="row 3: 5 \\+ 9 - 1 works out to 13 but its ground truth is '12'"):
        worked_sums.worked_row(rl_row("5 + 9 - 1", "12"), index=3)
    with pytest.raises(DataError, match="no extra_info.metadata.expression"):
        worked_sums.worked_row({"prompt": [], "extra_info": {}}, index=0)


def test_traces_of_generated_chain_sums_score_right(tmp_path):
    rl_dir, sft_dir = tmp_path / "rl", tmp_path / "sft"
    argv = ["--task", "chain_sum", "--size", "24", "--test_size", "4", "--local_save_dir", str(rl_dir),
            "--config", "min_terms=2", "--config", "max_terms=4", "--config", "max_digits=2"]
    rg_script.main(argv)
    paths = worked_sums.main(["--rows", str(rl_dir / "train.parquet"), "--count", "20", "--local_save_dir",
                              str(sft_dir)])
    rl_rows = pq.read_table(rl_dir / "train.parquet").to_pylist()
    sft_rows = pq.read_table(paths["train"]).to_pylist()
    assert len(sft_rows) == 20
    for rl, sft in zip(rl_rows, sft_rows):
        assert sft["messages"][:-1] == rl["prompt"]
        trace = sft["messages"][-1]["content"]
        assert trace.count("\n") == len(json.loads(rl["extra_info"]["metadata"])["expression"].split()) // 2
        assert compute_score("chain_sum", trace, rl["reward_model"]["ground_truth"], rl["extra_info"]) == 1.0


def test_no_rows_is_one_clear_error(tmp_path):
    rl_dir = tmp_path / "rl"
    rg_script.main(["--task", "chain_sum", "--size", "2", "--test_size", "1", "--local_save_dir", str(rl_dir)])
    with pytest.raises(DataError, match="no rows to write traces from"):
        worked_sums.main(["--rows", str(rl_dir / "train.parquet"), "--count", "0", "--local_save_dir",
                          str(tmp_path / "sft")])
