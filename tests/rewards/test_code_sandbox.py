import json
import time

import pytest

from hybridflow.errors import DataError
from hybridflow.rewards.code import compute_score, extract_program
from hybridflow.rewards.code_sandbox import outputs_match, run_python
from hybridflow.rewards.registry import default_compute_score

ADD_TESTS = json.dumps({"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7", "0\n"]})


def test_passing_program_scores_one():
    response = "Here you go:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\n"
    assert compute_score(response, ADD_TESTS) == {"score": 1.0, "all_passed": 1.0, "num_tests": 3.0}


def test_partially_wrong_program_scores_pass_fraction():
    # a - b is right only when b == 0: one of three tests
    response = "```python\na, b = map(int, input().split())\nprint(a - b)\n```"
    assert compute_score(response, ADD_TESTS)["score"] == pytest.approx(1 / 3)


def test_assert_based_tests_and_routing():
    truth = json.dumps({"asserts": ["assert square(3) == 9", "assert square(-2) == 4", "assert square(0) == 1"]})
    response = "```python\ndef square(x):\n    return x * x\n```"
    result = default_compute_score("codecontests", response, truth)
    assert result["score"] == pytest.approx(2 / 3) and result["all_passed"] == 0.0


def test_infinite_loop_is_bounded_by_the_time_limit():
    start = time.monotonic()
    run = run_python(program="while True:\n    pass\n", time_limit_s=1.0)
    assert run.timed_out and run.returncode is None and not run.ok
    assert time.monotonic() - start < 1.0 + 3.0


def test_looping_program_costs_one_time_limit_not_one_per_test():
    truth = json.dumps({"inputs": ["1\n"] * 5, "outputs": ["1\n"] * 5})
    start = time.monotonic()
    result = compute_score("```python\nwhile True: pass\n```", truth, time_limit_s=1.0)
    assert result["score"] == 0.0 and time.monotonic() - start < 1.0 + 3.0


def test_huge_allocation_fails_inside_the_memory_limit():
    run = run_python(program="x = bytearray(10 * 2**30)\nprint('allocated')\n", memory_limit_mb=512, time_limit_s=5.0)
    assert not run.ok and "MemoryError" in run.stderr and "allocated" not in run.stdout


def test_network_is_blocked():
    program = "import socket\nsocket.create_connection(('127.0.0.1', 9))\n"
    run = run_python(program=program, time_limit_s=5.0)
    assert not run.ok and ("disabled" in run.stderr or "unreachable" in run.stderr.lower())


def test_runs_in_a_fresh_temp_dir():
    run = run_python(program="import os\nprint(sorted(os.listdir('.')))\n")
    assert run.ok and run.stdout.strip() == "['main.py']"


def test_extract_program_and_compare():
    assert extract_program("a\n```py\nx = 1\n```\nb\n```python\ny = 2\n```") == "y = 2\n"
    assert extract_program("print(1)") == "print(1)"
    assert outputs_match("1 2  \n3\n\n", "1 2\n3")
    assert not outputs_match("1 2\n", "12\n")


def test_bad_test_case_json_names_the_format():
    with pytest.raises(DataError, match="'inputs'"):
        compute_score("print(1)", json.dumps({"fn_name": "f", "inputs": [[1]], "outputs": [[1]]}))
