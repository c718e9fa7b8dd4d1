"""Sampling parameters per row: hand-computed filters, and mixed requests in one batch."""

import math

import pytest
import torch

from hybridflow.errors import RolloutError
from hybridflow.rollout import SamplingParams, build_engine
from hybridflow.rollout.sampler import RowSampling, filter_min_p, processed_logits, sample_tokens
from tests.rollout.conftest import chat_prompts

NEG_INF = float("-inf")


def test_min_p_removes_tokens_below_a_fraction_of_the_most_likely():
    # probabilities 0.5, 0.3, 0.15, 0.05 (as logits log p): min_p 0.25 keeps p >= 0.125.
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = filter_min_p(logits=logits, min_p=torch.tensor([0.25])).isfinite()
    assert kept.tolist() == [[True, True, True, False]]
    assert filter_min_p(logits=logits, min_p=torch.tensor([0.0])).isfinite().all()


def test_each_row_gets_its_own_filters():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]] * 3)
    params = [SamplingParams(temperature=2.0), SamplingParams(top_k=2), SamplingParams(top_p=0.5, min_p=0.1)]
    out = processed_logits(logits=logits, params=RowSampling.of(params, vocab_size=4, device="cpu"))
    assert out[0].tolist() == [0.5, 2.0, 1.5, 1.0]  # T = 2 only
    assert out[1].tolist() == [NEG_INF, 4.0, 3.0, NEG_INF]  # top-2
    # row 2: softmax(1, 4, 3, 2) = (0.032, 0.644, 0.237, 0.087); the mass before token 1 is 0 < 0.5,
    # before token 2 it is 0.644 >= 0.5: top-p keeps token 1 alone.
    assert out[2].isfinite().tolist() == [False, True, False, False]


def test_a_mixed_batch_samples_each_row_as_if_alone():
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.7, top_k=5),
              SamplingParams(temperature=1.3, top_p=0.8), SamplingParams(temperature=1.0, min_p=0.05)]
    uniform = torch.rand(4, 1)
    tokens, logprobs = sample_tokens(logits=logits, params=RowSampling.of(params, vocab_size=50, device="cpu"),
                                     uniform=uniform)
    for row, p in enumerate(params):
        alone = sample_tokens(logits=logits[row : row + 1], params=p, uniform=uniform[row : row + 1])
        assert tokens[row].item() == alone[0].item()
        assert math.isclose(logprobs[row].item(), alone[1].item(), abs_tol=1e-6)


def test_a_rows_draw_is_bitwise_the_same_whatever_filters_its_batch_mates_ask_for():
    """Rows without filters (plain sampling, greedy) next to a top-p row get the bits they get among their kind alone
    (the one-pass kernel where it applies), not the torch ops' rounding, which a batch mate's filter would impose
    on the whole batch: what keyed draws and overlapped steps (a finished row decoded once more) rely on."""
    torch.manual_seed(0)
    logits = torch.randn(6, 5000)
    plain, greedy, top_p = SamplingParams(temperature=1.0), SamplingParams(temperature=0), SamplingParams(top_p=0.9)
    uniform = torch.rand(6, 1)
    kinds = [plain, greedy, top_p, plain, top_p, greedy]
    mixed = sample_tokens(logits=logits, params=RowSampling.of(kinds, vocab_size=5000, device="cpu"), uniform=uniform)
    unfiltered = [0, 1, 3, 5]
    alone = sample_tokens(logits=logits[unfiltered], uniform=uniform[unfiltered],
                          params=RowSampling.of([kinds[i] for i in unfiltered], vocab_size=5000, device="cpu"))
    assert torch.equal(mixed[0][unfiltered], alone[0]) and torch.equal(mixed[1][unfiltered], alone[1])


def test_engine_takes_one_sampling_params_per_prompt(tiny_llama):
    model, tokenizer = tiny_llama
    prompts = chat_prompts(tokenizer)[:3]
    eos = tokenizer.eos_token_id
    greedy = SamplingParams(n=2, temperature=0, max_tokens=12, stop_token_ids=[eos])
    long_sampled = SamplingParams(n=1, temperature=1.0, top_k=7, max_tokens=20, stop_token_ids=[eos], ignore_eos=True,
                                  seed=3)
    short_greedy = SamplingParams(n=1, temperature=0, max_tokens=5, stop_token_ids=[eos])
    engine = build_engine("native", model, tokenizer)
    mixed = engine.generate(prompts, [greedy, long_sampled, short_greedy])
    assert [c.prompt_index for c in mixed] == [0, 0, 1, 2]
    alone_greedy = engine.generate(prompts[:1], greedy)
    assert [c.token_ids for c in mixed[:2]] == [c.token_ids for c in alone_greedy]
    assert len(mixed[2].token_ids) == 20 and mixed[2].finish_reason == "length"  # ignore_eos: all 20
    alone_short = engine.generate(prompts[2:], short_greedy)[0]
    assert mixed[3].token_ids == alone_short.token_ids


def test_params_list_must_match_the_prompts(tiny_llama):
    model, tokenizer = tiny_llama
    with pytest.raises(RolloutError, match="one per prompt"):
        build_engine("native", model, tokenizer).generate(chat_prompts(tokenizer)[:2], [SamplingParams()])


def test_min_p_out_of_range_is_refused():
    with pytest.raises(RolloutError, match="min_p"):
        SamplingParams(min_p=1.5)
