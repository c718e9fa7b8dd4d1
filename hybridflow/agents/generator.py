"""One engine, many agent loops: every conversation's turns share the engine's decode steps.

Each agent loop awaits ``generate(context_ids, max_tokens=...)`` for its next turn. Two ways to
serve them, picked by the engine:

- the native engine (:class:`QueuedTurns`): each turn goes into the engine's
  :class:`~hybridflow.rollout.request_queue.RequestQueue` as it is asked for, a driver thread
  steps the queue, and a turn that arrives while others decode joins at the next decode step; it
  resolves as soon as its own completion ends, so its loop runs its tool while the other turns
  decode on (no turn waits for a batch's longest response);
- other backends (:class:`BatchedTurns`): the requests that arrive together (every loop that is
  not waiting on a tool) go to ``engine.generate`` as one batch, and the requests that arrive
  during an engine call form the next batch; one lock serialises the calls, which run in a
  thread so the event loop (and the tools' time-outs) keep going meanwhile.

A vision-language policy's turns carry their conversation's images (``multi_modal_inputs``): a batch passes
each prompt's to ``engine.generate``; a queued turn is submitted with the engine's encoding of them
(``engine.encode_images``). Text conversations call the engine exactly as without images.

Sampling is reproducible in both: with ``params.seed`` set, a queued turn samples from draws
keyed by (a seed derived from ``params.seed`` and its context tokens, its token index), so the
same seed and the same conversations give the same turns whenever each turn arrives; a batch
is seeded from ``params.seed`` and the number of batches before it, its rows in conversation order.
"""

from __future__ import annotations

import array
import asyncio
import contextvars
import hashlib
import time
from dataclasses import dataclass, replace

import torch

from hybridflow.errors import RolloutError
from hybridflow.rollout import Completion, SamplingParams
from hybridflow.rollout.engine import capabilities_of, image_encoder
from hybridflow.rollout.native import NativeEngine
from hybridflow.rollout.request_queue import RequestQueue
from hybridflow.tools.bounded import calls_in_flight

CONVERSATION: contextvars.ContextVar[int] = contextvars.ContextVar("hybridflow_conversation", default=0)
"""The index of the conversation (the agent loop's row) a turn belongs to; the manager sets it in each loop's task.
A batch's rows are ordered by it: which row samples which draws then does not depend on the order in which the
tools' threads answered."""
READY_TICKS = 4
"""Event-loop turns to wait before sending a batch: lets every loop that is ready submit."""
TOOL_WAIT_S = 0.02
"""Also wait up to this long for tool calls in flight (each runs in its own thread, see
``hybridflow.tools.bounded``): quick tools answer in well under it, and their loops join the batch
(5 ms split batches on a loaded 2-core machine: a thread was not scheduled in time)."""


class TurnGenerator:
    """``await generate(ids, max_tokens=k)`` -> one Completion, decoded beside the other loops' turns.

    Args:
        engine: the rollout engine; a :class:`NativeEngine` serves turns from a request queue.
        params: how every turn samples (``n`` is taken as 1; ``max_tokens`` comes per call).
        max_len: longest context + turn any loop reaches (prompt_length + response_length; a turn is cut there);
            with ``conversations`` it sizes the queue's KV cache. ``None``: the engine's ``max_model_len``.
        conversations: loops that will ask for turns (each has at most one in flight); ``None``: the engine's
            ``max_num_seqs``.
    """

    def __init__(self, engine, params: SamplingParams, *, max_len: int | None = None,
                 conversations: int | None = None):
        self.engine = engine
        self.params = params
        if capabilities_of(engine).steps:
            self.turns = QueuedTurns(engine, params, max_len=max_len, conversations=conversations)
        else:
            self.turns = BatchedTurns(engine, params)

    async def generate(self, prompt_ids: list[int], *, max_tokens: int,
                       multi_modal_inputs: dict | None = None) -> Completion:
        """The next turn after ``prompt_ids``; ``multi_modal_inputs``: the images of a vision-language policy's
        conversation so far (``pixel_values``, ``image_grid_thw``, one entry per image token run of the ids)."""
        images = multi_modal_inputs or None
        return await self.turns.generate(list(prompt_ids), max_tokens=max_tokens, multi_modal_inputs=images)

    def close(self) -> None:
        """Stop serving: turns still queued get an error (a loop that failed ends the rollout)."""
        self.turns.close()


