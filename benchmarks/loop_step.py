"""One GRPO step of the whole loop on one device: every phase's seconds, tokens/s, FLOPs and memory peak.

``main_ppo`` (its real entry point, in this process) runs GRPO with the actor, the rollout engine and the
reference colocated on one device, as verl's hybrid engine does, on a random-init model shaped from a config
only (``--shape``: benchmarks/model_shapes.py; no download), saved on the fly with the tests' tiny tokenizer.
Prompts are random text of up to ``--prompt-len`` tokens, EOS is ignored (``rollout.ignore_eos``), so every
response is ``--response-len`` tokens long, as a real run's lengths would be. verl-like settings: GRPO with the
KL loss against the reference (so the reference phase runs), one optimizer step per rollout, token-budget
micro-batches (``use_dynamic_bsz``).

Reported per phase of the measured steps (the loop's own ``timing_s/*``; the first step is a warm-up):
    seconds    the phase's ``timing_s/<phase>`` (each boundary synchronizes the device: PHASE_OBSERVERS)
    tok/s      the tokens the phase runs / its seconds: gen = generated tokens, old_log_prob / ref / update_actor
               = every valid prompt + response token, sync_weights = parameters
    TFLOP      forward-only phases 2 N D, the update 6 N D (N the parameters that run matmuls, D tokens), plus
               the causal attention's 2 x layers x heads x head_dim x L^2 per row (x3 for the update);
               generation: 2 N per generated token + attention over the cached context
    MFU        FLOPs / seconds / peak, the peak a large matmul measured in the same run (bf16 on a GPU, fp32 on CPU)
    peak GB    torch.cuda.max_memory_allocated, reset at each phase's start (CPU: the resident-set peak, VmHWM,
               reset through /proc/self/clear_refs)
    KV GB      the most bytes the native engine's KV cache (block pool, and on CPU its slot mirror) held during
               the phase, as allocated (on CPU only the pages written are resident). With
               ``rollout.free_cache_engine`` (the default; ``--keep-kv-cache`` turns it off) it is held in ``gen``
               only: the engine releases it after each generate, so the later phases show 0
and the step: its wall time (``timing_s/step``) against the sum of its phases (they must add up within 5 %; the
rest is printed as ``unaccounted``), the step's tokens/s and MFU. ``--isolated`` runs, in the same process after the
loop, benchmarks/update.py's ``fast`` variant with the loop's default head (full logits) on the same shape,
prompts x n and micro-batch budget (update.py's own rows), and prints its tokens/s beside the loop's update phase.

    python benchmarks/loop_step.py --device cuda --shape qwen2.5-1.5b              # 32 x 8, <= 512 + 1024 tokens
    python benchmarks/loop_step.py --device cpu --shape tiny --prompts 2 --n 2 --prompt-len 48 --response-len 8
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from model_shapes import SHAPES, random_model  # noqa: E402

FORWARD_PHASES = ("old_log_prob", "ref")
UPDATE_PHASE, GEN_PHASE, SYNC_PHASE = "update_actor", "gen", "sync_weights"
TOLERANCE = 0.05
"""The phases must add up to the step within this share of it."""


SEGMENT_ATTENTION = {"per-unit": "fast", "branched": "fast-branched", "flex": "fast-flex"}
"""--segment-attention: the benchmarks/update.py variant whose shared-prompt attention the loop takes."""


def use_segment_attention_choice(choice: str) -> None:
    """Set the segment-attention switches for ``choice`` (on cuda only), as update.py's variant of that layout."""
    import update

    update.switch_segment_attention(update.VARIANTS[SEGMENT_ATTENTION[choice]])


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", default="qwen2.5-1.5b", help=f"one of {', '.join(SHAPES)}")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8, help="responses per prompt")
    parser.add_argument("--prompt-len", type=int, default=512, help="data.max_prompt_length")
    parser.add_argument("--response-len", type=int, default=1024, help="data.max_response_length (EOS ignored)")
    parser.add_argument("--micro-tokens", type=int, default=4096, help="token budget of a micro-batch")
    parser.add_argument("--steps", type=int, default=2, help="training steps (the first is a warm-up)")
    parser.add_argument("--isolated", action="store_true", help="also run benchmarks/update.py's fast variant")
    parser.add_argument("--keep-kv-cache", action="store_true",
                        help="actor_rollout_ref.rollout.free_cache_engine=False: the engine keeps its KV cache "
                             "through the update (default: freed after each rollout, as verl)")
    parser.add_argument("--segment-attention", choices=tuple(SEGMENT_ATTENTION), default="per-unit",
                        help="on cuda, how a packed row's shared-prompt units attend in the actor's, old log-prob's "
                             "and reference's forwards: per-unit (the default: one SDPA call per unit), branched "
                             "(fused causal kernels branch by branch) or flex (one compiled FlexAttention call a "
                             "layer); benchmarks/update.py's fast / fast-branched / fast-flex in the whole loop")
    parser.add_argument("--out", default=None, help="work folder (default: a temp dir)")
    parser.add_argument("overrides", nargs="*", help="more main_ppo key=value overrides")
    args = parser.parse_args(argv)
    if args.shape not in SHAPES:
        parser.error(f"--shape: unknown {args.shape}; choose from {', '.join(SHAPES)}")
    return args


