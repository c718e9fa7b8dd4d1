"""The reference policy: frozen weights whose log-probs anchor the KL term.

Built from a frozen copy of the initial policy, or (with LoRA) from the actor's own
module with the adapter disabled, so no second model sits in memory.
"""

from __future__ import annotations

import contextlib

import torch

from hybridflow.data.batch import Batch
from hybridflow.errors import ConfigError
from hybridflow.workers.logprob import batch_log_probs


class ReferenceWorker:
    """Log-probs of responses under fixed weights; ``adapter_off`` is a context manager
    that switches a shared LoRA model to its base weights (None for a separate copy)."""

    def __init__(self, *, model: torch.nn.Module, micro_batch_size: int | None = None, use_dynamic_bsz: bool = False,
                 max_token_len: int | None = None, adapter_off=None, dp=None, layout: str = "padded",
                 use_torch_compile: bool = False, chunked_head: bool = False):
        self.model = model
        self.chunked_head = chunked_head
        self.layout = layout
        self.use_torch_compile = use_torch_compile
        self.dp = dp
        self.micro_batch_size = micro_batch_size
        self.use_dynamic_bsz = use_dynamic_bsz
        self.max_token_len = max_token_len
        self.adapter_off = adapter_off or contextlib.nullcontext
        for param in ([] if adapter_off else model.parameters()):
            param.requires_grad_(False)

    def compute_ref_log_prob(self, batch: Batch, *, temperature: float) -> torch.Tensor:
        """log pi_ref(response token) ``[B, T]``."""
        with self.adapter_off():
            log_probs, _ = batch_log_probs(self.model, batch, temperature=temperature,
                                           micro_batch_size=self.micro_batch_size,
                                           use_dynamic_bsz=self.use_dynamic_bsz, max_token_len=self.max_token_len,
                                           dp=self.dp, layout=self.layout, use_torch_compile=self.use_torch_compile,
                                           chunked_head=self.chunked_head)
        return log_probs

    def load_weights_from(self, model: torch.nn.Module) -> None:
        """Make the reference a copy of ``model``'s current weights (SPIN / SPPO start a new iteration).

        Both models are sharded alike (or not at all), so this copies local shards only."""
        if self.adapter_off is not contextlib.nullcontext:
            raise ConfigError("a LoRA reference is the actor with its adapter off and cannot be refreshed; "
                             "set actor_rollout_ref.model.lora_rank=0 or trainer.ref_update_freq=-1")
        self.model.load_state_dict(model.state_dict())

