"""Image rows -> prompt ids with the image tokens, per-row pixel values and grids; SFT rows with images."""

from __future__ import annotations

import pytest
import torch

from hybridflow.data.rl_dataset import RLDataset
from hybridflow.data.sft_dataset import SFTDataset
from hybridflow.data.vision import image_messages, image_to_bytes, load_image
from hybridflow.errors import DataError
from tests.vision.conftest import solid_image


def image_rows(tmp_path):
    """Two rows: a 56 x 56 image (1 x 4 x 4 patches) and a 112 x 84 image (1 x 6 x 8 patches), plus a text row."""
    import pandas as pd

    small, large = solid_image(56, 56), solid_image(112, 84, "blue")
    rows = [
        {"prompt": [{"role": "user", "content": "<image>How many?"}], "images": [image_to_bytes(small)],
         "data_source": "hybridflow/shape_count", "reward_model": {"ground_truth": "1"}},
        {"prompt": [{"role": "user", "content": "Count <image> please"}], "images": [image_to_bytes(large)],
         "data_source": "hybridflow/shape_count", "reward_model": {"ground_truth": "2"}},
        {"prompt": [{"role": "user", "content": "no picture"}], "images": [],
         "data_source": "hybridflow/shape_count", "reward_model": {"ground_truth": "0"}},
    ]
    path = tmp_path / "rows.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return str(path), [small, large]


