"""The GVPO differential (benchmarks/verl_diff_gvpo.py): its comparison sees a wrong loss or gradient; with verl
0.9.1's side venv (``make verl-diff``) and a verl-recipe checkout (``VERL_RECIPE_DIR``) the whole check runs and
passes against the recipe's own ``compute_policy_loss_gvpo``."""

from __future__ import annotations

import os

import pytest

from tests.benchmarks.loader import loaded_benchmark


@pytest.fixture(scope="module")
def diff():
    with loaded_benchmark("verl_diff_gvpo") as module:
        yield module


def test_our_side_is_compared_on_loss_and_gradient(diff):
    inputs = diff.make_inputs()
    assert set(inputs) == set(diff.CASES)
    mine = diff.ours(inputs["n4_off_policy"])
    assert diff.compare(mine, mine) == 0.0
    assert mine["loss"] > 0 and mine["grad"].abs().max() > 0
    for key in ("loss", "grad"):
        off = dict(mine, **{key: mine[key] + 1e-3})
        assert diff.compare(off, mine) == pytest.approx(1e-3, rel=1e-3), key


def test_without_a_recipe_checkout_it_skips(diff, tmp_path, capsys):
    assert diff.main("/no/python", recipe_dir=str(tmp_path)) == 0
    assert "gvpo: SKIP" in capsys.readouterr().out


@pytest.mark.slow
def test_equal_to_verl_recipe_s_gvpo_loss(diff):
    side = os.path.join(os.path.dirname(diff.__file__), os.pardir, ".venv-verl", "bin", "python")
    recipe = os.environ.get("VERL_RECIPE_DIR", diff.DEFAULT_RECIPE_DIR)
    if not os.path.exists(side) or diff.recipe_source(recipe) is None:
        pytest.skip("no .venv-verl (make verl-diff builds it) or no verl-recipe checkout (VERL_RECIPE_DIR)")
    assert diff.main(side) == 0
