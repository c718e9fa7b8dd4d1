"""Multi-head latent attention (MLA) for the native engine: DeepSeek-V3 (and Kimi-K2, DeepSeek-R1, which share its
``model_type``), with the paged cache holding each token's compressed latent only.

MLA (DeepSeek-AI 2024, "DeepSeek-V2", sec. 2.1) projects a token to a latent ``c = norm(x W_DKV)`` of
``kv_lora_rank`` values and one rotated key ``k_pe`` of ``qk_rope_head_dim`` shared by every head; each head's key
is ``[c W_UK_h | k_pe]`` and its value ``c W_UV_h`` (``kv_b_proj`` stacks ``W_UK_h`` and ``W_UV_h``). What a token
needs in the cache is therefore ``[c | k_pe]``: one part of ``kv_lora_rank + qk_rope_head_dim`` values a token and
layer, against ``2 * H * head_dim`` for the keys and values of the same heads (docs/benchmarks.md measures both).

Decoding never expands the latent ("weight absorption", the paper's appendix): a head's score
``q_nope . (c W_UK_h) + q_pe . k_pe`` equals ``(q_nope W_UK_h^T) . c + q_pe . k_pe``, so the query moves into the
latent space once, attention runs over ``[c | k_pe]`` as one key head shared by all ``H`` query heads (values: ``c``),
and the ``H`` outputs leave through ``W_UV_h`` before ``o_proj``. The same form serves prefill. On CPU in fp32 a
decode step's attention reads each row's latents straight from the pool through its block table with the C kernel of
:mod:`hybridflow.rollout.cpu_attention` (values: the latents themselves, of which the first ``kv_lora_rank`` outputs
are kept), in groups of at most its 16 query heads per key head; on CUDA with Triton it runs as
:mod:`hybridflow.rollout.triton_mla`'s kernels, reading the pool in place too, in a graph-safe step (static shapes, no
host reads: CUDA graphs replay it, the sparse layers' experts gathered); elsewhere the rows' blocks are gathered for
SDPA.

The rest is HF's ``DeepseekV3`` layer op for op: queries through ``q_a_proj -> q_a_layernorm -> q_b_proj`` (or
``q_proj`` when ``q_lora_rank`` is None), rotary on the rope part only, in DeepSeek's interleaved pair layout when
``rope_interleave`` (HF's ``apply_rotary_pos_emb_interleave``), the softmax scale of the module (yarn's ``mscale``
included), dense MLPs in the first ``first_k_dense_replace`` layers and :mod:`hybridflow.rollout.grouped_moe`
after. Norms are the HF module's own; the projections and the LM head are read through
:class:`~hybridflow.rollout.packed_linear.PackedLinear` (on CPU a oneDNN-packed copy, 1.2-2x faster than ``F.linear`` at
a decode step's rows; elsewhere the module's tensor itself) and the routed experts are packed copies, all rebuilt by
:meth:`MLADecoder.refresh` (which :meth:`MLADecoder.load_weights` calls after copying new weights into the module).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hybridflow.rollout import cpu_attention
from hybridflow.rollout.architectures import hidden_activation
from hybridflow.rollout.attention_variants import decode_mask, prefill_mask
from hybridflow.rollout.grouped_moe import grouped_moe_mlp, grouped_moe_weights, is_grouped_moe
from hybridflow.rollout.kv_cache import CachedPrefix, PagedKVCache
from hybridflow.rollout.optional import package_installed
from hybridflow.rollout.packed_linear import PackedLinear
from hybridflow.rollout.rotary import RotaryTables
from hybridflow.rollout.weights import copy_named_tensors


@dataclass(frozen=True)
class MLAProjections:
    """One layer's attention projections as :class:`PackedLinear` (``q`` is ``q_proj``, or ``q_a_proj`` then
    ``q_b_proj`` around the module's ``q_a_layernorm`` when ``q_lora_rank`` is set)."""

    q: tuple[PackedLinear, ...]
    kv_a: PackedLinear
    o: PackedLinear

    @classmethod
    def of(cls, attn) -> "MLAProjections":
        q = (attn.q_proj,) if attn.q_lora_rank is None else (attn.q_a_proj, attn.q_b_proj)
        return cls(q=tuple(map(_packed, q)), kv_a=_packed(attn.kv_a_proj_with_mqa), o=_packed(attn.o_proj))


