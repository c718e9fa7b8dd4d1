"""The script that runs inside the code sandbox: limits, then the program or the program server.

Its text is what the sandboxed interpreter runs with ``python -I -S -c`` (standard library only;
``hybridflow`` is not visible in there). The host imports it too, for the wire format
(:func:`encode` / :func:`decode`), which is the same on both sides.

``argv``: ``memory_bytes cpu_seconds file_bytes processes files mode kind [requests_fd
replies_fd]``. ``kind`` is ``program`` (run ``main.py`` as ``__main__``: stdin/stdout tests)
or ``serve`` (assert tests, judged on the host by :mod:`hybridflow.rewards.sandbox_judge`).

The server holds no test and judges nothing. It runs ``main.py``, says ``ready``, then answers
requests, one JSON line each, from the host:

- ``{"names": [...]}``: which of these names the program defines, answered ``{"names": {name:
  {"fn": 1} for a callable, {"v": <encoded>} for plain data}}``;
- ``{"call": name, "args": [...], "kwargs": {...}}``: the program's own function ``name``
  called on the (plain, freshly decoded) arguments; the reply is the returned value.

A reply is ``{"v": <encoded>}`` or ``{"error": "<exception type>"}``. Values cross the pipe only
in the wire format below, and :func:`decode` builds fresh built-in objects from it, so no object
the program made ever reaches the judge: whatever this process answers is data, never behaviour.
"""

from __future__ import annotations

import collections
import os
import sys

MAX_DEPTH = 64
MAX_ITEMS = 1_000_000
_SMALL_INT = 1 << 62
_ORDERED_DICT, _COUNTER, _DEFAULT_DICT = collections.OrderedDict, collections.Counter, collections.defaultdict


class NotPlainData(TypeError):
    """A value that is not plain data (or is nested or sized past the bounds): a failed test."""


# ------------------------------------------------------------------------------------ wire format
class _Budget:
    def __init__(self):
        self.items = 0

    def take(self, depth: int) -> None:
        self.items += 1
        if depth > MAX_DEPTH or self.items > MAX_ITEMS:
            raise NotPlainData(f"a value nested deeper than {MAX_DEPTH} or larger than {MAX_ITEMS} items")


def _encode_scalar(value):
    """JSON for an exact None/bool/int/float/str/bytes/complex, or NotImplemented."""
    kind = type(value)
    if value is None or kind in (bool, str, float):
        return value
    if kind is int:
        return value if -_SMALL_INT < value < _SMALL_INT else {"i": format(value, "x")}
    if kind is bytes:
        return {"b": value.hex()}
    if kind is complex:
        return {"c": [value.real, value.imag]}
    return NotImplemented


def _encode(value, budget: _Budget, depth: int):
    budget.take(depth)
    scalar = _encode_scalar(value)
    if scalar is not NotImplemented:
        return scalar
    kind = type(value)
    tag = {list: "l", tuple: "t", set: "s", frozenset: "f"}.get(kind)
    if tag is not None:
        return {tag: [_encode(item, budget, depth + 1) for item in value]}
    tag = {dict: "d", _DEFAULT_DICT: "d", _ORDERED_DICT: "o", _COUNTER: "C"}.get(kind)
    if tag is not None:  # dict.items, not the object's own: a subclass's overrides are not called
        return {tag: [[_encode(k, budget, depth + 1), _encode(v, budget, depth + 1)] for k, v in dict.items(value)]}
    raise NotPlainData(f"a {kind.__name__} is not plain data")


def encode(value):
    """``value`` as JSON-able wire data, walked by exact type (``type(x) is int``, not isinstance).

    Plain data is None, bool, int, float, complex, str, bytes, and list, tuple, set, frozenset,
    dict (and the standard ``Counter``, ``OrderedDict``, ``defaultdict``) built from those. A
    subclass of any of them (an ``int`` whose ``__eq__`` says True), a generator, a function or
    any other object raises :class:`NotPlainData`.
    """
    return _encode(value, _Budget(), 0)


_CONTAINERS = {"l": list, "t": tuple, "s": set, "f": frozenset}
_MAPPINGS = {"d": dict, "o": _ORDERED_DICT, "C": lambda pairs: _COUNTER(dict(pairs))}


