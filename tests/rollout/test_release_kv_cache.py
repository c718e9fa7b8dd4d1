"""``rollout.free_cache_engine``: the native engine gives its KV cache back between rollouts and allocates it again
as the first rollout did (same tokens, same log-probs); it refuses while a streaming session holds the cache; the
rollout worker releases it after each generate only when asked."""

from __future__ import annotations

import threading
import weakref

import pytest

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.native import NativeEngine, live_engines
from hybridflow.rollout.sleep import ReleasedMemory
from hybridflow.rollout.streaming import StreamingSession
from hybridflow.workers.rollout import RolloutWorker
from tests.rollout.conftest import chat_prompts
from tests.rollout.test_partial_rollout_worker import _prompts
from tests.rollout.test_streaming import varied_model


@pytest.fixture(scope="module")
def varied(tiny_tokenizer):
    return varied_model(tiny_tokenizer, seed=3)


def sampled(tokenizer, seed: int) -> SamplingParams:
    return SamplingParams(n=2, temperature=1.0, max_tokens=12, seed=seed, logprobs=True,
                          stop_token_ids=[tokenizer.eos_token_id])


def outputs(completions) -> list[tuple[list[int], list[float]]]:
    return [(c.token_ids, c.logprobs) for c in completions]


@pytest.mark.parametrize("path", ["kernel", "mirror"])
def test_a_released_engine_holds_no_pool_and_generates_what_a_kept_one_does(varied, path):
    """On both CPU attention paths: the C kernel reads the pool; SDPA reads the slot mirror, a second copy."""
    model, tokenizer = varied
    prompts = chat_prompts(tokenizer)
    kept, released = NativeEngine(model, tokenizer), NativeEngine(model, tokenizer)
    for engine in (kept, released):
        if path == "mirror":
            engine.decoder.paged_cpu_attention = False
        engine.generate(prompts, sampled(tokenizer, seed=1))
    held = [weakref.ref(released.cache.data)] + ([weakref.ref(released.mirror.data)] if path == "mirror" else [])
    assert (released.mirror is None) == (path == "kernel")
    assert released.kv_cache_bytes > 0
    assert released.release_kv_cache()
    assert released.cache is None and released.allocator is None and released.mirror is None
    assert released.graphs is None and released.kv_cache_bytes == 0
    assert all(tensor() is None for tensor in held)  # nothing else held them: their memory maps are unmapped
    assert kept.cache is not None  # the engine that never released still holds its pool
    again = released.generate(prompts, sampled(tokenizer, seed=2))
    assert released.cache is not None  # allocated again by the next generate
    assert outputs(again) == outputs(kept.generate(prompts, sampled(tokenizer, seed=2)))  # bit for bit


def test_release_is_refused_while_a_streaming_session_is_open(varied):
    model, tokenizer = varied
    params = SamplingParams(n=2, temperature=1.0, max_tokens=12, seed=5, logprobs=True)
    prompts = chat_prompts(tokenizer)

    def streamed(engine, *, release_midway: bool):
        session = StreamingSession(engine, params, max_prompt_length=max(map(len, prompts)))
        for index, ids in enumerate(prompts):
            session.submit(index, ids)
        done = session.step() + session.step()
        assert session.run.live
        if release_midway:
            assert not engine.release_kv_cache()  # refused: the session's rows are decoding in the pool
            assert engine.cache is session.run.cache
        done += list(session.stream())
        if release_midway:
            assert not engine.release_kv_cache()  # drained but open: it may take more prompts
            session.close()
            assert engine.release_kv_cache() and engine.cache is None
        return sorted((c.request_id, c.output_index, c.token_ids, c.logprobs) for c in done)

    assert streamed(NativeEngine(model, tokenizer), release_midway=True) == streamed(
        NativeEngine(model, tokenizer), release_midway=False)


