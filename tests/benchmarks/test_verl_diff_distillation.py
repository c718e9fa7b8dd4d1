"""The distillation differential (benchmarks/verl_diff_distillation.py): its comparison sees a wrong loss, gradient
or metric; with verl 0.9.1's side venv present (``make verl-diff``) the whole check runs and passes."""

from __future__ import annotations

import os

import pytest

from tests.benchmarks.loader import loaded_benchmark


@pytest.fixture(scope="module")
def diff():
    with loaded_benchmark("verl_diff_distillation") as module:
        yield module


def test_our_side_is_compared_on_every_output(diff):
    inputs = diff.make_inputs()
    case = inputs["cases"]["forward_kl_topk"]
    mine = diff.ours(case, inputs)
    assert diff.compare(mine, mine) == 0.0
    for key in ("loss", "grad_log_probs", "grad_logits"):
        off = dict(mine, **{key: mine[key] + 1e-3})
        assert diff.compare(off, mine) == pytest.approx(1e-3, rel=1e-3), key
    assert diff.compare(dict(mine, loss_max=mine["loss_max"] + 0.5), mine) == pytest.approx(0.5)
    assert mine["grad_logits"].abs().max() > 0  # the top-k loss reaches the logits


@pytest.mark.slow
def test_equal_to_verl_0_9_1(diff):
    side = os.path.join(os.path.dirname(diff.__file__), os.pardir, ".venv-verl", "bin", "python")
    if not os.path.exists(side):
        pytest.skip("no .venv-verl (make verl-diff builds it)")
    assert diff.main(side) == 0
