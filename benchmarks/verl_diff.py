"""The differential check against verl 0.9.1: the same verl keys, weights and batch give verl's update.

    python benchmarks/verl_diff.py                  # every case (make verl-diff); ~1 min a case on 2 cores
    python benchmarks/verl_diff.py --cases grpo,gspo
    PYTHONPATH=/other/checkout python benchmarks/verl_diff.py   # hybridflow's side from another checkout

One whole actor update on a tiny Llama-style model (random init, built in code, saved to a temp folder) and a
fixed GRPO batch (2 prompts x 4 responses, left-padded prompts, right-padded ragged responses, old and
reference log-probs near the model's own), run twice in separate processes:

- verl 0.9.1 (benchmarks/verl_diff_verl_side.py, in the side venv ``.venv-verl``): ``ActorRolloutRefWorker``
  (role ``actor``, no rollout) -> its ``TrainingWorker`` -> the FSDP2 engine -> ``losses.ppo_loss``,
  configured from verl's own ``ppo_trainer.yaml`` plus the case's keys, one gloo process on the CPU;
- hybridflow (this file, the main venv): ``build_hybrid_engine`` -> ``ActorWorker.update_policy`` with the
  same keys on hybridflow's ``ppo_trainer.yaml``.

Compared parameter by parameter: the gradients each optimizer step applied (after clipping; pass within
1e-5), the weights after the update (pass within 1e-6, except elements whose gradient at some step is below
1e-6 on both sides, where AdamW's ``g / (sqrt(v) + eps)`` turns a ~1e-9 fp32 summation difference into a
weight difference of up to lr: those are counted, ``eps-out``, and left out), the metrics verl logs (names
and values, 1e-4 relative) and the dtype the decoder layers compute in. A table: case -> max differences ->
pass/fail; exit status 1 when a case fails. The learning rate is 1e-4: a wrong step (schedule, clipping,
loss) moves weights by >= 1e-5, while AdamW's normalisation of the ~1e-8 noise in small gradients stays
below 1e-6 over 4 steps (at 1e-3 it reaches 1.7e-6 in ``grad_accum``).

The side venv is made on first use: a venv of this interpreter's base Python whose ``.pth`` puts this venv's
site-packages (torch 2.13.0, transformers, ...) after its own, so no second torch is installed; into it go
verl 0.9.1 and the few packages its worker path imports that the main venv lacks, each ``--no-deps`` and
pinned (``VERL_SIDE_PACKAGES``; hydra-core needs omegaconf 2.3 / antlr 4.9, which shadow the main venv's
there). ``VERL_DIFF_FIND_LINKS`` adds a folder of wheels (e.g. where verl's wheel was downloaded).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# appended: a hybridflow on PYTHONPATH (another checkout) wins over this one
sys.path.append(ROOT) if ROOT not in sys.path else None

SIDE_VENV = os.path.join(ROOT, ".venv-verl")
VERL_SIDE_PACKAGES = [
    "verl==0.9.1", "codetiming==1.4.0", "hydra-core==1.3.2", "omegaconf==2.3.0", "antlr4-python3-runtime==4.9.3",
    "tensordict==0.10.0", "pyvers==0.2.3", "cloudpickle==3.1.3", "orjson==3.13.0", "importlib_metadata==10.2.0",
    "uvicorn==0.54.0", "fastapi==0.115.12", "starlette==0.46.2",
]
PROMPTS, ROWS_PER_PROMPT, PROMPT_WIDTH, RESPONSE_WIDTH = 2, 4, 6, 6
GRAD_TOL, WEIGHT_TOL, METRIC_RTOL, EPS_SENSITIVE = 1e-5, 1e-6, 1e-4, 1e-6
COMPARED_METRICS = ("pg_loss", "pg_clipfrac", "ppo_kl", "pg_clipfrac_lower", "kl_loss", "entropy_loss",
                    "grad_norm", "lr")
FP32 = "{param_dtype: fp32, reduce_dtype: fp32, buffer_dtype: fp32}"
BF16 = "{param_dtype: bf16, reduce_dtype: fp32, buffer_dtype: fp32}"


@dataclass
class Case:
    """One comparison: verl keys given to both sides (on top of ``BASE_KEYS``), and how it is judged."""
    keys: list[str]
    what: str
    # verl computes in bf16 unless fsdp_config.mixed_precision says otherwise; the weight cases pin fp32 (both sides)
    verl_precision: str | None = FP32
    judge: str = "exact"  # exact | bf16 (dtypes equal, gradients within bf16 rounding) | dtype
    # where hybridflow follows the verl version a key comes from: the key on our side, verl 0.9's spelling on verl's
    ours_only: list[str] = field(default_factory=list)
    verl_only: list[str] = field(default_factory=list)


def _actor(*keys: str) -> list[str]:
    return [f"actor_rollout_ref.actor.{k}" for k in keys]


BASE_KEYS = [
    "actor_rollout_ref.rollout.n=4", f"data.max_response_length={RESPONSE_WIDTH}",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    *_actor("strategy=fsdp2", "use_torch_compile=False", "ppo_mini_batch_size=2", "ppo_micro_batch_size_per_gpu=8",
            "optim.lr=1e-4", "optim.total_training_steps=10", "loss_agg_mode=token-mean"),
]
GRPO = _actor("use_kl_loss=True", "kl_loss_type=low_var_kl", "kl_loss_coef=0.001", "clip_ratio=0.2")
CASES = {
    "grpo": Case(GRPO, "GRPO: token-mean, clip 0.2, low_var_kl 0.001"),
    "drgrpo": Case(_actor("loss_agg_mode=seq-mean-token-sum-norm", "use_kl_loss=False"),
                   "Dr.GRPO: seq-mean-token-sum-norm, no KL"),
    "gspo": Case(_actor("policy_loss.loss_mode=gspo", "loss_agg_mode=seq-mean-token-mean", "clip_ratio_low=0.0003",
                        "clip_ratio_high=0.0004", "use_kl_loss=False"), "GSPO (recipe's clip 3e-4 / 4e-4)"),
    "grad_accum": Case(GRPO + _actor("ppo_mini_batch_size=1", "ppo_micro_batch_size_per_gpu=2", "ppo_epochs=2"),
                       "2 mini-batches x 2 micro-batches, 2 epochs"),
    "dynamic_bsz": Case(GRPO + _actor("use_dynamic_bsz=True", "ppo_max_token_len_per_gpu=24"),
                        "use_dynamic_bsz, 24 tokens a micro-batch"),
    "lr_warmup": Case(GRPO + _actor("optim.lr_warmup_steps=4"), "optim.lr_warmup_steps=4 (verl: lr s/W)"),
    "clip_ratio_only": Case(_actor("use_kl_loss=False", "clip_ratio=0.1"),
                            "only actor.clip_ratio=0.1 (verl's clip_ratio_low/high 0.2 win)"),
    # verl < 0.9 clipped at actor.grad_clip; verl 0.9.1 reads optim.clip_grad only. hybridflow follows the version
    # a key comes from (issue 49), so actor.grad_clip=0.2 here is verl 0.9.1's optim.clip_grad=0.2
    "grad_clip": Case(GRPO, "actor.grad_clip=0.2 (verl < 0.9's key) against verl 0.9.1's optim.clip_grad=0.2",
                      ours_only=_actor("grad_clip=0.2"), verl_only=_actor("optim.clip_grad=0.2")),
    "optim_clip_grad": Case(GRPO + _actor("optim.clip_grad=0.2"), "actor.optim.clip_grad=0.2"),
    "entropy_metrics": Case(GRPO + _actor("entropy_coeff=0.01") + ["actor_rollout_ref.rollout.temperature=0.7"],
                            "entropy_coeff 0.01, temperature 0.7: entropy_loss and its value"),
    "mixed_precision_dict": Case(GRPO + [f"+actor_rollout_ref.actor.fsdp_config.mixed_precision={BF16}"],
                                 "fsdp_config.mixed_precision as verl's dict (bf16 compute)", verl_precision=None,
                                 judge="bf16"),
    "mixed_precision_default": Case(GRPO, "no mixed_precision: verl computes in bf16 (hybridflow: bf16 on a GPU "
                                    "and a CPU with bf16 units, fp32 on others, docs/configuration.md)", verl_precision=None, judge="dtype"),
}


# ----------------------------------------------------------------------------- shared inputs
def make_inputs(workdir: str) -> str:
    """The tiny model (saved) and the GRPO batch (``batch.pt``) both sides read; returns the model folder."""
    from hybridflow.models.tiny import save_tiny_model

    model_dir = save_tiny_model(os.path.join(workdir, "model"), arch="llama", seed=0)
    torch.save(grpo_batch(model_dir), os.path.join(workdir, "batch.pt"))
    return model_dir


def grpo_batch(model_dir: str) -> dict[str, torch.Tensor]:
    """2 prompts x 4 responses: ``[8, 6]`` left-padded prompts (lengths 6, 3) shared within a group,
    ``[8, 6]`` right-padded responses (lengths 1..6), an advantage per row broadcast over its response, and
    old / reference log-probs: the model's own ``[8, 6]`` plus 0.15 / 0.1 x N(0, 1) (ratios off 1)."""
    gen = torch.Generator().manual_seed(0)
    prompt_lengths = torch.tensor([6, 3]).repeat_interleave(ROWS_PER_PROMPT)
    response_lengths = torch.tensor([6, 3, 5, 1, 6, 2, 4, 6])
    prompts = torch.randint(3, 200, (PROMPTS, PROMPT_WIDTH), generator=gen).repeat_interleave(ROWS_PER_PROMPT, 0)
    responses = torch.randint(3, 200, (PROMPTS * ROWS_PER_PROMPT, RESPONSE_WIDTH), generator=gen)
    prompt_mask = (torch.arange(PROMPT_WIDTH) >= PROMPT_WIDTH - prompt_lengths.unsqueeze(1)).long()
    response_mask = (torch.arange(RESPONSE_WIDTH) < response_lengths.unsqueeze(1)).long()
    attention = torch.cat([prompt_mask, response_mask], dim=1)
    input_ids = torch.cat([prompts, responses], dim=1) * attention
    batch = {"prompts": prompts * prompt_mask, "responses": responses * response_mask, "input_ids": input_ids,
             "attention_mask": attention, "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
             "response_mask": response_mask}
    scores = torch.randn(PROMPTS * ROWS_PER_PROMPT, generator=gen)
    batch["advantages"] = scores.unsqueeze(1) * response_mask
    log_probs = response_log_probs(model_dir, batch)
    batch["old_log_probs"] = (log_probs + 0.15 * torch.randn(log_probs.shape, generator=gen)) * response_mask
    batch["ref_log_prob"] = (log_probs + 0.1 * torch.randn(log_probs.shape, generator=gen)) * response_mask
    return batch


