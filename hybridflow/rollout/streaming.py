"""Streaming rollout: continuous batching across calls, completions as they end, partial rollout.

``NativeEngine.generate`` takes a batch and returns when its longest response ends, so
the tail steps of a batch run with few live rows. A :class:`StreamingSession` keeps one
generation running between calls instead:

- ``submit`` adds prompts while others are still decoding; they join the batch at the
  next ``step`` (the tail of one batch carries the next batch's sequences);
- ``step`` runs one admit + decode step and returns the completions that ended in it, so
  a completion leaves as soon as it ends;
- ``pause`` takes every in-flight sequence out of the engine (a *partial rollout*: its
  prompt, its tokens so far and their behaviour log-probs), ``update_weights`` loads new
  weights, and ``resume`` puts the paused sequences back: each one is prefilled from its
  prompt plus its tokens so far and continues from the exact token where it stopped.

Every token carries the log-probability it was sampled with (the behaviour policy) and
the version of the weights that sampled it, so an off-policy trainer can correct for it.

The session is a :class:`~hybridflow.rollout.request_queue.RequestQueue` that its caller steps,
as ``generate`` is one that it drains: one code path admits and decodes for both. They share the
engine's KV cache: use one at a time, and ``close`` a session when done with it (the engine keeps its KV cache
for an open session, even through a trainer's ``free_cache_engine`` release).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field


from hybridflow.errors import RolloutError
from hybridflow.rollout.generation_run import GenerationRun, PendingPrompt, Sequence
from hybridflow.rollout.request_queue import RequestQueue
from hybridflow.rollout.types import SamplingParams, validate_prompts


@dataclass
class PausedSequence:
    """An unfinished response taken out of the engine by ``pause``.

    ``logprobs[i]`` is the behaviour log-prob of ``token_ids[i]``; ``weight_versions[i]``
    is the weight version that sampled it.
    """

    request_id: Hashable
    output_index: int
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    weight_versions: list[int]


@dataclass
class StreamedCompletion(PausedSequence):
    """One finished response (more than one weight version after a partial rollout)."""

    finish_reason: str = "stop"


@dataclass
class _Request:
    request_id: Hashable
    prompt_ids: list[int]
    versions: dict[int, list[int]] = field(default_factory=dict)
    """output index -> weight version of each token generated before the last resume."""
    finished: int = 0


class StreamingSession:
    """One long-running generation over a :class:`NativeEngine`.

    Args:
        engine: the native engine (its model, decoder and KV cache are used).
        params: sampling parameters for every request (``n`` samples per prompt).
        max_prompt_length: longest prompt that will be submitted (sizes the KV cache).
        weight_version: the version of the weights loaded now.
    """

    def __init__(self, engine, params: SamplingParams, *, max_prompt_length: int,
                 weight_version: int = 0):
        if not params.logprobs:
            raise RolloutError("a streaming session records behaviour log-probs; pass SamplingParams(logprobs=True)")
        self.engine = engine
        self.params = params
        self.weight_version = weight_version
        self.max_prompt_length = max_prompt_length
        self.queue = RequestQueue(engine, max_len=max_prompt_length + params.max_tokens, seed=params.seed)
        self.requests: dict[int, _Request] = {}
        self.ended: list[StreamedCompletion] = []
        """Completions that ended in the step in flight at a ``pause`` (recorded with the weights that sampled them):
        the next ``step`` returns them first."""

    @property
    def run(self) -> GenerationRun:
        return self.queue.run

    @property
    def idle(self) -> bool:
        """Nothing is waiting or decoding, and every completion was returned."""
        return self.queue.idle and not self.ended

    @property
    def live_request_ids(self) -> list[Hashable]:
        """The request of each sequence decoding now, row by row."""
        return [self.requests[s.prompt_index].request_id for s in self.run.live]

    def submit(self, request_id: Hashable, prompt_ids: list[int]) -> None:
        """Queue ``params.n`` samples of one prompt; they join the batch as rows and blocks free up."""
        validate_prompts([prompt_ids], max_model_len=self.engine.max_model_len)
        if len(prompt_ids) > self.max_prompt_length:
            raise RolloutError(f"prompt of {len(prompt_ids)} tokens is longer than the session's max_prompt_length "
                               f"{self.max_prompt_length}; open the session with a larger max_prompt_length")
        request = self.queue.submit(prompt_ids, self.params)
        self.queue.take_inbox()  # waiting now, as in the order of calls
        self.requests[request.index] = _Request(request_id, list(prompt_ids))

    def step(self) -> list[StreamedCompletion]:
        """Admit waiting samples, decode one token for every live one, and
        return the completions that ended."""
        ended, self.ended = self.ended, []
        return ended + [self._finish(sequence) for sequence in self.queue.step()]

    def stream(self) -> Iterator[StreamedCompletion]:
        """Step until idle, yielding each completion as it ends."""
        while not self.idle:
            yield from self.step()

    def pause(self) -> list[PausedSequence]:
        """Take every in-flight sequence out of the engine (its blocks freed); waiting prompts stay queued
        (their prefill is dropped, it was computed with the current weights). The step in flight, if any, lands
        first: what ended in it is returned by the next ``step``."""
        self.ended += [self._finish(sequence) for sequence in self.queue.land()]
        return [self._paused(sequence) for sequence in self.run.release()]

    def close(self) -> None:
        """End the session: sequences still decoding or waiting are dropped (``pause`` first to keep them), and the
        engine's KV cache is no longer held by it (until then ``NativeEngine.release_kv_cache`` refuses to free
        it: this session's run would go on writing into it)."""
        self.queue.close()

    def update_weights(self, named_tensors, *, version: int) -> None:
        """Load new weights; only between ``pause`` (or a drained session) and ``resume``."""
        if self.run.live:
            raise RolloutError("update_weights() while sequences are decoding; call pause() first "
                               "(or step until idle) so no sequence mixes weights within one step")
        self.engine.load_weights(named_tensors)
        self.weights_reloaded(version=version)

    def weights_reloaded(self, *, version: int) -> None:
        """The engine's weights were replaced from outside (a trainer's weight sync while this session was
        paused): waiting prompts are prefilled again and new tokens carry ``version``."""
        if self.run.live:
            raise RolloutError("the weights changed while sequences were decoding; pause() the session first")
        for pending in self.run.waiting:
            pending.drop_prefill()
        self.weight_version = version

    def resume(self, paused: list[PausedSequence]) -> None:
        """Put paused sequences back ahead of waiting prompts; each continues from its last token."""
        for item in reversed(paused):
            index = self._index_of(item)
            sequence = Sequence(index, item.output_index, len(item.prompt_ids), self.params,
                                token_ids=list(item.token_ids),
                                prompt_ids=list(item.prompt_ids),
                                logprobs=list(item.logprobs))
            self.requests[index].versions[item.output_index] = list(item.weight_versions)
            self.run.waiting.appendleft(
                PendingPrompt(index, list(item.prompt_ids) + list(item.token_ids), remaining=1, params=self.params,
                              resumed=sequence))

    def _index_of(self, item: PausedSequence) -> int:
        for index, request in self.requests.items():
            if request.request_id == item.request_id and request.prompt_ids == item.prompt_ids:
                return index
        index = self.queue.new_index()  # paused in another session (e.g. restored from a checkpoint)
        self.requests[index] = _Request(item.request_id, list(item.prompt_ids))
        return index

    def _versions(self, sequence: Sequence) -> list[int]:
        """Weight version of each token: earlier segments as recorded, the rest the current one."""
        earlier = self.requests[sequence.prompt_index].versions.get(sequence.output_index, [])
        return earlier + [self.weight_version] * (len(sequence.token_ids) - len(earlier))

    def _paused(self, sequence: Sequence) -> PausedSequence:
        request = self.requests[sequence.prompt_index]
        return PausedSequence(request.request_id, sequence.output_index, request.prompt_ids, list(sequence.token_ids),
                              list(sequence.logprobs), self._versions(sequence))

    def _finish(self, sequence: Sequence) -> StreamedCompletion:
        request = self.requests[sequence.prompt_index]
        versions = self._versions(sequence)
        request.versions.pop(sequence.output_index, None)
        request.finished += 1
        if request.finished == self.params.n:
            del self.requests[sequence.prompt_index]
        return StreamedCompletion(request.request_id, sequence.output_index, request.prompt_ids, sequence.token_ids,
                                  sequence.logprobs, versions, finish_reason=sequence.finish_reason)
