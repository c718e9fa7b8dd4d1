"""The README's and docs' shell commands, read from the Markdown itself (issue 59).

A fenced block opts in with ``<!-- doc-test: CHAIN -->`` on the line above it. The blocks of one chain, in
the order they appear (README.md first, then docs/*.md by name), form one shell script run in a fresh folder,
so a doc edit that breaks a later command (a path, a key, a checkpoint name) fails the test. A command whose
line ends in ``# tiny: OTHER`` runs as ``OTHER`` in the fast tier (the doc's own tiny-model switch) and as
written in the slow tier. ``make venv && source .venv/bin/activate`` is the environment the tests already run in:
the runner puts ``python`` and ``hybridflow`` (this checkout's) first on PATH instead.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- doc-test: ([\w-]+) -->\s*$")
TINY = re.compile(r"\s+# tiny: (?P<tiny>.+)$")
VENV_SETUP = "make venv && source .venv/bin/activate"


@dataclass(frozen=True)
class Block:
    """One opted-in fenced block: where it is and its text."""

    path: str
    line: int
    chain: str
    text: str


def doc_files(root: Path = REPO) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def marked_blocks(paths: list[Path]) -> list[Block]:
    """Every block under a ``doc-test`` marker, in file order."""
    blocks = []
    for path in paths:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            match = MARKER.match(line)
            if not match:
                continue
            if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
                raise ValueError(f"{path.name}:{i + 1}: a doc-test marker must sit right above a ``` fence")
            end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
            blocks.append(Block(path.name, i + 2, match.group(1), "\n".join(lines[i + 2:end])))
    return blocks


def commands(text: str) -> list[str]:
    """The block's commands: backslash-continued lines joined, blank and comment-only lines dropped."""
    joined, current = [], ""
    for line in text.splitlines():
        line = line.lstrip() if current else line
        current += line[:-1].rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            if current.strip() and not current.lstrip().startswith("#"):
                joined.append(current.strip())
            current = ""
    return joined


def chain_script(blocks: list[Block], *, tiny: bool) -> str:
    """One bash script of the chain's commands; the first failing command is named on stderr."""
    lines = ["set -eo pipefail", "trap 'echo \"doc command failed: $BASH_COMMAND\" >&2' ERR"]
    for block in blocks:
        for command in commands(block.text):
            if command == VENV_SETUP:
                continue
            match = TINY.search(command)
            if match:
                command = match.group("tiny") if tiny else command[:match.start()]
            lines += [f"echo {quote('$ ' + command)}", command]
    return "\n".join(lines) + "\n"


def quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _shim(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def run_chain(blocks: list[Block], folder: Path, *, tiny: bool, timeout: float) -> subprocess.CompletedProcess:
    """Run the chain in ``folder/work`` with this checkout's ``python`` / ``hybridflow`` first on PATH."""
    bin_dir, work = folder / "bin", folder / "work"
    bin_dir.mkdir(parents=True)
    work.mkdir()
    _shim(bin_dir, "python", f'exec {sys.executable} "$@"')
    _shim(bin_dir, "hybridflow", f'exec {sys.executable} -m hybridflow.cli "$@"')
    _shim(bin_dir, "less", "exec cat")  # the reader's pager; a test has no terminal
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", HYBRIDFLOW_DEBUG="")
    return subprocess.run(["bash", "-c", chain_script(blocks, tiny=tiny)], cwd=work, env=env, capture_output=True,
                          text=True, timeout=timeout)