def _decode(data, budget: _Budget, depth: int):
    budget.take(depth)
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is not dict or len(data) != 1:
        raise NotPlainData("malformed wire data")
    [(tag, body)] = data.items()
    if tag in _CONTAINERS and type(body) is list:
        return _CONTAINERS[tag](_decode(item, budget, depth + 1) for item in body)
    if tag in _MAPPINGS and type(body) is list and all(type(p) is list and len(p) == 2 for p in body):
        return _MAPPINGS[tag]((_decode(k, budget, depth + 1), _decode(v, budget, depth + 1)) for k, v in body)
    if tag == "i" and type(body) is str:
        return int(body, 16)
    if tag == "b" and type(body) is str:
        return bytes.fromhex(body)
    if tag == "c" and type(body) is list and len(body) == 2 and all(type(x) in (int, float) for x in body):
        return complex(*body)
    raise NotPlainData("malformed wire data")


def decode(data):
    """Fresh built-in objects from wire data (``json.loads`` output); raises :class:`NotPlainData`
    on anything else (an unhashable set member included)."""
    try:
        return _decode(data, _Budget(), 0)
    except (TypeError, ValueError) as error:  # an unhashable key, bad hex
        raise NotPlainData(f"malformed wire data: {error}") from None


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


def _run_module(namespace: dict) -> None:
    """Run main.py in ``namespace``; ``SystemExit`` ends only the module body."""
    try:
        with open("main.py", encoding="utf-8") as handle:
            exec(compile(handle.read(), "main.py", "exec"), namespace)
    except SystemExit:
        pass  # the functions defined so far are still tested; exiting passes nothing
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - the program may have replaced or closed them
                pass


def _answer(request: dict, namespace: dict) -> dict:
    if "names" in request:
        found = {}
        for name in request["names"]:
            if name in namespace:
                value = namespace[name]
                try:
                    found[name] = {"fn": 1} if callable(value) else {"v": encode(value)}
                except NotPlainData:
                    pass  # an object the test may not use: the name stays undefined there
        return {"names": found}
    args = decode(request["args"])
    kwargs = decode(request["kwargs"])
    return {"v": encode(namespace[request["call"]](*args, **kwargs))}


def _serve(requests_fd: int, replies_fd: int) -> None:
    """Run main.py, say ready, then answer each request line with one reply line."""
    import builtins
    import json

    dumps, loads = json.dumps, json.loads  # taken before the program can replace them
    requests, replies = os.fdopen(requests_fd, "r"), os.fdopen(replies_fd, "w")
    namespace = {"__name__": "__main__", "__file__": "main.py", "__builtins__": builtins}
    _run_module(namespace)
    replies.write('{"ready": 1}\n')
    replies.flush()
    for line in requests:
        try:
            reply = _answer(loads(line), namespace)
        except BaseException as error:  # noqa: BLE001 - the program's errors are answers, not crashes
            reply = {"error": type(error).__name__}
        replies.write(dumps(reply) + "\n")
        replies.flush()
    os._exit(0)


def _site_builtins() -> None:
    """``exit()`` and ``quit()``, which ``site`` adds and ``python -S`` (no site: no .pth files or
    sitecustomize run, the standard library only, ~10 ms less a start) leaves out."""
    import builtins

    def exit(code=None):  # noqa: A001 - the builtin's own name
        raise SystemExit(code)

    builtins.exit = builtins.quit = exit


def main(argv: list[str]) -> None:
    _site_builtins()
    memory_bytes, cpu_seconds, file_bytes, processes, files = (int(v) for v in argv[:5])
    mode, kind = argv[5], argv[6]
    _set_limits(memory_bytes, cpu_seconds, file_bytes, processes, files)
    if mode == "weak":
        _block_network()
    if kind == "serve":
        requests_fd, replies_fd = int(argv[7]), int(argv[8])
        _close_other_fds({requests_fd, replies_fd})
        _serve(requests_fd, replies_fd)
        return
    _close_other_fds(set())
    import runpy

    sys.argv = ["main.py"]
    runpy.run_path("main.py", run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
