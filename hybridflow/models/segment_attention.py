"""Attention inside the segments of one packed row: padding-free and shared-prompt forwards.

A packed row ``[1, N]`` holds several *units* back to back, each with its own position
ids. A unit is either one sequence (plain causal attention) or one prompt followed by
the ``n`` responses sampled from it (a *shared-prompt* unit): every response token
attends to the prompt and, causally, to its own response only, so the prompt's hidden
states are computed once for the whole group instead of ``n`` times. The logits of every
response token equal those of the padded ``[prompt ++ response]`` row (same keys, same
positions), and so do the gradients: the prompt's activations receive the sum of the
``n`` responses' gradients, which is what ``n`` copies would add up to.

Attention runs unit by unit (SDPA per unit), so its cost is ``sum_u L_u^2`` rather than
``N^2`` for a dense block-diagonal mask over the whole row; the projections and MLPs run
once over exactly the ``N`` valid tokens (no padding).

How it plugs into transformers: :func:`use_segment_attention` registers the attention
implementation ``hybridflow_segments`` and switches the model's config to it. Called
with a :class:`SegmentLayout` (the ``segment_layout`` forward kwarg, which transformers
passes down to every attention call), it attends per unit; called without one, it *is*
SDPA (same mask function, same kernel), so generation, the padded path and activation
checkpointing's recompute are unchanged.

What some architectures add to attention is honoured on both paths: a layer's ``sliding_window`` ``W``
(Mistral, Phi-3, Gemma's local layers: query position ``i`` sees key positions ``i - W < j``, from the
row's own position ids, so a shared prompt's responses count from the prompt's end), Gemma 2's
``softcap`` (scores ``c * tanh(s / c)``) and gpt-oss's attention sinks (``s_aux``: one learned logit per head that
joins every query's softmax and is then dropped, so the weights of the real keys sum to less than 1). SDPA has no
hook for either, so such a layer runs :func:`capped_attention` (FlexAttention renormalises by its log-sum-exp).
Any other attention kwarg a model passes is one this implementation does not know:
:mod:`hybridflow.models.layout_guard` names it where a model's packed forward differs from its padded one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from hybridflow.models import flex_segments
from hybridflow.models.segment_layout import SegmentLayout
from hybridflow.models.unit_attention import masked_unit_attention, takes_unit_attention

IMPLEMENTATION = "hybridflow_segments"
BRANCHED_SHARED_PROMPTS_DEVICES: tuple[str, ...] = ()
"""Device types (``"cuda"``) on which a shared-prompt unit runs branch by branch with fused causal kernels (a
masked call has no flash kernel) instead of one masked call per unit. None until measured: on one H200 the 0.5B and
1.5B updates took about the same time (kernel launches, not FLOPs, bound them), and branching launches
n + 1 attention calls per unit (benchmarks/update.py's fast-branched variant measures it)."""
FLEX_SEGMENT_DEVICES: tuple[str, ...] = ()
"""Device types (``"cuda"``) on which a packed row's units, shared prompts included, run as one compiled
FlexAttention call a layer (:mod:`hybridflow.models.flex_segments`) instead of one SDPA call per unit. Takes
precedence over :data:`BRANCHED_SHARED_PROMPTS_DEVICES`. None until measured on a card (benchmarks/update.py's
fast-flex variant): the CPU has no FlexAttention backward."""


HONOURED_KWARGS = frozenset({"softcap", "sliding_window", "s_aux", "position_ids", "is_causal", "output_attentions",
                             "use_cache", "cache_position", "output_router_logits"})
"""Attention kwargs this implementation honours (or that carry no attention math); any other a model passes with a
value is a feature the packed layouts may ignore (:func:`attention_kwargs_seen`)."""
_SEEN: dict[str, set[str]] | None = None


@contextlib.contextmanager
def attention_kwargs_seen() -> Iterator[dict[str, set[str]]]:
    """Inside, the attention kwargs outside :data:`HONOURED_KWARGS` that each attention class passed with a value,
    by class name (what :mod:`hybridflow.models.layout_guard` names when a packed forward differs)."""
    global _SEEN
    previous, _SEEN = _SEEN, {}
    try:
        yield _SEEN
    finally:
        _SEEN = previous


def _record_kwargs(module, kwargs: dict) -> None:
    if _SEEN is not None:
        unknown = {name for name, value in kwargs.items() if value is not None and name not in HONOURED_KWARGS}
        _SEEN.setdefault(type(module).__name__, set()).update(unknown)


def _segment_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """``query [1, H, N, D]``, ``key/value [1, H_kv, N, D]`` -> ``([1, N, H, D], None)``.

    With a ``sequence_parallel`` kwarg (hybridflow.models.ulysses) this rank holds a slice of the
    row: the heads are exchanged for the whole sequence around this same function."""
    sequence_parallel = kwargs.pop("sequence_parallel", None)
    if sequence_parallel is not None:
        return sequence_parallel.attention(_segment_attention, module, query, key, value, attention_mask,
                                           dropout=dropout, scaling=scaling, **kwargs)
    layout: SegmentLayout | None = kwargs.pop("segment_layout", None)
    _record_kwargs(module, kwargs)
    softcap, window, sinks = kwargs.get("softcap"), kwargs.get("sliding_window"), kwargs.get("s_aux")
    eager = softcap is not None or sinks is not None
    if layout is None:
        if eager:  # the mask transformers built already holds the window
            return capped_attention(query, key, value, mask=attention_mask, scale=scaling, softcap=softcap,
                                    sinks=sinks, grouped=True).transpose(1, 2).contiguous(), None
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    dropout = dropout if module.training else 0.0
    positions = _row_positions(layout, kwargs.get("position_ids"), query.shape[2])
    if query.device.type in FLEX_SEGMENT_DEVICES and flex_segments.expressible(layout, dropout):
        query, key, value = same_dtype(query, key, value)
        out = flex_segments.flex_segment_attention(query, key, value, layout=layout, scale=scaling, softcap=softcap,
                                                   window=window, positions=None if positions is None else positions[0],
                                                   sinks=sinks)
        return out.transpose(1, 2).contiguous(), None
    outputs = []
    on_cuda = query.device.type == "cuda"
    branched = query.device.type in BRANCHED_SHARED_PROMPTS_DEVICES and window is None and not eager
    # Cast once for the whole row (not per unit by autocast) and split it: the backward of a split is one cat,
    # where per-unit slices each build a zero tensor of the whole row and add into it.
    units = zip(*(split_units(tensor, layout.bounds) for tensor in same_dtype(query, key, value)))
    for index, (((start, end), mask), unit) in enumerate(zip(zip(layout.bounds, layout.masks), units)):
        branches = layout.branches[index] if layout.branches is not None else None
        if window is not None:
            mask = windowed(mask, _unit_positions(positions, start, end, branches), window)
        if eager:
            outputs.append(capped_attention(*unit, mask=mask, scale=scaling, softcap=softcap, sinks=sinks,
                                            grouped=True))
            continue
        if mask is not None and branches is not None and branched:
            # A masked SDPA call has no flash kernel; the unit's branches run the fused causal ones.
            outputs.append(shared_prompt_attention(*unit, lengths=branches, scale=scaling, dropout=dropout,
                                                   repeat_kv=True))
            continue
        # a CPU's masked flash call is slow at these sizes; a shared-prompt unit's structure (unless a window
        # narrowed its mask) lets it compute only the blocks its mask opens
        structure = branches if window is None else None
        if takes_unit_attention(unit[0], mask, dropout, structure):
            outputs.append(masked_unit_attention(*unit, mask, scaling, structure))
            continue
        # On CUDA, SDPA's fused kernels other than flash (memory-efficient, cuDNN) do not take enable_gqa, and
        # SDPA falls back to the math kernel and its [H, L, L] fp32 scores where flash does not apply (a mask,
        # fp32): repeating the KV heads keeps every unit on a fused kernel.
        unit_key, unit_value, gqa = kv_heads(*unit, repeat=on_cuda)
        outputs.append(F.scaled_dot_product_attention(unit[0], unit_key, unit_value, attn_mask=mask,
                                                      is_causal=mask is None, scale=scaling, dropout_p=dropout,
                                                      enable_gqa=gqa))
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def split_units(tensor: torch.Tensor, bounds: list[tuple[int, int]]) -> list[torch.Tensor]:
    """``tensor [..., N, D]``'s units along dim -2, one per ``(start, end)``: views of one ``split`` where the
    bounds tile ``[0, N)`` in order (its backward is one cat), else slices."""
    length = tensor.shape[-2]
    starts = [start for start, _ in bounds]
    if starts and starts[0] == 0 and bounds[-1][1] <= length and all(
            end == following for (_, end), following in zip(bounds, starts[1:])):
        sizes = [end - start for start, end in bounds]
        rest = length - bounds[-1][1]
        sizes = sizes + [rest] if rest else sizes
        if tensor.dim() >= 3 and tensor.transpose(-3, -2).is_contiguous():
            # [.., N, H, D] in memory (HF's projections, transposed): split that view so the backward cats whole
            # rows of memory, not a strided copy (SDPA's gradients come back in the same layout)
            pieces = [piece.transpose(-3, -2) for piece in torch.split(tensor.transpose(-3, -2), sizes, dim=-3)]
        else:
            pieces = torch.split(tensor, sizes, dim=-2)
        return list(pieces[:len(bounds)])
    return [tensor[..., start:end, :] for start, end in bounds]


def _row_positions(layout: SegmentLayout, position_ids: torch.Tensor | None, length: int) -> torch.Tensor | None:
    """``[1, N]`` position ids of the whole row attention sees: the layout's, else the forward's where they span
    the row (not a sequence-parallel slice), else None (each unit's are then derived from the layout)."""
    if layout.positions is not None:
        return layout.positions[None]
    if position_ids is not None and position_ids.shape[-1] == length:
        return position_ids
    return None


def _unit_positions(position_ids: torch.Tensor | None, start: int, end: int, branches: list[int] | None
                    ) -> torch.Tensor:
    """``[L]`` positions of one unit: from the row's position ids where known, else from the layout (a
    shared-prompt unit's responses each continue from the prompt's end)."""
    if position_ids is not None:
        return position_ids[0, start:end]
    if branches is None:
        return torch.arange(end - start)
    prompt = branches[0]
    return torch.cat([torch.arange(prompt)] + [torch.arange(prompt, prompt + n) for n in branches[1:]])


def windowed(mask: torch.Tensor | None, positions: torch.Tensor, window: int) -> torch.Tensor:
    """A unit's mask (None: causal) narrowed to a sliding window: query ``i`` keeps key ``j`` only where
    ``positions[i] - positions[j] < window``; bool ``[L, L]``."""
    positions = positions.to(mask.device if mask is not None else positions.device)
    near = positions[:, None] - positions[None, :] < window
    if mask is None:
        mask = torch.ones(near.shape, dtype=torch.bool, device=near.device).tril()
    return mask & near


def capped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: torch.Tensor | None, scale: float,
                     softcap: float | None, sinks: torch.Tensor | None = None, grouped: bool = False) -> torch.Tensor:
    """``softmax(cap(scale q k^T) + mask) v`` over ``[..., T, D]`` operands, ``cap(s) = c tanh(s / c)`` (Gemma 2;
    none when ``softcap`` is None); ``mask`` bool (True = attend) or additive, None = causal. ``sinks`` ``[H]``
    (gpt-oss): one more logit per head in every query's softmax, dropped after it. ``grouped``: ``k`` / ``v`` have
    fewer heads (dim -3) than ``q`` (GQA). Eager (scores, cap, mask, fp32 softmax, ``@ v``), as HF's
    ``eager_attention_forward``; without a cap or sinks it is SDPA."""
    if softcap is None and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, scale=scale,
                                              enable_gqa=grouped)
    if grouped:
        repeats = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(repeats, dim=-3), v.repeat_interleave(repeats, dim=-3)
    scores = torch.matmul(q, k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is None:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    # The dtype's minimum, not -inf: a fully masked row (a left-padding query) stays finite, as in HF's eager path.
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool else scores + mask
    if sinks is None:
        return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)
    sink = sinks.to(scores.dtype).reshape(-1, 1, 1).expand(*scores.shape[:-1], 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1, dtype=torch.float32)[..., :-1]
    return torch.matmul(probs.to(q.dtype), v)


