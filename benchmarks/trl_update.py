"""TRL's GRPO update on the rows of ``benchmarks/update.py``: the baseline of the update benchmark.

TRL's ``GRPOTrainer`` (``pip install -e '.[bench]'``; on a GPU machine its wheels travel in ``.whl/``,
docs/benchmarks.md "GPU runs") is built around the same random-init model, and its own loss code
(``GRPOTrainer.compute_loss``: the forward with TRL's fused LM head, the clipped ratio, the aggregation) runs
on the same rows, with ``loss_type="dapo"`` (the token mean over the batch, hybridflow's ``token-mean``), so
both compute the same loss and the first step's gradient norms agree. What is left out is TRL's generation and reward, which the benchmark does not time for
hybridflow either. The rows are laid out as TRL lays out a generation batch: prompts left-padded to the
longest prompt, completions right-padded to the longest completion, one batch of ``rows_per_micro`` rows per
gradient-accumulation micro-step (TRL's ``per_device_train_batch_size``), then TRL's optimizer (fused AdamW),
gradient clipping at 1.0 and a step.

``num_iterations=1`` and ``beta=0``: TRL then takes the old log-probs from the same forward (ratio 1), as
hybridflow's update on rows sampled by the current policy does, and loads no reference model.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable

import torch


def trl_available() -> str | None:
    """None when TRL and its ``datasets`` import; else the line that says how to get them."""
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
    except ImportError as err:
        return f"TRL is not installed ({err}); pip install -e '.[bench]' (on a GPU machine: the wheels in .whl/)"
    return None


def _placeholder_tokenizer(vocab_size: int):
    """A tokenizer TRL accepts: it only reads the pad / eos ids here, since nothing is generated."""
    from hybridflow.models.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(min(vocab_size, 512))
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    return tokenizer


def build_trainer(model, *, rows_per_micro: int, micros: int, device: torch.device, bf16: bool):
    """TRL's GRPOTrainer around ``model``: no generation, no reference, one optimizer step per ``micros``
    micro-steps of ``rows_per_micro`` rows."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_update_"), per_device_train_batch_size=rows_per_micro,
        num_generations=rows_per_micro, gradient_accumulation_steps=micros, beta=0.0, num_iterations=1,
        loss_type="dapo", learning_rate=1e-6, weight_decay=0.01, max_grad_norm=1.0, lr_scheduler_type="constant",
        optim="adamw_torch_fused", bf16=bf16, use_cpu=device.type == "cpu", report_to="none", save_strategy="no",
        disable_tqdm=True, seed=0)
    dataset = Dataset.from_list([{"prompt": "unused"}] * rows_per_micro)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=config,
                          train_dataset=dataset, processing_class=_placeholder_tokenizer(model.config.vocab_size))
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = micros
    return trainer


def trl_inputs(batch, *, prompt_width: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The rows as TRL's generation batch: ``[B, P]`` left-padded prompts, ``[B, T]`` right-padded
    completions (``P``, ``T``: the longest prompt and completion of the batch), an advantage per row."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    response_mask = batch["response_mask"]
    prompt_start = int(mask[:, :prompt_width].any(0).nonzero()[0])
    completion_end = int(response_mask.any(0).nonzero()[-1]) + 1
    return {"prompt_ids": ids[:, prompt_start:prompt_width].to(device),
            "prompt_mask": mask[:, prompt_start:prompt_width].to(device),
            "completion_ids": ids[:, prompt_width:prompt_width + completion_end].to(device),
            "completion_mask": response_mask[:, :completion_end].long().to(device),
            # GRPO's advantage is per row; the benchmark's rows carry it broadcast over the response
            "advantages": batch["advantages"].sum(-1).div(response_mask.sum(-1).clamp(min=1)).to(device)}


def build_update(model, batch, *, prompt_width: int, rows_per_micro: int, device: torch.device,
                 bf16: bool) -> Callable[[], float]:
    """One optimizer step of TRL's update over every row of ``batch``, in micro-steps of ``rows_per_micro`` rows
    (``batch.split(rows_per_micro)``'s rows) -> the gradient norm."""
    rows = len(batch)
    micros = -(-rows // rows_per_micro)
    trainer = build_trainer(model, rows_per_micro=rows_per_micro, micros=micros, device=device, bf16=bf16)
    inputs = trl_inputs(batch, prompt_width=prompt_width, device=device)
    # dapo divides each micro-step's token sum by the batch's tokens: the token mean over the whole batch,
    # hybridflow's loss_agg_mode=token-mean, so the two updates' gradients agree
    tokens = inputs["completion_mask"].sum()
    slices = [{**{key: value[start:start + rows_per_micro] for key, value in inputs.items()},
               "num_items_in_batch": tokens} for start in range(0, rows, rows_per_micro)]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    train_model = trainer.model
    train_model.train()

    def step() -> float:
        for micro in slices:
            with autocast:
                loss = trainer.compute_loss(train_model, micro)
            loss.backward()  # the loss is already divided by the micro-steps (current_gradient_accumulation_steps)
        norm = torch.nn.utils.clip_grad_norm_(train_model.parameters(), 1.0)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    return step