def test_collate_keeps_each_row_s_pixel_values_and_grid(tmp_path, tiny_vl):
    _, processor = tiny_vl
    path, (small, large) = image_rows(tmp_path)
    dataset = RLDataset(path, processor.tokenizer, processor=processor, max_prompt_length=128)
    batch = dataset.collate_fn([dataset[0], dataset[1], dataset[2]])
    per_row = batch["multi_modal_inputs"]
    # grid t x h x w in 14-pixel patches; 2 x 2 patches merge into one <|image_pad|> token
    assert per_row[0]["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert per_row[1]["image_grid_thw"].tolist() == [[1, 6, 8]]
    assert per_row[2] is None
    assert per_row[0]["pixel_values"].shape == (16, 3 * 2 * 14 * 14)
    assert per_row[1]["pixel_values"].shape == (48, 3 * 2 * 14 * 14)
    pad = processor.image_token_id
    assert (batch["input_ids"] == pad).sum(1).tolist() == [4, 12, 0]
    texts = ["<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How many?<|im_end|>\n"
             "<|im_start|>assistant\n",
             "<|im_start|>user\nCount <|vision_start|><|image_pad|><|vision_end|> please<|im_end|>\n"
             "<|im_start|>assistant\n"]
    for row, (image, text) in enumerate(zip([small, large], texts)):
        expected = processor(text=[text], images=[image], return_tensors="pt")
        assert torch.equal(per_row[row]["pixel_values"], expected["pixel_values"])
        mask = batch["attention_mask"][row].bool()
        assert batch["input_ids"][row][mask].tolist() == expected["input_ids"][0].tolist()


def test_placeholders_must_match_the_images(tmp_path, tiny_vl):
    with pytest.raises(DataError, match="2 '<image>' placeholder\\(s\\) but 'images' holds 1 image"):
        image_messages([{"role": "user", "content": "<image><image>"}], 1, row_index=3, image_key="images")
    with pytest.raises(DataError, match="row 2: the prompt has a '<video>' placeholder; videos are not supported"):
        image_messages([{"role": "user", "content": "<video> what happens?"}], 0, row_index=2, image_key="images")
    parts = [{"type": "text", "text": "a "}, {"type": "image"}, {"type": "text", "text": " b"}]
    assert image_messages([{"role": "user", "content": "a <image> b"}], 1, row_index=0, image_key="images") == [
        {"role": "user", "content": parts}]


def test_images_load_from_bytes_paths_and_pil(tmp_path):
    image = solid_image(20, 10, "green")
    path = tmp_path / "x.png"
    image.save(path)
    for entry in (image_to_bytes(image), {"path": str(path)}, str(path), image):
        loaded = load_image(entry, row_index=0)
        assert loaded.size == (20, 10) and loaded.getpixel((0, 0)) == (0, 128, 0)
    with pytest.raises(DataError, match="row 5: an image entry must be"):
        load_image({"url": "http://x"}, row_index=5)


def test_rows_with_images_need_a_vision_language_model(tmp_path, tiny_tokenizer):
    path, _ = image_rows(tmp_path)
    with pytest.raises(DataError, match="row 0 has images in 'images', but the model has no image processor"):
        RLDataset(path, tiny_tokenizer, max_prompt_length=128)


def test_sft_rows_with_images_mask_only_the_answer(tmp_path, tiny_vl):
    import pandas as pd

    _, processor = tiny_vl
    rows = [{"messages": [{"role": "user", "content": "<image>How many?"},
                          {"role": "assistant", "content": "\\boxed{2}"}],
             "images": [image_to_bytes(solid_image(56, 56))]}]
    path = tmp_path / "sft.parquet"
    pd.DataFrame(rows).to_parquet(path)
    sample = SFTDataset(str(path), processor.tokenizer, messages_key="messages", processor=processor)[0]
    ids, mask = sample["input_ids"], sample["loss_mask"]
    assert (ids == processor.image_token_id).sum() == 4 and not mask[ids == processor.image_token_id].any()
    assert processor.tokenizer.decode(ids[mask.bool()]) == "\\boxed{2}<|im_end|>"
    assert sample["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]


def video_rows(tmp_path, column: str = "videos"):
    """An image row without videos (an empty list, as verl's files hold), then a row whose ``column`` carries a
    video (its frames as image bytes)."""
    import pandas as pd

    frame = image_to_bytes(solid_image(56, 56))
    rows = [{"prompt": [{"role": "user", "content": "<image>How many?"}], "images": [frame], column: []},
            {"prompt": [{"role": "user", "content": "What happens?"}], "images": [], column: [[frame, frame]]}]
    path = tmp_path / f"{column}.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return str(path)


def test_a_row_that_carries_videos_is_refused_naming_the_column(tmp_path, tiny_vl):
    _, processor = tiny_vl
    message = ("row 1 has 1 video\\(s\\) in 'clips'; videos are not supported: give the sampled frames as images "
               "\\('images', one '<image>' each in the prompt\\) or drop the 'clips' column")
    with pytest.raises(DataError, match=message):
        RLDataset(video_rows(tmp_path, "clips"), processor.tokenizer, processor=processor, video_key="clips")
    with pytest.raises(DataError, match="row 1 has 1 video\\(s\\) in 'videos'"):
        SFTDataset(video_rows(tmp_path), processor.tokenizer, prompt_key="prompt", response_key="prompt",
                   processor=processor)
    dataset = RLDataset(video_rows(tmp_path, "clips"), processor.tokenizer, processor=processor)  # not the video_key
    assert len(dataset) == 2 and dataset.vision[1] is None


def test_sft_reads_verl_s_pokemon_rows(tmp_path, vl_arch):
    """verl's examples/data_preprocess/pokemon.py rows (``messages`` with ``<image>`` in the user turn, ``images`` as
    ``datasets`` writes them: ``{bytes, path}``), with no data.messages_key, as its run_qwen3_vl_2b.sh reads them."""
    import pandas as pd

    _, processor = vl_arch
    rows = [{"messages": [{"role": "user", "content": "<image>Fill in the blank: this is a photo of a {}"},
                          {"role": "assistant", "content": "This is a photo of Pikachu."}],
             "images": [{**image_to_bytes(solid_image(56, 56, "yellow")), "path": None}]}]
    pd.DataFrame(rows).to_parquet(tmp_path / "pokemon.parquet")
    sample = SFTDataset(str(tmp_path / "pokemon.parquet"), processor.tokenizer, processor=processor)[0]
    ids, mask = sample["input_ids"], sample["loss_mask"]
    assert (ids == processor.image_token_id).sum() == 4 and not mask[ids == processor.image_token_id].any()
    assert processor.tokenizer.decode(ids[mask.bool()]).startswith("This is a photo of Pikachu.")
    assert sample["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]
