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


READ_WITHOUT_A_FIELD = {("qwen3_moe", "head_dim")}
"""Keys a model reads with ``getattr(config, key, default)`` though its config class has no field for them."""


@pytest.mark.parametrize("shape", [name for name in SHAPES if not name.startswith("tiny")])
def test_each_real_shape_names_only_fields_of_its_config_and_runs_natively(shape):
    """A real model's shape (config only: no weights) keeps every value it names, each a field of its config class
    (transformers takes an unknown key silently, so a misspelt one would leave the default in place); ``rope_theta``
    is read into ``rope_parameters``."""
    import dataclasses

    fields = dict(SHAPES[shape])
    model_type = fields.pop("model_type")
    config = AutoConfig.for_model(model_type, **fields)
    known = {field.name for field in dataclasses.fields(type(config))} | {
        key for kind, key in READ_WITHOUT_A_FIELD if kind == model_type}
    for key, value in fields.items():
        if key == "rope_theta":
            assert config.rope_parameters["rope_theta"] == value
        else:
            assert key in known, f"{shape}: {key} is no field of {type(config).__name__}"
            assert getattr(config, key) == value, key
    assert unsupported_reason(config) is None


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
