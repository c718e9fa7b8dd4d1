"""The streaming session against the batch ``generate``: same tokens, early exits, partial rollout."""

import pytest
import torch

from hybridflow.errors import RolloutError
from hybridflow.models.tiny import build_tiny_model
from hybridflow.rollout import SamplingParams
from hybridflow.rollout.native import NativeEngine
from hybridflow.rollout.streaming import StreamingSession
from tests.rollout.conftest import chat_prompts

MAX_TOKENS = 20


def varied_model(tokenizer, seed: int):
    """A tiny Llama whose greedy responses are not one repeated token (as they are at the default
    0.02 init), so a token off by one position shows up."""
    model, tokenizer = build_tiny_model("llama", seed=seed, tokenizer=tokenizer)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * parameter.shape[1] ** -0.5)
    return model, tokenizer


@pytest.fixture(scope="module")
def varied(tiny_tokenizer):
    return varied_model(tiny_tokenizer, seed=1)


def greedy(tokenizer, n=1, max_tokens=MAX_TOKENS) -> SamplingParams:
    return SamplingParams(n=n, temperature=0, max_tokens=max_tokens, stop_token_ids=[tokenizer.eos_token_id])


def by_key(completions):
    return {(c.request_id, c.output_index): c for c in completions}


def test_streamed_tokens_equal_batch_generate_under_greedy(varied):
    model, tokenizer = varied
    prompts = chat_prompts(tokenizer)
    engine = NativeEngine(model, tokenizer, decode_lanes=False)
    expected = engine.generate(prompts, greedy(tokenizer, n=2))
    session = StreamingSession(engine, greedy(tokenizer, n=2), max_prompt_length=max(map(len, prompts)))
    for index, prompt in enumerate(prompts[:2]):
        session.submit(index, prompt)
    streamed = list(session.step()) + list(session.step())  # the first two are decoding ...
    for index, prompt in enumerate(prompts[2:], start=2):  # ... when the next prompts arrive
        session.submit(index, prompt)
    streamed += list(session.stream())
    got = by_key(streamed)
    assert len(got) == len(expected)
    for position, completion in enumerate(expected):  # grouped by prompt, n = 2 each
        mine = got[(completion.prompt_index, position % 2)]
        assert mine.token_ids == completion.token_ids
        assert mine.finish_reason == completion.finish_reason
        assert mine.logprobs == pytest.approx(completion.logprobs, abs=1e-5)
        assert mine.weight_versions == [0] * len(mine.token_ids)


def test_new_prompts_share_decode_steps_with_running_ones(tiny_llama):
    model, tokenizer = tiny_llama
    prompts = chat_prompts(tokenizer)
    session = StreamingSession(NativeEngine(model, tokenizer, decode_lanes=False),
                               greedy(tokenizer, max_tokens=50), max_prompt_length=max(map(len, prompts)))
    session.submit("a", prompts[0])
    session.step()
    session.submit("b", prompts[1])
    session.step()
    assert sorted(session.live_request_ids) == ["a", "b"]


def test_completions_leave_in_the_step_they_end(tiny_llama):
    model, tokenizer = tiny_llama
    prompts = chat_prompts(tokenizer)
    session = StreamingSession(NativeEngine(model, tokenizer, decode_lanes=False),
                               SamplingParams(n=4, temperature=1.0, max_tokens=MAX_TOKENS, seed=3,
                                              stop_token_ids=[tokenizer.eos_token_id]),
                               max_prompt_length=max(map(len, prompts)))
    for index, prompt in enumerate(prompts):
        session.submit(index, prompt)
    step, lengths_at_exit = 0, []
    while not session.idle:
        step += 1
        for completion in session.step():
            # the first step samples two tokens (one from the prefill, one decoded); every later step one
            lengths_at_exit.append((len(completion.token_ids), max(2, step + 1), completion.finish_reason))
    assert len(lengths_at_exit) == 16
    assert {reason for _, _, reason in lengths_at_exit} == {"stop", "length"}  # both kinds of ending are covered
    assert all(length == expected or (length == 1 and expected == 2) for length, expected, _ in lengths_at_exit)


