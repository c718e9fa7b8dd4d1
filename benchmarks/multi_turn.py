"""Multi-turn rollouts: turns/s of the native engine with prefix reuse vs re-prefilling every turn.

Workload (a tool-use conversation, engine level): ``B`` conversations, each a chat prompt with a
system message of ``--system-tokens`` tokens; every turn generates ``--turn-tokens`` tokens (EOS
ignored, so every turn costs the same), then a fixed tool observation is appended and the next
turn starts from the whole context. With ``prefix_cache_tokens`` the engine keeps each finished
turn's KV and prefills only the observation; without, it prefills the whole context again.
Turns/s = B x turns / wall seconds (engine construction excluded). Both engines produce the same
greedy tokens (checked).

    python benchmarks/multi_turn.py                       # SmolLM2-135M-Instruct, fp32, 2 threads
    python benchmarks/multi_turn.py --model-path tiny     # a random tiny model built in code (seconds)

``--agent-loops``: the same conversations at the agent-loop level, as ``TurnGenerator`` serves them. Each
conversation is a coroutine on one event loop that awaits ``generate(context, max_tokens=k)`` for a turn,
then calls a simulated tool (``time.sleep`` in its own thread through ``call_bounded``, as the tool agent
calls tools) and appends the observation. Turn lengths (1/4 to 2x ``--turn-tokens``) and tool latencies
(0 to ``--tool-ms``) are drawn per conversation and turn from a fixed seed, so conversations run out of
step. Two ways to serve the turns, on the same engine settings, in the same run:

- ``batch`` (``BatchedTurns``, how every backend was served before the request queue): the turns asked
  together go to ``engine.generate`` as one batch; a turn asked while it runs waits for it to end;
- ``queue`` (``QueuedTurns``, the native engine's default): each turn joins the running batch at the
  next decode step and returns when its own completion ends.

Reported: turns/s, and the mean rows of a decode step (occupancy) with its steps. Greedy, EOS ignored:
both give the same tokens (checked), so both do the same work.

    python benchmarks/multi_turn.py --agent-loops --model-path tiny
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see benchmarks/rollout.py

import torch  # noqa: E402

OBSERVATION = "\n<|im_start|>tool\n{result}<|im_end|>\n<|im_start|>assistant\n"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None, help="HF folder, 'tiny', or default: SmolLM2-135M-Instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--turn-tokens", type=int, default=16)
    parser.add_argument("--system-tokens", type=int, default=256, help="about this many tokens of system prompt")
    parser.add_argument("--agent-loops", action="store_true", help="agent-loop level: batch path vs request queue")
    parser.add_argument("--tool-ms", type=float, default=50.0, help="--agent-loops: longest simulated tool latency")
    parser.add_argument("--repeats", type=int, default=1, help="--agent-loops: runs of each path, interleaved")
    return parser.parse_args(argv)


def load(model_path: str | None):
    if model_path == "tiny":
        from hybridflow.models.tiny import build_tiny_model

        return build_tiny_model("llama", seed=0)
    from hybridflow.models import fetch_default_model, load_causal_lm, load_tokenizer

    path = model_path or fetch_default_model()
    return load_causal_lm(path, dtype="float32").eval().requires_grad_(False), load_tokenizer(path)


def first_prompts(tokenizer, *, count: int, system_tokens: int) -> list[list[int]]:
    words = " ".join(["You can call tools to compute and to check answers."] * max(1, system_tokens // 10))
    prompts = []
    for i in range(count):
        messages = [{"role": "system", "content": words}, {"role": "user", "content": f"What is {17 + i} * {23 + i}?"}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return prompts


def run_conversations(engine, tokenizer, prompts: list[list[int]], *, turns: int, turn_tokens: int):
    """(seconds, generated ids per conversation and turn)."""
    from hybridflow.rollout import SamplingParams

    params = SamplingParams(n=1, temperature=0.0, max_tokens=turn_tokens, stop_token_ids=[], logprobs=True)
    contexts, generated = [list(p) for p in prompts], []
    start = time.perf_counter()
    for turn in range(turns):
        completions = engine.generate(contexts, params)
        generated.append([c.token_ids for c in completions])
        observation = tokenizer(OBSERVATION.format(result=391 + turn), add_special_tokens=False)["input_ids"]
        contexts = [ctx + c.token_ids + observation for ctx, c in zip(contexts, completions)]
    return time.perf_counter() - start, generated


def agent_plans(*, conversations: int, turns: int, turn_tokens: int, tool_ms: float, seed: int = 0):
    """Per conversation, per turn: ``(tokens to generate, seconds its tool call takes after it)``."""
    rng = random.Random(seed)
    low, high = max(1, turn_tokens // 4), 2 * turn_tokens
    return [[(rng.randint(low, high), rng.uniform(0.0, tool_ms) / 1000) for _ in range(turns)]
            for _ in range(conversations)]


async def converse(generator, prompt: list[int], plan, observation: list[int]) -> list[list[int]]:
    """One agent loop: a turn, its tool call, the observation appended; the turns' tokens."""
    from hybridflow.tools.bounded import call_bounded

    context, generated = list(prompt), []
    for tokens, latency in plan:
        completion = await generator.generate(context, max_tokens=tokens)
        generated.append(completion.token_ids)
        await call_bounded(time.sleep, latency, timeout_s=None, what="simulated tool")
        context += completion.token_ids + observation
    return generated