# ------------------------------------------------------------------------------ inputs
def save_model(shape: str, path: str, device: str) -> str:
    """A random-init ``shape`` model (bf16) with the tests' tiny tokenizer, saved like a checkpoint."""
    from hybridflow.models.tiny import build_tiny_tokenizer

    model = random_model(shape, dtype="bfloat16", device=device)
    model.save_pretrained(path, safe_serialization=True)
    build_tiny_tokenizer().save_pretrained(path)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return path


def write_prompts(path: str, *, rows: int, max_tokens: int, seed: int = 0) -> str:
    """``rows`` prompts (verl's row schema, jsonl) of random words, from a quarter of ``max_tokens`` to
    ``max_tokens`` - 32 tokens (room for the chat template; longer ones are cut from the left)."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "sum", "the", "of", "number", "seven", "and", "then", "add"]
    with open(path, "w") as fh:
        for index in range(rows):
            count = rng.randint(max(1, max_tokens // 4), max(2, max_tokens - 32))
            text = " ".join(rng.choice(words) for _ in range(count))
            fh.write(json.dumps({"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": text}],
                                 "reward_model": {"style": "rule", "ground_truth": "42"},
                                 "extra_info": {"index": index}}) + "\n")
    return path


def overrides(args, *, model: str, data: str, out: str) -> list[str]:
    """main_ppo's keys for the benchmark's GRPO step (module docstring)."""
    actor, budget = "actor_rollout_ref.actor", args.micro_tokens
    return [
        "algorithm.adv_estimator=grpo", f"data.train_files={data}", f"data.val_files={data}",
        f"data.train_batch_size={args.prompts}", f"data.max_prompt_length={args.prompt_len}",
        f"data.max_response_length={args.response_len}", "data.truncation=left",
        f"actor_rollout_ref.model.path={model}", f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.ignore_eos=True",
        f"{actor}.ppo_mini_batch_size={args.prompts}", f"{actor}.use_dynamic_bsz=True",
        f"{actor}.ppo_max_token_len_per_gpu={budget}", f"{actor}.use_kl_loss=True", f"{actor}.kl_loss_coef=0.001",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
        f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={budget}",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
        f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={budget}",
        f"trainer.device={args.device}", "trainer.n_gpus_per_node=1", f"trainer.total_training_steps={args.steps}",
        "trainer.test_freq=-1", "trainer.val_before_train=False", "trainer.save_freq=-1", "trainer.logger=[file]",
        f"trainer.default_local_dir={out}", "reward_model.timeout_s=null",
        f"actor_rollout_ref.rollout.free_cache_engine={not args.keep_kv_cache}", *args.overrides,
    ]


# ------------------------------------------------------------------------------ per-phase memory
class PhaseMemory:
    """A PHASE_OBSERVERS entry: synchronizes the device at each phase's boundaries (so a phase's seconds hold
    its own kernels) and records each phase's memory peak, the most KV cache bytes the native engines held in it
    (``kv_peaks``) and its parent phase. A nested phase folds the peaks so far into every open phase before
    resetting the counters, so each phase's peaks cover its nested ones."""

    def __init__(self, device: str):
        self.device, self.open, self.peaks, self.kv_peaks, self.parents = device, {}, {}, {}, {}
        self.resettable = True
        """False once the CPU's peak could not be reset (each phase's peak is then the process's so far)."""

    def enter(self, name: str) -> None:
        self._fold()
        self.parents[name] = next(reversed(self.open), None)
        self.open[name] = (0, 0)
        self._reset()

    def exit(self, name: str) -> None:
        self._fold()
        peak, kv = self.open.pop(name, (0, 0))
        self.peaks[name] = max(self.peaks.get(name, 0), peak)
        self.kv_peaks[name] = max(self.kv_peaks.get(name, 0), kv)

    def _fold(self) -> None:
        peak, kv = self._peak(), self._kv_peak()
        for name, (open_peak, open_kv) in self.open.items():
            self.open[name] = (max(open_peak, peak), max(open_kv, kv))

    def _peak(self) -> int:
        if self.device == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))

    @staticmethod
    def _kv_peak() -> int:
        from hybridflow.rollout.native import live_engines

        return sum(engine.kv_high_water for engine in live_engines())

    def _reset(self) -> None:
        from hybridflow.rollout.native import live_engines

        for engine in live_engines():
            engine.reset_kv_high_water()
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        elif self.resettable:
            try:
                with open("/proc/self/clear_refs", "w") as fh:
                    fh.write("5")  # resets VmHWM to the current resident set
            except OSError:  # a container that forbids it: the peaks become the process's peak so far
                self.resettable = False


