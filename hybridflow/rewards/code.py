"""Code scorer: the fraction of test cases a generated Python program passes.

For code datasets (``codecontests``, ``apps``, ``taco``, ``primeintellect`` and their
hub names) the ground truth is JSON of test cases, in one of two forms:

- ``{"inputs": [stdin, ...], "outputs": [expected_stdout, ...]}`` -- judge style;
- ``{"asserts": ["assert f(2) == 4", ...]}`` -- each statement appended to the program.

The program is the last fenced code block of the response (```` ```python ... ``` ````),
or the whole response when it has none. Each test runs in a fresh sandbox
(:mod:`hybridflow.rewards.code_sandbox`). After the first time-out the remaining tests
count as failed without running, so a looping program costs one time limit, not one
per test. Returns ``{'score': passed / total, 'all_passed': 0 or 1, 'num_tests': total}``.
"""

from __future__ import annotations

import json
import re

from hybridflow.errors import DataError
from hybridflow.rewards.code_sandbox import check_sandbox, default_limits, outputs_match, run_python
from hybridflow.rewards.registry import register_scorer

CODE_DATA_SOURCES = (
    "codecontests",
    "deepmind/code_contests",
    "apps",
    "codeparrot/apps",
    "taco",
    "BAAI/TACO",
    "primeintellect",
    "PrimeIntellect/verifiable-coding-problems",
)
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_program(solution_str: str) -> str:
    """The last fenced code block, or the whole text when there is none."""
    blocks = _FENCE.findall(solution_str)
    return blocks[-1] if blocks else solution_str


def parse_test_cases(ground_truth) -> list[tuple[str, str | None, str | None]]:
    """``[(stdin, expected_stdout, assert_statement)]`` from the ground-truth JSON."""
    cases = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if isinstance(cases, dict) and "inputs" in cases and "outputs" in cases and "fn_name" not in cases:
        if len(cases["inputs"]) != len(cases["outputs"]):
            raise DataError("code test cases have different numbers of 'inputs' and 'outputs'; make them pair up")
        return [(str(given), str(wanted), None) for given, wanted in zip(cases["inputs"], cases["outputs"])]
    if isinstance(cases, dict) and "asserts" in cases:
        return [("", None, str(statement)) for statement in cases["asserts"]]
    raise DataError(
        "code ground_truth must be JSON {'inputs': [...], 'outputs': [...]} (stdin/stdout) or "
        "{'asserts': [...]}; convert call-based (fn_name) tests to 'asserts'"
    )


def compute_score(
    solution_str: str, ground_truth, time_limit_s: float | None = None, memory_limit_mb: int | None = None
) -> dict:
    """Pass fraction of the extracted program on the test cases (see module docstring).

    Limits default to ``reward_model.sandbox_fusion.timeout_s`` / ``memory_limit_mb``.
    """
    default_time, default_memory = default_limits()
    time_limit_s = default_time if time_limit_s is None else time_limit_s
    memory_limit_mb = default_memory if memory_limit_mb is None else memory_limit_mb
    program = extract_program(solution_str)
    cases = parse_test_cases(ground_truth)
    passed, timed_out = 0, False
    for stdin, expected, statement in cases:
        if timed_out:
            break
        source = program if statement is None else f"{program}\n\n{statement}\n"
        run = run_python(source, stdin=stdin, timeout_s=time_limit_s, memory_mb=memory_limit_mb)
        timed_out = run.timed_out
        passed += run.ok and (expected is None or outputs_match(run.stdout, expected))
    total = max(len(cases), 1)
    return {"score": passed / total, "all_passed": float(passed == len(cases) > 0), "num_tests": float(len(cases))}


@register_scorer(*CODE_DATA_SOURCES, preflight=check_sandbox)
def score_row(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    return compute_score(solution_str, ground_truth, **kwargs)
