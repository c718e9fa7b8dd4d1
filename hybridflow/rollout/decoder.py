"""A forward pass for Llama-family decoders that reads an HF model's own weights.

The native engine runs this instead of the HF module because it needs two things HF's
forward does not give cheaply: decode steps over a paged cache where every sequence has
its own length and blocks (one batched matmul per projection, attention masked per row), and no
per-step Python object churn (cache classes, masks built from scratch, output dicts).

The math is the HF Llama / Qwen2 decoder layer, op for op (Touvron et al. 2023, "LLaMA";
RMSNorm in fp32, rotary embeddings from the model's own ``rotary_emb`` so every RoPE
scaling variant is honoured, SwiGLU MLP, grouped-query attention), so greedy outputs
equal HF ``generate``; with what the table (:mod:`hybridflow.rollout.architectures`) adds per
architecture: Gemma's ``1 + w`` norms, scaled embeddings, GeGLU, post-sub-block norms and soft-capping,
sliding windows per layer (:mod:`hybridflow.rollout.attention_variants`), routed experts
(:mod:`hybridflow.rollout.moe`), OLMo's post-norms and whole-projection q / k norms, and gpt-oss's attention
sinks. Expert weights are read from the HF module (packed per expert on CPU), never released with the
projections. Projections that read the same input are fused (q|k|v and gate|up) into one matmul each, and on
CPU every projection's weight is packed once for oneDNN (:mod:`hybridflow.rollout.packed_linear`): the fused /
packed copies are the only weights decoding reads, built and updated by :mod:`hybridflow.rollout.weight_packing`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hybridflow.rollout import cpu_attention
from hybridflow.rollout.architectures import ARCHITECTURES, hidden_activation, layer_windows, unsupported_reason
from hybridflow.rollout.attention_variants import attention, decode_mask
from hybridflow.models.vision import is_vision_language, vision_token_ids
from hybridflow.rollout.kv_cache import CachedPrefix, PagedKVCache
from hybridflow.rollout.grouped_moe import grouped_moe_mlp
from hybridflow.rollout.moe import moe_mlp
from hybridflow.rollout.optional import package_installed
from hybridflow.rollout.packed_prefill import prefill_per_prompt, prefill_varlen, varlen_attention
from hybridflow.rollout.rotary import RotaryTables
from hybridflow.rollout.vision_prefill import PrefillImages
from hybridflow.rollout.weight_packing import LayerWeights, WeightPacker

logger = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = frozenset(ARCHITECTURES)
"""HF ``model_type`` values this decoder runs (:data:`hybridflow.rollout.architectures.ARCHITECTURES`)."""


def supports(model, *, max_model_len: int | None = None) -> bool:
    """Whether :class:`LlamaFamilyDecoder` reproduces this HF model exactly (for contexts of ``max_model_len``)."""
    return unsupported_reason(model.config, max_model_len=max_model_len) is None


class LlamaFamilyDecoder:
    """Prefill and batched decode for an HF causal LM of the architecture table (Llama, Qwen, Mistral, Phi-3,
    Gemma 2 / 3, Mixtral, Qwen3-MoE, OLMo 2 / 3, gpt-oss)."""

    kv_parts = 2
    """The paged cache holds keys and values (:class:`~hybridflow.rollout.kv_cache.PagedKVCache`'s parts)."""

    def __init__(self, model):
        config = model.config.get_text_config()  # a vision-language model's language model
        self.model = model
        self.text_model, self.layer_prefix = language_model(model)
        self.architecture = ARCHITECTURES[model.config.model_type]
        self.num_heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.eps = config.rms_norm_eps
        self.intermediate = config.intermediate_size
        self.scale = getattr(self.text_model.layers[0].self_attn, "scaling", self.head_dim**-0.5)  # Gemma's differs
        self.activation = F.silu if hidden_activation(config) == "silu" else _gelu_tanh
        self.windows = layer_windows(config)
        self.attn_softcap = getattr(config, "attn_logit_softcapping", None)
        self.final_softcap = getattr(config, "final_logit_softcapping", None)
        self.rope_kinds = list(config.layer_types) if self.architecture.rope_per_layer_type else [None] * len(
            self.windows)
        """The key of each layer's rotary table (Gemma 3: its layer type; else one table for all)."""
        self.rotary = RotaryTables(self.text_model.rotary_emb, self.rope_kinds, like=lambda: self.embed,
                                   half_tables=self.architecture.half_rope_tables)
        scale = getattr(self.text_model.embed_tokens, "embed_scale", None)
        self.embed_scale = None if scale is None else scale.to(self.text_model.embed_tokens.weight.dtype)
        """Gemma: the embeddings' ``sqrt(hidden)`` scale in their dtype; a constant, built once (CUDA graphs read it)."""
        self.rotary_dim = rotary_dim(self.text_model.rotary_emb, self.head_dim, self.architecture.partial_rotary)
        """The dimensions of a head the rotary embedding turns (GLM-4.5: a part; the rest pass as they are)."""
        self.sinks = self.architecture.attention_sinks
        """gpt-oss: attention sinks (the C and Triton decode kernels add them; prefill: the eager form)."""
        self.triton_kernels = triton_kernels_available(model, self.head_dim)
        """Whether the graph-safe decode step runs as Triton kernels (CUDA; :meth:`_decode_fused`) rather than
        torch ops and SDPA."""
        weight = next(model.parameters())
        self.varlen_prefill = (weight.device.type == "cuda" and weight.dtype in (torch.float16, torch.bfloat16)
                               and self.plain_attention())
        """Whether prefill attention is one varlen FlashAttention call a layer (CUDA, half precision)."""
        self.varlen_prefill_checked = False
        self.paged_cpu_attention = weight.device.type == "cpu" and cpu_attention.supports(
            dtype=weight.dtype, heads=self.num_heads, kv_heads=self.kv_heads, head_dim=self.head_dim)
        """Whether a CPU decode step's attention reads the pool through the block tables (:mod:`~.cpu_attention`)."""
        self.fused_cpu_decode = self.paged_cpu_attention
        """Whether a CPU decode step runs fused (:meth:`_decode_fused`, :mod:`hybridflow.rollout.cpu_fused`'s C kernels;
        GLM-4.5's partial rotary in them too) wherever :attr:`paged_cpu_attention` does."""
        self.vision_language = is_vision_language(model.config)
        """Prompts may carry images (:mod:`hybridflow.rollout.vision_prefill`); its rows rotate at their own positions."""
        suppressed = vision_token_ids(model.config)
        self.suppressed = torch.tensor(suppressed, device=weight.device) if suppressed else None
        """A vision-language model's vision tokens (``<|image_pad|>``, ...): never sampled (a response holding one
        would be an image without pixels in the training forward), as the HF engine's ``suppress_tokens``."""
        self.packer = WeightPacker(model, text_model=self.text_model, layer_prefix=self.layer_prefix,
                                   architecture=self.architecture, num_heads=self.num_heads, kv_heads=self.kv_heads,
                                   windows=self.windows)
        self.refresh()

    def plain_attention(self) -> bool:
        """Causal attention over every earlier key, uncapped (what the varlen and Triton kernels compute)."""
        return self.attn_softcap is None and not self.sinks and all(window is None for window in self.windows)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def vocab_size(self) -> int:
        return self.embed.shape[0]

    def refresh(self, incoming: dict[str, torch.Tensor] | None = None) -> None:
        """(Re)build the fused weight copies (:meth:`WeightPacker.refresh`) and take them."""
        self.packer.refresh(incoming)
        self._take_packed()

    def _take_packed(self) -> None:
        packer = self.packer
        self.embed, self.final_norm, self.lm_head, self.layers = (packer.embed, packer.final_norm, packer.lm_head,
                                                                  packer.layers)

    @property
    def weights_epoch(self) -> int:
        """Bumped whenever a weight tensor the decode step reads is replaced rather than updated in place."""
        return self.packer.weights_epoch

    def release_module_projections(self) -> None:
        """Drop the HF module's projection weights (:meth:`WeightPacker.release_module_projections`)."""
        self.packer.release_module_projections()

    def load_weights(self, named_tensors) -> None:
        """New trainer weights (HF names) into the module or the fused copies (:meth:`WeightPacker.load_weights`)."""
        self.packer.load_weights(named_tensors)
        self._take_packed()

    def rope_table(self, max_len: int, kind: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin`` ``[max_len, head_dim]`` of layer type ``kind`` (:meth:`RotaryTables.table`)."""
        return self.rotary.table(max_len, kind)

    @property
    def _rope(self) -> dict[str | None, tuple[torch.Tensor, torch.Tensor]]:
        """The rotary tables now (CUDA graphs hold this dict and see a new one as stale)."""
        return self.rotary.tables

    def _rms_norm(self, hidden: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        return rms_norm(hidden, weight, eps=self.eps, architecture=self.architecture)

    def _embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        hidden = F.embedding(token_ids, self.embed)
        return hidden if self.embed_scale is None else hidden * self.embed_scale

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head over the final norm (:meth:`_head`)."""
        return self._head(self._rms_norm(hidden, self.final_norm))

    def _head(self, normed: torch.Tensor) -> torch.Tensor:
        """``[N, V]`` logits of the final norm's output ``normed`` ``[N, hidden]``; Gemma 2 soft-caps them:
        ``c * tanh(z / c)``."""
        logits = self.lm_head(normed)
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return self._suppress(logits)

    def _suppress(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits [N, V]`` with the vision tokens at ``-inf`` (in place; graph-safe: a fixed index)."""
        return logits if self.suppressed is None else logits.index_fill_(-1, self.suppressed, float("-inf"))

    def _residual(self, hidden: torch.Tensor, out: torch.Tensor, norm: torch.Tensor | None) -> torch.Tensor:
        """``hidden + out``, with Gemma's norm of the sub-block's output where the layer has one."""
        return hidden + (out if norm is None else self._rms_norm(out, norm))

    def _mlp_block(self, hidden: torch.Tensor, layer: LayerWeights, *, graph_safe: bool = False) -> torch.Tensor:
        """The residual stream after the layer's MLP (dense or routed experts)."""
        normed = self._rms_norm(hidden, layer.post_norm)
        if layer.experts is not None or layer.grouped_moe is not None:
            out = self._routed_mlp(normed, layer, graph_safe=graph_safe)
        else:
            gate, up = layer.gate_up(normed).split(self.intermediate, dim=-1)
            out = layer.down(self.activation(gate) * up)
        return self._residual(hidden, out, layer.mlp_out_norm)

    def _routed_mlp(self, normed: torch.Tensor, layer: LayerWeights, *, graph_safe: bool) -> torch.Tensor:
        """A sparse layer's MLP: DeepSeek-style group-limited routing with shared experts (GLM-4.5), else softmax
        top-k (:func:`moe_mlp`)."""
        if layer.grouped_moe is not None:
            return grouped_moe_mlp(normed, layer.grouped_moe, self.activation, graph_safe=graph_safe)
        return moe_mlp(normed, layer.experts, self.activation, graph_safe=graph_safe)

    def _qkv(self, hidden: torch.Tensor, layer: LayerWeights, cos: torch.Tensor, sin: torch.Tensor):
        """``[N, hidden]`` -> rotated ``q [N, H, D]``, ``k [N, KV, D]`` and ``v [N, KV, D]``."""
        rotated_heads = self.num_heads + self.kv_heads
        qkv = qk_projection_norm(self, layer.qkv(hidden), layer)
        qk, v = qkv.split([rotated_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1)
        qk = qk.view(-1, rotated_heads, self.head_dim)
        if layer.qk_norm is not None:  # Qwen3: RMSNorm over each head before the rotation
            qk = self._rms_norm(qk, layer.qk_norm)
        # q and k share the rotation: one pass over [N, H + KV, D] rather than two.
        q, k = _apply_rope(qk, cos, sin).split(
            [self.num_heads, self.kv_heads], dim=1
        )
        return q, k, v.view(-1, self.kv_heads, self.head_dim)

    @torch.no_grad()
    def prefill(self, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Run one prompt ``[L]``; return last-position logits ``[V]`` and its KV ``[layers, 2, KV, L, D]``."""
        return self.prefill_many([token_ids])[0]

    @torch.no_grad()
    def prefill_many(self, prompts: list[torch.Tensor], computed: list[torch.Tensor | CachedPrefix | None] | None = None,
                     images: list[PrefillImages | None] | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Run several prompts ``[L_i]`` in one packed pass (:mod:`hybridflow.rollout.packed_prefill`); per prompt,
        last-position logits ``[V]`` and KV.

        ``computed[i]``, when given, is the KV ``[layers, 2, KV, C_i, D]`` of ``C_i`` tokens that come
        before ``prompts[i]`` (a prefix-cache hit or earlier chunks of a chunked prefill; a tensor, or a
        :class:`~hybridflow.rollout.kv_cache.CachedPrefix` read from the paged cache): only the new tokens are
        computed, at positions ``C_i ..``, and new row j attends to positions ``0 .. C_i + j``. The KV returned
        covers all ``C_i + L_i`` tokens.

        ``images[i]``, when given, carries a vision-language prompt's images for these tokens
        (:class:`~hybridflow.rollout.vision_prefill.PrefillImages`): the vision tower's output replaces the image
        tokens' embeddings, the tokens rotate at their 3-D M-RoPE positions, and Qwen3-VL's deepstack features join
        the residual stream after the first layers.

        On CUDA in half precision with nothing computed, attention over all prompts is one varlen
        FlashAttention call a layer (:func:`~hybridflow.rollout.packed_prefill.prefill_varlen`) instead of one SDPA call per prompt.
        """
        computed = computed or [None] * len(prompts)
        images = images or [None] * len(prompts)
        if self.varlen_prefill and all(c is None for c in computed):
            try:
                packed = prefill_varlen(self, prompts, images)
            except (RuntimeError, NotImplementedError) as error:  # an older build without the varlen kernel
                logger.warning("varlen FlashAttention prefill failed (%s); prefilling one prompt at a time",
                               str(error).splitlines()[0])
                self.varlen_prefill = False
            else:
                if self.varlen_prefill_checked or varlen_prefill_agrees(self, prompts, packed, images):
                    return packed
        return prefill_per_prompt(self, prompts, computed, images)

    def _varlen_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: torch.Tensor,
                          longest: int) -> torch.Tensor:
        """Causal attention within each packed segment (:func:`~hybridflow.rollout.packed_prefill.varlen_attention`)."""
        return varlen_attention(q, k, v, bounds, longest, scale=self.scale)

    @torch.no_grad()
    def decode(self, *, token_ids: torch.Tensor, positions: torch.Tensor, cache: PagedKVCache,
               block_tables: torch.Tensor, context: int | None = None,
               rope_positions: torch.Tensor | None = None) -> torch.Tensor:
        """One step for ``N`` sequences of the paged cache.

        Args:
            token_ids: ``[N]`` each sequence's latest token.
            positions: ``[N]`` where it goes (the sequence's current length).
            cache: keys/values of the earlier tokens; the new ones are written in place.
            block_tables: ``[N, W]`` int32, the blocks of each sequence (unused entries: the null block);
                every block a row writes into is its own (the engine copied shared ones first).
            context: ``max(positions) + 1``, the attention span of this step; ``None`` makes the
                step graph-safe (static shapes, no host values: CUDA graphs capture it, and
                ``torch.compile(fullgraph=True)`` traces it): on CUDA it then runs as Triton kernels
                (:meth:`_decode_fused`; attention reads each row's length and blocks on the device),
                elsewhere SDPA spans all ``W`` blocks with a device-built mask.
            rope_positions: ``[N]`` where each row's token rotates, when that is not ``positions`` (a
                vision-language sequence: ``position + delta``, :mod:`hybridflow.rollout.vision_prefill`;
                never past ``positions``).

        Returns:
            ``[N, V]`` next-token logits.
        """
        if context is None and self.triton_kernels:
            return self._decode_fused(token_ids=token_ids, positions=positions, cache=cache, block_tables=block_tables,
                                      ops=fused_decode_ops("cuda"), rope_positions=rope_positions)
        reads_pool_on_cpu = context is not None and self.paged_cpu_attention and isinstance(cache, PagedKVCache)
        if reads_pool_on_cpu and self.fused_cpu_decode:
            return self._decode_fused(token_ids=token_ids, positions=positions, cache=cache,
                                      block_tables=block_tables[:, : -(-context // cache.block_size)],
                                      ops=fused_decode_ops("cpu"), rope_positions=rope_positions)
        rope = self.rotary.rows(positions if rope_positions is None else rope_positions,
                               cache.max_len if context is None else context)
        rows = cache.write_rows(positions, block_tables)
        if context is not None:  # only the blocks the longest row reaches
            block_tables = block_tables[:, : -(-context // cache.block_size)]
        if reads_pool_on_cpu:
            attend = paged_cpu_attend(self, positions=positions, cache=cache, block_tables=block_tables)
        else:
            attend = gathered_attend(self, positions=positions, cache=cache, block_tables=block_tables)
        hidden = self._embed(token_ids)
        for index, layer in enumerate(self.layers):
            q, k, v = self._qkv(self._rms_norm(hidden, layer.input_norm), layer, *rope[self.rope_kinds[index]])
            cache.write(layer=index, rows=rows, keys=k, values=v)
            hidden = self._residual(hidden, layer.o_proj(attend(q, index, layer.window)), layer.attn_out_norm)
            hidden = self._mlp_block(hidden, layer, graph_safe=context is None)
        return self._logits(hidden)

    def _decode_fused(self, *, token_ids: torch.Tensor, positions: torch.Tensor, cache: PagedKVCache,
                      block_tables: torch.Tensor, ops: FusedDecodeOps,
                      rope_positions: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`decode` in a few kernels a layer (:class:`FusedDecodeOps`: Triton on CUDA, ten a layer for
        Llama's; C on CPU): the same math, with each residual add fused into the RMSNorm that follows it.

        What the table adds runs here too: Gemma's ``1 + w`` norms (the kernels' ``unit_offset``) and the norm of
        each sub-block's output before its add (one more norm call without a residual), the scaled embedding,
        GeGLU, soft caps (attention: the kernels'; logits: :meth:`_head`), a rotary table per layer type
        (Gemma 3), and routed experts in place of the MLP (:func:`moe_mlp`, graph-safe under ``ops.graph_safe``:
        Triton's grouped experts on CUDA)."""
        gemma = self.architecture.gemma_norms
        norm = functools.partial(_add_norm, ops.add_rms_norm, eps=self.eps, unit_offset=gemma)
        gated = ops.gelu_tanh_mul if self.activation is _gelu_tanh else ops.silu_mul
        rope = {kind: self.rope_table(cache.max_len, kind) for kind in dict.fromkeys(self.rope_kinds)}
        lengths = positions + 1
        count = token_ids.shape[0]
        normed, hidden = norm(x=self._embed(token_ids), residual=None, weight=self.layers[0].input_norm)
        for index, layer in enumerate(self.layers):
            keys, values = cache.layer(index)
            cos, sin = rope[self.rope_kinds[index]]
            qkv = qk_projection_norm(self, layer.qkv(normed), layer)
            q = ops.qkv_rope_write(qkv=qkv, positions=positions, cos=cos, sin=sin,
                                   qk_norm=layer.qk_norm, keys=keys, values=values, heads=self.num_heads, eps=self.eps,
                                   block_tables=block_tables, rope_positions=rope_positions, unit_offset=gemma)
            sinks = {} if layer.sinks is None else {"sinks": layer.sinks}  # gpt-oss
            attn = ops.attention(q=q, keys=keys, values=values, lengths=lengths, scale=self.scale,
                                 block_tables=block_tables, window=layer.window, softcap=self.attn_softcap, **sinks)
            normed, hidden = norm(x=_sub_block_out(layer.o_proj(attn.view(count, -1)), layer.attn_out_norm, norm),
                                  residual=hidden, weight=layer.post_norm)
            if layer.experts is not None or layer.grouped_moe is not None:
                out = self._routed_mlp(normed, layer, graph_safe=ops.graph_safe)
            else:
                out = layer.down(gated(layer.gate_up(normed)))
            following = self.layers[index + 1].input_norm if index + 1 < self.num_layers else self.final_norm
            normed, hidden = norm(x=_sub_block_out(out, layer.mlp_out_norm, norm), residual=hidden,
                                  weight=following)
        return self._head(normed)


def varlen_prefill_agrees(decoder: LlamaFamilyDecoder, prompts: list[torch.Tensor], packed, images) -> bool:
    """Once per decoder: the varlen kernel is a private aten op, so its first result is checked against the
    per-prompt path (last-position logits within bf16 rounding); a mismatch switches it off, saying so."""
    decoder.varlen_prefill_checked = True
    reference = prefill_per_prompt(decoder, prompts, [None] * len(prompts), images)
    agrees = all(torch.allclose(a.float(), b.float(), rtol=0.05, atol=0.05 * b.float().abs().max().item())
                 for (a, _), (b, _) in zip(packed, reference))
    if not agrees:
        logger.warning("varlen FlashAttention prefill disagreed with the per-prompt path on its first call; "
                       "prefilling one prompt at a time")
    decoder.varlen_prefill = agrees
    return agrees


def _sub_block_out(out: torch.Tensor, weight: torch.Tensor | None, norm: Callable) -> torch.Tensor:
    """A sub-block's output ``[N, hidden]`` as it joins the residual stream: Gemma normalises it first."""
    return out if weight is None else norm(x=out, residual=None, weight=weight)[0]


def paged_cpu_attend(decoder: LlamaFamilyDecoder, *, positions: torch.Tensor, cache: PagedKVCache,
                     block_tables: torch.Tensor):
    """``attend(q [N, H, D], layer, window) -> [N, H * D]``: each row over its own ``positions[n] + 1`` keys,
    read through ``block_tables`` from the pool (:func:`cpu_attention.paged_decode_attention`)."""
    lengths = positions + 1

    def attend(q, layer, window):
        keys, values = cache.layer(layer)
        out = cpu_attention.paged_decode_attention(q=q, keys=keys, values=values, block_tables=block_tables,
                                                   lengths=lengths, scale=decoder.scale, window=window,
                                                   softcap=decoder.attn_softcap, sinks=decoder.layers[layer].sinks)
        return out.reshape(q.shape[0], -1)

    return attend

def gathered_attend(decoder: LlamaFamilyDecoder, *, positions: torch.Tensor, cache: PagedKVCache,
                    block_tables: torch.Tensor):
    """``attend(q [N, H, D], layer, window) -> [N, H * D]`` for this step: attention over the blocks of
    ``block_tables`` ``[N, W]``, gathered (:meth:`PagedKVCache.span`), with a mask built on the device, one
    per window."""
    count = positions.shape[0]
    context = block_tables.shape[1] * cache.block_size
    masks = {window: decode_mask(positions, context, window, decoder.embed.dtype) for window in set(decoder.windows)}

    def attend(q, layer, window):
        keys, values = cache.span(layer, block_tables)
        # Grouped-query decode: the G = H / KV query heads of one KV head act as G queries.
        sinks = decoder.layers[layer].sinks
        if sinks is not None:  # gpt-oss: one query per head, over its KV head's keys (one sink logit a head)
            out = attention(q[:, :, None], keys, values, mask=masks[window], scale=decoder.scale,
                            softcap=decoder.attn_softcap, sinks=sinks, grouped=True)
            return out.reshape(count, -1)
        grouped_q = q.view(count, decoder.kv_heads, decoder.num_heads // decoder.kv_heads, decoder.head_dim)
        out = attention(grouped_q, keys, values, mask=masks[window], scale=decoder.scale, softcap=decoder.attn_softcap)
        return out.reshape(count, -1)

    return attend


@dataclass(frozen=True)
class FusedDecodeOps:
    """The kernels a fused decode step calls, one set per device with the same signatures: Triton on CUDA
    (:mod:`hybridflow.rollout.triton_fused`, :mod:`hybridflow.rollout.triton_attention`), C on CPU
    (:mod:`hybridflow.rollout.cpu_fused`, :mod:`hybridflow.rollout.cpu_attention`)."""

    add_rms_norm: Callable
    qkv_rope_write: Callable
    silu_mul: Callable
    gelu_tanh_mul: Callable
    attention: Callable
    graph_safe: bool
    """Whether the step must stay graph-safe (CUDA graphs: static shapes, no host reads), so a mixture-of-experts
    MLP takes :func:`moe_mlp`'s graph-safe path (Triton's grouped experts on CUDA) rather than grouping rows by
    expert with a host read of the group sizes (:mod:`hybridflow.rollout.moe`)."""


@functools.cache
def fused_decode_ops(device_type: str) -> FusedDecodeOps:
    """The fused decode kernels for ``"cuda"`` or ``"cpu"`` (imported on first use: Triton only where it runs)."""
    if device_type == "cuda":
        from hybridflow.rollout import triton_fused as fused
        from hybridflow.rollout.triton_attention import paged_decode_attention
    else:
        from hybridflow.rollout import cpu_fused as fused
        from hybridflow.rollout.cpu_attention import paged_decode_attention
    return FusedDecodeOps(add_rms_norm=fused.add_rms_norm, qkv_rope_write=fused.qkv_rope_write,
                          silu_mul=fused.silu_mul, gelu_tanh_mul=fused.gelu_tanh_mul,
                          attention=paged_decode_attention, graph_safe=device_type == "cuda")


def rms_norm(hidden: torch.Tensor, weight: torch.Tensor | None, *, eps: float, architecture) -> torch.Tensor:
    """``w * x / sqrt(mean(x^2) + eps)`` in fp32 (Llama casts before the scaling; Gemma scales by ``1 + w``
    in fp32 and casts after; OLMo and gpt-oss scale by ``w`` in fp32 and cast after); no weight: OLMo's
    missing pre-norm, ``hidden`` as it is."""
    if weight is None:
        return hidden
    x = hidden.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    if architecture.gemma_norms:
        return (x * (1.0 + weight.float())).to(hidden.dtype)
    if architecture.norm_scale_fp32:
        return (weight * x).to(hidden.dtype)
    return weight * x.to(hidden.dtype)


def qk_projection_norm(decoder: LlamaFamilyDecoder, qkv: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
    """OLMo 2 / 3: ``q|k|v`` ``[N, (H + 2 KV) D]`` with q and k each RMS-normalised over its whole projection
    (before the split into heads); other architectures' ``qkv`` as it is."""
    if layer.qk_proj_norm is None:
        return qkv
    q_size, k_size = decoder.num_heads * decoder.head_dim, decoder.kv_heads * decoder.head_dim
    q, k, v = qkv.split([q_size, k_size, k_size], dim=-1)
    q_weight, k_weight = layer.qk_proj_norm.split([q_size, k_size])
    return torch.cat([decoder._rms_norm(q, q_weight), decoder._rms_norm(k, k_weight), v], dim=-1)


def _add_norm(add_rms_norm: Callable, *, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None,
              eps: float, unit_offset: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused kernel's ``(normed, x + residual)``; without a weight (OLMo 2 / 3 have no norm before a sub-block)
    the sum alone, twice."""
    if weight is None:
        summed = x if residual is None else x + residual
        return summed, summed
    return add_rms_norm(x=x, residual=residual, weight=weight, eps=eps, unit_offset=unit_offset)


def language_model(model) -> tuple[torch.nn.Module, str]:
    """The module holding the decoder layers (``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``) and the HF name
    prefix of its layers: ``model.model`` / ``model.layers`` for a text model, ``model.model.language_model`` /
    ``model.language_model.layers`` for a vision-language one (Qwen2-VL, Qwen2.5-VL, Qwen3-VL)."""
    inner = getattr(model.model, "language_model", None)
    if inner is not None:
        return inner, "model.language_model.layers"
    return model.model, "model.layers"


def triton_kernels_available(model, head_dim: int) -> bool:
    """Whether the Triton decode kernels run for this model: on CUDA, with Triton installed and a
    power-of-two head size."""
    device = next(model.parameters()).device
    if device.type != "cuda" or not package_installed("triton"):
        return False
    from hybridflow.rollout.triton_attention import supported

    return supported(head_dim=head_dim, device=device)


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GeGLU's gate activation, HF's ``gelu_pytorch_tanh``."""
    return F.gelu(x, approximate="tanh")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021, "RoFormer"), HF's rotate-half layout, in ``x``'s dtype (OLMo 3's
    tables are fp32 whatever the model's dtype: rotated in fp32, then cast, as HF does); with tables narrower than
    the head (partial rotary, GLM-4.5) on its first dimensions only."""
    turned = cos.shape[-1]
    if turned < x.shape[-1]:
        return torch.cat([_apply_rope(x[..., :turned], cos, sin), x[..., turned:]], dim=-1)
    return (x * cos + _rotate_half(x) * sin).to(x.dtype)


def rotary_dim(rotary_emb, head_dim: int, partial: bool) -> int:
    """The dimensions of a head the rotary module turns: twice its frequencies where the architecture rotates a part
    (GLM-4.5's ``partial_rotary_factor``), else the whole head."""
    return 2 * rotary_emb.inv_freq.shape[-1] if partial else head_dim
