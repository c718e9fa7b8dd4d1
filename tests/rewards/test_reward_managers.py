import json
import math
import textwrap
import time

import pytest
reasoning_gym = pytest.importorskip("reasoning_gym")  # the GPU image lacks it: skip, do not stop collection

from hybridflow.errors import ConfigError
from hybridflow.rewards.custom import load_reward_function
from hybridflow.rewards.manager import DapoRewardManager, build_reward_manager

SCORER = """
import math, os, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    if solution_str == "hang":
        time.sleep(600)
    if solution_str == "spin":
        while True:
            pass
    if solution_str == "nan":
        return math.nan
    if solution_str == "raise":
        raise RuntimeError("scorer bug")
    if solution_str == "die":
        os._exit(3)
    if solution_str == "flag":
        return True
    return {"score": float(solution_str == ground_truth) + bonus, "length": len(solution_str), "tag": "text"}
"""


@pytest.fixture(scope="module")
def scorer(tmp_path_factory):
    path = tmp_path_factory.mktemp("custom") / "scorer.py"
    path.write_text(textwrap.dedent(SCORER))
    return load_reward_function(str(path))


def _run(manager, responses, truths=None):
    truths = truths or ["a"] * len(responses)
    return manager(responses, ["acme"] * len(responses), truths, [None] * len(responses))


def test_naive_failures_get_failure_score_and_are_counted(scorer):
    manager = build_reward_manager("naive", compute_score=scorer, failure_score=-1.0)
    result = _run(manager, ["a", "nan", "raise", "b", "flag"])
    assert result.scores == [1.0, -1.0, -1.0, 0.0, 1.0]
    assert result.num_failed == 2 and result.num_timed_out == 0
    assert "score is nan" in result.failures[0] and "RuntimeError: scorer bug" in result.failures[1]
    # extra metrics: numbers only, nan where a sample reported none
    assert list(result.extra) == ["length"]
    assert result.extra["length"][0] == 1.0 and result.extra["length"][3] == 1.0
    assert math.isnan(result.extra["length"][1]) and math.isnan(result.extra["length"][4])


def test_reward_kwargs_are_bound(scorer):
    manager = build_reward_manager("naive", compute_score=scorer, reward_kwargs={"bonus": 0.5})
    assert _run(manager, ["a", "b"]).scores == [1.5, 0.5]


@pytest.mark.parametrize("name, kwargs", [("naive", {}), ("parallel", {"num_workers": 2})])
def test_hung_scorer_times_out_within_bound(scorer, name, kwargs):
    timeout_s = 1.0
    # preload=(): the custom scorer needs no math-verify / reasoning-gym, so a replaced worker is ready at once
    manager = build_reward_manager(name, compute_score=scorer, timeout_s=timeout_s, preload=(), **kwargs)
    try:
        _run(manager, ["a"])  # start the worker(s): process start-up is not what is timed here
        start = time.monotonic()
        result = _run(manager, ["a", "hang", "b", "spin", "nan", "a", "raise"])
        elapsed = time.monotonic() - start
        assert result.scores == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
        assert result.num_failed == 4 and result.num_timed_out == 2
        assert sum("timed out after 1 s" in reason for reason in result.failures) == 2
        # naive: two sequential time-outs; parallel: they overlap. Either way bounded, not 600 s.
        assert elapsed < 2 * timeout_s + 3.0
        # the replaced worker keeps scoring
        assert _run(manager, ["a", "b"]).scores == [1.0, 0.0]
    finally:
        manager.close()


def test_dead_worker_is_a_counted_failure_and_is_replaced(scorer):
    manager = build_reward_manager("parallel", compute_score=scorer, num_workers=1, timeout_s=10.0, preload=())
    try:
        result = _run(manager, ["die", "a"])
        assert result.scores == [0.0, 1.0]
        assert result.num_failed == 1 and result.num_timed_out == 0 and "died" in result.failures[0]
    finally:
        manager.close()


