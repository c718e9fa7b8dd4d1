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
