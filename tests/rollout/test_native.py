"""The native engine against HF ``generate`` and a teacher-forced forward pass."""

import pytest
import torch

from hybridflow.errors import RolloutError
from hybridflow.models.tiny import build_tiny_model
from hybridflow.rollout import SamplingParams, build_engine
from hybridflow.rollout.native import NativeEngine
from tests.rollout.conftest import chat_prompts


def hf_greedy(model, prompt: list[int], *, max_new_tokens: int, eos: int) -> list[int]:
    """Reference: HF generate on one unpadded prompt, cut after the first EOS."""
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos)
    tokens = out[0, len(prompt):].tolist()
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def teacher_forced_logits(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """``[len(response), V]`` logits that predicted each response token."""
    ids = torch.tensor([prompt + response], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    return logits[len(prompt) - 1 : -1]


def test_greedy_equals_hf_generate_token_for_token(tiny, kernel_path):
    model, tokenizer = tiny
    prompts = chat_prompts(tokenizer)
    eos = tokenizer.eos_token_id
    params = SamplingParams(n=2, temperature=0, max_tokens=24, stop_token_ids=[eos])
    engine = build_engine("native", model, tokenizer)
    assert isinstance(engine, NativeEngine)  # not the HF fallback
    completions = engine.generate(prompts, params)
    assert [c.prompt_index for c in completions] == [0, 0, 1, 1, 2, 2, 3, 3]
    references = [hf_greedy(model, prompt, max_new_tokens=24, eos=eos) for prompt in prompts]
    for completion in completions:
        expected = references[completion.prompt_index]
        assert completion.token_ids == expected
        assert completion.finish_reason == ("stop" if expected[-1] == eos else "length")


def count_fused_steps(engine) -> list[int]:
    """Each call of the engine's fused decode step (the real one, run as it is) appends to the returned list."""
    calls, fused = [], engine.decoder._decode_fused
    engine.decoder._decode_fused = lambda **kwargs: calls.append(1) or fused(**kwargs)
    return calls


@pytest.mark.parametrize("arch", ["gemma2", "gemma3_text", "mixtral", "qwen3_moe"])
def test_gemma_and_moe_models_decode_fused_and_greedy_like_hf_generate(tiny_tokenizer, arch, kernel_path):
    """Gemma 2 / 3 and the mixtures of experts decode through the fused step (C kernels on CPU), every step of it,
    and still answer as HF ``generate`` does, token for token."""
    from tests.rollout.conftest import randomise_norms

    model, tokenizer = build_tiny_model(arch, seed=1, tokenizer=tiny_tokenizer)
    randomise_norms(model)
    prompts = chat_prompts(tokenizer)
    eos = tokenizer.eos_token_id
    engine = build_engine("native", model, tokenizer)
    assert isinstance(engine, NativeEngine) and engine.decoder.fused_cpu_decode
    calls = count_fused_steps(engine)
    completions = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[eos]))
    assert [c.token_ids for c in completions] == [hf_greedy(model, p, max_new_tokens=16, eos=eos) for p in prompts]
    assert len(calls) >= max(len(c.token_ids) for c in completions) - 1  # every decode step (the first: prefill)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, -1, 1.0), (0.7, -1, 1.0), (1.3, 20, 0.9)])