class QueuedTurns:
    """Each turn a request of its own in the native engine's queue, submitted as it is asked for."""

    def __init__(self, engine: NativeEngine, params: SamplingParams, *, max_len: int | None = None,
                 conversations: int | None = None):
        self.params = params
        self.queue = RequestQueue(engine, max_len=max_len, sequences=conversations, keyed_draws=True)
        self.seen: dict[bytes, int] = {}
        """Context digest -> turns asked for with that context so far (rows repeated for n samples)."""
        self.start_scheduled = False

    async def generate(self, prompt_ids: list[int], *, max_tokens: int,
                       multi_modal_inputs: dict | None = None) -> Completion:
        params = replace(self.params, n=1, max_tokens=max_tokens,
                         seed=self.turn_seed(prompt_ids, multi_modal_inputs))
        if multi_modal_inputs is None:  # a text conversation: as ever
            request = self.queue.submit(prompt_ids, params)
        else:
            request = self.queue.submit(prompt_ids, params, images=self.encoded(prompt_ids, multi_modal_inputs))
        if not self.start_scheduled:  # once the loops that are ready now have submitted: one prefill for them
            self.start_scheduled = True
            asyncio.get_running_loop().call_soon(self.start)
        (completion,) = await asyncio.wrap_future(request.future)
        return completion

    def start(self) -> None:
        self.start_scheduled = False
        self.queue.start()

    def encoded(self, prompt_ids: list[int], images: dict):
        """The engine's encoding of a turn's images (its vision tower's, spliced into the prefill)."""
        encode = image_encoder(self.queue.engine)
        if encode is None:
            raise RolloutError(f"{type(self.queue.engine).__name__} cannot decode a conversation with images (it "
                               "has no encode_images): run the vision-language policy with rollout.name=hf")
        return encode([prompt_ids], [images])[0]

    def turn_seed(self, prompt_ids: list[int], images: dict | None = None) -> int | None:
        """The seed of a turn: a hash of ``params.seed``, its context (and images) and how many turns had that
        context before (the samples of one prompt, repeated rows, start from the same context and must differ)."""
        if self.params.seed is None:
            return None
        digest = hashlib.blake2b(array.array("q", prompt_ids).tobytes(), digest_size=16)
        if images is not None:  # two pictures behind the same image tokens are two contexts
            digest.update(torch.as_tensor(images["pixel_values"]).float().numpy().tobytes())
        context = digest.digest()
        occurrence = self.seen.get(context, 0)
        self.seen[context] = occurrence + 1
        key = array.array("q", [self.params.seed % 2**63, occurrence]).tobytes() + context
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") % 2**63

    def close(self) -> None:
        self.queue.close()


@dataclass
class TurnRequest:
    """One turn asked of :class:`BatchedTurns`."""

    prompt_ids: list[int]
    max_tokens: int
    images: dict | None
    """The conversation's images so far (``multi_modal_inputs``), None for a text conversation."""
    future: asyncio.Future
    conversation: int
    """The index of its conversation (``CONVERSATION``)."""


class BatchedTurns:
    """The turns that arrive together as one ``engine.generate`` call (engines without a request queue)."""

    def __init__(self, engine, params: SamplingParams):
        self.engine = engine
        self.params = params
        self.pending: list[TurnRequest] = []
        self.lock = asyncio.Lock()
        self.drain: asyncio.Task | None = None
        self.engine_calls = 0

    async def generate(self, prompt_ids: list[int], *, max_tokens: int,
                       multi_modal_inputs: dict | None = None) -> Completion:
        future = asyncio.get_running_loop().create_future()
        self.pending.append(TurnRequest(prompt_ids, max_tokens, multi_modal_inputs, future, CONVERSATION.get()))
        if self.drain is None:
            self.drain = asyncio.create_task(self._drain())
        return await future

    def close(self) -> None:
        """Nothing to stop: an engine call in flight ends with ``asyncio.run`` (its executor is joined)."""

    async def _drain(self) -> None:
        async with self.lock:
            await self._gather_ready()
            batch, self.pending, self.drain = self.pending, [], None
            batch.sort(key=lambda request: request.conversation)  # not the order in which the tools' threads ran
            try:
                completions = await asyncio.to_thread(self._generate, batch)
            except Exception as err:  # every waiting loop gets the engine's error
                for request in batch:
                    request.future.set_exception(err)
                return
            for request, completion in zip(batch, completions):
                request.future.set_result(cut(completion, request.max_tokens))

    async def _gather_ready(self) -> None:
        """Let the loops that are ready (or whose quick tool calls are about to answer) submit: wait until
        ``READY_TICKS`` event-loop turns in a row have passed with no tool call in flight (calls in flight are
        waited for up to ``TOOL_WAIT_S``). A loop whose call has just answered needs a few turns to ask for its
        next turn, also when its call answers during the first turns of this wait."""
        deadline = time.monotonic() + TOOL_WAIT_S
        quiet = 0
        while quiet < READY_TICKS:
            if calls_in_flight() and time.monotonic() < deadline:
                quiet = 0
                await asyncio.sleep(0.0005)
            else:
                quiet += 1
                await asyncio.sleep(0)

    def _generate(self, batch) -> list[Completion]:
        """One engine call for all requests. An engine that takes params per prompt gets each request's own
        budget (a turn with little budget left stops there and frees its slot); others run the largest budget
        and each completion is cut to its own after. Conversations with images pass them all (one dict or None per
        prompt); a batch of text conversations calls the engine as ever."""
        seed = None if self.params.seed is None else (self.params.seed + 7919 * self.engine_calls) % 2**63
        self.engine_calls += 1
        prompts = [request.prompt_ids for request in batch]
        images = [request.images for request in batch]
        kwargs = {"multi_modal_inputs": images} if any(x is not None for x in images) else {}
        if capabilities_of(self.engine).params_per_prompt:
            params = [replace(self.params, n=1, max_tokens=request.max_tokens, seed=seed) for request in batch]
        else:
            params = replace(self.params, n=1, max_tokens=max(request.max_tokens for request in batch), seed=seed)
        return self.engine.generate(prompts, params, **kwargs)


def cut(completion: Completion, max_tokens: int) -> Completion:
    """``completion`` limited to ``max_tokens`` tokens (finish reason 'length' when cut)."""
    if len(completion.token_ids) <= max_tokens:
        return completion
    logprobs = completion.logprobs[:max_tokens] if completion.logprobs else completion.logprobs
    return replace(completion, token_ids=completion.token_ids[:max_tokens], logprobs=logprobs, finish_reason="length")
