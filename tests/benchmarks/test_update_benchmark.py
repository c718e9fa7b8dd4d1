"""benchmarks/update.py: its rows, its FLOP and memory arithmetic by hand, and a tiny CPU run of hybridflow's
update in which the fast layout (shared prompts, chunked head) and TRL's GRPO loss give the plain one's gradient norm."""

import torch

from tests.benchmarks.loader import loaded_benchmark


def test_grpo_rows_share_each_prompt_and_stay_in_their_length_ranges():
    with loaded_benchmark("update") as bench:
        batch = bench.grpo_rows(prompts=3, n=4, vocab=100, seed=0, max_prompt=256, max_response=1024)
    mask, ids = batch["attention_mask"], batch["input_ids"]
    prompt_lens = mask[:, :256].sum(-1)
    response_lens = batch["response_mask"].sum(-1)
    assert len(batch) == 12 and ((prompt_lens >= 64) & (prompt_lens <= 256)).all()
    assert ((response_lens >= 8) & (response_lens <= 1024)).all() and len(set(response_lens.tolist())) > 6
    for group in range(3):
        rows = ids[group * 4:(group + 1) * 4, :256]
        assert (rows == rows[0]).all()
    assert not (ids[0, :256] == ids[4, :256]).all()
    assert torch.equal(batch["advantages"][0] != 0, batch["response_mask"][0].bool())


def test_flop_and_memory_counts_by_hand():
    with loaded_benchmark("update") as bench:
        model = bench.build_model("tiny", torch.device("cpu"))
        head, body = bench.head_and_body_params(model)
        # tiny: h=64, i=176, 2 layers, 4 heads of 16, 2 KV heads (kv dim 32), V=1024, tied head
        per_layer = 64 * 64 + 64 + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 176 + 2 * 64  # q,k,v (+bias), o, MLP, norms
        assert head == 1024 * 64 and body == 2 * per_layer + 64  # + the final norm; the embedding is the head
        assert bench.activation_floor(model, 10, 2) == 2 * 10 * (6 * 64 + 2 * 32 + 4 * 176) * 2


def test_tiny_cpu_run_reports_a_table_and_fast_equals_plain_in_fp32():
    with loaded_benchmark("update") as bench:
        lines = bench.main(["--shape", "tiny", "--variants", "fast,plain", "--precision", "fp32", "--steps", "2",
                            "--prompts", "2", "--n", "3", "--micro-tokens", "2048", "--device", "cpu"])
    assert "matmul peak measured" in lines[0] and lines[1].split()[:2] == ["shape", "variant"]
    fast, plain = (line.split() for line in lines[2:])
    assert fast[:5] == ["tiny", "fast", "fp32", "shared_prompt", "chunked"]
    assert plain[:5] == ["tiny", "plain", "fp32", "padded", "logits"]
    assert len(fast[-3].split("/")) == 5 and fast[-2] == "of"  # attention / MLP / head / optimizer / other shares


def test_every_variant_gives_the_plain_update_gradient_in_fp32():
    with loaded_benchmark("update") as bench:
        args = bench.parse_args(["--shape", "tiny", "--steps", "1", "--prompts", "2", "--n", "3",
                                 "--micro-tokens", "1600", "--no-breakdown", "--device", "cpu"])
        fp32 = dict(precision="fp32")
        runs = {name: bench.run_variant("tiny", bench.dataclasses.replace(variant, **fp32), args,
                                        torch.device("cpu"), 1e9)
                for name, variant in bench.VARIANTS.items() if not variant.compiled}  # compiled: below
    assert runs["fast"]["micro_batches"] > 1  # several micro-batches, the groups cut between them
    assert runs["fast"]["run_tokens"] < runs["fast"]["tokens"] == runs["plain"]["run_tokens"]  # prompts once < valid
    assert "trl" in runs  # TRL's own loss code (loss_type="dapo") on the same rows: the same token-mean loss
    for name, run in runs.items():  # shared prompts, chunked head, checkpointing, TRL: the same gradient
        assert abs(run["grad_norm"] - runs["plain"]["grad_norm"]) < 1e-5 * runs["plain"]["grad_norm"], name


def test_compiled_decoder_layers_give_the_eager_gradient():
    with loaded_benchmark("update") as bench:
        args = bench.parse_args(["--shape", "tiny", "--steps", "1", "--prompts", "2", "--n", "3",
                                 "--micro-tokens", "1600", "--no-breakdown", "--precision", "fp32", "--device", "cpu"])
        runs = {name: bench.run_variant("tiny", bench.dataclasses.replace(bench.VARIANTS[name], precision="fp32"),
                                        args, torch.device("cpu"), 1e9) for name in ("fast", "fast-compiled")}
    assert abs(runs["fast-compiled"]["grad_norm"] - runs["fast"]["grad_norm"]) < 1e-5 * runs["fast"]["grad_norm"]


class ScriptedClock:
    """StepClock's arithmetic on given clock readings (no timing)."""

    def __init__(self, bench, readings):
        self.clock, readings = bench.StepClock(torch.device("cpu")), iter(readings)
        self.clock._now = lambda: next(readings)


def test_step_clock_keeps_one_part_open_so_parts_never_overlap():
    with loaded_benchmark("update") as bench:
        clock = ScriptedClock(bench, [0.0, 1.0, 4.0, 6.0, 7.0]).clock
        clock.start("attention")  # 0
        clock.start("mlp")        # 1: closes attention (1 s)
        clock.stop("attention")   # not the open part: ignored, no reading
        clock.stop("mlp")         # 4: mlp 1 -> 4 (3 s)
        clock.start("head")       # 6
        clock.stop("head")        # 7: head 1 s
        clock.stop("head")        # nothing open: ignored
        assert clock.seconds == {"attention": 1.0, "mlp": 3.0, "head": 1.0}
        assert bench.breakdown_shares({"step": 10.0, **clock.seconds, "optimizer": 2.0}) == [10.0, 30.0, 10.0, 20.0, 30.0]


def test_breakdown_of_a_real_step_adds_up_to_it():
    # The parts are disjoint intervals of one real update step: each > 0 (every hook fired), their sum <= the
    # step, and the shares with 'other' add to 100 (the H200 run's attention share summed past 100 with
    # separately timed parts: 66 + 26 + 15 + 1 - 8).
    with loaded_benchmark("update") as bench:
        args = bench.parse_args(["--shape", "tiny", "--steps", "1", "--prompts", "2", "--n", "3",
                                 "--micro-tokens", "1600", "--device", "cpu"])
        for name in ("fast", "bf16-padded"):
            parts = bench.run_variant("tiny", bench.VARIANTS[name], args, torch.device("cpu"), 1e9)["parts"]
            named = [parts[key] for key in ("attention", "mlp", "head", "optimizer")]
            assert all(value > 0 for value in named) and sum(named) <= parts["step"], (name, parts)
            shares = bench.breakdown_shares(parts)
            assert min(shares) >= 0 and abs(sum(shares) - 100) < 1e-9, (name, shares)
