"""A scripted engine for agent-loop tests: replies chosen from the conversation so far.

The agent loop's logic (turns, masks, limits, errors) is tested against replies we choose;
the real engine runs the same loop in ``test_tool_agent.py::test_native_engine_runs_the_tool_agent``.
"""

from __future__ import annotations

from hybridflow.rollout import Completion


class ScriptedEngine:
    """``reply(context_text) -> str``; the reply is encoded and closed with the stop token, unless
    it would exceed max_tokens (then cut, finish reason 'length')."""

    def __init__(self, tokenizer, reply):
        self.tokenizer = tokenizer
        self.reply = reply
        self.batch_sizes: list[int] = []
        self.images: list[list[dict | None] | None] = []
        """The ``multi_modal_inputs`` of each call (None: the call passed none)."""

    def generate(self, prompt_token_ids, params, *, multi_modal_inputs=None):
        self.batch_sizes.append(len(prompt_token_ids))
        self.images.append(multi_modal_inputs)
        out = []
        for index, ids in enumerate(prompt_token_ids):
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            tokens = self.tokenizer(self.reply(text), add_special_tokens=False)["input_ids"]
            tokens = tokens + [self.tokenizer.eos_token_id]
            finish = "stop"
            if len(tokens) > params.max_tokens:
                tokens, finish = tokens[: params.max_tokens], "length"
            out.append(Completion(token_ids=tokens, logprobs=[-0.5] * len(tokens), finish_reason=finish,
                                  prompt_index=index))
        return out

    def load_weights(self, named_tensors):
        pass
