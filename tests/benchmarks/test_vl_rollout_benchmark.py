"""The vision-language rollout benchmark: a tiny end-to-end run of the script (its report's fields, no timings), its
prefill clock on a ticking clock, and the decode roofline's bytes of a VLM (the language model's, not the tower's)."""

import itertools

import pytest
import torch

from tests.benchmarks.loader import loaded_benchmark


@pytest.fixture(scope="module")
def bench():
    with loaded_benchmark("vl_rollout") as module:
        yield module


@pytest.fixture(scope="module")
def tiny(bench):
    """``(model, processor, prompts, images)``: the tiny Qwen2.5-VL and 3 prompts with 1, 1 and 2 images."""
    from hybridflow.models.tiny import build_tiny_vl_processor

    processor = build_tiny_vl_processor(max_pixels=56 ** 2)
    model = bench.random_vl_model("tiny", processor.tokenizer, dtype="float32", device="cpu")
    prompts, images = bench.vl_prompts(processor, 3, image_size=56, seed=0)
    return model, processor, prompts, images


def test_script_runs_the_tiny_shape_end_to_end(bench, capsys):
    bench.main(["--shape", "tiny", "--prompts", "3", "--n", "2", "--max-tokens", "4", "--image-size", "56"])
    out = capsys.readouterr().out
    assert "cpu:" in out and "device cpu, dtype float32" in out  # the machine
    assert "workload: 3 prompts x 2 samples = 6 rows, 4 images (1, 1, 2 a prompt, 56 px)" in out
    assert "decode roofline: 3 steps read" in out and "copy bandwidth" in out
    for engine in ("native", "hf"):
        line = next(line for line in out.splitlines() if line.lstrip().startswith(f"{engine}: 24 tokens in"))
        assert "prefill" in line and "vision tower" in line and "roofline share" in line
    assert "native / hf: " in out
    table = [line for line in out.splitlines() if line.startswith("| tiny | 6 |")]
    assert [line.split(" | ")[2] for line in table] == ["native", "hf"]
    assert all(line.count("%") == 4 and line.endswith("x |") for line in table)


class TickingClock:
    """``time.perf_counter`` that advances by one at each call: a span counts the clock reads inside it."""

    def __init__(self):
        self.ticks = itertools.count()

    def perf_counter(self) -> float:
        return float(next(self.ticks))


@pytest.mark.parametrize("engine_name", ["native", "hf"])
def test_prefill_clock_spans_the_vision_tower(bench, tiny, engine_name, monkeypatch):
    """HF (transformers 5) runs the tower before its first forward, the native engine at submission: either way the
    prefill time holds the tower's (more ticks), and decode steps add nothing to it."""
    from hybridflow.rollout import SamplingParams

    model, processor, prompts, images = tiny
    engine = bench.build_engine(engine_name, model, processor.tokenizer, rows=6, max_len=256)
    clock = bench.PrefillClock(model, engine, "cpu")
    monkeypatch.setattr(bench, "time", TickingClock())
    try:
        for max_tokens in (2, 8):  # the prefill's ticks do not grow with the decode steps
            clock.seconds = {"tower": 0.0, "prefill": 0.0}
            clock.hf_prefill_done = False
            getattr(engine, "reset_prefix_cache", lambda: None)()  # a new batch: the native engine encodes again
            engine.generate(prompts, SamplingParams(n=2, max_tokens=max_tokens, ignore_eos=True, temperature=1.0,
                                                    seed=0), multi_modal_inputs=images)
            ticks = dict(clock.seconds)
            assert ticks["tower"] > 0 and ticks["prefill"] > ticks["tower"]
            if max_tokens == 8:
                assert ticks == first
            first = ticks
    finally:
        clock.close()
    assert "encode_images" not in vars(engine)  # unwrapped


def test_roofline_bytes_of_a_vlm_are_its_language_models(bench, tiny):
    """A decode step reads the language model's matrices and the (tied) LM head, never the vision tower; a cached
    token holds each layer's keys and values (the text config's layers and KV heads)."""
    model = tiny[0]
    language = model.model.language_model
    embedding = model.get_input_embeddings().weight
    matrices = [w for w in language.parameters() if w.dim() == 2 and w is not embedding] + [embedding]
    assert bench.weight_bytes(model) == sum(w.numel() * 4 for w in matrices)
    text = model.config.get_text_config()  # 2 layers x (k, v) x 2 KV heads x 16 dims x 4 bytes
    assert bench.kv_bytes_per_token(model) == text.num_hidden_layers * 2 * text.num_key_value_heads * 16 * 4 == 512
    assert sum(p.numel() for p in model.model.visual.parameters() if p.dim() == 2) > 0
    assert torch.is_tensor(embedding)


def test_tower_flops_count_patches_through_the_blocks_and_merged_tokens_through_the_merger(bench, tiny):
    # The tiny tower: patch embedding 32 x (3 x 2 x 14 x 14) = 37,632; two blocks of qkv 96 x 32, proj 32 x 32 and
    # gate, up, down 64 x 32 = 10,240 each; the merger 128 x 128 + 64 x 128 = 24,576 over 2 x 2 patches a token.
    model, _, _, images = tiny
    patches = sum(int(row["image_grid_thw"].prod(-1).sum()) for row in images if row)
    assert patches % 4 == 0 and patches > 0
    expected = 2 * (patches * (37632 + 2 * 10240) + patches // 4 * 24576)
    assert bench.tower_flops(model, images) == expected
    assert bench.tower_flops(model, [None]) == 0


def test_an_engine_that_fails_is_reported_and_the_other_still_runs(bench, capsys, monkeypatch):
    run_engine = bench.run_engine

    def hf_out_of_memory(name, *args):
        if name == "hf":
            raise RuntimeError("CUDA out of memory. Tried to allocate 9.00 GiB\nmore detail")
        return run_engine(name, *args)

    monkeypatch.setattr(bench, "run_engine", hf_out_of_memory)
    bench.main(["--shape", "tiny", "--prompts", "1", "--n", "2", "--max-tokens", "3", "--image-size", "56"])
    out = capsys.readouterr().out
    assert "hf: failed: RuntimeError: CUDA out of memory. Tried to allocate 9.00 GiB\n" in out
    assert "native: 6 tokens in" in out and "native / hf" not in out
    assert [line.split(" | ")[2] for line in out.splitlines() if line.startswith("| tiny |")] == ["native"]


def test_unknown_engines_are_refused_naming_the_choices(bench, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(["--engines", "native,vllm"])
    assert "unknown --engines vllm; choose from native, hf" in capsys.readouterr().err
