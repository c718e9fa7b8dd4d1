import json
import os
import re
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from hybridflow.data.preprocess import SCRIPTS, gsm8k
from hybridflow.data.preprocess import reasoning_gym as rg_script
from hybridflow.errors import DataError

GSM_ROWS = [
    {
        "question": f"Tom has {n} apples and buys {n} more. How many now?",
        "answer": f"{n} + {n} = {2 * n}\n#### {2 * n:,}",
    }
    for n in (3, 40, 700, 1500, 2)
]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read(path):
    return pq.read_table(path).to_pylist()


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_scripts_are_listed():
    assert SCRIPTS == {
        "geo3k": "hybridflow.data.preprocess.geo3k",
        "gsm8k": "hybridflow.data.preprocess.gsm8k",
        "reasoning_gym": "hybridflow.data.preprocess.reasoning_gym",
        "shape_count": "hybridflow.data.preprocess.shape_count",
        "tool_use": "hybridflow.data.preprocess.tool_use",
        "worked_sums": "hybridflow.data.preprocess.worked_sums",
    }


def test_extract_solution():
    assert gsm8k.extract_solution("so 2 + 2 = 4\n#### 1,234") == "1234"
    assert gsm8k.extract_solution("#### -3.5") == "-3.5"
    assert gsm8k.extract_solution("no final answer") is None


def test_gsm8k_single_file_rows(tmp_path):
    source = write_jsonl(tmp_path / "gsm8k.jsonl", GSM_ROWS)
    out = tmp_path / "out"
    paths = gsm8k.main(["--local_dataset_path", source, "--local_dir", str(out)])
    assert paths == {"train": str(out / "train.parquet"), "test": str(out / "test.parquet")}
    train, test = read(paths["train"]), read(paths["test"])
    assert len(train) == 4 and len(test) == 1  # ceil(5 * 0.1) = 1 test row, the last
    row = train[3]
    assert row["prompt"] == [{"role": "user", "content": GSM_ROWS[3]["question"] + " " + gsm8k.INSTRUCTION}]
    assert gsm8k.INSTRUCTION == 'Let\'s think step by step and output the final answer after "####".'
    assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
    assert row["reward_model"] == {"style": "rule", "ground_truth": "3000"}
    assert row["extra_info"] == {
        "split": "train",
        "index": 3,
        "answer": GSM_ROWS[3]["answer"],
        "question": GSM_ROWS[3]["question"],
    }
    assert test[0]["reward_model"]["ground_truth"] == "4" and test[0]["extra_info"]["split"] == "test"


def test_gsm8k_directory_as_subprocess(tmp_path, tiny_tokenizer):
    import pyarrow as pa

    source = tmp_path / "gsm8k" / "main"
    source.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(GSM_ROWS[:3]), source / "train-00000-of-00001.parquet")
    write_jsonl(source / "test.jsonl", GSM_ROWS[3:])
    out = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hybridflow.data.preprocess.gsm8k",
            "--local_dataset_path",
            str(tmp_path / "gsm8k"),
            "--local_save_dir",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert [r["reward_model"]["ground_truth"] for r in read(out / "train.parquet")] == ["6", "80", "1400"]
    assert [r["reward_model"]["ground_truth"] for r in read(out / "test.parquet")] == ["3000", "4"]
    # The output is a valid RL dataset.
    from hybridflow.data.rl_dataset import RLDataset

    assert len(RLDataset(str(out / "train.parquet"), tiny_tokenizer, max_prompt_length=256)) == 3


def test_gsm8k_errors(tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "no marker"}] * 3)
    with pytest.raises(DataError, match=r"train row 0: answer has no '#### N' final answer"):
        gsm8k.main(["--local_dataset_path", bad, "--local_save_dir", out])
    wrong = write_jsonl(tmp_path / "wrong.jsonl", [{"problem": "q", "answer": "#### 1"}] * 3)
    with pytest.raises(
        DataError, match=r"GSM8K train split has no column 'question' \(columns: \['answer', 'problem'\]\)"
    ):
        gsm8k.main(["--local_dataset_path", wrong, "--local_save_dir", out])
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    with pytest.raises(DataError, match=r"no train\* .parquet/.jsonl file under"):
        gsm8k.main(["--local_dataset_path", str(empty_dir), "--local_save_dir", out])
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(DataError, match=r"'datasets' package is not installed.*pass --local_dataset_path PATH"):
        gsm8k.main(["--local_save_dir", out])