def test_sampled_logprobs_equal_teacher_forced_forward(tiny, temperature, top_k, top_p, kernel_path):
    """Every architecture of the table, number for number against HF's own forward (greedy parity alone
    is weak on tiny tied models, whose greedy answers repeat a token)."""
    model, tokenizer = tiny
    prompts = chat_prompts(tokenizer)[:2]
    params = SamplingParams(n=3, temperature=temperature, top_k=top_k, top_p=top_p, max_tokens=16, seed=0)
    for completion in build_engine("native", model, tokenizer).generate(prompts, params):
        z = teacher_forced_logits(model, prompts[completion.prompt_index], completion.token_ids) / temperature
        if top_k > 0:
            z = z.masked_fill(z < z.topk(top_k, dim=-1).values[:, -1:], float("-inf"))
        if top_p < 1:
            sorted_z, order = z.sort(dim=-1, descending=True)
            probs = sorted_z.softmax(-1)
            drop = probs.cumsum(-1) - probs >= top_p
            z = z.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
        expected = z.log_softmax(-1).gather(-1, torch.tensor(completion.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4)


def test_fewer_slots_than_sequences_gives_same_greedy_outputs(tiny_llama):
    model, tokenizer = tiny_llama
    prompts = chat_prompts(tokenizer)
    params = SamplingParams(n=3, temperature=0, max_tokens=12, stop_token_ids=[tokenizer.eos_token_id])
    wide = NativeEngine(model, tokenizer, max_num_seqs=64).generate(prompts, params)
    narrow = NativeEngine(model, tokenizer, max_num_seqs=2).generate(prompts, params)
    assert [c.token_ids for c in narrow] == [c.token_ids for c in wide]
    assert [c.prompt_index for c in narrow] == [c.prompt_index for c in wide]


def test_continuous_batching_retires_early_stoppers(tiny_llama):
    """A stop token that fires often makes sequences end at different steps; each stops at its first one."""
    model, tokenizer = tiny_llama
    prompts = chat_prompts(tokenizer)
    stop = list(range(3, 60))  # a wide stop set so lengths vary
    params = SamplingParams(n=4, temperature=1.0, max_tokens=20, stop_token_ids=stop, seed=2)
    completions = NativeEngine(model, tokenizer, max_num_seqs=3).generate(prompts, params)
    assert len(completions) == 16 and len({len(c.token_ids) for c in completions}) > 1
    for c in completions:
        assert all(t not in stop for t in c.token_ids[:-1])
        if c.finish_reason == "stop":
            assert c.token_ids[-1] in stop
        else:
            assert len(c.token_ids) == 20
    z = teacher_forced_logits(model, prompts[completions[5].prompt_index], completions[5].token_ids)
    expected = z.log_softmax(-1).gather(-1, torch.tensor(completions[5].token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(completions[5].logprobs), expected, atol=1e-4)


def test_fixed_seed_is_deterministic(tiny_llama):
    model, tokenizer = tiny_llama
    engine = NativeEngine(model, tokenizer)
    prompts = chat_prompts(tokenizer)

    def run(seed):
        params = SamplingParams(n=4, temperature=1.0, max_tokens=10, seed=seed)
        return [c.token_ids for c in engine.generate(prompts, params)]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_stop_string_ends_completion_at_the_token_that_completes_it(tiny_llama):
    model, tokenizer = tiny_llama
    prompts = chat_prompts(tokenizer)[:1]
    free = NativeEngine(model, tokenizer).generate(prompts, SamplingParams(temperature=0, max_tokens=20))[0]
    text = tokenizer.decode(free.token_ids[:6])
    stop_string = text[-2:]
    params = SamplingParams(temperature=0, max_tokens=20, stop=[stop_string])
    stopped = NativeEngine(model, tokenizer).generate(prompts, params)[0]
    assert stopped.finish_reason == "stop"
    assert stop_string in tokenizer.decode(stopped.token_ids)
    assert stop_string not in tokenizer.decode(stopped.token_ids[:-1])
    assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)]


def test_context_limit_ends_with_length(tiny_llama):
    model, tokenizer = tiny_llama
    prompt = chat_prompts(tokenizer)[0]
    engine = NativeEngine(model, tokenizer, max_model_len=len(prompt) + 5)
    completion = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=50))[0]
    assert completion.finish_reason == "length" and len(completion.token_ids) == 5
    with pytest.raises(RolloutError, match="context"):
        engine.generate([prompt + [5] * 5], SamplingParams(max_tokens=1))


def test_max_tokens_one_and_logprobs_off(tiny_llama):
    model, tokenizer = tiny_llama
    completions = NativeEngine(model, tokenizer).generate(chat_prompts(tokenizer), SamplingParams(
        n=2, temperature=1.0, max_tokens=1, logprobs=False, seed=0))
    assert all(len(c.token_ids) == 1 and c.logprobs is None and c.finish_reason == "length" for c in completions)


