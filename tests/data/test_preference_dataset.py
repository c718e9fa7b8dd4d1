import pytest

from hybridflow.data.preference_dataset import PreferenceDataset
from hybridflow.errors import DataError

PROMPT = [{"role": "user", "content": "what is 2 + 3?"}]


def ids_of(tokenizer, messages, **kwargs):
    return tokenizer(tokenizer.apply_chat_template(messages, tokenize=False, **kwargs), add_special_tokens=False)[
        "input_ids"
    ]


def test_pair_tokens_masks_and_prompt_length(tiny_tokenizer, write_rows):
    rows = [
        {"prompt": "what is 2 + 3?", "chosen": "5", "rejected": "the answer is 6"},
        {
            "prompt": PROMPT,
            "chosen": PROMPT + [{"role": "assistant", "content": "5"}],
            "rejected": [{"role": "assistant", "content": "7"}],
        },
    ]
    dataset = PreferenceDataset(write_rows(rows, "pairs.jsonl"), tiny_tokenizer)
    prompt_length = len(ids_of(tiny_tokenizer, PROMPT, add_generation_prompt=True))
    for sample in (dataset[0], dataset[1]):
        assert sample["prompt_length"] == prompt_length
        assert sample["chosen_input_ids"].tolist() == ids_of(
            tiny_tokenizer, PROMPT + [{"role": "assistant", "content": "5"}]
        )
        assert sample["chosen_loss_mask"][:prompt_length].sum() == 0
        chosen = sample["chosen_input_ids"][sample["chosen_loss_mask"].bool()].tolist()
        assert tiny_tokenizer.decode(chosen) == "5<|im_end|>"
    rejected = dataset[0]["rejected_input_ids"][dataset[0]["rejected_loss_mask"].bool()].tolist()
    assert tiny_tokenizer.decode(rejected) == "the answer is 6<|im_end|>"
    assert (
        dataset[0]["rejected_input_ids"][:prompt_length].tolist()
        == dataset[0]["chosen_input_ids"][:prompt_length].tolist()
    )


def test_collate_shapes(tiny_tokenizer, write_rows):
    rows = [
        {"prompt": "hi", "chosen": "hello", "rejected": "go away now please"},
        {"prompt": "what is 1 + 1?", "chosen": "2", "rejected": "3"},
    ]
    dataset = PreferenceDataset(write_rows(rows), tiny_tokenizer)
    batch = dataset.collate_fn([dataset[0], dataset[1]])
    width = max(dataset[i][f"{side}_input_ids"].numel() for i in range(2) for side in ("chosen", "rejected"))
    for side in ("chosen", "rejected"):
        assert batch[f"{side}_input_ids"].shape == (2, width)
        assert batch[f"{side}_attention_mask"].shape == (2, width)
        assert batch[f"{side}_loss_mask"].shape == (2, width)
        lengths = [dataset[i][f"{side}_input_ids"].numel() for i in range(2)]
        assert batch[f"{side}_attention_mask"].sum(dim=1).tolist() == lengths
        assert (batch[f"{side}_loss_mask"] <= batch[f"{side}_attention_mask"]).all()
    assert batch["prompt_length"].tolist() == [dataset[0]["prompt_length"], dataset[1]["prompt_length"]]


def test_truncation_and_errors(tiny_tokenizer, write_rows):
    rows = [{"prompt": "hi", "chosen": "hello", "rejected": "the answer is the sum of the product " * 3}]
    path = write_rows(rows)
    rejected_length = len(
        ids_of(
            tiny_tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": rows[0]["rejected"]}]
        )
    )
    limit = rejected_length - 4
    with pytest.raises(
        DataError, match=rf"row 0: rejected has {rejected_length} tokens, more than data.max_length={limit}"
    ):
        PreferenceDataset(path, tiny_tokenizer, max_length=limit)
    cut = PreferenceDataset(path, tiny_tokenizer, max_length=limit, truncation="right")[0]
    assert cut["rejected_input_ids"].numel() == limit
    with pytest.raises(
        DataError, match=r"row 0: prompt has \d+ tokens, leaving no room for a reply within data.max_length=3"
    ):
        PreferenceDataset(path, tiny_tokenizer, max_length=3)
    with pytest.raises(DataError, match=r"has no column 'chosen' .*set data.chosen_key"):
        PreferenceDataset(write_rows([{"prompt": "a", "good": "b", "rejected": "c"}], "x.jsonl"), tiny_tokenizer)
    with pytest.raises(DataError, match=r"row 0: empty reply in data.chosen_key"):
        PreferenceDataset(write_rows([{"prompt": "a", "chosen": "", "rejected": "c"}], "y.jsonl"), tiny_tokenizer)
    only_prompt = [{"prompt": PROMPT, "chosen": PROMPT, "rejected": "c"}]
    with pytest.raises(DataError, match=r"row 0: data.chosen_key has no assistant message after the prompt"):
        PreferenceDataset(write_rows(only_prompt, "z.jsonl"), tiny_tokenizer)