# ------------------------------------------------------------------------------ counts
def model_counts(shape: str) -> dict:
    """Matmul parameters (the input embedding is a lookup; tied, it is the head) and attention's width."""
    from transformers import AutoConfig

    fields = dict(SHAPES[shape])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    per_layer = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2 + 3 * hidden * config.intermediate_size
    return {"params": layers * per_layer + hidden * vocab, "layers": layers, "attn_width": heads * head_dim}


def phase_flops(counts: dict, row: dict, rows: int) -> dict[str, float]:
    """FLOPs of each phase of one step from its mean lengths (module docstring); ``[rows]`` responses."""
    prompt, response = row["prompt_length/mean"], row["response_length/mean"]
    tokens = rows * (prompt + response)
    attention = 2 * counts["layers"] * counts["attn_width"] * rows * (prompt + response) ** 2  # causal QK^T + AV
    forward = 2 * counts["params"] * tokens + attention
    # generation: each new token's matmuls, and its attention over the context so far (prompt + half the response)
    gen_attention = 4 * counts["layers"] * counts["attn_width"] * rows * response * (prompt + response / 2)
    return {GEN_PHASE: 2 * counts["params"] * rows * response + gen_attention,
            **{name: forward for name in FORWARD_PHASES}, UPDATE_PHASE: 3 * forward}


def phase_tokens(counts: dict, row: dict, rows: int) -> dict[str, float]:
    tokens = rows * (row["prompt_length/mean"] + row["response_length/mean"])
    return {GEN_PHASE: rows * row["response_length/mean"], **{name: tokens for name in FORWARD_PHASES},
            UPDATE_PHASE: tokens, SYNC_PHASE: counts["params"]}


