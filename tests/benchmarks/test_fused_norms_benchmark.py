"""benchmarks/fused_norms.py's tiny run: both variants of both pieces timed, the fused ones installed."""

import torch

from tests.benchmarks.loader import loaded_benchmark


def test_a_tiny_run_times_hfs_and_the_fused_pieces(capsys, monkeypatch):
    threads = torch.get_num_threads()
    try:
        with loaded_benchmark("fused_norms") as module:
            monkeypatch.setattr(module, "keep_freed_heap", lambda: None)  # leave the test process's heap alone
            module.main(["--tokens", "5", "--hidden", "16", "--intermediate", "24", "--repeats", "2"])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "tokens 5, hidden 16, MLP 24, 1 thread, min of 2" in out
    assert out.count(" HF ") == 2 and "norm " in out and "mlp " in out
