"""Calling a tool's (or an interaction's) method so that it cannot take the run down.

``await call_bounded(method, *args, timeout_s=..., **kwargs)`` runs ``method`` in a daemon
thread of its own -- a coroutine method on an event loop of its own there -- and waits for it
at most ``timeout_s``. So a tool that raises gives :class:`ToolCallError` with its message; a
synchronous tool, or an ``async def`` one that blocks (``time.sleep``, a lock, a busy loop),
gives :class:`ToolCallTimeout` at the deadline while the rollout's event loop goes on. A
thread cannot be killed: a call past its deadline is abandoned (it keeps its thread until it
returns) and counted in :func:`abandoned_calls`.

``timeout_s=None`` still waits at most :data:`CALL_CEILING_S`.

:class:`ToolHealth` counts calls and failures per tool over one batch, so that a tool failing on
every call is said on the console once per batch, not only in the metrics.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

CALL_CEILING_S = 600.0
"""The longest any tool or interaction call is waited for, also with ``multi_turn.tool_timeout_s=null``."""
_abandoned = [0]
_in_flight = [0]


class ToolCallError(Exception):
    """A tool call failed; the message is what the model reads."""


class ToolCallTimeout(ToolCallError):
    """A tool call did not answer within its deadline."""


def calls_in_flight() -> int:
    """Calls started whose caller has not resumed yet (the turn generator waits briefly for them)."""
    return _in_flight[0]


def abandoned_calls() -> int:
    """Calls whose thread was still running at their deadline, in this process so far."""
    return _abandoned[0]


def _settle(future: asyncio.Future, outcome: tuple[bool, object]) -> None:
    if not future.done():
        ok, value = outcome
        future.set_result(value) if ok else future.set_exception(value)


def _in_thread(loop: asyncio.AbstractEventLoop, future: asyncio.Future, method, args, kwargs) -> None:
    try:
        result = method(*args, **kwargs)
        if inspect.isawaitable(result):
            result = asyncio.run(_awaited(result))
        outcome = (True, result)
    except BaseException as error:  # noqa: BLE001 - SystemExit from a tool is its failure, not ours
        outcome = (False, error)
    try:
        loop.call_soon_threadsafe(_settle, future, outcome)
    except RuntimeError:
        pass  # the rollout's loop has ended: nobody waits for this answer any more


async def _awaited(awaitable):
    return await awaitable


async def call_bounded(method, *args, timeout_s: float | None, what: str, **kwargs):
    """``method(*args, **kwargs)`` (sync or async) in its own thread, waited for at most ``timeout_s``.

    Raises:
        ToolCallTimeout: no answer by the deadline. ToolCallError: the method raised.
    """
    limit = CALL_CEILING_S if timeout_s is None else min(float(timeout_s), CALL_CEILING_S)
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    thread = threading.Thread(target=_in_thread, args=(loop, future, method, args, kwargs), daemon=True,
                              name=f"hybridflow-tool-{what}")
    _in_flight[0] += 1
    thread.start()
    try:
        return await asyncio.wait_for(future, timeout=limit)
    except asyncio.TimeoutError as error:
        if future.done() and not future.cancelled():  # the method itself raised TimeoutError
            raise ToolCallError(f"{what} raised TimeoutError: {error}") from error
        _abandoned[0] += 1
        raise ToolCallTimeout(f"{what} did not answer within {limit:g} s") from None
    except Exception as error:  # noqa: BLE001 - any failure of user code becomes a message
        raise ToolCallError(f"{what} raised {type(error).__name__}: {error}") from error
    finally:
        _in_flight[0] -= 1


@dataclass
class ToolHealth:
    """Calls and failures per tool name over one batch, each name's first failure and what a failure costs there
    (a tool's execute: the model sees an error; its calc_reward: the conversation gets no tool reward)."""

    calls: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    first_failure: dict[str, str] = field(default_factory=dict)
    consequence: dict[str, str] = field(default_factory=dict)

    def record(self, name: str, failure: str | None, *,
               consequence: str = "the model only ever sees errors from it") -> None:
        """A call of ``name`` and its failure (None: it worked). Names recorded only when they fail (calc_reward,
        release, interactions) are said on every batch in which they fail."""
        self.calls[name] = self.calls.get(name, 0) + 1
        if failure is not None:
            self.failures[name] = self.failures.get(name, 0) + 1
            self.first_failure.setdefault(name, failure)
            self.consequence.setdefault(name, consequence)

    def report(self) -> list[str]:
        """One console line per tool that failed on every call of the batch; then start over."""
        lines = [f"tool {name!r} failed on all {count} of its calls in this batch (first: "
                 f"{self.first_failure[name]}); {self.consequence[name]}: fix the tool or "
                 "multi_turn.tool_config_path"
                 for name, count in self.calls.items() if self.failures.get(name, 0) == count]  # fmt: skip
        for line in lines:
            logger.warning(line)
        self.calls, self.failures, self.first_failure, self.consequence = {}, {}, {}, {}
        return lines
