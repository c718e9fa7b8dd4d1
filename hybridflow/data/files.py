"""Reading dataset rows from parquet and jsonl files (or a folder of them, or a ``datasets`` save_to_disk folder).

verl's datasets are parquet files whose rows carry ``prompt`` (a list of chat
messages), ``data_source``, ``ability``, ``reward_model`` and ``extra_info``. Users also
hand over jsonl, so both load into the same ``list[dict]``. Rows are read with pyarrow
(not pandas) so nested columns come back as plain lists and dicts, not numpy arrays.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from hybridflow.errors import DataError

SUPPORTED_SUFFIXES = (".parquet", ".jsonl", ".json")


def as_file_list(files: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Normalise one path or a list of paths (verl's ``data.train_files`` takes both; a path may be a folder)."""
    if isinstance(files, (str, os.PathLike)):
        return [os.fspath(files)]
    paths = [os.fspath(path) for path in files]
    if not paths:
        raise DataError("no data files given; set data.train_files / data.val_files to a parquet or jsonl path")
    return paths


def read_rows(files: str | os.PathLike | Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """All rows of all ``files``, in order, as dicts."""
    rows: list[dict[str, Any]] = []
    for path in as_file_list(files):
        rows.extend(_read_folder(path) if os.path.isdir(path) else _read_one_file(path))
    return rows


def _read_folder(path: str) -> list[dict[str, Any]]:
    """A dataset folder (verl's newer scripts pass one as ``data.train_files``): a ``datasets``
    ``save_to_disk`` folder (its ``state.json``), else every .parquet / .jsonl file directly in it, by name."""
    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        splits = sorted(name for name in os.listdir(path) if os.path.isdir(os.path.join(path, name)))
        raise DataError(f"data folder {path!r} holds several splits ({', '.join(splits)}); point data.train_files / "
                        f"data.val_files at one of them, e.g. {os.path.join(path, splits[0] if splits else 'train')}")
    if os.path.isfile(os.path.join(path, "state.json")):
        import datasets

        return datasets.load_from_disk(path).to_list()
    files = sorted(name for name in os.listdir(path) if os.path.splitext(name)[1].lower() in SUPPORTED_SUFFIXES)
    if not files:
        raise DataError(f"data folder {path!r} holds no .parquet / .jsonl file and is not a datasets save_to_disk "
                        f"folder; point data.train_files / data.val_files at the files, e.g. [a.parquet,b.parquet]")
    return [row for name in files for row in _read_one_file(os.path.join(path, name))]


def no_rows_message(files) -> str:
    """The error for data files that hold no row at all."""
    return f"0 rows in data file(s) {files!r}; point data.train_files / data.val_files at a non-empty file"


def read_nonempty_rows(files: str | os.PathLike | Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """:func:`read_rows`, raising :class:`DataError` when the files hold no row."""
    rows = read_rows(files)
    if not rows:
        raise DataError(no_rows_message(files))
    return rows


def _read_one_file(path: str) -> list[dict[str, Any]]:
    if not os.path.isfile(path):
        raise DataError(f"data file {path!r} does not exist; check data.train_files / data.val_files")
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise DataError(
            f"cannot read {path!r}: unsupported file type {suffix or '(none)'!r}; convert it to .parquet or .jsonl"
        )
    reader = _read_parquet if suffix == ".parquet" else _read_jsonl
    return reader(path)


def _read_parquet(path: str) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as error:
        raise DataError(
            f"cannot read {path!r} as parquet ({error}); re-create the file (e.g. with a preprocess script)"
        ) from None


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    rows, offset = [], 0
    with open(path, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            line = _decoded_line(raw, path=path, line_number=line_number, offset=offset)
            offset += len(raw)
            if line.strip():
                rows.append(_json_object(line, path=path, line_number=line_number))
    return rows


def _decoded_line(raw: bytes, *, path: str, line_number: int, offset: int) -> str:
    """One line of a jsonl file as text; bytes that are not UTF-8 (JSON's encoding) are one DataError naming the
    line and the file's byte offset."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(
            f"cannot read {path!r}: line {line_number} (byte {offset + error.start}) is not UTF-8 "
            f"({raw[error.start:error.start + 4]!r}...); re-encode the file as UTF-8 "
            "(e.g. `iconv -f latin1 -t utf-8`)"
        ) from None


def _json_object(line: str, *, path: str, line_number: int) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataError(
            f"cannot read {path!r}: line {line_number} is not valid JSON ({error.msg}); write one JSON "
            "object per line"
        ) from None
    if not isinstance(row, dict):
        raise DataError(
            f"cannot read {path!r}: line {line_number} is a {type(row).__name__}, not a JSON object; "
            "write one object per line"
        )
    return row


def require_columns(rows: list[dict[str, Any]], columns: dict[str, str], source: str, fix: str | None = None) -> None:
    """Raise if a column is absent from the first row; ``columns`` maps column -> the config key that names it."""
    if not rows:
        return
    present = sorted(rows[0])
    for column, config_key in columns.items():
        if column not in rows[0]:
            raise DataError(
                f"{source} has no column {column!r} (columns: {present}); {fix or f'set {config_key} to one of them'}"
            )


def get_path(row: dict[str, Any], path: Sequence[str], *, config_key: str, row_index: int) -> Any:
    """``row[path[0]][path[1]]...``: verl's nested keys (``extra_info.question``)."""
    value: Any = row
    for depth, key in enumerate(path):
        if not isinstance(value, dict) or key not in value:
            where = ".".join(path[:depth]) or "the row"
            present = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise DataError(f"row {row_index}: {where} has no key {key!r} (has {present}); fix {config_key}")
        value = value[key]
    return value


def split_key(key: str, dict_keys: Sequence[str] | None = None) -> list[str]:
    """``'extra_info.question'`` or (``'extra_info'``, ``['question']``) -> path list."""
    return key.split(".") + list(dict_keys or [])


def write_parquet(rows: list[dict[str, Any]], path: str) -> None:
    """Write rows as parquet (the preprocess scripts' output format)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
