"""Growing a conversation token by token with the chat template.

The context of a multi-turn rollout is ``prompt ids ++ generated ids ++ observation ids ++
generated ids ...``: what the model generated is kept as generated (never re-tokenised),
and each observation (tool results, a simulated user's reply) is the text the chat template
writes for it *after an assistant turn*, up to and including the next assistant header.
That text is found by rendering a fixed two-message conversation with and without the new
messages: it works for any template (ChatML, Qwen, Llama 3, ...) and drops the default
system prompt some templates insert. The tokenisation sanity check compares the decoded
context with the template's rendering of the whole conversation.
"""

from __future__ import annotations

from hybridflow.data.chat import encode, render, with_tools

SENTINEL_USER = "<hybridflow sentinel question>"
SENTINEL_ASSISTANT = "<hybridflow sentinel answer>"
SANITY_MODES = ("strict", "ignore_strippable", "disable")


def render_conversation(tokenizer, messages: list[dict], *, tool_schemas: list[dict], template_kwargs: dict,
                        add_generation_prompt: bool) -> str:
    """The template's text for ``messages`` with the tools described (``hybridflow.data.chat.with_tools``:
    the template's ``tools`` argument, or a Hermes-style system message for a template that ignores it)."""
    messages, template_kwargs = with_tools(tokenizer, messages, tool_schemas, template_kwargs=template_kwargs)
    return render(tokenizer, messages, add_generation_prompt=add_generation_prompt, template_kwargs=template_kwargs)


def render_prompt(tokenizer, messages: list[dict], *, tool_schemas: list[dict], template_kwargs: dict) -> list[int]:
    """Prompt ids of ``messages`` (with the tools described) ready for the first assistant turn."""
    return encode(tokenizer, render_conversation(tokenizer, messages, tool_schemas=tool_schemas,
                                                 template_kwargs=template_kwargs, add_generation_prompt=True))


def observation_ids(tokenizer, messages: list[dict], *, turn_end: str, template_kwargs: dict) -> list[int]:
    """Ids the template writes for ``messages`` after an assistant turn, through the next assistant
    header. ``turn_end`` is the text the assistant turn ended with (its stop token, '' if it was cut
    off): the template's own copy of it is already in the context, so it is dropped here."""
    base = [{"role": "user", "content": SENTINEL_USER}, {"role": "assistant", "content": SENTINEL_ASSISTANT}]
    full = render(tokenizer, base + messages, add_generation_prompt=True, template_kwargs=template_kwargs)
    after = full[full.index(SENTINEL_ASSISTANT) + len(SENTINEL_ASSISTANT):]
    if turn_end and after.startswith(turn_end):
        after = after[len(turn_end):]
    return encode(tokenizer, after)


def tokenization_matches(tokenizer, *, context_ids: list[int], messages: list[dict], tool_schemas: list[dict],
                         template_kwargs: dict, mode: str) -> bool:
    """Whether the decoded context equals the template's rendering of the whole conversation
    (``strict``), or equals it up to whitespace (``ignore_strippable``); ``disable`` skips the check.
    The template may close the last assistant turn with text the model never generated (a newline
    after the end-of-turn token): only such whitespace may follow."""
    if mode == "disable":
        return True
    actual = tokenizer.decode(context_ids, skip_special_tokens=False)
    expected = render_conversation(tokenizer, messages, tool_schemas=tool_schemas, template_kwargs=template_kwargs,
                                   add_generation_prompt=messages[-1]["role"] != "assistant")
    if mode == "ignore_strippable":
        actual, expected = "".join(actual.split()), "".join(expected.split())
    rest = expected[len(actual):].strip() if expected.startswith(actual) else None
    return rest in ("", (tokenizer.eos_token or "").strip())  # a cut-off last turn has no end-of-turn token
