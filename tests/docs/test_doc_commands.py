"""Issue 59: every command in the README and the docs runs as written, in order (see doc_commands.py)."""

from pathlib import Path

import pytest

from tests.docs.doc_commands import chain_script, commands, doc_files, marked_blocks, run_chain

CHAINS = {"quickstart", "vision", "trainer", "sft"}  # the chains the docs must keep: dropping a marker is a failure, not a skip


def chain(name: str):
    return [block for block in marked_blocks(doc_files()) if block.chain == name]


def test_every_expected_chain_is_marked_in_the_docs():
    assert {block.chain for block in marked_blocks(doc_files())} >= CHAINS


def test_commands_join_continuations_and_take_the_tiny_switch(tmp_path: Path):
    text = "# a comment\nMODEL=$(fetch) STEPS=30   # tiny: MODEL=$(tiny m) STEPS=2\n\nrun a=1 \\\n    b=2\n"
    assert commands(text) == ["MODEL=$(fetch) STEPS=30   # tiny: MODEL=$(tiny m) STEPS=2", "run a=1 b=2"]
    (tmp_path / "README.md").write_text(f"x\n<!-- doc-test: c -->\n```bash\n{text}```\n")
    (tmp_path / "docs").mkdir()
    blocks = marked_blocks(doc_files(tmp_path))
    assert chain_script(blocks, tiny=True).splitlines()[3] == "MODEL=$(tiny m) STEPS=2"
    assert chain_script(blocks, tiny=False).splitlines()[3] == "MODEL=$(fetch) STEPS=30"


def _check_quickstart(proc, work: Path) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    # the validation score as it happens (step 0, before training), and the run folder said at start and end
    assert "step 0 | val-core/chain_sum/reward/mean@1 " in out
    assert out.count("hybridflow: run folder checkpoints/grpo") == 2
    assert (work / "out/grpo/config.json").exists()  # the merge found the checkpoint the GRPO step wrote
    assert "train_batch_size: 8" in out and "adv_estimator: grpo" in out


def test_readme_quickstart_runs_in_order_on_the_tiny_model(tmp_path: Path):
    proc = run_chain(chain("quickstart"), tmp_path, tiny=True, timeout=900)
    _check_quickstart(proc, tmp_path / "work")


@pytest.mark.slow
def test_readme_quickstart_runs_in_order_on_the_default_model(tmp_path: Path):
    proc = run_chain(chain("quickstart"), tmp_path, tiny=False, timeout=7200)
    _check_quickstart(proc, tmp_path / "work")


@pytest.mark.slow
def test_vision_doc_commands_run_in_order(tmp_path: Path):
    proc = run_chain(chain("vision"), tmp_path, tiny=False, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "step 0 | val-core/" in proc.stdout
    assert (tmp_path / "work/checkpoints/vl-sft").is_dir()  # its own folder: not the README's SFT run's


@pytest.mark.slow
def test_trainer_doc_commands_run_in_order(tmp_path: Path):
    proc = run_chain(chain("trainer"), tmp_path, tiny=False, timeout=7200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "work/my_model/config.json").exists()  # the export found global_step_30


@pytest.mark.slow
def test_sft_doc_commands_run_in_order(tmp_path: Path):
    proc = run_chain(chain("sft"), tmp_path, tiny=False, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "work/checkpoints/sft-tiny/latest_checkpointed_iteration.txt").exists()