def test_gsm8k_error_is_one_line_from_the_command_line(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hybridflow.data.preprocess.gsm8k",
            "--local_dataset_path",
            str(tmp_path / "missing.jsonl"),
            "--local_save_dir",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: data file {str(tmp_path / 'missing.jsonl')!r} does not exist; check data.train_files / data.val_files"
    ]


@pytest.mark.parametrize(
    "task,config",
    [
        ("basic_arithmetic", ["min_terms=2", "max_terms=2", "min_digits=1", "max_digits=1"]),
        ("chain_sum", ["min_terms=2", "max_terms=3"]),
        ("gsm_symbolic", []),
        ("countdown", []),
    ],
)
def test_reasoning_gym_tasks_rebuild_and_score(tmp_path, task, config):
    import reasoning_gym

    argv = [
        "--task",
        task,
        "--size",
        "6",
        "--test_size",
        "3",
        "--seed",
        "5",
        "--instruction",
        " Reply with only the final answer.",
        "--local_save_dir",
        str(tmp_path),
    ]
    for pair in config:
        argv += ["--config", pair]
    rg_script.main(argv)
    train, test = read(tmp_path / "train.parquet"), read(tmp_path / "test.parquet")
    assert len(train) == 6 and 1 <= len(test) <= 3
    expected = list(reasoning_gym.create_dataset(task, size=6, seed=5, **rg_script.parse_config(config)))
    score = reasoning_gym.get_score_answer_fn(task)
    for i, row in enumerate(train):
        assert row["prompt"] == [
            {"role": "user", "content": expected[i]["question"] + " Reply with only the final answer."}
        ]
        assert row["data_source"] == task and row["ability"] == "reasoning"
        assert row["reward_model"]["ground_truth"] == str(expected[i]["answer"])
        assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == i
        entry = {
            "question": expected[i]["question"],
            "answer": row["reward_model"]["ground_truth"],
            "metadata": json.loads(row["extra_info"]["metadata"]),
        }
        assert score(row["reward_model"]["ground_truth"], entry) == 1.0
    questions = {row["prompt"][0]["content"] for row in train}
    assert not questions & {row["prompt"][0]["content"] for row in test}


def test_reasoning_gym_dedupes_test_against_train(tmp_path):
    # chain_sum with two one-digit terms has few distinct questions: overlap is certain at this size.
    argv = [
        "--task",
        "chain_sum",
        "--size",
        "300",
        "--test_size",
        "50",
        "--config",
        "min_terms=2",
        "--config",
        "max_terms=2",
        "--config",
        "min_digits=1",
        "--config",
        "max_digits=1",
        "--local_save_dir",
        str(tmp_path),
    ]
    rg_script.main(argv)
    train, test = read(tmp_path / "train.parquet"), read(tmp_path / "test.parquet")
    train_questions = {row["prompt"][0]["content"] for row in train}
    test_questions = [row["prompt"][0]["content"] for row in test]
    assert len(test) < 50
    assert not train_questions & set(test_questions)
    assert len(set(test_questions)) == len(test_questions)
    assert [row["extra_info"]["index"] for row in test] == list(range(len(test)))


def test_split_unseen_drops_the_overlap_from_the_side_asked():
    def entries(*questions):
        return [{"question": q} for q in questions]

    train, test = entries("a", "b", "a", "c"), entries("b", "d", "d", "a")
    kept_train, kept_test = rg_script.split_unseen(train, test, test_as_drawn=False)
    assert kept_train == train and kept_test == entries("d")
    kept_train, kept_test = rg_script.split_unseen(train, test, test_as_drawn=True)
    assert kept_train == entries("c") and kept_test == entries("b", "d", "a")


def test_test_as_drawn_keeps_the_easy_questions_in_the_held_out_set(tmp_path):
    # 2-3 terms of 1-2 digits: a quarter of the draws are two one-digit terms (about 200 questions), and 1000
    # training draws hold most of them, so the default split's held-out set keeps few; drawn as the task
    # draws, about a quarter of it is that easy.
    def easy_share(folder, *extra):
        argv = ["--task", "chain_sum", "--size", "1000", "--test_size", "120", "--local_save_dir", str(folder)]
        for pair in ("min_terms=2", "max_terms=3", "min_digits=1", "max_digits=2"):
            argv += ["--config", pair]
        rg_script.main(argv + list(extra))
        train, test = read(folder / "train.parquet"), read(folder / "test.parquet")
        questions = [row["prompt"][0]["content"] for row in test]
        assert not {row["prompt"][0]["content"] for row in train} & set(questions)
        easy = [q for q in questions if re.fullmatch(r"State the final answer to the following arithmetic problem: "
                                                       r"\d [+-] \d =", q.strip())]
        return len(easy) / len(questions), len(train), len(test)

    default_share, default_train, default_test = easy_share(tmp_path / "default")
    drawn_share, drawn_train, drawn_test = easy_share(tmp_path / "drawn", "--test_as_drawn")
    assert default_train == 1000 and default_test < 120
    assert drawn_train < 1000 and drawn_test > default_test
    assert drawn_share > default_share + 0.1


