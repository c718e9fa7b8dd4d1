"""The CUDA decode path of issue 58's architectures (``make test-gpu``): gpt-oss (attention sinks, alternating sliding
windows) and GLM-4.5 (partial rotary) through the fused Triton step, DeepSeek-V3 (MLA) through its latent-cache Triton
kernel, each replayed from CUDA graphs: against eager steps, HF's greedy tokens and log-probs, and weight reloads.
The kernels themselves: test_triton_variants.py and test_triton_mla.py (interpreted on CPU)."""

import pytest
import torch

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.block_manager import BLOCK_SIZE
from hybridflow.rollout.native import NativeEngine
from tests.models.non_native import build_non_native
from tests.rollout.conftest import chat_prompts
from tests.rollout.test_native import teacher_forced_logits

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ARCHS = ["gpt_oss", "glm4_moe", "deepseek_v3"]


def _model(arch: str, seed: int = 1):
    model, tokenizer = build_non_native(arch, seed=seed)
    return model.to("cuda"), tokenizer


def _hf_greedy(model, prompt: list[int], *, max_new_tokens: int, eos: int) -> list[int]:
    out = model.generate(torch.tensor([prompt], device="cuda"), do_sample=False, max_new_tokens=max_new_tokens,
                         attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device="cuda"),
                         eos_token_id=eos, pad_token_id=eos)
    tokens = out[0, len(prompt):].tolist()
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


@pytest.mark.parametrize("arch", ARCHS)
def test_graph_replay_equals_eager_steps(arch):
    model, tokenizer = _model(arch)
    graphed = NativeEngine(model, tokenizer, max_num_seqs=5)
    eager = NativeEngine(model, tokenizer, max_num_seqs=5, enforce_eager=True)
    assert graphed.triton_kernels and not graphed.enforce_eager
    prompts, eos = chat_prompts(tokenizer), tokenizer.eos_token_id
    mixed = [SamplingParams(n=3, temperature=0, max_tokens=30, stop_token_ids=[eos], logprobs=True),
             SamplingParams(n=2, temperature=0.8, top_p=0.9, max_tokens=17, seed=4, logprobs=True),
             SamplingParams(n=1, temperature=1.2, top_k=9, max_tokens=40, ignore_eos=True, logprobs=True),
             SamplingParams(n=2, temperature=0, max_tokens=8, logprobs=True)]
    got, expected = graphed.generate(prompts, mixed), eager.generate(prompts, mixed)
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]
    for a, b in zip(got, expected):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-5)
    assert len(graphed.graphs.graphs) > 1  # several buckets were captured as the batch drained


@pytest.mark.parametrize("arch", ARCHS)
def test_graph_replay_under_preemption_equals_hf(arch):
    """fp32, a block budget of one sequence and a spare (preemption, recomputed prompts): HF's greedy tokens, and the
    log-probs of HF's forward within 1e-5."""
    model, tokenizer = _model(arch)
    prompts, eos = chat_prompts(tokenizer), tokenizer.eos_token_id
    max_len = max(map(len, prompts)) + 30
    graphed = NativeEngine(model, tokenizer, max_model_len=max_len, num_kv_blocks=-(-max_len // BLOCK_SIZE) + 3)
    completions = graphed.generate(prompts, SamplingParams(n=2, temperature=0, max_tokens=30, stop_token_ids=[eos],
                                                           logprobs=True))
    assert graphed.preemptions > 0 and graphed.graphs is not None
    for completion in completions:
        prompt = prompts[completion.prompt_index]
        assert completion.token_ids == _hf_greedy(model, prompt, max_new_tokens=30, eos=eos)
        logits = teacher_forced_logits(model, prompt, completion.token_ids).float()
        expected = logits.log_softmax(-1).gather(1, torch.tensor(completion.token_ids, device="cuda")[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected.cpu(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_graph_replay_follows_weight_reloads(arch):
    """New weights are copied into the tensors the graphs read (sinks, latent projections, experts and routing bias
    included): the captured graphs are kept and answer as the new model does."""
    graphed_model, tokenizer = _model(arch, seed=1)
    other, _ = _model(arch, seed=5)
    graphed = NativeEngine(graphed_model, tokenizer)
    prompts = chat_prompts(tokenizer)
    params = SamplingParams(n=2, temperature=1.0, max_tokens=16, seed=0)
    before = [c.token_ids for c in graphed.generate(prompts, params)]
    graphs = graphed.graphs
    graphed.load_weights(other.state_dict().items())
    assert graphed.graphs.valid_for(graphed.cache)
    after = [c.token_ids for c in graphed.generate(prompts, params)]
    fresh = NativeEngine(other, tokenizer, enforce_eager=True)
    assert after == [c.token_ids for c in fresh.generate(prompts, params)]
    assert after != before and graphed.graphs is graphs