def test_paused_sequence_resumes_from_the_exact_token(varied):
    model, tokenizer = varied
    prompts = chat_prompts(tokenizer)
    engine = NativeEngine(model, tokenizer, decode_lanes=False)
    expected = {c.prompt_index: c for c in engine.generate(prompts, greedy(tokenizer))}
    session = StreamingSession(engine, greedy(tokenizer), max_prompt_length=max(map(len, prompts)))
    for index, prompt in enumerate(prompts):
        session.submit(index, prompt)
    done = [c for _ in range(4) for c in session.step()]
    paused = session.pause()
    assert len(paused) + len(done) == len(prompts) and paused  # every in-flight sequence came out
    assert session.idle
    for item in paused:
        assert item.token_ids == expected[item.request_id].token_ids[: len(item.token_ids)]
        assert len(item.token_ids) == 5  # 4 steps: 2 tokens in the first, one in each of the next 3
    session.update_weights(dict(model.named_parameters()).items(), version=1)  # same values, new version
    session.resume(paused)
    done += list(session.stream())
    got = {c.request_id: c for c in done}
    for index, completion in expected.items():
        assert got[index].token_ids == completion.token_ids
        assert got[index].logprobs == pytest.approx(completion.logprobs, abs=1e-4)
    for item in paused:
        versions = got[item.request_id].weight_versions
        assert versions == [0] * 5 + [1] * (len(versions) - 5)


def test_resumed_sequence_continues_with_the_new_weights(tiny_tokenizer):
    model, tokenizer = varied_model(tiny_tokenizer, seed=1)  # its own copy: the update overwrites it
    other = varied_model(tiny_tokenizer, seed=7)[0]
    prompt = chat_prompts(tokenizer)[1]
    session = StreamingSession(NativeEngine(model, tokenizer, decode_lanes=False),
                               SamplingParams(temperature=0, max_tokens=12), max_prompt_length=len(prompt))
    session.submit("q", prompt)
    session.step()
    session.step()
    (paused,) = session.pause()
    session.update_weights(list(other.named_parameters()), version=1)
    session.resume([paused])
    (completion,) = list(session.stream())
    # the continuation is what the new weights produce greedily from prompt + the paused tokens
    reference = NativeEngine(other, tokenizer, decode_lanes=False).generate(
        [prompt + paused.token_ids], SamplingParams(temperature=0, max_tokens=12 - len(paused.token_ids)))[0]
    assert completion.token_ids == paused.token_ids + reference.token_ids
    assert len(set(completion.token_ids)) > 2  # not a constant response, where an off-by-one would hide
    assert completion.logprobs[:3] == paused.logprobs
    assert completion.weight_versions == [0] * 3 + [1] * 9


def test_update_weights_while_decoding_is_refused(tiny_llama):
    model, tokenizer = tiny_llama
    prompt = chat_prompts(tokenizer)[0]
    session = StreamingSession(NativeEngine(model, tokenizer, decode_lanes=False), greedy(tokenizer, max_tokens=50),
                               max_prompt_length=len(prompt))
    session.submit(0, prompt)
    session.step()
    with pytest.raises(RolloutError, match="call pause"):
        session.update_weights(model.named_parameters(), version=1)
    with pytest.raises(RolloutError, match="max_prompt_length"):
        session.submit(1, prompt + prompt)
    assert len(session.run.live) == 1  # the refused calls changed nothing


def test_a_session_on_a_tiny_block_budget_preempts_and_still_streams_batch_greedy(varied):
    """Submissions between steps, preemption inside the session, a pause and a resume: the same tokens and
    log-probs as one batch ``generate`` with room for everything."""
    from hybridflow.rollout.block_manager import BLOCK_SIZE

    model, tokenizer = varied
    prompts = chat_prompts(tokenizer)
    params = greedy(tokenizer, n=2, max_tokens=30)
    batch = NativeEngine(model, tokenizer).generate(prompts, params)  # grouped by prompt, 2 samples each
    expected = {(c.prompt_index, i % 2): c for i, c in enumerate(batch)}
    longest = max(map(len, prompts)) + 30
    engine = NativeEngine(model, tokenizer, decode_lanes=False, num_kv_blocks=-(-longest // BLOCK_SIZE) + 3)
    session = StreamingSession(engine, params, max_prompt_length=max(map(len, prompts)))
    session.submit(0, prompts[0])
    done = list(session.step())
    for index, prompt in enumerate(prompts[1:], start=1):
        session.submit(index, prompt)
        done += session.step()
    done += [c for _ in range(6) for c in session.step()]
    session.resume(session.pause())
    done += list(session.stream())
    assert session.run.preemptions > 0
    got = by_key(done)
    assert got.keys() == expected.keys()
    for key, completion in expected.items():
        assert got[key].token_ids == completion.token_ids
        assert got[key].logprobs == pytest.approx(completion.logprobs, abs=1e-4)

