"""verl 0.9.1's ``data.image_patch_size`` and ``data.mm_processor_kwargs`` on a tiny Qwen2.5-VL (issue 60).

image_patch_size: verl's RL dataset counts an image prompt for ``filter_overlong_prompts`` on its images first
resized by qwen_vl_utils' ``fetch_image`` (multiples of 2 x image_patch_size, 4 to 16384 tokens); rollout and
training use the processor's own patch size. mm_processor_kwargs: extra arguments of every processor call.
"""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from hybridflow.config.data import check_multimodal
from hybridflow.data.patch_resize import patch_grid_size
from hybridflow.data.rl_dataset import RLDataset
from hybridflow.data.vision import image_inputs, image_to_bytes
from hybridflow.errors import DataError
from tests.vision.conftest import solid_image


def test_patch_grid_size_by_hand():
    assert patch_grid_size(80, 80, factor=28) == (84, 84)  # round(2.86) = 3 patches of 28
    assert patch_grid_size(80, 80, factor=32) == (64, 64)  # round(2.5) = 2 (half to even)
    assert patch_grid_size(80, 120, factor=28) == (84, 112)
    assert patch_grid_size(10, 10, factor=28) == (56, 56)  # below 4 tokens: ceil(10 * 5.6 / 28) * 28
    # above 16384 tokens (12845056 px): b = sqrt(16e6 / 12845056); floor(4000 / b / 28) * 28 = 3584
    assert patch_grid_size(4000, 4000, factor=28) == (3584, 3584)
    with pytest.raises(ValueError, match="aspect ratio 300"):
        patch_grid_size(1, 300, factor=28)


def _rows(tmp_path, *sizes) -> str:
    rows = [{"prompt": [{"role": "user", "content": "Say hi."}], "data_source": "t"}]
    rows += [{"prompt": [{"role": "user", "content": f"<image>Row {i}?"}], "data_source": "t",
              "images": [image_to_bytes(solid_image(w, h))]} for i, (w, h) in enumerate(sizes)]
    path = tmp_path / "rows.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return str(path)


def _dataset(path, processor, **kwargs) -> RLDataset:
    return RLDataset(path, processor.tokenizer, processor=processor, **kwargs)


def test_image_patch_size_sets_what_the_overlong_filter_counts(tmp_path, tiny_vl):
    _, processor = tiny_vl
    path = _rows(tmp_path, (80, 80))
    full = _dataset(path, processor, max_prompt_length=256)
    real = len(full.prompt_ids[1])  # the processor's 28-px grid: 84 x 84 -> 3 x 3 tokens
    assert full.vision[1]["image_grid_thw"].tolist() == [[1, 6, 6]]
    # patch 14: fetch_image keeps 84 x 84, counted as real; patch 16: 64 x 64 -> 56 x 56, 2 x 2 tokens: 5 fewer
    kept = _dataset(path, processor, max_prompt_length=real, filter_overlong_prompts=True, image_patch_size=14)
    assert len(kept) == 2 and kept.prompt_ids[1] == full.prompt_ids[1]
    dropped = _dataset(path, processor, max_prompt_length=real - 1, filter_overlong_prompts=True, image_patch_size=14)
    assert len(dropped) == 1 and dropped.num_filtered == 1
    with pytest.raises(DataError) as err:  # counted at 16 it fits; the prompt trained on does not
        _dataset(path, processor, max_prompt_length=real - 1, filter_overlong_prompts=True, image_patch_size=16)
    assert str(err.value) == (
        f"row 1: the overlong filter kept the prompt (its images counted at data.image_patch_size=16), but with the "
        f"processor's own patch size it is {real} tokens, longer than data.max_prompt_length={real - 1}; set "
        "data.image_patch_size=null (the processor's) or raise max_prompt_length")
    dropped = _dataset(path, processor, max_prompt_length=real - 6, filter_overlong_prompts=True, image_patch_size=16)
    assert len(dropped) == 1  # counted at 16: real - 5 tokens > real - 6
    # without the filter the key changes nothing: rollout and training use the processor's own patch size
    assert _dataset(path, processor, max_prompt_length=256, image_patch_size=16).prompt_ids == full.prompt_ids


def test_a_small_image_counts_at_least_four_tokens(tmp_path, tiny_vl):
    """fetch_image's floor of 4 tokens (4 x 28^2 px) lifts a 40 x 40 image the tiny processor reads as 1 token."""
    _, processor = tiny_vl
    path = _rows(tmp_path, (40, 40))
    real = len(_dataset(path, processor, max_prompt_length=256).prompt_ids[1])
    assert len(_dataset(path, processor, max_prompt_length=real + 3, filter_overlong_prompts=True)) == 2
    assert len(_dataset(path, processor, max_prompt_length=real + 2, filter_overlong_prompts=True)) == 1


def test_mm_processor_kwargs_reach_every_processor_call(tmp_path, tiny_vl_dir):
    from hybridflow.config import PPOConfig, load_config
    from hybridflow.models import load_tokenizer
    from hybridflow.trainer.roles.builders import policy_processor

    tokenizer = load_tokenizer(tiny_vl_dir)
    cfg = load_config(PPOConfig, [f"actor_rollout_ref.model.path={tiny_vl_dir}",
                                  "+data.mm_processor_kwargs.max_pixels=3136"])
    bound, plain = policy_processor(cfg, tokenizer), policy_processor(load_config(PPOConfig, [
        f"actor_rollout_ref.model.path={tiny_vl_dir}"]), tokenizer)
    path = _rows(tmp_path, (112, 112))
    small, full = (_dataset(path, p, max_prompt_length=256) for p in (bound, plain))
    # 112 x 112 = 12544 px > 3136: smart_resize halves each side, 56 x 56: a 4 x 4 grid instead of 8 x 8
    assert small.vision[1]["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert full.vision[1]["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert len(full.prompt_ids[1]) - len(small.prompt_ids[1]) == 16 - 4
    # a tool's images go through the image processor alone: the kwargs apply there too
    assert image_inputs(bound, [solid_image(112, 112)], row_index=0)["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert bound.call_kwargs == {"max_pixels": 3136} and bound.image_token_id == plain.image_token_id


def test_bad_values_are_one_line_each():
    problems = []
    check_multimodal(problems, SimpleNamespace(data=SimpleNamespace(
        image_patch_size=0, mm_processor_kwargs={"images": [], "max_pixels": 1})))
    assert problems == [
        "data.image_patch_size=0 must be a positive patch size (e.g. 14) or null (the processor's)",
        "data.mm_processor_kwargs sets images, which the data pipeline passes itself; keep only the processor's "
        "options (e.g. max_pixels, min_pixels)"]
