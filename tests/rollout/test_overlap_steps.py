"""The native engine's ``overlap_steps`` (one decode step in flight, read back after the next one is launched): the
same tokens, log-probs and finish reasons as the synchronous steps, with keyed draws and greedy decoding, across
shared prefills, stop tokens and strings, lengths, repetition penalties, admission waves, late arrivals, preemption,
chunked prefill and streaming with a pause; and the readback of a step does come after the next step's launch."""

from __future__ import annotations

import pytest

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.generation_run import StepClock
from hybridflow.rollout.native import NativeEngine
from hybridflow.rollout.request_queue import RequestQueue
from hybridflow.rollout.streaming import StreamingSession
from tests.rollout.conftest import chat_prompts
from tests.rollout.test_streaming import varied_model

MAX_LEN = 64


@pytest.fixture(scope="module")
def varied(tiny_tokenizer):
    return varied_model(tiny_tokenizer, seed=1)


STOP_TOKENS = [400, 335]
"""Tokens the tiny model samples often (" is", "ply"): they end some of the sampled rows after a few tokens."""
STOP_STRING = "n sum"
"""Met by the greedy answer to the second prompt at its 10th token, across two tokens ("n", " sum")."""


def mixed_params() -> list[SamplingParams]:
    """Per prompt: samples sharing a prefill with stop tokens, greedy ones with a stop string, repetition
    penalties, filters, lengths that end rows at different steps (the last two prompts' at the queue's ``max_len``)."""
    return [SamplingParams(n=3, temperature=1.0, max_tokens=12, seed=1, logprobs=True, stop_token_ids=STOP_TOKENS),
            SamplingParams(n=2, temperature=0, max_tokens=16, logprobs=True, stop=[STOP_STRING]),
            SamplingParams(n=1, temperature=0.8, top_k=20, repetition_penalty=1.3, max_tokens=MAX_LEN, seed=3,
                           logprobs=True),  # ends at the queue's max_len, 8 tokens before the last prompt's samples
            SamplingParams(n=2, temperature=1.0, repetition_penalty=1.2, max_tokens=MAX_LEN, seed=4, logprobs=True,
                           ignore_eos=True, stop_token_ids=STOP_TOKENS)]


def run_queue(model, tokenizer, params: list[SamplingParams], *, overlap: bool, late_after: int = 0, **engine_kwargs):
    """Every sample's ``(tokens, log-probs, finish reason)`` through one keyed-draw queue, and the run. With
    ``late_after``, the last two requests are submitted after that many steps (they join a running batch)."""
    engine = NativeEngine(model, tokenizer, overlap_steps=overlap, **engine_kwargs)
    queue = RequestQueue(engine, max_len=MAX_LEN, keyed_draws=True)
    prompts = chat_prompts(tokenizer)
    split = len(params) - 2 if late_after else len(params)
    requests = [queue.submit(p, q) for p, q in zip(prompts[:split], params[:split])]
    for _ in range(late_after):
        queue.step()
    requests += [queue.submit(p, q) for p, q in zip(prompts[split:], params[split:])]
    queue.drain()
    queue.close()
    outputs = [[(c.token_ids, c.logprobs, c.finish_reason) for c in r.future.result()] for r in requests]
    return outputs, queue.run, engine


SCHEDULES = {
    "one wave": {},
    "admission waves and late arrivals": {"max_num_seqs": 3, "late_after": 3},
    "preemption": {"num_kv_blocks": 9},
    "chunked prefill": {"max_num_seqs": 4, "enable_chunked_prefill": True, "max_num_batched_tokens": 13,
                        "late_after": 2},
}


@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_overlapped_steps_give_the_synchronous_outputs(varied, schedule):
    model, tokenizer = varied
    params = mixed_params()
    synchronous, sync_run, _ = run_queue(model, tokenizer, params, overlap=False, **SCHEDULES[schedule])
    overlapped, run, engine = run_queue(model, tokenizer, params, overlap=True, **SCHEDULES[schedule])
    assert overlapped == synchronous
    reasons = [reason for request in synchronous for _, _, reason in request]
    assert {"stop", "length"} <= set(reasons)  # both endings are covered
    assert any(len(tokens) < 16 and reason == "stop" for tokens, _, reason in synchronous[1])  # the stop string
    assert sync_run.overlapped_readbacks == 0 and run.overlapped_readbacks > 0  # the setting did overlap steps
    if schedule == "preemption":
        assert engine.preemptions > 0


