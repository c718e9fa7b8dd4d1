"""The native decoder's packed prefill: several prompts in one pass, each projection one matmul over all of them.

A few tens of rows cost a decode step's weight reads almost whatever their number, so packing P prompts saves ~P - 1
passes over the weights. Attention stays per prompt (causal within it): one SDPA call per prompt a layer
(:func:`prefill_per_prompt`, any device, dtype and cached prefix), or on CUDA in half precision one varlen
FlashAttention call a layer (:func:`prefill_varlen`). A vision-language prompt's images are spliced over its image
tokens (:func:`splice_images`). ``decoder`` is the :class:`~hybridflow.rollout.decoder.LlamaFamilyDecoder` whose
layer pieces (norms, projections, rotary tables, head) these passes run.
"""

from __future__ import annotations

import itertools

import torch

from hybridflow.models.segment_attention import kv_heads
from hybridflow.rollout.attention_variants import attention, prefill_mask
from hybridflow.rollout.kv_cache import CachedPrefix
from hybridflow.rollout.vision_prefill import PrefillImages


def prefill_per_prompt(decoder, prompts: list[torch.Tensor], computed: list[torch.Tensor | CachedPrefix | None],
                       images: list[PrefillImages | None]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``LlamaFamilyDecoder.prefill_many`` with one SDPA call per prompt a layer (any device, dtype and prefix)."""
    lengths = [int(p.shape[0]) for p in prompts]
    offsets = [0 if c is None else c.length if isinstance(c, CachedPrefix) else int(c.shape[3]) for c in computed]
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    device = prompts[0].device
    rope = prefill_rope(decoder, offsets, lengths, images, device)
    hidden = decoder._embed(torch.cat(prompts))
    visual = splice_images(hidden, images, starts)
    prefixes = [torch.empty(decoder.num_layers, 2, decoder.kv_heads, o + n, decoder.head_dim, dtype=hidden.dtype,
                            device=device) for o, n in zip(offsets, lengths)]
    for prefix, done, offset in zip(prefixes, computed, offsets):
        if isinstance(done, CachedPrefix):
            done.copy_into(prefix)
        elif done is not None:
            prefix[:, :, :, :offset] = done
    masks = {window: [prefill_mask(n, o, window, device) for o, n in zip(offsets, lengths)]
             for window in set(decoder.windows)}
    for index, layer in enumerate(decoder.layers):
        q, k, v = decoder._qkv(decoder._rms_norm(hidden, layer.input_norm), layer, *rope[decoder.rope_kinds[index]])
        attn = []
        for prefix, start, length, offset, mask in zip(prefixes, starts, lengths, offsets, masks[layer.window]):
            rows = slice(start, start + length)
            prefix[index, 0, :, offset:] = k[rows].transpose(0, 1)
            prefix[index, 1, :, offset:] = v[rows].transpose(0, 1)
            query = q[rows].transpose(0, 1)[None]
            # On CUDA, SDPA runs grouped heads (enable_gqa) only in its math kernel: repeat them there.
            key, value, grouped = kv_heads(query, prefix[index, 0][None], prefix[index, 1][None],
                                           repeat=query.is_cuda)
            out = attention(query, key, value, mask=mask, scale=decoder.scale, softcap=decoder.attn_softcap,
                            grouped=grouped, sinks=layer.sinks)
            attn.append(out[0].transpose(0, 1).reshape(length, -1))
        hidden = decoder._residual(hidden, layer.o_proj(torch.cat(attn)), layer.attn_out_norm)
        hidden = add_deepstack(decoder._mlp_block(hidden, layer), index, visual)
    last_rows = torch.tensor([start + length - 1 for start, length in zip(starts, lengths)], device=device)
    return list(zip(decoder._logits(hidden[last_rows]).unbind(0), prefixes))

def prefill_rope(decoder, offsets: list[int], lengths: list[int], images: list[PrefillImages | None], device
                ) -> dict[str | None, tuple[torch.Tensor, torch.Tensor]]:
    """The rotary rows ``[sum L_i, 1, D]`` of a packed prefill whose prompt ``i`` covers positions ``o_i ..
    o_i + L_i - 1``: from the 1-D tables, or, when a prompt has images, from each token's M-RoPE position
    (the others' three coordinates equal: the same values as the 1-D table's)."""
    if all(image is None for image in images):
        positions = torch.cat([torch.arange(o, o + n, device=device) for o, n in zip(offsets, lengths)])
        return decoder.rotary.rows(positions, max(o + n for o, n in zip(offsets, lengths)))
    positions = [torch.arange(o, o + n, device=device).expand(3, -1) if image is None else image.positions
                 for o, n, image in zip(offsets, lengths, images)]
    return decoder.rotary.mrope_rows(torch.cat(positions, dim=1))

def splice_images(hidden: torch.Tensor, images: list[PrefillImages | None], starts: list[int]
                 ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]] | None:
    """Write each prompt's image embeddings over its image tokens' rows of the packed ``hidden`` ``[T, C]`` (HF's
    ``masked_scatter``; in place); returns ``(rows [K], deepstack features [K, C] per layer)`` of all the pass's
    image tokens, or None when it has none."""
    present = [(image, start) for image, start in zip(images, starts) if image is not None and image.rows.numel()]
    if not present:
        return None
    rows = torch.cat([image.rows + start for image, start in present])
    hidden[rows] = torch.cat([image.embeds for image, _ in present]).to(hidden.dtype)
    deepstack = tuple(torch.cat(layer) for layer in zip(*(image.deepstack for image, _ in present)))
    return rows, deepstack

def add_deepstack(hidden: torch.Tensor, layer: int,
                  visual: tuple[torch.Tensor, tuple[torch.Tensor, ...]] | None) -> torch.Tensor:
    """Qwen3-VL: after decoder layer ``layer``, its deepstack features join the residual at the image tokens."""
    if visual is None or layer >= len(visual[1]):
        return hidden
    rows, deepstack = visual
    hidden[rows] = hidden[rows] + deepstack[layer].to(hidden.dtype)
    return hidden

def prefill_varlen(decoder, prompts: list[torch.Tensor], images: list[PrefillImages | None]
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``LlamaFamilyDecoder.prefill_many`` with causal attention over the packed rows in one FlashAttention call a layer
    (``cu_seqlens`` keep prompts apart); the keys and values of a layer are written once, packed
    ``[layers, 2, sum L_i, KV, D]``, and each prompt's KV is returned as a ``[layers, 2, KV, L_i, D]`` view."""
    lengths = [int(p.shape[0]) for p in prompts]
    device = prompts[0].device
    offsets = [0, *itertools.accumulate(lengths)]  # on the host: no device read-back for the splice and views
    bounds = torch.tensor(offsets, dtype=torch.int32, device=device)
    rope = prefill_rope(decoder, [0] * len(lengths), lengths, images, device)
    hidden = decoder._embed(torch.cat(prompts))
    visual = splice_images(hidden, images, offsets[:-1])
    total = hidden.shape[0]
    packed = torch.empty(decoder.num_layers, 2, total, decoder.kv_heads, decoder.head_dim, dtype=hidden.dtype,
                         device=device)
    for index, layer in enumerate(decoder.layers):
        q, k, v = decoder._qkv(decoder._rms_norm(hidden, layer.input_norm), layer, *rope[decoder.rope_kinds[index]])
        packed[index, 0], packed[index, 1] = k, v
        attn = decoder._varlen_attention(q.contiguous(), packed[index, 0], packed[index, 1], bounds, max(lengths))
        hidden = decoder._residual(hidden, layer.o_proj(attn.reshape(total, -1)), layer.attn_out_norm)
        hidden = add_deepstack(decoder._mlp_block(hidden, layer), index, visual)
    last_rows = bounds[1:].long() - 1
    logits = decoder._logits(hidden[last_rows])
    kv = [packed[:, :, start : start + n].permute(0, 1, 3, 2, 4) for start, n in zip(offsets, lengths)]
    return list(zip(logits.unbind(0), kv))

def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bounds: torch.Tensor,
                     longest: int, *, scale: float) -> torch.Tensor:
    """Causal attention within each segment ``bounds[i] .. bounds[i + 1]`` of packed ``q`` ``[T, H, D]``,
    ``k`` / ``v`` ``[T, KV, D]`` (FlashAttention's varlen kernel: GQA without copies); ``[T, H, D]``."""
    return torch.ops.aten._flash_attention_forward(q, k, v, bounds, bounds, longest, longest, 0.0, True, False,
                                                   scale=scale)[0]