def step_report(rows_of_metrics: list[dict], memory: PhaseMemory, counts: dict, *, responses: int,
                peak_flops: float) -> dict:
    """Means over the measured steps: per phase seconds, tokens/s, FLOPs, MFU, memory peak; the step's sum."""
    measured = rows_of_metrics[1:] or rows_of_metrics
    names = [key.removeprefix("timing_s/") for key in measured[0] if key.startswith("timing_s/")]
    top = [name for name in names if memory.parents.get(name) == "step"]
    seconds = {name: sum(r[f"timing_s/{name}"] for r in measured) / len(measured) for name in names}
    flops, tokens = phase_flops(counts, measured[-1], responses), phase_tokens(counts, measured[-1], responses)
    phases = {name: {"seconds": seconds[name], "peak_bytes": memory.peaks.get(name, 0),
                     "kv_bytes": memory.kv_peaks.get(name, 0),
                     "tokens_per_s": tokens[name] / seconds[name] if name in tokens else None,
                     "flops": flops.get(name, 0.0),
                     "mfu": flops[name] / seconds[name] / peak_flops if name in flops else None} for name in top}
    step = seconds["step"]
    accounted = sum(seconds[name] for name in top)
    return {"phases": phases, "step_s": step, "accounted_s": accounted, "unaccounted_s": step - accounted,
            "adds_up": abs(step - accounted) <= TOLERANCE * step,
            "step_mfu": sum(flops.values()) / step / peak_flops, "step_peak_bytes": memory.peaks.get("step", 0),
            "step_kv_bytes": memory.kv_peaks.get("step", 0),
            "step_tokens_per_s": tokens[UPDATE_PHASE] / step}


# ------------------------------------------------------------------------------ run and print
def run_loop(args, out: str) -> tuple[list[dict], PhaseMemory]:
    """main_ppo in this process with a PhaseMemory observing its timer; its metrics rows."""
    from hybridflow.trainer import main_ppo
    from hybridflow.trainer.tracking import metrics

    model = save_model(args.shape, os.path.join(out, "model"), args.device)
    data = write_prompts(os.path.join(out, "train.jsonl"), rows=max(args.prompts, 8), max_tokens=args.prompt_len)
    memory = PhaseMemory(args.device)
    metrics.PHASE_OBSERVERS.append(memory)
    try:
        code = main_ppo.main(overrides(args, model=model, data=data, out=os.path.join(out, "run")))
    finally:
        metrics.PHASE_OBSERVERS.remove(memory)
    if code:
        raise SystemExit(f"main_ppo ended with exit code {code}")
    with open(os.path.join(out, "run", "logs", "metrics.jsonl")) as fh:
        return [json.loads(line) for line in fh], memory


def isolated_update(args, peak_flops: float) -> dict | None:
    """benchmarks/update.py's ``fast`` variant with the full logits at the loop's shape, prompts x n and micro-batch budget (its rows:
    prompts of 64-256 tokens, responses log-normal around 256); None for a shape that is not Qwen2 (update.py
    builds Qwen2 models)."""
    import update

    if SHAPES[args.shape]["model_type"] != "qwen2":
        return None
    update.SHAPES.setdefault(args.shape, SHAPES[args.shape])
    update_args = update.parse_args(["--shape", args.shape, "--prompts", str(args.prompts), "--n", str(args.n),
                                     "--micro-tokens", str(args.micro_tokens), "--steps", "2", "--no-breakdown",
                                     "--device", args.device])
    # the loop's defaults: shared prompts, the full logits (use_fused_kernels off), bf16 autocast on a GPU only
    variant = update.dataclasses.replace(update.VARIANTS["fast"], chunked_head=False,
                                         precision="bf16" if args.device == "cuda" else "fp32")
    return update.run_variant(args.shape, variant, update_args, torch.device(args.device), peak_flops)


