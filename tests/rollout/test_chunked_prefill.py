"""Chunked prefill in the native engine: each step spends at most ``max_num_batched_tokens`` tokens (one decode
token per live row, then prompt chunks with what is left), a long prompt is prefilled over several steps through
its blocks, and the outputs stay HF's token for token in fp32 (greedy) and number for number (log-probs), with
samples sharing a prompt, twin prompts, prefix caching and preemption."""

import copy

import pytest
import torch

from hybridflow.errors import RolloutError
from hybridflow.rollout import SamplingParams
from hybridflow.rollout.native import NativeEngine, PendingPrompt, chunk_end
from hybridflow.rollout.streaming import StreamingSession
from tests.rollout.conftest import chat_prompts
from tests.rollout.test_native import hf_greedy
from tests.rollout.test_paged_engine import expected_logprobs, tight_blocks

LONG = "solve 7 * 8 step by step, then add 12 and check it " * 3
"""A question whose chat prompt is 79 tokens: several chunks at the budgets below."""


def mixed_prompts(tokenizer) -> list[list[int]]:
    """A long prompt, short ones, and one of them twice (prefilled once, shared)."""
    short = chat_prompts(tokenizer)
    return [chat_prompts(tokenizer, [LONG])[0], short[0], short[2], short[0]]


def recorded_passes(engine, monkeypatch) -> list[list[tuple[int, int]]]:
    """``(tokens computed, tokens attended before them)`` of every prompt in every prefill pass, as it runs."""
    passes, prefill_many = [], engine.decoder.prefill_many

    def recording(prompts, computed):
        passes.append([(len(p), 0 if c is None else c.length) for p, c in zip(prompts, computed)])
        return prefill_many(prompts, computed)

    monkeypatch.setattr(engine.decoder, "prefill_many", recording)
    return passes


def assert_hf_outputs(model, prompts, completions, params, eos):
    for completion in completions:
        prompt = prompts[completion.prompt_index]
        assert completion.token_ids == hf_greedy(model, prompt, max_new_tokens=params.max_tokens, eos=eos)
        torch.testing.assert_close(torch.tensor(completion.logprobs),
                                   expected_logprobs(model, prompt, completion, params), atol=1e-4, rtol=1e-4)


def test_chunked_prefill_is_hf_greedy_token_for_token(tiny, monkeypatch):
    model, tokenizer = tiny
    prompts, eos = mixed_prompts(tokenizer), tokenizer.eos_token_id
    params = SamplingParams(n=2, temperature=0, max_tokens=12, stop_token_ids=[eos], logprobs=True)
    engine = NativeEngine(model, tokenizer, max_num_seqs=6, max_num_batched_tokens=23, enable_chunked_prefill=True,
                          prefix_cache_tokens=4096, decode_lanes=False)
    passes = recorded_passes(engine, monkeypatch)
    completions = engine.generate(prompts, params)
    assert len(completions) == 8
    assert_hf_outputs(model, prompts, completions, params, eos)
    assert max(sum(computed for computed, _ in batch) for batch in passes) <= 23
    assert any(before % 16 for batch in passes for _, before in batch)  # a chunk started inside a block
    assert engine.allocator.available == engine.allocator.num_blocks - 1  # every block came back (or is cached)


def test_chunked_prefill_under_preemption_recomputes_to_hf(tiny_llama, monkeypatch):
    model, tokenizer = tiny_llama
    prompts, eos = mixed_prompts(tokenizer), tokenizer.eos_token_id
    params = SamplingParams(n=2, temperature=0, max_tokens=30, stop_token_ids=[eos], logprobs=True)
    engine = NativeEngine(model, tokenizer, max_num_seqs=5, max_num_batched_tokens=11, enable_chunked_prefill=True,
                          prefix_cache_tokens=4096, num_kv_blocks=tight_blocks(prompts, 30, spare=3),
                          decode_lanes=False)
    passes = recorded_passes(engine, monkeypatch)
    completions = engine.generate(prompts, params)
    assert engine.preemptions > 0 and len(completions) == 8
    assert_hf_outputs(model, prompts, completions, params, eos)
    assert max(sum(computed for computed, _ in batch) for batch in passes) <= 11


