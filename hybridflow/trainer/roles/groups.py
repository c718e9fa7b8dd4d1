"""The group workers of the PPO roles: each composes plain workers and declares its dispatch modes.

The plain workers (``hybridflow.workers``) stay free of distribution concerns; only the group
workers below are ever built as worker groups. :class:`HybridEngineWorker` composes the
actor, rollout engine and reference of one rank (the HybridFlow paper's "3D-HybridEngine",
verl's ``ActorRolloutRefWorker``): the same process trains with sharded weights and
generates with full weights, and moving weights from one to the other is an all-gather
in memory, never a disk round trip.
"""

from __future__ import annotations

from hybridflow.controller.dispatch import Mode, dispatch
from hybridflow.data.batch import Batch
from hybridflow.models.fsdp import full_state_dict
from hybridflow.models.lora import is_lora_model, lora_scaling, merged_state_dict
from hybridflow.workers.actor import ActorWorker
from hybridflow.workers.critic import CriticWorker
from hybridflow.workers.implicit_prm import ImplicitPRMWorker
from hybridflow.workers.reference import ReferenceWorker

class CheckpointedRank:
    """Save / load of one rank's ``self.checkpoint`` component, called on every rank with the same directory."""

    checkpoint = None

    @dispatch(Mode.ONE_TO_ALL, collect="first")
    def save_checkpoint(self, directory: str) -> None:
        self.checkpoint.save_to(directory)

    @dispatch(Mode.ONE_TO_ALL, collect="first")
    def load_checkpoint(self, directory: str) -> None:
        self.checkpoint.load_from(directory)


class HybridEngineWorker(CheckpointedRank):
    """Actor + rollout + (optional) reference of one rank; also checkpointable as a whole.

    ``checkpoint``: a component with ``save_to(dir)``/``load_from(dir)`` for the actor
    (e.g. ``FSDPModelComponent``), called on every rank with the same directory.
    """

    def __init__(self, *, actor: ActorWorker, rollout=None, reference: ReferenceWorker | None = None,
                 checkpoint=None, reference_checkpoint=None, teacher=None):
        self.actor, self.rollout, self.reference, self.checkpoint = actor, rollout, reference, checkpoint
        self.teacher = teacher  # distillation teachers (hybridflow.workers.teacher), or None
        self.reference_checkpoint = reference_checkpoint  # the reference's own weights (None: shared with the actor)

    @dispatch(Mode.DP_COMPUTE)
    def compute_log_prob(self, batch: Batch, *, temperature: float):
        return self.actor.compute_log_prob(batch, temperature=temperature)

    @dispatch(Mode.DP_COMPUTE, collect="mean")
    def update_policy(self, batch: Batch, *, temperature: float, step: int) -> dict[str, float]:
        return self.actor.update_policy(batch, temperature=temperature, step=step)

    @dispatch(Mode.DP_COMPUTE, collect="mean")
    def update_preference(self, batch: Batch, **kwargs) -> dict[str, float]:
        return self.actor.update_preference(batch, **kwargs)

    @dispatch(Mode.DP_COMPUTE)
    def compute_ref_log_prob(self, batch: Batch, *, temperature: float):
        return self.reference.compute_ref_log_prob(batch, temperature=temperature)

    @dispatch(Mode.DP_COMPUTE)
    def compute_teacher_log_prob(self, batch: Batch):
        return self.teacher.compute_teacher_log_prob(batch)

    @dispatch(Mode.ONE_TO_ALL, collect="first")
    def refresh_reference(self) -> None:
        """Reference <- current actor weights, shard by shard on every rank (SPIN / SPPO iterations)."""
        self.reference.load_weights_from(self.actor.model)

    @dispatch(Mode.ONE_TO_ALL, collect="first")
    def save_reference(self, directory: str) -> None:
        self.reference_checkpoint.save_to(directory)

    @dispatch(Mode.ONE_TO_ALL, collect="first")
    def load_reference(self, directory: str) -> None:
        self.reference_checkpoint.load_from(directory)

    @dispatch(Mode.DP_COMPUTE)
    def generate(self, prompts: Batch, params, partial: bool = False) -> Batch:
        """``partial``: a weight sync may pause it between two decode steps (``RolloutWorker.generate``)."""
        return self.rollout.generate(prompts, params, partial=partial)

    @dispatch(Mode.ONE_TO_ALL, collect="first")
    def sync_rollout_weights(self, version: int | None = None) -> None:
        """Rollout engine <- the colocated actor's current weights, gathered in memory on every rank
        (no tensor moves through the driver, no disk round trip; LoRA folded in); ``version`` tags them."""
        self.rollout.load_weights(actor_weights_for_rollout(self.actor.model).items(), version=version)

    @dispatch(Mode.ONE_TO_ALL, collect="first")
    def rollout_weights(self) -> dict:
        """The weights a rollout engine needs (LoRA folded in), gathered on every rank; rank 0's copy is the answer
        (split placement: ``call_by_reference`` leaves it in Ray's store for the rollout group to read)."""
        return actor_weights_for_rollout(self.actor.model)

    @dispatch(Mode.ONE_TO_ALL, collect="first")
    def full_weights(self) -> dict:
        """The unsharded actor weights (every rank gathers; rank 0's copy comes back)."""
        return full_state_dict(self.actor.model)

    @dispatch(Mode.ONE_TO_ALL, collect="first")
    def load_weights(self, named) -> None:
        """Into this rank's engine: given (name, tensor)s or a ``{name: tensor}`` dict."""
        if isinstance(named, dict):
            named = named.items()
        self.rollout.load_weights(named)



