"""Chat messages: validation and rendering through the tokenizer's chat template.

A prompt is rendered to text with ``apply_chat_template(tokenize=False)`` and then
tokenised with ``add_special_tokens=False``: the template already writes every special
token, and tokenising the text (rather than letting the template tokenise) is what
verl does, so the ids match what a verl-trained model saw.
"""

from __future__ import annotations

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
    if not value or not any(isinstance(m["content"], str) and m["content"].strip() for m in value):
        raise DataError(
            f"row {row_index}: empty prompt in {config_key} (no message has text); remove the row or fill it in"
        )
    return list(value)


def render(
    tokenizer, messages: list[dict[str, Any]], *, add_generation_prompt: bool, template_kwargs: dict | None = None
) -> str:
    """The chat template's text for ``messages`` (``template_kwargs`` passed through)."""
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **(template_kwargs or {})
    )


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of already-templated text (no extra BOS/EOS: the template wrote them)."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _preview(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
