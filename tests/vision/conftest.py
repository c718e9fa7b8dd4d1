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


@pytest.fixture(scope="session", params=["qwen2_5_vl", "qwen2_vl", "qwen3_vl"])
def vl_arch_dir(request, tmp_path_factory):
    """A tiny random Qwen2.5-VL, then a tiny random Qwen2-VL, then a tiny random Qwen3-VL."""
    from hybridflow.models.tiny import save_tiny_vl_model

    return save_tiny_vl_model(str(tmp_path_factory.mktemp(request.param) / "model"), arch=request.param)


@pytest.fixture(scope="session")
def vl_arch(vl_arch_dir):
    """``(model, processor)`` of :func:`vl_arch_dir`, loaded as the trainer loads them."""
    from hybridflow.models import load_causal_lm, load_tokenizer
    from hybridflow.models.vision import load_processor

    return load_causal_lm(vl_arch_dir), load_processor(vl_arch_dir, tokenizer=load_tokenizer(vl_arch_dir))


def solid_image(width: int, height: int, colour: str = "red"):
    from PIL import Image

    return Image.new("RGB", (width, height), colour)
