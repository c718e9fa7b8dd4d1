"""verl's rollout sizing keys reach the engine: vLLM / SGLang constructors (fakes that record
their arguments stand in for the GPU packages) and the native engine's KV slots and context."""

import importlib.machinery
import sys
import types

import pytest

from hybridflow.config import PPOConfig, load_config
from hybridflow.trainer.roles.builders import _rollout_worker
from hybridflow.errors import RolloutError
from hybridflow.rollout.block_manager import BLOCK_SIZE
from hybridflow.rollout.engine import engine_unavailable
from hybridflow.rollout.types import SamplingParams
from tests.rollout.conftest import chat_prompts

SIZING = ["actor_rollout_ref.rollout.gpu_memory_utilization=0.8",
          "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
          "actor_rollout_ref.rollout.max_model_len=3072",
          "actor_rollout_ref.rollout.enable_chunked_prefill=False",
          "actor_rollout_ref.rollout.max_num_batched_tokens=10240",
          "actor_rollout_ref.rollout.max_num_seqs=96"]


def rollout_cfg(*overrides):
    return load_config(PPOConfig, ["actor_rollout_ref.model.path=/m", *overrides]).actor_rollout_ref.rollout


def fake_module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)  # so importlib.util.find_spec sees it installed
    module.__dict__.update(attrs)
    return module


@pytest.fixture
def loaded_model(tiny_llama, monkeypatch):
    """The tiny model as if loaded from a folder: the GPU engines read weights from ``name_or_path``."""
    model, tokenizer = tiny_llama
    monkeypatch.setattr(model, "name_or_path", "/models/tiny")
    return model, tokenizer


@pytest.fixture
def fake_vllm(monkeypatch):
    calls = []

    class LLM:
        def __init__(self, **kwargs):
            calls.append(kwargs)
            self.llm_engine = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=kwargs["max_model_len"]))

        def collective_rpc(self, method, args=()):
            calls.append(method)
            return [len(args[1])]

        def reset_prefix_cache(self):
            calls.append("reset_prefix_cache")

    monkeypatch.setitem(sys.modules, "vllm", fake_module("vllm", LLM=LLM))
    return calls


@pytest.fixture
def fake_sglang(monkeypatch):
    calls = []

    class Engine:
        def __init__(self, **kwargs):
            calls.append(kwargs)

        def update_weights_from_tensor(self, *, named_tensors, flush_cache):
            calls.append({"update_weights": len(named_tensors), "flush_cache": flush_cache})

        def flush_cache(self):
            calls.append({"flush_cache": True})

        def generate(self, *, input_ids, sampling_params, return_logprob):
            calls.append({"input_ids": input_ids, **sampling_params})
            return [{"output_ids": [7, 2], "meta_info": {"finish_reason": {"type": "stop"},
                                                         "output_token_logprobs": [(-0.5, 7, None), (-0.25, 2, None)]}}
                    for _ in input_ids]

    monkeypatch.setitem(sys.modules, "sglang", fake_module("sglang", Engine=Engine))
    return calls


def test_vllm_sizing_keys_reach_vllm_llm(fake_vllm, loaded_model):
    model, tokenizer = loaded_model
    worker = _rollout_worker(model, tokenizer, rollout_cfg("actor_rollout_ref.rollout.name=vllm", *SIZING,
                                                           "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4"))
    (kwargs,) = fake_vllm
    assert kwargs["model"] == "/models/tiny"
    assert kwargs["worker_extension_cls"] == "hybridflow.rollout.vllm_worker.WeightSyncExtension"
    assert kwargs["gpu_memory_utilization"] == 0.8 and kwargs["tensor_parallel_size"] == 4
    assert kwargs["max_model_len"] == 3072 and kwargs["max_num_seqs"] == 96
    assert kwargs["enable_chunked_prefill"] is False and kwargs["max_num_batched_tokens"] == 10240
    assert kwargs["swap_space"] == 4 and kwargs["dtype"] == "bfloat16"  # engine_kwargs pass through
    assert worker.engine.max_model_len == 3072


def test_vllm_max_model_len_defaults_to_prompt_plus_response(fake_vllm, loaded_model):
    model, tokenizer = loaded_model
    _rollout_worker(model, tokenizer, rollout_cfg("actor_rollout_ref.rollout.name=vllm", "data.max_prompt_length=100",
                                                  "data.max_response_length=28"))
    assert fake_vllm[0]["max_model_len"] == 128


def test_sglang_backend_maps_the_keys_and_groups_n_samples(fake_sglang, loaded_model):
    model, tokenizer = loaded_model
    worker = _rollout_worker(model, tokenizer, rollout_cfg("actor_rollout_ref.rollout.name=sglang", *SIZING))
    kwargs = fake_sglang[0]
    assert kwargs["model_path"] == "/models/tiny"
    assert kwargs["mem_fraction_static"] == 0.8 and kwargs["tp_size"] == 4 and kwargs["context_length"] == 3072
    assert kwargs["max_running_requests"] == 96 and kwargs["chunked_prefill_size"] == -1  # chunked prefill off
    out = worker.engine.generate([[1, 2], [3]], SamplingParams(n=2, max_tokens=4, temperature=0.5))
    assert [c.prompt_index for c in out] == [0, 0, 1, 1]
    assert fake_sglang[1]["input_ids"] == [[1, 2], [1, 2], [3], [3]] and fake_sglang[1]["max_new_tokens"] == 4
    assert out[0].token_ids == [7, 2] and out[0].logprobs == [-0.5, -0.25] and out[0].finish_reason == "stop"


