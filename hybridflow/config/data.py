"""verl's ``data.*``: the prompt data (files, lengths, filtering, the sampler).

Part of the PPO trainer's schema (:class:`hybridflow.config.ppo.PPOConfig`); each field's docstring is its
documentation, and ``ppo_trainer.yaml`` is generated from them.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hybridflow.config.checks import check_positive


@dataclass
class CustomClassConfig:
    """A user class loaded from a file: ``path`` to a .py file, ``name`` of the class."""

    path: Optional[str] = None
    """Refused when set (a user dataset class is not supported); in verl: python file that defines the class."""
    name: Optional[str] = None
    """Refused when set with ``path``; in verl: class name inside that file."""


@dataclass
class SamplerConfig:
    """verl's ``data.sampler``: a user sampler class (curriculum learning) that orders the training prompts."""

    class_path: Optional[str] = None
    """Refused when set (a user sampler is not supported: the training set is shuffled by ``data.shuffle`` /
    ``data.seed``); in verl: python file or module that defines the sampler class."""
    class_name: Optional[str] = None
    """Refused when set with ``class_path``; in verl: the sampler class (an AbstractSampler) in that file."""


@dataclass
class DataConfig:
    """Prompt data (verl's ``data.*``). Rows: prompt (chat messages), data_source, ability, reward_model, extra_info."""

    tokenizer: Optional[str] = None
    """Tokenizer path; null uses the actor model's tokenizer."""
    train_files: Any = "~/data/gsm8k/train.parquet"
    """Training parquet/jsonl file or list of files; a folder of them, or a ``datasets`` save_to_disk folder."""
    val_files: Any = "~/data/gsm8k/test.parquet"
    """Validation parquet/jsonl file, list of files or folder (as train_files); null disables validation."""
    prompt_key: str = "prompt"
    """Column holding the prompt as a list of chat messages."""
    reward_fn_key: str = "data_source"
    """Column used to route each row to its reward function."""
    max_prompt_length: int = 512
    """Prompt length limit in tokens (after the chat template)."""
    max_response_length: int = 512
    """Maximum number of generated tokens per response."""
    train_batch_size: int = 1024
    """Prompts per training step (each is sampled ``rollout.n`` times)."""
    gen_batch_size: Optional[int] = None
    """Prompts per generation batch (DAPO's dynamic sampling): each round generates this many prompts'
    groups and keeps the informative ones until ``train_batch_size`` groups are collected; null =
    train_batch_size. Without ``algorithm.filter_groups.enable`` it must equal train_batch_size."""
    val_batch_size: Optional[int] = None
    """Prompts per validation generation batch; null = the whole validation set at once."""
    return_raw_input_ids: bool = False
    """Compatibility-only (compat.py); in verl: keep the unpadded prompt ids (needed when the reward model uses another tokenizer)."""
    return_raw_chat: bool = False
    """Keep the raw chat messages in the batch."""
    return_full_prompt: bool = False
    """Compatibility-only (compat.py); in verl: keep the templated prompt text in the batch."""
    shuffle: bool = True
    """Shuffle the training set each epoch (reproducibly from ``seed`` and the epoch)."""
    seed: int = 1
    """Seed of the training-set shuffle."""
    dataloader_num_workers: int = 0
    """Compatibility-only (compat.py); in verl: worker processes of the DataLoader (0 = in the main process; tokenisation is done up front)."""
    validation_shuffle: bool = False
    """Shuffle the validation set."""
    filter_overlong_prompts: bool = False
    """Drop rows whose templated prompt is longer than ``max_prompt_length``."""
    filter_overlong_prompts_workers: int = 1
    """Compatibility-only, no effect (see compat.py)."""
    filter_accuracy: bool = False
    """verl-recipe's PRIME: the prompt groups whose accuracy (mean score of their n responses) lies within the
    accuracy bounds are trained on first (the others fill up the batch after them)."""
    accuracy_lower_bound: float = 0.0
    """verl-recipe's PRIME: the lowest accuracy of a group that passes ``filter_accuracy``."""
    accuracy_upper_bound: float = 1.0
    """verl-recipe's PRIME: the highest accuracy of a group that passes ``filter_accuracy``."""
    oversample_factor: float = 1.0
    """verl-recipe's PRIME: each step generates ``train_batch_size x oversample_factor`` prompts' groups and trains
    on ``train_batch_size`` of them, the groups that pass the filters first."""
    filter_truncate: bool = False
    """verl-recipe's PRIME: a group with a response of ``max_response_length - 1`` tokens or more does not pass."""
    truncation: str = "error"
    """What to do with a prompt that is still too long: ``error``, ``left``, ``right`` or ``middle``."""
    max_samples: int = -1
    """Use at most this many training rows (-1 = all)."""
    train_max_samples: int = -1
    """Newer verl spelling of ``max_samples`` for the training set."""
    val_max_samples: int = -1
    """Use at most this many validation rows (-1 = all)."""
    trust_remote_code: bool = False
    """Allow a tokenizer with custom code."""
    custom_cls: CustomClassConfig = field(default_factory=CustomClassConfig)
    """A user dataset class (path + name) instead of the built-in RL dataset: refused before anything loads."""
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    """A user sampler class (verl's curriculum sampler): refused before anything loads."""
    apply_chat_template_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for ``tokenizer.apply_chat_template`` (e.g. enable_thinking)."""
    use_shm: bool = False
    """Compatibility-only, no effect (see compat.py)."""
    image_key: str = "images"
    """Column of a row's images (a vision-language policy: each ``<image>`` of the prompt is the next one)."""
    video_key: str = "videos"
    """Column of a row's videos: a row that carries any is refused (videos are not supported; give the frames as
    images in ``image_key``)."""
    return_multi_modal_inputs: bool = True
    """Compatibility-only (compat.py); in verl: keep the processor's vision inputs in the batch."""
    # issue 60: verl 0.9.1's multimodal processing keys
    image_patch_size: Optional[int] = 14
    """The overlong-prompt filter (``filter_overlong_prompts``) counts an image prompt on its images first resized to
    multiples of 2 x this (qwen_vl_utils' ``fetch_image``, as verl's RL dataset does; ``data/patch_resize.py``);
    null = the processor's patch size. Rollout and training use the processor's own patch size, as verl's agent
    loop does."""
    mm_processor_kwargs: Dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of every call of a vision-language policy's processor (prompt images and a tool's),
    e.g. ``{max_pixels: 200704}`` for fewer image tokens, as verl passes them."""


TRUNCATION_MODES = ("error", "left", "right", "middle")


def prime_filtering(data: Any) -> bool:
    """PRIME's accuracy / truncation filter or its oversampling is asked for (``data.*``, verl-recipe's keys)."""
    return bool(data.filter_accuracy or data.filter_truncate or data.oversample_factor != 1.0)


def generation_batch_size(data: Any) -> int:
    """Prompts a step generates from: ``gen_batch_size`` (DAPO), else ``train_batch_size`` x PRIME's
    ``oversample_factor`` (1 unless set), as verl-recipe's PRIME trainer sizes its data loader."""
    return data.gen_batch_size or int(data.train_batch_size * data.oversample_factor)


