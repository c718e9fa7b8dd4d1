"""A forward pass for Llama-family decoders that reads an HF model's own weights.

The native engine runs this instead of the HF module because it needs two things HF's
forward does not give cheaply: decode steps over a paged cache where every sequence has
its own length and blocks (one batched matmul per projection, attention masked per row), and no
per-step Python object churn (cache classes, masks built from scratch, output dicts).

The math is the HF Llama / Qwen2 decoder layer, op for op (Touvron et al. 2023, "LLaMA";
RMSNorm in fp32, rotary embeddings from the model's own ``rotary_emb`` so every RoPE
scaling variant is honoured, SwiGLU MLP, grouped-query attention), so greedy outputs
equal HF ``generate``. Projections that read the same input are fused (q|k|v and
gate|up) into one matmul each, and on CPU every projection's weight is packed once for
oneDNN (:mod:`hybridflow.rollout.packed_linear`); :meth:`LlamaFamilyDecoder.refresh`
rebuilds these copies after the HF weights change.

Memory: the fused / packed copies are the only weights decoding reads. An engine that owns its
HF module (the trainer's rollout copy) drops the module's projection weights after packing
(:meth:`LlamaFamilyDecoder.release_module_projections`, ~0.42 GB on SmolLM2-135M in fp32), and
new weights then go straight from the trainer's tensors into the packed copies
(:meth:`LlamaFamilyDecoder.load_weights`).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hybridflow.errors import RolloutError
from hybridflow.rollout.architectures import ARCHITECTURES, unsupported_reason
from hybridflow.models.segment_attention import kv_heads
from hybridflow.rollout.kv_cache import PagedKVCache
from hybridflow.rollout.optional import package_installed
from hybridflow.rollout.packed_linear import PackedLinear, same_layout
from hybridflow.rollout.weights import copy_named_tensors

logger = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = frozenset(ARCHITECTURES)
"""HF ``model_type`` values this decoder runs (:data:`hybridflow.rollout.architectures.ARCHITECTURES`)."""


def supports(model, *, max_model_len: int | None = None) -> bool:
    """Whether :class:`LlamaFamilyDecoder` reproduces this HF model exactly (for contexts of ``max_model_len``)."""
    return unsupported_reason(model.config, max_model_len=max_model_len) is None


@dataclass
class LayerWeights:
    """One decoder layer's norms and projections; ``qkv`` maps ``hidden -> (H + 2 KV) * D``."""

    input_norm: torch.Tensor
    qkv: PackedLinear
    o_proj: PackedLinear
    post_norm: torch.Tensor
    gate_up: PackedLinear
    down: PackedLinear
    qk_norm: torch.Tensor | None = None
    """Qwen3: ``[H + KV, D]`` RMSNorm weights of each query head (``q_norm``) then each key head (``k_norm``)."""


