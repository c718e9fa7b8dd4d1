"""The chunked-prefill benchmark runs end to end on a tiny random model: the chunked engine's steps stay within the
budget while the whole-prompt one prefills the arrivals in one step."""

from tests.benchmarks.loader import loaded_benchmark


def test_chunked_prefill_benchmark_tiny_run(capsys):
    with loaded_benchmark("chunked_prefill") as module:
        results = module.main(["--shape", "tiny-llama", "--live", "2", "--arrivals", "2", "--prompt-len", "48",
                               "--budget", "16", "--arrive-at", "2", "--steps", "8", "--memory-prompt-len", "64"])
    assert set(results) == {"whole prompts", "chunked"}
    assert results["chunked"]["peak_step_tokens"] == 16  # 2 rows decoding and 14 prompt tokens a step
    assert results["whole prompts"]["peak_step_tokens"] == 2 * 48 + 4  # both prompts in one step, then 4 rows
    out = capsys.readouterr().out
    assert "| chunked |" in out and "longest stall: chunked / whole" in out