def response_log_probs(model_dir: str, batch: dict) -> torch.Tensor:
    """log pi(response token) ``[B, R]`` under the saved weights (plain transformers forward, fp32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits.float()
    logits = logits[:, PROMPT_WIDTH - 1:-1]
    return torch.log_softmax(logits, -1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)


# ----------------------------------------------------------------------------- hybridflow's side
def run_hybridflow_side(case_dir: str) -> None:
    """hybridflow's update on the case (its process: ``--side hybridflow CASE_DIR``); writes hybridflow.pt."""
    from hybridflow.config import PPOConfig, load_config
    from hybridflow.data.batch import Batch
    from hybridflow.data.parallel import LOCAL
    from hybridflow.trainer.roles.builders import build_hybrid_engine

    with open(os.path.join(case_dir, "case.json")) as f:
        case = json.load(f)
    keys = [k.lstrip("+") for k in case["overrides"]]
    cfg = load_config(PPOConfig, keys)
    actor = build_hybrid_engine(LOCAL, cfg=cfg, total_steps=cfg.actor_rollout_ref.actor.optim.total_training_steps,
                                with_rollout=False, with_reference=False).actor
    applied = record_applied_gradients(actor.model, actor.state.optimizer)
    dtypes = record_compute_dtype(actor.model)
    tensors = torch.load(os.path.join(case_dir, "batch.pt"))
    tensors["ref_log_probs"] = tensors.pop("ref_log_prob")
    metrics = actor.update_policy(Batch.from_dict(tensors=tensors),
                                  temperature=cfg.actor_rollout_ref.rollout.temperature, step=1)
    weights = {plain_name(n): full(p) for n, p in actor.model.named_parameters()}
    torch.save({"weights": weights, "applied": applied, "dtypes": sorted(set(dtypes)),
                "metrics": {k: float(v) for k, v in metrics.items()}}, os.path.join(case_dir, "hybridflow.pt"))