def test_the_kv_high_water_mark_sees_a_pool_released_within_the_window(varied):
    model, tokenizer = varied
    engine = NativeEngine(model, tokenizer)
    assert engine in live_engines()
    engine.reset_kv_high_water()
    assert engine.kv_high_water == 0
    engine.generate(chat_prompts(tokenizer), sampled(tokenizer, seed=1))
    held = engine.kv_cache_bytes
    engine.release_kv_cache()
    assert engine.kv_high_water == held > 0 and engine.kv_cache_bytes == 0
    engine.reset_kv_high_water()
    assert engine.kv_high_water == 0


@pytest.mark.parametrize("free_cache_engine", [True, False])
def test_the_rollout_worker_releases_after_generate_only_when_asked(varied, free_cache_engine):
    model, tokenizer = varied
    worker = RolloutWorker(engine=NativeEngine(model, tokenizer), pad_token_id=tokenizer.pad_token_id,
                           free_cache_engine=free_cache_engine)
    first = worker.generate(_prompts(tokenizer), sampled(tokenizer, seed=1))
    assert (worker.engine.cache is None) == free_cache_engine
    second = worker.generate(_prompts(tokenizer), sampled(tokenizer, seed=1))
    assert (worker.engine.cache is None) == free_cache_engine
    assert first["responses"].tolist() == second["responses"].tolist()


class FailingSync:
    """A handover whose weight sync fails once the generate has decoded a few steps (the engine's lock is real)."""

    def __init__(self):
        self.lock, self.checks, self.version = threading.Lock(), 0, 0

    def requested(self) -> bool:
        self.checks += 1
        return self.checks == 3

    def wait(self) -> int:
        raise RuntimeError("the weight sync failed")


def test_a_generate_that_fails_midway_still_releases(varied):
    """The failed generate's traceback keeps its frames (and their queue or session) alive: the queue and the
    partial rollout's session are closed on the way out, so the worker's release still frees the cache."""
    model, tokenizer = varied
    engine = NativeEngine(model, tokenizer)
    real_step = engine._step
    steps = iter(range(3))

    def failing_step(run):
        if next(steps, None) is None:
            raise RuntimeError("a decode step failed")
        real_step(run)

    engine._step = failing_step
    worker = RolloutWorker(engine=engine, pad_token_id=tokenizer.pad_token_id, free_cache_engine=True)
    with pytest.raises(RuntimeError, match="decode step") as failed:
        worker.generate(_prompts(tokenizer), sampled(tokenizer, seed=1))
    assert failed.traceback and engine.cache is None
    engine._step = real_step
    worker.handover = FailingSync()
    with pytest.raises(RuntimeError, match="weight sync") as failed:
        worker.generate(_prompts(tokenizer), sampled(tokenizer, seed=1), partial=True)
    assert failed.traceback and worker.handover.checks == 3 and engine.cache is None
    assert not worker.kept_cache_reported


def test_released_memory_releases_once_and_resumes_weights_before_the_kv_cache():
    """The vLLM / SGLang backends' bookkeeping (neither is installed here): one release however often asked, each
    part resumed once, the weights first, and nothing released by an engine built without sleep mode."""
    calls = []
    memory = ReleasedMemory(enabled=True, release=lambda: calls.append("release"),
                            resume=lambda parts: calls.append(parts))
    memory.resume("weights", "kv_cache")  # nothing released yet
    assert memory.release() and memory.release()
    memory.resume("weights")  # a weight sync
    memory.resume("kv_cache", "weights")  # the next generate
    memory.resume("weights", "kv_cache")
    assert calls == ["release", ["weights"], ["kv_cache"]]
    assert memory.release() and calls[-1] == "release"
    memory.resume("kv_cache", "weights")
    assert calls[-1] == ["weights", "kv_cache"]
    unable = ReleasedMemory(enabled=False, release=lambda: calls.append("never"), resume=calls.append)
    assert not unable.release() and "never" not in calls
