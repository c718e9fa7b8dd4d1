"""verl's ``actor_rollout_ref.rollout.*`` keys mapped onto ``SamplingParams``.

Any object with verl's attribute names works (the config dataclass, an OmegaConf
node, a ``SimpleNamespace``):

| verl key | ``SamplingParams`` |
|---|---|
| ``n`` | ``n`` |
| ``temperature`` | ``temperature`` |
| ``top_p`` | ``top_p`` |
| ``top_k`` (``-1`` or ``0`` = off, as verl's vLLM / HF defaults) | ``top_k`` (``-1`` = off) |
| ``repetition_penalty`` (training and validation: verl's vLLM / SGLang servers apply it to every request) | ``repetition_penalty`` |
| ``response_length`` | ``max_tokens`` |
| ``ignore_eos`` | ``ignore_eos`` (generate to ``response_length``; benchmarks) |
| ``do_sample=False`` | ``temperature=0`` (greedy) |
| ``val_kwargs.{n,temperature,top_p,top_k,do_sample}`` | the same, when ``validate=True`` |

This is the only place the mapping is written: the PPO loop calls it for training, validation and
the ReMax baseline; ``config/rollout.py`` rejects ``top_k < -1`` before any model loads.
"""

from __future__ import annotations

from hybridflow.rollout.types import SamplingParams


def sampling_params_from_rollout_config(
    rollout_cfg, *, validate: bool = False, eos_token_id: int | list[int] | None, seed: int | None = None,
    logprobs: bool = False,
) -> SamplingParams:
    """Build the ``SamplingParams`` of a training (or, with ``validate``, a validation) rollout.

    ``logprobs=True`` asks the engine for the sampled tokens' log-probs (the trainer's rollout log-probs).
    """
    source = rollout_cfg.val_kwargs if validate else rollout_cfg
    do_sample = getattr(source, "do_sample", True)
    top_k = int(getattr(source, "top_k", -1))
    stop_token_ids = [] if eos_token_id is None else ([eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id))
    return SamplingParams(
        n=int(getattr(source, "n", 1)),
        temperature=float(source.temperature) if do_sample else 0.0,
        top_p=float(getattr(source, "top_p", 1.0)),
        top_k=-1 if top_k <= 0 else top_k,
        max_tokens=int(rollout_cfg.response_length),
        stop_token_ids=stop_token_ids,
        seed=seed,
        logprobs=logprobs,
        ignore_eos=bool(getattr(rollout_cfg, "ignore_eos", False)),
        repetition_penalty=float(getattr(rollout_cfg, "repetition_penalty", 1.0)),  # validation too, as verl's servers
    )


ENGINE_SIZING_KEYS: dict[str, tuple[str, ...]] = {
    "native": ("max_num_seqs", "max_model_len", "enforce_eager", "cudagraph_capture_sizes", "gpu_memory_utilization",
               "max_num_batched_tokens", "enable_chunked_prefill"),
    "hf": ("max_model_len",),
    "vllm": ("dtype", "gpu_memory_utilization", "tensor_model_parallel_size", "max_model_len",
             "enable_chunked_prefill", "max_num_batched_tokens", "max_num_seqs", "enforce_eager", "free_cache_engine"),
    "sglang": ("dtype", "gpu_memory_utilization", "tensor_model_parallel_size", "max_model_len",
               "enable_chunked_prefill", "max_num_batched_tokens", "max_num_seqs", "free_cache_engine"),
}
"""verl ``rollout.*`` sizing keys each backend takes (under these names; the backend maps them to its own)."""


def engine_kwargs_from_rollout_config(rollout_cfg) -> dict:
    """Keyword arguments of ``build_engine(rollout_cfg.name, ...)``: the backend's sizing keys from
    ``rollout.*`` (``max_model_len`` null = prompt_length + response_length, as in verl), then
    ``rollout.engine_kwargs.<name>``, which wins."""
    max_model_len = rollout_cfg.max_model_len
    if max_model_len is None:
        max_model_len = int(rollout_cfg.prompt_length) + int(rollout_cfg.response_length)
    sizing = {"dtype": rollout_cfg.dtype, "gpu_memory_utilization": rollout_cfg.gpu_memory_utilization,
              "tensor_model_parallel_size": rollout_cfg.tensor_model_parallel_size, "max_model_len": max_model_len,
              "enable_chunked_prefill": rollout_cfg.enable_chunked_prefill,
              "max_num_batched_tokens": rollout_cfg.max_num_batched_tokens, "max_num_seqs": rollout_cfg.max_num_seqs,
              "enforce_eager": rollout_cfg.enforce_eager,
              "free_cache_engine": getattr(rollout_cfg, "free_cache_engine", False),
              "cudagraph_capture_sizes": getattr(rollout_cfg, "cudagraph_capture_sizes", None)}
    kwargs = {key: sizing[key] for key in ENGINE_SIZING_KEYS.get(rollout_cfg.name, ())}
    kwargs.update(dict((rollout_cfg.engine_kwargs or {}).get(rollout_cfg.name) or {}))
    return kwargs
