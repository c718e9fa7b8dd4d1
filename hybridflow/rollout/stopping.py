"""When a completion ends: a stop token, or a stop string in its decoded text."""

from __future__ import annotations

from hybridflow.errors import RolloutError
from hybridflow.rollout.types import SamplingParams

# Decoding a few tokens more than the longest stop string covers tokens that decode to
# several characters or to none (partial UTF-8 bytes).
_STOP_STRING_TOKEN_SLACK = 8


class StopChecker:
    """Decides whether the tokens generated so far end the completion.

    A stop token is kept as the completion's last token. A stop string ends the
    completion at the token that completes it; that token is kept too (so the
    completion's log-probs stay aligned with its tokens).
    """

    def __init__(self, *, params: SamplingParams, tokenizer):
        # ignore_eos: generate to max_tokens whatever comes (verl's rollout.ignore_eos, for benchmarks)
        self.stop_token_ids = frozenset() if params.ignore_eos else frozenset(params.stop_token_ids)
        self.stop_strings = [] if params.ignore_eos else list(params.stop)
        if self.stop_strings and tokenizer is None:
            raise RolloutError("stop strings need a tokenizer; pass tokenizer= to build_engine or use stop_token_ids")
        self.tokenizer = tokenizer
        self.window = max((len(s) for s in self.stop_strings), default=0) + _STOP_STRING_TOKEN_SLACK

    def is_stop(self, token_ids: list[int]) -> bool:
        if token_ids[-1] in self.stop_token_ids:
            return True
        if not self.stop_strings:
            return False
        tail = self.tokenizer.decode(token_ids[-self.window :], skip_special_tokens=False)
        return any(s in tail for s in self.stop_strings)