def test_fresh_prompts_keep_the_varlen_prefill_beside_later_chunks(tiny_llama, monkeypatch):
    """Where prefill has the varlen FlashAttention call (CUDA, half precision; here its CPU stand-in), a step's
    chunks that start at 0 go in a pass of their own: a pass with an earlier prefix runs SDPA per prompt."""
    from tests.rollout.test_native import segment_sdpa

    model, tokenizer = tiny_llama
    short, long = chat_prompts(tokenizer), chat_prompts(tokenizer, [LONG])[0]
    # Step 1: two short prompts and the long one's first chunk (14 + 19 + 23 and 4 decode tokens: 60), one varlen
    # pass. Step 2: the long one's next 55 tokens and the last prompt's first token: two passes, not one.
    prompts, eos = [short[0], short[2], long, short[3]], tokenizer.eos_token_id
    params = SamplingParams(n=2, temperature=0, max_tokens=12, stop_token_ids=[eos], logprobs=True)
    engine = NativeEngine(model, tokenizer, max_num_seqs=8, max_num_batched_tokens=60, enable_chunked_prefill=True,
                          decode_lanes=False)
    varlen_calls = []
    monkeypatch.setattr(engine.decoder, "_varlen_attention", segment_sdpa(engine.decoder.scale, varlen_calls))
    engine.decoder.varlen_prefill = engine.decoder.varlen_prefill_checked = True
    passes = recorded_passes(engine, monkeypatch)
    completions = engine.generate(prompts, params)
    assert_hf_outputs(model, prompts, completions, params, eos)
    assert passes[:3] == [[(14, 0), (19, 0), (23, 0)], [(1, 0)], [(55, 23)]]  # (tokens computed, before them)
    assert all(len({before > 0 for _, before in batch}) == 1 for batch in passes)  # never fresh and later mixed
    fresh = [batch for batch in passes if batch[0][1] == 0]
    assert len(varlen_calls) == len(fresh) * model.config.num_hidden_layers and max(varlen_calls) == 3


def step(engine, run) -> int:
    """One engine step (what ``generate`` and a streaming session run); the tokens it computed."""
    engine._admit(run)
    if run.live:
        engine._step(run)
    return run.step_prefill + run.step_decode


def test_each_step_stays_within_the_budget_while_live_rows_keep_decoding(tiny_llama):
    """One row decodes while a 79-token prompt with 2 samples arrives; budget 21: the row's decode token, then
    20 prompt tokens a step. After 60, the last 19 and the samples' 2 decode tokens would make 22: 18 go, and the
    last token joins alone in the next step (1 prompt token, 3 rows decoding)."""
    model, tokenizer = tiny_llama
    short, long = chat_prompts(tokenizer)[1], chat_prompts(tokenizer, [LONG])[0]
    params = SamplingParams(n=1, temperature=0, max_tokens=40, ignore_eos=True)
    engine = NativeEngine(model, tokenizer, max_num_seqs=3, max_num_batched_tokens=21, enable_chunked_prefill=True,
                          decode_lanes=False)
    run = engine.new_run(sequences=3, max_len=len(long) + 40, seed=0)
    run.waiting.append(PendingPrompt(0, short, 1, params))
    assert step(engine, run) == len(short) + 1  # prefilled whole (12 + its decode token <= 21), then decoded
    (decoding,) = run.live
    run.waiting.append(PendingPrompt(1, long, 2, SamplingParams(n=2, temperature=0, max_tokens=40)))
    pending, chunks, spent = run.waiting[0], [], []
    while run.waiting:
        before = len(decoding.token_ids)
        spent.append(step(engine, run))
        assert len(decoding.token_ids) == before + 1  # the live row decoded in every step
        chunks.append(run.step_prefill)
        assert pending.prefilled == sum(chunks) or not run.waiting  # (its prefill is dropped once its samples join)
    assert chunks == [20, 20, 20, 18, 1]
    assert spent == [21, 21, 21, 19, 1 + 3]
    assert len(run.live) == 3 and run.peak_step_tokens == 21


def test_a_copy_of_the_prompt_has_its_decode_token_set_aside_before_the_prefill(tiny_llama):
    """The same 14-token prompt twice, budget 15: the copy's sample will join on the first one's prefill, so its
    decode token is set aside first; the whole prompt and two decode tokens (16) would not fit, so 13 go, then
    the last token and both samples' first decode step (1 + 2)."""
    model, tokenizer = tiny_llama
    prompt = chat_prompts(tokenizer)[0]
    engine = NativeEngine(model, tokenizer, max_num_seqs=2, max_num_batched_tokens=15, enable_chunked_prefill=True,
                          decode_lanes=False)
    run = engine.new_run(sequences=2, max_len=len(prompt) + 8, seed=0)
    params = SamplingParams(n=1, temperature=0, max_tokens=8, ignore_eos=True)
    run.waiting.extend([PendingPrompt(0, prompt, 1, params), PendingPrompt(1, prompt, 1, params)])
    assert [step(engine, run), step(engine, run)] == [13, 1 + 2] and len(run.live) == 2
    while run.live:
        step(engine, run)
    assert run.peak_step_tokens == 13 and [s.token_ids for s in run.done][0] == [s.token_ids for s in run.done][1]


