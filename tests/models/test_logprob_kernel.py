"""The C log-prob / entropy head (hybridflow/models/logprob_kernel.py, issue 62) against fp64 references, the torch
path it replaces, itself at other thread counts, and its fallback."""

import math
import os

import pytest
import torch

from hybridflow.algos import logprob_and_entropy as torch_head
from hybridflow.cpu import c_compiler, cpu_flags
from hybridflow.models import logprob_kernel
from hybridflow.models.logprob_kernel import kernel_logprob_and_entropy

needs_kernel = pytest.mark.skipif(logprob_kernel.unavailable_reason() is not None,
                                  reason=str(logprob_kernel.unavailable_reason()))
DTYPES = [torch.float32, torch.bfloat16]


def _reference(logits: torch.Tensor, labels: torch.Tensor, g_lp: torch.Tensor, g_h: torch.Tensor | None):
    """fp64 log p(label), entropy and d(sum g_lp log p + g_h H)/dz in closed form; a masked (-inf) logit has
    p = 0 and adds nothing (0 log 0 = 0)."""
    z = logits.double()
    log_p = torch.log_softmax(z, -1)
    p = log_p.exp()
    p_log_p = torch.where(p > 0, p * log_p, torch.zeros_like(p))
    entropy = -p_log_p.sum(-1)
    grad = -g_lp.double()[:, None] * p
    grad.scatter_add_(-1, labels[:, None], g_lp.double()[:, None])
    if g_h is not None:
        grad -= g_h.double()[:, None] * (p_log_p + p * entropy[:, None])
    return log_p.gather(-1, labels[:, None]).squeeze(-1), entropy, grad


