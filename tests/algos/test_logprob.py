import math

import pytest
import torch

from hybridflow.algos import entropy_from_logits, logprobs_from_logits


def test_logprob_and_entropy_by_hand():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # probs 1/4, 3/4
    assert logprobs_from_logits(logits=logits, labels=torch.tensor([1])).item() == pytest.approx(math.log(0.75))
    assert entropy_from_logits(logits=logits).item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))


@pytest.mark.parametrize("chunk_size", [1, 3, 1024])
def test_chunking_does_not_change_values_or_gradients(chunk_size):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=gen).requires_grad_(True)
    labels = torch.randint(0, 11, (2, 5), generator=gen)
    logp = logprobs_from_logits(logits=logits, labels=labels, chunk_size=chunk_size)
    entropy = entropy_from_logits(logits=logits, chunk_size=chunk_size)
    reference_logp = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    probs = torch.softmax(logits, -1)
    reference_entropy = -(probs * torch.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(logp, reference_logp)
    torch.testing.assert_close(entropy, reference_entropy)
    grads = torch.autograd.grad(logp.sum() + entropy.sum(), logits)[0]
    reference_grads = torch.autograd.grad(reference_logp.sum() + reference_entropy.sum(), logits)[0]
    torch.testing.assert_close(grads, reference_grads)


def test_huge_logits_stay_finite_and_bf16_input_gives_fp32():
    logits = torch.tensor([[1e4, -1e4, 0.0]], dtype=torch.bfloat16)
    logp = logprobs_from_logits(logits=logits, labels=torch.tensor([1]))
    entropy = entropy_from_logits(logits=logits)
    assert logp.dtype == torch.float32 and entropy.dtype == torch.float32
    assert logp.item() == pytest.approx(-2e4, rel=1e-2)
    assert entropy.item() == pytest.approx(0.0, abs=1e-6)


def _bytes_saved_for_backward(fn, logits):
    """Bytes autograd keeps for backward, not counting the logits' own storage."""
    total = 0

    def pack(tensor):
        nonlocal total
        if tensor.untyped_storage().data_ptr() != logits.untyped_storage().data_ptr():
            total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        fn(logits)
    return total


def test_grad_path_keeps_no_fp32_copy_of_the_logits():
    logits = torch.randn(2, 16, 512, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 512, (2, 16))
    fp32_copy = logits.numel() * 4
    naive = _bytes_saved_for_backward(lambda z: torch.log_softmax(z.float(), -1), logits)
    assert naive >= fp32_copy  # the cost being avoided
    assert _bytes_saved_for_backward(lambda z: entropy_from_logits(logits=z, chunk_size=8), logits) < fp32_copy / 100
    assert _bytes_saved_for_backward(
        lambda z: logprobs_from_logits(logits=z, labels=labels, chunk_size=8), logits
    ) < fp32_copy / 100


def test_fused_logprob_and_entropy_gradient_by_hand():
    """probs (1/4, 3/4), label 1, loss = 2 log p_1 + 3 H: dlogp/dz = onehot - p, dH/dz_j = -p_j (log p_j + H)."""
    from hybridflow.algos import logprob_and_entropy

    logits = torch.tensor([[0.0, math.log(3.0)]], requires_grad=True)
    logp, entropy = logprob_and_entropy(logits=logits, labels=torch.tensor([1]), calculate_entropy=True)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert logp.item() == pytest.approx(math.log(0.75)) and entropy.item() == pytest.approx(h)
    (2 * logp + 3 * entropy).sum().backward()
    expected = [2 * (0 - 0.25) - 3 * 0.25 * (math.log(0.25) + h), 2 * (1 - 0.75) - 3 * 0.75 * (math.log(0.75) + h)]
    assert logits.grad[0].tolist() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_size,with_entropy", [(1, True), (4, True), (1024, True), (4, False)])
def test_fused_logprob_and_entropy_equal_the_separate_functions(dtype, chunk_size, with_entropy):
    """The same values bit for bit as the two chunked functions; gradients equal within the logits' rounding (the
    reference differentiates log_softmax in fp64), for either output alone and both together."""
    from hybridflow.algos import logprob_and_entropy

    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(3, 5, 37, generator=gen)).to(dtype).requires_grad_(True)
    labels = torch.randint(0, 37, (3, 5), generator=gen)
    weights = torch.randn(2, 3, 5, generator=gen)
    logp, entropy = logprob_and_entropy(logits=logits, labels=labels, calculate_entropy=with_entropy,
                                        chunk_size=chunk_size)
    assert logp.dtype == torch.float32 and torch.equal(logp, logprobs_from_logits(logits=logits, labels=labels))
    assert (entropy is None) != with_entropy
    if with_entropy:
        assert torch.equal(entropy, entropy_from_logits(logits=logits))
    wide = logits.detach().double().requires_grad_(True)
    log_softmax = torch.log_softmax(wide, -1)
    ref_logp, ref_entropy = log_softmax.gather(-1, labels[..., None]).squeeze(-1), -(log_softmax.exp() * log_softmax).sum(-1)
    outputs = [(logp, ref_logp)] + ([(entropy, ref_entropy)] if with_entropy else [])
    for used in ([0], [1], [0, 1]) if with_entropy else ([0],):
        loss = sum((outputs[i][0] * weights[i]).sum() for i in used)
        ref_loss = sum((outputs[i][1] * weights[i].double()).sum() for i in used)
        grad = torch.autograd.grad(loss, logits, retain_graph=True)[0]
        ref_grad = torch.autograd.grad(ref_loss, wide, retain_graph=True)[0]
        assert grad.dtype == dtype
        tolerance = 1e-5 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(grad.double(), ref_grad.to(dtype).double(), atol=tolerance, rtol=tolerance)


