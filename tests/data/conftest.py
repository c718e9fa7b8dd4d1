"""Fixtures for the data tests: small row files written by the tests themselves."""

import json

import pytest


def _gsm_row(question: str, answer: str, index: int) -> dict:
    return {
        "prompt": [{"role": "user", "content": question}],
        "data_source": "openai/gsm8k",
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": index},
    }


@pytest.fixture
def make_rows():
    """``make_rows(n)`` -> n verl-schema rows whose prompts grow with the row index."""

    def make(n: int) -> list[dict]:
        return [_gsm_row("what is " + " + ".join(["1"] * (i + 1)) + "?", str(i + 1), i) for i in range(n)]

    return make


@pytest.fixture
def write_rows(tmp_path):
    """``write_rows(rows, name)`` writes jsonl or parquet (by the name's suffix) and returns the path."""

    def write(rows: list[dict], name: str = "rows.jsonl") -> str:
        path = tmp_path / name
        if name.endswith(".parquet"):
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.Table.from_pylist(rows), path)
        else:
            path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return str(path)

    return write
