"""One engine, many agent loops: the turns of every conversation in flight are batched.

Each agent loop awaits ``generate(context_ids, max_tokens=...)`` for its next turn. The
requests that arrive together (every loop that is not waiting on a tool) go to the engine
as one batch, so a step's rollouts decode together turn after turn while slow tools run in
threads; requests that arrive during an engine call form the next batch. The engine is
synchronous and not re-entrant, so one lock serialises the calls; it runs in a thread so the
event loop (and the tools' time-outs) keep going meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from hybridflow.rollout import Completion, SamplingParams
from hybridflow.tools.bounded import calls_in_flight

READY_TICKS = 4
"""Event-loop turns to wait before sending a batch: lets every loop that is ready submit."""
TOOL_WAIT_S = 0.02
"""Also wait up to this long for tool calls in flight (each runs in its own thread, see
``hybridflow.tools.bounded``): quick tools answer in well under it, and their loops join the batch
(5 ms split batches on a loaded 2-core machine: a thread was not scheduled in time)."""


class TurnGenerator:
    """``await generate(ids, max_tokens=k)`` -> one Completion, batched with the other loops' turns."""

    def __init__(self, engine, params: SamplingParams):
        self.engine = engine
        self.params = params
        self.pending: list[tuple[list[int], int, asyncio.Future]] = []
        self.lock = asyncio.Lock()
        self.drain: asyncio.Task | None = None
        self.engine_calls = 0

    async def generate(self, prompt_ids: list[int], *, max_tokens: int) -> Completion:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((list(prompt_ids), max_tokens, future))
        if self.drain is None:
            self.drain = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        async with self.lock:
            await self._gather_ready()
            batch, self.pending, self.drain = self.pending, [], None
            try:
                completions = await asyncio.to_thread(self._generate, batch)
            except Exception as err:  # every waiting loop gets the engine's error
                for *_, future in batch:
                    future.set_exception(err)
                return
            for (_, max_tokens, future), completion in zip(batch, completions):
                future.set_result(cut(completion, max_tokens))

    async def _gather_ready(self) -> None:
        """Let the loops that are ready (or whose quick tool calls are about to answer) submit."""
        for _ in range(READY_TICKS):
            await asyncio.sleep(0)
        deadline = time.monotonic() + TOOL_WAIT_S
        if not calls_in_flight():
            return
        while calls_in_flight() and time.monotonic() < deadline:
            await asyncio.sleep(0.0005)
        for _ in range(READY_TICKS):
            await asyncio.sleep(0)

    def _generate(self, batch) -> list[Completion]:
        """One engine call for all requests. The native engine takes each request's own budget (a turn
        with little budget left stops there and frees its slot); other backends run the largest budget
        and each completion is cut to its own after."""
        seed = None if self.params.seed is None else (self.params.seed + 7919 * self.engine_calls) % 2**63
        self.engine_calls += 1
        prompts = [ids for ids, _, _ in batch]
        if getattr(self.engine, "takes_params_per_prompt", False):
            return self.engine.generate(prompts, [replace(self.params, n=1, max_tokens=m, seed=seed) for _, m, _ in batch])
        return self.engine.generate(prompts, replace(self.params, n=1, max_tokens=max(m for _, m, _ in batch), seed=seed))


def cut(completion: Completion, max_tokens: int) -> Completion:
    """``completion`` limited to ``max_tokens`` tokens (finish reason 'length' when cut)."""
    if len(completion.token_ids) <= max_tokens:
        return completion
    logprobs = completion.logprobs[:max_tokens] if completion.logprobs else completion.logprobs
    return replace(completion, token_ids=completion.token_ids[:max_tokens], logprobs=logprobs, finish_reason="length")
