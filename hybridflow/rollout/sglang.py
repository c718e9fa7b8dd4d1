"""SGLang backend, used when ``sglang`` is installed (never a required dependency).

``sglang.Engine`` is SGLang's offline engine. verl's ``rollout.*`` sizing keys map to
its arguments (``gpu_memory_utilization`` -> ``mem_fraction_static``,
``tensor_model_parallel_size`` -> ``tp_size``, ``max_model_len`` -> ``context_length``,
``max_num_seqs`` -> ``max_running_requests``, ``max_num_batched_tokens`` ->
``chunked_prefill_size``, -1 when chunked prefill is off); ``rollout.engine_kwargs.sglang``
goes through unchanged and wins. Weights are synced in memory through
``update_weights_from_tensor``. Each prompt is submitted ``n`` times, so the ``n``
completions of a prompt stay together and in order. SGLang's offline engine takes no
per-request seed here: sampled rollouts are not reproducible across runs with this backend.

With ``free_cache_engine`` (verl's ``rollout.free_cache_engine``) the engine is built with SGLang's memory saver
(``enable_memory_saver``): ``release_kv_cache`` releases its KV cache and weights
(``release_memory_occupation``), and they come back as verl resumes them: the weights before a weight sync, the
KV cache before the next ``generate``.
"""

from __future__ import annotations

from hybridflow.errors import RolloutError
from hybridflow.rollout.optional import package_installed
from hybridflow.rollout.sleep import PARTS, ReleasedMemory
from hybridflow.rollout.types import Completion, SamplingParams, validate_prompts


class SGLangEngine:
    """``generate`` through ``sglang.Engine``; the model is read from ``model_path``."""

    def __init__(self, model=None, tokenizer=None, *, model_path: str | None = None, dtype: str = "auto",
                 gpu_memory_utilization: float = 0.5, tensor_model_parallel_size: int = 1,
                 max_model_len: int | None = None, enable_chunked_prefill: bool = True,
                 max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None,
                 free_cache_engine: bool = False, **engine_kwargs):
        if not package_installed("sglang"):
            raise RolloutError("rollout.name=sglang needs SGLang; `pip install hybridflow[sglang]` or use rollout.name=native")
        import sglang

        model_path = model_path or getattr(model, "name_or_path", None)
        if not model_path:
            raise RolloutError("the sglang backend loads the model from disk; pass model_path= (a local folder or hub id)")
        chunked = (max_num_batched_tokens or -1) if enable_chunked_prefill else -1
        sizing = dict(dtype=dtype, mem_fraction_static=gpu_memory_utilization, tp_size=tensor_model_parallel_size,
                      context_length=max_model_len, chunked_prefill_size=chunked, max_running_requests=max_num_seqs,
                      enable_memory_saver=free_cache_engine)
        settings = {**sizing, **engine_kwargs}
        self.engine = sglang.Engine(model_path=model_path, **settings)
        self.max_model_len = max_model_len
        self.memory = ReleasedMemory(enabled=bool(settings["enable_memory_saver"]),
                                     release=lambda: self.engine.release_memory_occupation(tags=list(PARTS)),
                                     resume=lambda parts: self.engine.resume_memory_occupation(tags=parts))

    def release_kv_cache(self) -> bool:
        """Release the KV cache and the weights (``release_memory_occupation``); ``False`` (nothing freed) unless
        the engine was built with ``free_cache_engine`` (SGLang's ``enable_memory_saver``)."""
        return self.memory.release()

    def load_weights(self, named_tensors) -> None:
        self.memory.resume("weights")
        self.engine.update_weights_from_tensor(named_tensors=list(named_tensors), flush_cache=True)

    def reset_prefix_cache(self) -> None:
        """Empty SGLang's radix (prefix) cache: the next prompts prefill with the current weights (the released
        memory is taken back first: the flush resets the KV pool's allocator)."""
        self.memory.resume("weights", "kv_cache")
        self.engine.flush_cache()

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[Completion]:
        if self.max_model_len:
            validate_prompts(prompt_token_ids, max_model_len=self.max_model_len)
        self.memory.resume("weights", "kv_cache")
        sampling = {"n": 1, "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
                    "min_p": params.min_p, "ignore_eos": params.ignore_eos,
                    "repetition_penalty": params.repetition_penalty,
                    "max_new_tokens": params.max_tokens, "stop_token_ids": list(params.stop_token_ids),
                    "stop": list(params.stop) or None, "skip_special_tokens": False}
        repeated = [list(prompt) for prompt in prompt_token_ids for _ in range(params.n)]
        outputs = self.engine.generate(input_ids=repeated, sampling_params=sampling, return_logprob=params.logprobs)
        return [_completion(index // params.n, out, params) for index, out in enumerate(outputs)]


def _completion(prompt_index: int, out: dict, params: SamplingParams) -> Completion:
    meta = out.get("meta_info", {})
    token_ids = list(out["output_ids"])
    logprobs = None
    if params.logprobs and meta.get("output_token_logprobs") is not None:
        logprobs = [float(entry[0]) for entry in meta["output_token_logprobs"]]
    reason = (meta.get("finish_reason") or {}).get("type")
    return Completion(token_ids, logprobs, "stop" if reason == "stop" else "length", prompt_index)
