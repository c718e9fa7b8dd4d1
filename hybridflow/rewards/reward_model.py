"""Model-based rewards: a sequence-classification reward model scores prompt + response.

A reward model trained with its own chat template (Ouyang et al., 2022, "Training
language models to follow instructions with human feedback") must see the
conversation in *its* format, not the policy's: the prompt messages plus the
response as an assistant turn are re-rendered with the RM tokenizer's chat template,
tokenized, and the RM's scalar head is read at the last non-pad token of each row.
Rows are padded to the batch's longest; ``position_ids`` are computed from the
attention mask so that left and right padding give the same scores.
"""

from __future__ import annotations

import torch

from hybridflow.errors import ModelError


class RewardModelScorer:
    """One scalar per (prompt, response) from an ``AutoModelForSequenceClassification``.

    Args:
        model: a sequence-classification model with ``num_labels == 1``; its
            ``config.pad_token_id`` must be the tokenizer's pad id (the head pools at the
            rightmost non-pad token).
        tokenizer: the reward model's own tokenizer, with a chat template.
        max_length: truncate rendered conversations to this many tokens (from the left,
            keeping the response's end, where the score is read); None: no limit.
        micro_batch_size: rows per forward pass.
    """

    def __init__(self, *, model, tokenizer, max_length: int | None = None, micro_batch_size: int = 8):
        if getattr(model.config, "num_labels", 1) != 1:
            num_labels = model.config.num_labels
            raise ModelError(
                f"reward model must have num_labels=1 (one scalar), got {num_labels}; load it with num_labels=1"
            )
        if tokenizer.pad_token_id is None or model.config.pad_token_id != tokenizer.pad_token_id:
            raise ModelError(
                f"reward model config.pad_token_id={model.config.pad_token_id} differs from its tokenizer's pad id "
                f"{tokenizer.pad_token_id}; set model.config.pad_token_id = tokenizer.pad_token_id"
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.micro_batch_size = micro_batch_size

    def render(self, *, prompt, response: str) -> str:
        """The conversation in the RM's chat template; ``prompt`` is a message list or a user string."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        messages.append({"role": "assistant", "content": response})
        return self.tokenizer.apply_chat_template(messages, tokenize=False)

    def _encode(self, texts: list[str]) -> dict[str, torch.Tensor]:
        rows = [self.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
        if self.max_length is not None:
            rows = [row[-self.max_length :] for row in rows]
        encoded = self.tokenizer.pad({"input_ids": rows}, return_tensors="pt")
        attention_mask = encoded["attention_mask"]
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        return {"input_ids": encoded["input_ids"], "attention_mask": attention_mask, "position_ids": position_ids}

    @torch.no_grad()
    def score(self, *, prompts: list, responses: list[str]) -> torch.Tensor:
        """``[B]`` float32 reward-model scores, one per ``(prompts[b], responses[b])``."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        texts = [self.render(prompt=prompt, response=response) for prompt, response in zip(prompts, responses)]
        device = next(self.model.parameters()).device
        scores = []
        for start in range(0, len(texts), self.micro_batch_size):
            inputs = {k: v.to(device) for k, v in self._encode(texts[start : start + self.micro_batch_size]).items()}
            scores.append(self.model(**inputs).logits[:, 0].float().cpu())
        return torch.cat(scores) if scores else torch.zeros(0)
