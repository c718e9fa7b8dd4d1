"""The request queue: requests join a running batch between decode steps, from any thread; an engine error reaches
every waiting request; keyed draws make a request's tokens independent of its batch mates."""

from __future__ import annotations

import threading

import pytest

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.native import NativeEngine
from hybridflow.rollout.request_queue import RequestQueue
from tests.rollout.conftest import chat_prompts

HANG_GUARD_S = 120
"""Longest wait for another thread (a missed wake-up fails the test instead of hanging it)."""


class SteppedEngine(NativeEngine):
    """The native engine recording each decode step's rows (prompt indices); ``on_step(n)`` runs before step ``n``
    (counting from 1) decodes, in the thread that steps."""

    def __init__(self, *args, on_step=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.rows: list[list[int]] = []
        self.on_step = on_step or (lambda step: None)

    def _step(self, run):
        self.rows.append([s.prompt_index for s in run.live])
        self.on_step(len(self.rows))
        super()._step(run)

    def steps_of(self, index: int) -> list[int]:
        return [step for step, rows in enumerate(self.rows, start=1) if index in rows]


class Gate:
    """An ``on_step`` that holds the stepping thread before step ``at`` until ``resume`` is set (what the test
    submits meanwhile waits in the inbox), then raises ``error`` if one is given."""

    def __init__(self, at: int, *, error: Exception | None = None):
        self.at, self.error = at, error
        self.held, self.resume = threading.Event(), threading.Event()

    def __call__(self, step: int) -> None:
        if step == self.at:
            self.held.set()
            assert self.resume.wait(HANG_GUARD_S)
            if self.error is not None:
                raise self.error


def params(max_tokens: int, seed: int = 0, n: int = 1) -> SamplingParams:
    return SamplingParams(n=n, temperature=1.0, max_tokens=max_tokens, seed=seed, ignore_eos=True)


def test_a_request_submitted_from_another_thread_joins_the_running_batch_at_the_next_step(tiny_llama):
    """The driver thread decodes a 40-token request; step 5 is held until another thread has submitted a second
    request, which must decode from step 6 (not after the first ends) and end first."""
    model, tokenizer = tiny_llama
    gate = Gate(5)
    engine = SteppedEngine(model, tokenizer, on_step=gate)
    queue = RequestQueue(engine)
    long_prompt, short_prompt = chat_prompts(tokenizer)[:2]
    first = queue.submit(long_prompt, params(40))
    queue.start()
    assert gate.held.wait(HANG_GUARD_S)
    second = queue.submit(short_prompt, params(6))
    gate.resume.set()
    assert [len(c.token_ids) for c in second.future.result(HANG_GUARD_S)] == [6]
    assert [len(c.token_ids) for c in first.future.result(HANG_GUARD_S)] == [40]
    queue.close()
    assert engine.steps_of(1) == [6, 7, 8, 9, 10]  # waited for no step but the one running; 5 steps + admission
    assert engine.steps_of(0) == list(range(1, 40))
    assert queue.decode_steps == 39 and queue.decoded_rows == 39 + 5


def test_an_engine_error_reaches_the_decoding_the_waiting_and_the_just_submitted_requests(tiny_llama):
    model, tokenizer = tiny_llama
    gate = Gate(3, error=RuntimeError("device lost"))
    engine = SteppedEngine(model, tokenizer, max_num_seqs=2, on_step=gate)
    queue = RequestQueue(engine)
    prompts = chat_prompts(tokenizer)
    requests = [queue.submit(p, params(20)) for p in prompts]  # 4 requests, 2 rows: 2 decode, 2 wait
    queue.start()
    assert gate.held.wait(HANG_GUARD_S)
    requests.append(queue.submit(prompts[0], params(20)))  # still in the inbox when the step fails
    gate.resume.set()
    for request in requests:
        with pytest.raises(RuntimeError, match="device lost"):
            request.future.result(HANG_GUARD_S)
    assert queue.requests == {} and not queue.run.live and not queue.run.waiting
    again = queue.submit(prompts[1], params(4))  # the queue serves on
    queue.start()
    assert len(again.future.result(HANG_GUARD_S)[0].token_ids) == 4
    queue.close()


def tokens_alone_and_in_company(model, tokenizer, *, keyed: bool, **engine_kwargs):
    """The tokens of request 0's three samples when it decodes alone, and when three other requests with other
    lengths share (and join in the middle of) its steps; and the preemptions in company."""
    prompts = chat_prompts(tokenizer)
    alone = RequestQueue(NativeEngine(model, tokenizer, **engine_kwargs), max_len=64, keyed_draws=keyed)
    request = alone.submit(prompts[0], params(24, seed=5, n=3))
    alone.drain()
    crowd = RequestQueue(NativeEngine(model, tokenizer, **engine_kwargs), max_len=64, keyed_draws=keyed)
    crowd.submit(prompts[1], params(9, seed=6))
    crowd.step()
    crowd.step()
    shared = crowd.submit(prompts[0], params(24, seed=5, n=3))
    crowd.submit(prompts[2], params(30, seed=7))
    crowd.submit(prompts[3], params(3, seed=8))
    crowd.drain()
    samples = [[c.token_ids for c in r.future.result()] for r in (request, shared)]
    return *samples, crowd.engine.preemptions


def test_keyed_draws_give_a_request_the_same_tokens_whatever_shares_its_steps(tiny_llama):
    model, tokenizer = tiny_llama
    alone, shared, _ = tokens_alone_and_in_company(model, tokenizer, keyed=True)
    assert alone == shared and alone[0] != alone[1]  # the samples differ, each the same in company
    alone, shared, _ = tokens_alone_and_in_company(model, tokenizer, keyed=False)
    assert alone != shared  # the run's generator in row order: the draws depend on the batch


def test_keyed_draws_survive_preemption(tiny_llama):
    """With 6 blocks (a sequence takes up to 4), the crowd preempts and recomputes; the tokens stay those drawn alone."""
    model, tokenizer = tiny_llama
    alone, shared, preemptions = tokens_alone_and_in_company(model, tokenizer, keyed=True, num_kv_blocks=6)
    assert preemptions > 0
    assert alone == shared


def test_a_prompt_too_long_for_the_queue_is_refused_with_the_fix(tiny_llama):
    model, tokenizer = tiny_llama
    queue = RequestQueue(NativeEngine(model, tokenizer), max_len=8)
    with pytest.raises(Exception, match="larger max_len"):
        queue.submit(chat_prompts(tokenizer)[0], params(4))