def _kernel(logits, labels, g_lp, g_h, *, threads=None):
    """(log p, entropy, gradient) from the kernel for upstream gradients g_lp, g_h (None: entropy not in the loss)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        leaf = logits.clone().requires_grad_(True)
        log_p, entropy = kernel_logprob_and_entropy(logits=leaf, labels=labels, calculate_entropy=True)
        loss = (log_p * g_lp).sum() + ((entropy * g_h).sum() if g_h is not None else 0)
        loss.backward()
        return log_p.detach(), entropy.detach(), leaf.grad
    finally:
        torch.set_num_threads(before)


def _case(rows: int, vocab: int, dtype: torch.dtype, *, scale: float = 3.0, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = (scale * torch.randn(rows, vocab, generator=gen)).to(dtype)
    labels = torch.randint(0, vocab, (rows,), generator=gen)
    labels[0], labels[-1] = 0, vocab - 1  # both ends of a row
    return logits, labels, torch.randn(rows, generator=gen), torch.randn(rows, generator=gen)


def _gradient_bound(logits, labels, g_lp, g_h) -> torch.Tensor:
    """Per element, what fp32 rounding allows: p_j = e^(z_j - lse) carries its exp's few ulp and the rounding of
    z_j - lse (eps (|lse| + |log p_j|), relative), the entropy term's (log p_j + H) that absolute error and H's
    bound, and [j = y] - p_j one rounding of g_lp."""
    eps = torch.finfo(torch.float32).eps
    log_p = torch.log_softmax(logits.double(), -1)
    p = log_p.exp()
    finite = torch.where(p > 0, log_p, torch.zeros_like(log_p)).abs()
    lse = torch.logsumexp(logits.double(), -1, keepdim=True).abs()
    entropy = -torch.where(p > 0, p * log_p, torch.zeros_like(p)).sum(-1, keepdim=True)
    g_h = torch.zeros_like(g_lp) if g_h is None else g_h
    a, b = g_lp.double().abs()[:, None], g_h.double().abs()[:, None]
    magnitude = p * (a + b * (finite + entropy))
    onehot = torch.zeros_like(p).scatter_(-1, labels[:, None], 1.0)
    return ((8 * eps + 2 * eps * (lse + finite)) * magnitude + 4e-6 * (1 + entropy) * p * b
            + 2 * eps * a * onehot + 1e-30)


def _assert_within_bounds(logits, labels, g_lp, g_h, got):
    """The bounds of logprob_kernel's docstring: log p within 1e-6 (1 + |lse|), H within 2e-6 (1 + H), the gradient
    within :func:`_gradient_bound` plus, in bf16, one rounding (2^-8 relative)."""
    log_p, entropy, grad = got
    ref_log_p, ref_entropy, ref_grad = _reference(logits, labels, g_lp, g_h)
    lse = torch.logsumexp(logits.double(), -1)
    assert ((log_p.double() - ref_log_p).abs() <= 1e-6 * (1 + lse.abs())).all()
    assert ((entropy.double() - ref_entropy).abs() <= 2e-6 * (1 + ref_entropy.abs())).all()
    rounding = 2.0 ** -8 if logits.dtype == torch.bfloat16 else 0.0
    assert grad.dtype == logits.dtype
    bound = _gradient_bound(logits, labels, g_lp, g_h) + rounding * ref_grad.abs()
    assert ((grad.double() - ref_grad).abs() <= bound).all()


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,vocab,scale", [(1, 1, 3.0), (1, 37, 3.0), (5, 17, 3.0), (3, 16, 3.0), (4, 1000, 3.0),
                                              (2, 49152, 3.0), (16, 1000, 30.0), (8, 5000, 0.01)])
@pytest.mark.parametrize("entropy_in_loss", [True, False])
def test_the_kernel_matches_an_fp64_reference(dtype, rows, vocab, scale, entropy_in_loss):
    """V not a multiple of the 16 lanes (1, 17, 37, 1000), a multiple (16, 49152), one row, labels 0 and V - 1;
    logits of std 3 (a trained model's), 30 (peaked rows: large |log p| to round) and 0.01 (nearly uniform)."""
    logits, labels, g_lp, g_h = _case(rows, vocab, dtype, scale=scale)
    g_h = g_h if entropy_in_loss else None
    _assert_within_bounds(logits, labels, g_lp, g_h, _kernel(logits, labels, g_lp, g_h))


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_extreme_logits_stay_exact(dtype):
    """Huge and tiny logits, a row of equal logits, rows whose scale is 1e4 (fp32 lse ~1e4: only its rounding)."""
    logits, labels, g_lp, g_h = _case(6, 203, dtype, scale=30.0, seed=1)
    logits[0] *= 300  # ~1e4: every probability but the top's underflows
    logits[1] = 7.0  # uniform: H = log V, log p = -log V
    logits[2] = logits[2] * 1e-3  # nearly uniform
    logits[3, 100] = 3e4  # one dominant entry
    logits[4] -= 2e4  # all far below zero
    _assert_within_bounds(logits, labels, g_lp, g_h, _kernel(logits, labels, g_lp, g_h))
    log_p, entropy, _ = _kernel(logits, labels, g_lp, g_h)
    assert log_p[1].item() == pytest.approx(-math.log(203), abs=1e-6)
    assert entropy[1].item() == pytest.approx(math.log(203), abs=2e-6)


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("masked", [float("-inf"), "lowest", -1e4])
def test_masked_logits_add_nothing(dtype, masked):
    """Masking values (-inf, the dtype's lowest, -1e4) leave the unmasked entries' distribution: log p, H and
    their gradients equal those of the unmasked entries alone, and the masked entries' gradient is 0 (torch's
    path gives a NaN entropy for -inf, 0 * -inf)."""
    logits, labels, g_lp, g_h = _case(4, 300, dtype, seed=2)
    labels = labels % 100
    value = torch.finfo(dtype).min if masked == "lowest" else masked
    masked_logits = logits.clone()
    masked_logits[:, 100:] = value
    log_p, entropy, grad = _kernel(masked_logits, labels, g_lp, g_h)
    assert torch.isfinite(entropy).all() and (grad[:, 100:] == 0).all()
    _assert_within_bounds(logits[:, :100], labels, g_lp, g_h, (log_p, entropy, grad[:, :100]))


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [37, 4099])
def test_the_kernel_matches_the_torch_path(dtype, vocab):
    """The kernel against hybridflow.algos.logprob_and_entropy (the path it replaces) on the same inputs: values
    within the fp32 bounds; bf16 gradients equal but for elements one bf16 step apart (the two fp32 values straddle
    a rounding boundary). Each bound also admits the torch path's own error against fp64, which depends on the CPU:
    ATen's AVX2 exp / log build is the less exact (entropy 7.9e-6 off at H ~ 5 against the kernel's 3.4e-7)."""
    logits, labels, g_lp, g_h = _case(40, vocab, dtype, seed=3)
    got = _kernel(logits, labels, g_lp, g_h)
    leaf = logits.clone().requires_grad_(True)
    log_p, entropy = torch_head(logits=leaf, labels=labels, calculate_entropy=True)
    ((log_p * g_lp).sum() + (entropy * g_h).sum()).backward()
    log_p, entropy = log_p.detach(), entropy.detach()
    own = [(mine.double() - ref).abs() for mine, ref in zip((log_p, entropy, leaf.grad),
                                                            _reference(logits, labels, g_lp, g_h))]
    assert ((got[0] - log_p).abs() <= 2e-6 * (1 + log_p.abs()) + own[0]).all()
    assert ((got[1] - entropy).abs() <= 4e-6 * (1 + entropy.abs()) + own[1]).all()
    difference = (got[2].double() - leaf.grad.double()).abs()
    if dtype == torch.bfloat16:
        step = 2.0 ** -7 * leaf.grad.double().abs()
        assert (difference <= step + own[2]).all() and (difference > 0).double().mean() < 0.01
    else:
        assert (difference <= 4e-6 * leaf.grad.abs().amax(-1, keepdim=True) + own[2]).all()


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_results_do_not_depend_on_the_thread_count(dtype):
    logits, labels, g_lp, g_h = _case(33, 517, dtype, seed=4)
    runs = [_kernel(logits, labels, g_lp, g_h, threads=threads) for threads in (1, 2, 3)]
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], run))


