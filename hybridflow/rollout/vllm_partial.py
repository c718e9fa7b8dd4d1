"""verl's partial rollout on vLLM: a generation that a weight sync may interrupt between two engine steps.

The session steps vLLM's engine one step a call (``LLMEngine.add_request`` / ``step`` / ``abort_request`` in
:class:`~hybridflow.rollout.vllm_host.VLLMHost`), so the rollout worker can look for a waiting weight sync
between two steps, as it does with the native engine's :class:`~hybridflow.rollout.streaming.StreamingSession`
(the same calls: ``submit``, ``step``, ``pause``, ``weights_reloaded``, ``resume``, ``close``). ``pause`` aborts
every in-flight request and keeps what it sampled (tokens and their behaviour log-probs), which leaves vLLM with no
running request, so the sync's prefix-cache reset can act; ``resume`` resubmits each as its prompt plus its tokens
so far with the budget left, so vLLM prefills that prefix with the new weights and the continuation's tokens (and
log-probs) come from them: verl's abort-and-resubmit. Each sample of a prompt is its own ``n=1`` request seeded
as vLLM seeds its ``n`` children (``seed + j``), so a partial generate that no sync interrupted samples what
``generate`` does; a resubmitted request draws from a seed mixed with its prefix length, not its first draws again.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable
from dataclasses import dataclass, field

from hybridflow.errors import RolloutError
from hybridflow.rollout.streaming import StreamedCompletion
from hybridflow.rollout.types import SamplingParams, validate_prompts
from hybridflow.rollout.vllm import VLLMEngine, vllm_sampling_kwargs

_SESSIONS = itertools.count()
_GOLDEN = 0x9E3779B97F4A7C15  # spreads (seed, prefix length) over the seed space


@dataclass
class _Sample:
    """One sample: its prompt, what it sampled before the last resume (with each token's weight version), and the
    seed it started from; ``pause`` returns these."""

    request_id: Hashable
    output_index: int
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)
    seed: int | None = None


class VLLMPartialSession:
    """A stepped generation on a :class:`~hybridflow.rollout.vllm.VLLMEngine` that a weight sync may pause."""

    def __init__(self, engine: VLLMEngine, params: SamplingParams, *, weight_version: int = 0):
        if not params.logprobs:
            raise RolloutError("a partial rollout records behaviour log-probs; pass SamplingParams(logprobs=True)")
        self.call, self.params, self.weight_version = engine.call, params, weight_version
        self.max_model_len = engine.max_model_len
        self.live: dict[str, _Sample] = {}
        """vLLM request id -> the sample it serves."""
        self.prefix = f"hybridflow-partial-{next(_SESSIONS)}"
        self.submitted = 0
        self.ids = itertools.count()

    @property
    def idle(self) -> bool:
        return not self.live

    def submit(self, request_id: Hashable, prompt_ids: list[int]) -> None:
        """``params.n`` samples of one prompt; prompt ``i`` of the session seeds as ``generate``'s prompt ``i``."""
        validate_prompts([prompt_ids], max_model_len=self.max_model_len)
        n, seed = self.params.n, self.params.seed
        samples = [_Sample(request_id, j, list(prompt_ids),
                           seed=None if seed is None else (seed + self.submitted * n + j) % 2**63) for j in range(n)]
        self.submitted += 1
        self._send(samples)

    def step(self):
        """One vLLM step; the completions that ended in it (each token with the version that sampled it)."""
        ended = []
        for vllm_id, tokens, logprobs, finish in self.call("stream_step"):
            sample = self.live.pop(vllm_id)
            ended.append(StreamedCompletion(
                sample.request_id, sample.output_index, sample.prompt_ids, sample.token_ids + tokens,
                sample.logprobs + logprobs, self._versions(sample, len(tokens)),
                finish_reason="stop" if finish == "stop" else "length"))
        return ended

    def pause(self) -> list[_Sample]:
        """Abort every in-flight request; each comes back with what it sampled (for ``resume``)."""
        paused = []
        for vllm_id, tokens, logprobs in self.call("stream_abort"):
            sample = self.live.pop(vllm_id)
            paused.append(_Sample(sample.request_id, sample.output_index, sample.prompt_ids, sample.token_ids + tokens,
                                  sample.logprobs + logprobs, self._versions(sample, len(tokens)), sample.seed))
        return paused

    def weights_reloaded(self, *, version: int) -> None:
        """New weights are in vLLM (nothing runs while paused): tokens sampled from now on carry ``version``."""
        if self.live:
            raise RolloutError("the weights changed while vLLM requests were running; pause() the session first")
        self.weight_version = version

    def resume(self, paused: list[_Sample]) -> None:
        """Resubmit each paused sample as its prompt plus its tokens so far, with the budget it has left."""
        self._send(paused)

    def close(self) -> None:
        """Abort what still runs (a generate that failed midway)."""
        if self.live:
            self.call("stream_abort")
            self.live.clear()

    def _send(self, samples: list[_Sample]) -> None:
        requests = []
        for sample in samples:
            done = len(sample.token_ids)
            seed = sample.seed if sample.seed is None or not done else (sample.seed + done * _GOLDEN) % 2**63
            params = vllm_sampling_kwargs(self.params, n=1, seed=seed)
            params["max_tokens"] = self.params.max_tokens - done
            vllm_id = f"{self.prefix}-{next(self.ids)}"
            self.live[vllm_id] = sample
            requests.append((vllm_id, sample.prompt_ids + sample.token_ids, params))
        self.call("stream_add", requests)

    def _versions(self, sample: _Sample, new_tokens: int) -> list[int]:
        return sample.weight_versions + [self.weight_version] * new_tokens