def test_load_weights_switches_to_the_new_policy(tiny_tokenizer):
    model, tokenizer = build_tiny_model("qwen2", seed=1, tokenizer=tiny_tokenizer)
    trained, _ = build_tiny_model("qwen2", seed=5, tokenizer=tiny_tokenizer)
    engine = build_engine("native", model, tokenizer)
    prompts = chat_prompts(tokenizer)
    params = SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[tokenizer.eos_token_id])
    before = [c.token_ids for c in engine.generate(prompts, params)]
    engine.load_weights(trained.state_dict().items())
    after = [c.token_ids for c in engine.generate(prompts, params)]
    expected = [hf_greedy(trained, p, max_new_tokens=16, eos=tokenizer.eos_token_id) for p in prompts]
    assert after == expected and after != before
    with pytest.raises(RolloutError, match="unknown tensor"):
        engine.load_weights([("model.not_a_layer.weight", torch.zeros(1))])


@pytest.mark.parametrize("arch,tied", [("qwen2", True), ("llama", False)])
def test_an_engine_that_owns_its_model_keeps_one_copy_of_the_projections(tiny_tokenizer, arch, tied, kernel_path):
    """own_model=True drops the module's projection weights once packed; generation and weight loads are
    unchanged (qwen2: q/k/v biases through the fused copy; llama untied: the LM head too)."""
    import copy

    model, tokenizer = build_tiny_model(arch, seed=1, tokenizer=tiny_tokenizer, tie_word_embeddings=tied)
    trained, _ = build_tiny_model(arch, seed=5, tokenizer=tiny_tokenizer, tie_word_embeddings=tied)
    owned = NativeEngine(copy.deepcopy(model), tokenizer, own_model=True)
    shared = NativeEngine(model, tokenizer)
    released = [n for n, p in owned.model.named_parameters() if p.numel() == 0]
    assert len(released) == 7 * model.config.num_hidden_layers + (0 if tied else 1)
    assert ("lm_head.weight" in released) == (not tied)
    prompts = chat_prompts(tokenizer)
    params = SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[tokenizer.eos_token_id])
    assert [c.token_ids for c in owned.generate(prompts, params)] == [c.token_ids for c in shared.generate(prompts, params)]
    owned.load_weights(trained.state_dict().items())
    expected = [hf_greedy(trained, p, max_new_tokens=16, eos=tokenizer.eos_token_id) for p in prompts]
    assert [c.token_ids for c in owned.generate(prompts, params)] == expected
    logits, _ = owned.decoder.prefill(torch.tensor(prompts[0]))
    torch.testing.assert_close(logits, trained(torch.tensor([prompts[0]])).logits[0, -1], rtol=1e-4, atol=1e-4)
    # Once released, a fused projection can only be replaced whole.
    with pytest.raises(RolloutError, match="part of a fused projection"):
        owned.load_weights([("model.layers.0.self_attn.q_proj.weight", trained.model.layers[0].self_attn.q_proj.weight)])
    # A load that leaves the projections out keeps the current ones (and takes the new norms).
    norm = torch.full_like(trained.model.norm.weight, 0.5)
    owned.load_weights([("model.norm.weight", norm)])
    torch.testing.assert_close(owned.decoder.final_norm, norm)
    if arch == "qwen2":  # new q/k/v biases (HF initialises them to 0) alone reach the kept fused projection
        ones = [(f"model.layers.0.self_attn.{p}_proj.bias", torch.ones_like(getattr(trained.model.layers[0].self_attn,
                                                                                       f"{p}_proj").bias)) for p in "qkv"]
        owned.load_weights(ones)
        assert torch.equal(owned.decoder.layers[0].qkv.bias, torch.ones_like(owned.decoder.layers[0].qkv.bias))
    assert [c.token_ids for c in owned.generate(prompts[:1], params)] != []


