"""The distillation case of ``make verl-diff`` (issue 60): hybridflow's distillation losses against verl 0.9.1's
own ``distillation_loss`` on the same inputs.

    python benchmarks/verl_diff_distillation.py      # also run by benchmarks/verl_diff.py --cases distillation

Random inputs (3 rows, ragged responses of up to 4 tokens, a vocabulary of 11, top-3 teacher tokens): the
student's log-probs of its sampled tokens and its logits, the old log-probs, the teacher's log-probs and its top-k.
For each case (loss_mode, policy gradient or supervised, clamps, loss_agg_mode) both sides compute the
distillation loss and its gradient in the student's log-probs (estimators) or logits (forward_kl_topk); verl's
side runs in the side venv (benchmarks/verl_diff_distillation_verl_side.py, its packed layout). A case passes
when the loss, the gradients and verl's ``loss_min`` / ``loss_max`` metrics agree within 1e-6. Exit status 1 when
one fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.append(ROOT) if ROOT not in sys.path else None

from hybridflow.algos.distillation import DistillationObjective, get_distillation_loss  # noqa: E402
from hybridflow.algos.distillation.combine import distillation_term  # noqa: E402

TOL = 1e-6
BASE = dict(loss_mode="k3", use_policy_gradient=False, loss_max_clamp=None, log_prob_min_clamp=None,
            loss_agg_mode="token-mean")
CASES = {
    "k3": {},
    "k1_policy_gradient": dict(loss_mode="k1", use_policy_gradient=True),
    "low_var_kl_clamped": dict(loss_mode="low_var_kl", loss_max_clamp=0.05),
    "k2_seq_mean_token_mean": dict(loss_mode="k2", loss_agg_mode="seq-mean-token-mean"),
    "abs_policy_gradient": dict(loss_mode="abs", use_policy_gradient=True),
    "forward_kl_topk": dict(loss_mode="forward_kl_topk", log_prob_min_clamp=-3.0),
    "forward_kl_topk_policy_gradient": dict(loss_mode="forward_kl_topk", use_policy_gradient=True),
}


def make_inputs(seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    mask = (torch.arange(4) < torch.tensor([4, 2, 3])[:, None]).long()
    logits = torch.randn(3, 4, 11, generator=gen)
    sampled = torch.randint(0, 11, (3, 4), generator=gen)
    student = torch.log_softmax(logits, -1).gather(-1, sampled[..., None])[..., 0]
    teacher_full = torch.log_softmax(torch.randn(3, 4, 11, generator=gen) * 2, -1)
    topk_values, topk_ids = teacher_full.topk(3, dim=-1)
    return {"student_logits": logits, "student_log_probs": student * mask, "response_mask": mask,
            "old_log_probs": (student + 0.3 * torch.randn(3, 4, generator=gen)) * mask,
            "teacher_log_probs": teacher_full.gather(-1, sampled[..., None])[..., 0] * mask,
            "teacher_topk_log_probs": topk_values * mask[..., None], "teacher_topk_ids": topk_ids * mask[..., None],
            "cases": {name: {**BASE, **case} for name, case in CASES.items()}}


def ours(case: dict, inputs: dict) -> dict:
    mask = inputs["response_mask"]
    student = inputs["student_log_probs"].clone().requires_grad_(True)
    logits = inputs["student_logits"].clone().requires_grad_(True)
    objective = DistillationObjective(loss_mode=case["loss_mode"], use_policy_gradient=case["use_policy_gradient"],
                                      loss_max_clamp=case["loss_max_clamp"],
                                      log_prob_min_clamp=case["log_prob_min_clamp"])
    topk = torch.log_softmax(logits, -1).gather(-1, inputs["teacher_topk_ids"])
    per_token, _ = get_distillation_loss(case["loss_mode"])(
        loss_mode=case["loss_mode"], student_log_probs=student, teacher_log_probs=inputs["teacher_log_probs"],
        student_topk_log_probs=topk, teacher_topk_log_probs=inputs["teacher_topk_log_probs"],
        log_prob_min_clamp=case["log_prob_min_clamp"])
    loss, metrics = distillation_term(objective, per_token, log_prob=student, old_log_prob=inputs["old_log_probs"],
                                      response_mask=mask, loss_agg_mode=case["loss_agg_mode"])
    loss.backward()
    zero = torch.zeros_like
    return {"loss": loss.detach(), "grad_log_probs": zero(student) if student.grad is None else student.grad * mask,
            "grad_logits": zero(logits) if logits.grad is None else logits.grad * mask[..., None],
            "loss_min": metrics["loss_min"], "loss_max": metrics["loss_max"]}


def compare(verl: dict, mine: dict) -> float:
    """The largest difference over the loss, both gradients (verl's flow back through its packing to the same
    padded tensors) and the two metrics."""
    diffs = [(verl["loss"] - mine["loss"]).abs().item(),
             (verl["grad_log_probs"] - mine["grad_log_probs"]).abs().max().item(),
             (verl["grad_logits"] - mine["grad_logits"]).abs().max().item(),
             abs(verl["loss_min"] - mine["loss_min"]), abs(verl["loss_max"] - mine["loss_max"])]
    return max(diffs)


def main(verl_python: str | None = None) -> int:
    if verl_python is None:
        from benchmarks.verl_diff import ensure_side_venv

        verl_python = ensure_side_venv()
    workdir = tempfile.mkdtemp(prefix="verl_diff_distillation_")
    inputs = make_inputs()
    torch.save(inputs, os.path.join(workdir, "inputs.pt"))
    side = os.path.join(ROOT, "benchmarks", "verl_diff_distillation_verl_side.py")
    subprocess.run([verl_python, side, os.path.join(workdir, "inputs.pt"), os.path.join(workdir, "verl.pt")],
                   check=True, cwd=workdir)
    verl = torch.load(os.path.join(workdir, "verl.pt"))
    failed = 0
    print(f"{'distillation case':<34} {'max diff':>9} result")
    for name, case in inputs["cases"].items():
        diff = compare(verl[name], ours(case, inputs))
        failed += diff > TOL
        print(f"{name:<34} {diff:>9.2e} {'PASS' if diff <= TOL else 'FAIL'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