def test_a_chunks_full_blocks_are_named_as_it_goes(tiny_llama):
    """With prefix caching, the blocks a chunk fills are named at once: a prompt with the same start reuses them
    while the first is still being prefilled."""
    model, tokenizer = tiny_llama
    long = chat_prompts(tokenizer, [LONG])[0]
    engine = NativeEngine(model, tokenizer, max_num_seqs=2, max_num_batched_tokens=40, enable_chunked_prefill=True,
                          prefix_cache_tokens=4096, decode_lanes=False)
    run = engine.new_run(sequences=2, max_len=len(long) + 4, seed=0)
    pending = PendingPrompt(0, long, 1, SamplingParams(n=1, temperature=0, max_tokens=4))
    run.waiting.append(pending)
    step(engine, run)
    assert pending.prefilled == 40 and not pending.ready  # the budget, nothing decoding yet
    assert [engine.allocator.block_of[key] for key in pending.blocks.keys] == pending.blocks.blocks[:2]  # 2 x 16
    blocks, _ = engine.allocator.cached_prefix(long[:35] + [1, 2, 3])
    assert blocks == pending.blocks.blocks[:2]


@pytest.mark.parametrize("seed", [0, 1, 2, 5, 7, 433])
def test_random_schedules_stay_within_the_budget_and_generate_what_whole_prompts_do(tiny_llama, seed):
    """Random prompts (copies among them), samples, budgets and block pools (some small enough to preempt), stepped
    as ``generate`` steps: no step computes more than the budget, and the greedy tokens are whole prompts'. Seeds 1,
    2, 5 and 7 overran the budget before the allowance counted rows that joined earlier in the step; 433 looped in
    ``_admit`` while a copy of a prefilled prompt was forked again after each drop of its blocks."""
    import random

    model, tokenizer = tiny_llama
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randrange(2, 90))] for _ in range(rng.randrange(1, 8))]
    prompts += [list(rng.choice(prompts)) for _ in range(rng.randrange(0, 3))]
    params = [SamplingParams(n=rng.randrange(1, 5), temperature=0, max_tokens=rng.randrange(1, 14), ignore_eos=True)
              for _ in prompts]
    seqs, budget = rng.randrange(1, 9), rng.randrange(2, 60)
    blocks = rng.choice([None, tight_blocks(prompts, 14, spare=rng.randrange(0, 4))])
    expected = NativeEngine(model, tokenizer, max_num_seqs=seqs, decode_lanes=False).generate(prompts, params)
    engine = NativeEngine(model, tokenizer, max_num_seqs=seqs, max_num_batched_tokens=max(budget, seqs + 1),
                          enable_chunked_prefill=True, num_kv_blocks=blocks, prefix_cache_tokens=rng.choice([0, 512]),
                          decode_lanes=False)
    run = engine.new_run(sequences=sum(q.n for q in params), max_len=max(map(len, prompts)) + 14, seed=0)
    run.waiting.extend(PendingPrompt(i, list(p), q.n, q) for i, (p, q) in enumerate(zip(prompts, params)))
    while run.waiting or run.live:
        assert step(engine, run) <= engine.token_budget
    got = sorted(run.done, key=lambda s: (s.prompt_index, s.output_index))
    assert [s.token_ids for s in got] == [c.token_ids for c in expected]
    assert engine.allocator.available == engine.allocator.num_blocks - 1  # every block back (or cached, unheld)


def test_a_last_chunk_is_held_back_until_its_samples_decode_tokens_fit_too():
    pending = PendingPrompt(0, list(range(40)), 3, SamplingParams(n=3), prefilled=30)
    assert chunk_end(pending, 13, joining=3) == 40  # 10 tokens + 3 decode tokens: the last chunk
    assert chunk_end(pending, 12, joining=3) == 39  # they do not fit: all but the last token, the rest next step
    assert chunk_end(pending, 5, joining=3) == 35
    assert chunk_end(PendingPrompt(0, [1], 1, SamplingParams()), 1, joining=1) == 0  # nothing fits: no chunk


def test_without_chunking_a_long_prompt_is_prefilled_whole_in_one_step(tiny_llama):
    model, tokenizer = tiny_llama
    short, long = chat_prompts(tokenizer)[1], chat_prompts(tokenizer, [LONG])[0]
    params = SamplingParams(n=1, temperature=0, max_tokens=40, ignore_eos=True)
    engine = NativeEngine(model, tokenizer, max_num_seqs=2, max_num_batched_tokens=16, decode_lanes=False)
    run = engine.new_run(sequences=2, max_len=len(long) + 40, seed=0)
    run.waiting.append(PendingPrompt(0, short, 1, params))
    step(engine, run)
    run.waiting.append(PendingPrompt(1, long, 1, params))
    assert step(engine, run) == 79 + 2 and not run.waiting  # one pass of its own: the budget bounds passes only