@needs_kernel
def test_an_entropy_only_logged_gets_the_log_prob_only_gradient():
    """Entropy computed but not in the loss: the backward gets no entropy gradient (None) and gives the gradient of
    the log-probs alone, bit for bit; nothing asked of either output: no gradient."""
    logits, labels, g_lp, _ = _case(6, 41, torch.bfloat16, seed=5)
    grads = []
    for calculate_entropy in (True, False):
        leaf = logits.clone().requires_grad_(True)
        log_p, entropy = kernel_logprob_and_entropy(logits=leaf, labels=labels, calculate_entropy=calculate_entropy)
        assert (entropy is None) != calculate_entropy
        (log_p * g_lp).sum().backward()
        grads.append(leaf.grad)
    assert torch.equal(*grads)
    leaf = logits.clone().requires_grad_(True)
    _, entropy = kernel_logprob_and_entropy(logits=leaf, labels=labels, calculate_entropy=True)
    entropy.sum().backward()
    assert torch.isfinite(leaf.grad).all() and leaf.grad.abs().sum() > 0


@needs_kernel
def test_a_label_outside_the_vocabulary_is_refused():
    with pytest.raises(ValueError, match="label"):
        kernel_logprob_and_entropy(logits=torch.zeros(2, 5), labels=torch.tensor([0, 5]), calculate_entropy=False)


