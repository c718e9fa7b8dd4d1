"""Issue 57: every file in hybridflow/ under 600 lines and every class under 300 (a file or class past that holds
more than one idea; split it by what changes together)."""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "hybridflow"
MAX_FILE_LINES = 600
MAX_CLASS_LINES = 300


def long_files(root: pathlib.Path = PACKAGE, limit: int = MAX_FILE_LINES) -> dict[str, int]:
    lengths = {str(path.relative_to(root)): len(path.read_text().splitlines()) for path in root.rglob("*.py")}
    return {name: lines for name, lines in lengths.items() if lines >= limit}


def long_classes(root: pathlib.Path = PACKAGE, limit: int = MAX_CLASS_LINES) -> dict[str, int]:
    found = {}
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1
                if lines >= limit:
                    found[f"{path.relative_to(root)}:{node.name}"] = lines
    return found


def test_no_file_is_600_lines_or_longer():
    assert long_files() == {}


def test_no_class_is_300_lines_or_longer():
    assert long_classes() == {}


def test_the_size_checks_see_a_long_file_and_class(tmp_path):
    (tmp_path / "big.py").write_text("class Big:\n" + "    x = 1\n" * 5 + "\n" * 4)
    (tmp_path / "small.py").write_text("class Small:\n    y = 2\n")
    assert long_files(tmp_path, limit=10) == {"big.py": 10}
    assert long_classes(tmp_path, limit=6) == {"big.py:Big": 6}
