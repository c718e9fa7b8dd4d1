"""Supervised fine-tuning: ``torchrun --nproc_per_node=N -m hybridflow.trainer.sft_trainer key=value ...``.

Also ``python -m hybridflow.trainer.sft_trainer ...`` (one process) and ``hybridflow sft ...``.
verl's ``sft_trainer.yaml`` keys (``data.train_files``, ``data.train_batch_size``,
``data.micro_batch_size_per_gpu``, ``model.partial_pretrain``, ``model.lora_rank``,
``optim.lr``, ``trainer.total_epochs``, ...). One optimizer step:

```
 StatefulDataLoader ── the same global batch of train_batch_size samples on every rank
        │  N = target tokens of the whole batch (counted locally: every rank sees it)
        ▼
 sft/batches.py: this rank's slice -> micro-batches (padded [B, T], or packed [1, N] + block-causal mask)
        │
        ▼
 model forward -> sft/loss.py (token-mean CE over loss_mask, divided by the global N)
        │  backward per micro-batch: gradients accumulate; FSDP2 reduces them over ranks
        ▼
 TrainState.step (grad clip, NaN guard, AdamW) -> LR schedule -> metrics -> validation -> checkpoint
```

World size 1 runs the plain model; with more ranks the model is ``fully_shard``-ed
(FSDP2) over gloo (CPU) or nccl (GPU). ``model.lora_rank > 0`` trains a LoRA adapter.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict

import torch
import torch.distributed as dist

from hybridflow.config import SFTConfig, load_config, split_config_args, validate_sft_config
from hybridflow.config.loader import help_requested, trainer_usage
from hybridflow.config.sft import sft_messages_key, sft_packed
from hybridflow.config.validate import as_list, sft_micro_batch_size_per_gpu, sft_model_path
from hybridflow.data.dataloader import StatefulDataLoader
from hybridflow.data.parallel import DataParallel, LOCAL
from hybridflow.data.sft_dataset import SFTDataset
from hybridflow.errors import ConfigError, run_entry_point
from hybridflow.models import load_causal_lm, load_tokenizer, resolve_dtype
from hybridflow.models.fsdp import data_parallel_mesh, decoder_layers, micro_batch_sync, resolve_precision, shard_model
from hybridflow.models.loader import check_vocab_covers_tokenizer
from hybridflow.models.loader import load_config as load_model_config
from hybridflow.models.lora import apply_lora, load_lora_adapter
from hybridflow.models.segment_attention import use_segment_attention
from hybridflow.models.sharded_checkpoint import FSDPModelComponent
from hybridflow.models.ulysses import refuse_vision_language, split_sequences
from hybridflow.models.vision import load_processor, vision_forward_inputs
from hybridflow.trainer.checkpoints.manager import find_resume_checkpoint, load_checkpoint, save_checkpoint
from hybridflow.trainer.entry import model_context_length, read_model_config, resolve_device, seed_everything
from hybridflow.trainer.tracking.plots import Curve, fixed_keys, plot_curves
from hybridflow.trainer.sft.batches import count_targets, even_shard, micro_batch_inputs, rank_slice, split_micro
from hybridflow.trainer.sft.checkpoint import SharedDirComponent, claim_folder
from hybridflow.trainer.sft.layout_check import sft_packing_agrees
from hybridflow.trainer.sft.loss import sft_loss
from hybridflow.trainer.sft.sequence_parallel import sequence_parallel_sft_loss
from hybridflow.trainer.tracking.summary import summary_table
from hybridflow.trainer.tracking.trackers import Tracking
from hybridflow.workers.optim import TrainState, build_scheduler, configured_optimizer, resolve_warmup_steps
from hybridflow.workers.sequence_parallel import split_world

COMPONENT = "model"

# The end-of-run report (summary.py / plots.py) with SFT's metrics instead of PPO's.
SFT_HEADLINES = {"train/loss": min, "val/loss": min, "train/grad_norm": None, "train/lr": None,
                 "perf/tokens_per_s": max}  # metric -> "best" rule (None: only first and last are meaningful)
SFT_CURVES = (
    Curve("loss.png", "Loss", "cross-entropy (nats/token)", fixed_keys("train/loss", "val/loss")),
    Curve("lr.png", "Learning rate", "lr", fixed_keys("train/lr")),
    Curve("grad_norm.png", "Gradient norm", "pre-clip norm", fixed_keys("train/grad_norm")),
)


# ------------------------------------------------------------------ process group and device
def init_data_parallel(device: torch.device) -> DataParallel:
    """World size 1 without torchrun; else a process group from torchrun's env (gloo on CPU, nccl on GPU)."""
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return LOCAL
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DataParallel(world_size=dist.get_world_size(), rank=dist.get_rank())


