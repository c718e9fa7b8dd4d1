"""The CUDA decode path (``make test-gpu``): the engine's CUDA-graph replay against eager steps (continuous
batching, mixed sampling, weight reloads). The kernels themselves: test_triton_kernels.py."""

import pytest
import torch

from hybridflow.models.tiny import build_tiny_model
from hybridflow.rollout import SamplingParams
from hybridflow.rollout.native import NativeEngine
from tests.rollout.conftest import chat_prompts, randomise_norms

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _engines(arch, tiny_tokenizer, dtype=torch.float32, **kwargs):
    model, tokenizer = build_tiny_model(arch, seed=1, tokenizer=tiny_tokenizer)
    if arch in ("qwen3", "gemma3_text", "qwen3_moe"):  # q / k norms (Gemma's also by 1 + w, four norms a layer)
        randomise_norms(model)
    model = model.to("cuda", dtype)
    graphed = NativeEngine(model, tokenizer, **kwargs)
    eager = NativeEngine(model, tokenizer, enforce_eager=True, **kwargs)
    assert graphed.triton_kernels and not graphed.enforce_eager
    return graphed, eager, tokenizer


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3_text", "mixtral", "qwen3_moe"])
def test_graph_replay_equals_eager_steps_with_continuous_batching(tiny_tokenizer, arch):
    graphed, eager, tokenizer = _engines(arch, tiny_tokenizer, max_num_seqs=5)
    prompts = chat_prompts(tokenizer)
    eos = tokenizer.eos_token_id
    mixed = [SamplingParams(n=3, temperature=0, max_tokens=30, stop_token_ids=[eos]),
             SamplingParams(n=2, temperature=0.8, top_p=0.9, max_tokens=17, seed=4),
             SamplingParams(n=1, temperature=1.2, top_k=9, min_p=0.02, max_tokens=40, ignore_eos=True),
             SamplingParams(n=2, temperature=0, max_tokens=8)]
    for params in (mixed, SamplingParams(n=4, temperature=1.0, max_tokens=24, seed=7)):
        got, expected = graphed.generate(prompts, params), eager.generate(prompts, params)
        assert [c.token_ids for c in got] == [c.token_ids for c in expected]
        for a, b in zip(got, expected):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-5)
    assert len(graphed.graphs.graphs) > 1  # several buckets were captured as the batch drained


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "qwen3_moe"])  # Gemma's norms; routed experts (gathered)
def test_graph_replay_follows_weight_reloads(tiny_tokenizer, arch):
    graphed, eager, tokenizer = _engines(arch, tiny_tokenizer)
    other, _ = build_tiny_model(arch, seed=5, tokenizer=tiny_tokenizer)
    randomise_norms(other, seed=3)
    prompts = chat_prompts(tokenizer)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=16, seed=0)  # greedy: tied random models repeat
    before = [c.token_ids for c in graphed.generate(prompts, params)]
    graphs = graphed.graphs
    graphed.load_weights(other.state_dict().items())  # eager shares the module: it sees the new weights too
    assert graphed.graphs.valid_for(graphed.cache)  # copied in place: the captured graphs are kept
    fresh = NativeEngine(other.to("cuda"), tokenizer, enforce_eager=True)
    after = [c.token_ids for c in graphed.generate(prompts, params)]
    assert after == [c.token_ids for c in fresh.generate(prompts, params)]
    assert after != before and graphed.graphs is graphs


def test_graph_replay_with_preemption_and_shared_blocks_equals_hf_greedy(tiny_tokenizer):
    """A block budget of one sequence and a spare: the graphs replay over block tables that change as samples
    copy their partial prompt block and sequences are preempted and recomputed."""
    from hybridflow.rollout.block_manager import BLOCK_SIZE
    from tests.rollout.test_native import hf_greedy

    model, tokenizer = build_tiny_model("llama", seed=1, tokenizer=tiny_tokenizer)
    model = model.to("cuda")
    prompts, eos = chat_prompts(tokenizer), tokenizer.eos_token_id
    max_len = max(map(len, prompts)) + 30
    graphed = NativeEngine(model, tokenizer, max_model_len=max_len, num_kv_blocks=-(-max_len // BLOCK_SIZE) + 3)
    params = SamplingParams(n=3, temperature=0, max_tokens=30, stop_token_ids=[eos])
    completions = graphed.generate(prompts, params)
    assert graphed.preemptions > 0 and graphed.graphs is not None
    references = [hf_greedy(model, p, max_new_tokens=30, eos=eos) for p in prompts]
    assert [c.token_ids for c in completions] == [references[c.prompt_index] for c in completions]


def test_overlapped_steps_replay_the_synchronous_outputs(tiny_tokenizer):
    """``overlap_steps`` (the default on CUDA): each step's input tokens are copied device-to-device from the previous
    step's samples into the graphs' static input, and read back after the next launch; the outputs are the
    synchronous steps' (keyed draws, mixed requests, rows ending mid-run). A row decoded once past its end can move
    the batch to a larger graph bucket, whose kernels may round otherwise: log-probs within 1e-5."""
    from hybridflow.rollout.request_queue import RequestQueue

    model, tokenizer = build_tiny_model("llama", seed=1, tokenizer=tiny_tokenizer)
    model = model.to("cuda")
    prompts, eos = chat_prompts(tokenizer), tokenizer.eos_token_id
    mixed = [SamplingParams(n=3, temperature=0, max_tokens=30, stop_token_ids=[eos], logprobs=True),
             SamplingParams(n=2, temperature=0.8, top_p=0.9, max_tokens=17, seed=4, logprobs=True),
             SamplingParams(n=1, temperature=1.2, repetition_penalty=1.2, max_tokens=40, ignore_eos=True, seed=5,
                            logprobs=True),
             SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=6, logprobs=True)]
    outputs, runs = [], []
    for overlap in (None, False):
        engine = NativeEngine(model, tokenizer, max_num_seqs=5, overlap_steps=overlap)
        queue = RequestQueue(engine, keyed_draws=True)
        requests = [queue.submit(p, q) for p, q in zip(prompts, mixed)]
        queue.drain()
        queue.close()
        outputs.append([c for r in requests for c in r.future.result()])
        runs.append(queue.run)
    assert [c.token_ids for c in outputs[0]] == [c.token_ids for c in outputs[1]]
    for a, b in zip(*outputs):
        assert a.finish_reason == b.finish_reason
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-5)
    assert runs[0].overlapped_readbacks > 0 and runs[1].overlapped_readbacks == 0