@pytest.mark.parametrize("arch", ["gemma2", "gemma3_text", "mixtral", "qwen3_moe", "olmo2", "olmo3", "gpt_oss"])
def test_an_owning_engine_takes_new_weights(tiny_tokenizer, arch, kernel_path):
    """A weight sync into an engine that released its projections reaches Gemma's four norms a layer, OLMo's output
    and q / k norms, gpt-oss's sinks, biases and router, and the experts (kept in the module, repacked): the fused
    step then decodes as HF does with the trained weights. The logits within 1e-5: fp32 rounding of these
    logits of magnitude <= 1 (measured <= 3.6e-7 on every architecture and kernel path)."""
    import copy

    from tests.rollout.conftest import randomise_norms

    model, tokenizer = build_tiny_model(arch, seed=1, tokenizer=tiny_tokenizer)
    trained, _ = build_tiny_model(arch, seed=5, tokenizer=tiny_tokenizer)
    randomise_norms(trained, seed=3)
    owned = NativeEngine(copy.deepcopy(model), tokenizer, own_model=True)
    owned.load_weights(trained.state_dict().items())
    prompts = chat_prompts(tokenizer)
    params = SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[tokenizer.eos_token_id])
    expected = [hf_greedy(trained, p, max_new_tokens=16, eos=tokenizer.eos_token_id) for p in prompts]
    calls = count_fused_steps(owned)  # the fused step reads the new norms and experts
    assert [c.token_ids for c in owned.generate(prompts, params)] == expected
    assert calls
    logits, _ = owned.decoder.prefill(torch.tensor(prompts[0]))
    torch.testing.assert_close(logits, trained(torch.tensor([prompts[0]])).logits[0, -1], rtol=1e-5, atol=1e-5)


def test_packed_prefill_equals_one_prompt_at_a_time(tiny):
    model, tokenizer = tiny
    decoder = NativeEngine(model, tokenizer).decoder
    prompts = [torch.tensor(p) for p in chat_prompts(tokenizer)]
    packed = decoder.prefill_many(prompts)
    for prompt, (logits, prefix) in zip(prompts, packed):
        alone_logits, alone_prefix = decoder.prefill(prompt)
        assert prefix.shape == (decoder.num_layers, 2, decoder.kv_heads, len(prompt), decoder.head_dim)
        torch.testing.assert_close(logits, alone_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(prefix, alone_prefix, rtol=1e-5, atol=1e-5)


def test_admission_packs_prefills_within_the_token_budget(tiny_llama, monkeypatch):
    from hybridflow.rollout import native

    model, tokenizer = tiny_llama
    prompts = chat_prompts(tokenizer)
    engine = NativeEngine(model, tokenizer)
    calls = []
    prefill_many = engine.decoder.prefill_many
    monkeypatch.setattr(engine.decoder, "prefill_many",
                        lambda batch, computed: calls.append(len(batch)) or prefill_many(batch, computed))
    params = SamplingParams(n=2, temperature=0, max_tokens=4)
    wide = engine.generate(prompts, params)
    assert calls == [4]  # every prompt fits: one pass
    calls.clear()
    monkeypatch.setattr(native, "PREFILL_TOKEN_BUDGET", max(map(len, prompts[:2])) + 1)
    assert [c.token_ids for c in engine.generate(prompts, params)] == [c.token_ids for c in wide]
    assert calls == [1, 1, 1, 1]  # the budget fits one prompt at a time


def segment_sdpa(scale: float, calls: list | None = None):
    """The CUDA-only varlen FlashAttention call as causal SDPA over each segment (same function), for CPU tests;
    each call's segment count is appended to ``calls``."""
    import torch.nn.functional as F

    def attend(q, k, v, bounds, longest):
        if calls is not None:
            calls.append(len(bounds) - 1)
        out = torch.empty_like(q)
        for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            out[start:end] = F.scaled_dot_product_attention(
                q[start:end].transpose(0, 1), k[start:end].transpose(0, 1), v[start:end].transpose(0, 1),
                is_causal=True, scale=scale, enable_gqa=True).transpose(0, 1)
        return out

    return attend


def test_varlen_prefill_packs_and_unpacks_like_one_prompt_at_a_time(tiny, monkeypatch):
    """The varlen path's bookkeeping (segment bounds, packed KV views, last rows) on CPU, with the CUDA-only
    FlashAttention call replaced by causal SDPA over each segment (same function)."""
    from hybridflow.rollout.decoder import LlamaFamilyDecoder

    model, tokenizer = tiny
    decoder = LlamaFamilyDecoder(model)
    prompts = [torch.tensor(p) for p in chat_prompts(tokenizer)]
    expected = decoder.prefill_many(prompts)
    monkeypatch.setattr(decoder, "_varlen_attention", segment_sdpa(decoder.scale))
    decoder.varlen_prefill = True
    for (logits, kv), (want_logits, want_kv) in zip(decoder.prefill_many(prompts), expected):
        torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(kv, want_kv, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])  # qkv biases; q/k norms
