"""benchmarks/loop_step.py: main_ppo's GRPO step on the CPU with the tiny shape (the GPU stage's code path, so it
cannot rot without a GPU), its per-phase memory bookkeeping by hand, and the device plumbing."""

from tests.benchmarks.loader import loaded_benchmark

PHASES = ("gen", "old_log_prob", "ref", "update_actor", "sync_weights")


class ScriptedMemory:
    """PhaseMemory's bookkeeping on given peak readings (no device)."""

    def __init__(self, bench, readings):
        self.memory, readings = bench.PhaseMemory("cpu"), iter(readings)
        self.memory._peak, self.memory._reset = lambda: next(readings), lambda: None
        self.memory._kv_peak = lambda: 0


def test_phase_memory_folds_nested_peaks_into_the_open_phases():
    with loaded_benchmark("loop_step") as bench:
        memory = ScriptedMemory(bench, [1, 8, 4, 3, 7, 2]).memory
        memory.enter("step")          # reads 1 (nothing open)
        memory.enter("gen")           # reads 8, folded into step before gen resets the counter: step 8
        memory.exit("gen")            # reads 4: gen 4
        memory.enter("update_actor")  # reads 3: step stays 8
        memory.exit("update_actor")   # reads 7: update 7
        memory.exit("step")           # reads 2: step 8 (the peak before gen's reset)
    assert memory.peaks == {"gen": 4, "update_actor": 7, "step": 8}
    assert memory.parents == {"step": None, "gen": "step", "update_actor": "step"}


def test_cuda_device_reaches_the_trainer_and_the_counts_by_hand():
    with loaded_benchmark("loop_step") as bench:
        args = bench.parse_args(["--device", "cuda", "--shape", "qwen2.5-1.5b"])
        keys = bench.overrides(args, model="m", data="d.jsonl", out="o")
        counts = bench.model_counts("tiny")
        flops = bench.phase_flops(counts, {"prompt_length/mean": 10, "response_length/mean": 6}, 4)
    assert "trainer.device=cuda" in keys and "actor_rollout_ref.rollout.ignore_eos=True" in keys
    assert "data.train_batch_size=32" in keys and "actor_rollout_ref.rollout.n=8" in keys
    assert "data.max_prompt_length=512" in keys and "data.max_response_length=1024" in keys
    # tiny: h=64, 4 heads x 16, 2 KV heads, i=176, 2 layers, V=1024 (tied: the head is the embedding)
    assert counts == {"params": 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 176) + 64 * 1024, "layers": 2, "attn_width": 64}
    forward = 2 * counts["params"] * 4 * 16 + 2 * 2 * 64 * 4 * 16**2
    assert flops["ref"] == forward and flops["update_actor"] == 3 * forward
    assert flops["gen"] == 2 * counts["params"] * 4 * 6 + 4 * 2 * 64 * 4 * 6 * (10 + 3)


def test_tiny_cpu_step_reports_every_phase_and_adds_up():
    with loaded_benchmark("loop_step") as bench:
        report = bench.main(["--device", "cpu", "--shape", "tiny", "--prompts", "2", "--n", "2",
                             "--prompt-len", "64", "--response-len", "8", "--steps", "2", "--isolated"])
    phases = report["phases"]
    assert set(PHASES) <= set(phases)
    for name in PHASES:
        assert phases[name]["seconds"] > 0 and phases[name]["peak_bytes"] > 0, name
    # rollout.free_cache_engine (the default): the KV cache is held while generating, and released before the rest
    assert phases["gen"]["kv_bytes"] > 0
    assert all(phases[name]["kv_bytes"] == 0 for name in PHASES if name != "gen")
    # EOS ignored: every one of the 2 x 2 responses is 8 tokens long
    assert round(phases["gen"]["tokens_per_s"] * phases["gen"]["seconds"]) == 2 * 2 * 8
    # the phases are disjoint children of the step: what they leave is >= 0 and adds back to the step
    assert report["unaccounted_s"] >= 0
    assert abs(report["accounted_s"] + report["unaccounted_s"] - report["step_s"]) < 1e-12
    assert report["adds_up"] == (report["unaccounted_s"] <= 0.05 * report["step_s"])
    assert report["lines"][1].split()[0] == "phase" and report["lines"][-2].startswith("step")
    assert report["lines"][-1].startswith("isolated update (benchmarks/update.py fast, full logits")


def test_segment_attention_choice_sets_its_switch_on_cuda_and_clears_the_other(monkeypatch):
    from hybridflow.models import segment_attention

    monkeypatch.setattr(segment_attention, "FLEX_SEGMENT_DEVICES", ())
    monkeypatch.setattr(segment_attention, "BRANCHED_SHARED_PROMPTS_DEVICES", ())
    with loaded_benchmark("loop_step") as bench:
        assert bench.parse_args(["--device", "cpu"]).segment_attention == "per-unit"
        for choice, flex, branched in (("flex", ("cuda",), ()), ("branched", (), ("cuda",)), ("per-unit", (), ())):
            bench.use_segment_attention_choice(bench.parse_args(["--segment-attention", choice]).segment_attention)
            assert (segment_attention.FLEX_SEGMENT_DEVICES, segment_attention.BRANCHED_SHARED_PROMPTS_DEVICES) == (
                flex, branched), choice