def _mixed_batch():
    responses, sources, truths, infos = [], [], [], []
    for task in ("chain_sum", "countdown"):
        for seed in range(3):
            entry = reasoning_gym.create_dataset(task, size=1, seed=seed)[0]
            guess = entry["metadata"]["expression"] if task == "countdown" and seed != 1 else entry["answer"]
            responses.append(f"<answer>{guess if seed != 2 else 'oops 123'}</answer>")
            sources.append(task)
            truths.append(entry["answer"])
            infos.append({"metadata": json.dumps(entry["metadata"])})
    rows = [
        ("openai/gsm8k", "so #### 12", "12"),
        ("openai/gsm8k", "so #### 13", "12"),
        ("lighteval/MATH", r"\boxed{\frac{1}{2}}", "0.5"),
        ("lighteval/MATH", r"\boxed{3}", "4"),
    ]
    for source, response, truth in rows:
        responses.append(response), sources.append(source), truths.append(truth), infos.append(None)
    return responses, sources, truths, infos


def test_parallel_equals_naive_on_builtin_scorers():
    batch = _mixed_batch()
    naive = build_reward_manager("naive")(*batch)
    parallel_manager = build_reward_manager("parallel", num_workers=2, timeout_s=30.0)
    try:
        parallel = parallel_manager(*batch)
    finally:
        parallel_manager.close()
    assert parallel == naive
    assert naive.num_failed == 0 and set(naive.scores) > {0.0, 1.0}  # right, wrong and partial-credit rows


def test_dapo_adds_overlong_penalty(scorer):
    max_len, buffer_len, factor = 20, 8, 0.5
    manager = DapoRewardManager(
        scorer, max_response_length=max_len, overlong_buffer_len=buffer_len, penalty_factor=factor
    )
    lengths = [5, 12, 16, 20, 30]
    result = manager(["a", "a", "b", "a", "a"], ["acme"] * 5, ["a"] * 5, [None] * 5, response_lengths=lengths)
    # DAPO eq. (13): min(0, (L_max - L_cache - |y|) / L_cache) * factor, floored at -factor
    penalties = [max(min(0.0, (max_len - buffer_len - n) / buffer_len), -1.0) * factor for n in lengths]
    accs = [1.0, 1.0, 0.0, 1.0, 1.0]
    assert result.extra["overlong_reward"] == pytest.approx(penalties)
    assert result.extra["acc"] == accs
    assert result.scores == pytest.approx([a + p for a, p in zip(accs, penalties)])


def test_dapo_needs_lengths_and_a_valid_buffer(scorer):
    manager = build_reward_manager("dapo", compute_score=scorer, max_response_length=10, overlong_buffer_len=4)
    with pytest.raises(ValueError, match="response_lengths"):
        _run(manager, ["a"])
    with pytest.raises(ConfigError, match="overlong_buffer.len"):
        build_reward_manager("dapo", compute_score=scorer, max_response_length=10, overlong_buffer_len=11)


def test_unknown_manager_lists_choices():
    with pytest.raises(ConfigError, match="dapo, gdpo, naive, parallel, prime"):
        build_reward_manager("primo")


def test_prime_is_a_process_pool_with_per_sample_time_limits(scorer):
    """verl's ``prime`` manager scores in a process pool; a sample that hangs or kills its worker
    costs only its own score (verl's would zero the whole batch on a time-out)."""
    manager = build_reward_manager("prime", compute_score=scorer, num_workers=2, timeout_s=2.0, failure_score=-1.0,
                                   reward_kwargs={"bonus": 0.25})
    try:
        result = _run(manager, ["a", "hang", "b", "die", "a"])
    finally:
        manager.close()
    assert result.scores == [1.25, -1.0, 0.25, -1.0, 1.25]
    assert result.num_failed == 2 and result.num_timed_out == 1


def test_mismatched_inputs_are_rejected(scorer):
    manager = build_reward_manager("naive", compute_score=scorer)
    with pytest.raises(ValueError, match="differ in length"):
        manager(["a", "b"], ["acme"], ["a", "b"], [None, None])


@pytest.mark.parametrize("kwargs, match", [({"timeout_s": 0}, "timeout_s"), ({"num_workers": 0}, "num_workers")])
def test_bad_pool_settings_are_config_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        build_reward_manager("parallel", **kwargs)