def _cat_or_none(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
    return None if any(t is None for t in tensors) else torch.cat(tensors)


class LlamaFamilyDecoder:
    """Prefill and batched decode for an HF ``LlamaForCausalLM`` / ``Qwen2ForCausalLM``."""

    def __init__(self, model):
        config = model.config
        self.model = model
        self.projections = ARCHITECTURES[config.model_type].projections
        self.num_heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.eps = config.rms_norm_eps
        self.intermediate = config.intermediate_size
        self.scale = self.head_dim**-0.5
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self.weights_epoch = 0
        """Bumped whenever a weight tensor the decode step reads is replaced rather than updated in place."""
        self.triton_kernels = triton_kernels_available(model, self.head_dim)
        """Whether the graph-safe decode step runs as Triton kernels (CUDA) rather than torch ops and SDPA."""
        weight = next(model.parameters())
        self.varlen_prefill = weight.device.type == "cuda" and weight.dtype in (torch.float16, torch.bfloat16)
        """Whether prefill attention is one varlen FlashAttention call a layer (CUDA, half precision)."""
        self.varlen_prefill_checked = False
        self.released = False  # whether the module's projection weights were dropped (release_module_projections)
        self.refresh()

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def vocab_size(self) -> int:
        return self.embed.shape[0]

    def refresh(self, incoming: dict[str, torch.Tensor] | None = None) -> None:
        """(Re)build the fused weight copies: from ``incoming`` (HF name -> new weight) where given,
        else from the HF module's current parameters (which must still be held)."""
        incoming = incoming or {}
        inner = self.model.model
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
        return self.model.lm_head.weight is self.model.model.embed_tokens.weight

    def _projection_weight(self, name: str, module, incoming: dict) -> torch.Tensor | None:
        if name in incoming:
            return incoming[name]
        return None if self.released else module.weight

    def _fused(self, index: int, layer, part: str, incoming: dict) -> torch.Tensor | None:
        """One fused projection's weight for layer ``index``, or ``None`` to keep the current copy."""
        names = [f"model.layers.{index}.{path}.weight" for path in self.projections[part]]
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

    def _layer_weights(self, index: int, layer, incoming: dict, current: LayerWeights | None) -> LayerWeights:
        linears = {}
        for part, paths in self.projections.items():
            weight = self._fused(index, layer, part, incoming)  # None: the current copy is kept
            bias = _cat_or_none([layer.get_submodule(path).bias for path in paths])
            linears[part] = self._linear(getattr(current, part, None), weight, None if bias is None else bias.detach())
        return LayerWeights(input_norm=layer.input_layernorm.weight, post_norm=layer.post_attention_layernorm.weight,
                            qk_norm=self._qk_norm(layer.self_attn, None if current is None else current.qk_norm),
                            **linears)

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
            stacked = torch.cat([attn.q_norm.weight.expand(self.num_heads, -1),
                                 attn.k_norm.weight.expand(self.kv_heads, -1)])
            if current is not None and same_layout(stacked, current):
                return current.copy_(stacked)
        self.weights_epoch += 1
        return stacked

    def projection_names(self) -> set[str]:
        """The HF names whose weights live only in the fused copies once released."""
        names = {f"model.layers.{i}.{path}.weight" for i in range(self.num_layers)
                 for paths in self.projections.values() for path in paths}
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

    def rope_table(self, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos, sin`` ``[max_len, head_dim]`` from the model's rotary module (cached)."""
        if self._rope is None or self._rope[0].shape[0] < max_len:
            positions = torch.arange(max_len, device=self.embed.device)[None]
            probe = torch.zeros(1, dtype=self.embed.dtype, device=self.embed.device)
            cos, sin = self.model.model.rotary_emb(probe, positions)
            self._rope = (cos[0], sin[0])
        return self._rope

    def _rms_norm(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        x = hidden.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * x.to(hidden.dtype)

    def _mlp(self, hidden: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
        gate, up = layer.gate_up(hidden).split(self.intermediate, dim=-1)
        return layer.down(F.silu(gate) * up)

    def _qkv(self, hidden: torch.Tensor, layer: LayerWeights, cos: torch.Tensor, sin: torch.Tensor):
        """``[N, hidden]`` -> rotated ``q [N, H, D]``, ``k [N, KV, D]`` and ``v [N, KV, D]``."""
        rotated_heads = self.num_heads + self.kv_heads
        qk, v = layer.qkv(hidden).split([rotated_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1)
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
    def prefill_many(self, prompts: list[torch.Tensor], computed: list[torch.Tensor | None] | None = None
                     ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Run several prompts ``[L_i]`` in one pass; per prompt, last-position logits ``[V]`` and KV.

        The prompts are packed end to end (``[sum L_i]`` rows), so every projection is one
        matmul over all of them; a few tens of rows cost a decode step's weight reads
        almost whatever their number, so packing P prompts saves ~P - 1 passes over the
        weights. Attention stays per prompt (causal within it, never across prompts).

        ``computed[i]``, when given, is the KV ``[layers, 2, KV, C_i, D]`` of ``C_i`` tokens that come
        before ``prompts[i]`` (a prefix-cache hit): only the new tokens are computed, at positions
        ``C_i ..``, and new row j attends to positions ``0 .. C_i + j``. The KV returned covers all
        ``C_i + L_i`` tokens.

        On CUDA in half precision with nothing computed, attention over all prompts is one varlen
        FlashAttention call a layer (:meth:`_prefill_varlen`) instead of one SDPA call per prompt.
        """
        computed = computed or [None] * len(prompts)
        if self.varlen_prefill and all(c is None for c in computed):
            try:
                packed = self._prefill_varlen(prompts)
            except (RuntimeError, NotImplementedError) as error:  # an older build without the varlen kernel
                logger.warning("varlen FlashAttention prefill failed (%s); prefilling one prompt at a time",
                               str(error).splitlines()[0])
                self.varlen_prefill = False
            else:
                if self.varlen_prefill_checked or self._varlen_prefill_agrees(prompts, packed):
                    return packed
        return self._prefill_per_prompt(prompts, computed)

    def _prefill_per_prompt(self, prompts: list[torch.Tensor], computed: list[torch.Tensor | None]
                            ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`prefill_many` with one SDPA call per prompt a layer (any device, dtype and prefix)."""
        lengths = [int(p.shape[0]) for p in prompts]
        offsets = [0 if c is None else int(c.shape[3]) for c in computed]
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        device = prompts[0].device
        positions = torch.cat([torch.arange(o, o + n, device=device) for o, n in zip(offsets, lengths)])
        cos_table, sin_table = self.rope_table(max(o + n for o, n in zip(offsets, lengths)))
        cos, sin = cos_table[positions][:, None], sin_table[positions][:, None]
        hidden = F.embedding(torch.cat(prompts), self.embed)
        prefixes = [torch.empty(self.num_layers, 2, self.kv_heads, o + n, self.head_dim, dtype=hidden.dtype,
                                device=device) for o, n in zip(offsets, lengths)]
        for prefix, done, offset in zip(prefixes, computed, offsets):
            if done is not None:
                prefix[:, :, :, :offset] = done
        masks = [None if o == 0 else torch.ones(n, o + n, dtype=torch.bool, device=device).tril(diagonal=o)
                 for o, n in zip(offsets, lengths)]
        for index, layer in enumerate(self.layers):
            q, k, v = self._qkv(self._rms_norm(hidden, layer.input_norm), layer, cos, sin)
            attn = []
            for prefix, start, length, offset, mask in zip(prefixes, starts, lengths, offsets, masks):
                rows = slice(start, start + length)
                prefix[index, 0, :, offset:] = k[rows].transpose(0, 1)
                prefix[index, 1, :, offset:] = v[rows].transpose(0, 1)
                query = q[rows].transpose(0, 1)[None]
                # On CUDA, SDPA runs grouped heads (enable_gqa) only in its math kernel: repeat them there.
                key, value, grouped = kv_heads(query, prefix[index, 0][None], prefix[index, 1][None],
                                               repeat=query.is_cuda)
                out = F.scaled_dot_product_attention(query, key, value, is_causal=mask is None, attn_mask=mask,
                                                     scale=self.scale, enable_gqa=grouped)
                attn.append(out[0].transpose(0, 1).reshape(length, -1))
            hidden = hidden + layer.o_proj(torch.cat(attn))
            hidden = hidden + self._mlp(self._rms_norm(hidden, layer.post_norm), layer)
        last_rows = torch.tensor([start + length - 1 for start, length in zip(starts, lengths)], device=device)
        logits = self.lm_head(self._rms_norm(hidden[last_rows], self.final_norm))
        return list(zip(logits.unbind(0), prefixes))

    def _varlen_prefill_agrees(self, prompts: list[torch.Tensor], packed) -> bool:
        """Once per decoder: the varlen kernel is a private aten op, so its first result is checked against
        the per-prompt path (last-position logits within bf16 rounding); a mismatch switches it off, saying so."""
        self.varlen_prefill_checked = True
        reference = self._prefill_per_prompt(prompts, [None] * len(prompts))
        agrees = all(torch.allclose(a.float(), b.float(), rtol=0.05, atol=0.05 * b.float().abs().max().item())
                     for (a, _), (b, _) in zip(packed, reference))
        if not agrees:
            logger.warning("varlen FlashAttention prefill disagreed with the per-prompt path on its first call; "
                           "prefilling one prompt at a time")
        self.varlen_prefill = agrees
        return agrees

    def _prefill_varlen(self, prompts: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """:meth:`prefill_many` with causal attention over the packed rows in one FlashAttention call a layer
        (``cu_seqlens`` keep prompts apart); the keys and values of a layer are written once, packed
        ``[layers, 2, sum L_i, KV, D]``, and each prompt's KV is returned as a ``[layers, 2, KV, L_i, D]`` view."""
        lengths = [int(p.shape[0]) for p in prompts]
        device = prompts[0].device
        bounds = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)
        positions = torch.cat([torch.arange(n, device=device) for n in lengths])
        cos_table, sin_table = self.rope_table(max(lengths))
        cos, sin = cos_table[positions][:, None], sin_table[positions][:, None]
        hidden = F.embedding(torch.cat(prompts), self.embed)
        total = hidden.shape[0]
        packed = torch.empty(self.num_layers, 2, total, self.kv_heads, self.head_dim, dtype=hidden.dtype, device=device)
        for index, layer in enumerate(self.layers):
            q, k, v = self._qkv(self._rms_norm(hidden, layer.input_norm), layer, cos, sin)
            packed[index, 0], packed[index, 1] = k, v
            attn = self._varlen_attention(q.contiguous(), packed[index, 0], packed[index, 1], bounds, max(lengths))
            hidden = hidden + layer.o_proj(attn.reshape(total, -1))
            hidden = hidden + self._mlp(self._rms_norm(hidden, layer.post_norm), layer)
        last_rows = bounds[1:].long() - 1
        logits = self.lm_head(self._rms_norm(hidden[last_rows], self.final_norm))
        kv = [packed[:, :, start : start + n].permute(0, 1, 3, 2, 4) for start, n in zip(bounds.tolist(), lengths)]
        return list(zip(logits.unbind(0), kv))

    def _varlen_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: torch.Tensor,
                          longest: int) -> torch.Tensor:
        """Causal attention within each segment ``bounds[i] .. bounds[i + 1]`` of packed ``q`` ``[T, H, D]``,
        ``k`` / ``v`` ``[T, KV, D]`` (FlashAttention's varlen kernel: GQA without copies); ``[T, H, D]``."""
        return torch.ops.aten._flash_attention_forward(q, k, v, bounds, bounds, longest, longest, 0.0, True, False,
                                                       scale=self.scale)[0]

    @torch.no_grad()
    def decode(self, *, token_ids: torch.Tensor, positions: torch.Tensor, cache: PagedKVCache,
               block_tables: torch.Tensor, context: int | None = None) -> torch.Tensor:
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

        Returns:
            ``[N, V]`` next-token logits.
        """
        if context is None and self.triton_kernels:
            return self._decode_fused(token_ids=token_ids, positions=positions, cache=cache, block_tables=block_tables)
        cos_table, sin_table = self.rope_table(cache.max_len if context is None else context)
        cos, sin = cos_table[positions][:, None], sin_table[positions][:, None]
        rows = cache.write_rows(positions, block_tables)
        if context is not None:  # only the blocks the longest row reaches
            block_tables = block_tables[:, : -(-context // cache.block_size)]
        attend = self._decode_attention(positions=positions, cache=cache, block_tables=block_tables)
        hidden = F.embedding(token_ids, self.embed)
        for index, layer in enumerate(self.layers):
            q, k, v = self._qkv(self._rms_norm(hidden, layer.input_norm), layer, cos, sin)
            cache.write(layer=index, rows=rows, keys=k, values=v)
            hidden = hidden + layer.o_proj(attend(q, index))
            hidden = hidden + self._mlp(self._rms_norm(hidden, layer.post_norm), layer)
        return self.lm_head(self._rms_norm(hidden, self.final_norm))

    def _decode_fused(self, *, token_ids: torch.Tensor, positions: torch.Tensor, cache: PagedKVCache,
                      block_tables: torch.Tensor) -> torch.Tensor:
        """:meth:`decode` in ten kernels a layer (:mod:`hybridflow.rollout.triton_fused`): the same math,
        with each residual add fused into the RMSNorm that follows it."""
        from hybridflow.rollout.triton_attention import paged_decode_attention
        from hybridflow.rollout.triton_fused import add_rms_norm, qkv_rope_write, silu_mul

        cos, sin = self.rope_table(cache.max_len)
        lengths = positions + 1
        count = token_ids.shape[0]
        normed, hidden = add_rms_norm(x=F.embedding(token_ids, self.embed), residual=None,
                                      weight=self.layers[0].input_norm, eps=self.eps)
        for index, layer in enumerate(self.layers):
            keys, values = cache.layer(index)
            q = qkv_rope_write(qkv=layer.qkv(normed), positions=positions, cos=cos, sin=sin, qk_norm=layer.qk_norm,
                               keys=keys, values=values, heads=self.num_heads, eps=self.eps,
                               block_tables=block_tables)
            attn = paged_decode_attention(q=q, keys=keys, values=values, lengths=lengths, scale=self.scale,
                                          block_tables=block_tables)
            normed, hidden = add_rms_norm(x=layer.o_proj(attn.view(count, -1)), residual=hidden,
                                          weight=layer.post_norm, eps=self.eps)
            following = self.layers[index + 1].input_norm if index + 1 < self.num_layers else self.final_norm
            normed, hidden = add_rms_norm(x=layer.down(silu_mul(layer.gate_up(normed))), residual=hidden,
                                          weight=following, eps=self.eps)
        return self.lm_head(normed)

    def _decode_attention(self, *, positions: torch.Tensor, cache: PagedKVCache, block_tables: torch.Tensor):
        """``attend(q [N, H, D], layer) -> [N, H * D]`` for this step: SDPA over the blocks of ``block_tables``
        ``[N, W]``, gathered (:meth:`PagedKVCache.span`), with a mask built on the device."""
        count = positions.shape[0]
        context = block_tables.shape[1] * cache.block_size
        # Row n sees its first positions[n] + 1 keys; later entries are stale or the null block's.
        hidden_positions = torch.arange(context, device=positions.device)[None] > positions[:, None]
        mask = torch.zeros(count, 1, 1, context, dtype=self.embed.dtype, device=positions.device)
        mask.masked_fill_(hidden_positions[:, None, None, :], float("-inf"))

        def sdpa(q, layer):
            keys, values = cache.span(layer, block_tables)
            # Grouped-query decode: the G = H / KV query heads of one KV head act as G queries.
            grouped_q = q.view(count, self.kv_heads, self.num_heads // self.kv_heads, self.head_dim)
            out = F.scaled_dot_product_attention(grouped_q, keys, values, attn_mask=mask, scale=self.scale)
            return out.reshape(count, -1)

        return sdpa


def triton_kernels_available(model, head_dim: int) -> bool:
    """Whether the Triton decode kernels run for this model: on CUDA, with Triton installed and a
    power-of-two head size."""
    device = next(model.parameters()).device
    if device.type != "cuda" or not package_installed("triton"):
        return False
    from hybridflow.rollout.triton_attention import supported

    return supported(head_dim=head_dim, device=device)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021, "RoFormer"), HF's rotate-half layout."""
    return x * cos + _rotate_half(x) * sin