@needs_kernel
def test_bf16_cpu_logits_take_the_kernel_and_fp32_keeps_the_torch_path():
    """The dispatch of logprob_kernel.logprob_and_entropy: bf16 logits the kernel's bits, fp32 the torch path's
    (the fp32 behaviour pins' bits), non-contiguous views the bits of their contiguous copies."""
    for dtype, expected_path in ((torch.bfloat16, kernel_logprob_and_entropy), (torch.float32, torch_head)):
        logits, labels, _, _ = _case(5, 64, dtype, seed=6)
        got = logprob_kernel.logprob_and_entropy(logits=logits, labels=labels, calculate_entropy=True)
        want = expected_path(logits=logits, labels=labels, calculate_entropy=True)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    wide, labels, g_lp, g_h = _case(5, 128, torch.bfloat16, seed=7)
    for view in (wide[:, ::2], wide[:, 32:96]):  # copied (stride 2 along V); read in place (rows 128 apart)
        runs = []
        for logits in (view, view.contiguous()):
            leaf = logits.detach().requires_grad_(True)
            log_p, entropy = logprob_kernel.logprob_and_entropy(logits=leaf, labels=labels % 64, calculate_entropy=True)
            ((log_p * g_lp).sum() + (entropy * g_h).sum()).backward()
            runs.append((log_p, entropy, leaf.grad))
        assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_forced_fallback_runs_the_torch_path(monkeypatch):
    """HYBRIDFLOW_CPU_KERNELS=torch: no kernel, bf16 logits get the torch path's bits (the test runs on every
    machine: also where no compiler builds the kernel)."""
    monkeypatch.setenv(logprob_kernel.FORCE_FALLBACK, "torch")
    logprob_kernel.library.cache_clear()
    logprob_kernel.unavailable_reason.cache_clear()
    try:
        assert logprob_kernel.unavailable_reason() is not None
        logits, labels, g_lp, _ = _case(5, 64, torch.bfloat16, seed=8)
        grads = []
        for head in (logprob_kernel.logprob_and_entropy, torch_head):
            leaf = logits.clone().requires_grad_(True)
            log_p, _ = head(logits=leaf, labels=labels, calculate_entropy=True)
            (log_p * g_lp).sum().backward()
            grads.append((log_p, leaf.grad))
        assert all(torch.equal(a, b) for a, b in zip(*grads))
    finally:
        monkeypatch.delenv(logprob_kernel.FORCE_FALLBACK)
        logprob_kernel.library.cache_clear()
        logprob_kernel.unavailable_reason.cache_clear()


@needs_kernel
@pytest.mark.parametrize("march", ["haswell", "x86-64"])
def test_the_builds_for_avx2_and_plain_x86_64_are_right_too(march, monkeypatch, tmp_path):
    """What an AVX2-only machine builds (haswell: the 16-float vectors as two ymm) and a plain x86-64 one (SSE2),
    run here, against the fp64 reference: the one source must be right for every instruction set gcc targets."""
    if march == "haswell" and not {"avx2", "fma", "bmi2"} <= set(cpu_flags()):
        pytest.skip("this CPU cannot run code built for haswell")
    monkeypatch.setenv("HYBRIDFLOW_KERNEL_MARCH", march)
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path))
    logprob_kernel.library.cache_clear()
    logprob_kernel.unavailable_reason.cache_clear()
    try:
        assert logprob_kernel.unavailable_reason() is None and list(tmp_path.glob("kernels/*.so"))
        for dtype in DTYPES:
            logits, labels, g_lp, g_h = _case(3, 1000, dtype, seed=9)
            logits[1, 500:] = float("-inf")
            _assert_within_bounds(logits, labels % 500, g_lp, g_h, _kernel(logits, labels % 500, g_lp, g_h))
    finally:
        monkeypatch.undo()
        logprob_kernel.library.cache_clear()
        logprob_kernel.unavailable_reason.cache_clear()


def test_the_kernel_builds_and_passes_its_probe_where_a_compiler_is():
    """A kernel that builds but computes wrong values must fail here, not skip the tests above."""
    if c_compiler() is None or os.environ.get(logprob_kernel.FORCE_FALLBACK, "").lower() == "torch":
        pytest.skip("no C compiler, or the torch path forced")
    assert logprob_kernel.unavailable_reason() is None


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_nan_logit_gives_nans_in_its_row_only(dtype):
    """As the torch path: a NaN logit makes its row's log p, entropy and gradient NaN; the other rows keep their
    values."""
    logits, labels, g_lp, g_h = _case(3, 50, dtype, seed=10)
    clean = _kernel(logits, labels, g_lp, g_h)
    logits[1, 7] = float("nan")
    log_p, entropy, grad = _kernel(logits, labels, g_lp, g_h)
    assert log_p[1].isnan() and entropy[1].isnan() and grad[1].isnan().all()
    for row in (0, 2):
        assert log_p[row] == clean[0][row] and entropy[row] == clean[1][row] and torch.equal(grad[row], clean[2][row])
