import math

import pytest
import torch

from hybridflow.rollout import SamplingParams
from hybridflow.rollout.sampler import filter_top_k, filter_top_p, processed_logits, sample_tokens

NEG_INF = float("-inf")


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    assert filter_top_k(logits=logits, top_k=2).tolist() == [[NEG_INF, 4.0, 3.0, NEG_INF]]
    assert torch.equal(filter_top_k(logits=logits, top_k=-1), logits)
    assert torch.equal(filter_top_k(logits=logits, top_k=10), logits)


def test_top_p_keeps_smallest_set_reaching_p():
    probs = torch.tensor([[0.15, 0.5, 0.05, 0.3]])
    logits = probs.log()
    # descending: 0.5, 0.3 (mass before 0.5), 0.15 (before 0.8), 0.05 (before 0.95)
    kept_08 = filter_top_p(logits=logits, top_p=0.8).isfinite()
    assert kept_08.tolist() == [[False, True, False, True]]
    kept_081 = filter_top_p(logits=logits, top_p=0.81).isfinite()
    assert kept_081.tolist() == [[True, True, False, True]]
    assert filter_top_p(logits=logits, top_p=0.01).isfinite().tolist() == [[False, True, False, False]]


def test_processed_logits_is_temperature_then_filters():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    params = SamplingParams(temperature=0.5, top_k=3)
    expected = torch.tensor([[4.0, 2.0, 0.0, NEG_INF]])
    assert torch.equal(processed_logits(logits=logits, params=params), expected)


def test_sampled_logprob_is_log_of_processed_distribution():
    torch.manual_seed(0)
    logits = torch.randn(5, 11)
    params = SamplingParams(temperature=0.7, top_k=4)
    tokens, logprobs = sample_tokens(logits=logits, params=params, generator=torch.Generator().manual_seed(1))
    for row in range(5):
        z = logits[row] / 0.7
        kth = sorted(z.tolist(), reverse=True)[3]
        kept = [v for v in z.tolist() if v >= kth]
        token_logit = z[tokens[row]].item()
        assert token_logit >= kth  # never outside the top-k
        expected = token_logit - math.log(sum(math.exp(v) for v in kept))
        assert logprobs[row].item() == pytest.approx(expected, abs=1e-5)


def test_greedy_takes_argmax_with_unscaled_logprob():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, -1.0]])
    tokens, logprobs = sample_tokens(logits=logits, params=SamplingParams(temperature=0), generator=None)
    assert tokens.tolist() == [1, 0]
    lse0 = math.log(1 + math.exp(3) + math.exp(1))
    assert logprobs[0].item() == pytest.approx(3 - lse0, abs=1e-6)


def test_sampling_frequencies_follow_probabilities_and_skip_masked_tokens():
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    draws = 20000
    logits = probs.log()[None].expand(draws, -1)
    tokens, _ = sample_tokens(logits=logits, params=SamplingParams(temperature=1.0),
                              generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(tokens, minlength=4).float() / draws
    assert counts[1].item() == 0.0
    # 4 standard errors of a binomial proportion at p <= 0.6 and 20000 draws is < 0.015
    assert torch.allclose(counts, probs, atol=0.015)


def test_same_seed_same_tokens_other_seed_other_tokens():
    logits = torch.zeros(64, 50)
    params = SamplingParams(temperature=1.0)
    first, _ = sample_tokens(logits=logits, params=params, generator=torch.Generator().manual_seed(3))
    again, _ = sample_tokens(logits=logits, params=params, generator=torch.Generator().manual_seed(3))
    other, _ = sample_tokens(logits=logits, params=params, generator=torch.Generator().manual_seed(4))
    assert torch.equal(first, again) and not torch.equal(first, other)