# ------------------------------------------------------------------ building the parts
def load_model(cfg: SFTConfig, *, device: torch.device) -> torch.nn.Module:
    """The causal LM to train (a LoRA-wrapped one when ``model.lora_rank > 0``), on ``device``."""
    model_cfg = cfg.model
    if model_cfg.external_lib:
        importlib.import_module(model_cfg.external_lib)  # registers custom architectures with transformers
    model = load_causal_lm(sft_model_path(cfg), config_path=model_cfg.hf_config_path,
                           dtype=model_cfg.fsdp_config.model_dtype,
                           trust_remote_code=model_cfg.trust_remote_code,
                           override_config=dict(model_cfg.override_config),
                           gradient_checkpointing=model_cfg.enable_gradient_checkpointing)
    if model_cfg.lora_adapter_path:  # continue a trained adapter (its rank, alpha and targets)
        model = load_lora_adapter(model, model_cfg.lora_adapter_path)
    elif model_cfg.lora_rank > 0:
        model = apply_lora(model, rank=model_cfg.lora_rank, alpha=model_cfg.lora_alpha,
                           target_modules=model_cfg.target_modules, exclude_modules=model_cfg.exclude_modules)
    return model.to(device)


def preflight(cfg: SFTConfig, *, world_size: int) -> None:
    """Every check that needs no model weights (files, batch arithmetic, the context and the kind of model from
    config.json)."""
    path, trust = sft_model_path(cfg), cfg.model.trust_remote_code
    validate_sft_config(cfg, world_size=world_size, model_max_len=model_context_length(path, trust))
    config = read_model_config(path, trust) if world_size > 1 else None  # one process runs whole sequences
    if config is not None:
        refuse_vision_language(config, sp_size=cfg.ulysses_sequence_parallel_size,
                               key="ulysses_sequence_parallel_size")


def build_tokenizer(cfg: SFTConfig):
    """The model's tokenizer (or ``model.tokenizer_path``'s); ``data.chat_template`` (else
    ``model.custom_chat_template``) replaces its template when set."""
    tokenizer = load_tokenizer(cfg.model.tokenizer_path or sft_model_path(cfg),
                               trust_remote_code=cfg.model.trust_remote_code)
    config = load_model_config(cfg.model.hf_config_path or sft_model_path(cfg),
                               trust_remote_code=cfg.model.trust_remote_code,
                               override_config=dict(cfg.model.override_config))
    check_vocab_covers_tokenizer(config, tokenizer, sft_model_path(cfg),
                                 tokenizer_key="model.tokenizer_path" if cfg.model.tokenizer_path else "the model's own")
    template = cfg.data.chat_template or cfg.model.custom_chat_template
    if template:
        tokenizer.chat_template = template
    if not tokenizer.chat_template:
        raise ConfigError(f"the tokenizer of {sft_model_path(cfg)} has no chat template: set data.chat_template")
    return tokenizer


def chat_template_kwargs(data) -> dict:
    """``data.apply_chat_template_kwargs`` plus ``enable_thinking`` from ``data.enable_thinking_default`` (verl's
    YAML default is the string ``none``: not passed)."""
    kwargs = dict(data.apply_chat_template_kwargs or {})
    if data.enable_thinking_default is not None and str(data.enable_thinking_default).lower() != "none":
        kwargs["enable_thinking"] = bool(data.enable_thinking_default)
    return kwargs


