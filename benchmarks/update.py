"""The actor update at GPU speed: tokens/s, MFU, peak memory against its floor, and where the time goes.

hybridflow's own update (``ActorWorker.update_policy``: micro-batches by token budget, the policy loss,
backward, grad clip, fused AdamW) on a random-init model shaped like Qwen2.5-0.5B or -1.5B (config only,
no download; ``tiny`` for a CPU smoke run), on GRPO-like rows: ``n`` responses sharing each prompt, prompt
lengths uniform in [64, 256], response lengths log-normal (median 256, sigma 0.8, clipped to [8, 1024]).

Variants (``--variants``; each a fresh model, same rows, same seed):
    fast:  bf16 autocast over fp32 master weights and AdamW state, shared-prompt packed rows (padding-free,
           one SDPA call per unit), log-probs from the hidden states in chunks (``use_fused_kernels``),
           micro-batches of ``--micro-tokens`` (4,096) tokens
    bf16-padded: bf16 autocast, padded rows, log-probs from the full logits
    fast-ckpt: fast with activation checkpointing of every decoder layer
    fast-branched: fast with each shared-prompt unit's attention branch by branch on CUDA (fused causal
           kernels, n + 1 calls) instead of one masked SDPA call
    fast-flex: fast with a packed row's units (shared prompts included) as one compiled FlexAttention call a layer
           (hybridflow.models.flex_segments: a block mask skips the masked tiles) instead of one SDPA call per unit
    fast-12k: fast with micro-batches of 12,288 tokens (fewer, larger kernels per token)
    fast-compiled: fast with every decoder layer through torch.compile (norms, projections, rotary, SwiGLU
           fused; the attention call stays eager); not in --quick: compiling takes its own minute
    plain: fp32, padded rows, log-probs from the full logits (verl's defaults)
    trl:   TRL's GRPOTrainer loss (its fused LM head, ``loss_type="dapo"``: the same token-mean loss) and its
           fused AdamW on the same rows, bf16 autocast, padded as TRL pads a generation batch
           (benchmarks/trl_update.py); the baseline: its first step's gradient norm equals hybridflow's
    ...and single switches via ``--precision``, ``--layout``, ``--chunked-head``, ``--checkpointing``.

Reported per variant:
    tokens/s  valid tokens (prompt + response of every row, as a padded batch counts them) / update seconds
    MFU       model FLOPs / seconds / peak, model FLOPs = 6 (N_body x tokens the layout must run + N_head x
              response tokens) (Kaplan et al. 2020, "Scaling Laws", C = 6 N D; the head only runs on response
              positions; attention's ``L^2`` FLOPs left out as in that count); the tokens: every valid token
              (padding is waste, not counted), each prompt once in the shared-prompt layout; peak = a large
              bf16 matmul timed in the same run (fp32 on the CPU)
    peak memory  torch.cuda.max_memory_allocated (CPU: peak RSS growth) against the floor
              16 N bytes (fp32 weights, grads, Adam m and v) + the kept activations of the largest
              micro-batch, ``layers x tokens x (6 h + 2 kv + 4 i) x bytes`` (the inputs of the matmuls,
              norms and SwiGLU; flash / efficient SDPA keeps no ``L^2`` scores)
    breakdown  one more real update step, its wall time cut into disjoint intervals by hooks (StepClock): every
              layer's attention module (projections, rotary, SDPA) and MLP, forward and backward; the head
              (final norm's output to its gradient: vocab projection, log-softmax, loss); the optimizer step
              (clip + AdamW); ``other`` = the rest (embedding, norms, residuals, packing); shares of that
              instrumented step (each boundary synchronizes, so on a GPU it is slower than step_s); none
              under checkpointing or compile (recomputed / fused layers have no clean boundaries)

    python benchmarks/update.py --quick                      # the 1.5B shape, 5 variants, ~75 s on one H200
    python benchmarks/update.py --shape tiny --variants bf16-padded,trl --precision fp32   # TRL's ratio, CPU
    python benchmarks/update.py --shape tiny --steps 2       # CPU smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import math
import os
import resource
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hybridflow.data.batch import Batch  # noqa: E402
from hybridflow.models import segment_attention  # noqa: E402
from hybridflow.models.fsdp import autocast_forward  # noqa: E402
from hybridflow.models.loader import enable_gradient_checkpointing  # noqa: E402
from hybridflow.workers.actor import ActorWorker, PolicyObjective  # noqa: E402
from hybridflow.workers.logprob import pack_micro_batch  # noqa: E402
from hybridflow.workers.micro_batches import LogProbBatching, balanced_token_groups  # noqa: E402
from hybridflow.workers.optim import TrainState, build_optimizer, build_scheduler  # noqa: E402
from hybridflow.workers.ppo_update import UpdateSchedule  # noqa: E402
from model_shapes import SHAPES as MODEL_SHAPES  # noqa: E402

SHAPES = {  # Qwen2.5's shapes from benchmarks/model_shapes.py (config.json values; tied embeddings)
    "tiny": MODEL_SHAPES["tiny"],
    "0.5b": MODEL_SHAPES["qwen2.5-0.5b"],
    "1.5b": MODEL_SHAPES["qwen2.5-1.5b"],
}


@dataclasses.dataclass(frozen=True)
class Variant:
    """One way to run the update (what the flags switch)."""

    precision: str = "bf16"
    """bf16: autocast over fp32 weights (hybridflow.models.fsdp.autocast_forward); fp32: no autocast."""
    layout: str = "shared_prompt"
    """padded / packed / shared_prompt (hybridflow.workers.logprob.forward_layout)."""
    chunked_head: bool = True
    """Log-probs from the hidden states in chunks (use_fused_kernels) instead of the full logits."""
    checkpointing: bool = False
    """Activation checkpointing per decoder layer (enable_gradient_checkpointing)."""
    branched_attention: bool = False
    """On CUDA, shared-prompt units branch by branch with fused causal kernels; False: one masked SDPA call
    per unit (hybridflow.models.segment_attention.BRANCHED_SHARED_PROMPTS_DEVICES)."""
    flex_attention: bool = False
    """On CUDA, every unit of a packed row in one compiled FlexAttention call a layer
    (hybridflow.models.segment_attention.FLEX_SEGMENT_DEVICES); takes precedence over branched_attention."""
    micro_tokens: int | None = None
    """Token budget of a micro-batch; None: ``--micro-tokens``."""
    compiled: bool = False
    """torch.compile every decoder layer (dynamic shapes), the attention call left eager: fewer launches."""
    framework: str = "hybridflow"
    """hybridflow: ActorWorker.update_policy; trl: TRL's GRPOTrainer loss and optimizer (benchmarks/trl_update.py)."""


