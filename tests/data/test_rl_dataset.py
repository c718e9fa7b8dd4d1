import pytest
import torch

from hybridflow.data.rl_dataset import RLDataset, collate_prompts
from hybridflow.errors import DataError


def templated_ids(tokenizer, messages):
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.parquet"])
def test_prompt_is_chat_template_output(tiny_tokenizer, make_rows, write_rows, name):
    rows = make_rows(3)
    dataset = RLDataset(write_rows(rows, name), tiny_tokenizer, max_prompt_length=64)
    assert len(dataset) == 3
    for i, row in enumerate(rows):
        direct = tiny_tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True)["input_ids"]
        assert dataset[i]["prompt_ids"] == direct == templated_ids(tiny_tokenizer, row["prompt"])
        assert dataset[i]["ground_truth"] == row["reward_model"]["ground_truth"]
        assert dataset[i]["data_source"] == "openai/gsm8k"
        assert dataset[i]["index"] == i


def test_list_of_files_concatenates(tiny_tokenizer, make_rows, write_rows):
    rows = make_rows(4)
    files = [write_rows(rows[:1], "a.jsonl"), write_rows(rows[1:], "b.parquet")]
    dataset = RLDataset(files, tiny_tokenizer, max_prompt_length=64)
    assert [dataset[i]["ground_truth"] for i in range(4)] == ["1", "2", "3", "4"]
    assert [dataset[i]["uid"] for i in range(4)] == ["0", "1", "2", "3"]


def test_chat_template_kwargs_are_passed_through(tiny_tokenizer_dir, make_rows, write_rows):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    # A template variable (like Qwen3's enable_thinking) that only the kwargs can set.
    tokenizer.chat_template = (
        "{% if system_text %}<|im_start|>system\n{{ system_text }}<|im_end|>\n{% endif %}" + tokenizer.chat_template
    )
    rows = make_rows(1)
    plain = RLDataset(write_rows(rows), tokenizer, max_prompt_length=64)
    passed = RLDataset(
        write_rows(rows), tokenizer, max_prompt_length=64, apply_chat_template_kwargs={"system_text": "be brief"}
    )
    expected_text = "<|im_start|>system\nbe brief<|im_end|>\n" + tokenizer.apply_chat_template(
        rows[0]["prompt"], tokenize=False, add_generation_prompt=True
    )
    assert passed[0]["prompt_ids"] == tokenizer(expected_text, add_special_tokens=False)["input_ids"]
    assert passed[0]["prompt_ids"][-len(plain[0]["prompt_ids"]) :] == plain[0]["prompt_ids"]


def test_collate_left_pads_with_masks_and_positions(tiny_tokenizer):
    pad = tiny_tokenizer.pad_token_id
    samples = [{"prompt_ids": [5, 6, 7], "uid": "a"}, {"prompt_ids": [8], "uid": "b"}]
    batch = collate_prompts(samples, pad_token_id=pad)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [pad, pad, 8]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]
    assert batch["raw_prompt_ids"] == [[5, 6, 7], [8]]
    assert batch["uid"] == ["a", "b"]
    wide = collate_prompts(samples, pad_token_id=pad, pad_to=5)
    assert wide["input_ids"].tolist() == [[pad, pad, 5, 6, 7], [pad, pad, pad, pad, 8]]
    assert wide["position_ids"].tolist() == [[0, 0, 0, 1, 2], [0, 0, 0, 0, 0]]


def test_collate_batch_from_dataset_carries_row_fields(tiny_tokenizer, make_rows, write_rows):
    rows = make_rows(3)
    dataset = RLDataset(write_rows(rows), tiny_tokenizer, max_prompt_length=64, return_raw_chat=True)
    batch = dataset.collate_fn([dataset[0], dataset[2]])
    lengths = [len(dataset[0]["prompt_ids"]), len(dataset[2]["prompt_ids"])]
    width = max(lengths)
    assert batch["input_ids"].shape == (2, width)
    assert batch["attention_mask"].sum(dim=1).tolist() == lengths
    # Unpadding each row gives back the unpadded prompt.
    for row in range(2):
        real = batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist()
        assert real == batch["raw_prompt_ids"][row]
        assert batch["position_ids"][row, -1].item() == lengths[row] - 1
    assert batch["raw_prompt"] == [rows[0]["prompt"], rows[2]["prompt"]]
    assert batch["ground_truth"] == ["1", "3"]
    assert batch["reward_model"][1] == {"style": "rule", "ground_truth": "3"}
    assert batch["ability"] == ["math", "math"]
    assert batch["extra_info"][0]["split"] == "train"


