"""``chunked_head`` (``use_fused_kernels``): log-probs, entropy and gradients from the hidden states in
chunks equal the logits path in every forward layout, and a head it cannot replace falls back, once."""

import pytest
import torch

from hybridflow.data.packing import PackedResponses
from hybridflow.models import build_tiny_model, compute_log_probs, packed_log_probs
from hybridflow.models.logprob import chunk_capable_head
from tests.models.test_segment_attention import PROMPT_COLS, RESPONSE_COLS, grads, grpo_like_rows


def layout_outputs(model, layout: str, rows, *, chunked_head: bool):
    """(log-probs, entropy, sum pi^2) ``[B, T]`` of ``rows`` in ``layout``."""
    input_ids, attention_mask, position_ids = rows
    switches = dict(temperature=0.7, calculate_entropy=True, calculate_sum_pi_squared=True, chunked_head=chunked_head)
    if layout == "padded":
        return compute_log_probs(model, input_ids=input_ids, attention_mask=attention_mask,
                                 position_ids=position_ids, response_length=RESPONSE_COLS, **switches)
    packed = PackedResponses(input_ids, attention_mask, response_length=RESPONSE_COLS,
                             share_prompt=layout == "shared_prompt")
    return packed_log_probs(model, packed, **switches)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("layout", ["padded", "packed", "shared_prompt"])
def test_chunked_head_equals_the_logits_path(tiny_tokenizer, monkeypatch, arch, layout):
    model, _ = build_tiny_model(arch, seed=1, tokenizer=tiny_tokenizer)
    model.train()
    rows = grpo_like_rows(model.config.vocab_size)
    valid = rows[1][:, PROMPT_COLS:].bool()
    weights = torch.randn(valid.shape, generator=torch.Generator().manual_seed(3))
    expected = layout_outputs(model, layout, rows, chunked_head=False)
    ((expected[0] + expected[1]) * weights * valid).sum().backward()
    expected_grads = grads(model)
    # 7 tokens per chunk: no layout's token count is a multiple of it
    monkeypatch.setattr("hybridflow.algos.linear_logprob.CPU_CHUNK_ELEMENTS", 7 * model.config.vocab_size)
    head_outputs = []
    hook = model.get_output_embeddings().register_forward_hook(lambda mod, args, out: head_outputs.append(out.shape))
    got = layout_outputs(model, layout, rows, chunked_head=True)
    hook.remove()
    assert [shape[-1] for shape in head_outputs] == [3]  # (log p, H, sum p^2) per token: no [K, V] logits
    for value, reference in zip(got, expected):
        torch.testing.assert_close(value[valid], reference[valid], rtol=0, atol=2e-5)
    ((got[0] + got[1]) * weights * valid).sum().backward()
    got_grads = grads(model)
    assert got_grads.keys() == expected_grads.keys()
    for name, grad in got_grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=0, atol=2e-5, msg=name)
    assert "forward" not in vars(model.get_output_embeddings())  # the head is itself again


def test_a_head_with_a_bias_falls_back_to_the_logits_with_one_warning(tiny_tokenizer):
    model, _ = build_tiny_model("qwen2", seed=2, tokenizer=tiny_tokenizer)
    head = model.get_output_embeddings()
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    model.set_output_embeddings(biased)
    rows = grpo_like_rows(model.config.vocab_size)
    with pytest.warns(UserWarning, match="not a bias-free nn.Linear"):
        got = layout_outputs(model, "packed", rows, chunked_head=True)
    expected = layout_outputs(model, "packed", rows, chunked_head=False)
    torch.testing.assert_close(got, expected)
    assert chunk_capable_head(model) is None
