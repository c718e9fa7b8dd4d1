"""Which tokens of a templated conversation the assistant wrote (SFT's loss mask).

Only some chat templates mark assistant text with ``{% generation %}`` (SmolLM2's,
Llama 3's and most others do not), so the spans are found from the template itself:
render the conversation up to each assistant turn (with the generation prompt) and up
to its end, tokenise both, and the turn's tokens are the difference,

    span(turn k) = [ len(ids(render(m[:k], add_generation_prompt=True))),
                     len(ids(render(m[:k+1]))) ),

cut after the turn's end-of-sequence token (ChatML's ``<|im_end|>`` is generated; the
``\\n`` after it is template glue). This is only valid when every rendered prefix is a
prefix of the full rendering, text and tokens both; templates that rewrite earlier
turns (e.g. strip past reasoning) break it, and that is an error rather than a wrong
mask.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from hybridflow.data.chat import encode, render
from hybridflow.errors import DataError


def tokenize_with_assistant_mask(
    tokenizer, messages: list[dict[str, Any]], *, row_index: int, template_kwargs: dict | None = None
) -> tuple[list[int], list[int]]:
    """``(input_ids, assistant_mask)`` of the whole conversation; mask is 1 on assistant tokens."""
    full_text = render(tokenizer, messages, add_generation_prompt=False, template_kwargs=template_kwargs)
    input_ids = encode(tokenizer, full_text)
    mask = [0] * len(input_ids)
    checked_length = partial(
        _prefix_length,
        tokenizer,
        full_text=full_text,
        full_ids=input_ids,
        row_index=row_index,
        template_kwargs=template_kwargs,
    )
    for turn, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = checked_length(messages[:turn], add_generation_prompt=True)
        end = checked_length(messages[: turn + 1], add_generation_prompt=False)
        end = _end_after_eos(input_ids, start=start, end=end, eos_token_id=tokenizer.eos_token_id)
        mask[start:end] = [1] * (end - start)
    return input_ids, mask


def _prefix_length(
    tokenizer,
    prefix,
    *,
    add_generation_prompt: bool,
    full_text: str,
    full_ids: list[int],
    row_index: int,
    template_kwargs,
) -> int:
    """Token count of the rendered ``prefix``, after checking it is a prefix of the full rendering."""
    text = render(tokenizer, prefix, add_generation_prompt=add_generation_prompt, template_kwargs=template_kwargs)
    ids = encode(tokenizer, text)
    if not full_text.startswith(text) or full_ids[: len(ids)] != ids:
        raise DataError(
            f"row {row_index}: the chat template is not prefix-stable (rendering the first {len(prefix)} "
            "messages is not a prefix of rendering the conversation, so assistant tokens cannot be located); "
            "use a chat template that renders earlier turns unchanged"
        )
    return len(ids)


def _end_after_eos(ids: list[int], *, start: int, end: int, eos_token_id: int | None) -> int:
    """Shrink ``end`` to just past the last EOS in ``ids[start:end]`` (unchanged if none)."""
    for position in range(end - 1, start - 1, -1):
        if ids[position] == eos_token_id:
            return position + 1
    return end