VARIANTS = {"fast": Variant(), "bf16-padded": Variant(layout="padded", chunked_head=False),
            "fast-ckpt": Variant(checkpointing=True), "fast-branched": Variant(branched_attention=True),
            "fast-flex": Variant(flex_attention=True),
            "fast-12k": Variant(micro_tokens=12288), "fast-compiled": Variant(compiled=True),
            "plain": Variant(precision="fp32", layout="padded", chunked_head=False),
            "trl": Variant(layout="padded", chunked_head=False, framework="trl")}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="1.5b", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--variants", default="fast", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--precision", choices=("bf16", "fp32"), help="override every variant's precision")
    parser.add_argument("--layout", choices=("padded", "packed", "shared_prompt"), help="override the layout")
    parser.add_argument("--chunked-head", choices=("on", "off"), help="override the head")
    parser.add_argument("--checkpointing", choices=("on", "off"), help="override activation checkpointing")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per optimizer step")
    parser.add_argument("--n", type=int, default=8, help="responses per prompt")
    parser.add_argument("--micro-tokens", type=int, default=4096, help="token budget of a micro-batch")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (the first is a warm-up)")
    parser.add_argument("--quick", action="store_true",
                        help="--shape 1.5b --variants fast,fast-flex,fast-branched,fast-12k,bf16-padded,trl --steps 2 (the "
                             "goal's shape; about 75 s on one H200 before fast-flex, whose warm-up step compiles; "
                             "the GPU script's update stage)")
    parser.add_argument("--no-breakdown", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.quick:
        args.shape, args.variants, args.steps = "1.5b", "fast,fast-flex,fast-branched,fast-12k,bf16-padded,trl", 2
    for flag, given, known in (("--shape", args.shape, SHAPES), ("--variants", args.variants, VARIANTS)):
        unknown = [name for name in given.split(",") if name not in known]
        if unknown:
            parser.error(f"{flag}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    return args


def chosen_variants(args) -> dict[str, Variant]:
    overrides = {key: value for key, value in (
        ("precision", args.precision), ("layout", args.layout),
        ("chunked_head", None if args.chunked_head is None else args.chunked_head == "on"),
        ("checkpointing", None if args.checkpointing is None else args.checkpointing == "on")) if value is not None}
    return {name: dataclasses.replace(VARIANTS[name], **overrides) for name in args.variants.split(",")}


# ------------------------------------------------------------------------------ model and rows
def build_model(shape: str, device: torch.device, *, seed: int = 0):
    """A random-init Qwen2 causal LM of ``shape`` in fp32 on ``device`` (initialised there: no CPU copy)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    fields = {key: value for key, value in SHAPES[shape].items() if key != "model_type"}
    config = Qwen2Config(**fields, use_cache=False, attn_implementation="sdpa")
    torch.manual_seed(seed)
    with torch.device(device):
        return Qwen2ForCausalLM(config)


PROMPT_WIDTH = 256
"""The prompt columns of :func:`grpo_rows`' layout (its longest prompt)."""


def grpo_rows(*, prompts: int, n: int, vocab: int, seed: int = 0, max_prompt: int = PROMPT_WIDTH,
              max_response: int = 1024) -> Batch:
    """``prompts x n`` rows in the PPO batch layout (``[B, P + T]`` left-padded prompt ++ right-padded
    response), each prompt's ``n`` rows sharing its tokens, with a random advantage per row (GRPO's are
    centred per prompt; the update's cost does not depend on their values)."""
    gen = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(64, max_prompt + 1, (prompts,), generator=gen).repeat_interleave(n)
    median, sigma = 256.0, 0.8
    response_lens = (torch.randn(prompts * n, generator=gen) * sigma + math.log(median)).exp()
    response_lens = response_lens.round().long().clamp(8, max_response)
    width = int(response_lens.max())
    ids = torch.zeros(prompts * n, max_prompt + width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row in range(prompts * n):
        if row % n == 0:
            prompt = torch.randint(10, vocab, (int(prompt_lens[row]),), generator=gen)
        ids[row, max_prompt - prompt.numel():max_prompt] = prompt
        mask[row, max_prompt - prompt.numel():max_prompt + int(response_lens[row])] = 1
        ids[row, max_prompt:max_prompt + int(response_lens[row])] = torch.randint(
            10, vocab, (int(response_lens[row]),), generator=gen)
    response_mask = mask[:, max_prompt:].float()
    advantages = torch.randn(prompts * n, generator=gen)[:, None] * response_mask
    return Batch({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
                  "responses": ids[:, max_prompt:], "response_mask": response_mask, "advantages": advantages})


def build_actor(model, *, variant: Variant, rows: int, micro_tokens: int, device: torch.device) -> ActorWorker:
    """hybridflow's actor worker: one optimizer step per update over ``rows`` rows, token-budget
    micro-batches (``use_dynamic_bsz``; a packed layout's budget counts valid tokens), fused AdamW (hybridflow.workers.optim picks it on CPU and CUDA), grad clip 1."""
    if variant.checkpointing:
        enable_gradient_checkpointing(model)
    if variant.compiled:
        compile_decoder_layers(model)
    model = autocast_forward(model, device_type=device.type,
                             dtype=torch.bfloat16 if variant.precision == "bf16" else None)
    optimizer = build_optimizer(model.parameters(), lr=1e-6, betas=(0.9, 0.999), weight_decay=0.01)
    scheduler = build_scheduler(optimizer, warmup_steps=0, total_steps=1_000_000, style="constant")
    state = TrainState(model, optimizer, scheduler, grad_clip=1.0)
    schedule = UpdateSchedule(mini_batch_size=rows, use_dynamic_bsz=True, max_token_len=micro_tokens)
    return ActorWorker(state=state, schedule=schedule, objective=PolicyObjective(loss_agg_mode="token-mean"),
                       log_prob=LogProbBatching(use_dynamic_bsz=True, max_token_len=micro_tokens),
                       layout=variant.layout, chunked_head=variant.chunked_head)


def compile_decoder_layers(model) -> None:
    """torch.compile each decoder layer with dynamic shapes (micro-batch lengths change); the attention
    function (a Python loop over a packed row's units) runs eager between the compiled pieces."""
    from transformers import AttentionInterface

    segment_attention.use_segment_attention(model)
    mapping = AttentionInterface._global_mapping
    if not getattr(mapping[segment_attention.IMPLEMENTATION], "_left_eager", False):
        eager = torch.compiler.disable(mapping[segment_attention.IMPLEMENTATION])
        eager._left_eager = True
        mapping[segment_attention.IMPLEMENTATION] = eager
    for layer in model.model.layers:
        layer.compile(dynamic=True)


# ------------------------------------------------------------------------------ clocks and counts
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, *, repeats: int = 1) -> float:
    """Seconds per call of ``fn`` (CUDA events on a GPU, the wall clock on a CPU), after one warm-up."""
    fn()
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        return (time.perf_counter() - start) / repeats
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1000 / repeats


def matmul_peak(device: torch.device) -> tuple[float, str]:
    """(FLOP/s of a large square matmul, its dtype): bf16 on a GPU (the MFU's peak), fp32 on a CPU."""
    size, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (1024, torch.float32)
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    seconds = timed(lambda: a @ b, device, repeats=20 if device.type == "cuda" else 3)
    return 2 * size**3 / seconds, str(dtype).removeprefix("torch.")


def head_and_body_params(model) -> tuple[int, int]:
    """(head parameters, body parameters that run matmuls): the input embedding is a lookup (no FLOPs);
    with tied embeddings its matrix is the head's."""
    head = model.get_output_embeddings().weight.numel()
    embedding = model.get_input_embeddings().weight.numel()
    total = sum(p.numel() for p in model.parameters())
    return head, total - embedding - (0 if model.config.tie_word_embeddings else head)


def needed_tokens(micros: list[Batch], layout: str) -> list[int]:
    """Tokens each micro-batch's forward must run in ``layout``: its valid tokens (the padding a padded
    forward also runs is waste, not counted), each prompt once in the shared-prompt layout."""
    if layout == "shared_prompt":
        return [pack_micro_batch(m, layout=layout).input_ids.shape[1] for m in micros]
    return [int(m["attention_mask"].sum()) for m in micros]


def activation_floor(model, tokens: int, bytes_per: int) -> int:
    """Bytes of kept activations for ``tokens`` (module docstring: the matmul / norm / SwiGLU inputs)."""
    cfg = model.config
    kv = cfg.num_key_value_heads * cfg.hidden_size // cfg.num_attention_heads
    per_token = 6 * cfg.hidden_size + 2 * kv + 4 * cfg.intermediate_size
    return cfg.num_hidden_layers * tokens * per_token * bytes_per


def peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ------------------------------------------------------------------------------ the parts, inside one step
class StepClock:
    """Splits one real update step's wall time into disjoint intervals per part: ``attention`` and ``mlp`` (each
    decoder layer's module, forward and backward), ``head`` (from the final norm's output to its gradient: the
    vocabulary projection, log-softmax, loss and their backward), ``optimizer`` (clip + AdamW). One interval is
    open at a time (a part that starts closes the open one), so the parts never overlap and ``other`` = step -
    their sum (embedding, norms, residuals, packing, Python) is >= 0 by construction. Every boundary
    synchronizes the device, which a real step does not: the instrumented step is slower on a GPU, and the
    shares are of its own time."""

    def __init__(self, device: torch.device):
        self.device, self.seconds, self.open = device, {}, None

    def start(self, part: str) -> None:
        now = self._now()
        self._close(now)
        self.open = (part, now)

    def stop(self, part: str) -> None:
        if self.open is not None and self.open[0] == part:
            self._close(self._now())

    def _close(self, now: float) -> None:
        if self.open is not None:
            part, began = self.open
            self.seconds[part] = self.seconds.get(part, 0.0) + now - began
            self.open = None

    def _now(self) -> float:
        synchronize(self.device)
        return time.perf_counter()

    def watch(self, module: torch.nn.Module, part: str) -> list:
        """Hooks timing ``module``'s forward (pre-hook to hook) and backward (its output's gradient to its
        input's); returns the handles."""
        def before(_module, args, kwargs):
            self.start(part)
            hidden = args[0] if args else kwargs.get("hidden_states")
            if hidden is not None and hidden.requires_grad:
                hidden.register_hook(lambda grad: self.stop(part))

        def after(_module, _args, output):
            self.stop(part)
            output = output[0] if isinstance(output, tuple) else output
            if output.requires_grad:
                output.register_hook(lambda grad: self.start(part))

        return [module.register_forward_pre_hook(before, with_kwargs=True), module.register_forward_hook(after)]

    def watch_head(self, norm: torch.nn.Module) -> list:
        """The head's interval: from the final norm's output (forward) until that output's gradient."""
        def after(_module, _args, output):
            self.start("head")
            if output.requires_grad:
                output.register_hook(lambda grad: self.stop("head"))
            else:  # no backward (a no-grad pass): the head is the rest of the forward, left to ``other``
                self.stop("head")

        return [norm.register_forward_hook(after)]


def part_seconds(actor: ActorWorker, model, batch: Batch, *, step: int, device: torch.device) -> dict:
    """``{"step": instrumented step seconds, "attention", "mlp", "head", "optimizer": seconds}`` of one
    real update step (:class:`StepClock`); the parts sum to at most the step."""
    clock, state = StepClock(device), actor.state
    handles = clock.watch_head(model.model.norm)
    for layer in model.model.layers:
        handles += clock.watch(layer.self_attn, "attention") + clock.watch(layer.mlp, "mlp")
    optimizer_step = state.step

    def timed_step(**kwargs):
        clock.start("optimizer")
        try:
            return optimizer_step(**kwargs)
        finally:
            clock.stop("optimizer")

    state.step = timed_step
    try:
        begin = clock._now()
        actor.update_policy(batch, temperature=1.0, step=step)
        seconds = clock._now() - begin
    finally:
        del state.step
        for handle in handles:
            handle.remove()
    clock._close(clock._now())
    return {"step": seconds, **{part: clock.seconds.get(part, 0.0) for part in ("attention", "mlp", "head", "optimizer")}}


def breakdown_shares(parts: dict) -> list[float]:
    """Percent of the instrumented step: attention, mlp, head, optimizer, other (the rest); sums to 100."""
    named = [parts[key] for key in ("attention", "mlp", "head", "optimizer")]
    return [100 * value / parts["step"] for value in (*named, parts["step"] - sum(named))]


# ------------------------------------------------------------------------------ one variant
def switch_segment_attention(variant: Variant) -> None:
    """Set hybridflow's shared-prompt attention switches (on CUDA) to ``variant``'s: branched, FlexAttention, or
    neither (one SDPA call per unit)."""
    segment_attention.BRANCHED_SHARED_PROMPTS_DEVICES = ("cuda",) if variant.branched_attention else ()
    segment_attention.FLEX_SEGMENT_DEVICES = ("cuda",) if variant.flex_attention else ()


def run_variant(shape: str, variant: Variant, args, device: torch.device, peak_flops: float) -> dict:
    """Build, warm up, measure ``args.steps - 1`` updates, then the parts; the numbers of the report."""
    baseline_memory = peak_memory(device)
    switch_segment_attention(variant)
    model = build_model(shape, device)
    batch = grpo_rows(prompts=args.prompts, n=args.n, vocab=model.config.vocab_size, seed=1).to(device)
    micro_tokens = variant.micro_tokens or args.micro_tokens
    build = trl_update_step if variant.framework == "trl" else hybridflow_update_step
    update, micros, actor = build(model, batch, variant=variant, micro_tokens=micro_tokens, device=device)
    seconds = []
    for step in range(args.steps):
        if step == 1 and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        synchronize(device)
        start = time.perf_counter()
        grad_norm = update(step)
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    step_seconds = sorted(seconds[1:] or seconds)[len(seconds[1:] or seconds) // 2]
    result = _counts(model, batch, micros, variant, step_seconds=step_seconds, peak_flops=peak_flops)
    result.update(peak_bytes=peak_memory(device) - (0 if device.type == "cuda" else baseline_memory),
                  grad_norm=grad_norm, micro_batches=len(micros))
    if actor is not None and not args.no_breakdown and not variant.checkpointing and not variant.compiled:
        result["parts"] = part_seconds(actor, model, batch, step=args.steps, device=device)
    del actor, model, update
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def hybridflow_update_step(model, batch: Batch, *, variant: Variant, micro_tokens: int, device: torch.device):
    """(step -> grad norm, the actor's own micro-batches, the actor) for hybridflow's update."""
    actor = build_actor(model, variant=variant, rows=len(batch), micro_tokens=micro_tokens, device=device)
    # The policy that sampled the rows is the current one (ratio 1, no token clipped), as in a GRPO step
    # with one update per rollout; random old log-probs would clip away the negative advantages' gradient.
    batch["old_log_probs"] = actor.compute_log_prob(batch, temperature=1.0)[0]
    lengths = batch["attention_mask"].sum(-1).tolist()  # the actor's own cut (same schedule)
    micros = [batch.index_select(rows) for rows in balanced_token_groups(lengths, micro_tokens)]
    return (lambda step: actor.update_policy(batch, temperature=1.0, step=step)["actor/grad_norm"]), micros, actor


def trl_update_step(model, batch: Batch, *, variant: Variant, micro_tokens: int, device: torch.device):
    """(step -> grad norm, the row slices TRL runs as micro-steps, None) for TRL's update: as many rows a
    micro-step as fit ``micro_tokens`` at the batch's padded width (TRL pads a generation batch as one)."""
    import trl_update

    missing = trl_update.trl_available()
    if missing:
        raise RuntimeError(missing)
    width = int(batch["attention_mask"].any(0).sum())
    rows_per_micro = max(1, micro_tokens // width)
    step = trl_update.build_update(model, batch, prompt_width=PROMPT_WIDTH, rows_per_micro=rows_per_micro,
                                   device=device, bf16=variant.precision == "bf16")
    return (lambda _step: step()), batch.split(rows_per_micro), None


def _counts(model, batch: Batch, micros: list[Batch], variant: Variant, *, step_seconds: float,
            peak_flops: float) -> dict:
    head_params, body_params = head_and_body_params(model)
    run_tokens = needed_tokens(micros, variant.layout)
    response_tokens = int(batch["response_mask"].sum())
    flops = 6 * (body_params * sum(run_tokens) + head_params * response_tokens)
    params = sum(p.numel() for p in model.parameters())
    act_bytes, layers = (2 if variant.precision == "bf16" else 4), model.config.num_hidden_layers
    kept = activation_floor(model, max(run_tokens), act_bytes)
    if variant.checkpointing:  # every layer's fp32 input, and one layer's activations during its recompute
        kept = layers * max(run_tokens) * model.config.hidden_size * 4 + kept // layers
    return dict(step_s=step_seconds, tokens=int(batch["attention_mask"].sum()), run_tokens=sum(run_tokens),
                tokens_per_s=int(batch["attention_mask"].sum()) / step_seconds,
                mfu=flops / step_seconds / peak_flops, params=params, floor_bytes=16 * params + kept)


# ------------------------------------------------------------------------------ report
def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    from hybridflow.cpu import describe_cpu

    return f"{describe_cpu()}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def table(results: list[tuple[str, str, Variant, dict]]) -> list[str]:
    """The final lines: one per (shape, variant), the parts as shares of the step."""
    lines = [f"{'shape':6} {'variant':13} {'prec':4} {'layout':13} {'head':7} {'ckpt':4} {'mb':>3} "
             f"{'step_s':>7} {'tok/s':>8} {'MFU':>6} {'peak_GB':>7} {'floor_GB':>8} {'TRL/this':>8}  attn/mlp/head/opt/other % of the instrumented step"]
    trl_seconds = {shape: r["step_s"] for shape, name, v, r in results if v.framework == "trl" and "step_s" in r}
    for shape, name, v, r in results:
        if "error" in r:
            lines.append(f"{shape:6} {name:13} {r['error']}")
            continue
        shares = ""
        if "parts" in r:
            shares = "/".join(f"{share:.0f}" for share in breakdown_shares(r["parts"])) + f" of {r['parts']['step']:.3f}s"
        head = "trl" if v.framework == "trl" else "chunked" if v.chunked_head else "logits"
        versus_trl = f"{trl_seconds[shape] / r['step_s']:.2f}x" if shape in trl_seconds else "-"
        lines.append(f"{shape:6} {name:13} {v.precision:4} {v.layout:13} {head:7} {'on' if v.checkpointing else 'off':4} "
                     f"{r['micro_batches']:3d} {r['step_s']:7.3f} {r['tokens_per_s']:8.0f} {100 * r['mfu']:5.1f}% "
                     f"{r['peak_bytes'] / 1e9:7.2f} {r['floor_bytes'] / 1e9:8.2f} {versus_trl:>8}  {shares}")
    return lines


def main(argv=None) -> list[str]:
    args = parse_args(argv)
    device = torch.device(args.device)
    peak_flops, peak_dtype = matmul_peak(device)
    results = []
    for shape in args.shape.split(","):
        for name, variant in chosen_variants(args).items():
            try:
                result = run_variant(shape, variant, args, device, peak_flops)
            except Exception as err:  # noqa: BLE001 -- one variant failing (out of memory...) must not end the run
                result = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:100] if str(err) else ''}"}
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            results.append((shape, name, variant, result))
            print(f"{shape} {name}: {result}", flush=True)
    lines = [f"update benchmark on {describe_device(device)}; {peak_dtype} matmul peak measured "
             f"{peak_flops / 1e12:.1f} TFLOP/s; {args.prompts} prompts x {args.n} responses per step, "
             f"micro-batches of <= {args.micro_tokens} tokens unless the variant says (padded: rows x longest row; "
             f"packed: valid tokens); median of {max(1, args.steps - 1)} steps",
             *table(results)]
    print("\n".join(lines))
    return lines


if __name__ == "__main__":
    main()
