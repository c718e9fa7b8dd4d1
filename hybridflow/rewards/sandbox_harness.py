"""The script that runs inside the code sandbox: limits, then the program or the assert harness.

This file is importable (the host uses :func:`parse_assert_tests` to check test rows), and its
text is also what the sandboxed interpreter runs with ``python -I -c`` (standard library only;
``hybridflow`` is not visible in there).

``argv``: ``memory_bytes cpu_seconds file_bytes processes files mode kind [spec_fd verdict_fd
time_limit_s]``. ``kind`` is ``program`` (run ``main.py`` as ``__main__``: stdin/stdout
tests) or ``asserts`` (the harness below).

Assert tests are kept out of the program's sight and reach:

- the harness *parent* forks the *child* that runs ``main.py`` before it reads the tests, so
  the child's memory never holds them; the tests come on ``spec_fd`` (a file the host already
  unlinked), the parent is non-dumpable (no ``/proc/<ppid>/mem`` or ``fd``, no ptrace), and the
  child closes every descriptor but stdio and its two command pipes before the program runs;
- the parent evaluates each ``assert`` itself: literals, comparisons, ``and``/``or``/``not``,
  arithmetic and a few pure built-ins (``abs``, ``len``, ``sorted``, ``math.isclose``, ...) run
  in the parent; only the other sub-expressions (``add(2, 3)``) go to the child, whose answer
  comes back as the ``repr`` of plain data (``ast.literal_eval``; an object whose ``__eq__``
  always says True arrives as text that is not a literal, and fails). The expected values never
  enter the child's process;
- a pass is a line ``<nonce> <index> 1`` that the parent writes on ``verdict_fd`` after that
  test ran, where the nonce is a random token from the spec. ``exit()``, ``sys.exit()``,
  ``raise SystemExit`` or ``os._exit()`` in the program end only the child: the parent then
  fails every test that has no answer. ``SystemExit`` raised by the module body is caught and
  the functions defined so far are still tested (an ordinary program that ends with
  ``sys.exit()`` is graded on its functions, never passed for exiting).
"""

from __future__ import annotations

import ast
import math
import operator
import os
import sys

_SAFE_CALLS = {
    "abs": abs, "round": round, "len": len, "sorted": sorted, "set": set, "frozenset": frozenset,
    "list": list, "tuple": tuple, "min": min, "max": max, "sum": sum, "int": int, "float": float,
    "str": str, "bool": bool, "any": any, "all": all, "dict": dict,
}  # fmt: skip
_BINARY = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}  # fmt: skip
_UNARY = {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}
_COMPARE = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_, ast.IsNot: operator.is_not,
}  # fmt: skip
_REPLY_LIMIT = 16 << 20


class TestCaseError(ValueError):
    """An ``asserts`` entry that is not Python made of ``assert`` and ``import`` statements."""


def parse_assert_tests(entries: list[str]) -> list[tuple[list[str], list[ast.expr]]]:
    """``[(imports, assert_tests)]``: per entry, its import statements (run in the child first)
    and the test expression of each of its asserts. Raises :class:`TestCaseError`."""
    parsed = []
    for entry in entries:
        try:
            body = ast.parse(entry).body
        except SyntaxError as error:
            raise TestCaseError(f"code test {entry!r} is not valid Python: {error.msg}") from None
        imports = [ast.unparse(node) for node in body if isinstance(node, (ast.Import, ast.ImportFrom))]
        tests = [node.test for node in body if isinstance(node, ast.Assert)]
        if not tests or len(imports) + len(tests) != len(body):
            raise TestCaseError(
                f"code test {entry!r} must be assert statements (imports allowed), e.g. 'assert f(2) == 4'"
            )
        parsed.append((imports, tests))
    return parsed


