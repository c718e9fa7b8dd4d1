"""``python -m hybridflow.trainer.main_eval data.path=gen.parquet ...``: verl 0.9.1's ``verl.trainer.main_eval``
: score a parquet of generated responses offline against each row's ground truth.

Each row holds a list of responses (``data.response_key``), its data source and ``reward_model.ground_truth``;
a row's score is the mean over its responses (a scorer's dict gives its ``score``), and the result is the mean
over the rows of each data source, printed as ``{"test_score/<data_source>": mean}`` and returned. Scored in this
process (verl sends each row to a Ray task; the numbers are the same).
"""

from __future__ import annotations

import sys
from collections import defaultdict

import numpy as np
import pandas as pd

from hybridflow.config.evaluation import EvalConfig
from hybridflow.config.loader import load_config, split_config_args
from hybridflow.errors import ConfigError, run_entry_point
from hybridflow.rewards.custom import load_reward_function
from hybridflow.rewards.registry import default_compute_score


def evaluate(cfg: EvalConfig) -> dict[str, float]:
    """``{"test_score/<data_source>": mean score}`` of the generated responses in ``cfg.data.path``."""
    data = cfg.data
    frame = pd.read_parquet(data.path)
    missing = [key for key in (data.response_key, data.data_source_key, data.reward_model_key) if key not in frame]
    if missing:
        raise ConfigError(f"{data.path} has no column(s) {missing}: set data.response_key / data_source_key / "
                          f"reward_model_key to its columns ({', '.join(frame.columns)})")
    score_fn = default_compute_score
    if cfg.custom_reward_function.path:
        score_fn = load_reward_function(cfg.custom_reward_function.path, cfg.custom_reward_function.name)
    by_source: dict[str, list[float]] = defaultdict(list)
    for responses, source, reward in zip(frame[data.response_key], frame[data.data_source_key],
                                         frame[data.reward_model_key]):
        scores = [_score(score_fn(source, str(r), reward["ground_truth"])) for r in responses]
        by_source[source].append(float(np.mean(scores)))
    return {f"test_score/{source}": float(np.mean(values)) for source, values in by_source.items()}


def _score(value) -> float:
    return float(value["score"] if isinstance(value, dict) else value)


def main(argv: list[str] | None = None) -> int:
    def run(args: list[str]) -> int:
        config_file, overrides = split_config_args(args)
        print(evaluate(load_config(EvalConfig, overrides, config_file)))
        return 0

    return run_entry_point(run, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
