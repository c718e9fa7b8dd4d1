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
"""

from __future__ import annotations

import argparse
import os
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


def main(argv=None) -> dict[str, float]:
    from hybridflow.rollout.native import NativeEngine

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model_path)
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
