"""The algorithm library's errors are user errors: the entry points print them as one line, not a traceback."""

import pytest

from hybridflow.algos import get_advantage
from hybridflow.algos.errors import AlgorithmError, UnknownAlgorithmError
from hybridflow.algos.policy_losses.common import clip_range
from hybridflow.errors import HybridflowError, run_entry_point


def failing_main(error_source):
    def main(argv):
        error_source()
    return main


@pytest.mark.parametrize("error_source, line", [
    (lambda: clip_range(clip_ratio=-0.2, clip_ratio_low=None, clip_ratio_high=None),
     "hybridflow: error: clip ratios must be >= 0, got low=-0.2, high=-0.2; fix actor.clip_ratio_low/high\n"),
    (lambda: get_advantage("grpo_typo"), "hybridflow: error: unknown advantage estimator 'grpo_typo'"),
])
def test_an_algorithm_error_is_one_line_on_stderr(error_source, line, capsys):
    """Issue 50: a negative clip_ratio reaching the policy loss was a traceback (AlgorithmError was only a
    ValueError); it stays a ValueError for library callers that catch that."""
    with pytest.raises(AlgorithmError) as err:
        error_source()
    assert isinstance(err.value, HybridflowError) and isinstance(err.value, ValueError)
    assert issubclass(UnknownAlgorithmError, HybridflowError)
    assert run_entry_point(failing_main(error_source), []) == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith(line) and stderr.count("\n") == 1 and "Traceback" not in stderr
