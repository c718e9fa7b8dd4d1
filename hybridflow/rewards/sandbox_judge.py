"""The trusted side of assert tests: each test runs here, the program only answers calls.

An assert entry (``"import math\\nassert math.isclose(area(2), 12.566, rel_tol=1e-3)"``) is
ordinary Python executed in *this* process, in a fresh namespace where:

- builtins, the entry's own imports and the pure standard modules it uses without importing them
  (``math`` in ``math.fabs(x)``, HumanEval style) are this process's own objects; a name the
  program bound by importing from a pure standard module (``from collections import Counter`` in
  ``main.py``) is imported here too. What the program
  did to its own ``math`` or ``builtins`` never reaches a test;
- every other free name of the entry the program defines becomes a :class:`RemoteFunction` (a
  callable) or its value (plain data), asked once per entry. Calling a remote function sends its
  name and the already-evaluated arguments (plain data only) to the program's process
  (:mod:`sandbox_harness`), which calls its own function and answers the returned value as plain
  data, decoded here into fresh built-in objects.

So comparisons, comprehensions, lambdas, ``all``/``any``, ``math``, ``Counter``, ``sorted``, ...
all run here on plain data; the expected values never leave this process; a returned object that
is not plain data (a subclass of ``int`` whose ``__eq__`` says True, a generator, an instance of
the program's class) fails the test.

Time is this process's monotonic clock, from writing a request to reading its whole answer; an
answer read after the deadline is a time-out, whatever the program did meanwhile. Each entry
gets ``timeout_s`` of the program's time (the module body gets its own ``timeout_s``).
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import json
import os
import select
import time
from dataclasses import dataclass

from hybridflow.rewards.sandbox_harness import NotPlainData, decode, encode

REPLY_LIMIT_BYTES = 16 << 20
# standard modules that a test may use under their own name (``math.fabs(x)``): the test's author
# chose which of their functions to call, so the module is this process's own, never the program's
PURE_MODULES = frozenset({
    "math", "cmath", "collections", "itertools", "functools", "heapq", "bisect", "operator", "fractions",
    "decimal", "statistics", "string", "re", "copy", "datetime", "json", "typing", "numbers",
    "array", "enum", "dataclasses", "textwrap", "unicodedata", "struct", "types", "abc",
})  # fmt: skip
# the functions and classes that compute on their arguments only (no exit, stdin, sleep, files,
# environment, global RNG or settings): a name the program imports from these, unaliased, is taken
# from this process (the program may have changed its own copy). Trust is by function, not module:
# ``from json.tool import main`` is the program's, asked from the sandbox . A module's
# constants (``from math import pi``) are taken here too when they are plain data.
PURE_FUNCTIONS = {
    "math": frozenset({
        "acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "ceil", "comb", "copysign", "cos", "cosh",
        "degrees", "dist", "erf", "erfc", "exp", "expm1", "fabs", "factorial", "floor", "fmod", "frexp", "fsum",
        "gamma", "gcd", "hypot", "isclose", "isfinite", "isinf", "isnan", "isqrt", "lcm", "ldexp", "lgamma", "log",
        "log10", "log1p", "log2", "modf", "nextafter", "perm", "pow", "prod", "radians", "remainder", "sin",
        "sinh", "sqrt", "tan", "tanh", "trunc", "ulp",
    }),
    "cmath": frozenset({"exp", "isclose", "log", "phase", "polar", "rect", "sqrt"}),
    "collections": frozenset({"Counter", "OrderedDict", "defaultdict", "deque", "namedtuple"}),
    "itertools": frozenset({
        "accumulate", "chain", "combinations", "combinations_with_replacement", "compress", "dropwhile",
        "filterfalse", "groupby", "islice", "pairwise", "permutations", "product", "starmap", "takewhile",
        "zip_longest",
    }),
    "functools": frozenset({"cmp_to_key", "reduce"}),
    "heapq": frozenset({"heapify", "heappop", "heappush", "heappushpop", "heapreplace", "merge", "nlargest",
                        "nsmallest"}),
    "bisect": frozenset({"bisect", "bisect_left", "bisect_right", "insort", "insort_left", "insort_right"}),
    "operator": frozenset({"add", "and_", "eq", "floordiv", "ge", "gt", "itemgetter", "le", "lt", "mod", "mul",
                           "ne", "neg", "or_", "pow", "sub", "truediv", "xor"}),
    "fractions": frozenset({"Fraction"}),
    "decimal": frozenset({"Decimal"}),
    "statistics": frozenset({"fmean", "mean", "median", "median_high", "median_low", "mode", "multimode",
                             "pstdev", "pvariance", "stdev", "variance"}),
    "re": frozenset({"escape", "findall", "split", "sub", "subn"}),
    "copy": frozenset({"copy", "deepcopy"}),
    "json": frozenset({"dumps", "loads"}),
    "typing": frozenset({"Any", "Dict", "FrozenSet", "List", "Optional", "Set", "Tuple", "Union"}),
    "datetime": frozenset({"date", "datetime", "timedelta"}),
    "textwrap": frozenset({"dedent", "fill", "indent", "wrap"}),
}  # fmt: skip


class TestCaseError(ValueError):
    """An ``asserts`` entry that is not Python made of ``assert`` and ``import`` statements."""


class ProgramStopped(BaseException):
    """The program is out of time or memory, ended, or answered garbage: this test and every later
    one fail. A BaseException, so that no ``except Exception`` in a test can swallow it."""


class ProgramAnswerError(Exception):
    """The program raised, or answered something that is not plain data: this test fails."""


@dataclass(frozen=True)
class AssertEntry:
    """One entry of ``asserts``: its compiled statements, the free names they use, and which of
    those name a pure standard module the entry uses as one (``math`` in ``math.fabs(x)``)."""

    source: str
    code: object
    free_names: tuple[str, ...]
    modules: frozenset[str]


def parse_assert_tests(entries: list[str]) -> list[AssertEntry]:
    """Each entry compiled; raises :class:`TestCaseError` for one that is not made of assert
    (at least one) and import statements."""
    return list(_parsed(tuple(entries)))


@functools.lru_cache(maxsize=64)
def _parsed(entries: tuple[str, ...]) -> tuple[AssertEntry, ...]:
    """A row's entries, compiled once per process: a group's samples share their tests (1-2 ms a row
    of five, twice per sample before), and code objects and entries are immutable."""
    return tuple(_parse_entry(entry) for entry in entries)


def _parse_entry(entry: str) -> AssertEntry:
    try:
        tree = ast.parse(entry)
    except SyntaxError as error:
        raise TestCaseError(f"code test {entry!r} is not valid Python: {error.msg}") from None
    allowed = (ast.Assert, ast.Import, ast.ImportFrom)
    if not any(isinstance(node, ast.Assert) for node in tree.body) or not all(
        isinstance(node, allowed) for node in tree.body
    ):
        raise TestCaseError(f"code test {entry!r} must be assert statements (imports allowed), e.g. 'assert f(2) == 4'")
    imported = {alias.asname or alias.name.split(".")[0] for node in tree.body if not isinstance(node, ast.Assert)
                for alias in node.names}  # fmt: skip
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    free = sorted(name for name in names - imported if not hasattr(builtins, name))
    attribute_bases = {node.value.id for node in ast.walk(tree)
                       if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)}  # fmt: skip
    modules = frozenset(name for name in free if name in attribute_bases and name in PURE_MODULES)
    return AssertEntry(source=entry, code=compile(tree, "<test>", "exec"), free_names=tuple(free), modules=modules)


def stdlib_imports(program: str) -> dict[str, tuple[str, str | None]]:
    """``{bound name: (module, attribute or None)}`` for the top-level imports of ``program`` that this
    process takes from its own standard library, where the program binds that name no other way:
    ``import M`` of a :data:`PURE_MODULES` module, and ``from M import name`` of a
    :data:`PURE_FUNCTIONS` function or a plain-data constant of such a module.

    Only imports under their own public name count (``from collections import Counter``, ``import
    math``): ``from sys import exit as add`` or ``from math import hypot as add`` would let the
    program choose which function of the judge's process a test's ``add(...)`` calls. Those stay
    the program's, asked from the sandbox like any function it defines."""
    try:
        body = ast.parse(program).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    imports: dict[str, tuple[str, str | None]] = {}
    for node in body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if alias.asname is None and top in PURE_MODULES:
                    imports[top] = (top, None)
        elif isinstance(node, ast.ImportFrom) and node.module in PURE_MODULES and not node.level:
            imports.update({alias.name: (node.module, alias.name) for alias in node.names
                            if alias.asname is None and _trusted_member(node.module, alias.name)})
    bound_otherwise = _bound_without_import(body)
    return {name: origin for name, origin in imports.items() if name not in bound_otherwise}


