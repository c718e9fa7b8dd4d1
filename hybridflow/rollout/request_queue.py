"""One request queue over the native engine: requests join the running batch between decode steps.

A :class:`RequestQueue` holds one :class:`~hybridflow.rollout.native.GenerationRun` and serves
every caller of the native engine from it:

- ``NativeEngine.generate`` submits its prompts and :meth:`~RequestQueue.drain` s the queue in
  its own thread;
- a :class:`~hybridflow.rollout.streaming.StreamingSession` (the async trainers' partial rollouts)
  submits prompts and calls :meth:`~RequestQueue.step` itself, between which it may pause the
  run for a weight sync;
- the agent loops (``hybridflow.agents.generator.TurnGenerator``) submit each turn from an
  asyncio event loop as it becomes ready, and a driver thread (:meth:`~RequestQueue.start`)
  steps the run while anything is queued or decoding.

Each step takes what was submitted since the last one (a thread-safe inbox), admits waiting
samples into free rows (``StepEngine.admit``: prefill, first token) and decodes one token
for every live row (``StepEngine.step``). A request whose samples have all ended is
resolved at once: its ``concurrent.futures.Future`` gets its ``n`` completions, in output
order, while the other rows decode on. So a turn that arrives while a batch is decoding joins
at the next step instead of waiting for that batch's longest response, and a short turn leaves
without waiting for a long one (with the engine's ``overlap_steps``, a step's tokens are read back during the next
step, so a request is resolved one step after its last sample ends). If a step raises, every request in the queue (waiting, decoding
or still in the inbox) gets the error; the run is emptied and the queue serves later requests.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from hybridflow.errors import RolloutError
from hybridflow.rollout.generation_run import GenerationRun, PendingPrompt, Sequence
from hybridflow.rollout.types import Completion, SamplingParams, validate_prompts
from hybridflow.rollout.vision_prefill import PromptImages


class StepEngine(Protocol):
    """What a :class:`RequestQueue` needs of its engine (the native engine is one): runs over its KV cache and the
    two halves of one engine step. The engine builds its ``generate`` on this queue, so the queue knows it only
    through this protocol."""

    max_model_len: int
    max_num_seqs: int
    preemptions: int

    def new_run(self, *, sequences: int, max_len: int, seed: int | None) -> GenerationRun:
        """An empty run over a cache reserved for ``sequences`` sequences of ``max_len`` positions."""

    def close_run(self, run: GenerationRun) -> None:
        """``run`` no longer uses the KV cache."""

    def check_prompt_images(self, prompt_ids: list[int]) -> None:
        """Refuse a prompt whose image tokens have no images (vision-language models; nothing to check otherwise)."""

    def admit(self, run: GenerationRun) -> None:
        """Prefill waiting prompts and move their samples into the batch."""

    def step(self, run: GenerationRun) -> None:
        """One decode step over every live row."""


@dataclass
class Request:
    """``params.n`` completions of one prompt, delivered together through ``future``."""

    prompt_ids: list[int]
    params: SamplingParams
    future: Future = field(default_factory=Future)
    index: int = -1
    """Its prompt index in the run (``Sequence.prompt_index``), set when a step takes it from the inbox."""
    outputs: dict[int, Sequence] = field(default_factory=dict)
    """Output index -> its finished sequence."""
    images: PromptImages | None = None
    """A vision-language prompt's images (``NativeEngine.encode_images``)."""


def settle(future: Future, *, result=None, error: BaseException | None = None) -> None:
    """Resolve ``future`` unless its waiter cancelled it (then nobody reads it)."""
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except InvalidStateError:
        pass


def completion_of(sequence: Sequence) -> Completion:
    """The :class:`Completion` of a finished sequence (log-probs only when its params ask for them)."""
    return Completion(sequence.token_ids, sequence.logprobs if sequence.params.logprobs else None,
                      sequence.finish_reason, sequence.prompt_index)


