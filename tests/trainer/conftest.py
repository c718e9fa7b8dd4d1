"""Fixtures shared by the trainer tests."""

import subprocess
import uuid

import pytest


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs (the test is root in its container); skipped where mounting is not permitted."""
    mount_point = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
    mount_point.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount_point)],
                              capture_output=True, text=True)
    except OSError as error:  # no mount command
        pytest.skip(f"cannot mount a tmpfs here to fill up ({error})")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here to fill up ({done.stderr.strip() or 'mount failed'})")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)
