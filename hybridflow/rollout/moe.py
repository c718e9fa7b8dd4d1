"""Top-k routed mixture-of-experts MLP for the native decoder (Mixtral, Qwen3-MoE).

Routing, exactly as HF computes it (Jiang et al. 2024, "Mixtral of Experts"; Qwen3 technical report):

    p = softmax(x W_r^T)            in fp32, [N, E]
    (w, e) = topk(p, k)             [N, k] weights and expert ids
    w = w / sum_k w                 Mixtral always; Qwen3-MoE only with ``norm_topk_prob``
    y = sum_k w_k * down_e(act(gate_e(x)) * up_e(x))

Qwen3-MoE casts ``w`` to the activations' dtype before the experts; Mixtral keeps it fp32 and casts the
weighted expert output. gpt-oss (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b model card") routes by the k largest
logits of a router with a bias, ``w = softmax(topk(x W_r^T + b_r))`` in the activations' dtype, and its experts
have biases and a clamped SwiGLU over interleaved gate / up columns (:func:`clamped_swiglu`).

The experts run grouped, never one token at a time. On CPU in fp32 one C call does it all
(:mod:`hybridflow.rollout.cpu_moe`); otherwise the ``N * k`` (token, expert) pairs are sorted by
expert and each expert multiplies one contiguous slice of rows (:func:`grouped_experts`: one host sync
for the slice sizes), by its weights packed for oneDNN on a CPU (:class:`PackedLinear`: 1.7x faster than
``F.linear`` at 4 rows of Mixtral-tiny's ``[1408, 256]``, one packed copy of the experts as the cost; elsewhere
the module's own tensors). A graph-safe decode step (static shapes, no host values) runs, on CUDA with Triton,
two grouped GEMMs that read each used expert's weights about once (:mod:`hybridflow.rollout.triton_moe`);
elsewhere it gathers each pair's expert weights and runs one batched matmul (:func:`gathered_experts`: fine for
tiny CPU models, ``[N k, 2 I, hidden]`` bytes a layer, so never for a real MoE on a GPU).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from hybridflow.rollout.cpu_moe import KernelExperts, kernel_experts, routed_experts
from hybridflow.rollout.optional import package_installed
from hybridflow.rollout.packed_linear import PackedLinear


@dataclass
class ExpertWeights:
    """One MoE layer: the router and the stacked expert weights (the HF module's own tensors)."""

    router: torch.Tensor
    """``[E, hidden]`` routing logits' weight."""
    gate_up: torch.Tensor
    """``[E, 2 I, hidden]`` each expert's gate then up projection."""
    down: torch.Tensor
    """``[E, hidden, I]`` each expert's down projection."""
    top_k: int
    renormalize: bool
    weights_in_activation_dtype: bool
    """Qwen3-MoE casts the routing weights to the activations' dtype before the experts."""
    # issue 58 (gpt-oss):
    router_bias: torch.Tensor | None = None
    """``[E]`` added to the routing logits (gpt-oss)."""
    gate_up_bias: torch.Tensor | None = None
    """``[E, 2 I]`` each expert's gate / up bias (gpt-oss)."""
    down_bias: torch.Tensor | None = None
    """``[E, hidden]`` each expert's down bias (gpt-oss)."""
    softmax_over_top_k: bool = False
    """gpt-oss: the routing weights are the softmax of the k selected logits (in their dtype)."""
    gated: Callable[[torch.Tensor], torch.Tensor] | None = None
    """``[rows, 2 I]`` -> ``[rows, I]`` in place of ``act(gate) * up`` over the two halves (gpt-oss:
    :func:`clamped_swiglu`)."""
    clamp: tuple[float, float] | None = None
    """gpt-oss's ``(alpha, limit)`` of :func:`clamped_swiglu`, for the C kernel (issue 58)."""
    cpu_kernel: KernelExperts | None = field(init=False)
    """The experts in the C kernel's layout (fp32 on CPU with the kernels built, :mod:`hybridflow.rollout.cpu_moe`):
    what :func:`moe_mlp` runs there; ``None`` elsewhere."""
    triton_grouped: bool = field(init=False)
    """Whether the graph-safe path runs the Triton grouped GEMMs (:mod:`hybridflow.rollout.triton_moe`): weights on
    CUDA with Triton installed. Tests set it on CPU to run the kernels through Triton's interpreter."""

    def __post_init__(self):
        self.triton_grouped = self.gate_up.device.type == "cuda" and package_installed("triton")
        self.cpu_kernel = kernel_experts(self.gate_up, self.down, self.gate_up_bias, self.down_bias, self.clamp)

    @functools.cached_property
    def gate_up_linears(self) -> list[PackedLinear]:
        """Each expert's gate / up projection as :class:`PackedLinear` (what :func:`grouped_experts` multiplies by;
        packed at first use, so a layer the C kernel runs keeps one copy of its experts)."""
        return [PackedLinear(weight, _row(self.gate_up_bias, e)) for e, weight in enumerate(self.gate_up)]

    @functools.cached_property
    def down_linears(self) -> list[PackedLinear]:
        return [PackedLinear(weight, _row(self.down_bias, e)) for e, weight in enumerate(self.down)]


def _row(tensor: torch.Tensor | None, index: int) -> torch.Tensor | None:
    return None if tensor is None else tensor[index]


def expert_weights(mlp, renormalize: str) -> ExpertWeights:
    """The :class:`ExpertWeights` of an HF sparse-MoE block (``mlp.gate`` router, ``mlp.experts`` with 3-D
    ``gate_up_proj`` / ``down_proj``); ``renormalize`` is the table's ``moe_renormalize``."""
    if renormalize == "top_k_logits":
        return gpt_oss_expert_weights(mlp)
    gate = mlp.gate
    qwen = renormalize == "norm_topk_prob"
    return ExpertWeights(router=gate.weight, gate_up=mlp.experts.gate_up_proj, down=mlp.experts.down_proj,
                         top_k=gate.top_k, renormalize=bool(gate.norm_topk_prob) if qwen else True,
                         weights_in_activation_dtype=qwen)


def gpt_oss_expert_weights(mlp) -> ExpertWeights:
    """gpt-oss's block (``mlp.router`` with a bias, ``mlp.experts`` stored ``[E, in, out]`` with biases): views of the
    module's own tensors in the ``[E, out, in]`` layout the experts multiply by."""
    experts, router = mlp.experts, mlp.router
    return ExpertWeights(router=router.weight, gate_up=experts.gate_up_proj.transpose(1, 2),
                         down=experts.down_proj.transpose(1, 2), top_k=router.top_k, renormalize=False,
                         weights_in_activation_dtype=True, router_bias=router.bias,
                         gate_up_bias=experts.gate_up_proj_bias, down_bias=experts.down_proj_bias,
                         softmax_over_top_k=True, clamp=(experts.alpha, experts.limit),
                         gated=functools.partial(clamped_swiglu, alpha=experts.alpha, limit=experts.limit))


def clamped_swiglu(gate_up: torch.Tensor, *, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss's gate over interleaved columns ``[g0, u0, g1, u1, ...]`` ``[rows, 2 I]`` -> ``[rows, I]``:
    ``g = min(g, limit)``, ``u = clamp(u, -limit, limit)``, ``(u + 1) * g * sigmoid(alpha g)``."""
    gate = gate_up[..., ::2].clamp(max=limit)
    up = gate_up[..., 1::2].clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def route(hidden: torch.Tensor, experts: ExpertWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """``hidden`` ``[N, hidden]`` -> routing weights ``[N, k]`` and expert ids ``[N, k]`` (see module doc)."""
    logits = F.linear(hidden, experts.router, experts.router_bias)
    if experts.softmax_over_top_k:
        top, ids = torch.topk(logits, experts.top_k, dim=-1)
        return torch.softmax(top, dim=-1, dtype=top.dtype), ids
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, experts.top_k, dim=-1)
    if experts.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if experts.weights_in_activation_dtype:
        weights = weights.to(logits.dtype)
    return weights, ids


def moe_mlp(hidden: torch.Tensor, experts: ExpertWeights, activation: Callable, *, graph_safe: bool = False
            ) -> torch.Tensor:
    """The routed MLP of ``hidden`` ``[N, hidden]`` -> ``[N, hidden]``; ``graph_safe``: static shapes, no host
    values (the Triton grouped GEMMs for SwiGLU experts where :attr:`ExpertWeights.triton_grouped`). Otherwise on CPU
    the C kernel where it applies (:func:`routed_experts`; an opaque host call, so never in the traceable step)."""
    return run_experts(hidden, *route(hidden, experts), experts, activation, graph_safe=graph_safe)


def run_experts(hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
                activation: Callable, *, graph_safe: bool = False) -> torch.Tensor:
    """``sum_k weights[n, k] * expert_{ids[n, k]}(hidden[n])`` by the fastest path that applies (:func:`moe_mlp`)."""
    fused = None if graph_safe else routed_experts(hidden, weights, ids, experts.cpu_kernel, activation)
    if fused is not None:
        return fused
    plain_swiglu = activation is F.silu and experts.gated is None and experts.gate_up_bias is None
    if graph_safe and experts.triton_grouped and plain_swiglu:
        from hybridflow.rollout.triton_moe import grouped_swiglu_experts  # Triton only where it runs

        return grouped_swiglu_experts(hidden, weights, ids, experts.gate_up, experts.down)
    run = gathered_experts if graph_safe else grouped_experts
    return run(hidden, weights, ids, experts, activation)


def _glu(gate_up: torch.Tensor, experts: ExpertWeights, activation: Callable) -> torch.Tensor:
    """``[rows, 2 I]`` -> ``[rows, I]``: ``act(gate) * up`` over the halves, or the experts' own gate."""
    if experts.gated is not None:
        return experts.gated(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return activation(gate) * up


def grouped_experts(hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
                    activation: Callable) -> torch.Tensor:
    """Sort the ``N * k`` pairs by expert; each expert with rows runs two matmuls over its contiguous
    slice; the weighted outputs are summed back per token (``index_add``)."""
    top_k = ids.shape[1]
    flat_ids = ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    tokens = order // top_k
    counts = torch.bincount(flat_ids, minlength=experts.router.shape[0]).tolist()
    outputs = [experts.down_linears[e](_glu(experts.gate_up_linears[e](rows), experts, activation))
               for e, rows in enumerate(hidden[tokens].split(counts)) if counts[e]]
    weighted = torch.cat(outputs) * weights.reshape(-1)[order, None]
    return torch.zeros_like(hidden).index_add_(0, tokens, weighted.to(hidden.dtype))


def gathered_experts(hidden: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts: ExpertWeights,
                     activation: Callable) -> torch.Tensor:
    """Static shapes: each (token, expert) pair gathers its expert's weights ``[N k, 2I, hidden]`` and
    ``[N k, hidden, I]``, one batched matmul each; the ``k`` weighted outputs of a token are summed."""
    count, top_k = ids.shape
    flat_ids = ids.reshape(-1)
    rows = hidden.repeat_interleave(top_k, dim=0)[:, :, None]  # [N k, hidden, 1]
    gate_up = torch.bmm(experts.gate_up[flat_ids], rows).squeeze(-1)
    if experts.gate_up_bias is not None:
        gate_up = gate_up + experts.gate_up_bias[flat_ids]
    out = torch.bmm(experts.down[flat_ids], _glu(gate_up, experts, activation)[:, :, None]).squeeze(-1)
    if experts.down_bias is not None:
        out = out + experts.down_bias[flat_ids]
    weighted = (out * weights.reshape(-1, 1)).to(hidden.dtype)
    return weighted.view(count, top_k, -1).sum(dim=1)
