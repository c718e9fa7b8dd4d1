"""Which checkpoints a run may resume from or write over .

Every step's completion marker records the components it holds and the run's *signature*: the
config values a checkpoint cannot be resumed across (``algorithm.adv_estimator``, the model path).
Before a run loads or saves anything, :func:`claim_run_folder` compares the folder's newest
complete step with this run:

- its components or signature differ (GRPO checkpoints resumed with ``adv_estimator=gae``, which
  needs a critic): refused in one line, nothing touched. That step is not *damaged* -- damage is
  a missing or altered file of what the step says it holds (``manifest.py``);
- ``trainer.resume_mode=disable`` in a folder that holds checkpoints: refused, the run would
  write over steps it did not make;
- ``trainer.start_over=true``: the folder's steps, tracker and best-checkpoint record are
  deleted (one line names them) and the run starts fresh there, as asked.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping

from hybridflow.errors import ConfigError
from hybridflow.trainer.checkpoints.manager import TRACKER_FILE, complete_steps, read_marker

logger = logging.getLogger(__name__)
START_OVER_KEY = "trainer.start_over"
_RECORDS = (TRACKER_FILE, "best_checkpoint.json")


def _fix(root: str) -> str:
    return (f"point trainer.default_local_dir at a new folder, or set {START_OVER_KEY}=true to delete "
            f"the checkpoints in {root} and start over there")  # fmt: skip


def mismatch(marker: dict, components: tuple[str, ...], signature: Mapping[str, object]) -> str | None:
    """How the step of ``marker`` differs from this run's components and signature, or None."""
    made = sorted(marker.get("components", []))
    if made != sorted(components):
        return f"it holds components {made}, this run needs {sorted(components)}"
    recorded = marker.get("signature") or {}
    for key in sorted(set(recorded) & set(signature)):
        if recorded[key] != signature[key]:
            return f"it was made with {key}={recorded[key]!r}, this run has {key}={signature[key]!r}"
    return None


def claim_run_folder(root: str, resume_mode: str, components: tuple[str, ...], signature: Mapping[str, object],
                     start_over: bool = False) -> None:  # fmt: skip
    """Refuse (``ConfigError``, one line) a run folder whose checkpoints this run did not make; with
    ``start_over`` delete them instead. ``resume_path`` names its step itself and is not checked here
    beyond the components the loader needs."""
    steps = complete_steps(root)
    if not steps:
        return
    newest = steps[max(steps)]
    if start_over:
        _delete_steps(root, steps)
        return
    if resume_mode == "disable":
        raise ConfigError(f"trainer.resume_mode=disable, but {root} holds checkpoints up to "
                          f"{os.path.basename(newest)} that this run would write over; {_fix(root)}")  # fmt: skip
    if resume_mode != "auto":
        return
    problem = mismatch(read_marker(newest) or {}, components, signature)
    if problem is not None:
        raise ConfigError(f"{newest} was made under another configuration ({problem}); it is not resumed and "
                          f"nothing was changed: {_fix(root)}")  # fmt: skip


def _delete_steps(root: str, steps: dict[int, str]) -> None:
    for path in steps.values():
        shutil.rmtree(path)
    for name in _RECORDS:
        if os.path.exists(os.path.join(root, name)):
            os.remove(os.path.join(root, name))
    logger.warning("%s=true: deleted %d checkpoint(s) in %s (global_step_%d..%d) and started over",
                   START_OVER_KEY, len(steps), root, min(steps), max(steps))  # fmt: skip