def occupancy_engine(model, tokenizer):
    """The native engine (prefix reuse on), counting the rows and the seconds of each decode step."""
    from hybridflow.rollout.native import NativeEngine

    class OccupancyEngine(NativeEngine):
        rows: list[int]
        decode_s: float

        def _step(self, run):
            self.rows.append(len(run.live))
            start = time.perf_counter()
            super()._step(run)
            self.decode_s += time.perf_counter() - start

    engine = OccupancyEngine(model, tokenizer, prefix_cache_tokens=1 << 20)
    engine.rows, engine.decode_s = [], 0.0
    return engine


def run_agent_loops(path: str, engine, prompts, plans, observation):
    """(seconds, tokens per conversation and turn) of every conversation's loop on one event loop."""
    from hybridflow.agents.generator import BatchedTurns, QueuedTurns
    from hybridflow.rollout import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, seed=0)
    longest = max(len(p) + sum(t + len(observation) for t, _ in plan) for p, plan in zip(prompts, plans))
    turns = BatchedTurns(engine, params) if path == "batch" else QueuedTurns(engine, params, max_len=longest,
                                                                               conversations=len(prompts))

    async def everyone():
        return await asyncio.gather(*(converse(turns, p, plan, observation) for p, plan in zip(prompts, plans)))

    start = time.perf_counter()
    try:
        generated = asyncio.run(everyone())
    finally:
        turns.close()
    return time.perf_counter() - start, generated


def agent_main(args, model, tokenizer) -> dict[str, float]:
    prompts = first_prompts(tokenizer, count=args.conversations, system_tokens=args.system_tokens)
    plans = agent_plans(conversations=args.conversations, turns=args.turns, turn_tokens=args.turn_tokens,
                        tool_ms=args.tool_ms)
    observation = tokenizer(OBSERVATION.format(result=391), add_special_tokens=False)["input_ids"]
    total_turns = args.conversations * args.turns
    print(f"agent loops: {args.conversations} conversations x {args.turns} turns of {max(1, args.turn_tokens // 4)}"
          f"-{2 * args.turn_tokens} tokens, tools 0-{args.tool_ms:g} ms; first prompt {len(prompts[0])} tokens; "
          f"torch threads {torch.get_num_threads()}; load average {os.getloadavg()[0]:.2f}")
    engines = {path: occupancy_engine(model, tokenizer) for path in ("batch", "queue")}
    seconds, outputs = {"batch": [], "queue": []}, {}
    for path, engine in engines.items():  # warm-up: one short conversation
        run_agent_loops(path, engine, prompts[:1], [[(2, 0.0)]], observation)
        engine.rows.clear()
        engine.decode_s = 0.0
    for _ in range(args.repeats):
        for path, engine in engines.items():
            took, outputs[path] = run_agent_loops(path, engine, prompts, plans, observation)
            seconds[path].append(took)
    results = {}
    for path, engine in engines.items():
        best = min(seconds[path])
        results[path] = total_turns / best
        steps = len(engine.rows) // args.repeats
        occupancy = sum(engine.rows) / max(len(engine.rows), 1)
        print(f"{path:>6}: {best:6.2f} s (best of {args.repeats}), {results[path]:6.2f} turns/s, {steps} decode steps "
              f"({engine.decode_s / args.repeats:5.2f} s a run), mean rows per step {occupancy:5.2f} of "
              f"{args.conversations}")
    print(f"queue / batch: {results['queue'] / results['batch']:.2f}x turns/s; same greedy tokens: "
          f"{outputs['batch'] == outputs['queue']}; load average now {os.getloadavg()[0]:.2f}")
    return results


def main(argv=None) -> dict[str, float]:
    from hybridflow.rollout.native import NativeEngine

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model_path)
    if args.agent_loops:
        return agent_main(args, model, tokenizer)
    prompts = first_prompts(tokenizer, count=args.conversations, system_tokens=args.system_tokens)
    total_turns = args.conversations * args.turns
    print(f"{args.conversations} conversations x {args.turns} turns of {args.turn_tokens} tokens; first prompt "
          f"{len(prompts[0])} tokens; torch threads {torch.get_num_threads()}")
    results, outputs = {}, {}
    for name, budget in (("re-prefill", 0), ("prefix reuse", 1 << 20)):
        engine = NativeEngine(model, tokenizer, prefix_cache_tokens=budget)
        run_conversations(engine, tokenizer, prompts[:1], turns=1, turn_tokens=2)  # warm-up
        seconds, outputs[name] = run_conversations(engine, tokenizer, prompts, turns=args.turns,
                                                   turn_tokens=args.turn_tokens)
        results[name] = total_turns / seconds
        reused = engine.allocator.reused_tokens
        print(f"{name:>12}: {seconds:6.2f} s, {results[name]:6.2f} turns/s (prefill tokens reused: {reused})")
    same = outputs["re-prefill"] == outputs["prefix reuse"]
    print(f"speed-up {results['prefix reuse'] / results['re-prefill']:.2f}x; same greedy tokens: {same}")
    return results


if __name__ == "__main__":
    main()