def build_dataset(cfg: SFTConfig, files, tokenizer, *, max_samples: int | None = None) -> SFTDataset:
    """The rows of ``files``: at most ``max_samples`` (default ``data.max_samples``; -1: all)."""
    data = cfg.data
    if data.custom_cls.get("path"):
        raise ConfigError("data.custom_cls is not supported; convert the data to prompt/response or messages columns")
    return SFTDataset(files, tokenizer, prompt_key=data.prompt_key, response_key=data.response_key,
                      prompt_dict_keys=data.prompt_dict_keys, response_dict_keys=data.response_dict_keys,
                      messages_key=sft_messages_key(data),
                      tools_key=data.multiturn.tools_key,
                      max_length=data.max_length, truncation=data.truncation,
                      max_samples=data.max_samples if max_samples is None else max_samples,
                      apply_chat_template_kwargs=chat_template_kwargs(data),
                      processor=load_processor(sft_model_path(cfg), tokenizer=tokenizer,
                                               trust_remote_code=cfg.model.trust_remote_code),
                      image_key=data.image_key)


def packed_layout(cfg: SFTConfig, dataset: SFTDataset) -> bool:
    """Whether micro-batches are packed rows (:func:`sft_packed`); rows with images stay padded, said once."""
    if not sft_packed(cfg):
        return False
    if any("multi_modal_inputs" in sample for sample in dataset.samples):
        logging.getLogger(__name__).warning(
            "the rows carry images, which go with padded rows (a VLM's images and 3-D positions); "
            "use_remove_padding / data.use_packing / data.pad_mode=no_padding is not applied")
        return False
    return True


def total_steps(cfg: SFTConfig, batches_per_epoch: int) -> int:
    """``trainer.total_training_steps`` when set, else epochs x batches per epoch."""
    return cfg.trainer.total_training_steps or batches_per_epoch * cfg.trainer.total_epochs


def build_train_state(cfg: SFTConfig, model: torch.nn.Module, *, steps: int) -> TrainState:
    optim = cfg.optim
    optimizer = configured_optimizer(model.parameters(), optim)
    warmup = resolve_warmup_steps(warmup_steps=optim.lr_warmup_steps, warmup_ratio=optim.warmup_steps_ratio,
                                  total_steps=steps)
    scheduler = build_scheduler(optimizer, warmup_steps=warmup, total_steps=steps,
                                style=optim.lr_scheduler, min_lr_ratio=optim.min_lr_ratio,
                                num_cycles=optim.num_cycles, zero_indexed_step=optim.zero_indexed_step)
    return TrainState(model, optimizer, scheduler, grad_clip=optim.clip_grad,
                      offload_optimizer=cfg.model.fsdp_config.optimizer_offload)