def plain_name(name: str) -> str:
    """A parameter's name without FSDP / compile / autocast wrapper prefixes."""
    for wrapper in ("_fsdp_wrapped_module.", "_orig_mod.", "_checkpoint_wrapped_module.", "module."):
        name = name.replace(wrapper, "")
    return name


def full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().float().cpu().clone()


def record_applied_gradients(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[dict]:
    """Each optimizer step's gradients (after clipping) by parameter name, appended to the returned list."""
    names = {id(p): plain_name(n) for n, p in module.named_parameters()}
    steps: list[dict] = []

    def before_step(opt, args, kwargs):
        steps.append({names[id(p)]: full(p.grad) for group in opt.param_groups for p in group["params"]
                      if p.grad is not None})

    optimizer.register_step_pre_hook(before_step)
    return steps


def record_compute_dtype(module: torch.nn.Module) -> list[str]:
    """The dtype of the first decoder layer's query projection output, once per forward."""
    seen: list[str] = []
    target = next(m for n, m in module.named_modules() if n.endswith("layers.0.self_attn.q_proj"))
    target.register_forward_hook(lambda mod, args, out: seen.append(str(out.dtype).replace("torch.", "")))
    return seen


# ----------------------------------------------------------------------------- the side venv
def ensure_side_venv() -> str:
    """``.venv-verl``'s python, made (once) as the module docstring says."""
    python = os.path.join(SIDE_VENV, "bin", "python")
    stamp = os.path.join(SIDE_VENV, ".verl-diff-stamp")
    if os.path.exists(stamp) and open(stamp).read() == "\n".join(VERL_SIDE_PACKAGES):
        return python
    if not os.path.exists(python):
        subprocess.run([sys._base_executable, "-m", "venv", SIDE_VENV], check=True)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(site, "zz_main_venv.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")  # after the side venv's own packages
    links = os.environ.get("VERL_DIFF_FIND_LINKS")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", *(["--find-links", links] if links else []),
                    *VERL_SIDE_PACKAGES], check=True)
    with open(stamp, "w") as f:
        f.write("\n".join(VERL_SIDE_PACKAGES))
    return python


