"""The reference backend: HF ``model.generate`` with left padding.

Simple and slow on purpose: it is what the native engine is checked against. Each
prompt is repeated ``n`` times (``num_return_sequences``) and the batch runs until its
longest member stops. Log-probs come from ``output_scores`` (the processed scores
after temperature / top-k / top-p, as the native engine reports them; raw scores under
greedy decoding).

A vision-language model gets each prompt's images (``multi_modal_inputs``: ``pixel_values`` and
``image_grid_thw`` per prompt): the vision tower encodes them in the prefill, the language model decodes,
and HF places the 3-D positions (its ``get_rope_index``) and repeats the images for ``n`` samples. A VLM
never samples its vision tokens (``<|image_pad|>``, ...): a response holding one would be an image
without pixels in the training forward, so they are suppressed (their probability goes to the rest).
"""

from __future__ import annotations

import torch

from hybridflow.models.vision import vision_forward_inputs, vision_token_ids
from hybridflow.rollout.stopping import StopChecker
from hybridflow.rollout.types import Completion, SamplingParams, validate_prompts
from hybridflow.rollout.weights import copy_named_tensors


class HFEngine:
    """``generate`` through ``transformers``' ``model.generate``."""

    def __init__(self, model, tokenizer=None, *, max_model_len: int | None = None, pad_token_id: int | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len or model.config.get_text_config().max_position_embeddings
        self.pad_token_id = _first_defined(pad_token_id, getattr(tokenizer, "pad_token_id", None),
                                           model.config.get_text_config().pad_token_id, 0)
        self.suppressed = vision_token_ids(model.config)

    def load_weights(self, named_tensors) -> None:
        copy_named_tensors(self.model, named_tensors)

    @torch.no_grad()
    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams, *,
                 multi_modal_inputs: list[dict | None] | None = None) -> list[Completion]:
        """``params.n`` completions per prompt; ``multi_modal_inputs``: a VLM's images, one dict (or None) per
        prompt."""
        validate_prompts(prompt_token_ids, max_model_len=self.max_model_len)
        input_ids, attention_mask = self._left_pad(prompt_token_ids)
        longest = input_ids.shape[1]
        vision = vision_forward_inputs(self.model, multi_modal_inputs, input_ids)
        with torch.random.fork_rng(devices=[input_ids.device] if input_ids.is_cuda else []):
            if params.seed is not None:
                torch.manual_seed(params.seed)
            config = self._config(params, longest)
            stops = {"tokenizer": self.tokenizer} if config.stop_strings else {}  # HF matches stop strings with it
            out = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config,
                                      **vision, **stops)
        new_tokens = out.sequences[:, longest:]
        # Step by step: stacking the [rows, V] scores of every step would copy them all at once.
        logprobs = torch.stack([torch.log_softmax(step.float(), dim=-1).gather(-1, new_tokens[:, i, None]).squeeze(-1)
                                for i, step in enumerate(out.scores)], dim=1)
        if params.greedy:  # HF refuses n > 1 without sampling; the n greedy answers are identical
            new_tokens, logprobs = new_tokens.repeat_interleave(params.n, 0), logprobs.repeat_interleave(params.n, 0)
        stop = StopChecker(params=params, tokenizer=self.tokenizer)
        return [self._completion(row // params.n, tokens, lps, stop, params)
                for row, (tokens, lps) in enumerate(zip(new_tokens.tolist(), logprobs.tolist()))]

    def _left_pad(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        longest = max(map(len, prompts))
        device = next(self.model.parameters()).device
        input_ids = torch.full((len(prompts), longest), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), longest), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, longest - len(prompt) :] = torch.tensor(prompt)
            attention_mask[row, longest - len(prompt) :] = 1
        return input_ids.to(device), attention_mask.to(device)

    def _config(self, params: SamplingParams, prompt_length: int):
        from transformers import GenerationConfig

        sampling = dict(temperature=params.temperature, top_p=params.top_p, min_p=params.min_p or None,
                        top_k=max(params.top_k, 0))  # HF: 0 = off (its default is 50)
        return GenerationConfig(
            max_new_tokens=min(params.max_tokens, self.max_model_len - prompt_length),
            num_return_sequences=1 if params.greedy else params.n,
            do_sample=not params.greedy,
            **({} if params.greedy else sampling),
            # [] rather than None: HF fills a None from model.generation_config, whose EOS would then stop it
            eos_token_id=[] if params.ignore_eos else (list(params.stop_token_ids) or None),
            pad_token_id=self.pad_token_id,
            stop_strings=None if params.ignore_eos else (list(params.stop) or None),
            return_dict_in_generate=True,
            output_scores=True,
            suppress_tokens=self.suppressed or None,
            repetition_penalty=params.repetition_penalty,  # greedy rows too, as the native engine
        )

    def _completion(self, prompt_index, tokens, logprobs, stop: StopChecker, params) -> Completion:
        """Cut the padded row after its first stop; 'length' when it never stopped."""
        for end in range(1, len(tokens) + 1):
            if stop.is_stop(tokens[:end]):
                return Completion(tokens[:end], logprobs[:end] if params.logprobs else None, "stop", prompt_index)
        return Completion(tokens, logprobs if params.logprobs else None, "length", prompt_index)


def _first_defined(*values):
    return next(v for v in values if v is not None)