# ------------------------------------------------------------------ the trainer
class SFTTrainer:
    """The SFT loop over parts built from a config (see :func:`build_trainer`)."""

    def __init__(self, cfg: SFTConfig, *, model, tokenizer, train_dataset: SFTDataset,
                 val_dataset: SFTDataset | None, dp: DataParallel = LOCAL, device=torch.device("cpu")):
        self.cfg, self.tokenizer, self.dp, self.device = cfg, tokenizer, dp, device
        # Sequence parallelism: groups of ranks share one slice of the batch (self.data) and split rows
        self.data, self.sp = split_world(dp, sp_size=cfg.ulysses_sequence_parallel_size, device_type=device.type,
                                         key="ulysses_sequence_parallel_size")
        self.val_dataset = val_dataset
        self.loader = StatefulDataLoader(train_dataset, batch_size=cfg.data.train_batch_size, collate_fn=list,
                                         shuffle=cfg.data.shuffle, seed=cfg.data.seed, drop_last=True)
        self.total_steps = total_steps(cfg, len(self.loader))
        fsdp = cfg.model.fsdp_config
        decoder_layers(model, fsdp.wrap_policy.transformer_layer_cls_to_wrap)  # a wrong class fails at any size
        precision = resolve_precision(fsdp.mixed_precision, device_type=device.type)
        # The layout guard probes the plain model, before sharding (issue 58)
        self.packed = packed_layout(cfg, train_dataset) and sft_packing_agrees(model,
                                                                               pad_token_id=tokenizer.pad_token_id)
        if dp.world_size > 1:
            model = shard_model(model, mesh=data_parallel_mesh(device.type, dp.world_size, fsdp.fsdp_size),
                                precision=precision,
                                reshard_after_forward=fsdp.reshard_after_forward,
                                param_offload=fsdp.param_offload or fsdp.offload_policy,
                                layer_classes_to_wrap=fsdp.wrap_policy.transformer_layer_cls_to_wrap)
        self.model = split_sequences(model, self.sp, key="ulysses_sequence_parallel_size")
        self.state = build_train_state(cfg, model, steps=self.total_steps)
        self.compute_dtype = precision.param_dtype or resolve_dtype(fsdp.model_dtype)
        # FSDP2 casts per layer when sharded; the plain single-process model gets autocast instead
        plain_mixed = dp.world_size == 1 and self.compute_dtype != resolve_dtype(fsdp.model_dtype)
        self.autocast = (torch.autocast(device.type, dtype=self.compute_dtype) if plain_mixed
                         else contextlib.nullcontext())
        self.micro_batch_size = sft_micro_batch_size_per_gpu(cfg.data, self.data.world_size)
        self.global_step = 0
        self.tracking: Tracking | None = None
        self._bar = None
        self._saving_last = False

    # ---- one step ------------------------------------------------------------------
    def _forward(self, micro: list, *, global_num_tokens: float):
        inputs = micro_batch_inputs(micro, use_packing=self.packed,
                                    pad_token_id=self.tokenizer.pad_token_id,
                                    attn_implementation=self.model.config._attn_implementation)
        extra = {}
        if "segment_layout" in inputs:  # packed row: attention per sample
            use_segment_attention(self.model)
            extra["segment_layout"] = inputs.pop("segment_layout").to(self.device)
        inputs = {key: None if value is None else value.to(self.device) for key, value in inputs.items()}
        extra.update(vision_forward_inputs(self.model, [s.get("multi_modal_inputs") for s in micro],
                                           inputs["input_ids"]))
        if extra.get("pixel_values") is not None:
            inputs["position_ids"] = None  # the VLM computes its 3-D positions (get_rope_index)
        if self.sp is not None:
            with self.autocast:
                return sequence_parallel_sft_loss(self.model, {**inputs, **extra}, sp=self.sp,
                                                  global_num_tokens=global_num_tokens)
        with self.autocast:
            logits = self.model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                position_ids=inputs["position_ids"], use_cache=False, **extra).logits
        return sft_loss(logits=logits, input_ids=inputs["input_ids"], loss_mask=inputs["loss_mask"],
                        global_num_tokens=global_num_tokens)

    def train_step(self, samples: Sequence[dict]) -> dict[str, float]:
        """One optimizer step on a global batch; returns its metrics."""
        start = time.perf_counter()
        num_targets = count_targets(samples)
        micros = split_micro(rank_slice(samples, rank=self.data.rank, world_size=self.data.world_size),
                             micro_batch_size=self.micro_batch_size)
        self.model.train()
        self.state.zero_grad()
        nll_sum = torch.zeros((), device=self.device)
        for index, micro in enumerate(micros):
            with micro_batch_sync(self.model, index=index, count=len(micros)):
                loss, parts = self._forward(micro, global_num_tokens=num_targets)
                # FSDP2 averages gradients over ranks; the loss is already a share of the global sum
                (loss * self.data.world_size).backward()
            nll_sum += parts["nll_sum"]
        loss_value = float(self.data.all_reduce_sum(nll_sum)) / max(num_targets, 1)
        lr = self.state.lr
        grad_norm = self.state.step(loss_value=loss_value)
        self.state.scheduler.step()
        seconds = time.perf_counter() - start
        tokens = sum(sample["input_ids"].numel() for sample in samples)
        return {"train/loss": loss_value, "train/lr": lr, "train/grad_norm": grad_norm,
                "train/num_target_tokens": num_targets, "train/epoch": self.loader.epoch,
                "perf/total_num_tokens": tokens, "perf/tokens_per_s": tokens / seconds, "timing_s/step": seconds}

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """``val/loss``: token-mean CE over every target token of the validation set."""
        micros = even_shard(self.val_dataset, rank=self.data.rank, world_size=self.data.world_size,
                            micro_batch_size=self.micro_batch_size)
        self.model.eval()
        totals = torch.zeros(2, device=self.device)
        for micro in micros:
            _, parts = self._forward(micro, global_num_tokens=1.0)
            totals += torch.stack([parts["nll_sum"], parts["num_tokens"]])
        nll, count = self.data.all_reduce_sum(totals).tolist()
        return {"val/loss": nll / max(count, 1.0)}

    # ---- checkpoints ---------------------------------------------------------------
    def checkpoint_component(self) -> SharedDirComponent:
        contents = self.cfg.trainer.checkpoint
        inner = FSDPModelComponent(self.model, self.state.optimizer, self.state.scheduler, self.tokenizer,
                                   save_contents=set(contents.save_contents) - {"hf_model"},
                                   load_contents=contents.load_contents)
        contents = contents.save_contents
        return SharedDirComponent(inner, dp=self.dp, export_weights=lambda: self._saving_last or "hf_model" in contents)

    def save(self) -> None:
        """Checkpoint this step (a collective: call it on every rank)."""
        component = self.checkpoint_component()
        if self.dp.rank != 0:
            component.save_to(None)
            return
        extra = {"dataloader": self.loader.state_dict(), "global_step": self.global_step}
        save_checkpoint(self.cfg.trainer.default_local_dir, self.global_step, {COMPONENT: component}, extra=extra,
                        max_to_keep=self.cfg.trainer.max_ckpt_to_keep, signature=self.signature())

    def signature(self) -> dict:
        """The config values a checkpoint of this run cannot be resumed across (checkpoints/ownership.py)."""
        return {"model.partial_pretrain": sft_model_path(self.cfg), "model.lora_rank": self.cfg.model.lora_rank}

    def resume(self) -> None:
        """Restore model, optimizer, schedule, RNG and dataloader position from the checkpoint to resume from,
        after refusing a folder whose checkpoints this run did not make (``trainer.start_over`` deletes them)."""
        trainer = self.cfg.trainer
        claim_folder(trainer, COMPONENT, self.signature(), dp=self.dp)  # another configuration's folder: refused
        path = find_resume_checkpoint(trainer.default_local_dir, trainer.resume_mode, trainer.resume_from_path,
                                      components=(COMPONENT,))
        if path is None:
            return
        self.global_step, extra = load_checkpoint(path, {COMPONENT: self.checkpoint_component()})
        self.loader.load_state_dict(extra["dataloader"])
        print(f"hybridflow: resumed from {path} at step {self.global_step}", flush=True)

    # ---- the loop ------------------------------------------------------------------
    def _due(self, freq: int) -> bool:
        return freq > 0 and self.global_step % freq == 0

    def _after_step(self, metrics: dict[str, float], *, epoch_end: bool) -> None:
        last = self.global_step >= self.total_steps
        trainer = self.cfg.trainer
        if self.val_dataset is not None and (self._due(trainer.test_freq) or epoch_end or last):
            metrics.update(self.validate())
        if self.tracking is not None:
            self.tracking.log(metrics, step=self.global_step)
        if self._bar is not None:  # the console line lists PPO's metrics; the bar shows SFT's loss
            self._bar.set_postfix(loss=f"{metrics['train/loss']:.4f}", refresh=False)
        if self._due(trainer.save_freq) or last:
            self._saving_last = last
            self.save()

    def _run_epochs(self) -> None:
        while self.global_step < self.total_steps:
            batches_left = len(self.loader) - self.loader.state_dict()["position"] // self.loader.batch_size
            for index, samples in enumerate(self.loader):
                metrics = self.train_step(samples)
                self.global_step += 1
                self._after_step(metrics, epoch_end=index == batches_left - 1)
                if self.global_step >= self.total_steps:
                    return

    def fit(self, tracking: Tracking | None = None) -> list[dict[str, float]]:
        """Resume if a checkpoint exists, train to ``total_steps``; returns the logged history (rank 0)."""
        self.tracking = tracking
        self.resume()
        if tracking is not None and self.global_step > 0:
            tracking.resume_at(self.global_step)
        if tracking is None:
            self._run_epochs()
            return []
        with tracking.progress(self.total_steps, initial_step=self.global_step) as self._bar:
            self._run_epochs()
        self._bar = None
        return tracking.history