class RequestQueue:
    """Requests with their own ``SamplingParams`` over one generation run of ``engine``.

    Args:
        engine: the native engine, or any :class:`StepEngine` (its KV cache serves this queue; one queue or ``generate`` call at a time).
        max_len: longest prompt + response a request may reach (sizes the cache rows); ``None`` = the engine's
            ``max_model_len``. A request is cut there (finish reason 'length').
        sequences: most samples in the queue at once that the cache is reserved for (at most ``max_num_seqs``
            decode together; more wait for a row); ``None`` = ``max_num_seqs``.
        seed: seeds the run's generator (draws in row order: ``generate`` and streaming sessions).
        keyed_draws: draw each token from (the request's seed, its sample index, its token index) instead
            (:func:`~hybridflow.rollout.sampler.keyed_uniform`), so what a request samples does not depend on
            when it arrived or which requests shared its steps; a request without a seed gets a random one.
    """

    def __init__(self, engine: StepEngine, *, max_len: int | None = None, sequences: int | None = None,
                 seed: int | None = None, keyed_draws: bool = False):
        self.engine = engine
        self.max_len = min(engine.max_model_len, max_len or engine.max_model_len)
        self.run = engine.new_run(sequences=sequences or engine.max_num_seqs, max_len=self.max_len, seed=seed)
        self.run.keyed_draws = keyed_draws
        self.requests: dict[int, Request] = {}
        """The requests taken from the inbox whose samples have not all ended, by prompt index."""
        self.decode_steps = 0
        self.decoded_rows = 0
        """Rows summed over decode steps: ``decoded_rows / decode_steps`` is the mean batch occupancy."""
        self._next_index = 0
        self._inbox: list[Request] = []
        self._lock = threading.Lock()
        self._driver: threading.Thread | None = None
        self._preemptions_counted = 0
        self._closed = False

    @property
    def idle(self) -> bool:
        """Nothing in the inbox, waiting or decoding (a step in flight counts as decoding)."""
        return not self._inbox and not self.run.waiting and not self.run.live and self.run.in_flight is None

    def submit(self, prompt_ids: list[int], params: SamplingParams, *, images: PromptImages | None = None) -> Request:
        """Queue ``params.n`` samples of one prompt (from any thread); they join at the next step. A
        vision-language prompt's ``images`` come from ``NativeEngine.encode_images``."""
        validate_prompts([prompt_ids], max_model_len=self.engine.max_model_len)
        if images is None:  # image tokens need their images
            self.engine.check_prompt_images(prompt_ids)
        if len(prompt_ids) >= self.max_len:
            raise RolloutError(f"a prompt of {len(prompt_ids)} tokens leaves no room to generate within this queue's "
                               f"max_len={self.max_len}; open the queue with a larger max_len (prompt + response; the agent "
                               "loops' queue takes rollout.prompt_length + rollout.response_length)")
        if self.run.keyed_draws and params.seed is None:
            params = replace(params, seed=int(torch.randint(2**62, (1,)).item()))
        request = Request(list(prompt_ids), params, images=images)
        with self._lock:
            if self._closed:
                raise RolloutError("submit() on a closed request queue; open a new one for the next rollout")
            self._inbox.append(request)
        return request

    def new_index(self) -> int:
        """A prompt index no request of this queue has (for a sequence resumed from elsewhere)."""
        with self._lock:
            index, self._next_index = self._next_index, self._next_index + 1
        return index

    def step(self) -> list[Sequence]:
        """Take the inbox, admit waiting samples and decode one token for every live row; returns the sequences
        that ended (each request whose samples have all ended is resolved). On an error every request in the
        queue gets it, and it is raised."""
        try:
            self.take_inbox()
            self.engine.admit(self.run)
            if self.run.live:
                self.decoded_rows += len(self.run.live)
                self.decode_steps += 1
            if self.run.live or self.run.in_flight is not None:
                self.engine.step(self.run)
        except BaseException as error:
            self._fail(error)
            raise
        finally:
            self._count_preemptions()
        return self._collect()

    def land(self) -> list[Sequence]:
        """Read back the decode step still in flight (the engine's ``overlap_steps``), if any; returns the sequences
        that ended in it (their requests resolved as :meth:`step` does). Before a pause: the host's records are then
        exact."""
        try:
            self.run.land_in_flight()
        except BaseException as error:
            self._fail(error)
            raise
        return self._collect()

    def _collect(self) -> list[Sequence]:
        """Take the run's finished sequences and record them (each request whose samples have all ended resolved)."""
        finished, self.run.done = self.run.done, []
        for sequence in finished:
            self._record(sequence)
        return finished

    def drain(self) -> None:
        """Step in this thread until nothing is queued or decoding."""
        while not self.idle:
            self.step()

    def start(self) -> None:
        """Make sure a driver thread steps the queue: it runs while anything is queued or decoding, then ends
        (the next ``start`` after a ``submit`` begins another)."""
        with self._lock:
            if self._driver is None:
                self._driver = threading.Thread(target=self._drive, name="hybridflow-request-queue", daemon=True)
                self._driver.start()

    def close(self) -> None:
        """Stop: wait for the driver thread's step to end, then give every request still queued an error; the
        engine's KV cache is then no longer held by this queue (``NativeEngine.release_kv_cache`` may free it)."""
        with self._lock:
            self._closed, driver = True, self._driver
        if driver is not None:
            driver.join()
        if not self.idle or self.requests:
            self._fail(RolloutError("the request queue was closed before this request ended (another agent loop "
                                    "or the rollout failed)"))
        self.engine.close_run(self.run)

    def _drive(self) -> None:
        while True:
            with self._lock:  # decided under the lock that submit takes: no request is left behind
                if self.idle or self._closed:
                    self._driver = None
                    return
            try:
                self.step()
            except BaseException:  # noqa: BLE001 - step gave the error to every request; serve later ones
                continue

    def take_inbox(self) -> None:
        """Move the submitted requests into the run's waiting queue, in order (each step does it first)."""
        with self._lock:
            arrived, self._inbox = self._inbox, []
            for request in arrived:
                request.index, self._next_index = self._next_index, self._next_index + 1
        for request in arrived:
            self.requests[request.index] = request
            self.run.waiting.append(PendingPrompt(request.index, request.prompt_ids, request.params.n, request.params,
                                                  images=request.images))

    def _record(self, sequence: Sequence) -> None:
        request = self.requests.get(sequence.prompt_index)
        if request is None:  # resumed from another queue (a streaming session's restored rollout)
            return
        request.outputs[sequence.output_index] = sequence
        if len(request.outputs) == request.params.n:
            del self.requests[request.index]
            self.run.forget(request.params)
            settle(request.future, result=[completion_of(request.outputs[i]) for i in range(request.params.n)])

    def _fail(self, error: BaseException) -> None:
        """Give ``error`` to every request in the queue and empty the run (its blocks freed)."""
        with self._lock:
            failed, self._inbox = [*self.requests.values(), *self._inbox], []
        self.requests = {}
        try:
            self.run.release()
        except Exception:  # noqa: BLE001 - the step broke mid-way; the waiters must hear of it regardless
            pass
        self.run.waiting.clear()
        self.run.done = []
        for request in failed:
            settle(request.future, error=error)

    def _count_preemptions(self) -> None:
        self.engine.preemptions += self.run.preemptions - self._preemptions_counted
        self._preemptions_counted = self.run.preemptions
