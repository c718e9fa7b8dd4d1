"""What a complete checkpoint step holds, recorded in its completion marker and checked on resume.

The marker (``checkpoint_complete.json``) lists every file of the step with its size,
and a CRC-32 of each file up to ``CHECKSUM_MAX_BYTES`` (larger files -- big weight and
optimizer shards -- are checked by size only, so that saving and resuming do not read
the whole model back). A step whose files are missing, shorter or longer than recorded,
or whose checksum differs, is *damaged*: resume skips it with a warning naming the file.

Markers written before the manifest existed have no ``files`` entry; those steps are
checked only for their components' folders.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable

CHECKSUM_MAX_BYTES = 256 * 2**20
_CHUNK = 4 * 2**20


def crc32_of(path: str) -> str:
    """CRC-32 of a file's bytes as 8 hex digits (read in chunks)."""
    value = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            value = zlib.crc32(chunk, value)
    return f"{value:08x}"


def _files(root: str, *, skip: str) -> Iterable[tuple[str, str]]:
    """``(relative path, absolute path)`` of every file under ``root`` except ``skip``."""
    for directory, _, names in os.walk(root):
        for name in sorted(names):
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            if relative != skip:
                yield relative, path


def build_manifest(root: str, *, marker_name: str) -> dict[str, dict]:
    """``{relative path: {"size": bytes, "crc32": hex (small files only)}}`` of the step at ``root``."""
    manifest = {}
    for relative, path in _files(root, skip=marker_name):
        size = os.path.getsize(path)
        manifest[relative] = {"size": size, **({"crc32": crc32_of(path)} if size <= CHECKSUM_MAX_BYTES else {})}
    return manifest


def manifest_problem(root: str, marker: dict, *, components: Iterable[str] = ()) -> str | None:
    """What is damaged in the step at ``root`` (the first problem found), or None when it is intact."""
    for name in sorted(set(components) | set(marker.get("components", []))):
        if not os.path.isdir(os.path.join(root, name)):
            return f"component {name!r} is missing"
    for relative, expected in sorted(marker.get("files", {}).items()):
        path = os.path.join(root, relative)
        if not os.path.isfile(path):
            return f"{relative} is missing"
        size = os.path.getsize(path)
        if size != expected["size"]:
            return f"{relative} is {'truncated' if size < expected['size'] else 'longer than written'}: {size} bytes, {expected['size']} written"
        if "crc32" in expected and crc32_of(path) != expected["crc32"]:
            return f"{relative} is corrupt (checksum differs from the one written)"
    return None


def tree_size(root: str) -> int:
    """Bytes of all files under ``root``."""
    return sum(os.path.getsize(path) for _, path in _files(root, skip=""))
