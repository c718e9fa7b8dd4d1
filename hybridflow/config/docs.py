"""Field docstrings of the config dataclasses, read from the source with ``ast``.

A string literal right under a dataclass field is its documentation (the convention
of cleanrl and of PEP 257's attribute docstrings). They feed ``hybridflow config show
--doc``, the generated YAML files and error messages.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """Map field name -> docstring for one dataclass (inherited fields included)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(klass: type) -> dict[str, str]:
    try:
        tree = ast.parse(inspect.getsource(klass))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body
    docs = {}
    for stmt, nxt in zip(body, body[1:]):
        is_field = isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
        is_doc = isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant)
        if is_field and is_doc and isinstance(nxt.value.value, str):
            docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


def replace_block(path: str, *, begin: str, end: str, block: str) -> None:
    """Replace the generated block of the doc at ``path`` (from the ``begin`` marker to the ``end`` one)."""
    with open(path) as fh:
        text = fh.read()
    start, stop = text.index(begin), text.index(end) + len(end)
    with open(path, "w") as fh:
        fh.write(text[:start] + block + text[stop:])
