import pytest
import torch

from hybridflow.models import compute_log_probs
from hybridflow.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    return build_tiny_model("qwen2", seed=3, tokenizer=tiny_tokenizer)[0].eval()


def left_padded_batch():
    """Two rows: prompt lengths 3 and 5 (left padded to 5) followed by 4 response tokens."""
    input_ids = torch.tensor([[0, 0, 11, 12, 13, 40, 41, 42, 43], [21, 22, 23, 24, 25, 50, 51, 52, 53]])
    attention_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 9])
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def test_log_probs_and_entropy_match_full_forward(model):
    input_ids, attention_mask, position_ids = left_padded_batch()
    temperature = 0.6
    log_probs, entropy = compute_log_probs(model, input_ids=input_ids, attention_mask=attention_mask,
                                           position_ids=position_ids, response_length=4, temperature=temperature,
                                           calculate_entropy=True)
    with torch.no_grad():
        full = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    for row in range(2):
        for t in range(4):
            z = full[row, 4 + t] / temperature  # position 4 + t predicts token 5 + t
            logp = z.log_softmax(-1)
            assert log_probs[row, t].item() == pytest.approx(logp[input_ids[row, 5 + t]].item(), abs=1e-5)
            assert entropy[row, t].item() == pytest.approx(-(logp.exp() * logp).sum().item(), abs=1e-5)


def test_left_padding_does_not_change_a_row(model):
    input_ids, attention_mask, position_ids = left_padded_batch()
    batched, _ = compute_log_probs(model, input_ids=input_ids, attention_mask=attention_mask,
                                   position_ids=position_ids, response_length=4)
    alone, _ = compute_log_probs(model, input_ids=input_ids[:1, 2:], attention_mask=attention_mask[:1, 2:],
                                 position_ids=position_ids[:1, 2:], response_length=4)
    assert torch.allclose(batched[:1], alone, atol=1e-5)


def test_gradients_flow_and_entropy_is_optional(model):
    input_ids, attention_mask, position_ids = left_padded_batch()
    log_probs, entropy = compute_log_probs(model, input_ids=input_ids, attention_mask=attention_mask,
                                           position_ids=position_ids, response_length=4)
    assert entropy is None and log_probs.shape == (2, 4) and log_probs.dtype == torch.float32
    log_probs.sum().backward()
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0
    model.zero_grad()
