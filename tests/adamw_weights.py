"""Comparing weights that two runs reached through AdamW, when the runs sum the same gradients in another order.

AdamW moves each element by ``lr x m / (sqrt(v) + eps)``: about ``lr x sign(g)`` whatever the gradient's size, so
an element whose gradient is near zero (|g| ~ eps) carries its rounding up to ``lr / eps`` times further than SGD
would, as far as the whole step. Two correct runs therefore agree on nearly every element within rounding, and on
a few elements only within AdamW's step (measured, issue 48: summing four rows apart instead of at once, in ONE
process without sharding, moved one Mixtral expert element 2.2e-5 and one Llama element 6.4e-6 after two steps at
lr 1e-2; on an Intel Xeon the sequence-parallel critic had 1 of 8,192 elements 7.4e-5 apart). A broken run (a
wrong slice, a missing reduction) moves most elements by about the step instead.
"""

from __future__ import annotations

import torch

OUTLIER_FRACTION = 1e-3
"""At most this share of a tensor's elements may differ by more than ``atol`` (the largest seen: 1 of 8,192)."""
STEP_BOUND = 1.1
"""``|m_hat| / sqrt(v_hat)`` of AdamW (betas 0.9, 0.999) over the first few steps: exactly 1 at the first, at
most ~1.04 at the second (Cauchy-Schwarz over the two gradients' weights), with room for weight decay."""


def assert_adamw_weights_close(got: dict, expected: dict, *, atol: float, lr: float, steps: int) -> None:
    """Each tensor: all but ``OUTLIER_FRACTION`` of its elements within ``atol``, every element within the
    ``steps`` AdamW steps of ``lr`` two runs can disagree by (twice the updates' bound)."""
    assert set(got) == set(expected)
    for name, want in expected.items():
        have = torch.as_tensor(got[name])
        assert have.shape == want.shape, name
        gap = (have.double() - torch.as_tensor(want).double()).abs()
        off = int((gap > atol).sum())
        assert off <= OUTLIER_FRACTION * gap.numel(), f"{name}: {off} of {gap.numel()} elements beyond {atol} " \
                                                      f"(largest {gap.max().item():.3g})"
        assert gap.max().item() <= 2 * STEP_BOUND * lr * steps, f"{name}: {gap.max().item():.3g} apart, beyond AdamW's steps"
