"""The turn generator batches the loops' turns; on the native engine each turn keeps its own budget."""

import asyncio

from hybridflow.agents import TurnGenerator
from hybridflow.models.tiny import build_tiny_model
from hybridflow.rollout import SamplingParams
from hybridflow.rollout.native import NativeEngine
from tests.rollout.conftest import chat_prompts


class CountingEngine(NativeEngine):
    """The native engine, recording each call's per-prompt budgets and its decode steps."""

    calls: list
    steps = 0

    def generate(self, prompts, params):
        self.calls.append([p.max_tokens for p in params] if isinstance(params, list) else params.max_tokens)
        return super().generate(prompts, params)

    def _step(self, run):
        self.steps += 1
        super()._step(run)


def test_each_turn_decodes_to_its_own_budget_in_one_engine_call(tiny_tokenizer):
    model, tokenizer = build_tiny_model("llama", seed=1, tokenizer=tiny_tokenizer)
    engine = CountingEngine(model, tokenizer)
    engine.calls = []
    params = SamplingParams(temperature=1.0, max_tokens=64, seed=0, ignore_eos=True)
    generator = TurnGenerator(engine, params)
    prompts = chat_prompts(tokenizer)[:3]

    async def turns():
        return await asyncio.gather(*(generator.generate(p, max_tokens=m) for p, m in zip(prompts, (2, 5, 30))))

    completions = asyncio.run(turns())
    assert engine.calls == [[2, 5, 30]]  # one call, each turn its own budget
    assert [len(c.token_ids) for c in completions] == [2, 5, 30]
    assert engine.steps == 29  # the longest turn's steps only: the short ones left their slots early
