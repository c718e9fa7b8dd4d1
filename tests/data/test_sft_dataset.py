import pytest
import torch

from hybridflow.data.assistant_mask import tokenize_with_assistant_mask
from hybridflow.data.sft_dataset import SFTDataset, collate_sft
from hybridflow.errors import DataError

CONVERSATION = [
    {"role": "system", "content": "you are helpful"},
    {"role": "user", "content": "what is 2 + 3?"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "and 3 * 4"},
    {"role": "assistant", "content": "the answer is 12"},
]


def masked_text(tokenizer, sample):
    ids = sample["input_ids"][sample["loss_mask"].bool()].tolist()
    return tokenizer.decode(ids)


def test_multiturn_mask_covers_every_assistant_turn_only(tiny_tokenizer, write_rows):
    path = write_rows([{"messages": CONVERSATION}])
    sample = SFTDataset(path, tiny_tokenizer, messages_key="messages")[0]
    expected_text = tiny_tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert sample["input_ids"].tolist() == tiny_tokenizer(expected_text, add_special_tokens=False)["input_ids"]
    assert masked_text(tiny_tokenizer, sample) == "5<|im_end|>the answer is 12<|im_end|>"


def test_rows_of_verl_0_9_conversations_need_no_messages_key(tiny_tokenizer, write_rows):
    """verl 0.9's SFT trainer reads the ``messages`` column by default (its data.messages_key=messages); rows with
    that column and no prompt column are conversations without the key, rows with a prompt column stay single turn."""
    conversations = SFTDataset(write_rows([{"messages": CONVERSATION}]), tiny_tokenizer)[0]
    keyed = SFTDataset(write_rows([{"messages": CONVERSATION}]), tiny_tokenizer, messages_key="messages")[0]
    assert torch.equal(conversations["input_ids"], keyed["input_ids"])
    assert torch.equal(conversations["loss_mask"], keyed["loss_mask"])
    both = write_rows([{"question": "1 + 1?", "answer": "2", "messages": CONVERSATION}])
    assert masked_text(tiny_tokenizer, SFTDataset(both, tiny_tokenizer)[0]) == "2<|im_end|>"
    with pytest.raises(DataError, match="has no column 'question'"):
        SFTDataset(write_rows([{"dialogue": CONVERSATION}]), tiny_tokenizer)


def test_mask_equals_generation_markers(tiny_tokenizer):
    # The tiny template has {% generation %} markers: HF's own assistant mask is the reference.
    reference = tiny_tokenizer.apply_chat_template(CONVERSATION, return_assistant_tokens_mask=True, return_dict=True)
    ids, mask = tokenize_with_assistant_mask(tiny_tokenizer, CONVERSATION, row_index=0)
    assert ids == reference["input_ids"]
    assert mask == reference["assistant_masks"]


def test_template_without_generation_markers(tiny_tokenizer_dir):
    # SmolLM2-style template: no {% generation %}, and a default system prompt injected.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    tokenizer.chat_template = (
        "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nyou are helpful<|im_end|>\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    ids, mask = tokenize_with_assistant_mask(tokenizer, CONVERSATION[1:], row_index=0)
    assert tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m]) == "5<|im_end|>the answer is 12<|im_end|>"
    assert tokenizer.decode(ids).startswith("<|im_start|>system\nyou are helpful")


def test_template_that_rewrites_earlier_turns_is_an_error(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    # Drops the content of earlier assistant turns (like templates that strip past reasoning).
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and not loop.last %}...{% else %}{{ m['content'] }}{% endif %}"
        "<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(
        DataError, match=r"row 3: the chat template is not prefix-stable \(rendering the first 2 messages"
    ):
        tokenize_with_assistant_mask(tokenizer, CONVERSATION[1:], row_index=3)


def test_single_turn_prompt_response_columns(tiny_tokenizer, write_rows):
    rows = [
        {"question": "what is 2 + 3?", "answer": "5"},
        {"question": [{"role": "user", "content": "hi"}], "answer": "hello"},
    ]
    dataset = SFTDataset(write_rows(rows), tiny_tokenizer)
    first = dataset[0]
    conversation = [{"role": "user", "content": "what is 2 + 3?"}, {"role": "assistant", "content": "5"}]
    text = tiny_tokenizer.apply_chat_template(conversation, tokenize=False)
    assert first["input_ids"].tolist() == tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert masked_text(tiny_tokenizer, first) == "5<|im_end|>"
    prompt_len = len(tiny_tokenizer.apply_chat_template(conversation[:1], add_generation_prompt=True)["input_ids"])
    assert first["loss_mask"][:prompt_len].sum() == 0
    assert masked_text(tiny_tokenizer, dataset[1]) == "hello<|im_end|>"


