"""LR schedules (hand-computed), the NaN guard, and micro-batch splitting."""

import logging
import math

import pytest
import torch

from hybridflow.workers.micro_batches import split_by_token_budget
from hybridflow.workers.optim import TrainState, build_optimizer, build_scheduler, lr_multiplier, resolve_warmup_steps


def test_warmup_then_constant():
    # verl 0.9.1's get_constant_schedule_with_warmup: s / W, so the first step runs at lr 0
    assert [lr_multiplier(s, warmup_steps=4, total_steps=10, style="constant") for s in range(6)] == [
        0.0, 0.25, 0.5, 0.75, 1.0, 1.0]


def test_cosine_warmup_and_zero_indexed_step():
    # verl's get_cosine_schedule_with_warmup: the same s / W ramp; zero_indexed_step=False shifts s by one
    assert [lr_multiplier(s, warmup_steps=4, total_steps=8, style="cosine") for s in range(3)] == [0.0, 0.25, 0.5]
    assert [lr_multiplier(s, warmup_steps=4, total_steps=8, style="cosine", zero_indexed_step=False)
            for s in range(3)] == [0.25, 0.5, 0.75]
    # s = 6: p = (6 - 4) / 4 = 0.5 -> 0.5 (1 + cos(pi / 2)) = 0.5; from 1, p = (7 - 4) / 4 -> 0.5 (1 + cos(3 pi / 4))
    assert lr_multiplier(6, warmup_steps=4, total_steps=8, style="cosine") == pytest.approx(0.5)
    assert lr_multiplier(6, warmup_steps=4, total_steps=8, style="cosine", zero_indexed_step=False) == pytest.approx(
        0.5 * (1 - math.sqrt(0.5)))
    # the constant schedule ignores zero_indexed_step, as verl's does
    assert lr_multiplier(0, warmup_steps=4, total_steps=8, style="constant", zero_indexed_step=False) == 0.0


def test_cosine_hand_values():
    # W=2, S=10, floor 0.1, half cosine: p = (s - 2) / 8
    def expected(s):
        p = (s - 2) / 8
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p))

    for s in (2, 4, 6, 10):
        got = lr_multiplier(s, warmup_steps=2, total_steps=10, style="cosine", min_lr_ratio=0.1)
        assert got == pytest.approx(expected(s))
    assert lr_multiplier(10, warmup_steps=2, total_steps=10, style="cosine", min_lr_ratio=0.1) == pytest.approx(0.1)


def test_warmup_steps_rule():
    assert resolve_warmup_steps(warmup_steps=-1, warmup_ratio=0.1, total_steps=50) == 5
    assert resolve_warmup_steps(warmup_steps=3, warmup_ratio=0.1, total_steps=50) == 3
    # verl: 0 (or null) delegates to the ratio too
    assert resolve_warmup_steps(warmup_steps=0, warmup_ratio=0.1, total_steps=50) == 5
    assert resolve_warmup_steps(warmup_steps=None, warmup_ratio=0.1, total_steps=50) == 5


def test_scheduler_follows_multiplier():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = build_optimizer([param], lr=1.0, betas=(0.9, 0.999), weight_decay=0.0)
    sched = build_scheduler(opt, warmup_steps=2, total_steps=4, style="constant")
    lrs = []
    for _ in range(3):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == [0.0, 0.5, 1.0]


def _state():
    model = torch.nn.Linear(2, 1)
    opt = build_optimizer(model.parameters(), lr=0.1, betas=(0.9, 0.999), weight_decay=0.0)
    return TrainState(model, opt, build_scheduler(opt, warmup_steps=0, total_steps=1, style="constant"), grad_clip=1.0)


def test_nan_guard_skips_the_step_keeps_weights_and_says_so(caplog):
    state = _state()
    before = {k: v.clone() for k, v in state.model.state_dict().items()}
    loss = state.model(torch.tensor([[float("nan"), 1.0]])).sum()
    loss.backward()
    with caplog.at_level(logging.WARNING):
        state.step(loss_value=loss.item())
    assert state.skipped_steps == 1
    (line,) = [r.getMessage() for r in caplog.records if "update skipped" in r.getMessage()]  # issue 50: was silent
    assert line == ("hybridflow: warning: update skipped: the loss (nan) or the gradient norm (nan) is not finite; the "
                    "weights and optimizer state stay as they were (1 skipped so far): look for non-finite rewards or "
                    "advantages, or lower the learning rate")
    for k, v in state.model.state_dict().items():
        assert torch.equal(v, before[k])
    assert all(p.grad is None for p in state.model.parameters())
    assert not state.optimizer.state  # Adam moments untouched