def _trusted_member(module: str, name: str) -> bool:
    """``module.name`` is an allow-listed pure function, or a constant that is plain data."""
    if name in PURE_FUNCTIONS.get(module, ()):
        return True
    if name.startswith("_"):
        return False
    try:
        encode(getattr(importlib.import_module(module), name))
    except (NotPlainData, ImportError, AttributeError):
        return False
    return True


def _bound_without_import(body: list[ast.stmt]) -> set[str]:
    """Names the top-level statements other than imports bind (defs, classes, assignments)."""
    definitions = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    bound = {node.name for node in body if isinstance(node, definitions)}
    for statement in body:
        if not isinstance(statement, (ast.Import, ast.ImportFrom)):
            stores = (node for node in ast.walk(statement) if isinstance(node, ast.Name))
            bound |= {node.id for node in stores if isinstance(node.ctx, ast.Store)}
    return bound


def _import(module: str, attribute: str | None):
    imported = importlib.import_module(module)
    return imported if attribute is None else getattr(imported, attribute)


class ProgramChannel:
    """The two pipes to the program server, read and written by this process's own clock.

    Waits with ``poll`` (any descriptor number, not ``select``'s 1,023). The sample's memory is
    watched by the process that supervises this judge (:mod:`judge_process`), not here.
    """

    def __init__(self, requests_fd: int, replies_fd: int):
        self.requests_fd, self.replies_fd = requests_fd, replies_fd
        self.pending = b""
        os.set_blocking(requests_fd, False)

    def _wait(self, fd: int, for_write: bool, deadline: float) -> None:
        poller = select.poll()
        poller.register(fd, select.POLLOUT if for_write else select.POLLIN)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProgramStopped("time")
            if poller.poll(1000 * remaining):
                return

    def send(self, request: dict, deadline: float) -> None:
        data = (json.dumps(request) + "\n").encode()
        while data:
            self._wait(self.requests_fd, True, deadline)
            try:
                data = data[os.write(self.requests_fd, data) :]
            except BlockingIOError:
                continue
            except OSError:
                raise ProgramStopped("ended") from None

    def receive(self, deadline: float) -> dict:
        """The next reply line, or :class:`ProgramStopped` when it is late, too long or not JSON."""
        while b"\n" not in self.pending:
            self._wait(self.replies_fd, False, deadline)
            chunk = os.read(self.replies_fd, 1 << 16)
            if not chunk or len(self.pending) > REPLY_LIMIT_BYTES:
                raise ProgramStopped("ended or answered too much")
            self.pending += chunk
        if time.monotonic() > deadline:
            raise ProgramStopped("time")  # late, whatever held this process back
        line, self.pending = self.pending.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except (ValueError, RecursionError):
            raise ProgramStopped("answered something that is not JSON") from None
        if type(reply) is not dict:
            raise ProgramStopped("answered something that is not a reply")
        return reply


