"""Decode lanes: slices of a decode step run concurrently and give the same results as one batch."""

import threading

import pytest
import torch

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.lanes import MIN_ROWS_PER_LANE, DecodeLanes
from hybridflow.rollout.native import NativeEngine
from tests.rollout.conftest import chat_prompts


def test_slices_cover_the_rows_in_order():
    lanes = DecodeLanes(threads=2)
    assert lanes.run(lambda start, stop: (start, stop), 2 * MIN_ROWS_PER_LANE + 7) == [(0, 19), (19, 39)]
    assert lanes.run(lambda start, stop: (start, stop), 5) == [(0, 5)]  # too few rows for two lanes


def test_lanes_for_needs_min_rows_per_lane_and_at_most_one_lane_per_thread():
    assert DecodeLanes(threads=2).lanes_for(2 * MIN_ROWS_PER_LANE - 1) == 1
    assert DecodeLanes(threads=2).lanes_for(2 * MIN_ROWS_PER_LANE) == 2
    assert DecodeLanes(threads=2).lanes_for(100 * MIN_ROWS_PER_LANE) == 2
    assert DecodeLanes(threads=4).lanes_for(3 * MIN_ROWS_PER_LANE) == 3


def test_each_lane_runs_on_its_own_thread_with_its_share_of_threads():
    outer = torch.get_num_threads()
    lanes = DecodeLanes(threads=2)
    seen = lanes.run(lambda start, stop: (threading.get_ident(), torch.get_num_threads()), 64)
    assert seen[0][0] != seen[1][0]
    assert [threads for _, threads in seen] == [1, 1]
    assert torch.get_num_threads() == outer


def test_a_failing_lane_raises_after_every_lane_has_finished():
    finished = []

    def work(start, stop):
        if start == 0:
            raise ValueError("lane 0 failed")
        finished.append((start, stop))
        return start

    with pytest.raises(ValueError, match="lane 0 failed"):
        DecodeLanes(threads=2).run(work, 64)
    assert finished == [(32, 64)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_with_lanes_equals_engine_without(tiny_llama, temperature):
    """Both lanes read the same uniform draws as the whole batch would: same tokens, same log-probs."""
    model, tokenizer = tiny_llama
    prompts = chat_prompts(tokenizer)
    params = SamplingParams(n=12, temperature=temperature, max_tokens=12, seed=3)  # 48 live rows: two lanes
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with_lanes = NativeEngine(model, tokenizer, decode_lanes=True)
        assert with_lanes.lanes is not None
        laned = with_lanes.generate(prompts, params)
        single = NativeEngine(model, tokenizer, decode_lanes=False).generate(prompts, params)
    finally:
        torch.set_num_threads(threads)
    assert [c.token_ids for c in laned] == [c.token_ids for c in single]
    for a, b in zip(laned, single):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