def table(report: dict) -> list[str]:
    lines = [f"{'phase':14} {'seconds':>8} {'share':>6} {'tok/s':>10} {'TFLOP':>8} {'MFU':>6} {'peak_GB':>8} "
             f"{'KV_GB':>7}"]
    step = report["step_s"]
    for name, phase in report["phases"].items():
        rate = "-" if phase["tokens_per_s"] is None else f"{phase['tokens_per_s']:.0f}"
        mfu = "-" if phase["mfu"] is None else f"{100 * phase['mfu']:.1f}%"
        lines.append(f"{name:14} {phase['seconds']:8.3f} {100 * phase['seconds'] / step:5.1f}% {rate:>10} "
                     f"{phase['flops'] / 1e12:8.3f} {mfu:>6} {phase['peak_bytes'] / 1e9:8.2f} "
                     f"{phase['kv_bytes'] / 1e9:7.3f}")
    lines.append(f"{'unaccounted':14} {report['unaccounted_s']:8.3f} {100 * report['unaccounted_s'] / step:5.1f}%")
    lines.append(f"{'step':14} {step:8.3f} {100.0:5.1f}% {report['step_tokens_per_s']:10.0f} "
                 f"{'':>8} {100 * report['step_mfu']:5.1f}% {report['step_peak_bytes'] / 1e9:8.2f} "
                 f"{report['step_kv_bytes'] / 1e9:7.3f}   phases "
                 f"{'add up' if report['adds_up'] else 'DO NOT add up'} within {100 * TOLERANCE:.0f} %")
    return lines


def isolated_line(report: dict, isolated: dict | None) -> str:
    if isolated is None:
        return "isolated update: none run (--isolated, on a Qwen2 shape)"
    loop_update = report["phases"].get(UPDATE_PHASE, {}).get("tokens_per_s")
    return (f"isolated update (benchmarks/update.py fast, full logits, {isolated['tokens']} tokens): "
            f"{isolated['tokens_per_s']:.0f} tok/s, {100 * isolated['mfu']:.1f}% MFU, "
            f"{isolated['peak_bytes'] / 1e9:.2f} GB; in the loop {loop_update or 0:.0f} tok/s")


def main(argv=None) -> dict:
    """Runs the loop, prints its table (before the isolated update, so a run cut short still reports it), then
    the isolated update's line; returns the report with its ``lines``."""
    args = parse_args(argv)
    import update

    use_segment_attention_choice(args.segment_attention)

    device = torch.device(args.device)
    peak_flops, peak_dtype = update.matmul_peak(device)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        rows, memory = run_loop(args, args.out or tmp)
        report = step_report(rows, memory, model_counts(args.shape), responses=args.prompts * args.n,
                             peak_flops=peak_flops)
    report["lines"] = [f"GRPO step of main_ppo on {update.describe_device(device)}; {peak_dtype} matmul peak "
                       f"measured {peak_flops / 1e12:.1f} TFLOP/s; shape {args.shape}, {args.prompts} prompts x "
                       f"{args.n} (<= {args.prompt_len} prompt + {args.response_len} response tokens, EOS ignored), "
                       f"micro-batches of <= {args.micro_tokens} tokens; mean of {max(1, args.steps - 1)} measured "
                       f"step(s) of {args.steps}; KV cache "
                       f"{'kept' if args.keep_kv_cache else 'freed after each rollout'} "
                       f"(rollout.free_cache_engine={not args.keep_kv_cache}); "
                       f"segment attention {args.segment_attention}; "
                       f"{time.perf_counter() - start:.0f} s for the whole run"
                       + ("" if memory.resettable else "; the CPU peaks could not be reset: each is the peak so far"),
                       *table(report)]
    print("\n".join(report["lines"]), flush=True)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    isolated = isolated_update(args, peak_flops) if args.isolated else None
    report["lines"].append(isolated_line(report, isolated))
    print(report["lines"][-1], flush=True)
    return report


if __name__ == "__main__":
    main()