def test_weight_sync_copies_into_the_decoders_own_tensors(tiny_tokenizer, arch, monkeypatch):
    """Unpacked (the CUDA path), a sync writes into the tensors a captured CUDA graph reads: no tensor is
    replaced, the epoch stays, and the engine decodes with the new weights."""
    from hybridflow.rollout.packed_linear import PORTABLE_KERNELS_ENV

    monkeypatch.setenv(PORTABLE_KERNELS_ENV, "1")
    model, tokenizer = build_tiny_model(arch, seed=1, tokenizer=tiny_tokenizer)
    other, _ = build_tiny_model(arch, seed=4, tokenizer=tiny_tokenizer)
    engine = NativeEngine(model, tokenizer)
    decoder = engine.decoder
    tensors = [t for layer in decoder.layers for t in (layer.qkv.weight, layer.qkv.bias, layer.gate_up.weight,
                                                        layer.down.weight, layer.qk_norm) if t is not None]
    pointers, epoch = [t.data_ptr() for t in tensors], decoder.weights_epoch
    engine.load_weights(other.state_dict().items())
    assert [t.data_ptr() for t in tensors] == pointers and decoder.weights_epoch == epoch
    prompts = chat_prompts(tokenizer)[:2]
    params = SamplingParams(n=1, temperature=1.0, max_tokens=8, seed=0)
    fresh = NativeEngine(other, tokenizer)
    assert [c.token_ids for c in engine.generate(prompts, params)] == [c.token_ids for c in fresh.generate(prompts, params)]


@pytest.mark.parametrize("path", ["kernel", "oneDNN"])
def test_packed_weights_are_rebuilt_and_say_so(tiny_llama, path, monkeypatch):
    """oneDNN's packed copies are rebuilt (the epoch says so); the fp32 kernel's panels are repacked in place (issue
    62: the same tensors, the epoch kept)."""
    from hybridflow.rollout import fp32_linear

    if path == "oneDNN":
        monkeypatch.setattr(fp32_linear, "unavailable_reason", lambda: "turned off by the test")
    model, tokenizer = tiny_llama
    engine = NativeEngine(model, tokenizer)
    qkv = engine.decoder.layers[0].qkv
    if not qkv.packed or (path == "kernel") != (qkv.kernel_weight is not None):
        pytest.skip(f"no {path} packing on this CPU")
    epoch = engine.decoder.weights_epoch
    engine.load_weights(model.state_dict().items())
    if path == "kernel":
        assert engine.decoder.layers[0].qkv is qkv and engine.decoder.weights_epoch == epoch
    else:
        assert engine.decoder.weights_epoch > epoch


def test_a_varlen_prefill_that_disagrees_on_first_use_is_switched_off(tiny_llama, monkeypatch, caplog):
    from hybridflow.rollout.decoder import LlamaFamilyDecoder

    model, tokenizer = tiny_llama
    decoder = LlamaFamilyDecoder(model)
    prompts = [torch.tensor(p) for p in chat_prompts(tokenizer)]
    expected = decoder.prefill_many(prompts)
    monkeypatch.setattr(decoder, "_varlen_attention", lambda q, k, v, bounds, longest: torch.zeros_like(q))
    decoder.varlen_prefill = True
    with caplog.at_level("WARNING"):
        got = decoder.prefill_many(prompts)
    assert "disagreed" in caplog.text and not decoder.varlen_prefill
    for (logits, kv), (want_logits, want_kv) in zip(got, expected):
        torch.testing.assert_close(logits, want_logits)
        torch.testing.assert_close(kv, want_kv)