def build_trainer(cfg: SFTConfig) -> SFTTrainer:
    """Validate the config, set up the process group, load tokenizer, data and model."""
    device = resolve_device(cfg.trainer.device)
    dp = init_data_parallel(device)
    preflight(cfg, world_size=dp.world_size)
    if dp.world_size == 1 and cfg.ulysses_sequence_parallel_size > 1:
        logging.getLogger(__name__).warning(
            "hybridflow: warning: ulysses_sequence_parallel_size=%d splits sequences over processes, but this run "
            "has one: it trains on whole sequences (launch with torchrun --nproc_per_node=N)",
            cfg.ulysses_sequence_parallel_size)
    seed_everything(cfg.trainer.seed)
    tokenizer = build_tokenizer(cfg)
    train = build_dataset(cfg, cfg.data.train_files, tokenizer)
    val = (build_dataset(cfg, cfg.data.val_files, tokenizer, max_samples=cfg.data.val_max_samples)
           if cfg.data.val_files else None)
    model = load_model(cfg, device=device)
    return SFTTrainer(cfg, model=model, tokenizer=tokenizer, train_dataset=train, val_dataset=val, dp=dp,
                      device=device)


def make_tracking(cfg: SFTConfig) -> Tracking:
    return Tracking(cfg.trainer.project_name, cfg.trainer.experiment_name, as_list(cfg.trainer.logger),
                    config=asdict(cfg), local_dir=os.path.join(cfg.trainer.default_local_dir, "logs"))


