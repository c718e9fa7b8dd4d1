"""The native decoder's weights: the HF module's projections fused (q|k|v, gate|up) and, on CPU, packed once
for oneDNN (:mod:`hybridflow.rollout.packed_linear`), rebuilt or updated in place when the trainer's weights change.

An engine that owns its HF module drops the module's projection weights after packing
(:meth:`WeightPacker.release_module_projections`, ~0.42 GB on SmolLM2-135M in fp32); new weights then go straight
from the trainer's tensors into the packed copies (:meth:`WeightPacker.load_weights`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from hybridflow.errors import RolloutError
from hybridflow.rollout.grouped_moe import GroupedMoE, grouped_moe_weights, is_grouped_moe
from hybridflow.rollout.moe import ExpertWeights, expert_weights
from hybridflow.rollout.packed_linear import PackedLinear, same_layout
from hybridflow.rollout.weights import copy_named_tensors

logger = logging.getLogger(__name__)


@dataclass
class LayerWeights:
    """One decoder layer's norms and projections; ``qkv`` maps ``hidden -> (H + 2 KV) * D``."""

    input_norm: torch.Tensor | None
    """The norm before attention (None: OLMo 2 / 3 have none)."""
    qkv: PackedLinear
    o_proj: PackedLinear
    post_norm: torch.Tensor | None
    """The norm before the MLP (Llama's ``post_attention_layernorm``, Gemma's ``pre_feedforward_layernorm``; None:
    OLMo 2 / 3 have none)."""
    gate_up: PackedLinear | None = None
    down: PackedLinear | None = None
    qk_norm: torch.Tensor | None = None
    """Qwen3: ``[H + KV, D]`` RMSNorm weights of each query head (``q_norm``) then each key head (``k_norm``)."""
    attn_out_norm: torch.Tensor | None = None
    """Gemma: the norm of the attention output before the residual add (its ``post_attention_layernorm``)."""
    mlp_out_norm: torch.Tensor | None = None
    """Gemma: the norm of the MLP output before the residual add (``post_feedforward_layernorm``)."""
    experts: ExpertWeights | None = None
    """A mixture-of-experts layer's router and experts, in place of ``gate_up`` / ``down``."""
    window: int | None = None
    """This layer's sliding attention window (None: global attention)."""
    # Issue 58 (GLM-4.5):
    grouped_moe: GroupedMoE | None = None
    """A DeepSeek-style sparse layer (sigmoid group-limited routing, shared experts), in place of ``experts``."""
    # issue 58 (OLMo 2 / 3, gpt-oss):
    qk_proj_norm: torch.Tensor | None = None
    """OLMo 2 / 3: ``[H * D + KV * D]`` RMSNorm weights over the whole q projection then the whole k projection."""
    sinks: torch.Tensor | None = None
    """gpt-oss: ``[H]`` the attention sinks' logits (the module's own parameter)."""


