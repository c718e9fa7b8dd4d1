"""``python -m hybridflow.trainer.main_eval``'s config: verl 0.9.1's ``evaluation.yaml`` keys ."""

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class EvalDataConfig:
    """The parquet of generated responses to score."""

    path: str = "/tmp/math_Qwen2-7B-Instruct.parquet"
    """Parquet file with one row per prompt and a list of responses in ``response_key``."""
    prompt_key: str = "prompt"
    """Column of the prompt (kept for verl's layout; not read to score)."""
    response_key: str = "responses"
    """Column holding each row's list of generated responses."""
    data_source_key: str = "data_source"
    """Column naming the row's data source (picks the scorer; groups the scores)."""
    reward_model_key: str = "reward_model"
    """Column holding ``{style, ground_truth}``."""


@dataclass
class EvalRewardFunctionConfig:
    """A user reward function; null path: the built-in scorer of each data source (verl's default_compute_score)."""

    path: Optional[str] = None
    """.py file defining the function."""
    name: str = "compute_score"
    """The function's name in that file."""


@dataclass
class EvalRayInitConfig:
    """Compatibility-only: the responses are scored in this process (verl fans them out to Ray tasks)."""

    num_cpus: Optional[int] = None
    """Compatibility-only: no Ray cluster is started."""


@dataclass
class EvalRayKwargsConfig:
    ray_init: EvalRayInitConfig = field(default_factory=EvalRayInitConfig)
    """Compatibility-only."""
    timeline_json_file: Optional[str] = None
    """Compatibility-only: no Ray timeline is written."""


@dataclass
class EvalConfig:
    """Everything ``python -m hybridflow.trainer.main_eval`` reads."""

    data: EvalDataConfig = field(default_factory=EvalDataConfig)
    """The generated responses."""
    custom_reward_function: EvalRewardFunctionConfig = field(default_factory=EvalRewardFunctionConfig)
    """How a response is scored."""
    ray_kwargs: EvalRayKwargsConfig = field(default_factory=EvalRayKwargsConfig)
    """Compatibility-only."""