class RemoteFunction:
    """A function of the program: calling it asks the program's process, by the judge's clock."""

    def __init__(self, judge: "Judge", name: str):
        self.judge, self.name = judge, name

    def __call__(self, *args, **kwargs):
        return self.judge.call(self.name, args, kwargs)

    def __repr__(self) -> str:
        return f"<program function {self.name}>"


class Judge:
    """Runs assert entries here against the program behind ``channel``."""

    def __init__(self, channel: ProgramChannel, program: str, timeout_s: float, sample_deadline: float):
        self.channel, self.timeout_s, self.sample_deadline = channel, timeout_s, sample_deadline
        self.program_imports = stdlib_imports(program)
        self.budget_s = timeout_s

    def _ask(self, request: dict) -> dict:
        start = time.monotonic()
        deadline = min(start + self.budget_s, self.sample_deadline)
        self.channel.send(request, deadline)
        reply = self.channel.receive(deadline)
        self.budget_s -= time.monotonic() - start
        return reply

    def wait_ready(self) -> None:
        """The module body ran (within ``timeout_s``)."""
        self.budget_s = self.timeout_s
        if "ready" not in self.channel.receive(min(time.monotonic() + self.timeout_s, self.sample_deadline)):
            raise ProgramStopped("did not start")

    def call(self, name: str, args: tuple, kwargs: dict):
        try:
            request = {"call": name, "args": encode(list(args)), "kwargs": encode(dict(kwargs))}
        except NotPlainData as error:
            raise ProgramAnswerError(f"an argument to {name} is not plain data: {error}") from None
        reply = self._ask(request)
        if "v" not in reply:
            raise ProgramAnswerError(f"{name} raised {reply.get('error')!s:.100}")
        try:
            return decode(reply["v"])
        except NotPlainData as error:
            raise ProgramAnswerError(f"{name} answered {error}") from None

    def namespace(self, entry: AssertEntry) -> dict:
        """This entry's globals: trusted names first, then what the program defines."""
        namespace: dict = {"__builtins__": builtins, "__name__": "__test__"}
        remote = []
        for name in entry.free_names:
            origin = (name, None) if name in entry.modules else self.program_imports.get(name)
            try:
                if origin is not None:
                    namespace[name] = _import(*origin)
                    continue
            except (ImportError, AttributeError):
                pass  # not importable here: the program's, as it would be without this rule
            remote.append(name)
        if remote:
            reply = self._ask({"names": remote})
            found = reply.get("names")
            for name in remote:
                if type(found) is dict and name in found:
                    namespace[name] = self._resolved(name, found[name])
        return namespace

    def _resolved(self, name: str, answer):
        if answer == {"fn": 1}:
            return RemoteFunction(self, name)
        try:
            return decode(answer["v"])
        except (NotPlainData, KeyError, TypeError) as error:
            raise ProgramAnswerError(f"the program's {name} is not plain data") from error

    def passes(self, entry: AssertEntry) -> bool:
        """Whether ``entry`` runs here without an exception; :class:`ProgramStopped` goes through."""
        self.budget_s = self.timeout_s
        try:
            exec(entry.code, self.namespace(entry))
        except ProgramStopped:
            raise
        except BaseException:  # noqa: BLE001 - a failed assert, a wrong answer of any shape, a SystemExit
            return False
        return True


def judge(channel: ProgramChannel, program: str, entries: list[AssertEntry], timeout_s: float,
          sample_deadline: float, report=lambda mark: None) -> list[bool]:  # fmt: skip
    """Whether the program passes each entry; after the program stops, every later entry fails.

    ``report(mark)`` is told each stage as it ends: ``b"r"`` (the module body ran), then ``b"1"`` or
    ``b"0"`` per entry."""
    referee = Judge(channel, program, timeout_s, sample_deadline)
    passed: list[bool] = []
    try:
        referee.wait_ready()
        report(b"r")
        for entry in entries:
            passed.append(referee.passes(entry))
            report(b"1" if passed[-1] else b"0")
    except ProgramStopped:
        report(b"0" * (len(entries) - len(passed)))
    return passed + [False] * (len(entries) - len(passed))
