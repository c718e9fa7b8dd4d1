"""The MoE router's load-balancing loss: recorded in hybridflow's padded and packed forwards, it equals the one
HF's own forward returns (``outputs.aux_loss``) on the same tokens."""

import pytest
import torch

from hybridflow.data.packing import PackedResponses
from hybridflow.models import build_tiny_model, compute_log_probs, packed_log_probs
from hybridflow.models.router_aux import record_router_logits
from tests.models.test_segment_attention import RESPONSE_COLS, grpo_like_rows


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_recorded_router_loss_equals_hfs_aux_loss_padded_and_packed(tiny_tokenizer, arch):
    model, _ = build_tiny_model(arch, seed=1, tokenizer=tiny_tokenizer, output_router_logits=True,
                                router_aux_loss_coef=0.02)
    input_ids, attention_mask, position_ids = grpo_like_rows(model.config.vocab_size)
    with torch.no_grad():
        expected = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).aux_loss
        with record_router_logits(model) as padded:
            compute_log_probs(model, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              response_length=RESPONSE_COLS)
        with record_router_logits(model) as packed:
            packed_log_probs(model, PackedResponses(input_ids, attention_mask, response_length=RESPONSE_COLS,
                                                    share_prompt=False))
    assert padded.coef == 0.02 and padded.attention_mask is not None and packed.attention_mask is None
    assert len(padded.logits) == (1 if arch == "qwen3_moe" else 2)  # qwen3_moe's layer 1 is dense (mlp_only_layers)
    assert float(expected) > 1.0  # E * sum f_e P_e is 1 for a perfectly balanced router, above otherwise
    torch.testing.assert_close(padded.loss(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(packed.loss(), expected, rtol=1e-5, atol=1e-6)


def test_a_dense_model_or_a_router_loss_left_off_records_nothing(tiny_tokenizer):
    dense, _ = build_tiny_model("llama", tokenizer=tiny_tokenizer)
    quiet, _ = build_tiny_model("mixtral", tokenizer=tiny_tokenizer)  # output_router_logits defaults to False
    for model in (dense, quiet):
        with record_router_logits(model) as router:
            assert router is None
