import pytest

from hybridflow.rewards.math import compute_score, last_boxed_content


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{5}", "5"),
        (r"\boxed{1} then \boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # last one wins, nested braces kept
        (r"\boxed{\sqrt{a{b}}+1} end", r"\sqrt{a{b}}+1"),
        (r"\fbox{7}", "7"),
        (r"\boxed{12", None),  # never closed
        ("no box at all", None),
    ],
)
def test_last_boxed_content(text, expected):
    assert last_boxed_content(text) == expected


@pytest.mark.parametrize(
    "response, truth, expected",
    [
        (r"The answer is \boxed{0.5}.", r"\frac{1}{2}", 1.0),
        (r"The answer is \boxed{\frac{1}{2}}.", "0.5", 1.0),
        (r"\boxed{\{1,2\}}", r"\{2,1\}", 1.0),
        (r"\boxed{2x+2}", "2(x+1)", 1.0),
        (r"\boxed{3}", "2", 0.0),
        ("The answer is 0.5", r"\frac{1}{2}", 0.0),  # unboxed: no credit
        (r"\boxed{5}", r"\boxed{5}", 1.0),  # boxed ground truth is unwrapped
    ],
)
def test_math_verify_equivalence(response, truth, expected):
    assert compute_score(response, truth) == expected


def test_works_off_the_main_thread():
    # signal.alarm only works on the main thread; the scorer must switch math-verify's time-outs off there
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(compute_score, r"\boxed{\frac{2}{4}}", "0.5").result() == 1.0