def _call(node: ast.Call, remote):
    """A pure built-in applied in the parent, or None when ``node`` is not one."""
    func = node.func
    if isinstance(func, ast.Name) and func.id in _SAFE_CALLS:
        function = _SAFE_CALLS[func.id]
    elif ast.unparse(func) == "math.isclose":
        function = math.isclose
    else:
        return None
    if any(isinstance(arg, ast.Starred) for arg in node.args) or any(k.arg is None for k in node.keywords):
        return None
    if any(k.arg == "key" for k in node.keywords):
        return None  # a key function would be a lambda: not data
    args = [evaluate(arg, remote) for arg in node.args]
    return lambda: function(*args, **{k.arg: evaluate(k.value, remote) for k in node.keywords})


def evaluate(node: ast.expr, remote):
    """Value of ``node``: evaluated here where it is data and logic, by ``remote(source)`` elsewhere."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [evaluate(item, remote) for item in node.elts]
        return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {evaluate(k, remote): evaluate(v, remote) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](evaluate(node.operand, remote))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](evaluate(node.left, remote), evaluate(node.right, remote))
    if isinstance(node, ast.BoolOp):
        return _bool_op(node, remote)
    if isinstance(node, ast.Compare):
        left = evaluate(node.left, remote)
        for op, comparator in zip(node.ops, node.comparators):
            right = evaluate(comparator, remote)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Call) and (apply := _call(node, remote)) is not None:
        return apply()
    return remote(ast.unparse(node))


def _bool_op(node: ast.BoolOp, remote):
    value = None
    for operand in node.values:
        value = evaluate(operand, remote)
        if bool(value) == isinstance(node.op, ast.Or):
            return value
    return value


# ----------------------------------------------------------------------------- inside the sandbox
def _set_limits(memory_bytes: int, cpu_seconds: int, file_bytes: int, processes: int, files: int) -> None:
    import resource

    for name, value in (
        ("RLIMIT_AS", memory_bytes), ("RLIMIT_CPU", cpu_seconds), ("RLIMIT_FSIZE", file_bytes),
        ("RLIMIT_CORE", 0), ("RLIMIT_NPROC", processes), ("RLIMIT_NOFILE", files),
    ):  # fmt: skip
        resource.setrlimit(getattr(resource, name), (value, value))


def _block_network() -> None:
    """The weak mode has no network namespace: refuse sockets at the Python level."""
    import socket

    def _no_network(*args, **kwargs):
        raise OSError("network access is disabled in the sandbox")

    socket.socket = socket.create_connection = socket.socketpair = _no_network


def _close_other_fds(keep: set[int]) -> None:
    for fd in range(3, 1024):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _non_dumpable() -> None:
    """PR_SET_DUMPABLE 0: a same-uid process may not ptrace us or open /proc/<pid>/{mem,fd,environ}."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)


def _plain(value, depth: int = 0):
    """``value`` as built-in data (subclasses and iterators converted), for an honest ``repr``."""
    if depth > 50:
        raise ValueError("value nested too deeply")
    for kind in (bool, int, float, complex, str, bytes):
        if isinstance(value, kind):
            return kind(value)
    if value is None:
        return None
    if isinstance(value, dict):
        return {_plain(k, depth + 1): _plain(v, depth + 1) for k, v in value.items()}
    for kind in (list, tuple, set, frozenset):
        if isinstance(value, kind):
            return kind(_plain(item, depth + 1) for item in value)
    if hasattr(value, "__next__") or isinstance(value, (range, type({}.keys()), type({}.values()))):
        return [_plain(item, depth + 1) for item in value]
    raise TypeError(f"a {type(value).__name__} is not plain data")


