"""Chat messages: validation and rendering through the tokenizer's chat template.

A prompt is rendered to text with ``apply_chat_template(tokenize=False)`` and then
tokenised with ``add_special_tokens=False``: the template already writes every special
token, and tokenising the text (rather than letting the template tokenise) is what
verl does, so the ids match what a verl-trained model saw.
"""

from __future__ import annotations

import json
from typing import Any

from hybridflow.errors import DataError

MESSAGE_ROLES = ("system", "user", "assistant", "tool")


def as_messages(value: Any, *, role: str, row_index: int, config_key: str) -> list[dict[str, str]]:
    """A string becomes one ``{role, content}`` message; a message list is validated."""
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return validate_messages(value, row_index=row_index, config_key=config_key)


def validate_messages(value: Any, *, row_index: int, config_key: str) -> list[dict[str, str]]:
    """Check ``value`` is a non-empty list of ``{role, content}`` dicts with text content."""
    if hasattr(value, "tolist"):  # numpy arrays, when rows came through pandas
        value = value.tolist()
    if not isinstance(value, list) or not all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        raise DataError(
            f"row {row_index}: {config_key} must be a list of chat messages like "
            f"[{{'role': 'user', 'content': '...'}}], got {_preview(value)}; fix the row or point {config_key} "
            "at the messages column"
        )
    for position, message in enumerate(value):
        if message["role"] not in MESSAGE_ROLES:
            raise DataError(
                f"row {row_index}: message {position} of {config_key} has role {message['role']!r}; a role must be "
                f"one of {', '.join(MESSAGE_ROLES)}: rename it in the data (e.g. 'human' -> 'user', 'gpt' -> 'assistant')"
            )
        if message["content"] is None and not message.get("tool_calls"):
            raise DataError(
                f"row {row_index}: message {position} of {config_key} ({message['role']}) has content None; give it "
                "text ('' for an empty turn) or remove the message"
            )
    for position, message in enumerate(value):
        content = message["content"]
        if isinstance(content, (bytes, bytearray, memoryview)):
            raise DataError(
                f"row {row_index}: message {position} of {config_key} has binary content ({bytes(content)[:20]!r}...), "
                "not text; decode it to a str (e.g. .decode('utf-8')) when writing the data"
            )
    if not value or not any(isinstance(m["content"], str) and m["content"].strip() for m in value):
        raise DataError(
            f"row {row_index}: empty prompt in {config_key} (no message has text); remove the row or fill it in"
        )
    return list(value)


def render(
    tokenizer, messages: list[dict[str, Any]], *, add_generation_prompt: bool, template_kwargs: dict | None = None
) -> str:
    """The chat template's text for ``messages`` (``template_kwargs`` passed through)."""
    if getattr(tokenizer, "chat_template", None) is None and "chat_template" not in (template_kwargs or {}):
        raise DataError(
            f"the tokenizer of {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; use an instruct/chat "
            "model's tokenizer, add a chat_template to its tokenizer_config.json, or pass one with "
            "data.apply_chat_template_kwargs.chat_template"
        )
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **(template_kwargs or {})
    )


def with_tools(tokenizer, messages: list[dict[str, Any]], tool_schemas: list[dict] | None, *,
               template_kwargs: dict | None = None) -> tuple[list[dict[str, Any]], dict]:
    """``(messages, template_kwargs)`` that describe ``tool_schemas`` to the model: through the
    template's ``tools`` argument, or, for a template that ignores it (SmolLM2's), in a Hermes-style
    system message. The multi-turn rollout and SFT on tool traces both render through this, so a
    model is trained on exactly the prompt it is later rolled out on."""
    template_kwargs = dict(template_kwargs or {})
    if not tool_schemas:
        return messages, template_kwargs
    if template_renders_tools(tokenizer, template_kwargs):
        return messages, {**template_kwargs, "tools": list(tool_schemas)}
    return with_tools_system_message(messages, tool_schemas), template_kwargs


def template_renders_tools(tokenizer, template_kwargs: dict) -> bool:
    """Whether the chat template writes the schemas passed as ``tools`` (a probe rendering)."""
    probe = [{"role": "user", "content": "<hybridflow probe question>"}]
    schema = [{"type": "function", "function": {"name": "hybridflow_probe", "parameters": {"type": "object"}}}]
    kwargs = {**template_kwargs, "tools": schema}
    return "hybridflow_probe" in render(tokenizer, probe, add_generation_prompt=True, template_kwargs=kwargs)


def with_tools_system_message(messages: list[dict[str, Any]], tool_schemas: list[dict]) -> list[dict[str, Any]]:
    """``messages`` with the tool list and the Hermes call format in the system message."""
    listing = "\n".join(json.dumps(schema) for schema in tool_schemas)
    text = ("You may call one or more functions to assist with the user query. The functions are:\n<tools>\n"
            f"{listing}\n</tools>\nFor each function call, write a JSON object with the function name and arguments "
            'within <tool_call></tool_call> tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
            "\n</tool_call>")
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of already-templated text (no extra BOS/EOS: the template wrote them)."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _preview(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
