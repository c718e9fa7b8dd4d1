"""The self-play update (SPIN's DPO pairs, SPPO) gives the same loss and gradients in every forward layout:
``use_remove_padding`` / ``use_shared_prompt`` must reach the preference update, not only the PPO one."""

import pytest
import torch

from hybridflow.data.batch import Batch
from hybridflow.models import build_tiny_model
from hybridflow.workers.preference_update import OBJECTIVES, preference_micro_loss
from tests.models.test_segment_attention import PROMPT_COLS, grads, grpo_like_rows


def preference_batch(vocab: int, groups) -> Batch:
    input_ids, attention_mask, position_ids = grpo_like_rows(vocab, groups=groups)
    rows = input_ids.shape[0]
    gen = torch.Generator().manual_seed(5)
    return Batch({"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
                  "responses": input_ids[:, PROMPT_COLS:], "response_mask": attention_mask[:, PROMPT_COLS:],
                  "ref_seq_log_prob": -20 * torch.rand(rows, generator=gen),
                  "win_prob": torch.rand(rows, generator=gen)})


@pytest.mark.parametrize("objective, params, groups", [
    ("dpo", {"beta": 0.1}, ((5, 2), (7, 2), (4, 2))),  # pairs [chosen, rejected] of one prompt each
    ("sppo", {"eta": 1.0}, ((5, 3), (7, 3), (4, 1))),
])
def test_preference_loss_and_gradients_equal_in_every_layout(tiny_tokenizer, objective, params, groups):
    model, _ = build_tiny_model("llama", seed=1, tokenizer=tiny_tokenizer)
    model.train()
    micro = preference_batch(model.config.vocab_size, groups)
    counts = {"seqs": float(len(micro)), "tokens": float(micro["response_mask"].sum())}
    results = {}
    for layout in ("padded", "packed", "shared_prompt"):
        loss, shares, _ = preference_micro_loss(micro, model=model, objective=OBJECTIVES[objective], params=params,
                                                counts=counts, temperature=0.7, layout=layout)
        loss.backward()
        results[layout] = (loss.detach(), grads(model))
    expected_loss, expected_grads = results["padded"]
    for layout in ("packed", "shared_prompt"):
        loss, got = results[layout]
        torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
        for name in expected_grads:
            torch.testing.assert_close(got[name], expected_grads[name], rtol=1e-4, atol=2e-5, msg=name)
