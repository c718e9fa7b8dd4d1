"""The OpenMP wait policy hybridflow picks at import: spin on idle cores, sleep on busy ones, the user's choice kept."""

import os
import subprocess
import sys
import time

import pytest

from hybridflow import omp

_CLEAN = {k: v for k, v in os.environ.items() if k not in (*omp.POLICY_VARS, omp.MARK)}


@pytest.mark.parametrize(("environ", "cores", "elsewhere", "expected"), [
    ({"OMP_NUM_THREADS": "2"}, 2, 0.0, {"GOMP_SPINCOUNT": "30000"}),        # idle 2 cores, 2 threads: spin
    ({"OMP_NUM_THREADS": "2"}, 2, 0.25, {"GOMP_SPINCOUNT": "30000"}),       # a blip of load still fits
    ({"OMP_NUM_THREADS": "2"}, 2, 1.0, {"OMP_WAIT_POLICY": "PASSIVE"}),     # one busy neighbour: sleep
    ({"OMP_NUM_THREADS": "2"}, 16, 10.0, {"GOMP_SPINCOUNT": "30000"}),      # 16 cores, 10 busy: 2 still free
    ({"OMP_NUM_THREADS": "8"}, 16, 10.0, {"OMP_WAIT_POLICY": "PASSIVE"}),   # 8 wanted, 6 free
    ({}, 4, 2.0, {"OMP_WAIT_POLICY": "PASSIVE"}),                          # unset threads = all 4 cores
    ({"OMP_NUM_THREADS": "1"}, 2, 0.0, {"OMP_WAIT_POLICY": "PASSIVE"}),     # one thread never waits
    ({"OMP_NUM_THREADS": "2"}, 2, None, {"OMP_WAIT_POLICY": "PASSIVE"}),    # load unknown: the safe side
    ({"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE"}, 2, 1.0, {}),   # the user's choice stays
    ({"OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": "0"}, 2, 0.0, {}),
])
def test_decide(environ, cores, elsewhere, expected):
    updates, reason = omp.decide(environ, cores=cores, load=lambda: elsewhere)
    assert updates == expected
    assert reason and "\n" not in reason


def test_decide_samples_the_load_only_where_it_decides():
    """Sampling /proc/stat takes ~15 ms of every `import hybridflow`: not where the user chose or one thread runs."""
    def unwanted():
        raise AssertionError("load sampled")

    assert omp.decide({"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE"}, cores=2, load=unwanted)[0] == {}
    assert omp.decide({"OMP_NUM_THREADS": "1"}, cores=2, load=unwanted)[0] == {"OMP_WAIT_POLICY": "PASSIVE"}


def _busy_neighbour():
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def test_runnable_elsewhere_sees_a_busy_process():
    neighbour = _busy_neighbour()
    try:
        time.sleep(0.2)
        assert omp.runnable_elsewhere(samples=20, interval_s=0.005) >= 0.9
    finally:
        neighbour.kill()
        neighbour.wait()


def _policy_after_import(environ) -> str:
    code = ("import os, hybridflow, hybridflow.omp as o; "
            "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'), '|', o.choice)")
    out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_import_sleeps_beside_a_busy_process():
    """A fresh interpreter with the policy unset: `import hybridflow` (before torch) picks PASSIVE when a
    neighbour holds a core of the two its threads want."""
    neighbour = _busy_neighbour()
    try:
        time.sleep(0.2)
        env = {**_CLEAN, "OMP_NUM_THREADS": str(omp.usable_cores())}
        assert _policy_after_import(env).startswith("PASSIVE None |")
    finally:
        neighbour.kill()
        neighbour.wait()


def test_import_keeps_the_users_policy():
    env = {**_CLEAN, "OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE"}
    assert _policy_after_import(env).startswith("ACTIVE None | OpenMP waits as OMP_WAIT_POLICY=ACTIVE (set by the user)")
    env = {**_CLEAN, "OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": "5000"}
    assert _policy_after_import(env).startswith("None 5000 |")


@pytest.mark.parametrize(("environ", "expected"), [
    ({}, {}),
    ({"OMP_WAIT_POLICY": "PASSIVE"}, {"OMP_WAIT_POLICY": "PASSIVE"}),                       # the user's
    ({"GOMP_SPINCOUNT": "30000", omp.MARK: "GOMP_SPINCOUNT=30000"}, {}),                     # a parent's choice
    ({"OMP_WAIT_POLICY": "PASSIVE", omp.MARK: "OMP_WAIT_POLICY=PASSIVE"}, {}),
    ({"GOMP_SPINCOUNT": "5000", omp.MARK: "GOMP_SPINCOUNT=30000"}, {"GOMP_SPINCOUNT": "5000"}),  # changed since
    ({"GOMP_SPINCOUNT": "30000", "OMP_WAIT_POLICY": "ACTIVE", omp.MARK: "GOMP_SPINCOUNT=30000"},
     {"GOMP_SPINCOUNT": "30000", "OMP_WAIT_POLICY": "ACTIVE"}),                               # one added since
])
def test_user_settings_leave_out_a_parents_marked_choice(environ, expected):
    assert omp.user_settings(environ) == expected


def test_apply_marks_its_choice_and_decides_again_under_a_parents(monkeypatch):
    """A child of a hybridflow process that spun on idle cores must not take that choice as the user's: beside a
    busy parent it sleeps instead."""
    monkeypatch.setattr(omp, "usable_cores", lambda: 2)
    monkeypatch.setattr(omp, "runnable_elsewhere", lambda: 0.0)
    environ = {"OMP_NUM_THREADS": "2"}
    omp.apply(environ)
    assert environ == {"OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": "30000", omp.MARK: "GOMP_SPINCOUNT=30000"}
    monkeypatch.setattr(omp, "runnable_elsewhere", lambda: 1.0)  # the parent now runs beside the child
    reason = omp.apply(environ)
    assert environ == {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE", omp.MARK: "OMP_WAIT_POLICY=PASSIVE"}
    assert "set by the user" not in reason
    environ = {"OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": "5000"}  # the user's own: kept, not marked
    omp.apply(environ)
    assert environ == {"OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": "5000"}


def test_child_of_a_spinning_process_decides_again():
    """End to end: a real interpreter started with the environment a spinning hybridflow parent leaves."""
    env = {**_CLEAN, "OMP_NUM_THREADS": "1", "GOMP_SPINCOUNT": "30000", omp.MARK: "GOMP_SPINCOUNT=30000"}
    assert _policy_after_import(env) == "PASSIVE None | OpenMP runs one thread per process: its workers never wait"