def shared_prompt_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, lengths: list[int],
                            scale: float | None, dropout: float = 0.0, repeat_kv: bool = False) -> torch.Tensor:
    """Attention of one shared-prompt unit ``[1, H, P + sum R_i, D]`` -> ``[1, H, P + sum R_i, D]``, branch by
    branch: the prompt causally over itself, then each response's queries over ``prompt ++ response`` keys,
    causal aligned to the bottom right (query ``j`` of a response sees the prompt and response tokens
    ``<= j``). The same attention as the unit's mask, without one: every call can take a fused causal
    kernel. ``lengths`` = ``[P, R_1, ..., R_n]``; the prompt's keys get the sum of the responses' gradients."""
    from torch.nn.attention.bias import causal_lower_right

    prompt = lengths[0]
    query, key, value = same_dtype(query, key, value)
    key, value, gqa = kv_heads(query, key, value, repeat=repeat_kv)
    outputs = [F.scaled_dot_product_attention(query[:, :, :prompt], key[:, :, :prompt], value[:, :, :prompt],
                                              is_causal=True, scale=scale, dropout_p=dropout, enable_gqa=gqa)]
    offset = prompt
    for length in lengths[1:]:
        rows = slice(offset, offset + length)
        if length:
            branch_key = torch.cat([key[:, :, :prompt], key[:, :, rows]], dim=2)
            branch_value = torch.cat([value[:, :, :prompt], value[:, :, rows]], dim=2)
            outputs.append(F.scaled_dot_product_attention(
                query[:, :, rows], branch_key, branch_value, attn_mask=causal_lower_right(length, prompt + length),
                scale=scale, dropout_p=dropout, enable_gqa=gqa))
        offset += length
    return torch.cat(outputs, dim=2)