def test_a_fixed_test_seed_keeps_the_held_out_questions_when_the_train_set_grows(tmp_path):
    # entry i is drawn from Random(seed + i): with --size 200 the default test seed (242) falls inside the
    # larger train set's range, so the larger set holds the test questions and --test_as_drawn drops them
    def split(folder, size, *extra):
        argv = ["--task", "chain_sum", "--size", str(size), "--test_size", "20", "--test_as_drawn",
                "--local_save_dir", str(folder), *extra]
        rg_script.main(argv)
        questions = [[row["prompt"][0]["content"] for row in read(folder / f"{name}.parquet")]
                     for name in ("train", "test")]
        assert not set(questions[0]) & set(questions[1])
        return questions

    small_train, small_test = split(tmp_path / "small", 200)
    big_train, big_test = split(tmp_path / "big", 800, "--test_seed", "242")
    assert big_test == small_test
    assert len(big_train) > 3 * len(small_train) and set(small_train) <= set(big_train)
    _, default_test = split(tmp_path / "default", 800)
    assert default_test != small_test


def test_reasoning_gym_as_subprocess(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "hybridflow.data.preprocess.reasoning_gym",
            "--task",
            "chain_sum",
            "--size",
            "4",
            "--local_dir",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert len(read(tmp_path / "train.parquet")) == 4
    assert len(read(tmp_path / "test.parquet")) == 1  # default test size: max(1, 4 // 10)


def test_reasoning_gym_errors(tmp_path):
    base = ["--size", "2", "--local_save_dir", str(tmp_path)]
    with pytest.raises(
        DataError, match=r"unknown reasoning-gym task 'nope'; pick a name from reasoning_gym.factory.DATASETS"
    ):
        rg_script.main(["--task", "nope"] + base)
    with pytest.raises(DataError, match=r"reasoning-gym rejected --config \{'bogus': 3\} for 'chain_sum'"):
        rg_script.main(["--task", "chain_sum", "--config", "bogus=3"] + base)
    with pytest.raises(DataError, match=r"--config 'min_terms' is not key=value"):
        rg_script.main(["--task", "chain_sum", "--config", "min_terms"] + base)
    assert rg_script.parse_config(["a=2", "b=x", "c=true", "d=[1, 2]"]) == {"a": 2, "b": "x", "c": True, "d": [1, 2]}


def test_tool_use_rows_from_gsm8k_carry_tools_and_interaction_kwargs(tmp_path):
    from hybridflow.data.preprocess import tool_use

    source = write_jsonl(tmp_path / "gsm8k.jsonl", GSM_ROWS)
    paths = tool_use.main(["--local_save_dir", str(tmp_path / "out"), "--interaction", "gsm8k", "--",
                           "gsm8k", "--local_dataset_path", source])
    row = read(paths["train"])[0]
    assert row["agent_name"] == "tool_agent" and row["data_source"] == "openai/gsm8k"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"] and "calc_gsm8k_reward" in row["prompt"][0]["content"]
    assert row["extra_info"]["tools_kwargs"] == {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "6"}}}
    assert row["extra_info"]["interaction_kwargs"]["ground_truth"] == "6"
    assert row["extra_info"]["interaction_kwargs"]["name"] == "gsm8k"


def test_tool_use_rows_from_reasoning_gym_offline(tmp_path):
    from hybridflow.data.preprocess import tool_use

    paths = tool_use.main(["--local_save_dir", str(tmp_path), "--tool", "calculator", "--", "reasoning_gym", "--task",
                           "basic_arithmetic", "--size", "4", "--test_size", "2"])
    rows = read(paths["train"])
    assert len(rows) == 4 and all(r["agent_name"] == "tool_agent" for r in rows)
    assert rows[0]["extra_info"]["tools_kwargs"]["calculator"]["create_kwargs"]["ground_truth"] == \
        rows[0]["reward_model"]["ground_truth"]


def test_tool_use_without_a_source_names_the_choices(tmp_path):
    from hybridflow.data.preprocess import tool_use

    with pytest.raises(DataError, match="gsm8k, reasoning_gym"):
        tool_use.main(["--local_save_dir", str(tmp_path)])