def test_a_step_in_flight_lands_before_its_rows_run_out_of_blocks(varied):
    """Two samples admitted together into 6 usable blocks, each growing to 4: the younger one is preempted while
    nothing waits (a step in flight then: it must land before any row is preempted, whose tokens so far are recomputed)."""
    model, tokenizer = varied
    params = [SamplingParams(n=2, temperature=1.0, max_tokens=36, seed=5, logprobs=True, ignore_eos=True)]
    synchronous, _, _ = run_queue(model, tokenizer, params, overlap=False, num_kv_blocks=7)
    overlapped, run, engine = run_queue(model, tokenizer, params, overlap=True, num_kv_blocks=7)
    assert overlapped == synchronous and engine.preemptions == 1 and run.overlapped_readbacks > 0


def test_a_step_is_read_back_after_the_next_one_is_launched(varied):
    """One request of 8 tokens (the first sampled at admission): 7 decode steps, each read back once the next is
    launched but the last, whose row ends with it (nothing follows it: it is read at once)."""
    model, tokenizer = varied
    params = [SamplingParams(temperature=1.0, max_tokens=8, seed=2, ignore_eos=True)]
    for overlap, overlapped in ((True, 6), (False, 0)):
        _, run, _ = run_queue(model, tokenizer, params, overlap=overlap)
        assert (run.launched_steps, run.overlapped_readbacks) == (7, overlapped)


def test_the_step_clock_times_each_host_gap_and_readback(varied):
    """A benchmark's :class:`StepClock`: one readback a launched step, a host gap before every launch that follows
    a readback (all but the first without overlap), and the readbacks that came after the next launch."""
    model, tokenizer = varied
    params = [SamplingParams(temperature=1.0, max_tokens=8, seed=2, ignore_eos=True)]
    for overlap in (False, True):
        engine = NativeEngine(model, tokenizer, overlap_steps=overlap)
        clock = engine.step_clock = StepClock()
        queue = RequestQueue(engine, max_len=MAX_LEN, keyed_draws=True)
        queue.submit(chat_prompts(tokenizer)[0], params[0])
        queue.drain()
        run = queue.run
        assert len(clock.waits) == run.launched_steps == 7 and clock.overlapped == run.overlapped_readbacks
        assert len(clock.gaps) == (5 if overlap else 6)  # overlapped: launches 3 .. 7 follow a readback
        assert all(gap > 0 for gap in clock.gaps)


def test_the_setting_defaults_to_off_on_cpu(varied):
    model, tokenizer = varied
    assert not NativeEngine(model, tokenizer).overlap_steps
    assert NativeEngine(model, tokenizer, overlap_steps=True).overlap_steps


def stream_with_a_pause(model, tokenizer, *, overlap: bool):
    """A greedy streaming session paused after 5 steps (a step in flight then) and resumed under version 1."""
    engine = NativeEngine(model, tokenizer, overlap_steps=overlap)
    session = StreamingSession(engine, SamplingParams(n=2, temperature=0, max_tokens=14, logprobs=True,
                                                      stop_token_ids=[tokenizer.eos_token_id]),
                               max_prompt_length=MAX_LEN)
    for index, prompt in enumerate(chat_prompts(tokenizer)):
        session.submit(index, prompt)
    done = []
    for _ in range(5):
        done += session.step()
    in_flight = session.run.in_flight is not None
    paused = session.pause()
    session.weights_reloaded(version=1)
    session.resume(paused)
    done += list(session.stream())
    session.close()
    return sorted((c.request_id, c.output_index, c.token_ids, c.logprobs, c.weight_versions, c.finish_reason)
                  for c in done), in_flight


def test_a_paused_streaming_session_lands_its_step_in_flight_first(varied):
    model, tokenizer = varied
    synchronous, _ = stream_with_a_pause(model, tokenizer, overlap=False)
    overlapped, in_flight = stream_with_a_pause(model, tokenizer, overlap=True)
    assert in_flight and overlapped == synchronous
