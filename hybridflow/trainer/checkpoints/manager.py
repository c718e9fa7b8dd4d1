"""Checkpoint save / resume / rotation in verl's layout, crash-safe.

Layout under ``trainer.default_local_dir``::

    global_step_{N}/
        actor/  critic/  ...           one directory per component (see components.py)
        data.pt                        ``extra``: dataloader state and other trainer state
        checkpoint_complete.json       completion marker, written last inside the step
    latest_checkpointed_iteration.txt  "N", written after the step directory is in place

Crash safety, in write order:

1. the step is written into ``global_step_{N}.tmp-{pid}`` (a name resume never matches),
   every file fsynced, the completion marker last;
2. the directory is renamed to ``global_step_{N}`` (an atomic rename on one filesystem);
3. the tracker is written to a temp file, fsynced and ``os.replace``-d into place.

A crash at any point leaves the tracker naming the previous complete step, and any
directory without the marker (torn by a crash, or copied partially) is never resumed
from in ``auto`` mode.

Damage after the fact: the marker records every file's size (and a checksum of the
smaller ones, see manifest.py); ``auto`` resume verifies the step it picks
and falls back to the newest intact one with a warning that names the damaged file.

Full disks: before writing, the free space is compared with the size of the previous
checkpoint; a save that runs out of space anyway removes its partial temp folder and
raises :class:`CheckpointError` ("disk full at DIR: needs ~X MB, Y MB free").
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hybridflow.errors import CheckpointError, ConfigError, ModelError
from hybridflow.trainer.checkpoints.components import Checkpointable, HasStateDict, as_component
from hybridflow.trainer.checkpoints.manifest import build_manifest, manifest_problem, tree_size

logger = logging.getLogger(__name__)

TRACKER_FILE = "latest_checkpointed_iteration.txt"
COMPLETE_MARKER = "checkpoint_complete.json"
EXTRA_FILE = "data.pt"
STEP_DIR = re.compile(r"^global_step_(\d+)$")
LEFTOVER_DIR = re.compile(r"^global_step_\d+\.(?:tmp|old)-(\d+)$")
RESUME_MODES = ("auto", "disable", "resume_path")
_NEARLY_FULL_BYTES = 2**20  # less free than this after a failed write: the disk filled up


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step_{step}")


# ---- durable file-system primitives ---------------------------------------------------


def _fsync_path(path: str) -> None:
    """fsync a file or a directory (a directory fsync makes renames inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: str) -> None:
    for directory, _, files in os.walk(root):
        for name in files:
            _fsync_path(os.path.join(directory, name))
        _fsync_path(directory)