def test_finite_step_clips_and_updates():
    state = _state()
    loss = (state.model(torch.tensor([[100.0, 100.0]])) ** 2).sum()
    loss.backward()
    grad_norm = state.step(loss_value=loss.item())
    assert grad_norm > 1.0 and state.skipped_steps == 0
    assert state.optimizer.state


@pytest.mark.parametrize("skip", [False, True])
def test_zero_gradient_step_moves_weights_only_by_momentum_unless_skipped(skip):
    """After one real step, an exactly-zero gradient: AdamW (beta1 0.9, beta2 0.999, lr 0.1, no decay here)
    still moves each weight by lr * m2_hat / (sqrt(v2_hat) + eps) with m2 = 0.9 m1, v2 = 0.999 v1;
    ``skip_zero_grad`` leaves it where it was."""
    layer = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1, weight_decay=0.0)
    state = TrainState(layer, optimizer, build_scheduler(optimizer, warmup_steps=0, total_steps=10, style="constant"),
                       grad_clip=None, skip_zero_grad=skip)
    layer(torch.tensor([[1.0]])).sum().backward()  # d/dw (w x) = x = 1
    state.step(loss_value=1.0)
    after_real = layer.weight.item()
    assert after_real == pytest.approx(1.0 - 0.1)  # first Adam step: m_hat / sqrt(v_hat) = 1
    state.zero_grad()
    (layer(torch.tensor([[1.0]])) * 0.0).sum().backward()  # gradient exactly 0
    assert state.step(loss_value=0.0) == 0.0
    m2_hat, v2_hat = 0.9 * 0.1 / (1 - 0.9**2), 0.999 * 0.001 / (1 - 0.999**2)
    drift = 0.1 * m2_hat / (math.sqrt(v2_hat) + 1e-8)
    assert layer.weight.item() == pytest.approx(after_real if skip else after_real - drift, rel=1e-6)
    assert state.zero_grad_steps == (1 if skip else 0)


def test_token_budget_groups_consecutive_rows():
    # padded cost = rows x longest; budget 10
    assert split_by_token_budget([3, 3, 3, 4, 9, 2], 10) == [[0, 1, 2], [3], [4], [5]]
    assert split_by_token_budget([12], 10) == [[0]]  # too long alone: its own group
    groups = split_by_token_budget([1, 2, 3, 4, 5, 6, 7], 12)
    assert sum(groups, []) == list(range(7))
    assert all(len(g) * max([1, 2, 3, 4, 5, 6, 7][i] for i in g) <= 12 or len(g) == 1 for g in groups)


def test_a_packed_token_budget_counts_valid_tokens():
    # budget 10; padded: rows x longest ([2, 5] = 10, [3], [6], [1, 1]); packed: the sum (2+5+3, 6+1+1), verl's rule
    lengths = [2, 5, 3, 6, 1, 1]
    assert split_by_token_budget(lengths, 10) == [[0, 1], [2], [3], [4, 5]]
    assert split_by_token_budget(lengths, 10, padded=False) == [[0, 1, 2], [3, 4, 5]]
    assert split_by_token_budget([12, 1], 10, padded=False) == [[0], [1]]


def test_split_to_count_reaches_the_largest_rank_count():
    from hybridflow.workers.micro_batches import split_to_count

    groups = split_to_count([[0, 1, 2, 3], [4]], 4)
    assert len(groups) == 4 and sum(groups, []) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        split_to_count([[0], [1]], 3)


def test_optimizer_takes_the_fused_kernel_on_cpu_and_matches_the_loop():
    model = torch.nn.Linear(4, 3)
    fused = build_optimizer(model.parameters(), lr=0.1, betas=(0.9, 0.999), weight_decay=0.01)
    assert fused.defaults["fused"] is True
    twin = torch.nn.Linear(4, 3)
    twin.load_state_dict(model.state_dict())
    loop = torch.optim.AdamW(twin.parameters(), lr=0.1, betas=(0.9, 0.999), weight_decay=0.01, foreach=False)
    for _ in range(3):
        for module, optimizer in ((model, fused), (twin, loop)):
            optimizer.zero_grad()
            module(torch.ones(2, 4)).pow(2).sum().backward()
            optimizer.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