def _packed(linear: torch.nn.Linear) -> PackedLinear:
    return PackedLinear(linear.weight, linear.bias)


class MLADecoder:
    """Prefill and batched decode of an HF DeepSeek-V3 model over a latent paged cache (the interface of
    :class:`~hybridflow.rollout.decoder.LlamaFamilyDecoder` that the engine, its runner and its pool use)."""

    kv_parts = 1
    """The paged cache holds one part, the latent ``[c | k_pe]`` (no values)."""
    kv_heads = 1
    varlen_prefill = False
    vision_language = False
    fused_cpu_decode = False
    paged_cpu_attention = True
    """Attention gathers each row's blocks from the pool itself: the CPU slot mirror is never built."""
    suppressed = None

    def __init__(self, model):
        config = model.config
        self.model = model
        self.text_model = model.model
        self.num_heads = config.num_attention_heads
        self.rank, self.rope_dim = config.kv_lora_rank, config.qk_rope_head_dim
        self.nope_dim, self.v_dim = config.qk_nope_head_dim, config.v_head_dim
        self.head_dim = self.rank + self.rope_dim
        """The width of one cached token a layer: its latent then its rotated key."""
        self.scale = self.text_model.layers[0].self_attn.scaling
        self.interleaved = bool(getattr(config, "rope_interleave", False))
        self.rotary = RotaryTables(self.text_model.rotary_emb, [None], like=lambda: self.embed)
        self.head_group = max(g for g in range(1, cpu_attention.MAX_GROUP + 1) if self.num_heads % g == 0)
        """Query heads per call of the CPU kernel (the largest divisor of ``H`` it takes)."""
        self.paged_kernel = self.embed.device.type == "cpu" and cpu_attention.supports(
            dtype=self.embed.dtype, heads=self.head_group, kv_heads=1, head_dim=self.head_dim)
        """Whether a decode step's attention runs as the CPU kernel over the pool (fp32, latent width in 16s)."""
        self.triton_kernels = self.embed.device.type == "cuda" and package_installed("triton")
        """Whether a graph-safe decode step (``context=None``: CUDA graphs) runs attention as the Triton MLA kernel."""
        self.silu = hidden_activation(config) == "silu"
        """The experts' gate is SiLU: passed as ``F.silu`` itself (HF's ``act_fn`` is a module, which the C experts
        kernel and the Triton grouped GEMMs would not recognise, leaving the sparse layers on the torch path)."""
        self.weights_epoch = 0
        """The graphs read the module's tensors, which a weight sync copies into in place: never bumped."""
        self.refresh()

    @property
    def num_layers(self) -> int:
        return len(self.text_model.layers)

    @property
    def vocab_size(self) -> int:
        return self.embed.shape[0]

    @property
    def embed(self) -> torch.Tensor:
        return self.text_model.embed_tokens.weight

    @property
    def _rope(self):
        return self.rotary.tables

    def refresh(self, incoming=None) -> None:
        """Pack the projections, the LM head and the routed experts again from the module (norms are read from it)."""
        self.projections = [MLAProjections.of(layer.self_attn) for layer in self.text_model.layers]
        self.lm_head = _packed(self.model.lm_head)
        self.experts = [grouped_moe_weights(layer.mlp) if is_grouped_moe(layer.mlp) else None
                        for layer in self.text_model.layers]

    def load_weights(self, named_tensors) -> None:
        """New trainer weights (HF names) into the module, then the expert copies rebuilt."""
        copy_named_tensors(self.model, named_tensors)
        self.refresh()

    def release_module_projections(self) -> None:
        """Nothing to release: the decoder reads the module's projections, it holds no second copy of them."""

    def rope_table(self, max_len: int, kind: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary.table(max_len, kind)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary on ``x`` ``[N, heads, rope_dim]`` with rows ``cos, sin`` ``[N, 1, rope_dim]``: interleaved pairs
        ``(x0, x1), (x2, x3), ..`` out as ``[evens' | odds']`` (HF's ``apply_rotary_pos_emb_interleave``), else
        rotate-half."""
        if self.interleaved:
            half = cos.shape[-1] // 2
            cos, sin = cos[..., :half], sin[..., :half]
            even, odd = x[..., 0::2], x[..., 1::2]
            return torch.cat([even * cos - odd * sin, odd * cos + even * sin], dim=-1)
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-second, first), dim=-1) * sin

    def _latent_qkv(self, hidden: torch.Tensor, index: int, cos: torch.Tensor, sin: torch.Tensor):
        """Normed ``hidden`` ``[N, C]`` -> the query in latent space ``[N, H, rank + rope]`` and the token's cache
        entry ``[N, rank + rope]`` (its latent ``c`` and rotated ``k_pe``)."""
        attn = self.text_model.layers[index].self_attn
        projections = self.projections[index]
        if len(projections.q) == 1:
            q = projections.q[0](hidden)
        else:
            q = projections.q[1](attn.q_a_layernorm(projections.q[0](hidden)))
        q_nope, q_pe = q.view(-1, self.num_heads, self.nope_dim + self.rope_dim).split(
            [self.nope_dim, self.rope_dim], dim=-1)
        latent, k_pe = projections.kv_a(hidden).split([self.rank, self.rope_dim], dim=-1)
        latent = attn.kv_a_layernorm(latent)
        w_uk = attn.kv_b_proj.weight.view(self.num_heads, self.nope_dim + self.v_dim, self.rank)[:, : self.nope_dim]
        query = torch.cat([torch.einsum("nhd,hdr->nhr", q_nope, w_uk), self._rotate(q_pe, cos, sin)], dim=-1)
        return query, torch.cat([latent, self._rotate(k_pe[:, None], cos, sin)[:, 0]], dim=-1)

    def _attention_out(self, out_latent: torch.Tensor, index: int) -> torch.Tensor:
        """The heads' outputs in latent space ``[N, H, rank]`` through ``W_UV_h`` and ``o_proj``: ``[N, C]``."""
        attn = self.text_model.layers[index].self_attn
        w_uv = attn.kv_b_proj.weight.view(self.num_heads, self.nope_dim + self.v_dim, self.rank)[:, self.nope_dim:]
        heads_out = torch.einsum("nhr,hvr->nhv", out_latent, w_uv)
        return self.projections[index].o(heads_out.reshape(out_latent.shape[0], -1))

    def _mlp_block(self, hidden: torch.Tensor, index: int, *, graph_safe: bool = False) -> torch.Tensor:
        layer = self.text_model.layers[index]
        normed = layer.post_attention_layernorm(hidden)
        moe = self.experts[index]
        if moe is None:
            return hidden + layer.mlp(normed)
        activation = F.silu if self.silu else layer.mlp.experts.act_fn
        return hidden + grouped_moe_mlp(normed, moe, activation, graph_safe=graph_safe)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.text_model.norm(hidden))

    @torch.no_grad()
    def prefill(self, token_ids: torch.Tensor):
        return self.prefill_many([token_ids])[0]

    @torch.no_grad()
    def prefill_many(self, prompts: list[torch.Tensor], computed: list | None = None, images=None
                     ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Several prompts ``[L_i]`` in one packed pass (projections and MLPs over all rows, attention per prompt);
        per prompt, last-position logits ``[V]`` and its latents ``[layers, 1, 1, C_i + L_i, rank + rope]`` with
        ``computed[i]`` (a tensor of that layout or a :class:`CachedPrefix`) the ``C_i`` tokens before it."""
        computed = computed or [None] * len(prompts)
        lengths = [int(p.shape[0]) for p in prompts]
        offsets = [0 if c is None else c.length if isinstance(c, CachedPrefix) else int(c.shape[3]) for c in computed]
        starts = [sum(lengths[:i]) for i in range(len(lengths))]
        device = prompts[0].device
        positions = torch.cat([torch.arange(o, o + n, device=device) for o, n in zip(offsets, lengths)])
        cos, sin = self.rotary.rows(positions, max(o + n for o, n in zip(offsets, lengths)))[None]
        hidden = self.text_model.embed_tokens(torch.cat(prompts))
        caches = [torch.empty(self.num_layers, 1, 1, o + n, self.head_dim, dtype=hidden.dtype, device=device)
                  for o, n in zip(offsets, lengths)]
        for cache, done, offset in zip(caches, computed, offsets):
            if isinstance(done, CachedPrefix):
                done.copy_into(cache)
            elif done is not None:
                cache[:, :, :, :offset] = done
        masks = [prefill_mask(n, o, None, device) for o, n in zip(offsets, lengths)]
        for index, layer in enumerate(self.text_model.layers):
            query, latent = self._latent_qkv(layer.input_layernorm(hidden), index, cos, sin)
            outs = []
            for cache, start, length, offset, mask in zip(caches, starts, lengths, offsets, masks):
                rows = slice(start, start + length)
                cache[index, 0, 0, offset:] = latent[rows]
                keys = cache[index, 0][None]  # [1, 1, C + L, rank + rope]: one key head for all H query heads
                out = F.scaled_dot_product_attention(query[rows].transpose(0, 1)[None], keys, keys[..., : self.rank],
                                                     attn_mask=mask, is_causal=mask is None, scale=self.scale,
                                                     enable_gqa=True)
                outs.append(out[0].transpose(0, 1))
            hidden = self._mlp_block(hidden + self._attention_out(torch.cat(outs), index), index)
        last_rows = torch.tensor([start + length - 1 for start, length in zip(starts, lengths)], device=device)
        return list(zip(self._logits(hidden[last_rows]).unbind(0), caches))

    @torch.no_grad()
    def decode(self, *, token_ids: torch.Tensor, positions: torch.Tensor, cache: PagedKVCache,
               block_tables: torch.Tensor, context: int | None = None,
               rope_positions: torch.Tensor | None = None) -> torch.Tensor:
        """One step for ``N`` rows of the latent paged cache (the arguments of ``LlamaFamilyDecoder.decode``; ``context``
        None: graph-safe, attention by the Triton kernel where :attr:`triton_kernels`): ``[N, V]`` next-token logits."""
        graph_safe = context is None
        context = cache.max_len if context is None else context
        cos, sin = self.rotary.rows(positions, context)[None]
        rows = cache.write_rows(positions, block_tables)
        block_tables = block_tables[:, : -(-context // cache.block_size)]
        mask = None  # the kernels read each row's own length
        if graph_safe and self.triton_kernels:
            attend = self._triton_attend
        elif self.paged_kernel:
            attend = self._paged_attend
        else:
            attend = self._gathered_attend
            mask = decode_mask(positions, block_tables.shape[1] * cache.block_size, None, self.embed.dtype)
        hidden = self.text_model.embed_tokens(token_ids)
        for index, layer in enumerate(self.text_model.layers):
            query, latent = self._latent_qkv(layer.input_layernorm(hidden), index, cos, sin)
            cache.write(layer=index, rows=rows, keys=latent, values=None)
            out = attend(query, cache, index, block_tables, positions=positions, mask=mask)
            hidden = self._mlp_block(hidden + self._attention_out(out, index), index, graph_safe=graph_safe)
        return self._logits(hidden)

    def _gathered_attend(self, query: torch.Tensor, cache: PagedKVCache, index: int, block_tables: torch.Tensor, *,
                         positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``query`` ``[N, H, rank + rope]`` over the rows' latents, gathered: ``[N, H, rank]``."""
        keys = cache.gather(index, 0, block_tables)  # [N, 1, span, rank + rope]
        out = F.scaled_dot_product_attention(query[:, None], keys, keys[..., : self.rank], attn_mask=mask,
                                             scale=self.scale)
        return out[:, 0]

    def _paged_attend(self, query: torch.Tensor, cache: PagedKVCache, index: int, block_tables: torch.Tensor, *,
                      positions: torch.Tensor, mask=None) -> torch.Tensor:
        """The same through the CPU kernel, reading the pool in place: each row split into ``H / head_group`` rows
        of ``head_group`` heads over the same blocks."""
        count, chunks = query.shape[0], self.num_heads // self.head_group
        latents = cache.data[index, 0]  # [1, blocks, B, rank + rope]
        out = cpu_attention.paged_decode_attention(
            q=query.reshape(count * chunks, self.head_group, self.head_dim), keys=latents, values=latents,
            block_tables=block_tables.repeat_interleave(chunks, dim=0),
            lengths=(positions + 1).repeat_interleave(chunks), scale=self.scale, window=None)
        return out.view(count, self.num_heads, self.head_dim)[..., : self.rank]

    def _triton_attend(self, query: torch.Tensor, cache: PagedKVCache, index: int, block_tables: torch.Tensor, *,
                       positions: torch.Tensor, mask=None) -> torch.Tensor:
        """The same through the Triton kernel over the pool in place (every head in one launch): ``[N, H, rank]``."""
        from hybridflow.rollout.triton_mla import mla_decode_attention  # Triton only where it runs

        return mla_decode_attention(q=query, latents=cache.data[index, 0, 0], lengths=positions + 1,
                                    block_tables=block_tables, scale=self.scale, rank=self.rank)