def write_text_atomic(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` so that readers see the old or the new content, never a torn one."""
    temp = f"{path}.tmp-{os.getpid()}"
    with open(temp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)
    _fsync_path(os.path.dirname(os.path.abspath(path)))


def _write_tracker(root: str, step: int) -> None:
    write_text_atomic(os.path.join(root, TRACKER_FILE), str(step))


# ---- discovery ------------------------------------------------------------------------


def is_complete(path: str) -> bool:
    """A step directory counts only with its real name and the completion marker inside."""
    return STEP_DIR.match(os.path.basename(os.path.normpath(path))) is not None and os.path.isfile(
        os.path.join(path, COMPLETE_MARKER)
    )


def complete_steps(root: str) -> dict[int, str]:
    """``{step: path}`` of every complete step directory under ``root``."""
    if not os.path.isdir(root):
        return {}
    found = {}
    for name in os.listdir(root):
        match = STEP_DIR.match(name)
        if match and is_complete(os.path.join(root, name)):
            found[int(match.group(1))] = os.path.join(root, name)
    return found


def _tracked_step(root: str) -> int | None:
    try:
        with open(os.path.join(root, TRACKER_FILE), encoding="utf-8") as f:
            return int(f.read().strip())
    except (FileNotFoundError, ValueError):
        return None


def read_marker(path: str) -> dict | None:
    """The completion marker of step directory ``path`` (None when absent or unreadable)."""
    try:
        with open(os.path.join(path, COMPLETE_MARKER), encoding="utf-8") as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def damage(path: str, components: tuple[str, ...] = ()) -> str | None:
    """What is damaged in the complete step ``path`` (a missing component, a truncated or corrupt file), or None."""
    marker = read_marker(path)
    if marker is None:
        return f"{COMPLETE_MARKER} is unreadable"
    return manifest_problem(path, marker, components=components)


def _find_auto(root: str, components: tuple[str, ...] = ()) -> str | None:
    """The tracker's step if complete and intact; else the newest intact step, with a warning; else None."""
    tracked = _tracked_step(root)
    steps = complete_steps(root)
    order = ([tracked] if tracked in steps else []) + sorted((s for s in steps if s != tracked), reverse=True)
    for step in order:
        problem = damage(steps[step], components)
        if problem is None:
            if step != tracked:
                _warn_fallback(root, tracked, steps[step], damaged=tracked in steps)
            return steps[step]
        logger.warning("checkpoint %s is damaged (%s); skipping it", steps[step], problem)
    if tracked is not None or steps:
        logger.warning("no intact checkpoint under %s; starting fresh", root)
    return None


def _warn_fallback(root: str, tracked: int | None, chosen: str, *, damaged: bool) -> None:
    if tracked is None:
        problem = "is missing or unreadable"
    else:
        problem = f"names global_step_{tracked}, which is {'damaged' if damaged else 'missing or incomplete'}"
    logger.warning("%s under %s %s; resuming from the newest complete step %s", TRACKER_FILE, root, problem, chosen)


def find_resume_checkpoint(
    root: str, resume_mode: str = "auto", resume_from_path: str | None = None, components: tuple[str, ...] = ()
) -> str | None:
    """The step directory to resume from (``trainer.resume_mode``), or None to start fresh.

    - ``disable``: always None.
    - ``auto``: the step named by the tracker; if the tracker is missing or names a missing,
      incomplete or damaged step, the newest complete intact ``global_step_*`` (with a warning).
    - ``resume_path``: ``resume_from_path``, which must be an existing ``global_step_N``
      directory (checkpoints written by verl, which have no completion marker, load this way);
      a damaged one is an error.

    ``components`` (e.g. ``("actor", "critic")``) must all be present in the step.
    """
    if resume_mode not in RESUME_MODES:
        raise ConfigError(f"trainer.resume_mode={resume_mode!r} is not one of {list(RESUME_MODES)}")
    if resume_mode == "disable":
        return None
    if resume_mode == "auto":  # a step without a component this run needs is another run's, not damaged
        return _find_auto(root)
    if not resume_from_path or not os.path.isdir(resume_from_path):
        raise ConfigError(
            f"trainer.resume_mode=resume_path needs trainer.resume_from_path to be an existing "
            f"global_step_N directory; got {resume_from_path!r}"
        )
    if not STEP_DIR.match(os.path.basename(os.path.normpath(resume_from_path))):
        raise ConfigError(f"trainer.resume_from_path={resume_from_path!r} must name a global_step_N directory")
    if not is_complete(resume_from_path):
        logger.warning("%s has no %s; loading it anyway as asked", resume_from_path, COMPLETE_MARKER)
    elif (problem := damage(resume_from_path, tuple(components))) is not None:
        raise CheckpointError(
            f"checkpoint {resume_from_path} is damaged ({problem}); set trainer.resume_from_path to another "
            "global_step_N, or trainer.resume_mode=auto to take the newest intact one"
        )
    return resume_from_path


def step_of(path: str) -> int:
    match = STEP_DIR.match(os.path.basename(os.path.normpath(path)))
    if match is None:
        raise ConfigError(f"{path!r} is not a global_step_N checkpoint directory")
    return int(match.group(1))


# ---- save / load / rotate -------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_leftovers(root: str) -> None:
    """Delete temp/old step directories left by writers that died mid-save."""
    for name in os.listdir(root):
        match = LEFTOVER_DIR.match(name)
        if match and not _pid_alive(int(match.group(1))):
            logger.warning("removing %s left by an interrupted checkpoint save", name)
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _write_step(temp: str, step: int, components: Mapping[str, Checkpointable], extra: Mapping[str, Any],
                signature: Mapping[str, Any]) -> None:  # fmt: skip
    os.makedirs(temp)
    for name, component in components.items():
        os.makedirs(os.path.join(temp, name))
        component.save_to(os.path.join(temp, name))
    torch.save(dict(extra), os.path.join(temp, EXTRA_FILE))
    _fsync_tree(temp)
    marker = {"step": step, "components": sorted(components), "signature": dict(signature), "saved_at": time.time(),
              "files": build_manifest(temp, marker_name=COMPLETE_MARKER)}
    write_text_atomic(os.path.join(temp, COMPLETE_MARKER), json.dumps(marker))


def _publish(temp: str, final: str) -> None:
    """Rename ``temp`` to ``final``; an existing ``final`` (a re-saved step) is swapped out first."""
    if os.path.exists(final):
        old = f"{final}.old-{os.getpid()}"
        os.rename(final, old)
        os.rename(temp, final)
        shutil.rmtree(old)
    else:
        os.rename(temp, final)
    _fsync_path(os.path.dirname(final))


def _oldest_beyond(paths: list[str], max_to_keep: int | None) -> list[str]:
    """The oldest of ``paths`` (sorted old to new, the kept newest step not among them) beyond
    ``max_to_keep`` - 1 (that step counts as one); none when the limit is unset or <= 0."""
    if not max_to_keep or max_to_keep <= 0:
        return []
    return paths[: max(0, len(paths) - (max_to_keep - 1))]


def rotate_checkpoints(root: str, max_to_keep: int | None | Mapping[str, int | None], keep: str,
                       protect: Sequence[str] = ()) -> list[str]:
    """Delete the oldest complete steps so at most ``max_to_keep`` remain, never ``keep``; returns the deleted paths.

    Steps in ``protect`` (the best checkpoint, ``trainer.keep_best_checkpoint``) are never deleted and
    do not count against the limit.

    A mapping gives each component its own limit (verl's ``max_actor_ckpt_to_keep`` /
    ``max_critic_ckpt_to_keep``): a component's directory goes once its own limit is exceeded,
    a whole step once every component of it has gone.
    """
    spared = {os.path.abspath(p) for p in (keep, *protect)}
    others = [p for _, p in sorted(complete_steps(root).items()) if os.path.abspath(p) not in spared]
    if not isinstance(max_to_keep, Mapping):
        doomed = _oldest_beyond(others, max_to_keep)
    else:
        removed = {name: set(_oldest_beyond(others, limit)) for name, limit in max_to_keep.items()}
        doomed = [p for p in others if all(p in paths for paths in removed.values())]
        for name, paths in removed.items():
            for path in sorted(paths - set(doomed)):
                shutil.rmtree(os.path.join(path, name), ignore_errors=True)
    for path in doomed:
        shutil.rmtree(path)
    return doomed


def save_checkpoint(
    root: str,
    step: int,
    components: Mapping[str, Checkpointable | HasStateDict],
    extra: Mapping[str, Any] | None = None,
    max_to_keep: int | None | Mapping[str, int | None] = None,
    protect: Sequence[str] = (),
    signature: Mapping[str, Any] | None = None,
) -> str:
    """Save ``components`` (``{"actor": ..., "critic": ...}``) and ``extra`` as step ``step``; returns its directory.

    ``extra`` (dataloader state, KL-controller state, ...) goes to ``data.pt``. After the
    tracker names the new step, the oldest complete steps beyond ``max_to_keep`` are
    deleted (None or <= 0 keeps all; a mapping limits each component, see ``rotate_checkpoints``),
    except the steps in ``protect``. ``signature`` (config values a resume must match, see
    ownership.py) is recorded in the completion marker.
    """
    os.makedirs(root, exist_ok=True)
    _remove_leftovers(root)
    temp, final = f"{step_dir(root, step)}.tmp-{os.getpid()}", step_dir(root, step)
    shutil.rmtree(temp, ignore_errors=True)
    needed = _previous_step_bytes(root)
    _check_free_space(root, needed)
    try:
        _write_step(temp, step, {name: as_component(c) for name, c in components.items()}, extra or {},
                    signature or {})
        _publish(temp, final)
        _write_tracker(root, step)
    except BaseException as error:
        _fail_save(error, root=root, temp=temp, needed=needed)
        raise
    rotate_checkpoints(root, max_to_keep, keep=final, protect=protect)
    return final


# ---- disk space ---------------------------------------------------------------------


def _previous_step_bytes(root: str) -> int:
    """Size of the newest complete step (the estimate of the next one), from its marker; 0 if none."""
    steps = complete_steps(root)
    if not steps:
        return 0
    newest = steps[max(steps)]
    files = (read_marker(newest) or {}).get("files")
    return sum(entry["size"] for entry in files.values()) if files else tree_size(newest)


def _disk_full_message(root: str, needed: int, free: int, *, lower_bound: bool = False) -> str:
    need = f"{'more than ' if lower_bound else '~'}{needed / 2**20:.1f} MB"
    return (
        f"disk full at {root}: needs {need}, {free / 2**20:.1f} MB free; free some space or point "
        "trainer.default_local_dir at a bigger disk (the earlier checkpoints are intact)"
    )


def _check_free_space(root: str, needed: int) -> None:
    free = shutil.disk_usage(root).free
    if needed > free:
        raise CheckpointError(_disk_full_message(root, needed, free))


def _is_disk_full(error: BaseException, root: str) -> bool:
    """ENOSPC anywhere in the exception chain, or (torch's zip writer hides it) a disk left nearly full."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    if "No space left on device" in repr(error):
        return True
    return shutil.disk_usage(root).free < _NEARLY_FULL_BYTES


def _fail_save(error: BaseException, *, root: str, temp: str, needed: int) -> None:
    """Remove the partial step; a full disk becomes one clear :class:`CheckpointError`."""
    # torch's DCP CheckpointException derives from BaseException, so only interrupts are excluded
    disk_full = not isinstance(error, (KeyboardInterrupt, SystemExit)) and _is_disk_full(error, root)
    written = tree_size(temp) if os.path.isdir(temp) else 0
    shutil.rmtree(temp, ignore_errors=True)
    if disk_full:
        free = shutil.disk_usage(root).free
        message = _disk_full_message(root, max(needed, written), free, lower_bound=not needed)
        raise CheckpointError(message) from error


def load_checkpoint(
    path: str, components: Mapping[str, Checkpointable | HasStateDict]
) -> tuple[int, dict[str, Any]]:
    """Restore ``components`` from step directory ``path``; returns ``(step, extra)``.

    ``data.pt`` is unpickled with ``weights_only=False`` (dataloader states hold Python
    objects): only resume from checkpoints you trust.
    """
    step = step_of(path)
    for name, component in components.items():
        directory = os.path.join(path, name)
        if not os.path.isdir(directory):
            raise ModelError(f"checkpoint {path} has no {name!r} component (found {sorted(os.listdir(path))})")
        as_component(component).load_from(directory)
    extra_path = os.path.join(path, EXTRA_FILE)
    extra = torch.load(extra_path, weights_only=False) if os.path.isfile(extra_path) else {}
    return step, extra