def test_a_session_paused_mid_chunk_resumes_to_hf(tiny_llama):
    """``pause`` drops a half-prefilled prompt's chunks with the rest of its prefill; it is prefilled again."""
    model, tokenizer = tiny_llama
    prompts, eos = [chat_prompts(tokenizer)[2], chat_prompts(tokenizer, [LONG])[0]], tokenizer.eos_token_id
    params = SamplingParams(n=1, temperature=0, max_tokens=10, stop_token_ids=[eos], logprobs=True)
    engine = NativeEngine(model, tokenizer, max_num_seqs=3, max_num_batched_tokens=20, enable_chunked_prefill=True,
                          decode_lanes=False)
    session = StreamingSession(engine, params, max_prompt_length=len(prompts[1]))
    session.submit("short", prompts[0])
    done = session.step()
    session.submit("long", prompts[1])
    done += session.step() + session.step()
    assert 0 < session.run.waiting[0].prefilled < len(prompts[1])  # mid-prefill
    paused = session.pause()
    assert session.run.waiting[0].prefilled == 0
    session.resume(paused)
    done += list(session.stream())
    assert sorted(c.request_id for c in done) == ["long", "short"]
    for completion in done:
        assert completion.token_ids == hf_greedy(model, completion.prompt_ids, max_new_tokens=10, eos=eos)
        torch.testing.assert_close(torch.tensor(completion.logprobs),
                                   expected_logprobs(model, completion.prompt_ids, completion, params),
                                   atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_num_batched_tokens": 0}, "is not a positive number of tokens"),
    ({"max_num_batched_tokens": 8, "max_num_seqs": 8, "enable_chunked_prefill": True}, "must exceed max_num_seqs=8"),
])
def test_a_budget_the_scheduler_cannot_use_is_one_line(tiny_llama, kwargs, message):
    model, tokenizer = tiny_llama
    with pytest.raises(RolloutError, match=message) as error:
        NativeEngine(model, tokenizer, **kwargs)
    assert "\n" not in str(error.value) and "rollout.max_num_batched_tokens" in str(error.value)
    NativeEngine(model, tokenizer, max_num_batched_tokens=8, max_num_seqs=8)  # whole prompts: any positive budget


def test_the_trainer_passes_the_budget_and_chunking_to_the_native_engine(tiny_llama):
    from hybridflow.trainer.roles.builders import _rollout_worker
    from tests.rollout.test_engine_sizing import rollout_cfg

    model, tokenizer = tiny_llama  # the worker owns its model (drops its projections): a copy each
    engine = _rollout_worker(copy.deepcopy(model), tokenizer, rollout_cfg()).engine
    assert engine.max_num_batched_tokens == 8192 and engine.chunked_prefill  # verl's defaults
    cfg = rollout_cfg("actor_rollout_ref.rollout.max_num_seqs=3", "actor_rollout_ref.rollout.max_num_batched_tokens=9",
                      "actor_rollout_ref.rollout.enable_chunked_prefill=False")
    engine = _rollout_worker(copy.deepcopy(model), tokenizer, cfg).engine
    assert engine.max_num_batched_tokens == 9 and not engine.chunked_prefill and engine.token_budget == 9


@pytest.mark.parametrize("overrides, line", [
    (["actor_rollout_ref.rollout.max_num_batched_tokens=0"],
     "actor_rollout_ref.rollout.max_num_batched_tokens=0 must be a positive integer"),
    (["actor_rollout_ref.rollout.max_num_batched_tokens=64", "actor_rollout_ref.rollout.max_num_seqs=64"],
     "actor_rollout_ref.rollout.max_num_batched_tokens=64 must exceed actor_rollout_ref.rollout.max_num_seqs=64"),
])
def test_config_validation_refuses_a_budget_before_any_model_loads(tmp_path, overrides, line):
    from hybridflow.config import PPOConfig, load_config, validate_ppo_config
    from hybridflow.errors import ConfigError

    (tmp_path / "model").mkdir()
    cfg = load_config(PPOConfig, [f"actor_rollout_ref.model.path={tmp_path / 'model'}", "data.train_files=[]",
                                  "data.val_files=[]", *overrides])
    from hybridflow.trainer.entry import engine_and_logger_problems

    try:
        validate_ppo_config(cfg)
        problems = []
    except ConfigError as error:
        problems = str(error).splitlines()
    (problem,) = [p for p in problems + engine_and_logger_problems(cfg) if "max_num_batched_tokens" in p]
    assert problem.startswith(line)