@pytest.mark.parametrize(
    "keys",
    [
        dict(prompt_key="extra_info.question", response_key="extra_info.answer"),
        dict(
            prompt_key="extra_info",
            prompt_dict_keys=["question"],
            response_key="extra_info",
            response_dict_keys=["answer"],
        ),
    ],
)
def test_nested_keys(tiny_tokenizer, write_rows, keys):
    rows = [{"extra_info": {"question": "what is 1 + 1?", "answer": "2"}}]
    sample = SFTDataset(write_rows(rows, "rows.parquet"), tiny_tokenizer, **keys)[0]
    assert masked_text(tiny_tokenizer, sample) == "2<|im_end|>"
    assert "what is 1 + 1?" in tiny_tokenizer.decode(sample["input_ids"])


def test_missing_columns_and_nested_keys(tiny_tokenizer, write_rows):
    path = write_rows([{"q": "x", "answer": "y"}])
    with pytest.raises(
        DataError, match=r"has no column 'question' \(columns: \['answer', 'q'\]\); set data.prompt_key"
    ):
        SFTDataset(path, tiny_tokenizer)
    nested = write_rows([{"extra_info": {"q": "x"}, "answer": "y"}], "nested.jsonl")
    with pytest.raises(
        DataError, match=r"row 0: extra_info has no key 'question' \(has \['q'\]\); fix data.prompt_key"
    ):
        SFTDataset(nested, tiny_tokenizer, prompt_key="extra_info.question")
    with pytest.raises(DataError, match=r"has no column 'conversations'.*set data.multiturn.messages_key"):
        SFTDataset(path, tiny_tokenizer, messages_key="conversations")


def test_bad_rows(tiny_tokenizer, write_rows):
    with pytest.raises(DataError, match=r"row 1: response in data.response_key is '', not a non-empty string"):
        SFTDataset(write_rows([{"question": "a", "answer": "b"}, {"question": "a", "answer": ""}]), tiny_tokenizer)
    with pytest.raises(DataError, match=r"row 0: empty prompt in data.prompt_key"):
        SFTDataset(write_rows([{"question": " ", "answer": "b"}]), tiny_tokenizer)
    content_none = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]}]
    message = r"row 0: message 1 of data.multiturn.messages_key \(assistant\) has content None"
    with pytest.raises(DataError, match=message):
        SFTDataset(write_rows(content_none), tiny_tokenizer, messages_key="messages")
    no_assistant = [{"messages": [{"role": "user", "content": "hi"}]}]
    with pytest.raises(DataError, match=r"row 0: no assistant message in data.multiturn.messages_key"):
        SFTDataset(write_rows(no_assistant), tiny_tokenizer, messages_key="messages")


def test_truncation_modes(tiny_tokenizer, write_rows):
    path = write_rows([{"messages": CONVERSATION}])
    full = SFTDataset(path, tiny_tokenizer, messages_key="messages")[0]
    n = full["input_ids"].numel()
    limit = n - 5
    right = SFTDataset(path, tiny_tokenizer, messages_key="messages", max_length=limit, truncation="right")[0]
    assert right["input_ids"].tolist() == full["input_ids"][:limit].tolist()
    assert right["loss_mask"].tolist() == full["loss_mask"][:limit].tolist()
    left = SFTDataset(path, tiny_tokenizer, messages_key="messages", max_length=limit, truncation="left")[0]
    assert left["input_ids"].tolist() == full["input_ids"][5:].tolist()
    assert left["loss_mask"].tolist() == [0] + full["loss_mask"][6:].tolist()  # first token never a target
    with pytest.raises(DataError, match=rf"row 0: conversation has {n} tokens, more than data.max_length={limit}"):
        SFTDataset(path, tiny_tokenizer, messages_key="messages", max_length=limit)
    with pytest.raises(
        DataError, match=r"unknown data.truncation='middle'; choose one of \['error', 'left', 'right'\]"
    ):
        SFTDataset(path, tiny_tokenizer, messages_key="messages", truncation="middle")