def test_vllm_weight_sync_empties_the_prefix_cache(fake_vllm, loaded_model):
    """vLLM caches prefixes by default: after a sync, blocks computed with the old weights must not be reused."""
    model, tokenizer = loaded_model
    worker = _rollout_worker(model, tokenizer, rollout_cfg("actor_rollout_ref.rollout.name=vllm"))
    worker.engine.load_weights(model.named_parameters())
    assert fake_vllm[1:] == ["hybridflow_load_weights", "reset_prefix_cache"]  # by name: a function is refused


def test_sglang_weight_sync_flushes_the_radix_cache(fake_sglang, loaded_model):
    model, tokenizer = loaded_model
    worker = _rollout_worker(model, tokenizer, rollout_cfg("actor_rollout_ref.rollout.name=sglang"))
    worker.engine.load_weights(model.named_parameters())
    worker.engine.reset_prefix_cache()
    assert fake_sglang[1:] == [{"update_weights": len(list(model.parameters())), "flush_cache": True},
                               {"flush_cache": True}]


@pytest.mark.parametrize("name, package", [("vllm", "vllm"), ("sglang", "sglang")])
def test_missing_optional_backend_is_named_before_loading(monkeypatch, name, package, tmp_path):
    monkeypatch.setitem(sys.modules, package, None)  # find_spec -> None: not installed
    monkeypatch.setenv("HYBRIDFLOW_VLLM_SIDE_VENV", "0")  # and vLLM's side venv may not be made
    monkeypatch.setenv("HYBRIDFLOW_VLLM_VENV", str(tmp_path / "none"))
    problem = engine_unavailable(name)
    assert f"rollout.name={name} needs the {package} package" in problem
    assert f"pip install hybridflow[{name}]" in problem and "rollout.name=native" in problem


def test_native_engine_honours_max_num_seqs_and_max_model_len(tiny_llama):
    model, tokenizer = tiny_llama
    worker = _rollout_worker(model, tokenizer, rollout_cfg("actor_rollout_ref.rollout.max_num_seqs=3",
                                                           "actor_rollout_ref.rollout.max_model_len=40"))
    engine = worker.engine
    assert engine.max_num_seqs == 3 and engine.max_model_len == 40
    prompts = chat_prompts(tokenizer)[:2]
    out = engine.generate(prompts, SamplingParams(n=2, max_tokens=3, seed=0))
    assert len(out) == 4
    capacity = min(40, max(map(len, prompts)) + 3)  # 4 samples, 3 at a time: blocks for 3, plus the null block
    assert engine.cache.blocks == 3 * -(-capacity // BLOCK_SIZE) + 1
    with pytest.raises(RolloutError, match="model context is 40"):
        engine.generate([[1] * 40], SamplingParams(max_tokens=2))


def test_kv_blocks_are_what_the_memory_budget_holds_and_too_few_is_one_line():
    import pytest

    from hybridflow.errors import RolloutError
    from hybridflow.rollout.native import kv_blocks_within

    gib, mib = 2**30, 2**20
    # 0.5 of 80 GiB with 10 GiB in use leaves 30 GiB: 30 * 1024 blocks of 1 MiB.
    assert kv_blocks_within(budget=0.5 * 80 * gib - 10 * gib, per_block=mib, utilization=0.5, total=80 * gib,
                            max_len=4096) == 30 * 1024
    # One sequence of 4096 positions takes 256 blocks of 16 and the null block: 257 MiB, more than 256 MiB.
    with pytest.raises(RolloutError, match="raise rollout.gpu_memory_utilization, lower max_model_len"):
        kv_blocks_within(budget=256 * mib, per_block=mib, utilization=0.5, total=80 * gib, max_len=4096)
    assert kv_blocks_within(budget=257 * mib, per_block=mib, utilization=0.5, total=80 * gib, max_len=4096) == 257


def test_the_trainer_passes_gpu_memory_utilization_to_the_native_engine():
    from hybridflow.config import PPOConfig, load_config
    from hybridflow.rollout.config import engine_kwargs_from_rollout_config

    cfg = load_config(PPOConfig, ["actor_rollout_ref.model.path=m", "data.train_files=t", "data.val_files=v",
                                  "actor_rollout_ref.rollout.gpu_memory_utilization=0.7"])
    assert engine_kwargs_from_rollout_config(cfg.actor_rollout_ref.rollout)["gpu_memory_utilization"] == 0.7


def test_vllm_cpu_kv_cache_is_sized_from_the_workload(tmp_path):
    """On a CPU, ``gpu_memory_utilization`` caps the KV cache instead of reserving that share of the RAM: the cache
    holds the sequences asked for (2 x layers x kv heads x head_dim x 4 bytes a token), 64 MiB at least."""
    import json

    from hybridflow.rollout.vllm import cpu_kv_cache_bytes

    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 30, "num_attention_heads": 9,
                                                      "num_key_value_heads": 3, "hidden_size": 576}))
    assert cpu_kv_cache_bytes(str(tmp_path), max_model_len=512, max_num_seqs=8, share=0.5) == 188_743_680  # 46,080 B
    assert cpu_kv_cache_bytes(str(tmp_path), max_model_len=512, max_num_seqs=8, share=1e-9) == 64 << 20  # capped
