"""The turn generator: on the native engine each turn is a request of the engine's queue, joining the running batch
at the next decode step and resolved when its own completion ends; other engines get the turns as batches."""

import asyncio
import threading

import pytest

from hybridflow.agents import TurnGenerator
from hybridflow.agents.generator import BatchedTurns, QueuedTurns
from hybridflow.errors import RolloutError
from hybridflow.models.tiny import build_tiny_model
from hybridflow.rollout import SamplingParams
from hybridflow.rollout.native import NativeEngine
from tests.rollout.conftest import chat_prompts

HANG_GUARD_S = 120
"""Longest wait for an event another thread sets (a missed wake-up fails the test instead of hanging it)."""


class CountingEngine(NativeEngine):
    """The native engine, recording each call's per-prompt budgets and, per decode step, the rows' prompt indices;
    ``hold_at`` (step number) makes that step wait until ``resume`` is set (a turn submitted meanwhile)."""

    def __init__(self, *args, hold_at: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls, self.rows = [], []
        self.hold_at, self.held, self.resume = hold_at, threading.Event(), threading.Event()

    def generate(self, prompts, params):
        self.calls.append([p.max_tokens for p in params] if isinstance(params, list) else params.max_tokens)
        return super().generate(prompts, params)

    def _step(self, run):
        self.rows.append([s.prompt_index for s in run.live])
        if len(self.rows) == self.hold_at:
            self.held.set()
            assert self.resume.wait(HANG_GUARD_S)
        super()._step(run)


@pytest.fixture(scope="module")
def llama(tiny_tokenizer):
    return build_tiny_model("llama", seed=1, tokenizer=tiny_tokenizer)


PARAMS = SamplingParams(temperature=1.0, max_tokens=64, seed=0, ignore_eos=True)


def test_batched_turns_decode_to_their_own_budgets_in_one_engine_call(llama):
    model, tokenizer = llama
    engine = CountingEngine(model, tokenizer)
    turns = BatchedTurns(engine, PARAMS)
    prompts = chat_prompts(tokenizer)[:3]

    async def ask():
        return await asyncio.gather(*(turns.generate(p, max_tokens=m) for p, m in zip(prompts, (2, 5, 30))))

    completions = asyncio.run(ask())
    assert engine.calls == [[2, 5, 30]]  # one call, each turn its own budget
    assert [len(c.token_ids) for c in completions] == [2, 5, 30]
    assert len(engine.rows) == 29  # the longest turn's steps only: the short ones left their slots early


def test_the_native_engine_serves_turns_from_its_queue_with_one_prefill_for_turns_asked_together(llama):
    model, tokenizer = llama
    engine = CountingEngine(model, tokenizer)
    generator = TurnGenerator(engine, PARAMS)
    assert isinstance(generator.turns, QueuedTurns)
    prompts = chat_prompts(tokenizer)[:3]

    async def ask():
        return await asyncio.gather(*(generator.generate(p, max_tokens=m) for p, m in zip(prompts, (2, 5, 30))))

    completions = asyncio.run(ask())
    generator.close()
    assert engine.calls == []  # no batch call: each turn is a request of the queue
    assert [len(c.token_ids) for c in completions] == [2, 5, 30]
    # asked in the same event-loop turn: admitted together, so the longest turn's 29 steps decode all of them
    assert len(engine.rows) == 29 and engine.rows[0] == [0, 1, 2] and engine.rows[-1] == [2]


def test_a_turn_asked_while_a_long_turn_decodes_joins_at_the_next_step_and_returns_first(llama):
    """Loop A asks a 60-token turn; loop B a 3-token turn, then (its tool answered) a second one while A decodes.
    Step 10 is held until B's second turn is in the queue's inbox: it must decode from step 11, and B must have its
    answer before A's turn ends (the batch path would make it wait for A's 60 steps)."""
    model, tokenizer = llama
    engine = CountingEngine(model, tokenizer, hold_at=10)
    generator = TurnGenerator(engine, PARAMS)
    long_prompt, short_prompt = chat_prompts(tokenizer)[:2]
    order = []

    async def loop_a():
        await generator.generate(long_prompt, max_tokens=60)
        order.append("A")

    async def loop_b():
        first = await generator.generate(short_prompt, max_tokens=3)
        await asyncio.to_thread(engine.held.wait, HANG_GUARD_S)  # the tool call, answered mid-batch
        second = asyncio.ensure_future(generator.generate(short_prompt + first.token_ids, max_tokens=5))
        await asyncio.sleep(0)  # the turn is submitted once its coroutine first runs
        engine.resume.set()
        await second
        order.append("B")

    async def both():
        await asyncio.gather(loop_a(), loop_b())

    asyncio.run(both())
    generator.close()
    joined = next(step for step, rows in enumerate(engine.rows, start=1) if 2 in rows)
    assert joined == 11  # submitted during step 10: it waited for no step but the one running
    assert order == ["B", "A"]
    assert len(engine.rows) == 59  # A's 60 tokens: the first sampled at admission, 59 decode steps


def run_conversations(llama, tool_delays: list[float], *, seed: int = 0, rows: int = 3):
    """``rows`` two-turn conversations (the first ``rows - 1`` on distinct prompts, the last repeating the first
    prompt, as the n samples of one prompt do); each waits ``tool_delays[i]`` seconds between its turns. Returns
    each conversation's two turns' tokens and log-probs."""
    model, tokenizer = llama
    generator = TurnGenerator(NativeEngine(model, tokenizer), SamplingParams(temperature=1.0, max_tokens=12, seed=seed))
    prompts = chat_prompts(tokenizer)[: rows - 1] + chat_prompts(tokenizer)[:1]

    async def conversation(prompt, delay):
        first = await generator.generate(prompt, max_tokens=4 + 3 * len(prompt) % 7)
        await asyncio.sleep(delay)
        second = await generator.generate(prompt + first.token_ids + prompt[-3:], max_tokens=9)
        return [(c.token_ids, c.logprobs) for c in (first, second)]

    async def everyone():
        return await asyncio.gather(*(conversation(p, d) for p, d in zip(prompts, tool_delays)))

    try:
        return asyncio.run(everyone())
    finally:
        generator.close()


def test_a_seed_gives_the_same_turns_whatever_order_the_tools_answer_in(llama):
    """The tool delays change when each second turn joins and which turns share its steps; with the draws keyed by
    request, not by row, the turns stay the same."""
    fast_first = run_conversations(llama, [0.0, 0.05, 0.1])
    slow_first = run_conversations(llama, [0.1, 0.05, 0.0])
    for a, b in zip(fast_first, slow_first):
        for (tokens_a, logprobs_a), (tokens_b, logprobs_b) in zip(a, b):
            assert tokens_a == tokens_b
            assert logprobs_a == pytest.approx(logprobs_b, abs=1e-5)  # rows batched apart: last-bit differences
    assert fast_first[0][0][0] != fast_first[2][0][0]  # the same prompt twice: two different samples
    assert run_conversations(llama, [0.0, 0.0, 0.0], seed=1)[0] != fast_first[0]


def test_an_engine_error_reaches_every_waiting_turn_and_the_queue_serves_on(llama):
    model, tokenizer = llama

    class FailingEngine(NativeEngine):
        steps = 0

        def _step(self, run):
            self.steps += 1
            if self.steps == 3:
                raise RuntimeError("device lost")
            super()._step(run)

    generator = TurnGenerator(FailingEngine(model, tokenizer), PARAMS)
    prompts = chat_prompts(tokenizer)

    async def ask():
        turns = [generator.generate(p, max_tokens=10) for p in prompts]
        return await asyncio.wait_for(asyncio.gather(*turns, return_exceptions=True), HANG_GUARD_S)

    results = asyncio.run(ask())
    assert [str(r) for r in results] == ["device lost"] * len(prompts)
    later = asyncio.run(ask())  # the run was emptied: later turns decode
    generator.close()
    assert [len(c.token_ids) for c in later] == [10] * len(prompts)


def test_closing_the_generator_fails_the_turns_still_queued(llama):
    model, tokenizer = llama
    generator = TurnGenerator(NativeEngine(model, tokenizer), PARAMS)
    request = generator.turns.queue.submit(chat_prompts(tokenizer)[0], PARAMS)  # never started: nobody steps it
    generator.close()
    with pytest.raises(RolloutError, match="closed"):
        request.future.result(HANG_GUARD_S)


class BreakingLoop:
    """An agent loop that raises after its first turn when its row says so; other rows ask for one long turn."""

    def __init__(self, context, **kwargs):
        self.context = context

    async def run(self, row, generator):
        if row["breaks"]:
            await generator.generate(row["raw_prompt_ids"], max_tokens=2)
            raise ValueError("the loop broke")
        await generator.generate(row["raw_prompt_ids"], max_tokens=300)


def test_a_loop_that_raises_leaves_no_turn_decoding_after_the_rollout(llama, monkeypatch):
    """The manager closes the turn queue: the long turn ends with the rollout instead of decoding on in the
    driver thread while the trainer goes on (and, say, loads new weights into the engine)."""
    from hybridflow.agents import AgentContext, AgentLoopManager, MultiTurnSettings
    from hybridflow.agents.base import AGENT_LOOPS

    model, tokenizer = llama
    monkeypatch.setitem(AGENT_LOOPS, "breaking_test_loop", BreakingLoop)
    context = AgentContext(tokenizer=tokenizer, settings=MultiTurnSettings(prompt_length=64, response_length=300))
    manager = AgentLoopManager(engine=NativeEngine(model, tokenizer), context=context,
                               default_agent_loop="breaking_test_loop")
    prompts = chat_prompts(tokenizer)[:2]
    rows = [{"raw_prompt_ids": prompts[0], "breaks": False}, {"raw_prompt_ids": prompts[1], "breaks": True}]
    with pytest.raises(ValueError, match="the loop broke"):
        manager.run(rows, PARAMS)
    assert [t for t in threading.enumerate() if t.name == "hybridflow-request-queue"] == []


def test_a_batch_of_turns_is_in_conversation_order_whatever_order_they_arrive_in(tiny_tokenizer):
    """Which row of an engine call samples which draws must not depend on which tool thread answered first: the
    batch's rows are ordered by their conversation's index (``CONVERSATION``, set by the manager in each loop)."""
    from hybridflow.agents.generator import CONVERSATION
    from tests.agents.scripted import ScriptedEngine

    seen = []
    engine = ScriptedEngine(tiny_tokenizer, lambda text: seen.append(text) or "ok")
    turns = BatchedTurns(engine, PARAMS)
    prompts = [tiny_tokenizer(f"conversation {i}", add_special_tokens=False)["input_ids"] for i in range(4)]

    async def conversation(index):
        CONVERSATION.set(index)
        return await turns.generate(prompts[index], max_tokens=8)

    async def everyone():  # the last conversation asks first
        return await asyncio.gather(*(conversation(i) for i in reversed(range(4))))

    asyncio.run(everyone())
    assert engine.batch_sizes == [4]
    assert seen == [f"conversation {i}" for i in range(4)]


def test_a_turn_with_images_on_an_engine_that_cannot_encode_them_is_one_clear_error(llama, monkeypatch):
    """The native queue submits a turn with images as ``engine.encode_images``' encoding; an engine without it says
    so (text turns never ask for it)."""
    import torch

    monkeypatch.delattr(NativeEngine, "encode_images", raising=False)
    model, tokenizer = llama
    generator = TurnGenerator(NativeEngine(model, tokenizer), PARAMS)
    prompt = chat_prompts(tokenizer)[0]
    images = {"pixel_values": torch.zeros(4, 8), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    try:
        with pytest.raises(RolloutError, match="cannot decode a conversation with images .*rollout.name=hf"):
            asyncio.run(generator.generate(prompt, max_tokens=4, multi_modal_inputs=images))
        assert len(asyncio.run(generator.generate(prompt, max_tokens=4)).token_ids) == 4
    finally:
        generator.close()