def test_collate_right_pads_dynamic_or_max_length(tiny_tokenizer, write_rows):
    rows = [{"question": "what is 2 + 3?", "answer": "5"}, {"question": "hi", "answer": "hello there"}]
    dynamic = SFTDataset(write_rows(rows), tiny_tokenizer, padding="longest")
    lengths = [dynamic[i]["input_ids"].numel() for i in range(2)]
    batch = dynamic.collate_fn([dynamic[0], dynamic[1]])
    assert batch["input_ids"].shape == (2, max(lengths))
    assert batch["attention_mask"].sum(dim=1).tolist() == lengths
    for row in range(2):
        n = lengths[row]
        assert batch["input_ids"][row, :n].tolist() == dynamic[row]["input_ids"].tolist()
        assert batch["position_ids"][row, :n].tolist() == list(range(n))
        assert batch["loss_mask"][row, n:].sum() == 0
        assert (batch["input_ids"][row, n:] == tiny_tokenizer.pad_token_id).all()
    fixed = SFTDataset(write_rows(rows), tiny_tokenizer, padding="max_length", max_length=40)
    assert fixed.collate_fn([fixed[0]])["input_ids"].shape == (1, 40)
    with pytest.raises(DataError, match=r"unknown SFT padding 'dynamic'; choose one of \['max_length', 'longest'\]"):
        SFTDataset(write_rows(rows), tiny_tokenizer, padding="dynamic")


def test_collate_sft_hand_built():
    samples = [
        {"input_ids": torch.tensor([4, 5, 6]), "loss_mask": torch.tensor([0, 1, 1])},
        {"input_ids": torch.tensor([7]), "loss_mask": torch.tensor([0])},
    ]
    batch = collate_sft(samples, pad_token_id=0, pad_to=4)
    assert batch["input_ids"].tolist() == [[4, 5, 6, 0], [7, 0, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 2], [0, 0, 0, 0]]
    assert batch["loss_mask"].tolist() == [[0, 1, 1, 0], [0, 0, 0, 0]]


def test_empty_file_and_max_samples(tiny_tokenizer, write_rows):
    from hybridflow.data.preference_dataset import PreferenceDataset

    empty = write_rows([], "empty.jsonl")
    for dataset_class in (SFTDataset, PreferenceDataset):
        with pytest.raises(
            DataError, match=r"0 rows in data file\(s\) .*; point data.train_files / data.val_files at a non-empty file"
        ):
            dataset_class(empty, tiny_tokenizer)
    rows = [{"question": f"what is {i} + 1?", "answer": str(i + 1)} for i in range(4)]
    dataset = SFTDataset(write_rows(rows), tiny_tokenizer, max_samples=2)
    assert len(dataset) == 2
    assert masked_text(tiny_tokenizer, dataset[1]) == "2<|im_end|>"


CALCULATOR = {"type": "function", "function": {"name": "calculator", "description": "Evaluate an expression",
                                               "parameters": {"type": "object", "properties": {}}}}
CALL_12_TIMES_34 = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>'
TOOL_TRACE = [
    {"role": "user", "content": "Calculate 12 * 34."},
    {"role": "assistant", "content": CALL_12_TIMES_34},
    {"role": "tool", "content": "408"},
    {"role": "assistant", "content": "408"},
]
NO_TOOLS_TEMPLATE = (  # SmolLM2-style ChatML that ignores the `tools` argument
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("template", ["tiny (renders tools)", "ignores tools"])
@pytest.mark.parametrize("as_json", [False, True])
def test_tools_column_renders_as_the_multi_turn_rollout_does(tiny_tokenizer_dir, write_rows, template, as_json):
    """A tool trace is trained on exactly the text the tool agent rolls out on (schemas through the template's
    `tools` argument or, for a template that ignores it, a Hermes system message); the tool turn is masked."""
    import json

    from transformers import AutoTokenizer

    from hybridflow.agents.chat import render_conversation

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    if template == "ignores tools":
        tokenizer.chat_template = NO_TOOLS_TEMPLATE
    tools = json.dumps([CALCULATOR]) if as_json else [CALCULATOR]
    path = write_rows([{"messages": TOOL_TRACE, "tools": tools}])
    sample = SFTDataset(path, tokenizer, messages_key="messages", tools_key="tools")[0]
    rollout_text = render_conversation(tokenizer, TOOL_TRACE, tool_schemas=[CALCULATOR], template_kwargs={},
                                       add_generation_prompt=False)
    assert sample["input_ids"].tolist() == tokenizer(rollout_text, add_special_tokens=False)["input_ids"]
    assert "calculator" in tokenizer.decode(sample["input_ids"][:-20])  # the schema is in the prompt
    assert masked_text(tokenizer, sample) == TOOL_TRACE[1]["content"] + "<|im_end|>408<|im_end|>"


def test_tools_column_that_is_not_a_schema_list_is_an_error(tiny_tokenizer, write_rows):
    for bad, message in (("{not json", "not valid JSON"), ('{"name": "x"}', "must be a list of tool schemas")):
        path = write_rows([{"messages": TOOL_TRACE, "tools": bad}])
        with pytest.raises(DataError, match=message):
            SFTDataset(path, tiny_tokenizer, messages_key="messages", tools_key="tools")
