"""The SFT trainer's config: verl's ``sft_trainer.yaml`` keys.

Single source of truth; ``hybridflow/config/sft_trainer.yaml`` is generated from it.
"""

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Optional

from hybridflow.config.common import CheckpointContentsConfig, FSDPConfig
from hybridflow.config.checks import check_positive


@dataclass
class MultiturnConfig:
    """Multi-turn conversations stored as a list of chat messages."""

    enable: bool = False
    """Read ``messages_key`` instead of prompt_key/response_key."""
    messages_key: str = "messages"
    """Column with the list of {role, content} messages."""
    tools_key: str = "tools"
    """Column with the row's tool schemas (a list or its JSON text), described to the model as the
    multi-turn rollout describes them: the template's ``tools`` argument, or a Hermes system message."""
    enable_thinking_key: str = "enable_thinking"
    """Compatibility-only (compat.py); in verl: column with a per-row enable_thinking flag for the chat template."""


@dataclass
class SFTDataConfig:
    """Supervised data (verl's SFT ``data.*``)."""

    train_batch_size: int = 256
    """Sequences per optimizer step (global, across data-parallel ranks)."""
    micro_batch_size: Optional[int] = None
    """Deprecated global micro-batch size (verl's older key): when set, each rank runs
    micro_batch_size / data-parallel size sequences per forward/backward, instead of micro_batch_size_per_gpu."""
    # verl 0.9.1's SFT data key
    num_workers: int = 8
    """Compatibility-only (compat.py); in verl: DataLoader worker processes."""
    micro_batch_size_per_gpu: int = 4
    """Sequences per forward/backward on each rank."""
    train_files: Any = "~/data/gsm8k/train.parquet"
    """Training parquet/jsonl file(s)."""
    val_files: Any = None
    """Validation parquet/jsonl file(s); null disables the validation loss."""
    prompt_key: str = "question"
    """Column with the prompt (a string or a list of messages)."""
    response_key: str = "answer"
    """Column with the response string."""
    prompt_dict_keys: Optional[List[str]] = None
    """Nested keys to reach the prompt inside a dict column (e.g. [question] for extra_info.question)."""
    response_dict_keys: Optional[List[str]] = None
    """Nested keys to reach the response inside a dict column."""
    multiturn: MultiturnConfig = field(default_factory=MultiturnConfig)
    """Multi-turn data."""
    messages_key: Optional[str] = None
    """verl 0.9's SFT trainer (``verl.trainer.sft_trainer``): the column of chat messages. Set, every row is read
    as a conversation, as with multiturn.enable=True and multiturn.messages_key=<this>; null keeps multiturn.*, and
    rows with a ``messages`` column but no prompt column are conversations (verl 0.9's default messages_key)."""
    pad_mode: Optional[str] = None
    """verl 0.9's SFT trainer: ``no_padding`` packs each micro-batch into one row (as use_remove_padding=True),
    ``right`` pads it; null leaves use_remove_padding / use_packing to decide."""
    use_dynamic_bsz: bool = False
    """Compatibility-only (compat.py); in verl: micro-batches sized by max_token_len_per_gpu tokens."""
    max_token_len_per_gpu: int = 8192
    """Compatibility-only (compat.py); in verl: the token budget of a dynamic micro-batch."""
    ignore_input_ids_mismatch: bool = False
    """Compatibility-only (compat.py); in verl: accept turn-by-turn tokenisation that differs from the whole
    conversation's."""
    max_length: int = 1024
    """Longest tokenised example (prompt + response)."""
    truncation: str = "error"
    """Longer examples: ``error``, ``left`` or ``right``."""
    balance_dp_token: bool = False
    """Compatibility-only (compat.py); in verl: equalise tokens across data-parallel ranks."""
    chat_template: Optional[str] = None
    """A Jinja chat template that replaces the tokenizer's."""
    image_key: str = "images"
    """Column of a row's images (a vision-language model: each ``<image>`` of the prompt is the next one)."""
    use_packing: bool = False
    """Pack several examples into one row of max_length tokens (no padding waste)."""
    max_samples: int = -1
    """Use at most this many rows (-1 = all)."""
    shuffle: bool = True
    """Shuffle each epoch."""
    seed: int = 1
    """Shuffle seed."""
    custom_cls: Dict[str, Any] = field(default_factory=lambda: {"path": None, "name": None})
    """A user dataset class (path + name)."""
    use_shm: bool = False
    """Compatibility-only, no effect (see compat.py)."""
    # verl 0.9.1's SFT data keys (issue 60)
    val_max_samples: int = -1
    """Use at most this many validation rows (-1 = all)."""
    enable_thinking_default: Optional[Any] = None
    """``enable_thinking`` passed to the chat template of every row (true/false); null (or verl's ``none``): not
    passed."""
    apply_chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the tokenizer's ``apply_chat_template`` (e.g. {enable_thinking: false})."""