# ----------------------------------------------------------------------------- running and judging
def run_case(name: str, case: Case, *, workdir: str, model_dir: str, verl_python: str) -> dict:
    """Both sides of one case in their own processes; the comparison row."""
    case_dir = os.path.join(workdir, name)
    os.makedirs(case_dir, exist_ok=True)
    os.link(os.path.join(workdir, "batch.pt"), os.path.join(case_dir, "batch.pt"))
    keys = [f"actor_rollout_ref.model.path={model_dir}", *BASE_KEYS, *case.keys]
    no_flash_attn = "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"
    verl_keys = keys + case.verl_only + [no_flash_attn]
    keys = keys + case.ours_only
    if case.verl_precision:  # pinned on both sides: hybridflow too defaults to bf16 on a CPU with bf16 units
        pinned = f"+actor_rollout_ref.actor.fsdp_config.mixed_precision={case.verl_precision}"
        verl_keys.append(pinned)
        keys.append(pinned)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    errors = {}
    for side, python, side_keys in (("verl", verl_python, verl_keys), ("hybridflow", sys.executable, keys)):
        with open(os.path.join(case_dir, "case.json"), "w") as f:
            json.dump({"overrides": side_keys, "rows_per_prompt": ROWS_PER_PROMPT}, f)
        script = (["-W", "ignore", os.path.join(ROOT, "benchmarks", "verl_diff_verl_side.py")] if side == "verl"
                  else [os.path.abspath(__file__), "--side", "hybridflow"])
        proc = subprocess.run([python, *script, case_dir], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            errors[side] = last_line(proc.stderr or proc.stdout)
            with open(os.path.join(case_dir, f"{side}.log"), "w") as f:
                f.write(proc.stdout + proc.stderr)
    if errors:
        return {"case": name, "pass": False, "note": "; ".join(f"{s} failed: {e}" for s, e in errors.items())}
    verl = torch.load(os.path.join(case_dir, "verl.pt"))
    ours = torch.load(os.path.join(case_dir, "hybridflow.pt"))
    return {"case": name, **judge(case, verl, ours)}


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def judge(case: Case, verl: dict, ours: dict) -> dict:
    """The case's row: max gradient / weight / metric differences and pass or fail with what failed."""
    grad_diff, weight_diff, excluded, notes = compare_tensors(verl, ours)
    metric_diff, metric_notes = compare_metrics(verl["metrics"], ours["metrics"])
    row = {"grad": grad_diff, "weight": weight_diff, "eps_excluded": excluded, "metric": metric_diff,
           "dtypes": f"{'/'.join(verl['dtypes'])} | {'/'.join(ours['dtypes'])}"}
    if case.judge == "dtype":
        # on a GPU and a CPU with bf16 units hybridflow follows verl's bf16; other CPUs keep fp32 (issue 62)
        from hybridflow.cpu import cpu_has_bf16

        want = verl["dtypes"] if torch.cuda.is_available() or cpu_has_bf16() else ["float32"]
        notes = [] if ours["dtypes"] == want else [f"hybridflow computes in {ours['dtypes']}, want {want}"]
        return {**row, "pass": not notes, "note": "; ".join(notes) or "dtype only (weights differ by design)"}
    if case.judge == "bf16":
        scale = max((g.abs().max().item() for step in verl["applied"] for g in step.values()), default=1.0)
        notes = [n for n in notes if not n.startswith(("gradients", "weights"))]
        if verl["dtypes"] != ours["dtypes"]:
            notes.append(f"compute dtype {ours['dtypes']} != verl's {verl['dtypes']}")
        if grad_diff is None or grad_diff > 2e-2 * scale:
            notes.append(f"gradients differ by {grad_diff} (> bf16 rounding 2e-2 x {scale:.3g})")
        return {**row, "pass": not notes, "note": "; ".join(notes + metric_notes[:1])}
    notes += metric_notes
    return {**row, "pass": not notes, "note": "; ".join(notes)}


def compare_tensors(verl: dict, ours: dict) -> tuple[float | None, float | None, int, list[str]]:
    """Max |difference| of the applied gradients (every step) and of the final weights, the number of
    eps-sensitive weight elements left out, and what failed."""
    notes = []
    if len(verl["applied"]) != len(ours["applied"]):
        notes.append(f"{len(ours['applied'])} optimizer steps, verl took {len(verl['applied'])}")
    if set(verl["weights"]) != set(ours["weights"]):
        missing = sorted(set(verl["weights"]) ^ set(ours["weights"]))
        return None, None, 0, notes + [f"parameter names differ: {missing[:4]}"]
    grad_diff = max((max_abs(v[n], o[n]) for v, o in zip(verl["applied"], ours["applied"]) for n in v), default=0.0)
    weight_diff, excluded = 0.0, 0
    for name, want in verl["weights"].items():
        keep = ~eps_sensitive(name, verl["applied"], ours["applied"], want.shape)
        excluded += int((~keep).sum())
        if keep.any():
            weight_diff = max(weight_diff, (want - ours["weights"][name])[keep].abs().max().item())
    if grad_diff > GRAD_TOL:
        notes.append(f"gradients differ by {grad_diff:.2e}")
    if weight_diff > WEIGHT_TOL:
        notes.append(f"weights differ by {weight_diff:.2e}")
    return grad_diff, weight_diff, excluded, notes


def eps_sensitive(name: str, verl_steps: list[dict], our_steps: list[dict], shape) -> torch.Tensor:
    """Elements of parameter ``name`` where AdamW's ``g / (sqrt(v) + eps)`` amplifies fp32 noise: some step's
    gradient is below ``EPS_SENSITIVE`` on both sides without being exactly 0 on both (a 0 moves nothing but
    the decay)."""
    sensitive = torch.zeros(shape, dtype=torch.bool)
    for verl_grads, our_grads in zip(verl_steps, our_steps):
        if name in verl_grads and name in our_grads:
            g_v, g_o = verl_grads[name], our_grads[name]
            small = (g_v.abs() < EPS_SENSITIVE) & (g_o.abs() < EPS_SENSITIVE)
            sensitive |= small & ~((g_v == 0) & (g_o == 0))
    return sensitive


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0


def compare_metrics(verl: dict, ours: dict) -> tuple[float, list[str]]:
    """Largest relative difference over the metrics verl logs among ``COMPARED_METRICS``; a name verl
    logs and hybridflow does not is a failure."""
    worst, notes = 0.0, []
    for short in COMPARED_METRICS:
        key = f"actor/{short}"
        if key not in verl:
            continue
        if key not in ours:
            notes.append(f"hybridflow does not log {key}")
            continue
        rel = abs(verl[key] - ours[key]) / max(abs(verl[key]), 1e-6)
        if abs(verl[key] - ours[key]) > 1e-7 and rel > METRIC_RTOL:
            notes.append(f"{key} {ours[key]:.6g} vs verl {verl[key]:.6g}")
        worst = max(worst, rel)
    return worst, notes


def fmt(value) -> str:
    return "-" if value is None else f"{value:.1e}"


def print_table(rows: list[dict]) -> None:
    print(f"{'case':<24} {'grad':>8} {'weight':>8} {'eps-out':>7} {'metric':>8} {'dtype verl | hf':<20} result")
    for r in rows:
        print(f"{r['case']:<24} {fmt(r.get('grad')):>8} {fmt(r.get('weight')):>8} {r.get('eps_excluded', 0):>7} "
              f"{fmt(r.get('metric')):>8} {r.get('dtypes', '-'):<20} {'PASS' if r['pass'] else 'FAIL'}"
              f"{'  ' + r['note'] if r.get('note') else ''}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # issue 60: the distillation losses (verl_diff_distillation.py) and the GVPO recipe's loss (verl_diff_gvpo.py)
    names = [*CASES, "distillation", "gvpo"]
    parser.add_argument("--cases", default=",".join(names), help="comma-separated, from: " + ", ".join(names))
    parser.add_argument("--workdir", default=None, help="keep the inputs and both sides' results here")
    parser.add_argument("--side", choices=["hybridflow"], help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.side:
        run_hybridflow_side(rest[0])
        return 0
    unknown = sorted(set(args.cases.split(",")) - set(names))
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {', '.join(names)}")
    verl_python = ensure_side_venv()
    cases = args.cases.split(",")
    distillation_failed = 0
    if "distillation" in cases:
        from benchmarks.verl_diff_distillation import main as distillation_diff

        cases.remove("distillation")
        distillation_failed = distillation_diff(verl_python)
    if "gvpo" in cases:
        from benchmarks.verl_diff_gvpo import main as gvpo_diff

        cases.remove("gvpo")
        distillation_failed |= gvpo_diff(verl_python)
    if not cases:
        return distillation_failed
    workdir = args.workdir or tempfile.mkdtemp(prefix="verl_diff_")
    os.makedirs(workdir, exist_ok=True)
    import hybridflow

    print(f"hybridflow from {os.path.dirname(hybridflow.__file__)}; inputs and results in {workdir}", flush=True)
    model_dir = make_inputs(workdir)
    rows = []
    for name in cases:
        start = time.time()
        rows.append(run_case(name, CASES[name], workdir=workdir, model_dir=model_dir, verl_python=verl_python))
        print(f"  {name}: {'pass' if rows[-1]['pass'] else 'FAIL'} ({time.time() - start:.0f} s)", flush=True)
    print_table(rows)
    return 0 if all(r["pass"] for r in rows) and not distillation_failed else 1


if __name__ == "__main__":
    sys.exit(main())
