"""A tiny random Qwen2.5-VL saved like a real checkpoint, and images of different sizes."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_vl_dir(tmp_path_factory):
    from hybridflow.models.tiny import save_tiny_vl_model

    return save_tiny_vl_model(str(tmp_path_factory.mktemp("tiny_vl") / "model"))


@pytest.fixture(scope="session")
def tiny_vl(tiny_vl_dir):
    """``(model, processor)`` loaded from the folder the way the trainer loads them."""
    from hybridflow.models import load_causal_lm, load_tokenizer
    from hybridflow.models.vision import load_processor

    processor = load_processor(tiny_vl_dir, tokenizer=load_tokenizer(tiny_vl_dir))
    return load_causal_lm(tiny_vl_dir), processor


def solid_image(width: int, height: int, colour: str = "red"):
    from PIL import Image

    return Image.new("RGB", (width, height), colour)