def same_dtype(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """The tensors in the dtype SDPA would run them in: autocast's where it is on for their device, else their
    promoted dtype. Under autocast the rotary embedding leaves q and k in fp32 (fp32 cos/sin) and v in bf16;
    a plain SDPA call is cast by autocast, but one with a ``causal_lower_right`` bias dispatches to the fused
    kernels directly, past autocast, and rejects mixed dtypes."""
    device = tensors[0].device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
    else:
        dtype = tensors[0].dtype
        for tensor in tensors[1:]:
            dtype = torch.promote_types(dtype, tensor.dtype)
    return [tensor.to(dtype) for tensor in tensors]


def kv_heads(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
             repeat: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(key, value, enable_gqa) for SDPA: with ``repeat`` the KV heads repeated to the query's head count
    (query head ``i`` reads KV head ``i // groups``, as enable_gqa does), else left grouped."""
    groups = query.shape[1] // key.shape[1]
    if groups == 1:
        return key, value, False
    if repeat:
        return key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1), False
    return key, value, True


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if IMPLEMENTATION not in AttentionInterface._global_mapping:
        AttentionInterface.register(IMPLEMENTATION, _segment_attention)
        ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, sdpa_mask)


def use_segment_attention(model) -> None:
    """Switch ``model`` (HF causal LM, value model or their wrappers) to segment attention.

    Idempotent; without a layout the implementation is SDPA, so nothing else changes.
    """
    _register()
    config = model.config
    if config._attn_implementation != IMPLEMENTATION:
        config._attn_implementation = IMPLEMENTATION


def supports_segment_attention(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or the transformers model it wraps) runs its attention through transformers'
    attention interface (``_supports_attention_backend``), which :func:`use_segment_attention` plugs into;
    a model with its own attention code would attend across the units of a packed row."""
    return any(getattr(type(module), "_supports_attention_backend", False) for module in model.modules())


def packed_row_mask() -> torch.Tensor:
    """A placeholder 4-D mask: transformers passes a 4-D mask through untouched, which keeps it
    from building an ``[N, N]`` mask for the packed row; segment attention never reads it."""
    return torch.ones(1, 1, 1, 1, dtype=torch.bool)
