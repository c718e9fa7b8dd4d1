"""A generative reward model (LLM-as-a-judge): a causal LM reads (question, reference, response) in a
prompt template, writes a verdict, and the score is parsed from it.

    judge prompt = template.format(prompt=<last user message>, response=<policy response>, ground_truth=<reference>)
    verdict      = engine.generate(chat_template(judge prompt))            # batched, greedy by default
    score        = clip(last match of score_pattern in verdict / score_scale, 0, 1)   # failure_score if none

The engine is any rollout engine (``generate(prompt_ids, params)``) around the judge model,
built by the trainer from ``reward_model.rollout.*``. ``timeout_s`` bounds how long a step waits
for the verdicts: past it every sample of the batch gets ``failure_score`` and the late call is
awaited before the next one (the engine is not re-entrant).
"""

from __future__ import annotations

import logging
import re
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import torch

logger = logging.getLogger(__name__)

DEFAULT_TEMPLATE = (
    "You are grading an answer.\nQuestion: {prompt}\nReference answer: {ground_truth}\nAnswer to grade: {response}\n"
    "Rate the answer from 0 to 10 (10 = correct and complete). End with the rating as 'Score: N'."
)
DEFAULT_PATTERN = r"Score:\s*(-?\d+(?:\.\d+)?)"


def parse_score(verdict: str, *, pattern: str, scale: float) -> float | None:
    """The last number ``pattern`` captures in ``verdict`` divided by ``scale``, clipped to [0, 1]; None if none."""
    matches = re.findall(pattern, verdict)
    if not matches:
        return None
    try:
        value = float(matches[-1] if isinstance(matches[-1], str) else matches[-1][0])
    except ValueError:
        return None
    return min(max(value / scale, 0.0), 1.0)


def question_of(prompt) -> str:
    """The last user message of a chat prompt (or the prompt itself when it is a string)."""
    if isinstance(prompt, str):
        return prompt
    users = [m["content"] for m in list(prompt) if m["role"] == "user"]
    return users[-1] if users else ""


class GenerativeJudge:
    """Scores responses by generating verdicts with ``engine`` (the judge model) and parsing them."""

    uses_ground_truth = True

    def __init__(self, *, engine, tokenizer, sampling_params, template: str = DEFAULT_TEMPLATE,
                 score_pattern: str = DEFAULT_PATTERN, score_scale: float = 10.0, failure_score: float = 0.0,
                 timeout_s: float | None = None, max_prompt_length: int | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.params = sampling_params
        self.template = template
        self.pattern = score_pattern
        self.scale = score_scale
        self.failure_score = failure_score
        self.timeout_s = timeout_s
        self.max_prompt_length = max_prompt_length
        self.executor = ThreadPoolExecutor(max_workers=1)
        self.late = None
        self.last_metrics: dict[str, float] = {}
        self.warned_partial = False
        """A call with some (not all) failures is said once; one where all fail, every time."""

    def judge_prompt_ids(self, *, prompt, response: str, ground_truth) -> list[int]:
        text = self.template.format(prompt=question_of(prompt), response=response, ground_truth=ground_truth)
        rendered = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                      add_generation_prompt=True)
        ids = self.tokenizer(rendered, add_special_tokens=False)["input_ids"]
        return ids[-self.max_prompt_length:] if self.max_prompt_length else ids  # keep the end: the rating request

    def verdicts(self, prompt_ids: list[list[int]]) -> list[str] | None:
        """Decoded verdicts, or None when they did not come within ``timeout_s``."""
        if self.late is not None:
            self.late.result()  # a timed-out call still holds the engine
            self.late = None
        future = self.executor.submit(self.engine.generate, prompt_ids, self.params)
        try:
            completions = future.result(timeout=self.timeout_s)
        except FutureTimeout:
            self.late = future
            return None
        return [self.tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]

    def score(self, *, prompts: list, responses: list[str], ground_truths: list | None = None) -> torch.Tensor:
        """``[B]`` float32 scores in [0, 1]; ``failure_score`` where no rating could be read."""
        ground_truths = ground_truths if ground_truths is not None else [""] * len(responses)
        ids = [self.judge_prompt_ids(prompt=p, response=r, ground_truth=g)
               for p, r, g in zip(prompts, responses, ground_truths)]
        verdicts = self.verdicts(ids)
        parsed = [None] * len(ids) if verdicts is None else [
            parse_score(v, pattern=self.pattern, scale=self.scale) for v in verdicts]
        scores = [self.failure_score if s is None else s for s in parsed]
        failed = sum(s is None for s in parsed)
        self.last_metrics = {"reward/judge_failed": float(failed), "reward/judge_timed_out": float(verdicts is None)}
        if failed:
            self.say_failures(failed=failed, total=len(parsed), verdicts=verdicts)
        return torch.tensor(scores, dtype=torch.float32)

    def say_failures(self, *, failed: int, total: int, verdicts: list[str] | None) -> None:
        """On the console (reward/judge_failed counts them): every call where no sample got a score, and the first
        call with some failures; each line says the likely fix."""
        if failed < total and self.warned_partial:
            return
        self.warned_partial = self.warned_partial or failed < total
        if verdicts is None:
            why = f"the judge did not answer within reward_model.judge.timeout_s={self.timeout_s:g}s: raise it"
        else:
            unreadable = next(v for v, ok in zip(verdicts, (parse_score(v, pattern=self.pattern, scale=self.scale)
                                                            for v in verdicts)) if ok is None)
            why = (f"no rating matched reward_model.judge.score_pattern {self.pattern!r} (e.g. {unreadable[:80]!r}): "
                   "fix the pattern or the judge's prompt_template")
        logger.warning("hybridflow: warning: the generative judge scored %d of %d samples as failures "
                       "(reward_model.failure_score=%g): %s", failed, total, self.failure_score, why)
