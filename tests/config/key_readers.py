"""Which config leaves the package's code reads: a static scan of attribute accesses.

A leaf ``a.b.section.key`` counts as read when some code outside the schema modules
accesses ``<x>.key`` where ``<x>`` is (an alias of) something named ``section``:
``cfg.critic.shuffle``, ``critic_cfg.shuffle`` after ``critic_cfg = cfg.critic``,
``self.cfg.shuffle`` after ``CriticWorker(cfg=critic_cfg)`` or ``f(cfg.critic)`` into a
parameter ``cfg``, and ``getattr(section, "key")`` with a literal or a loop over a
module-level tuple of names. Matching the (section, key) pair rather than the key's last
name alone keeps ``critic.enable`` from being "read" by ``reward_model.enable``.

Functions of ``hybridflow/config`` that other packages import (``critic_enabled``,
``sft_model_path``; never the ``validate_*`` checks) count as readers: they run in the
trainers. Validation alone does not make a key work.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
from collections import defaultdict

from hybridflow.config.loader import schema_keys

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "hybridflow"
MAX_DEPTH = 3  # section paths are told apart by up to their last three names


class _Scan(ast.NodeVisitor):
    """Aliases between scoped names, then the attribute reads through them.

    Alias keys: ``func:name`` for a local or a parameter (``func`` qualified by its class),
    ``Class.self.attr`` for an instance attribute, and ``("dot", keys of x, attr)`` for any
    other attribute ``x.attr``. A read ``<expr>.key`` resolves ``<expr>`` through the aliases
    to the section names it may stand for: ``attr`` and ``parent.attr`` (``critic.model``
    for ``critic_cfg.model`` after ``critic_cfg = cfg.critic``).
    """

    def __init__(self, callables: dict[str, list[tuple[str, list[str]]]], name_tuples: dict[str, list[str]]):
        self.callables = callables
        self.name_tuples = name_tuples
        self.aliases: dict[str, set[str]] = defaultdict(set)
        self.reads: list[tuple[set[str], list[str]]] = []
        self.getattr_reads: list[tuple[set[str], list[str]]] = []  # names, or keys of a loop over names
        self.dotted_reads: set[tuple[str, str]] = set()  # (section suffix, leaf) of setting("a.b.leaf") reads
        self.scope: list[str] = ["<module>"]
        self.classes: list[str] = []
        self._names: dict = {}

    # ------------------------------------------------------------------ what an expression stands for
    def keys(self, node: ast.AST) -> set[str]:
        if isinstance(node, ast.Name):
            return {f"{self.scope[-1]}:{node.id}"}
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self" and self.classes:
                return {f"{self.classes[-1]}.self.{node.attr}"}
            return {("dot", frozenset(self.keys(node.value)), node.attr)}
        if isinstance(node, (ast.Subscript, ast.Starred)):
            return self.keys(node.value)
        if isinstance(node, ast.IfExp):
            return self.keys(node.body) | self.keys(node.orelse)
        if isinstance(node, ast.BoolOp):
            return set().union(*(self.keys(v) for v in node.values))
        return set()

    def alias(self, target: ast.AST, value: ast.AST) -> None:
        seqs = (ast.Tuple, ast.List)
        if isinstance(target, seqs) and isinstance(value, seqs) and len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts):
                self.alias(t, v)
            return
        for key in self.keys(target):
            self.aliases[key] |= self.keys(value) - {key}

    # ------------------------------------------------------------------ scopes
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(node.name)
        self.generic_visit(node)
        self.classes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        name = f"{self.classes[-1]}.{node.name}" if self.classes else node.name
        outer = self.scope[-1]
        self.scope.append(name)
        for arg in node.args.args + node.args.kwonlyargs:  # closures see the enclosing names
            self.aliases[f"{name}:{arg.arg}"]  # noqa: B018 - registers the parameter
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                self.aliases[f"{name}:{sub.id}"].add(f"{outer}:{sub.id}")
        self.generic_visit(node)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    # ------------------------------------------------------------------ bindings and reads
    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self.alias(target, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.alias(node.target, node.value)
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        self.alias(node.target, node.iter)
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self.alias(node.target, node.iter)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        for qualname, params in self.callables.get(callee, []):
            bound = dict(zip(params, node.args))
            bound.update({kw.arg: kw.value for kw in node.keywords if kw.arg})
            for param, value in bound.items():
                key = f"{qualname}.{param}" if qualname.endswith(".self") else f"{qualname}:{param}"
                self.aliases[key] |= self.keys(value)
        if callee == "getattr" and len(node.args) >= 2:
            attr = node.args[1]
            literal = isinstance(attr, ast.Constant) and isinstance(attr.value, str)
            self.getattr_reads.append((self.keys(node.args[0]), [attr.value] if literal else self.keys(attr)))
        self.dotted_key_reads(node, callee)
        self.generic_visit(node)

    def dotted_key_reads(self, node: ast.Call, callee: str | None) -> None:
        """An algorithm spec reads the run config by dotted key: ``setting("algorithm.gdpo_reward_keys")`` and the
        literal values of a ``knobs={"reward_weights": "algorithm.gdpo_reward_weights"}`` argument."""
        literals = list(node.args[:1]) if callee == "setting" else []
        for keyword in node.keywords:
            if keyword.arg == "knobs" and isinstance(keyword.value, ast.Dict):
                literals += keyword.value.values
        for literal in literals:
            if isinstance(literal, ast.Constant) and isinstance(literal.value, str) and "." in literal.value:
                *section, leaf = literal.value.split(".")
                depths = range(1, min(len(section), MAX_DEPTH) + 1)
                self.dotted_reads |= {(".".join(section[-n:]), leaf) for n in depths}

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.reads.append((self.keys(node.value), [node.attr]))
        self.generic_visit(node)

    # ------------------------------------------------------------------ results
    def resolve(self, key: str) -> set[str]:
        seen, todo = {key}, [key]
        while todo:
            for other in self.aliases.get(todo.pop(), ()):
                if other not in seen:
                    seen.add(other)
                    todo.append(other)
        return seen

    def section_names(self, key, visiting: frozenset = frozenset()) -> set[str]:
        """Section paths ``key`` may stand for: ``attr``, ``parent.attr``, ``grandparent.parent.attr``."""
        if key in self._names:
            return self._names[key]
        out: set[str] = set()
        for other in self.resolve(key):
            if isinstance(other, tuple) and other not in visiting:
                _, parents, attr = other
                out.add(attr)
                for parent in parents:
                    out |= {f"{name}.{attr}" for name in self.section_names(parent, visiting | {other})
                            if name.count(".") < MAX_DEPTH - 1}
        if not visiting:
            self._names[key] = out
        return out

    def pairs(self) -> set[tuple[str, str]]:
        """(section name, attribute) for every attribute read."""
        out: set[tuple[str, str]] = set(self.dotted_reads)
        for parents, names in self.getattr_reads:
            attrs = [n for key in names for t in self.resolve(key) for n in self.name_tuples.get(t, [t])
                     if isinstance(n, str)]
            self.reads.append((parents, attrs))
        for parents, attrs in self.reads:
            names = set().union(*(self.section_names(p) for p in parents)) if parents else set()
            out |= {(name, attr) for name in names for attr in attrs}
        return out


def _callables_and_tuples(trees: list[ast.AST]):
    """Parameter names of every function (a class maps to its __init__ or dataclass fields), and
    module-level tuples of strings (names a loop may pass to getattr)."""
    callables: dict[str, list[tuple[str, list[str]]]] = defaultdict(list)
    tuples: dict[str, list[str]] = {}
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple) and node.value.elts and all(
                    isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.value.elts):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        tuples[f"<module>:{target.id}"] = [e.value for e in node.value.elts]
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                fields = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
                callables[node.name].append((f"{node.name}.self", fields))  # dataclass fields -> self.<field>
                for sub in node.body:
                    if isinstance(sub, ast.FunctionDef):
                        params = [a.arg for a in sub.args.args[1:] + sub.args.kwonlyargs]
                        callables[sub.name].append((f"{node.name}.{sub.name}", params))
                        if sub.name == "__init__":
                            callables[node.name].append((f"{node.name}.__init__", params))
            elif isinstance(node, ast.FunctionDef):
                params = [a.arg for a in node.args.args + node.args.kwonlyargs]
                callables[node.name].append((node.name, params))
    return callables, tuples


def _runtime_config_functions(outside: list[ast.AST], config_dir: pathlib.Path) -> list[ast.AST]:
    """Functions of hybridflow/config imported by other packages (not the validate_* checks)."""
    imported = {alias.name for tree in outside for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hybridflow.config")
                for alias in node.names if not alias.name.startswith("validate_")}
    functions = []
    for path in config_dir.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name in imported:
                functions.append(node)
    return functions


def read_pairs(package: pathlib.Path = PACKAGE) -> set[tuple[str, str]]:
    """(section, key) pairs read by the code of ``package`` outside its ``config`` folder."""
    config_dir = package / "config"
    outside = [ast.parse(p.read_text()) for p in sorted(package.rglob("*.py")) if config_dir not in p.parents]
    trees = outside + [ast.Module(body=_runtime_config_functions(outside, config_dir), type_ignores=[])]
    scan = _Scan(*_callables_and_tuples(trees))
    for tree in trees:
        scan.visit(tree)
    return scan.pairs()


def config_leaves(schema: type) -> list[str]:
    """Dotted keys of the schema that hold values (not sections)."""
    return [key for key, tp in schema_keys(schema).items() if not dataclasses.is_dataclass(tp)]


def ambiguous_sections(schema: type) -> set[str]:
    """Section path suffixes that occur at more than one place: ``model`` (actor, critic, reward
    model), ``model.fsdp_config`` (critic, reward model), ``fsdp_config``, ``optim``, ..."""
    sections = [key for key, tp in schema_keys(schema).items() if dataclasses.is_dataclass(tp)]
    suffixes = [".".join(path.split(".")[-n:]) for path in sections for n in range(1, path.count(".") + 2)]
    return {suffix for suffix in suffixes if suffixes.count(suffix) > 1}


def is_read(key: str, pairs: set[tuple[str, str]], ambiguous: set[str] = frozenset()) -> bool:
    """Whether ``key`` is read: as ``<section>.leaf`` with the shortest suffix of its section path
    (up to MAX_DEPTH names) that names no other section; a top-level leaf as ``<anything>.leaf``."""
    parts = key.split(".")
    if len(parts) == 1:
        return any(attr == key for _, attr in pairs)
    section = parts[:-1]
    for n in range(1, min(len(section), MAX_DEPTH) + 1):
        suffix = ".".join(section[-n:])
        if suffix not in ambiguous or n == min(len(section), MAX_DEPTH):
            return (suffix, parts[-1]) in pairs
    return False


def unread_leaves(schema: type, pairs: set[tuple[str, str]] | None = None) -> list[str]:
    pairs = read_pairs() if pairs is None else pairs
    ambiguous = ambiguous_sections(schema)
    return [key for key in config_leaves(schema) if not is_read(key, pairs, ambiguous)]