@dataclass
class SFTModelConfig:
    """The model being fine-tuned."""

    partial_pretrain: Optional[str] = None
    """Model folder or hub id (verl's name)."""
    path: Optional[str] = None
    """Alias of partial_pretrain (wins when both are set)."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings."""
    external_lib: Optional[str] = None
    """Python module to import before loading."""
    enable_gradient_checkpointing: bool = False
    """Recompute activations in backward."""
    trust_remote_code: bool = False
    """Allow models with custom code."""
    lora_rank: int = 0
    """LoRA rank; 0 trains the full model."""
    lora_alpha: int = 16
    """LoRA alpha."""
    target_modules: Any = "all-linear"
    """LoRA target modules."""
    use_liger: bool = False
    """Compatibility-only, no effect (see compat.py)."""
    strategy: str = "fsdp2"
    """Compatibility-only (compat.py); in verl: training backend."""
    override_config: Dict[str, Any] = field(default_factory=dict)
    """Entries that override the model's HF config."""
    # verl 0.9.1's SFT model keys (issue 60)
    tokenizer_path: Optional[str] = None
    """The tokenizer's folder; null: the model's."""
    hf_config_path: Optional[str] = None
    """The HF config's folder (architecture, sizes); null: the model's. The weights still come from the model."""
    custom_chat_template: Optional[str] = None
    """A Jinja chat template that replaces the tokenizer's (``data.chat_template`` wins when both are set)."""
    lora_adapter_path: Optional[str] = None
    """A trained LoRA adapter (a peft folder) to continue training; its rank, alpha and targets come from it."""
    exclude_modules: Optional[Any] = None
    """Modules excluded from LoRA (with lora_rank > 0)."""
    use_shm: bool = False
    """Compatibility-only (compat.py); in verl: copy the model to /dev/shm before loading."""
    enable_activation_offload: bool = False
    """Compatibility-only (compat.py); in verl: offload activations to the CPU."""


@dataclass
class SFTOptimConfig:
    """AdamW + schedule with verl's SFT names and defaults (lr 1e-5, betas 0.9/0.95, cosine, 10% warm-up)."""

    lr: float = 1e-5
    """Peak learning rate."""
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    """AdamW (beta1, beta2)."""
    eps: float = 1e-8
    """AdamW epsilon."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay."""
    warmup_steps_ratio: float = 0.1
    """Linear warm-up length as a fraction of the total steps."""
    # verl 0.9.1's SFT optim key
    lr_warmup_steps: Optional[int] = -1
    """Linear warm-up steps; a positive value wins over warmup_steps_ratio (null, 0 or negative: the ratio)."""
    clip_grad: float = 1.0
    """Global gradient-norm clip (<= 0 disables)."""
    lr_scheduler: str = "cosine"
    """``cosine`` or ``constant`` after warm-up."""
    min_lr_ratio: float = 0.0
    """Floor of the cosine schedule as a fraction of lr."""
    num_cycles: float = 0.5
    """Cosine cycles over training."""
    # verl 0.9.1's SFT optim keys (issue 60)
    optimizer: str = "AdamW"
    """Optimizer class name inside ``optimizer_impl`` (e.g. AdamW, SGD; AdamW8bit with bitsandbytes)."""
    optimizer_impl: str = "torch.optim"
    """Module the optimizer class is imported from."""
    override_optimizer_config: Optional[Dict[str, Any]] = field(default_factory=dict)
    """Extra keyword arguments of the optimizer class, over lr / weight_decay / betas."""
    zero_indexed_step: bool = True
    """The schedule counts steps from 0 (verl's default) or from 1 (the first step already past warm-up step 0)."""


@dataclass
class SFTTrainerConfig:
    """Loop, logging and checkpoints of SFT."""

    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    """Checkpoint root."""
    default_hdfs_dir: Optional[str] = None
    """Compatibility-only, no effect (see compat.py)."""
    project_name: str = "hybridflow-sft"
    """Tracker project name."""
    experiment_name: str = "sft"
    """Tracker run name."""
    total_epochs: int = 4
    """Passes over the training set."""
    total_training_steps: Optional[int] = None
    """Stop after this many steps."""
    logger: Any = field(default_factory=lambda: ["console"])
    """Trackers: console, file, tensorboard, wandb, swanlab, mlflow."""
    seed: int = 1
    """Global seed."""
    save_freq: int = -1
    """Checkpoint every N steps (-1 = at the end only)."""
    test_freq: int = -1
    """Validation loss every N steps (-1 = each epoch end)."""
    nnodes: int = 1
    """Nodes."""
    n_gpus_per_node: int = 1
    """Devices (or CPU processes) per node."""
    max_ckpt_to_keep: Optional[int] = None
    """Keep only the newest N checkpoints."""
    resume_mode: str = "auto"
    """``auto``, ``disable`` or ``resume_path``."""
    resume_from_path: Optional[str] = None
    """Checkpoint to resume from when resume_mode=resume_path."""
    checkpoint: CheckpointContentsConfig = field(default_factory=CheckpointContentsConfig)
    """What checkpoints hold."""
    device: str = "auto"
    """``auto``, ``cpu`` or ``cuda``."""
    # issue 61: resume ownership, as trainer.start_over of PPO (checkpoints/ownership.py)
    start_over: bool = False
    """Delete the checkpoints in default_local_dir and start a fresh run there. Without it, a folder whose
    checkpoints were made under another configuration (model path or LoRA rank), or any checkpoint with
    resume_mode=disable, is refused with one line and left untouched."""


