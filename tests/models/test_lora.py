"""LoRA: which parameters train, the adapter formula, disable / merge / save / load."""

import pytest
import torch

from hybridflow.errors import ConfigError, ModelError
from hybridflow.models.lora import (
    apply_lora,
    disable_adapter,
    is_lora_model,
    load_adapter,
    merge_lora,
    save_adapter,
    trainable_parameters,
)
from hybridflow.models.tiny import build_tiny_model

RANK, ALPHA = 4, 8


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matmuls: a second OpenMP thread only adds stalls on busy shared cores."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def tokens():
    return torch.randint(3, 300, (2, 11), generator=torch.Generator().manual_seed(0))


def _base(tokenizer=None):
    model, _ = build_tiny_model("llama", seed=0, tokenizer=tokenizer)
    return model


def _randomise_lora_b(model):
    """B starts at 0 (adapter = identity); give it values so the adapter changes the outputs."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_only_adapter_parameters_are_trainable(tiny_tokenizer):
    model = apply_lora(_base(tiny_tokenizer), rank=RANK, alpha=ALPHA)
    names = list(trainable_parameters(model))
    assert names and all("lora_A" in n or "lora_B" in n for n in names)
    # all-linear: the seven projections of each of the 2 layers, an A and a B each; never the lm_head
    assert len(names) == 2 * 7 * 2
    assert not any("lm_head" in n or "embed" in n for n in names)


def test_lora_layer_computes_w_x_plus_scaled_b_a_x(tiny_tokenizer):
    model = apply_lora(_base(tiny_tokenizer), rank=RANK, alpha=ALPHA, target_modules=["q_proj"])
    _randomise_lora_b(model)
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    w = layer.base_layer.weight
    a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    expected = x @ w.T + (ALPHA / RANK) * (x @ a.T @ b.T)
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)


def test_target_and_exclude_modules(tiny_tokenizer):
    model = apply_lora(_base(tiny_tokenizer), rank=RANK, alpha=ALPHA, target_modules=["q_proj", "v_proj"],
                       exclude_modules=["model.layers.1.self_attn.v_proj"])
    names = list(trainable_parameters(model))
    assert len(names) == (2 + 1) * 2  # q and v of layer 0, q of layer 1, an A and a B each
    assert not any("layers.1.self_attn.v_proj" in n for n in names)


def test_only_adapter_parameters_change_after_a_step(tiny_tokenizer, tokens):
    model = apply_lora(_base(tiny_tokenizer), rank=RANK, alpha=ALPHA)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(trainable_parameters(model).values(), lr=1e-2, weight_decay=0.0)
    model(input_ids=tokens, labels=tokens).loss.backward()
    optimizer.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_B" in n for n in changed)  # grad of A is B^T(...) = 0 while B = 0
    assert len(changed) == 2 * 7


def test_disable_adapter_gives_the_base_model_exactly(tiny_tokenizer, tokens):
    base_logits = _logits(_base(tiny_tokenizer), tokens)
    model = apply_lora(_base(tiny_tokenizer), rank=RANK, alpha=ALPHA)
    _randomise_lora_b(model)
    assert not torch.allclose(_logits(model, tokens), base_logits, atol=1e-3)
    with disable_adapter(model):
        assert torch.equal(_logits(model, tokens), base_logits)
    assert not torch.allclose(_logits(model, tokens), base_logits, atol=1e-3)  # back on after the block


def test_merged_model_matches_the_adapted_model(tiny_tokenizer, tokens):
    model = apply_lora(_base(tiny_tokenizer), rank=RANK, alpha=ALPHA)
    _randomise_lora_b(model)
    adapted = _logits(model, tokens)
    merged = merge_lora(model)
    assert not is_lora_model(merged) and type(merged).__name__ == "LlamaForCausalLM"
    assert not any("lora" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(_logits(merged, tokens), adapted, rtol=1e-4, atol=1e-5)


def test_save_and_load_adapter_round_trip(tiny_tokenizer, tokens, tmp_path):
    model = apply_lora(_base(tiny_tokenizer), rank=RANK, alpha=ALPHA)
    _randomise_lora_b(model)
    save_adapter(model, str(tmp_path))
    files = {p.name for p in tmp_path.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    restored = load_adapter(apply_lora(_base(tiny_tokenizer), rank=RANK, alpha=ALPHA), str(tmp_path))
    assert torch.equal(_logits(restored, tokens), _logits(model, tokens))


def test_load_adapter_with_another_rank_is_an_error(tiny_tokenizer, tmp_path):
    save_adapter(apply_lora(_base(tiny_tokenizer), rank=RANK, alpha=ALPHA, target_modules=["q_proj"]), str(tmp_path))
    other = apply_lora(_base(tiny_tokenizer), rank=RANK, alpha=ALPHA, target_modules=["q_proj", "v_proj"])
    with pytest.raises(ModelError, match="lora_rank or target_modules"):
        load_adapter(other, str(tmp_path))


def test_bad_inputs_raise_user_errors(tiny_tokenizer, tmp_path):
    with pytest.raises(ConfigError, match="model.lora_rank"):
        apply_lora(_base(tiny_tokenizer), rank=0, alpha=ALPHA)
    with pytest.raises(ConfigError, match="target_modules"):
        apply_lora(_base(tiny_tokenizer), rank=RANK, alpha=ALPHA, target_modules=["no_such_proj"])
    with pytest.raises(ModelError, match="needs a LoRA model"):
        merge_lora(_base(tiny_tokenizer))
    model = apply_lora(_base(tiny_tokenizer), rank=RANK, alpha=ALPHA)
    with pytest.raises(ModelError, match="save_adapter"):
        load_adapter(model, str(tmp_path))


def test_merged_state_dict_equals_peft_merge():
    """W + (alpha / r) B A folded from the state dict equals peft's own merge_and_unload."""
    import copy

    from hybridflow.models.lora import apply_lora, lora_scaling, merge_lora, merged_state_dict
    from hybridflow.models.tiny import build_tiny_model

    model, _ = build_tiny_model(seed=3)
    lora = apply_lora(model, rank=4, alpha=8, target_modules="all-linear")
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_()  # B starts at 0: make the update non-trivial
    ours = merged_state_dict(lora.state_dict(), scaling=lora_scaling(lora))
    reference = merge_lora(copy.deepcopy(lora)).state_dict()
    assert ours.keys() == reference.keys()
    for key in reference:
        torch.testing.assert_close(ours[key], reference[key], rtol=0, atol=1e-6)


def test_merged_state_dict_refuses_lora_it_cannot_fold():
    from hybridflow.models.lora import merged_state_dict

    state = {"base_model.model.model.embed_tokens.lora_embedding_A.default": torch.zeros(2, 4)}
    with pytest.raises(ModelError, match="cannot fold LoRA weights"):
        merged_state_dict(state, scaling=1.0)