def _check_prime_filter(problems: list[str], cfg: Any) -> None:
    data = cfg.data
    if not prime_filtering(data):
        return
    if data.oversample_factor < 1.0:
        problems.append(f"data.oversample_factor={data.oversample_factor} must be >= 1 (PRIME generates that many "
                        "times the train batch's prompts and keeps train_batch_size of them)")
    if cfg.algorithm.filter_groups.enable:
        problems.append("PRIME's filter (data.filter_accuracy / filter_truncate / oversample_factor) and DAPO's "
                        "algorithm.filter_groups.enable=True both pick the groups to train on: keep one")
    if data.gen_batch_size is not None and data.gen_batch_size != data.train_batch_size:
        problems.append(f"data.gen_batch_size={data.gen_batch_size} with PRIME's filter: the generation batch is "
                        "train_batch_size x data.oversample_factor; drop data.gen_batch_size")


MM_RESERVED = ("text", "images", "videos", "return_tensors")
"""Processor arguments hybridflow sets itself: not for ``data.mm_processor_kwargs``."""


def check_multimodal(problems: list[str], cfg: Any) -> None:
    """``data.image_patch_size`` is a positive size or null; ``data.mm_processor_kwargs`` a mapping of the processor's
    own options (issue 60)."""
    data = cfg.data
    if data.image_patch_size is not None and data.image_patch_size <= 0:
        problems.append(f"data.image_patch_size={data.image_patch_size} must be a positive patch size (e.g. 14) or "
                        "null (the processor's)")
    taken = sorted(set(data.mm_processor_kwargs or {}) & set(MM_RESERVED))
    if taken:
        problems.append(f"data.mm_processor_kwargs sets {', '.join(taken)}, which the data pipeline passes itself; "
                        "keep only the processor's options (e.g. max_pixels, min_pixels)")


def check_generation_batch(problems: list[str], cfg: Any) -> None:
    """data.gen_batch_size only means something with DAPO's dynamic sampling."""
    gen, train = cfg.data.gen_batch_size, cfg.data.train_batch_size
    _check_prime_filter(problems, cfg)
    if gen is None or prime_filtering(cfg.data):
        return
    check_positive(problems, "data.gen_batch_size", gen)
    if gen > 0 and gen != train and not cfg.algorithm.filter_groups.enable:
        problems.append(f"data.gen_batch_size={gen} differs from data.train_batch_size={train} but "
                        "algorithm.filter_groups.enable=False: generation batches larger or smaller than the "
                        "train batch are for dynamic sampling; enable filter_groups or drop data.gen_batch_size")
