import pytest

from hybridflow.rewards.gsm8k import SOLUTION_CLIP_CHARS, compute_score, extract_solution


@pytest.mark.parametrize(
    "text, method, expected",
    [
        ("18 eggs... #### 18", "strict", "18"),
        ("#### 3 first try, then #### 5", "strict", "5"),  # the last '####' wins
        ("#### 1,234", "strict", "1234"),
        ("#### $12", "strict", "12"),
        ("#### -7", "strict", "-7"),
        ("the answer is 18", "strict", None),  # strict needs '#### '
        ("3 apples and 4 pears make 7.", "flexible", "7"),
        ("costs $1,050 in total", "flexible", "1050"),
        ("no digits here.", "flexible", None),
    ],
)
def test_extract_solution(text, method, expected):
    assert extract_solution(text, method=method) == expected


def test_score_values():
    assert compute_score("so #### 72", "72") == 1.0
    assert compute_score("so #### 71", "72") == 0.0  # default format_score
    assert compute_score("so #### 71", "72", format_score=0.1) == 0.1
    assert compute_score("no answer", "72", format_score=0.1) == 0.0  # nothing extracted: 0, not format_score
    assert compute_score("so #### 72", "72", score=2.0) == 2.0
    assert compute_score("I think 70, no 72", "72", method="flexible") == 1.0
    assert compute_score("I think 72", "72", method="strict") == 0.0
    assert compute_score("#### 1,000", "1,000") == 1.0  # commas stripped on both sides


def test_only_last_300_characters_are_searched():
    early = "#### 42 " + "x" * SOLUTION_CLIP_CHARS
    assert compute_score(early, "42") == 0.0
    late = "x" * 1000 + " #### 42"
    assert compute_score(late, "42") == 1.0


def test_bad_method_is_rejected():
    with pytest.raises(ValueError, match="strict"):
        extract_solution("#### 1", method="loose")