@dataclass
class SFTConfig:
    """Everything ``python -m hybridflow.trainer.sft_trainer`` reads."""

    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    """Supervised data."""
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    """Model to fine-tune."""
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    """Optimizer."""
    ulysses_sequence_parallel_size: int = 1
    """Ulysses sequence parallelism: groups of this many torchrun processes share one slice of each batch
    and split every packed row between them (hybridflow.models.ulysses). Must divide the processes and
    the attention heads; needs use_remove_padding (or data.use_packing). One process runs whole
    sequences and warns."""
    use_remove_padding: bool = False
    """verl's padding-free switch: the same as data.use_packing (micro-batches as one packed row)."""
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)
    """Loop, logging, checkpoints."""

    KEY_ALIASES: ClassVar[tuple[tuple[str, str], ...]] = (
        # verl 0.9's SFT trainer (sft_trainer_engine.yaml): its engine@engine, optim@optim and model@model groups
        ("data.tools_key", "data.multiturn.tools_key"),
        ("data.enable_thinking_key", "data.multiturn.enable_thinking_key"),
        ("data.train_max_samples", "data.max_samples"),
        ("model.use_remove_padding", "use_remove_padding"),
        ("checkpoint.", "trainer.checkpoint."),
        ("engine.ulysses_sequence_parallel_size", "ulysses_sequence_parallel_size"),
        ("engine.strategy", "model.strategy"),
        ("engine.", "model.fsdp_config."),
        ("optim.lr_warmup_steps_ratio", "optim.warmup_steps_ratio"),
        ("optim.warmup_style", "optim.lr_scheduler"),
        ("optim.lr_scheduler_type", "optim.lr_scheduler"),
        # issue 60: verl reads trainer.balance_batch only in sft_trainer_ray, to even out tokens per rank
        ("trainer.balance_batch", "data.balance_dp_token"),
    )
    """verl 0.9 SFT spellings -> this schema's keys (``hybridflow.config.loader.compose``)."""
    CONFIG_GROUPS: ClassVar[dict[str, tuple[str, ...]]] = {"engine": ("fsdp",), "optim": ("fsdp",),
                                                          "model": ("hf_model",)}
    """Hydra group choices verl's SFT commands pass (``engine=fsdp``): hybridflow has the one each names."""


def sft_messages_key(data: SFTDataConfig) -> Optional[str]:
    """The column of chat messages, or None for prompt/response rows."""
    if data.messages_key is not None:
        return data.messages_key
    return data.multiturn.messages_key if data.multiturn.enable else None


def sft_packed(cfg: SFTConfig) -> bool:
    """Micro-batches as one packed row: use_remove_padding, data.use_packing or data.pad_mode=no_padding."""
    return cfg.use_remove_padding or cfg.data.use_packing or cfg.data.pad_mode == "no_padding"


def sft_model_path(cfg: Any) -> str | None:
    """``model.path`` wins over verl's ``model.partial_pretrain``."""
    return cfg.model.path or cfg.model.partial_pretrain


def sft_micro_batch_size_per_gpu(data: Any, world_size: int) -> int:
    """Sequences per forward/backward on each rank: verl's deprecated global ``data.micro_batch_size``
    split over the data-parallel ranks when set, else ``data.micro_batch_size_per_gpu``."""
    if data.micro_batch_size is not None:
        return data.micro_batch_size // world_size
    return data.micro_batch_size_per_gpu


def sft_data_parallel_size(cfg: Any, world_size: int) -> int:
    """Data-parallel workers of an SFT run of ``world_size`` processes: groups of
    ``ulysses_sequence_parallel_size`` processes share one slice of the batch."""
    size = cfg.ulysses_sequence_parallel_size
    return world_size // size if size > 0 and world_size % size == 0 else world_size


def check_sft_batches(problems: list[str], data: Any, world_size: int) -> None:
    """The SFT batch splits into micro-batches over ``world_size`` data-parallel workers."""
    check_positive(problems, "data.train_batch_size", data.train_batch_size)
    if data.micro_batch_size is not None:
        check_positive(problems, "data.micro_batch_size", data.micro_batch_size)
        if data.micro_batch_size > 0 and data.micro_batch_size % world_size:
            problems.append(f"data.micro_batch_size={data.micro_batch_size} (global) is not divisible by the "
                            f"{world_size} data-parallel workers: use data.micro_batch_size_per_gpu instead")
            return
    micro = sft_micro_batch_size_per_gpu(data, world_size)
    check_positive(problems, "data.micro_batch_size_per_gpu", micro)
    if data.train_batch_size > 0 and micro > 0 and data.train_batch_size % (micro * world_size):
        problems.append(f"data.train_batch_size={data.train_batch_size} is not divisible by "
                        f"{micro} sequences per micro-batch x {world_size} data-parallel workers "
                        "(data.micro_batch_size_per_gpu, or data.micro_batch_size / workers)")
