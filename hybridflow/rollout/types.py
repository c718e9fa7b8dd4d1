"""Typed records between the trainer and a generation engine.

``SamplingParams`` says how to sample; a ``Completion`` is one sampled response. An
engine returns ``n`` completions per prompt, grouped by prompt in input order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hybridflow.errors import RolloutError

FinishReason = Literal["stop", "length"]


@dataclass
class SamplingParams:
    """How to sample responses (vLLM's names and meanings).

    ``temperature == 0`` means greedy decoding (top-k / top-p are then ignored).
    ``top_k == -1`` and ``top_p == 1`` switch those filters off. ``logprobs=True`` asks
    for the log-probability of each sampled token under the *sampling* distribution,
    i.e. after the repetition penalty, temperature, top-k and top-p (vLLM's ``processed_logprobs``);
    under greedy decoding it is the log-probability under the unscaled (but penalised) model distribution.
    """

    n: int = 1
    """Completions per prompt."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability is >= top_p."""
    top_k: int = -1
    """Keep the k most likely tokens; -1 keeps all."""
    min_p: float = 0.0
    """Drop tokens less likely than ``min_p`` times the most likely one; 0 keeps all."""
    repetition_penalty: float = 1.0
    """Penalise every token already in the prompt or the response (vLLM's and HF's rule, Keskar et al. 2019,
    "CTRL"): its logit ``z`` becomes ``z / r`` where positive, ``z * r`` where not, before temperature and the
    filters; greedy rows too. 1 switches it off; > 1 discourages repeats."""
    max_tokens: int = 16
    """Most new tokens per completion (finish reason 'length' when reached)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Token ids that end a completion (kept as its last token); usually the EOS id."""
    ignore_eos: bool = False
    """Generate exactly ``max_tokens`` tokens, ignoring ``stop_token_ids`` and ``stop`` (benchmarks)."""
    stop: list[str] = field(default_factory=list)
    """Strings that end a completion once its decoded text contains one."""
    seed: int | None = None
    """Seed of the sampling generator; the same seed and inputs give the same outputs (with one
    ``SamplingParams`` per prompt, the first seed given seeds the whole call; in a request queue with keyed
    draws, as the agent loops' turns use, each request's seed keys its own draws)."""
    logprobs: bool = True
    """Return per-token log-probabilities."""

    def __post_init__(self):
        if self.n < 1:
            raise RolloutError(f"n must be >= 1 (got {self.n}); set rollout.n to the samples wanted per prompt")
        if self.max_tokens < 1:
            raise RolloutError(f"max_tokens must be >= 1 (got {self.max_tokens}); set rollout.response_length >= 1")
        if not 0.0 < self.top_p <= 1.0:
            raise RolloutError(f"top_p must be in (0, 1] (got {self.top_p}); use 1.0 to switch it off")
        if self.temperature < 0:
            raise RolloutError(f"temperature must be >= 0 (got {self.temperature}); use 0 for greedy decoding")
        if not 0.0 <= self.min_p <= 1.0:
            raise RolloutError(f"min_p must be in [0, 1] (got {self.min_p}); use 0.0 to switch it off")
        if not self.repetition_penalty > 0:
            raise RolloutError(f"repetition_penalty must be > 0 (got {self.repetition_penalty}); use 1.0 to switch "
                               "it off")
        if self.top_k == 0 or self.top_k < -1:
            raise RolloutError(f"top_k must be -1 (off) or >= 1 (got {self.top_k})")
        if isinstance(self.stop, str):
            self.stop = [self.stop]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Completion:
    """One generated response.

    ``token_ids`` ends with the stop token when ``finish_reason == 'stop'``;
    ``logprobs[i]`` is the log-probability of ``token_ids[i]`` (see ``SamplingParams``).
    """

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: FinishReason
    prompt_index: int


def validate_prompts(prompt_token_ids: list[list[int]], *, max_model_len: int) -> None:
    """Reject empty batches, empty prompts and prompts that leave no room to generate.

    A prompt with room left is accepted even when ``max_tokens`` does not fit: its
    completion is cut at the context with finish reason 'length'.
    """
    if len(prompt_token_ids) == 0:
        raise RolloutError("generate() got an empty list of prompts; pass at least one tokenized prompt")
    for index, prompt in enumerate(prompt_token_ids):
        if len(prompt) == 0:
            raise RolloutError(f"prompt {index} is empty; every prompt needs at least one token")
        if len(prompt) >= max_model_len:
            raise RolloutError(
                f"prompt {index} has {len(prompt)} tokens but the model context is {max_model_len}; "
                f"lower data.max_prompt_length or filter long prompts (data.filter_overlong_prompts=True)"
            )