def test_the_fused_default_chunking_gives_the_bits_of_one_chunk():
    """The default rows per chunk (a cache-sized chunk, issue 62) against all rows in one chunk, on more rows than a
    chunk and a ragged last one: log-probs, entropies and the logits' gradient equal bit for bit."""
    from hybridflow.algos import logprob_and_entropy
    from hybridflow.algos.logprob import FUSED_CHUNK_ROWS

    rows = 2 * FUSED_CHUNK_ROWS + 5
    gen = torch.Generator().manual_seed(3)
    logits = (4 * torch.randn(rows, 97, generator=gen)).to(torch.bfloat16)
    labels = torch.randint(0, 97, (rows,), generator=gen)
    upstream = torch.randn(2, rows, generator=gen)
    results = []
    for chunk_size in (FUSED_CHUNK_ROWS, rows):
        leaf = logits.clone().requires_grad_(True)
        kwargs = {} if chunk_size == FUSED_CHUNK_ROWS else {"chunk_size": chunk_size}
        logp, entropy = logprob_and_entropy(logits=leaf, labels=labels, calculate_entropy=True, **kwargs)
        torch.autograd.backward([logp, entropy], list(upstream))
        results.append((logp, entropy, leaf.grad))
    assert all(torch.equal(a, b) for a, b in zip(*results))


def test_an_entropy_only_logged_costs_its_backward_nothing():
    """With the entropy computed but not in the loss (entropy_coeff 0: logged only), the backward runs the ops of a
    log-prob-only call, not three more passes over each chunk's logits with a zero gradient (issue 62); the same
    gradient."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from hybridflow.algos import logprob_and_entropy

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    gen = torch.Generator().manual_seed(4)
    logits = (3 * torch.randn(6, 41, generator=gen)).to(torch.bfloat16)
    labels = torch.randint(0, 41, (6,), generator=gen)
    upstream = torch.randn(6, generator=gen)
    runs = []
    for with_entropy in (False, True):
        leaf = logits.clone().requires_grad_(True)
        logp, _ = logprob_and_entropy(logits=leaf, labels=labels, calculate_entropy=with_entropy, chunk_size=4)
        with Ops() as ops:
            logp.backward(upstream)
        runs.append((ops.names, leaf.grad))
    assert runs[1][0] == runs[0][0]
    assert torch.equal(runs[1][1], runs[0][1])
