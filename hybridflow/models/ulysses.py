"""Ulysses sequence parallelism: one packed row split over the ``S`` ranks of a group.

DeepSpeed-Ulysses (Jacobs et al., "DeepSpeed Ulysses", arXiv:2309.14509, Sec. 3): each of the
``S`` ranks of a sequence-parallel group holds ``N / S`` consecutive tokens of the packed row
``[1, N]`` (padded to a multiple of ``S``) and runs embeddings, projections, MLPs and the LM
head on its slice only. Attention needs every token, so around it one all-to-all trades the
sequence split for a head split:

    q, k, v  [1, H, N/S, D]  --all-to-all-->  [1, H/S, N, D]   (all tokens, H/S heads)
    segment attention over the whole row (hybridflow.models.segment_attention)
    out      [1, N, H/S, D]  --all-to-all-->  [1, N/S, H, D]   (own tokens, all heads)

so the activation memory of one rank is ``1/S`` of the row's, and the attention of each head
runs on one rank. Key/value heads are split the same way; with fewer KV heads than ``S``
(GQA) each is repeated ``S / H_kv`` times first, so that rank ``j``'s query heads find their
KV head on rank ``j``.

The outputs that a loss reads (log-probs, entropies, values at ``K`` chosen positions) are
gathered back to all ``S`` ranks, so every rank of the group evaluates the same, whole loss
(loss functions see whole sequences: sequence-level ratios, per-sequence means). In the
backward each rank keeps the gradient of its own positions only and scales it by ``S``:
FSDP averages gradients over all ``dp x S`` ranks, while the workers scale their globally
normalised losses by the data-parallel size ``dp`` alone, so the ``S`` partial gradients of
a group add up to exactly one copy of the group's gradient.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hybridflow.errors import ConfigError
from hybridflow.models.vision import is_vision_language


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's place in its sequence-parallel group: ``size`` ranks, ``group`` a torch
    process group (None = the default group, when ``size`` is the whole world)."""

    size: int
    rank: int
    group: object | None = None

    def attention(self, inner, module, query, key, value, attention_mask, **kwargs):
        """``inner`` (an attention function over the whole row) around two all-to-alls:
        ``query [1, H, N/S, D]``, ``key/value [1, H_kv, N/S, D]`` -> ``([1, N/S, H, D], None)``."""
        key, value = repeat_kv_heads(key, self.size), repeat_kv_heads(value, self.size)
        query, key, value = (_Exchange.apply(t, self, _seq_to_heads, _heads_to_seq_layout) for t in (query, key, value))
        if kwargs.get("s_aux") is not None:  # attention sinks: one per head, this rank's heads only
            heads = query.shape[1]
            kwargs["s_aux"] = kwargs["s_aux"][self.rank * heads:(self.rank + 1) * heads]
        out, _ = inner(module, query, key, value, attention_mask, **kwargs)  # [1, N, H/S, D]
        return _Exchange.apply(out, self, _heads_to_seq, _seq_to_heads_layout), None


def check_heads(*, num_heads: int, num_kv_heads: int, sp_size: int, key: str) -> None:
    """Ulysses splits attention heads over the group: ``sp_size`` must divide the query heads,
    and divide the KV heads or be a multiple of them (then KV heads are repeated)."""
    if num_heads % sp_size:
        raise ConfigError(f"{key}={sp_size} must divide the model's {num_heads} attention heads "
                          "(Ulysses gives each rank of a group heads/size heads); pick a divisor of "
                          f"{num_heads}")
    if num_kv_heads % sp_size and sp_size % num_kv_heads:
        raise ConfigError(f"{key}={sp_size} and the model's {num_kv_heads} key/value heads: one must divide "
                          "the other (KV heads are split over the group, or repeated when there are fewer); "
                          f"pick a size that divides or is a multiple of {num_kv_heads}")


