"""Value model (critic): a causal LM backbone plus a scalar head, ``V(s_t)`` per token.

``values[b, t] = w^T h_L(x_{<=t}) + c`` where ``h_L`` is the backbone's last hidden
state (Ouyang et al. 2022, "Training language models to follow instructions with
human feedback", for the PPO critic on a language model). Built by composition: the
backbone is the HF ``AutoModel`` of the same checkpoint the actor uses, the head one
``nn.Linear(hidden, 1)``. Saved as an HF folder plus ``value_head.safetensors``.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from hybridflow.errors import ModelError
from hybridflow.models.loader import enable_gradient_checkpointing, load_checked_weights, load_config, resolve_dtype
from hybridflow.models.vision import is_vision_language

VALUE_HEAD_FILE = "value_head.safetensors"


class ValueModel(nn.Module):
    """``forward(input_ids [B, L], attention_mask [B, L], position_ids [B, L]) -> values [B, L]``."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone
        hidden = backbone.config.hidden_size
        self.value_head = nn.Linear(hidden, 1, dtype=next(backbone.parameters()).dtype)
        # Zero init: every state starts at value 0, so the first advantages are the returns.
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @property
    def config(self):
        return self.backbone.config

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs) -> torch.Tensor:
        # kwargs reach the attention layers (e.g. the segment layout of a packed row)
        kwargs["use_cache"] = False
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               **kwargs).last_hidden_state
        return self.value_head(hidden).squeeze(-1).float()

    def gradient_checkpointing_enable(self, **kwargs) -> None:
        self.backbone.gradient_checkpointing_enable(**kwargs)

    def save_pretrained(self, path: str) -> None:
        from safetensors.torch import save_file

        self.backbone.save_pretrained(path, safe_serialization=True)
        head = {name: t.detach().contiguous().cpu() for name, t in self.value_head.state_dict().items()}
        save_file(head, os.path.join(path, VALUE_HEAD_FILE))


def load_value_model(
    path: str,
    *,
    dtype: str | torch.dtype = "float32",
    attn_implementation: str | None = None,
    gradient_checkpointing: bool = False,
    trust_remote_code: bool = False,
    override_config: dict | None = None,
    config_path: str | None = None,
) -> ValueModel:
    """A ``ValueModel`` from a causal LM folder (fresh head) or a saved value model (its head); ``config_path``:
    the HF config's folder when not ``path`` (verl's ``critic.model.hf_config_path``)."""
    from safetensors.torch import load_file
    from transformers import AutoModel

    config = load_config(config_path or path, trust_remote_code=trust_remote_code, override_config=override_config)
    if is_vision_language(config):  # its values would be read from the image tokens without their pixels
        raise ModelError(f"{path} is a vision-language model ({', '.join(config.architectures or [])}): a value "
                         "model over images is not supported; use a critic-free estimator (algorithm.adv_estimator="
                         "grpo, rloo, reinforce_plus_plus, ...) or a text model as the critic")
    backbone = load_checked_weights(AutoModel, path, config=config, dtype=resolve_dtype(dtype),
                                    attn_implementation=attn_implementation, trust_remote_code=trust_remote_code)
    model = ValueModel(backbone)
    head_file = os.path.join(os.path.expanduser(str(path)), VALUE_HEAD_FILE)
    if os.path.exists(head_file):
        model.value_head.load_state_dict(load_file(head_file))
    if gradient_checkpointing:
        enable_gradient_checkpointing(backbone)
    return model


def export_value_model(hf_dir: str, target_dir: str, *, load_weights) -> str:
    """Write a checkpoint's value model as ``load_value_model`` reads it: the backbone as an HF
    folder (``AutoModel``) plus ``value_head.safetensors``, with the tokenizer files.

    ``hf_dir`` is the checkpoint's ``huggingface/`` folder (config, tokenizer); ``load_weights(model)``
    fills a freshly built ``ValueModel`` in place from the saved weights.
    """
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    model = ValueModel(AutoModel.from_config(AutoConfig.from_pretrained(hf_dir)))
    load_weights(model)
    os.makedirs(target_dir, exist_ok=True)
    model.save_pretrained(target_dir)
    if os.path.isfile(os.path.join(hf_dir, "tokenizer_config.json")):
        AutoTokenizer.from_pretrained(hf_dir).save_pretrained(target_dir)
    return target_dir