def _cat_or_none(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
    return None if any(t is None for t in tensors) else torch.cat(tensors)


class WeightPacker:
    """The fused / packed copies of one HF model's decoder weights (what the decode step reads): ``embed``,
    ``final_norm``, ``lm_head`` and one :class:`LayerWeights` a layer."""

    def __init__(self, model, *, text_model, layer_prefix: str, architecture, num_heads: int, kv_heads: int,
                 windows: list[int | None]):
        self.model, self.text_model, self.layer_prefix = model, text_model, layer_prefix
        self.architecture = architecture
        self.projections = architecture.projections
        self.num_heads, self.kv_heads, self.windows = num_heads, kv_heads, windows
        self.weights_epoch = 0
        """Bumped whenever a weight tensor the decode step reads is replaced rather than updated in place."""
        self.released = False  # whether the module's projection weights were dropped (release_module_projections)

    def refresh(self, incoming: dict[str, torch.Tensor] | None = None) -> None:
        """(Re)build the fused weight copies: from ``incoming`` (HF name -> new weight) where given,
        else from the HF module's current parameters (which must still be held)."""
        incoming = incoming or {}
        inner = self.text_model
        self.embed = inner.embed_tokens.weight
        self.final_norm = inner.norm.weight
        if self._lm_head_tied():  # the head is the embedding, which the module keeps
            head = self.model.lm_head.weight
        else:
            head = incoming.get("lm_head.weight", None if self.released else self.model.lm_head.weight)
        if head is not None:
            self.lm_head = self._linear(getattr(self, "lm_head", None), head, None)
        old = getattr(self, "layers", [None] * len(inner.layers))
        self.layers = [self._layer_weights(i, layer, incoming, old[i]) for i, layer in enumerate(inner.layers)]
        logger.debug("native decoder projections: %s", self.lm_head.path)

    def _lm_head_tied(self) -> bool:
        return self.model.lm_head.weight is self.text_model.embed_tokens.weight

    def _projection_weight(self, name: str, module, incoming: dict) -> torch.Tensor | None:
        if name in incoming:
            return incoming[name]
        return None if self.released else module.weight

    def _fused(self, index: int, layer, part: str, incoming: dict) -> torch.Tensor | None:
        """One fused projection's weight for layer ``index``, or ``None`` to keep the current copy."""
        names = [f"{self.layer_prefix}.{index}.{path}.weight" for path in self.projections[part]]
        modules = [layer.get_submodule(path) for path in self.projections[part]]
        weights = [self._projection_weight(n, m, incoming) for n, m in zip(names, modules)]
        if all(w is None for w in weights):
            return None
        if any(w is None for w in weights):
            missing = [n for n, w in zip(names, weights) if w is None]
            raise RolloutError(f"load_weights got only part of a fused projection: send {missing} with the rest "
                               "(the engine keeps only the fused copy)")
        with torch.no_grad():
            return weights[0] if len(weights) == 1 else torch.cat(weights)

    def _parts(self, layer) -> dict[str, tuple[str, ...]]:
        """The fused projections of this layer: all of the table's, less the MLP's in a mixture-of-experts layer."""
        if not _is_moe(layer):
            return self.projections
        return {part: paths for part, paths in self.projections.items() if part not in ("gate_up", "down")}

    def _layer_weights(self, index: int, layer, incoming: dict, current: LayerWeights | None) -> LayerWeights:
        linears = {}
        for part, paths in self._parts(layer).items():
            weight = self._fused(index, layer, part, incoming)  # None: the current copy is kept
            bias = _cat_or_none([layer.get_submodule(path).bias for path in paths])
            linears[part] = self._linear(getattr(current, part, None), weight, None if bias is None else bias.detach())
        norms = self._norms(layer)
        grouped = grouped_moe_weights(layer.mlp) if is_grouped_moe(layer.mlp) else None
        routed = _is_moe(layer) and grouped is None
        experts = expert_weights(layer.mlp, self.architecture.moe_renormalize) if routed else None
        whole = self.architecture.qk_norm_whole  # issue 58: OLMo's norms span the projections, Qwen3's each head
        held = None if current is None else current.qk_proj_norm if whole else current.qk_norm
        qk_norm = self._qk_norm(layer.self_attn, held)
        sinks = layer.self_attn.sinks.detach() if self.architecture.attention_sinks else None
        return LayerWeights(qk_norm=None if whole else qk_norm, qk_proj_norm=qk_norm if whole else None, sinks=sinks,
                            experts=experts, grouped_moe=grouped, window=self.windows[index], **norms, **linears)

    def _norms(self, layer) -> dict[str, torch.Tensor]:
        """The layer's RMSNorm weights by :class:`LayerWeights` field (Gemma's four, Llama's two)."""
        if not self.architecture.pre_norms:  # OLMo 2 / 3: only the norms of the sub-blocks' outputs
            return dict(input_norm=None, attn_out_norm=layer.post_attention_layernorm.weight, post_norm=None,
                        mlp_out_norm=layer.post_feedforward_layernorm.weight)
        if self.architecture.gemma_norms:
            return dict(input_norm=layer.input_layernorm.weight, attn_out_norm=layer.post_attention_layernorm.weight,
                        post_norm=layer.pre_feedforward_layernorm.weight,
                        mlp_out_norm=layer.post_feedforward_layernorm.weight)
        return dict(input_norm=layer.input_layernorm.weight, post_norm=layer.post_attention_layernorm.weight)

    def _linear(self, current: PackedLinear | None, weight: torch.Tensor | None,
                bias: torch.Tensor | None) -> PackedLinear:
        """``current`` with the new weight / bias copied in place where it can take them, else a new layer
        (which bumps :attr:`weights_epoch`: CUDA graphs captured before read the old tensors)."""
        if current is not None and current.assign(weight, bias):
            return current
        if weight is None:  # keep the (packed) weight, take the bias as it is
            current.bias = bias
            self.weights_epoch += 1
            return current
        self.weights_epoch += 1
        return PackedLinear(weight, bias)

    def _qk_norm(self, attn, current: torch.Tensor | None) -> torch.Tensor | None:
        """Qwen3's per-head q / k RMSNorm weights stacked ``[H + KV, D]`` (one norm over both), or None;
        written into ``current`` in place when there is one."""
        if getattr(attn, "q_norm", None) is None:
            return None
        with torch.no_grad():
            if self.architecture.qk_norm_whole:  # OLMo 2 / 3: [H * D] and [KV * D], one after the other
                stacked = torch.cat([attn.q_norm.weight, attn.k_norm.weight])
            else:
                stacked = torch.cat([attn.q_norm.weight.expand(self.num_heads, -1),
                                     attn.k_norm.weight.expand(self.kv_heads, -1)])
            if current is not None and same_layout(stacked, current):
                return current.copy_(stacked)
        self.weights_epoch += 1
        return stacked

    def projection_names(self) -> set[str]:
        """The HF names whose weights live only in the fused copies once released."""
        names = {f"{self.layer_prefix}.{i}.{path}.weight" for i, layer in enumerate(self.text_model.layers)
                 for paths in self._parts(layer).values() for path in paths}
        return names if self._lm_head_tied() else names | {"lm_head.weight"}

    def release_module_projections(self) -> None:
        """Drop the HF module's projection weights (the fused copies hold them): the module's own forward
        no longer runs afterwards, and :meth:`load_weights` must send every projection it changes."""
        for name in self.projection_names():
            module = self.model.get_submodule(name.rsplit(".", 1)[0])
            module.weight = torch.nn.Parameter(torch.empty(0, dtype=module.weight.dtype, device=module.weight.device),
                                               requires_grad=False)
        self.released = True

    def load_weights(self, named_tensors) -> None:
        """New trainer weights (HF names): copied into the module, or, once released, the projections straight
        into new fused copies (the rest, norms, embeddings and biases, into the module)."""
        if not self.released:
            copy_named_tensors(self.model, named_tensors)
            self.refresh()
            return
        projections, rest = {}, []
        routed = self.projection_names()
        for name, tensor in named_tensors:
            if name in routed:
                projections[name] = tensor.to(device=self.embed.device, dtype=self.embed.dtype)
            else:
                rest.append((name, tensor))
        copy_named_tensors(self.model, rest)
        self.refresh(projections)


def _is_moe(layer) -> bool:
    """Whether an HF decoder layer's MLP is a routed mixture of experts (Mixtral, Qwen3-MoE's sparse layers; gpt-oss
    calls its router ``router``)."""
    return hasattr(layer.mlp, "experts") and (hasattr(layer.mlp, "gate") or hasattr(layer.mlp, "router"))
