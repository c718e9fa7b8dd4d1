"""Keys whose meaning changed between verl versions: which one hybridflow follows, and the one line it says.

- ``actor.grad_clip`` / ``critic.grad_clip``: verl before 0.9 clipped with them (``dp_actor`` / ``dp_critic``); verl
  0.9's engine reads ``optim.clip_grad`` (its deprecated spelling ``optim.grad_clip`` wins when set) and ignores
  the role key. A role ``grad_clip`` that a user moved off verl's default follows the version it comes from (it
  clips), with one line saying verl 0.9 would not; moved off together with ``optim.clip_grad`` to another value,
  the two versions disagree and the run is refused in one line.
- ``actor.clip_ratio``: verl 0.9's ``actor.yaml`` sets ``clip_ratio_low`` / ``clip_ratio_high`` to 0.2 and those
  win, so ``clip_ratio`` alone changes nothing; hybridflow follows verl 0.9 and says so once.

Each line is logged once per process (``warn_version_differences``), at start-up, before any model loads.
"""

from __future__ import annotations

import logging
from typing import Any

from hybridflow.errors import ConfigError

logger = logging.getLogger(__name__)

VERL_CLIP_GRAD = 1.0
"""verl's default of ``optim.clip_grad`` and of the old role ``grad_clip``."""
VERL_CLIP_RATIO = 0.2
"""verl 0.9's default of ``clip_ratio``, ``clip_ratio_low`` and ``clip_ratio_high``."""

ACTOR = "actor_rollout_ref.actor"
_warned: set[str] = set()


def optim_clip_grad(optim: Any) -> float:
    """The clip threshold of an ``optim`` section as verl 0.9 reads it: ``grad_clip`` (deprecated) when set, else
    ``clip_grad``."""
    return optim.grad_clip if optim.grad_clip is not None else optim.clip_grad


def grad_clip_threshold(role: str, role_grad_clip: float | None, optim: Any) -> tuple[float, str | None]:
    """(the threshold a role clips its gradient norm at, the line to say or None) from the role's ``grad_clip``
    (verl before 0.9) and its ``optim`` section (verl 0.9); ConfigError where the two versions would disagree."""
    clip_grad = optim_clip_grad(optim)
    if role_grad_clip is None or role_grad_clip in (clip_grad, VERL_CLIP_GRAD):
        return clip_grad, None
    if clip_grad != VERL_CLIP_GRAD:
        raise ConfigError(f"{role}.grad_clip={role_grad_clip} and {role}.optim.clip_grad={clip_grad} disagree (verl "
                          f"before 0.9 clips at the first, verl 0.9 at the second): set only {role}.optim.clip_grad")
    if role_grad_clip <= 0:
        return role_grad_clip, (f"{role}.grad_clip={role_grad_clip} turns gradient clipping off; verl 0.9 ignores "
                                f"this key and clips at {role}.optim.clip_grad ({clip_grad})")
    return role_grad_clip, (f"{role}.grad_clip={role_grad_clip} clips the gradient norm at {role_grad_clip}, as in "
                            f"verl before 0.9; verl 0.9 ignores it and clips at {role}.optim.clip_grad "
                            f"({clip_grad}): set {role}.optim.clip_grad={role_grad_clip} to mean the same in both")


def clip_ratio_note(actor: Any) -> str | None:
    """The line for an ``actor.clip_ratio`` that no clip bound reads (both of ``clip_ratio_low/high`` are set)."""
    if actor.clip_ratio == VERL_CLIP_RATIO or None in (actor.clip_ratio_low, actor.clip_ratio_high):
        return None
    if actor.clip_ratio_low == actor.clip_ratio == actor.clip_ratio_high:
        return None
    key = ACTOR
    return (f"{key}.clip_ratio={actor.clip_ratio} has no effect: as in verl 0.9, {key}.clip_ratio_low="
            f"{actor.clip_ratio_low} and clip_ratio_high={actor.clip_ratio_high} bound the ratio; set those (or null "
            f"them to fall back to clip_ratio)")


def version_notes(cfg: Any, *, with_critic: bool) -> list[str]:
    """Every start-up line for ``cfg`` (a resolved PPOConfig); raises ConfigError on a grad-clip conflict."""
    notes = [clip_ratio_note(cfg.actor_rollout_ref.actor),
             grad_clip_threshold(ACTOR, cfg.actor_rollout_ref.actor.grad_clip,
                                 cfg.actor_rollout_ref.actor.optim)[1]]
    if with_critic:
        notes.append(grad_clip_threshold("critic", cfg.critic.grad_clip, cfg.critic.optim)[1])
    return [note for note in notes if note]


def warn_version_differences(cfg: Any, *, with_critic: bool) -> list[str]:
    """Log each of ``version_notes`` once per process; returns them."""
    notes = version_notes(cfg, with_critic=with_critic)
    for note in notes:
        if note not in _warned:
            _warned.add(note)
            logger.warning("hybridflow: %s", note)
    return notes
