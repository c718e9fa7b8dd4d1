"""Token sampling on the device, with parameters per row: temperature, min-p, top-k, top-p.

For logits ``z`` ``[N, V]`` and row ``i``'s parameters, the sampling distribution is

    p_i = softmax(filter_top_p(filter_top_k(filter_min_p(rep(z_i) / T_i))))

where ``rep`` is the repetition penalty ``r_i`` over the tokens row ``i`` has seen (its prompt and
response so far; Keskar et al. 2019, "CTRL", as vLLM and HF apply it): ``z / r`` where ``z > 0``,
``z * r`` elsewhere, other tokens unchanged (``r = 1``: off).

where each filter sets the logits of removed tokens to ``-inf``: min-p removes tokens whose
probability is below ``min_p`` times the most likely one's (Nguyen et al. 2024, "Turning Up
the Heat: Min-p Sampling"), top-k keeps the ``k`` largest, top-p the smallest set whose mass
reaches ``p`` (Holtzman et al. 2020, "The Curious Case of Neural Text Degeneration"). The
returned log-prob of a sampled token is ``log p_i[token]`` under this processed distribution
(vLLM's ``processed_logprobs``). A greedy row (``T == 0``) takes ``argmax z_i`` and reports
``log softmax(z_i)[token]``.

The rows of one batch may differ in every parameter (requests with their own
``SamplingParams`` decode side by side); all of it runs as tensor ops on the logits' device,
and a filter no row asks for costs nothing. Rows without filters take a one-pass kernel where
there is one (Triton on CUDA, C on CPU for fp32 logits), with the same rule.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from hybridflow.rollout.host_copy import device_tensor
from hybridflow.rollout.optional import package_installed
from hybridflow.rollout.types import SamplingParams


@dataclass
class RowSampling:
    """Per-row sampling parameters as device tensors, each ``[N]``.

    ``top_k`` holds ``V`` (the vocabulary size) where a row keeps every token; the
    ``needs_*`` flags say whether any row uses a filter, so unused ones are skipped.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    greedy: torch.Tensor
    repetition_penalty: torch.Tensor
    all_greedy: bool
    any_greedy: bool
    needs_top_k: bool
    needs_top_p: bool
    needs_min_p: bool
    needs_temperature: bool
    needs_repetition_penalty: bool
    """Whether any row (greedy ones too) has a repetition penalty: sampling then needs each row's seen tokens."""
    params: tuple[SamplingParams, ...] = ()
    vocab_size: int = 0
    groups: tuple[tuple[torch.Tensor, RowSampling], ...] = ()
    """Where rows differ in the filters they ask for (:func:`filter_kind`): ``(row indices [n] on the device, those
    rows' RowSampling)`` per kind, sampled apart, so that a row's token and log-prob come from the path and filters its
    own parameters choose whatever shares its batch (a filter a row does not ask for is not always an exact no-op on
    it: top-p 1.0 may drop a tail token whose mass before it rounds to 1; and the one-pass kernel rounds its log-probs
    otherwise than the torch ops do). Empty when every row asks for the same filters."""

    @classmethod
    def of(cls, params: Sequence[SamplingParams], *, vocab_size: int, device) -> RowSampling:
        """The parameters of ``params[i]`` in row ``i``."""
        rows = cls._columns(params, vocab_size=vocab_size, device=device)
        kinds = [filter_kind(p, vocab_size) for p in params]
        if len(set(kinds)) > 1:
            rows.groups = tuple(
                (device_tensor([i for i, k in enumerate(kinds) if k == kind], dtype=torch.long, device=device),
                 cls._columns([p for p, k in zip(params, kinds) if k == kind], vocab_size=vocab_size, device=device))
                for kind in sorted(set(kinds)))
        return rows

    @classmethod
    def _columns(cls, params: Sequence[SamplingParams], *, vocab_size: int, device) -> RowSampling:
        greedy = [p.greedy for p in params]
        top_k = [vocab_size if p.top_k == -1 else min(p.top_k, vocab_size) for p in params]

        def column(values, dtype=torch.float32):
            return device_tensor(values, dtype=dtype, device=device)

        return cls(
            temperature=column([1.0 if p.greedy else p.temperature for p in params]),
            top_k=column(top_k, torch.long), top_p=column([p.top_p for p in params]),
            min_p=column([p.min_p for p in params]), greedy=column(greedy, torch.bool),
            repetition_penalty=column([p.repetition_penalty for p in params]),
            all_greedy=all(greedy), any_greedy=any(greedy),
            needs_top_k=any(k < vocab_size for k, g in zip(top_k, greedy) if not g),
            needs_top_p=any(p.top_p < 1.0 for p in params if not p.greedy),
            needs_min_p=any(p.min_p > 0.0 for p in params if not p.greedy),
            needs_temperature=any(p.temperature != 1.0 for p in params if not p.greedy),
            needs_repetition_penalty=any(p.repetition_penalty != 1.0 for p in params),
            params=tuple(params), vocab_size=vocab_size,
        )

    def slice(self, start: int, stop: int) -> RowSampling:
        """Rows ``start .. stop - 1`` (a decode lane's share); the flags stay those of the whole batch (the groups
        of rows that ask for different filters are those of the slice)."""
        if start == 0 and stop == self.temperature.shape[0]:
            return self
        if self.groups:
            return RowSampling.of(self.params[start:stop], vocab_size=self.vocab_size, device=self.temperature.device)
        names = ("temperature", "top_k", "top_p", "min_p", "greedy", "repetition_penalty")
        columns = {name: getattr(self, name)[start:stop] for name in names}
        return replace(self, **columns)

    @classmethod
    def uniform(cls, params: SamplingParams, *, rows: int, vocab_size: int, device) -> RowSampling:
        """``rows`` rows that all sample with ``params``."""
        return cls.of([params] * rows, vocab_size=vocab_size, device=device)


