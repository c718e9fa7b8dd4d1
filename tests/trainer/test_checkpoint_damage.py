"""Damaged checkpoints are skipped on resume with a warning naming the damage; full disks say so."""

import json
import logging
import os
import re

import pytest
import torch

from hybridflow.errors import CheckpointError
from hybridflow.models.sharded_checkpoint import FSDPModelComponent
from hybridflow.trainer.checkpoints.manager import COMPLETE_MARKER, find_resume_checkpoint, load_checkpoint, save_checkpoint
from hybridflow.trainer.checkpoints.manifest import crc32_of
from tests.trainer.test_checkpoint import Counter, trained_actor


def save_steps(root, steps, **extra_components):
    """Steps with a DCP-sharded actor (``actor/dcp/*.distcp``) and a plain critic."""
    for step in steps:
        model, optimizer, scheduler, tokenizer = trained_actor(seed=step)
        components = {"actor": FSDPModelComponent(model, optimizer, scheduler, tokenizer), "critic": Counter(step)}
        save_checkpoint(str(root), step, {**components, **extra_components}, extra={"step": step})


def resume(root, caplog, components=("actor", "critic")):
    with caplog.at_level(logging.WARNING, logger="hybridflow.trainer.checkpoints.manager"):
        return find_resume_checkpoint(str(root), "auto", components=components)


def truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_marker_records_every_file_with_size_and_checksum(tmp_path):
    save_steps(tmp_path, [1])
    step = tmp_path / "global_step_1"
    files = json.loads((step / COMPLETE_MARKER).read_text())["files"]
    on_disk = sorted(str(p.relative_to(step)) for p in step.rglob("*") if p.is_file() and p.name != COMPLETE_MARKER)
    assert sorted(files) == on_disk and any(name.endswith(".distcp") for name in files)
    assert files["data.pt"] == {"size": (step / "data.pt").stat().st_size, "crc32": crc32_of(str(step / "data.pt"))}


@pytest.mark.parametrize("damage, expected", [
    ("distcp", r"actor/dcp/__0_0.distcp is truncated: \d+ bytes, \d+ written"),
    ("data.pt", r"data.pt is truncated"),
    ("critic", r"component 'critic' is missing"),
    ("flipped", r"data.pt is corrupt \(checksum differs"),
])
def test_damaged_newest_step_falls_back_to_the_previous_one(tmp_path, caplog, damage, expected):
    save_steps(tmp_path, [1, 2])
    newest = tmp_path / "global_step_2"
    if damage == "distcp":
        truncate(next((newest / "actor" / "dcp").glob("*.distcp")))
    elif damage == "data.pt":
        truncate(newest / "data.pt")
    elif damage == "critic":
        for path in (newest / "critic").iterdir():
            path.unlink()
        (newest / "critic").rmdir()
    else:
        data = bytearray((newest / "data.pt").read_bytes())
        data[-30] ^= 0xFF
        (newest / "data.pt").write_bytes(bytes(data))
    assert resume(tmp_path, caplog) == str(tmp_path / "global_step_1")
    assert any(re.search(f"global_step_2 is damaged \\({expected}", r.getMessage())
               for r in caplog.records), caplog.text
    model, optimizer, scheduler, _ = trained_actor(seed=9)
    step, extra = load_checkpoint(resume(tmp_path, caplog), {"actor": FSDPModelComponent(model, optimizer, scheduler),
                                                             "critic": Counter()})
    assert (step, extra) == (1, {"step": 1})


def test_a_component_the_run_needs_but_never_saved_is_another_runs_not_damage(tmp_path, caplog):
    # issue 61: it was called damaged, skipped, and the run started fresh over it; now the step is intact
    # and the run that needs more is refused in one line before anything is touched (ownership.py)
    from hybridflow.errors import ConfigError
    from hybridflow.trainer.checkpoints.ownership import claim_run_folder

    save_steps(tmp_path, [1])
    assert resume(tmp_path, caplog, components=("actor", "critic", "reward")) == str(tmp_path / "global_step_1")
    assert "damaged" not in caplog.text
    with pytest.raises(ConfigError, match=r"another configuration \(it holds components \['actor', 'critic'\], "
                                          r"this run needs \['actor', 'critic', 'reward'\]\)"):
        claim_run_folder(str(tmp_path), "auto", ("actor", "critic", "reward"), {})


def test_damaged_explicit_resume_path_is_one_clear_error(tmp_path):
    save_steps(tmp_path, [1])
    truncate(tmp_path / "global_step_1" / "data.pt")
    with pytest.raises(CheckpointError, match=r"global_step_1 is damaged \(data.pt is truncated.*resume_mode=auto"):
        find_resume_checkpoint(str(tmp_path), "resume_path", str(tmp_path / "global_step_1"))


def test_markers_without_a_manifest_still_resume(tmp_path, caplog):
    save_steps(tmp_path, [1])
    marker_path = tmp_path / "global_step_1" / COMPLETE_MARKER
    marker = json.loads(marker_path.read_text())
    del marker["files"]  # as written before the manifest existed
    marker_path.write_text(json.dumps(marker))
    assert resume(tmp_path, caplog) == str(tmp_path / "global_step_1")


# --------------------------------------------------------------------------- full disk
class Blob:
    """A component of ``megabytes`` random MB (incompressible, so the disk really fills)."""

    def __init__(self, megabytes: float):
        self.data = torch.randint(0, 255, (int(megabytes * 2**20),), dtype=torch.uint8)

    def state_dict(self):
        return {"data": self.data}

    def load_state_dict(self, state):
        self.data = state["data"]


def test_full_disk_before_writing_names_need_and_free_space(small_disk):
    save_checkpoint(str(small_disk), 1, {"actor": Blob(1.6)})
    with pytest.raises(CheckpointError, match=r"disk full at .*: needs ~1\.6 MB, 1\.\d MB free; free some space"):
        save_checkpoint(str(small_disk), 2, {"actor": Blob(1.6)})
    assert sorted(os.listdir(small_disk)) == ["global_step_1", "latest_checkpointed_iteration.txt"]
    assert find_resume_checkpoint(str(small_disk), "auto") == str(small_disk / "global_step_1")


def test_disk_filling_up_while_writing_removes_the_partial_step(small_disk):
    with pytest.raises(CheckpointError, match=r"disk full at .*: needs more than \d+\.\d MB, \d+\.\d MB free"):
        save_checkpoint(str(small_disk), 1, {"actor": Blob(4)})  # no earlier step to estimate from
    assert os.listdir(small_disk) == []  # no global_step_1.tmp-PID left behind


def test_sharded_save_on_a_filling_disk_is_one_clear_error(small_disk):
    (small_disk / "someone_elses_file").write_bytes(os.urandom(2 * 2**20))
    with pytest.raises(CheckpointError, match=r"disk full at .*: needs more than \d+\.\d MB, \d+\.\d MB free"):
        save_steps(small_disk, [1])  # the DCP shards (1.6 MB) do not fit in the 1 MB left
    assert os.listdir(small_disk) == ["someone_elses_file"]
