"""Code scorer: the fraction of test cases a generated Python program passes.

For code datasets (``codecontests``, ``apps``, ``taco``, ``primeintellect`` and their
hub names) the ground truth is JSON of test cases, in one of two forms:

- ``{"inputs": [stdin, ...], "outputs": [expected_stdout, ...]}`` -- judge style: each test
  runs the program in a fresh sandbox; it passes when the run exits 0 (a crash, a time-out or
  the memory bound fails) and its whole stdout matches (an output longer than the kept limit
  fails: a prefix is never judged);
- ``{"asserts": ["assert f(2) == 4", ...]}`` -- each entry runs in the trusted judge
  (:mod:`hybridflow.rewards.sandbox_judge`); one sandbox per sample only answers calls of the
  program's own functions with plain data, so the program never sees the asserts or the
  expected values, and exiting early passes nothing.

The program is the last fenced code block of the response (```` ```python ... ``` ````),
or the whole response when it has none (:mod:`hybridflow.rewards.code_sandbox`). After the
first time-out the remaining tests count as failed without running, so a looping program
costs one time limit, not one per test; all tests of one sample stop at
:data:`SAMPLE_CEILING_S` (a hard ceiling, also with ``reward_model.timeout_s=null``).
Returns ``{'score': passed / total, 'all_passed': 0 or 1, 'num_tests': total}``.
"""

from __future__ import annotations

import functools
import json
import re
import time
import warnings

from hybridflow.errors import DataError
from hybridflow.rewards.code_sandbox import (
    OUTPUT_LIMIT_BYTES,
    check_sandbox,
    default_limits,
    outputs_match,
    run_asserts,
    run_python,
)
from hybridflow.rewards.sandbox_judge import TestCaseError, parse_assert_tests
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
SAMPLE_CEILING_S = 60.0
"""All of a sample's tests together stop here, whatever ``reward_model.timeout_s`` (null included)."""
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_program(solution_str: str) -> str:
    """The last fenced code block, or the whole text when there is none."""
    blocks = _FENCE.findall(solution_str)
    return blocks[-1] if blocks else solution_str


def parse_test_cases(ground_truth) -> tuple[list[tuple[str, str]], list[str]]:
    """``([(stdin, expected_stdout)], [assert_entry])`` from the ground-truth JSON; one of them is empty."""
    cases = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if isinstance(cases, dict) and "inputs" in cases and "outputs" in cases and "fn_name" not in cases:
        if len(cases["inputs"]) != len(cases["outputs"]):
            raise DataError("code test cases have different numbers of 'inputs' and 'outputs'; make them pair up")
        return [(str(given), str(wanted)) for given, wanted in zip(cases["inputs"], cases["outputs"])], []
    if isinstance(cases, dict) and "asserts" in cases:
        asserts = [str(statement) for statement in cases["asserts"]]
        try:
            parse_assert_tests(asserts)
        except TestCaseError as error:
            raise DataError(str(error)) from None
        return [], asserts
    raise DataError(
        "code ground_truth must be JSON {'inputs': [...], 'outputs': [...]} (stdin/stdout) or "
        "{'asserts': [...]}; convert call-based (fn_name) tests to 'asserts'"
    )


def _stdio_passes(program: str, cases: list[tuple[str, str]], time_limit_s: float, memory_limit_mb: int) -> int:
    """Tests whose output matches, from a run that exited 0; after a time-out, or past
    :data:`SAMPLE_CEILING_S` for the whole sample, the rest fail unrun."""
    passed, ceiling = 0, time.monotonic() + SAMPLE_CEILING_S
    for stdin, expected in cases:
        remaining = ceiling - time.monotonic()
        if remaining <= 0:
            _warn_ceiling()
            break
        run = run_python(program, stdin=stdin, timeout_s=min(time_limit_s, remaining), memory_mb=memory_limit_mb,
                         output_limit_bytes=_output_limit(expected))  # fmt: skip
        passed += run.ok and not run.stdout_truncated and outputs_match(run.stdout, expected)
        if run.timed_out:
            if remaining < time_limit_s:
                _warn_ceiling()
            break
    return passed


def _output_limit(expected: str) -> int:
    """Room for the whole of a right answer (twice the expected output, at least 1 MiB): what is
    judged is all the program printed, never a prefix, and a longer output fails."""
    return max(OUTPUT_LIMIT_BYTES, 2 * len(expected.encode()) + 4096)


@functools.cache
def _warn_ceiling() -> None:
    warnings.warn(
        f"code reward: a sample's tests ran past the {SAMPLE_CEILING_S:g} s ceiling per sample; its remaining "
        "tests count as failed (the ceiling holds even with reward_model.timeout_s=null)",
        RuntimeWarning,
        stacklevel=3,
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
    stdio_cases, asserts = parse_test_cases(ground_truth)
    if asserts:
        time_limit_s = min(time_limit_s, SAMPLE_CEILING_S / (len(asserts) + 1))
        passed = sum(run_asserts(program, asserts, timeout_s=time_limit_s, memory_mb=memory_limit_mb))
    else:
        passed = _stdio_passes(program, stdio_cases, time_limit_s, memory_limit_mb)
    count = len(asserts) + len(stdio_cases)
    return {"score": passed / max(count, 1), "all_passed": float(passed == count > 0), "num_tests": float(count)}


@register_scorer(*CODE_DATA_SOURCES, preflight=check_sandbox, keyword_args=("time_limit_s", "memory_limit_mb"))
def score_row(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    return compute_score(solution_str, ground_truth, **kwargs)