def filter_kind(params: SamplingParams, vocab_size: int) -> tuple[bool, bool, bool]:
    """Which of min-p, top-k and top-p a row asks for (none for a greedy row)."""
    if params.greedy:
        return False, False, False
    return params.min_p > 0.0, 0 < params.top_k < vocab_size, params.top_p < 1.0


def seen_mask(seen: Sequence[Sequence[int]], *, vocab_size: int, device) -> torch.Tensor:
    """``[N, V]`` bool: ``True`` at the tokens row ``i`` has seen (``seen[i]``, its prompt and response so far)."""
    mask = torch.zeros(len(seen), vocab_size, dtype=torch.bool, device=device)
    rows = [row for row, ids in enumerate(seen) for _ in ids]
    if rows:
        tokens = [token for ids in seen for token in ids]
        mask[torch.tensor(rows, device=device), torch.tensor(tokens, device=device)] = True
    return mask


def apply_repetition_penalty(*, logits: torch.Tensor, penalty: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
    """Row ``i``'s logits of the tokens it has seen (``seen`` ``[N, V]`` bool, :func:`seen_mask`) penalised by
    ``penalty[i]``: ``z / r`` where ``z > 0``, ``z * r`` elsewhere; a new ``[N, V]`` tensor, on the device, in one
    pass whatever the rows have seen (``logits`` may be a view shared by rows, as an admission wave's first logits
    are)."""
    factor = penalty.to(logits.dtype)[:, None]
    penalised = torch.where(logits > 0, logits / factor, logits * factor)
    return torch.where(seen, penalised, logits)


def filter_min_p(*, logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Remove tokens with ``p < min_p * max p`` per row: ``z < max z + log(min_p)`` (``min_p`` ``[N]``)."""
    threshold = logits.amax(dim=-1, keepdim=True) + torch.log(min_p.clamp(min=1e-30))[:, None]
    return logits.masked_fill((logits < threshold) & (min_p > 0)[:, None], float("-inf"))


def _sorted_filters(*, logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Top-k then top-p over one descending sort of each row (``top_k``, ``top_p`` ``[N]`` or ``None``).

    Top-k keeps every logit >= the row's k-th largest (ties at the k-th value all stay); top-p
    keeps a token while the mass strictly before it, in descending order, is below ``top_p``,
    so the most likely token always survives.
    """
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    if top_k is not None:
        kth_largest = sorted_logits.gather(-1, (top_k - 1)[:, None])
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth_largest, float("-inf"))
    remove_sorted = sorted_logits == float("-inf")
    if top_p is not None:
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        remove_sorted = remove_sorted | (mass_before >= top_p[:, None])
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


def filter_top_k(*, logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the ``top_k`` largest logits of each row ``[N, V]``; ``-1`` keeps all."""
    if top_k == -1 or top_k >= logits.shape[-1]:
        return logits
    return _sorted_filters(logits=logits, top_k=torch.full((logits.shape[0],), top_k, device=logits.device),
                           top_p=None)


def filter_top_p(*, logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose total probability is >= ``top_p``."""
    if top_p >= 1.0:
        return logits
    return _sorted_filters(logits=logits, top_k=None,
                           top_p=torch.full((logits.shape[0],), top_p, device=logits.device))


def processed_logits(*, logits: torch.Tensor, params: SamplingParams | RowSampling) -> torch.Tensor:
    """``[N, V]`` fp32 logits of the sampling distribution (temperature, then min-p, top-k, top-p)."""
    rows = params if isinstance(params, RowSampling) else RowSampling.uniform(
        params, rows=logits.shape[0], vocab_size=logits.shape[-1], device=logits.device)
    scaled = logits.float()
    if rows.needs_temperature:  # dividing by 1 would cost a pass over [N, V] for nothing
        scaled = scaled / rows.temperature[:, None]
    if rows.needs_min_p:
        scaled = filter_min_p(logits=scaled, min_p=rows.min_p)
    if rows.needs_top_k or rows.needs_top_p:
        scaled = _sorted_filters(logits=scaled, top_k=rows.top_k if rows.needs_top_k else None,
                                 top_p=rows.top_p if rows.needs_top_p else None)
    return scaled


def sample_tokens(
    *, logits: torch.Tensor, params: SamplingParams | RowSampling, generator: torch.Generator | None = None,
    uniform: torch.Tensor | None = None, seen: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of ``logits`` ``[N, V]``.

    Args:
        params: one ``SamplingParams`` for every row, or a :class:`RowSampling` per row.
        uniform: ``[N, 1]`` draws from ``U[0, 1)`` (:func:`draw_uniform`) to use instead of
            drawing from ``generator``; lets slices of one batch be sampled apart (in decode
            lanes) with the same numbers as the whole batch.
        seen: ``[N, V]`` bool, the tokens each row has seen so far (:func:`seen_mask`); needed (and only
            read) where a row has a repetition penalty.

    Returns:
        ``(tokens [N] int64, logprobs [N] float32)``, both on the logits' device.
    """
    if logits.device.type == "cpu" and logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()  # a bf16 engine's logits: the CPU sampler runs in fp32 (its kernel takes fp32)
    rows = params if isinstance(params, RowSampling) else RowSampling.uniform(
        params, rows=logits.shape[0], vocab_size=logits.shape[-1], device=logits.device)
    if rows.groups:
        if uniform is None and not rows.all_greedy:  # drawn for the whole batch, in row order, as below
            uniform = draw_uniform(rows=logits.shape[0], generator=generator, device=logits.device)
        return _sample_groups(logits, rows, uniform=uniform, seen=seen)
    if rows.needs_repetition_penalty:
        if seen is None:
            raise ValueError("a row has a repetition penalty: pass the tokens each row has seen (seen=seen_mask(...))")
        logits = apply_repetition_penalty(logits=logits, penalty=rows.repetition_penalty, seen=seen)
    if _fused_sampling_applies(logits, rows):
        if uniform is None:
            uniform = (torch.zeros(logits.shape[0], 1, device=logits.device) if rows.all_greedy
                       else draw_uniform(rows=logits.shape[0], generator=generator, device=logits.device))
        fused = _fused_sample(logits, rows, uniform)
        if fused is not None:
            return fused
    if uniform is None and not rows.all_greedy:
        uniform = draw_uniform(rows=logits.shape[0], generator=generator, device=logits.device)
    return _torch_sample(logits, rows, uniform)


def _sample_groups(logits: torch.Tensor, rows: RowSampling, *, uniform: torch.Tensor | None,
                   seen: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample_tokens` of each group of rows that ask for the same filters (:attr:`RowSampling.groups`) apart,
    put back in row order."""
    tokens = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    logprobs = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for index, group in rows.groups:
        tokens[index], logprobs[index] = sample_tokens(
            logits=logits[index], params=group, uniform=None if uniform is None else uniform[index],
            seen=None if seen is None else seen[index])
    return tokens, logprobs


def _torch_sample(logits: torch.Tensor, rows: RowSampling,
                  uniform: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`sample_tokens` in torch ops (every filter; ``uniform`` may be None when every row is greedy)."""
    if rows.any_greedy:
        greedy = _greedy(logits)
        if rows.all_greedy:
            return greedy
    sampled = _inverse_cdf_sample(logits=processed_logits(logits=logits, params=rows), uniform=uniform)
    if not rows.any_greedy:
        return sampled
    return tuple(torch.where(rows.greedy, g, s) for g, s in zip(greedy, sampled))


_FUSED_SAMPLING = {"cuda": {"enabled": True, "checked": False}, "cpu": {"enabled": True, "checked": False}}
"""The one-pass sampler's state per device type: switched off, with one warning, if it fails to build or if its first draw
disagrees with the torch ops (it is checked once per process, like a kernel that just compiled)."""


def _fused_sampling_applies(logits: torch.Tensor, rows: RowSampling) -> bool:
    """The one-pass sampler serves rows without top-k, top-p or min-p: on CUDA where Triton is installed
    (:mod:`hybridflow.rollout.triton_sampling`), on CPU for fp32 logits (:func:`sample_tokens` casts a bf16 engine's)
    where the C kernels are built (:mod:`hybridflow.rollout.cpu_fused`)."""
    state = _FUSED_SAMPLING.get(logits.device.type)
    if state is None or not state["enabled"] or rows.needs_top_k or rows.needs_top_p or rows.needs_min_p:
        return False
    if logits.is_cuda:
        return package_installed("triton")
    if logits.dtype != torch.float32:
        return False
    from hybridflow.rollout.cpu_fused import available

    return available()


def _fused_sample(logits: torch.Tensor, rows: RowSampling, uniform: torch.Tensor):
    if logits.is_cuda:
        from hybridflow.rollout.triton_sampling import sample_rows
    else:
        from hybridflow.rollout.cpu_fused import sample_rows

    try:
        fused = sample_rows(logits=logits, temperature=rows.temperature, greedy=rows.greedy, uniform=uniform)
    except Exception as error:  # noqa: BLE001 - any build failure: the torch ops give the same draws
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        return _fused_sampling_off(logits.device.type, f"failed ({reason})")
    state = _FUSED_SAMPLING[logits.device.type]
    if not state["checked"]:
        state["checked"] = True
        if not _draws_agree(fused, logits=logits, rows=rows, uniform=uniform):
            return _fused_sampling_off(logits.device.type, "disagreed with the torch ops on its first draw")
    return fused


BOUNDARY_TOLERANCE = 1e-5
"""How close (in cumulative probability) a draw may fall to the edge between two tokens and go either way: the
kernel and torch's ``cumsum`` add ``w`` in different orders, and over a near-flat distribution of 49k+ entries (a
random model's) their fp32 sums differ by more than the gap some draws fall into."""


def _draws_agree(fused: tuple[torch.Tensor, torch.Tensor], *, logits: torch.Tensor, rows: RowSampling,
                 uniform: torch.Tensor) -> bool:
    """Whether the one-pass sampler's draws are the torch ops' (:func:`_torch_sample`): the same tokens, or, on a
    sampled row, a token whose CDF interval (in fp64) holds the draw to within :data:`BOUNDARY_TOLERANCE`; and
    each token's log-prob within 1e-3 of the fp64 one."""
    tokens, logprobs = fused
    reference = _torch_sample(logits, rows, uniform)[0]
    differ = (tokens != reference).nonzero().flatten()
    z = processed_logits(logits=logits, params=rows).double()  # greedy rows: temperature 1, no filters here
    for row in differ.tolist():
        if bool(rows.greedy[row]):
            return False
        cdf = torch.softmax(z[row], dim=-1).cumsum(-1)
        token, u = int(tokens[row]), float(uniform[row])
        lower = float(cdf[token - 1]) if token > 0 else 0.0
        if not lower - BOUNDARY_TOLERANCE <= u <= float(cdf[token]) + BOUNDARY_TOLERANCE:
            return False
    expected = torch.log_softmax(z, -1).gather(-1, tokens[:, None]).squeeze(-1)
    return torch.allclose(logprobs.double(), expected, atol=1e-3)


def _fused_sampling_off(device_type: str, reason: str) -> None:
    logging.getLogger(__name__).warning("the one-pass %s sampling kernel %s; sampling with torch ops",
                                        device_type, reason)
    _FUSED_SAMPLING[device_type]["enabled"] = False
    return None


def _greedy(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = logits.argmax(dim=-1)
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)


def draw_uniform(*, rows: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """``[rows, 1]`` fp32 draws from ``U[0, 1)``, one per sampled row."""
    return torch.rand(rows, 1, generator=generator, device=device, dtype=torch.float32)


def _inverse_cdf_sample(*, logits: torch.Tensor, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One draw per row of ``softmax(logits)`` ``[N, V]`` by inverting its CDF at ``uniform`` ``[N, 1]``.

    With ``m = max z`` and ``w = exp(z - m)``, the token is the first index whose running
    sum of ``w`` exceeds ``u * sum(w)``, and its log-prob is ``z[token] - m - log sum(w)``.
    Four passes over ``[N, V]`` (max, subtract, exp, cumulative sum), where
    ``torch.multinomial`` draws an exponential variate per vocabulary entry, which on CPU
    costs more than a decode step's attention. ``right=True`` never selects a
    zero-probability (filtered, ``-inf``) token.
    """
    peak = logits.amax(dim=-1, keepdim=True)
    cdf = (logits - peak).exp_().cumsum_(dim=-1)
    total = cdf[:, -1:]
    tokens = torch.searchsorted(cdf, uniform * total, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)
    logprobs = logits.gather(-1, tokens[:, None]) - peak - total.log()
    return tokens, logprobs.squeeze(-1)


_MASK64 = (1 << 64) - 1


def _signed64(value: int) -> int:
    """``value`` mod 2**64 as the int64 with the same bits."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN, _MIX1, _MIX2 = (_signed64(c) for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` on int64 is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _splitmix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser (Steele et al. 2014) on int64 ``[N]``, multiplications wrapping mod 2**64."""
    x = (x ^ _shift_right(x, 30)) * _MIX1
    x = (x ^ _shift_right(x, 27)) * _MIX2
    return x ^ _shift_right(x, 31)


def keyed_uniform(keys: torch.Tensor) -> torch.Tensor:
    """``[N, 1]`` fp32 draws from ``U[0, 1)``, each a function of its row's key alone.

    ``keys`` ``[N, 3]`` int64 holds ``(seed, sample index, token index)``; the draw is
    ``h >> 40`` scaled by ``2**-24`` with ``h = mix(mix(mix(seed) + sample) + token)``, ``mix``
    SplitMix64's finaliser (``+`` adds the golden-ratio increment too). A token's draw then does
    not depend on which other rows share its decode step, on when its request was admitted, or
    on a preemption: what a request samples is fixed by its seed and its inputs.
    """
    h = keys[:, 0]
    for column in (1, 2):
        h = _splitmix64(h + _GOLDEN) + keys[:, column]
    h = _splitmix64(h + _GOLDEN)
    return (_shift_right(h, 40).to(torch.float32) * 2.0**-24)[:, None]
