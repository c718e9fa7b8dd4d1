"""GLM-4.5 (``glm4_moe``) in the native engine (issue 58): Llama's attention with partial rotary, optional q / k norms
and q / k / v biases, and DeepSeek-V3's group-limited routing with shared experts, against HF's own model (fp32)."""

import pytest
import torch

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.native import NativeEngine
from tests.models.non_native import build_non_native
from tests.rollout.conftest import chat_prompts, randomise_norms
from tests.rollout.test_chunked_prefill import mixed_prompts
from tests.rollout.test_native import hf_greedy
from tests.rollout.test_paged_engine import assert_greedy_as_hf, tight_blocks

VARIANTS = {
    "default": {},  # partial_rotary_factor 0.5, one group, no q / k norms, no biases
    "qk_norm+bias+groups": dict(use_qk_norm=True, attention_bias=True, n_group=2, topk_group=1),
}


def glm(seed: int = 1, **overrides):
    """A tiny random GLM-4.5 (dense then sparse layer; 4 experts, 1 shared) with random norms, biases and routing
    bias, so a skipped one changes the numbers."""
    model, tokenizer = build_non_native("glm4_moe", seed=seed, **overrides)
    randomise_norms(model, seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.state_dict(keep_vars=True).items():
            if name.endswith(("e_score_correction_bias", "proj.bias")):
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.2)
    return model, tokenizer


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_and_logprobs_equal_hf_under_chunking_preemption_and_prefix_sharing(variant):
    model, tokenizer = glm(**VARIANTS[variant])
    prompts, eos = mixed_prompts(tokenizer), tokenizer.eos_token_id
    params = SamplingParams(n=2, temperature=0, max_tokens=24, stop_token_ids=[eos], logprobs=True)
    engine = NativeEngine(model, tokenizer, max_num_seqs=5, max_num_batched_tokens=17, enable_chunked_prefill=True,
                          prefix_cache_tokens=4096, num_kv_blocks=tight_blocks(prompts, 24, spare=3))
    assert engine.decoder.rotary_dim == 8 and engine.decoder.head_dim == 16
    assert_greedy_as_hf(engine, model, prompts, params, eos=eos)


def test_full_rotary_decodes_fused_and_an_owning_engine_takes_new_weights():
    """With ``partial_rotary_factor=1`` the C kernels' fused step runs (the sparse layer's grouped routing in it);
    an engine that owns its model (projections released) takes another model's weights, experts and routing bias
    included, and answers as that model does."""
    model, tokenizer = glm(seed=1, partial_rotary_factor=1.0)
    other, _ = glm(seed=2, partial_rotary_factor=1.0)
    prompts, eos = chat_prompts(tokenizer), tokenizer.eos_token_id
    params = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[eos])
    reference = [hf_greedy(model, p, max_new_tokens=12, eos=eos) for p in prompts]
    engine = NativeEngine(model, tokenizer, own_model=True)
    assert engine.decoder.fused_cpu_decode == engine.decoder.paged_cpu_attention
    assert [c.token_ids for c in engine.generate(prompts, params)] == reference
    engine.load_weights(list(other.state_dict().items()))
    after = [c.token_ids for c in engine.generate(prompts, params)]
    assert after == [hf_greedy(other, p, max_new_tokens=12, eos=eos) for p in prompts] and after != reference


def test_partial_rotary_decodes_through_the_fused_c_step_as_the_eager_one():
    """The C kernels' fused step turns the first 8 of 16 dimensions as the torch step does: logits and the keys and
    values written equal (q / k norms and biases on)."""
    from hybridflow.rollout import cpu_kernels
    from hybridflow.rollout.decoder import LlamaFamilyDecoder
    from tests.rollout.conftest import assert_fused_step_equals_eager

    if cpu_kernels.library() is None:
        pytest.skip("no C compiler: the kernels are not built")
    model, _ = glm(**VARIANTS["qk_norm+bias+groups"])
    decoder = LlamaFamilyDecoder(model)
    assert decoder.fused_cpu_decode and decoder.rotary_dim == 8
    assert_fused_step_equals_eager(decoder)
