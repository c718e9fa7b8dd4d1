"""Scorer for reasoning-gym tasks, using each task's own ``score_answer``.

hybridflow's preprocess script writes one row per reasoning-gym entry with
``data_source`` = the task name (``chain_sum``, ``countdown``, ...), ``ground_truth`` =
the entry's ``answer``, ``extra_info['metadata']`` = the entry's metadata as a JSON
string and optionally ``extra_info['task_config']`` (the dataset config, dict or JSON)
and ``extra_info['question']``. We rebuild the entry ``{question, answer, metadata}``
and call the task's ``score_answer(answer, entry)`` (Stojanovski et al., 2025,
"Reasoning Gym"), so partial credit follows the package (e.g. ``countdown`` gives 0.05
for a well-formed wrong expression).

Answer extraction rule, first that applies:

1. the content of the last ``<answer>...</answer>`` (reasoning-gym's ``extract_answer``);
2. when the ground truth is a number: the last number in the text, commas removed
   ("The total is 1,024." -> ``1024``);
3. otherwise the last non-empty line, without a leading "Answer:" / "Final answer:"
   label (``countdown`` answers are expressions such as ``94*4 - 61 - 6``).
"""

from __future__ import annotations

import functools
import json
import re

from hybridflow.errors import DataError

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_LABEL = re.compile(r"^\s*(?:final\s+)?answer\s*[:=]\s*", re.IGNORECASE)


@functools.cache
def task_names() -> frozenset[str]:
    """Names of all datasets registered in the installed reasoning-gym."""
    import reasoning_gym  # noqa: F401  (importing registers every task)
    from reasoning_gym.factory import DATASETS

    return frozenset(DATASETS)


def is_reasoning_gym_task(data_source: str) -> bool:
    return data_source in task_names()


def _is_number(text: str) -> bool:
    return _NUMBER.fullmatch(text.strip().replace(" ", "")) is not None


def extract_answer(solution_str: str, ground_truth) -> str | None:
    """The model's answer by the rule in the module docstring; None for empty text."""
    from reasoning_gym.utils import extract_answer as extract_tagged

    tagged = extract_tagged(solution_str)
    if tagged is not None:
        return tagged
    if _is_number(str(ground_truth)):
        numbers = _NUMBER.findall(solution_str)
        return numbers[-1].replace(",", "") if numbers else None
    lines = [line for line in solution_str.splitlines() if line.strip()]
    return _LABEL.sub("", lines[-1]).strip() if lines else None


def _json_field(extra_info: dict, key: str, default):
    value = extra_info.get(key, default)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as error:
            fix = "rewrite the rows with the preprocess script"
            raise DataError(f"extra_info[{key!r}] is not valid JSON ({error}); {fix}") from None
    return value


@functools.lru_cache(maxsize=256)
def _score_fn(task: str, config_json: str):
    # Building a dataset can be costly (some tasks generate at construction): once per
    # (task, config) per process.
    import reasoning_gym

    config = json.loads(config_json)
    if config:
        return reasoning_gym.create_dataset(task, **config).score_answer
    return reasoning_gym.get_score_answer_fn(task)


def compute_score(task: str, solution_str: str, ground_truth, extra_info: dict | None = None) -> float:
    """reasoning-gym's score of the answer extracted from ``solution_str``, in [0, 1]."""
    extra_info = extra_info or {}
    entry = {
        "question": extra_info.get("question", ""),
        "answer": ground_truth,
        "metadata": _json_field(extra_info, "metadata", {}),
    }
    config = _json_field(extra_info, "task_config", {}) or {}
    score_answer = _score_fn(task, json.dumps(config, sort_keys=True))
    return float(score_answer(extract_answer(solution_str, ground_truth), entry))


def score_row(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    """Registry adapter: the data source is the task name."""
    return compute_score(data_source, solution_str, ground_truth, extra_info)
