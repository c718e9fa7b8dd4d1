"""Every tiny shape of benchmarks/model_shapes.py is an architecture the native engine runs (a benchmark of a
shape that fell back to HF generate would compare HF with itself)."""

import pytest
from transformers import AutoConfig

from hybridflow.rollout.architectures import unsupported_reason
from tests.benchmarks.loader import loaded_benchmark

with loaded_benchmark("model_shapes") as shapes_module:
    SHAPES = dict(shapes_module.SHAPES)


@pytest.mark.parametrize("shape", [name for name in SHAPES if name.startswith("tiny-")])
def test_each_tiny_shape_runs_natively(shape):
    fields = dict(SHAPES[shape])
    assert unsupported_reason(AutoConfig.for_model(fields.pop("model_type"), **fields)) is None


with loaded_benchmark("model_shapes") as shapes_module:
    VL_SHAPES = {name: dict(fields) for name, fields in shapes_module.VL_SHAPES.items()}
    random_vl_model = shapes_module.random_vl_model


@pytest.mark.parametrize("shape", list(VL_SHAPES))
def test_each_vl_shape_is_the_qwen2_5_vl_it_names_and_runs_natively(shape):
    """Built on the meta device (no memory): the tower and the language model take the shape's fields, the vision
    token ids are the tiny processor's, and the native engine decodes it."""
    from hybridflow.models.tiny import build_tiny_vl_processor

    tokenizer = build_tiny_vl_processor().tokenizer
    model = random_vl_model(shape, tokenizer, dtype="bfloat16", device="meta")
    vision, text = model.config.vision_config, model.config.get_text_config()
    for key, value in VL_SHAPES[shape]["vision"].items():
        assert getattr(vision, key) == value, key
    for key in ("hidden_size", "num_hidden_layers", "num_key_value_heads", "vocab_size"):
        assert getattr(text, key) == VL_SHAPES[shape]["text"][key], key
    assert model.config.image_token_id == tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert unsupported_reason(model.config, max_model_len=4096) is None
