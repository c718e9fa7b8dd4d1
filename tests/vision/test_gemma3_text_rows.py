"""A Gemma 3 multimodal checkpoint (Gemma3ForConditionalGeneration, a SigLIP tower without Qwen-VL's patch
merging) trains on text rows as a text model does (issue 50: "'SiglipVisionConfig' object has no attribute
'spatial_merge_size'" at the first log-prob)."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.ppo_fixtures import base_overrides


@pytest.fixture(scope="module")
def tiny_gemma3_vl_dir(tmp_path_factory):
    """A random Gemma 3 multimodal model: the tiny gemma3_text language model under a 1-layer SigLIP tower over
    56-pixel images (4 x 4 patches pooled to 4 image tokens), the image tokens at ids 500..502 of the tiny
    tokenizer's 512."""
    import transformers

    from hybridflow.models.tiny import build_tiny_tokenizer, tiny_config

    tokenizer = build_tiny_tokenizer()
    text = tiny_config("gemma3_text", vocab_size=len(tokenizer), eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=56,
                  patch_size=14)
    config = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision, mm_tokens_per_image=4,
                                       image_token_id=500, boi_token_id=501, eoi_token_id=502)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = transformers.Gemma3ForConditionalGeneration(config).float()
    path = tmp_path_factory.mktemp("gemma3_vl")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_text_rows_train_on_a_gemma3_multimodal_checkpoint(tmp_path, tiny_gemma3_vl_dir):
    from hybridflow.trainer.main_ppo import main

    overrides = base_overrides(tmp_path, tiny_gemma3_vl_dir, steps=1) + ["trainer.save_freq=1"]
    assert main(overrides) == 0
    assert (tmp_path / "ckpt" / "global_step_1" / "actor").is_dir()


def test_images_through_gemma3_s_processor_are_one_line(tmp_path):
    """Image rows take Qwen-VL processors (patch grids, image_grid_thw); Gemma 3's returns none, which was a
    KeyError: one DataError line instead, while the dataset is built."""
    import transformers
    from PIL import Image

    from hybridflow.data.vision import image_to_bytes, process_image_prompt
    from hybridflow.errors import DataError
    from hybridflow.models.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokens = {"boi": "<start_of_image>", "eoi": "<end_of_image>", "image": "<image_soft_token>"}
    tokenizer.add_special_tokens({"additional_special_tokens": list(tokens.values())})
    for kind, token in tokens.items():  # what Gemma 3's own tokenizer carries
        setattr(tokenizer, f"{kind}_token", token)
        setattr(tokenizer, f"{kind}_token_id", tokenizer.convert_tokens_to_ids(token))
    template = ("{% for m in messages %}{% for p in m.content %}{% if p.type == 'image' %}<start_of_image>"
                "{% else %}{{ p.text }}{% endif %}{% endfor %}{% endfor %}")
    processor = transformers.Gemma3Processor(
        image_processor=transformers.Gemma3ImageProcessorPil(size={"height": 56, "width": 56}), tokenizer=tokenizer,
        image_seq_length=4, chat_template=template)
    image = image_to_bytes(Image.new("RGB", (56, 56)))
    with pytest.raises(DataError, match=r"^row 2: images through Gemma3Processor are not supported: image rows take "
                                        r"a Qwen2-VL / Qwen2.5-VL processor .*drop the image column"):
        process_image_prompt(processor, [{"role": "user", "content": "<image> what is it?"}], [image], row_index=2)
