"""The chunked log-prob / entropy from hidden states (hybridflow/algos/linear_logprob.py) against the
unchunked path (full logits -> hybridflow.algos.logprobs_from_logits / entropy_from_logits): values
and gradients for chunk sizes that divide the token count, do not, are 1, and exceed it."""

import math

import pytest
import torch

from hybridflow.algos import entropy_from_logits, logprobs_from_logits
from hybridflow.algos.linear_logprob import linear_log_probs
from hybridflow.algos.logprob import sum_pi_squared_from_logits

TOKENS, HIDDEN, VOCAB, TEMPERATURE = 10, 6, 11, 0.7


def test_hand_computed_two_token_vocabulary():
    # z = W h / tau = [0, ln 3]  ->  p = [1/4, 3/4]; log p(1) = ln 3/4; H = -(1/4 ln 1/4 + 3/4 ln 3/4);
    # sum p^2 = 1/16 + 9/16 (the softmax and the Shannon entropy of Schulman et al. 2017's entropy bonus).
    hidden = torch.tensor([[1.0, 0.0]])
    weight = torch.tensor([[0.0, 5.0], [2 * math.log(3), 7.0]])
    log_p, entropy, sum_sq = linear_log_probs(hidden=hidden, weight=weight, labels=torch.tensor([1]),
                                              temperature=2.0, calculate_entropy=True,
                                              calculate_sum_pi_squared=True)
    assert log_p.item() == pytest.approx(math.log(0.75), abs=1e-6)
    assert entropy.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)
    assert sum_sq.item() == pytest.approx(10 / 16, abs=1e-6)


def inputs(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    # fp64, so that the two paths agree to rounding far below any chunking mistake
    hidden = (torch.randn(2, TOKENS // 2, HIDDEN, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    weight = torch.randn(VOCAB, HIDDEN, generator=gen, dtype=torch.float64).requires_grad_()
    labels = torch.randint(0, VOCAB, (2, TOKENS // 2), generator=gen)
    loss_weights = torch.randn(2, 2, TOKENS // 2, generator=gen)  # a loss that weighs each output and token
    return hidden, weight, labels, loss_weights


def unchunked(hidden, weight, labels):
    """The whole ``[N, V]`` logits through torch's log_softmax in the inputs' dtype (fp64 here: the
    project's unchunked path, hybridflow.algos.logprobs_from_logits, rounds to fp32; compared below)."""
    log_softmax = (hidden @ weight.T / TEMPERATURE).log_softmax(-1)
    p = log_softmax.exp()
    return log_softmax.gather(-1, labels[..., None]).squeeze(-1), -(p * log_softmax).sum(-1), p.detach().square().sum(-1)


def test_the_fp64_reference_is_the_projects_unchunked_path():
    hidden, weight, labels, _ = inputs()
    logits = hidden.detach() @ weight.detach().T / TEMPERATURE
    projects = (logprobs_from_logits(logits=logits, labels=labels), entropy_from_logits(logits=logits),
                sum_pi_squared_from_logits(logits=logits))
    for value, reference in zip(projects, unchunked(hidden.detach(), weight.detach(), labels)):
        torch.testing.assert_close(value, reference.float(), rtol=0, atol=2e-5)


@pytest.mark.parametrize("chunk_tokens", [1, 3, 4, 5, 10, 64])
def test_values_and_gradients_equal_the_unchunked_path(chunk_tokens):
    hidden, weight, labels, loss_weights = inputs()
    expected = unchunked(hidden, weight, labels)
    (loss_weights[0] * expected[0] + loss_weights[1] * expected[1]).sum().backward()
    expected_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    got = linear_log_probs(hidden=hidden, weight=weight, labels=labels, temperature=TEMPERATURE,
                           calculate_entropy=True, calculate_sum_pi_squared=True, chunk_tokens=chunk_tokens)
    for value, reference in zip(got, expected):
        torch.testing.assert_close(value, reference, rtol=0, atol=1e-10)
    (loss_weights[0] * got[0] + loss_weights[1] * got[1]).sum().backward()
    torch.testing.assert_close(hidden.grad, expected_grads[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(weight.grad, expected_grads[1], rtol=0, atol=1e-10)


@pytest.mark.parametrize("chunk_tokens", [3, 10])
def test_log_prob_alone_has_the_log_prob_gradient(chunk_tokens):
    hidden, weight, labels, loss_weights = inputs(seed=1)
    (loss_weights[0] * unchunked(hidden, weight, labels)[0]).sum().backward()
    expected = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    log_p, entropy, sum_sq = linear_log_probs(hidden=hidden, weight=weight, labels=labels, temperature=TEMPERATURE,
                                              chunk_tokens=chunk_tokens)
    assert entropy is None and sum_sq is None
    (loss_weights[0] * log_p).sum().backward()
    torch.testing.assert_close((hidden.grad, weight.grad), expected, rtol=0, atol=1e-10)


def test_bf16_autocast_runs_the_matmuls_in_bf16_and_keeps_fp32_outputs():
    hidden, weight, labels, _ = inputs(seed=2)
    hidden, weight = (t.detach().float().requires_grad_() for t in (hidden, weight))
    expected = unchunked(hidden, weight, labels)[0]
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        log_p, _, _ = linear_log_probs(hidden=hidden, weight=weight, labels=labels, temperature=TEMPERATURE,
                                       chunk_tokens=3)
    log_p.sum().backward()
    assert log_p.dtype == torch.float32 and weight.grad.dtype == torch.float32
    assert not torch.equal(log_p, expected)  # bf16 rounding happened ...
    torch.testing.assert_close(log_p, expected, rtol=0, atol=0.1)  # ... and only rounding


def test_chunk_size_must_be_positive():
    hidden, weight, labels, _ = inputs()
    with pytest.raises(ValueError, match="chunk_tokens must be positive"):
        linear_log_probs(hidden=hidden, weight=weight, labels=labels, chunk_tokens=0)
