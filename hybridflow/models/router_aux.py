"""The mixture-of-experts router's load-balancing loss, carried into the actor's loss where the HF model gives one.

An HF MoE causal LM (Mixtral, Qwen3-MoE) adds ``router_aux_loss_coef * L_aux`` to its LM loss when its config
sets ``output_router_logits``; ``L_aux`` is Switch Transformer's balance term (Fedus et al. 2021, eqs. 4-6):

    L_aux = E * sum_e f_e * P_e

with ``f_e`` the fraction of (token, top-k slot) assignments routed to expert ``e`` and ``P_e`` the mean router
probability of ``e``, both over every layer's tokens (padding excluded). hybridflow's forwards compute only the
response tokens' log-probs, so the HF model never sees labels: the router logits are recorded by hooks on the
module class the model itself declares for them (``_can_record_outputs["router_logits"]``) and ``L_aux`` is
HF's own ``load_balancing_loss_func`` of the model's module, with the padded batch's 2-D attention mask (a
packed row has no padding: no mask). The model's own computation is switched off in every forward
(:func:`router_forward_kwargs`): its packed row carries a placeholder mask that function cannot read.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch


def _moe_model(model: torch.nn.Module):
    """The HF model inside ``model`` (wrappers included) that records router logits, or None."""
    return next((m for m in model.modules() if "router_logits" in (getattr(m, "_can_record_outputs", None) or {})
                 and hasattr(getattr(m, "config", None), "output_router_logits")), None)


def router_forward_kwargs(model: torch.nn.Module) -> dict:
    """Forward kwargs that keep an MoE model from computing its own router loss (see module doc); {} otherwise."""
    return {"output_router_logits": False} if hasattr(getattr(model, "config", None), "output_router_logits") else {}


@dataclass
class RouterLogits:
    """What one forward recorded: each MoE layer's router logits ``[tokens, E]`` and the 2-D mask, if any."""

    coef: float
    num_experts: int
    top_k: int
    loss_fn: object
    logits: list[torch.Tensor] = field(default_factory=list)
    attention_mask: torch.Tensor | None = None

    def loss(self) -> torch.Tensor:
        """``L_aux`` of the recorded forward (HF's ``load_balancing_loss_func``)."""
        return self.loss_fn(tuple(self.logits), self.num_experts, self.top_k, self.attention_mask)


@contextlib.contextmanager
def record_router_logits(model: torch.nn.Module) -> Iterator[RouterLogits | None]:
    """Inside, forwards of ``model`` record router logits; yields None for a model that gives no router loss
    (dense, or ``output_router_logits`` off)."""
    moe = _moe_model(model)
    if moe is None or not moe.config.output_router_logits:
        yield None
        return
    recorder = moe._can_record_outputs["router_logits"]
    config = moe.config
    record = RouterLogits(coef=config.router_aux_loss_coef, top_k=config.num_experts_per_tok,
                          num_experts=getattr(config, "num_local_experts", None) or config.num_experts,
                          loss_fn=sys.modules[type(moe).__module__].load_balancing_loss_func)

    def keep_logits(module, args, output):
        record.logits.append(output[recorder.index] if isinstance(output, tuple) else output)

    def keep_mask(module, args, kwargs):
        mask = kwargs.get("attention_mask")
        record.attention_mask = mask if mask is not None and mask.dim() == 2 else None

    handles = [m.register_forward_hook(keep_logits) for m in moe.modules() if isinstance(m, recorder.target_class)]
    handles.append(moe.register_forward_pre_hook(keep_mask, with_kwargs=True))
    try:
        yield record
    finally:
        for handle in handles:
            handle.remove()
