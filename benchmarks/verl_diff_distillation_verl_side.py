"""verl 0.9.1's side of the distillation differential (run by benchmarks/verl_diff_distillation.py in
``.venv-verl``): verl's own ``distillation_loss`` (and, for forward_kl_topk, its FSDP logits processor
``compute_forward_kl_topk``) on the driver's inputs, in verl's packed ("thd") layout.

    python verl_diff_distillation_verl_side.py INPUTS.pt OUTPUT.pt

Each row is one prompt token followed by its response, packed into one sequence of ``nnz`` tokens; the
value at packed position j belongs to the token at j + 1 (verl's ``no_padding_2_padding`` shift).
"""

import sys
from types import SimpleNamespace

import torch
from tensordict import TensorDict

from verl.trainer.distillation.fsdp.losses import compute_forward_kl_topk
from verl.trainer.distillation.losses import distillation_loss
from verl.workers.config import DistillationConfig, DistillationLossConfig


def pack(padded: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """``[B, T, ...]`` per-response-token values -> ``[nnz, ...]`` packed with verl's shift (one zero per row)."""
    rows = [torch.cat([padded[b, :n], padded.new_zeros((1, *padded.shape[2:]))]) for b, n in enumerate(lengths)]
    return torch.cat(rows)


def nested(padded: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """The same values as a jagged nested tensor of rows (verl's teacher outputs)."""
    rows = [torch.cat([padded[b, :n], padded.new_zeros((1, *padded.shape[2:]))]) for b, n in enumerate(lengths)]
    return torch.nested.nested_tensor(rows, layout=torch.jagged)


def run_case(case: dict, inputs: dict) -> dict:
    mask = inputs["response_mask"]
    lengths = mask.sum(-1).tolist()
    batch, width = mask.shape
    loss_cfg = DistillationLossConfig(loss_mode=case["loss_mode"], topk=inputs["teacher_topk_ids"].shape[-1],
                                      use_policy_gradient=case["use_policy_gradient"],
                                      loss_max_clamp=case["loss_max_clamp"],
                                      log_prob_min_clamp=case["log_prob_min_clamp"])
    distill_cfg = DistillationConfig(enabled=False, distillation_loss=loss_cfg)
    actor_cfg = SimpleNamespace(loss_agg_mode=case["loss_agg_mode"], global_batch_info={}, loss_scale_factor=None)
    student = inputs["student_log_probs"].clone().requires_grad_(True)
    logits = inputs["student_logits"].clone().requires_grad_(True)
    data = TensorDict({
        "prompts": torch.ones(batch, 1, dtype=torch.long), "responses": torch.ones(batch, width, dtype=torch.long),
        "attention_mask": torch.cat([torch.ones(batch, 1, dtype=torch.long), mask], dim=1), "response_mask": mask,
        "old_log_probs": inputs["old_log_probs"], "dp_size": 1, "batch_num_tokens": int(mask.sum()),
        "global_batch_size": batch, "teacher_logprobs": pack(inputs["teacher_log_probs"][..., None], lengths)},
        batch_size=[])
    output = {"log_probs": pack(student, lengths)}
    if case["loss_mode"] == "forward_kl_topk":
        topk = compute_forward_kl_topk(
            student_logits=pack(logits, lengths)[None], config=distill_cfg, data_format="thd",
            teacher_topk_log_probs=nested(inputs["teacher_topk_log_probs"], lengths),
            teacher_topk_ids=nested(inputs["teacher_topk_ids"], lengths))
        output.update({name: value[0] for name, value in topk.items()})
    loss, metrics = distillation_loss(actor_cfg, distill_cfg, output, data)
    loss.backward()
    return {"loss": loss.detach(), "grad_log_probs": student.grad if student.grad is not None else torch.zeros_like(student),
            "grad_logits": logits.grad if logits.grad is not None else torch.zeros_like(logits),
            "loss_min": float(metrics["distillation/loss_min"].aggregate()),
            "loss_max": float(metrics["distillation/loss_max"].aggregate())}


def main() -> None:
    inputs = torch.load(sys.argv[1])
    torch.save({name: run_case(case, inputs) for name, case in inputs["cases"].items()}, sys.argv[2])


if __name__ == "__main__":
    main()
