"""vLLM backend, used when ``vllm`` is installed (never a required dependency).

Weights are synced from the trainer through the loaded model's ``load_weights``
(vLLM's in-place reload path, as verl's sharding managers use it), without a reload
from disk.

With ``free_cache_engine`` (verl's ``rollout.free_cache_engine``) the engine is built in vLLM's sleep mode:
``release_kv_cache`` puts it to sleep at level 1 (weights offloaded to CPU memory, the KV cache discarded; vLLM
keeps the device addresses, so its CUDA graphs survive), and it wakes in two stages as verl's hybrid engine does:
the weights before a weight sync writes into them, the KV cache before the next ``generate``.
"""

from __future__ import annotations

from hybridflow.errors import RolloutError
from hybridflow.rollout.optional import package_installed
from hybridflow.rollout.sleep import ReleasedMemory
from hybridflow.rollout.types import Completion, SamplingParams, validate_prompts


def vllm_available() -> bool:
    return package_installed("vllm")


class VLLMEngine:
    """``generate`` through ``vllm.LLM``; the model is read from ``model_path``.

    The sizing arguments carry verl's ``rollout.*`` keys to ``vllm.LLM`` under vLLM's names
    (``tensor_model_parallel_size`` -> ``tensor_parallel_size``); ``llm_kwargs``
    (``rollout.engine_kwargs.vllm``) go through unchanged and win.
    """

    def __init__(self, model=None, tokenizer=None, *, model_path: str | None = None, dtype: str = "auto",
                 gpu_memory_utilization: float = 0.5, tensor_model_parallel_size: int = 1,
                 max_model_len: int | None = None, enable_chunked_prefill: bool = True,
                 max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None,
                 enforce_eager: bool = True, free_cache_engine: bool = False, **llm_kwargs):
        if not vllm_available():
            raise RolloutError("rollout.name=vllm needs vLLM; `pip install hybridflow[vllm]` or use rollout.name=native")
        import vllm

        model_path = model_path or getattr(model, "name_or_path", None)
        if not model_path:
            raise RolloutError("the vllm backend loads the model from disk; pass model_path= (a local folder or hub id)")
        sizing = dict(dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                      tensor_parallel_size=tensor_model_parallel_size, max_model_len=max_model_len,
                      enable_chunked_prefill=enable_chunked_prefill, max_num_batched_tokens=max_num_batched_tokens,
                      max_num_seqs=max_num_seqs, enforce_eager=enforce_eager,
                      enable_sleep_mode=free_cache_engine)
        settings = {**sizing, **llm_kwargs}
        self.llm = vllm.LLM(model=model_path, **settings)
        self.max_model_len = self.llm.llm_engine.model_config.max_model_len
        self.memory = ReleasedMemory(enabled=bool(settings["enable_sleep_mode"]),
                                     release=lambda: self.llm.sleep(level=1),
                                     resume=lambda parts: self.llm.wake_up(tags=parts))

    def release_kv_cache(self) -> bool:
        """Sleep (level 1): the KV cache discarded, the weights offloaded to CPU memory; ``False`` (nothing freed)
        unless the engine was built with ``free_cache_engine`` (vLLM's ``enable_sleep_mode``)."""
        return self.memory.release()

    def load_weights(self, named_tensors) -> None:
        self.memory.resume("weights")
        weights = list(named_tensors)
        self.llm.collective_rpc(lambda worker: worker.model_runner.model.load_weights(weights))
        self.reset_prefix_cache()  # vLLM caches prefixes by default: blocks computed with the old weights

    def reset_prefix_cache(self) -> None:
        """Forget vLLM's cached prefix blocks, so the next prompts prefill with the current weights."""
        self.llm.reset_prefix_cache()

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[Completion]:
        import vllm

        validate_prompts(prompt_token_ids, max_model_len=self.max_model_len)
        self.memory.resume("weights", "kv_cache")
        vllm_params = vllm.SamplingParams(
            n=params.n, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k, min_p=params.min_p,
            repetition_penalty=params.repetition_penalty,
            ignore_eos=params.ignore_eos,
            max_tokens=params.max_tokens, stop_token_ids=list(params.stop_token_ids), stop=list(params.stop) or None,
            seed=params.seed, logprobs=0 if params.logprobs else None, include_stop_str_in_output=True,
        )
        prompts = [{"prompt_token_ids": p} for p in prompt_token_ids]
        outputs = self.llm.generate(prompts, vllm_params, use_tqdm=False)
        return [_completion(index, sample, params) for index, out in enumerate(outputs) for sample in out.outputs]


def _completion(prompt_index: int, sample, params: SamplingParams) -> Completion:
    token_ids = list(sample.token_ids)
    logprobs = None
    if params.logprobs and sample.logprobs is not None:
        logprobs = [step[token].logprob for token, step in zip(token_ids, sample.logprobs)]
    finish = "stop" if sample.finish_reason == "stop" else "length"
    return Completion(token_ids, logprobs, finish, prompt_index)