def actor_weights_for_rollout(model) -> dict:
    """The actor's full weights by HF name; with LoRA, the adapter folded in (W + alpha/r B A)."""
    weights = full_state_dict(model)
    return merged_state_dict(weights, scaling=lora_scaling(model)) if is_lora_model(model) else weights


class RolloutGroupWorker:
    """A rollout engine in its own process (split placement): generates, and takes the training group's weights."""

    def __init__(self, *, rollout):
        self.rollout = rollout

    @dispatch(Mode.DP_COMPUTE)
    def generate(self, prompts: Batch, params, partial: bool = False) -> Batch:
        """``partial``: a weight sync (``load_weights``, run by a second thread of this rank's actor) may pause
        it between two decode steps."""
        return self.rollout.generate(prompts, params, partial=partial)

    @dispatch(Mode.ONE_TO_ALL, collect="first")
    def load_weights(self, named, version: int | None = None) -> None:
        """Given a ``{name: tensor}`` dict (the training group's ``rollout_weights()``); ``version`` tags them."""
        self.rollout.load_weights(named.items() if isinstance(named, dict) else named, version=version)


class GroupCheckpoint:
    """A worker group as one checkpoint component: every rank saves/loads its shards.

    ``save`` / ``load`` name the group's methods (the reference of a hybrid engine has its own)."""

    def __init__(self, group, *, save: str = "save_checkpoint", load: str = "load_checkpoint"):
        self.group, self.save, self.load = group, save, load

    def save_to(self, directory: str) -> None:
        getattr(self.group, self.save)(directory)

    def load_from(self, directory: str) -> None:
        getattr(self.group, self.load)(directory)


class CriticGroupWorker(CheckpointedRank):
    """The critic of one rank (FSDP2-sharded value model) plus its checkpoint component."""

    def __init__(self, *, critic: CriticWorker, checkpoint):
        self.critic, self.checkpoint = critic, checkpoint

    @dispatch(Mode.DP_COMPUTE)
    def compute_values(self, batch: Batch):
        return self.critic.compute_values(batch)

    @dispatch(Mode.DP_COMPUTE, collect="mean")
    def update_critic(self, batch: Batch, *, step: int = 0) -> dict[str, float]:
        return self.critic.update_critic(batch, step=step)



class ImplicitPRMGroupWorker(CheckpointedRank):
    """PRIME's implicit PRM of one rank (FSDP2-sharded causal LM) plus its checkpoint component."""

    def __init__(self, *, prm: ImplicitPRMWorker, checkpoint):
        self.prm, self.checkpoint = prm, checkpoint

    @dispatch(Mode.DP_COMPUTE)
    def compute_prm_log_probs(self, batch: Batch, *, temperature: float):
        return self.prm.compute_prm_log_probs(batch, temperature=temperature)

    @dispatch(Mode.DP_COMPUTE, collect="mean")
    def update_prm(self, batch: Batch, *, temperature: float, step: int) -> dict[str, float]:
        return self.prm.update_prm(batch, temperature=temperature, step=step)
