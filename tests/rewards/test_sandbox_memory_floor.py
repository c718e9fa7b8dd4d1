"""The config's floor for ``reward_model.sandbox_fusion.memory_limit_mb`` is the sandbox's real one: a program
starts at the floor and not at half of it (so the refusal in config/validate.py names a value that matters)."""

from hybridflow.config.validate import SANDBOX_MIN_MEMORY_MB
from hybridflow.rewards import code_sandbox
from hybridflow.rewards.code_sandbox import run_python


def test_a_program_starts_at_the_floor_and_not_below(monkeypatch):
    if not code_sandbox.sandbox_available():  # grading, not isolation, is what this checks
        monkeypatch.setenv(code_sandbox.ALLOW_UNSANDBOXED_ENV, "1")
    at_floor = run_python("print(sum(range(10)))", stdin="", timeout_s=10, memory_mb=SANDBOX_MIN_MEMORY_MB)
    assert at_floor.stdout == "45\n", at_floor
    below = run_python("print(sum(range(10)))", stdin="", timeout_s=10, memory_mb=SANDBOX_MIN_MEMORY_MB // 2)
    assert below.stdout == ""
