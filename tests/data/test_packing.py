import pytest
import torch

from hybridflow.data.packing import block_causal_mask, pack_sequences
from hybridflow.data.sft_dataset import SFTDataset
from hybridflow.errors import DataError


def sample(ids, mask):
    return {"input_ids": torch.tensor(ids), "loss_mask": torch.tensor(mask)}


def test_pack_hand_built():
    samples = [sample([1, 2, 3], [0, 1, 1]), sample([4, 5], [0, 1]), sample([6, 7, 8, 9], [0, 0, 1, 1])]
    packs = pack_sequences(samples, max_tokens=5)
    assert [p["sample_indices"] for p in packs] == [[0, 1], [2]]
    first = packs[0]
    assert first["input_ids"].tolist() == [[1, 2, 3, 4, 5]]
    assert first["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert first["loss_mask"].tolist() == [[0, 1, 1, 0, 1]]
    assert first["cu_seqlens"].tolist() == [0, 3, 5] and first["cu_seqlens"].dtype == torch.int32
    assert first["max_seqlen"] == 3
    assert packs[1]["cu_seqlens"].tolist() == [0, 4]
    with pytest.raises(DataError, match=r"sample 2 has 4 tokens, more than the packing budget max_tokens=3"):
        pack_sequences(samples, max_tokens=3)


def test_block_causal_mask_hand_built():
    mask = block_causal_mask(torch.tensor([0, 2, 3], dtype=torch.int32))[0, 0]
    assert mask.tolist() == [[True, False, False], [True, True, False], [False, False, True]]


def _sft_samples(tokenizer, write_rows):
    rows = [
        {"messages": [{"role": "user", "content": "what is 2 + 3?"}, {"role": "assistant", "content": "5"}]},
        {
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "sum 1 2"},
                {"role": "assistant", "content": "3"},
            ]
        },
        {
            "messages": [
                {"role": "user", "content": "think step by step"},
                {"role": "assistant", "content": "so the answer is 7"},
            ]
        },
    ]
    dataset = SFTDataset(write_rows(rows), tokenizer, messages_key="messages")
    return dataset, [dataset[i] for i in range(len(dataset))]


def test_packing_equals_padding_tokens_masks_positions(tiny_tokenizer, write_rows):
    dataset, samples = _sft_samples(tiny_tokenizer, write_rows)
    padded = dataset.collate_fn(samples)
    (packed,) = pack_sequences(samples, max_tokens=1000)
    real = padded["attention_mask"].bool()
    assert torch.equal(packed["input_ids"][0], padded["input_ids"][real])
    assert torch.equal(packed["loss_mask"][0], padded["loss_mask"][real])
    assert torch.equal(packed["position_ids"][0], padded["position_ids"][real])
    starts = packed["cu_seqlens"][:-1].long()
    assert packed["position_ids"][0, starts].tolist() == [0, 0, 0]
    assert packed["loss_mask"][0, starts].tolist() == [0, 0, 0]  # no target crosses a boundary


def _per_token_loss(logits, input_ids):
    """-log p(x_t | x_<t) at position t (0 at t = 0), from the formula."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    nll = -logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.cat([torch.zeros_like(nll[:, :1]), nll], dim=1)


def test_packed_batch_gives_the_same_per_token_loss(tiny_tokenizer, write_rows):
    from hybridflow.models.tiny import build_tiny_model

    dataset, samples = _sft_samples(tiny_tokenizer, write_rows)
    model, _ = build_tiny_model("llama", seed=0, tokenizer=tiny_tokenizer)
    model.config._attn_implementation = "sdpa"
    padded = dataset.collate_fn(samples)
    (packed,) = pack_sequences(samples, max_tokens=1000)
    with torch.no_grad():
        padded_logits = model(
            input_ids=padded["input_ids"], attention_mask=padded["attention_mask"], position_ids=padded["position_ids"]
        ).logits
        packed_logits = model(
            input_ids=packed["input_ids"],
            position_ids=packed["position_ids"],
            attention_mask=block_causal_mask(packed["cu_seqlens"]),
        ).logits
    padded_loss = (_per_token_loss(padded_logits, padded["input_ids"]) * padded["loss_mask"])[
        padded["attention_mask"].bool()
    ]
    packed_loss = _per_token_loss(packed_logits, packed["input_ids"])[0] * packed["loss_mask"][0]
    assert padded_loss.shape == packed_loss.shape
    torch.testing.assert_close(packed_loss, padded_loss, atol=1e-5, rtol=1e-5)
    assert packed_loss.sum() > 0