def _long_prompt_rows(tokenizer):
    """Row 0 short, row 1 long; returns rows and the long row's templated ids."""
    short = [{"role": "user", "content": "hi"}]
    long = [{"role": "user", "content": "what is the sum of the answer " * 4}]
    rows = [{"prompt": p, "data_source": "d", "reward_model": {"ground_truth": "x"}} for p in (short, long)]
    return rows, templated_ids(tokenizer, short), templated_ids(tokenizer, long)


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_modes(tiny_tokenizer, write_rows, mode):
    rows, short_ids, long_ids = _long_prompt_rows(tiny_tokenizer)
    limit = len(short_ids) + 3
    assert len(long_ids) > limit
    dataset = RLDataset(write_rows(rows), tiny_tokenizer, max_prompt_length=limit, truncation=mode)
    assert dataset[0]["prompt_ids"] == short_ids
    expected = {
        "left": long_ids[len(long_ids) - limit :],
        "right": long_ids[:limit],
        "middle": long_ids[: limit // 2] + long_ids[len(long_ids) - (limit - limit // 2) :],
    }[mode]
    assert dataset[1]["prompt_ids"] == expected
    assert len(expected) == limit


def test_truncation_error_names_row_length_and_limit(tiny_tokenizer, write_rows):
    rows, short_ids, long_ids = _long_prompt_rows(tiny_tokenizer)
    limit = len(short_ids)
    with pytest.raises(
        DataError, match=rf"row 1: prompt has {len(long_ids)} tokens, more than data.max_prompt_length={limit}; raise"
    ):
        RLDataset(write_rows(rows), tiny_tokenizer, max_prompt_length=limit, truncation="error")


def test_unknown_truncation_mode(tiny_tokenizer, write_rows, make_rows):
    with pytest.raises(
        DataError, match=r"unknown data.truncation='both'; choose one of \['error', 'left', 'right', 'middle'\]"
    ):
        RLDataset(write_rows(make_rows(1)), tiny_tokenizer, truncation="both")


def test_filter_overlong_prompts_counts_dropped(tiny_tokenizer, make_rows, write_rows):
    rows = make_rows(5)
    lengths = [len(templated_ids(tiny_tokenizer, row["prompt"])) for row in rows]
    limit = sorted(lengths)[2]
    expected_kept = [i for i, n in enumerate(lengths) if n <= limit]
    dataset = RLDataset(write_rows(rows), tiny_tokenizer, max_prompt_length=limit, filter_overlong_prompts=True)
    assert dataset.num_filtered == 5 - len(expected_kept)
    assert [dataset[i]["index"] for i in range(len(dataset))] == expected_kept
    assert all(len(dataset[i]["prompt_ids"]) <= limit for i in range(len(dataset)))


def test_all_rows_filtered_error(tiny_tokenizer, make_rows, write_rows):
    with pytest.raises(DataError) as error:
        RLDataset(write_rows(make_rows(5)), tiny_tokenizer, max_prompt_length=4, filter_overlong_prompts=True)
    assert str(error.value) == (
        "0 of 5 rows left: 5 longer than data.max_prompt_length=4 "
        "(set data.filter_overlong_prompts=False or raise max_prompt_length)"
    )


def test_max_samples_first_n_or_seeded_subset(tiny_tokenizer, make_rows, write_rows):
    path = write_rows(make_rows(6))
    first = RLDataset(path, tiny_tokenizer, max_prompt_length=64, max_samples=2)
    assert [first[i]["index"] for i in range(len(first))] == [0, 1]
    a = RLDataset(path, tiny_tokenizer, max_prompt_length=64, max_samples=3, shuffle=True, seed=7)
    b = RLDataset(path, tiny_tokenizer, max_prompt_length=64, max_samples=3, shuffle=True, seed=7)
    picked = [a[i]["index"] for i in range(3)]
    assert picked == [b[i]["index"] for i in range(3)]
    assert len(set(picked)) == 3
    everything = RLDataset(path, tiny_tokenizer, max_prompt_length=64, max_samples=-1)
    assert len(everything) == 6


def test_missing_file(tiny_tokenizer, tmp_path):
    missing = str(tmp_path / "nope.parquet")
    with pytest.raises(
        DataError, match=rf"data file '{missing}' does not exist; check data.train_files / data.val_files"
    ):
        RLDataset(missing, tiny_tokenizer)


def test_unsupported_and_corrupt_files(tiny_tokenizer, tmp_path):
    csv = tmp_path / "rows.csv"
    csv.write_text("a,b\n")
    with pytest.raises(DataError, match=r"unsupported file type '.csv'; convert it to .parquet or .jsonl"):
        RLDataset(str(csv), tiny_tokenizer)
    corrupt = tmp_path / "rows.parquet"
    corrupt.write_bytes(b"not a parquet file at all")
    with pytest.raises(DataError, match=r"as parquet .*; re-create the file"):
        RLDataset(str(corrupt), tiny_tokenizer)
    bad_json = tmp_path / "rows.jsonl"
    bad_json.write_text('{"prompt": []}\n{oops\n')
    with pytest.raises(DataError, match=r"line 2 is not valid JSON"):
        RLDataset(str(bad_json), tiny_tokenizer)
    latin1 = tmp_path / "latin1.jsonl"  # issue 50: a UnicodeDecodeError traceback before
    first = '{"prompt": [{"role": "user", "content": "hi"}]}\n'
    latin1.write_bytes(first.encode() + '{"prompt": [{"role": "user", "content": "caf\u00e9"}]}\n'.encode("latin1"))
    offset = len(first) + len('{"prompt": [{"role": "user", "content": "caf')
    with pytest.raises(DataError) as err:
        RLDataset(str(latin1), tiny_tokenizer)
    assert str(err.value) == (f"cannot read {str(latin1)!r}: line 2 (byte {offset}) is not UTF-8 ("
                              + repr(b'\xe9"}]') + "...); re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)")


def test_missing_prompt_column_names_columns_and_key(tiny_tokenizer, make_rows, write_rows):
    path = write_rows(make_rows(2))
    with pytest.raises(DataError) as error:
        RLDataset(path, tiny_tokenizer, prompt_key="question")
    assert str(error.value) == (
        f"data file(s) {path!r} has no column 'question' (columns: "
        "['ability', 'data_source', 'extra_info', 'prompt', 'reward_model']); set data.prompt_key to one of them"
    )


def test_empty_prompt_names_row(tiny_tokenizer, make_rows, write_rows):
    rows = make_rows(3)
    rows[2]["prompt"] = [{"role": "user", "content": "   "}]
    with pytest.raises(DataError, match=r"row 2: empty prompt in data.prompt_key"):
        RLDataset(write_rows(rows), tiny_tokenizer, max_prompt_length=64)
    rows[2]["prompt"] = []
    with pytest.raises(DataError, match=r"row 2: empty prompt"):
        RLDataset(write_rows(rows), tiny_tokenizer, max_prompt_length=64)


@pytest.mark.parametrize("bad", ["just a string", [{"content": "no role"}], {"role": "user", "content": "x"}])
def test_prompt_must_be_message_list(tiny_tokenizer, make_rows, write_rows, bad):
    rows = make_rows(2)
    rows[1]["prompt"] = bad
    with pytest.raises(
        DataError, match=r"row 1: data.prompt_key must be a list of chat messages like \[\{'role': 'user'"
    ):
        RLDataset(write_rows(rows), tiny_tokenizer, max_prompt_length=64)


def test_empty_file(tiny_tokenizer, write_rows):
    path = write_rows([])
    with pytest.raises(DataError, match=r"0 rows in data file\(s\)"):
        RLDataset(path, tiny_tokenizer)


def test_position_ids_match_unpadded_forward_positions(tiny_tokenizer):
    # Invariance: a prompt's positions do not depend on how much padding its batch needs.
    samples = [{"prompt_ids": [3, 4, 5, 6]}, {"prompt_ids": [7, 8]}]
    alone = collate_prompts(samples[1:], pad_token_id=0)
    together = collate_prompts(samples, pad_token_id=0)
    mask = together["attention_mask"][1].bool()
    assert torch.equal(together["position_ids"][1][mask], alone["position_ids"][0])


@pytest.mark.parametrize("role", ["human", "gpt", "function", "User"])
def test_unknown_message_role_is_rejected_at_load(tiny_tokenizer, make_rows, write_rows, role):
    rows = make_rows(3)
    rows[2]["prompt"] = [{"role": "system", "content": "be brief"}, {"role": role, "content": "1 + 1?"}]
    with pytest.raises(DataError, match=rf"row 2: message 1 of data.prompt_key has role '{role}'; a role must be one of system, user, assistant, tool"):
        RLDataset(write_rows(rows), tiny_tokenizer, max_prompt_length=64)


def test_reward_inputs_are_the_kept_rows(tiny_tokenizer, make_rows, write_rows):
    rows = make_rows(3)
    del rows[1]["reward_model"]
    dataset = RLDataset(write_rows(rows), tiny_tokenizer, max_prompt_length=64)
    assert dataset.reward_inputs() == [(0, "openai/gsm8k", "1"), (1, "openai/gsm8k", None), (2, "openai/gsm8k", "3")]