USAGE_SUMMARY = ("Supervised fine-tuning with verl's sft_trainer keys; under torchrun, one rank per process "
                 "(also: hybridflow sft, python -m hybridflow.trainer.fsdp_sft_trainer).")


def _main(argv: list[str], *, prog: str = "python -m hybridflow.trainer.sft_trainer") -> int:
    if help_requested(argv):
        print(trainer_usage(prog, USAGE_SUMMARY, "sft"), end="")
        return 0
    config_file, overrides = split_config_args(argv)
    cfg = load_config(SFTConfig, overrides, config_file)
    trainer = build_trainer(cfg)
    tracking = make_tracking(cfg) if trainer.dp.rank == 0 else None
    history = trainer.fit(tracking)
    if tracking is not None:
        tracking.finish()
        print(summary_table(history, headlines=SFT_HEADLINES))
        plot_curves(history, os.path.join(cfg.trainer.default_local_dir, "plots"), curves=SFT_CURVES)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None, *, prog: str = "python -m hybridflow.trainer.sft_trainer") -> int:
    """Entry point of ``python -m hybridflow.trainer.sft_trainer`` (and verl's ``fsdp_sft_trainer``
    name) and ``hybridflow sft``."""
    return run_entry_point(functools.partial(_main, prog=prog), list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
