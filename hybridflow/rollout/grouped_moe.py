"""DeepSeek-V3's (and GLM-4.5's) mixture of experts for the native decoder: sigmoid scores, group-limited top-k
routing, and shared experts beside the routed ones.

Routing, exactly as HF's ``DeepseekV3TopkRouter`` / ``Glm4MoeTopkRouter`` compute it (DeepSeek-AI 2024,
"DeepSeek-V3 Technical Report", sec. 2.1.2), in fp32:

    s = sigmoid(x W_r^T)                        [N, E] affinities
    c = s + b                                   the load-balancing bias ``e_score_correction_bias``, for choosing only
    g = sum of the top 2 of c in each group     [N, n_group]; the ``topk_group`` best groups stay, the rest -> -inf
    e = topk(c over the kept groups, k)         expert ids
    w = s[e] (/ sum_k s[e] + 1e-20 with ``norm_topk_prob``) * ``routed_scaling_factor``
    y = sum_k w_k * expert_e(x) + shared(x)

The routed experts run grouped by expert (:func:`hybridflow.rollout.moe.run_experts`: the C kernel of
:mod:`hybridflow.rollout.cpu_moe` on CPU in fp32, Triton's grouped GEMMs in a graph-safe CUDA step, else torch ops); the
shared experts and the dense first layers (``first_k_dense_replace``) are the HF module's own MLPs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hybridflow.rollout.cpu_moe import KernelExperts, kernel_experts, routed_experts
from hybridflow.rollout.moe import ExpertWeights, run_experts


@dataclass
class GroupedMoE:
    """One sparse layer: its router (the module's tensors), the packed routed experts and the shared MLP module."""

    router: torch.Tensor
    """``[E, hidden]`` the router's weight."""
    correction_bias: torch.Tensor
    """``[E]`` added to the scores when choosing experts, never to the weights."""
    groups: int
    topk_group: int
    top_k: int
    norm_topk_prob: bool
    scaling: float
    experts: ExpertWeights
    shared: torch.nn.Module
    with_shared: KernelExperts | None = None
    """The C kernel's layout of the routed experts plus the shared MLP as one more expert (index ``E``, weight 1 for
    every token): one call for the whole sparse MLP on CPU (:func:`shared_as_expert`); ``None`` where it does not
    apply."""


def is_grouped_moe(mlp) -> bool:
    """Whether an HF layer's MLP is a DeepSeek-style sparse block (router with a correction bias, shared experts)."""
    return hasattr(getattr(mlp, "gate", None), "e_score_correction_bias") and hasattr(mlp, "shared_experts")


def grouped_moe_weights(mlp) -> GroupedMoE:
    """The :class:`GroupedMoE` of an HF ``DeepseekV3MoE`` / ``Glm4MoeMoE`` block (expert copies packed now: build it
    again after the weights change)."""
    gate = mlp.gate
    experts = ExpertWeights(router=gate.weight, gate_up=mlp.experts.gate_up_proj, down=mlp.experts.down_proj,
                            top_k=gate.top_k, renormalize=False, weights_in_activation_dtype=False)
    return GroupedMoE(router=gate.weight, correction_bias=gate.e_score_correction_bias, groups=gate.num_group,
                      topk_group=gate.topk_group, top_k=gate.top_k, norm_topk_prob=bool(gate.norm_topk_prob),
                      scaling=float(gate.routed_scaling_factor), experts=experts, shared=mlp.shared_experts,
                      with_shared=shared_as_expert(experts, mlp.shared_experts))


def shared_as_expert(experts: ExpertWeights, shared) -> KernelExperts | None:
    """The routed experts ``[E, 2 I, hidden]`` / ``[E, hidden, I]`` and the shared MLP (``gate_proj`` / ``up_proj`` /
    ``down_proj`` without biases, the same activation as HF's experts, ``n_shared_experts * I`` wide) stacked as
    ``E + 1`` experts in the kernel's layout, where the kernel runs and the widths agree (one shared expert)."""
    if experts.cpu_kernel is None or not all(hasattr(shared, name) for name in ("gate_proj", "up_proj", "down_proj")):
        return None
    projections = (shared.gate_proj, shared.up_proj, shared.down_proj)
    if any(p.bias is not None for p in projections) or shared.down_proj.weight.shape != experts.down.shape[1:]:
        return None
    gate_up = torch.cat([shared.gate_proj.weight, shared.up_proj.weight]).detach()
    return kernel_experts(torch.cat([experts.gate_up.detach(), gate_up[None]]),
                          torch.cat([experts.down.detach(), shared.down_proj.weight.detach()[None]]), None, None, None)


def grouped_route(hidden: torch.Tensor, moe: GroupedMoE) -> tuple[torch.Tensor, torch.Tensor]:
    """``hidden`` ``[N, hidden]`` -> fp32 routing weights ``[N, k]`` and expert ids ``[N, k]`` (module doc)."""
    scores = F.linear(hidden.float(), moe.router.float()).sigmoid()
    choice = scores + moe.correction_bias
    experts = choice.shape[-1]
    group_scores = choice.view(-1, moe.groups, experts // moe.groups).topk(2, dim=-1)[0].sum(dim=-1)
    kept = torch.topk(group_scores, k=moe.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, kept, 1).bool()
    expert_mask = group_mask[:, :, None].expand(-1, -1, experts // moe.groups).reshape(-1, experts)
    ids = torch.topk(choice.masked_fill(~expert_mask, float("-inf")), k=moe.top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, ids)
    if moe.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * moe.scaling, ids


def grouped_moe_mlp(hidden: torch.Tensor, moe: GroupedMoE, activation, *, graph_safe: bool = False) -> torch.Tensor:
    """The sparse MLP of ``hidden`` ``[N, hidden]``: the routed experts' weighted sum plus the shared experts;
    ``graph_safe``: static shapes, no host values (each pair gathers its expert's weights)."""
    weights, ids = grouped_route(hidden, moe)
    if moe.with_shared is not None and not graph_safe:  # the C kernel on CPU: the shared MLP as expert E, weight 1
        shared = torch.full_like(ids[:, :1], moe.experts.gate_up.shape[0])
        everything = routed_experts(hidden, torch.cat([weights, torch.ones_like(weights[:, :1])], dim=1),
                                    torch.cat([ids, shared], dim=1), moe.with_shared, activation)
        if everything is not None:
            return everything
    return run_experts(hidden, weights, ids, moe.experts, activation, graph_safe=graph_safe) + moe.shared(hidden)