def repeat_kv_heads(states: torch.Tensor, sp_size: int) -> torch.Tensor:
    """``[1, H_kv, n, D]`` -> ``[1, max(H_kv, S), n, D]``: each KV head repeated ``S / H_kv`` times
    (in place, so query head groups keep their KV head) when there are fewer heads than ranks."""
    heads = states.shape[1]
    if heads % sp_size == 0:
        return states
    return states.repeat_interleave(sp_size // heads, dim=1)


def _all_to_all(chunks: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """``chunks [S, ...]``: chunk ``j`` goes to rank ``j``; the result's chunk ``j`` came from rank ``j``."""
    import torch.distributed as dist

    chunks = chunks.contiguous()  # q/k/v arrive as transposed views; the exchange reads raw memory
    out = torch.empty_like(chunks)
    dist.all_to_all_single(out, chunks, group=sp.group)
    return out


def _seq_to_heads(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """``[1, H, n, D]`` (own n = N/S tokens) -> ``[1, H/S, N, D]`` (heads of this rank, all tokens)."""
    _, heads, n, dim = x.shape
    chunks = x[0].reshape(sp.size, heads // sp.size, n, dim)  # chunk j: the heads rank j keeps
    received = _all_to_all(chunks, sp)  # [S (sequence slice), H/S, n, D]
    return received.permute(1, 0, 2, 3).reshape(1, heads // sp.size, sp.size * n, dim)


def _heads_to_seq(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """``[1, N, H/S, D]`` -> ``[1, N/S, H, D]``: the inverse exchange, after attention."""
    _, length, heads, dim = x.shape
    chunks = x[0].reshape(sp.size, length // sp.size, heads, dim)  # chunk j: rank j's tokens
    received = _all_to_all(chunks, sp)  # [S (head group), n, H/S, D]
    return received.permute(1, 0, 2, 3).reshape(1, length // sp.size, sp.size * heads, dim)


def _heads_to_seq_layout(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """Gradient of :func:`_seq_to_heads`: ``[1, H/S, N, D]`` -> ``[1, H, n, D]``."""
    return _heads_to_seq(x.transpose(1, 2), sp).transpose(1, 2)


def _seq_to_heads_layout(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """Gradient of :func:`_heads_to_seq`: ``[1, n, H, D]`` -> ``[1, N, H/S, D]``."""
    return _seq_to_heads(x.transpose(1, 2), sp).transpose(1, 2)


class _Exchange(torch.autograd.Function):
    """An all-to-all layout change ``forward``; its gradient is the inverse exchange ``inverse``."""

    @staticmethod
    def forward(ctx, x, sp, forward, inverse):
        ctx.sp, ctx.inverse = sp, inverse
        return forward(x, sp)

    @staticmethod
    def backward(ctx, grad):
        return ctx.inverse(grad.contiguous(), ctx.sp), None, None, None


class _GatherKept(torch.autograd.Function):
    """Own values placed in a zero ``[K, ...]`` tensor, summed over the group (= gathered).
    Backward: the own positions' gradient times ``S`` (see the module docstring)."""

    @staticmethod
    def forward(ctx, local, own, total, sp):
        import torch.distributed as dist

        ctx.own, ctx.size = own, sp.size
        full = local.new_zeros((total, *local.shape[1:]))
        full[own] = local
        dist.all_reduce(full, group=sp.group)
        return full

    @staticmethod
    def backward(ctx, grad):
        return grad[ctx.own] * ctx.size, None, None, None


# --------------------------------------------------------------------------- one packed row
@dataclass
class SequenceShard:
    """This rank's slice of a packed row ``[1, N]`` and the ``K`` kept positions (``keep``,
    indices into the row) that fall in it. Without sequence parallelism (``sp`` None) the
    slice is the whole row and :meth:`gather` is the identity.

    ``local_keep [K_s]``: kept positions inside the slice (index the slice's outputs with it);
    ``own [K]`` bool: which of the ``K`` kept positions this rank computes.
    """

    sp: SequenceParallel | None
    length: int
    keep: torch.Tensor
    start: int = 0
    end: int = 0
    own: torch.Tensor = field(init=False)
    local_keep: torch.Tensor = field(init=False)

    def __post_init__(self):
        size = 1 if self.sp is None else self.sp.size
        chunk = -(-self.length // size)
        rank = 0 if self.sp is None else self.sp.rank
        self.padded = chunk * size
        self.start, self.end = rank * chunk, (rank + 1) * chunk
        self.own = (self.keep >= self.start) & (self.keep < self.end)
        self.local_keep = self.keep[self.own] - self.start

    def slice(self, row: torch.Tensor, *, pad_value: int = 0) -> torch.Tensor:
        """``[1, N, ...]`` -> this rank's ``[1, N/S, ...]`` (the row right-padded to ``S`` slices)."""
        if self.sp is None:
            return row
        pad = self.padded - row.shape[1]
        if pad:
            row = torch.cat([row, row.new_full((1, pad, *row.shape[2:]), pad_value)], dim=1)
        return row[:, self.start : self.end]

    def layout(self, bounds: list[tuple[int, int]], masks: list) -> tuple[list, list]:
        """Segment bounds and masks of the padded row: the padding is one more causal unit, so no
        real token attends to it."""
        if self.sp is None or self.padded == self.length:
            return bounds, masks
        return [*bounds, (self.length, self.padded)], [*masks, None]

    def gather(self, local: torch.Tensor) -> torch.Tensor:
        """``[K_s, ...]`` values of the own kept positions -> ``[K, ...]`` on every rank of the group."""
        if self.sp is None:
            return local
        return _GatherKept.apply(local, self.own, self.keep.numel(), self.sp)


def sequence_parallel_of(model) -> SequenceParallel | None:
    """The group ``model``'s packed forwards are split over (see :func:`split_sequences`)."""
    return getattr(model, "_hybridflow_sequence_parallel", None)


def refuse_vision_language(config, *, sp_size: int, key: str) -> None:
    """Sequence parallelism (``sp_size > 1``) of a vision-language model (its HF ``config``), refused in one line:
    packed rows are what the sequence is split along, and a VLM runs padded ones. The trainers call it from the
    model's config.json before the weights load, and :func:`split_sequences` on the model itself."""
    if sp_size > 1 and is_vision_language(config):
        raise ConfigError(f"{key}={sp_size}: a vision-language model runs padded rows, which are not split over "
                          f"ranks; set {key}=1")


def split_sequences(model, sp: SequenceParallel | None, *, key: str):
    """Make ``model``'s packed forwards sequence-parallel over ``sp`` (None or size 1: no-op).

    Checks that the heads split over the group (``key`` names the config key in the error).
    """
    if sp is None or sp.size == 1:
        return model
    config = model.config
    refuse_vision_language(config, sp_size=sp.size, key=key)
    heads = config.num_attention_heads
    check_heads(num_heads=heads, num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                sp_size=sp.size, key=key)
    object.__setattr__(model, "_hybridflow_sequence_parallel", sp)
    return model


def build_sequence_parallel(*, world_size: int, rank: int, sp_size: int, device_type: str, key: str):
    """The ``(dp, sp)`` mesh of ``world_size`` ranks: consecutive ranks form a sequence-parallel
    group. Returns ``(dp_size, dp_rank, dp_group, SequenceParallel)``; at ``sp_size`` 1 the data-
    parallel group is the whole world (default group) and the SequenceParallel is None."""
    if sp_size < 1 or world_size % sp_size:
        raise ConfigError(f"{key}={sp_size} must divide the {world_size} ranks of the worker group "
                          "(trainer.nnodes x trainer.n_gpus_per_node, or torchrun's processes)")
    if sp_size == 1:
        return world_size, rank, None, None
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, (world_size // sp_size, sp_size), mesh_dim_names=("dp", "sp"))
    sp = SequenceParallel(size=sp_size, rank=rank % sp_size, group=mesh.get_group("sp"))
    dp_size = world_size // sp_size
    return dp_size, rank // sp_size, (mesh.get_group("dp") if dp_size > 1 else None), sp