def _serve(commands_fd: int, replies_fd: int) -> None:
    """The child: run main.py, then evaluate each expression the parent sends in its globals."""
    import builtins
    import json

    namespace = {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins}
    commands, replies = os.fdopen(commands_fd, "r"), os.fdopen(replies_fd, "w")
    try:
        with open("main.py", encoding="utf-8") as handle:
            exec(compile(handle.read(), "main.py", "exec"), namespace)
    except SystemExit:
        pass
    finally:
        for stream in (sys.stdout, sys.stderr):  # the parent ends the child with SIGKILL: flush what it printed
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - the program may have replaced or closed them
                pass
    for line in commands:
        request = json.loads(line)
        try:
            if "run" in request:
                exec(request["run"], namespace)
                reply = {"value": "None"}
            else:
                reply = {"value": repr(_plain(eval(request["eval"], namespace)))}
        except BaseException as error:  # noqa: BLE001 - the program's errors are answers, not crashes
            reply = {"error": type(error).__name__}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
    os._exit(0)


class _Child:
    """The parent's handle on the child: send an expression, wait (with a deadline) for its value."""

    def __init__(self, commands_fd: int, replies_fd: int, time_limit_s: float):
        self.time_limit_s = time_limit_s
        self.commands, self.replies_fd = os.fdopen(commands_fd, "w"), replies_fd
        self.pending = b""

    def ask(self, request: dict):
        import json
        import select
        import time

        self.commands.write(json.dumps(request) + "\n")
        self.commands.flush()
        deadline = time.monotonic() + self.time_limit_s
        while b"\n" not in self.pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.replies_fd], [], [], remaining)[0]:
                raise TimeoutError("no answer within the time limit")
            chunk = os.read(self.replies_fd, 1 << 16)
            if not chunk or len(self.pending) > _REPLY_LIMIT:
                raise EOFError("the program ended or answered too much")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        reply = json.loads(line)
        if "value" not in reply:
            raise AssertionError(f"raised {reply.get('error')}")
        return ast.literal_eval(reply["value"])


def _judge(child: _Child, imports: list[str], tests: list[ast.expr]) -> bool:
    for statement in imports:
        child.ask({"run": statement})
    return all(bool(evaluate(test, lambda source: child.ask({"eval": source}))) for test in tests)


def _run_asserts(spec_fd: int, verdict_fd: int, time_limit_s: float) -> None:
    """The parent: fork the child first, then read the tests and judge each one."""
    import json
    import signal

    _non_dumpable()
    commands_read, commands_write = os.pipe()
    replies_read, replies_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        _close_other_fds({commands_read, replies_write})
        _serve(commands_read, replies_write)
    os.close(commands_read)
    os.close(replies_write)
    with os.fdopen(spec_fd, "r", encoding="utf-8") as handle:
        spec = json.load(handle)
    child = _Child(commands_write, replies_read, time_limit_s)
    verdicts = os.fdopen(verdict_fd, "w")
    for index, (imports, tests) in enumerate(parse_assert_tests(spec["asserts"])):
        try:
            passed = _judge(child, imports, tests)
        except (TimeoutError, EOFError, BrokenPipeError):
            break  # the child is stuck or gone: every test left fails
        except Exception:  # noqa: BLE001 - a wrong answer of any shape is a failed test
            passed = False
        verdicts.write(f"{spec['nonce']} {index} {int(passed)}\n")
        verdicts.flush()
    verdicts.write(f"{spec['nonce']} done\n")
    verdicts.close()
    os.kill(pid, signal.SIGKILL)


def main(argv: list[str]) -> None:
    memory_bytes, cpu_seconds, file_bytes, processes, files = (int(v) for v in argv[:5])
    mode, kind = argv[5], argv[6]
    _set_limits(memory_bytes, cpu_seconds, file_bytes, processes, files)
    if mode == "weak":
        _block_network()
    if kind == "asserts":
        spec_fd, verdict_fd, time_limit_s = int(argv[7]), int(argv[8]), float(argv[9])
        _close_other_fds({spec_fd, verdict_fd})
        _run_asserts(spec_fd, verdict_fd, time_limit_s)
        return
    _close_other_fds(set())
    import runpy

    sys.argv = ["main.py"]
    runpy.run_path("main.py", run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
