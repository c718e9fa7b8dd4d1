import sys

import pytest

from hybridflow.errors import RolloutError
from hybridflow.rollout import SamplingParams, build_engine, list_engines
from hybridflow.rollout.types import validate_prompts
from hybridflow.rollout.vllm import vllm_available


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(n=0), "n must be >= 1"),
        (dict(max_tokens=0), "max_tokens must be >= 1"),
        (dict(max_tokens=-3), "max_tokens must be >= 1"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(temperature=-0.1), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=-2), "top_k"),
    ],
)
def test_bad_sampling_params_name_the_fix(kwargs, fragment):
    with pytest.raises(RolloutError, match=fragment):
        SamplingParams(**kwargs)


def test_temperature_zero_is_greedy_and_single_stop_string_becomes_list():
    params = SamplingParams(temperature=0.0, stop="###")
    assert params.greedy and params.stop == ["###"]
    assert not SamplingParams(temperature=0.5).greedy


def test_validate_prompts_rejects_empty_and_overlong():
    with pytest.raises(RolloutError, match="empty list"):
        validate_prompts([], max_model_len=8)
    with pytest.raises(RolloutError, match="prompt 1 is empty"):
        validate_prompts([[1], []], max_model_len=8)
    with pytest.raises(RolloutError, match="prompt 0 has 8 tokens but the model context is 8"):
        validate_prompts([[1] * 8], max_model_len=8)
    validate_prompts([[1] * 7], max_model_len=8)  # room for one token is enough


def test_unknown_backend_lists_the_known_ones(tiny_llama):
    model, tokenizer = tiny_llama
    with pytest.raises(RolloutError, match=r"one of hf, native, sglang, vllm"):
        build_engine("sglang-typo", model, tokenizer)
    assert {"native", "hf", "vllm", "sglang"} <= set(list_engines())


def test_vllm_backend_without_vllm_says_how_to_install(tiny_llama, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "vllm", None)  # not importable here
    monkeypatch.setenv("HYBRIDFLOW_VLLM_SIDE_VENV", "0")  # and no side venv may be made
    monkeypatch.setenv("HYBRIDFLOW_VLLM_VENV", str(tmp_path / "none"))
    assert not vllm_available()
    model, tokenizer = tiny_llama
    with pytest.raises(RolloutError, match=r"pip install hybridflow\[vllm\]"):
        build_engine("vllm", model, tokenizer)
