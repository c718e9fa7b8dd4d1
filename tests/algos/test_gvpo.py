"""GVPO (loss_mode=gvpo, verl-recipe's gvpo): hand-computed loss and gradient, whole groups, the pre-load checks."""

import numpy as np
import pytest
import torch

from hybridflow.algos import AlgorithmError, get_policy_loss, policy_loss_spec

# rows a, b, a, b (groups interleaved); row 1's second token is masked (absurd log-ratio and advantage there)
OLD = torch.tensor([[-1.0, -2.0], [-0.5, -1.0], [-1.5, -0.7], [-2.0, -0.3]])
LOG_RATIO = torch.tensor([[0.2, 0.4], [0.0, 50.0], [-0.2, 0.0], [0.6, 0.2]])
ADV = torch.tensor([[1.0, 1.0], [-0.5, 9.0], [-1.0, -1.0], [0.5, 0.5]])
MASK = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
UID = np.array(["a", "b", "a", "b"], dtype=object)


def _gvpo(log_ratio=LOG_RATIO, index=UID, **kwargs):
    log_prob = (OLD + log_ratio).requires_grad_(True)
    loss, metrics = get_policy_loss("gvpo")(old_log_prob=OLD, log_prob=log_prob, advantages=ADV, response_mask=MASK,
                                            index=index, **{"gvpo_beta": 0.5, **kwargs})
    return loss, metrics, log_prob


def test_loss_and_gradient_by_hand():
    # r = 0.5 * sum of valid log-ratios: [0.3, 0.0, -0.1, 0.4]; group means a: 0.1, b: 0.2
    # a_i (mean advantage over valid tokens): [1, -0.5, -1, 0.5]; k = 2, so / (k - 1) = / 1
    # l = 0.5 * ((r - mean) - a)^2: [0.5*0.64, 0.5*0.09, 0.5*0.64, 0.5*0.09]
    loss, metrics, log_prob = _gvpo(rollout_n=2)
    assert loss.item() == pytest.approx(0.32 + 0.045 + 0.32 + 0.045)
    (grad,) = torch.autograd.grad(loss, log_prob)
    # dl/dr = (r - mean) - a (mean detached), times beta on each valid token
    expected = torch.tensor([[-0.4, -0.4], [0.15, 0.0], [0.4, 0.4], [-0.15, -0.15]])
    assert torch.allclose(grad, expected, atol=1e-6)
    assert metrics["ppo_kl"] == pytest.approx(-(0.6 + 0.0 - 0.2 + 0.8) / 7)
    assert metrics["pg_clipfrac"] == metrics["pg_clipfrac_lower"] == 0.0


def test_a_micro_batch_is_scaled_as_the_recipe_scales_it():
    """b rows of a mini-batch of N_seq: the recipe's sum over the micro-batch / (grad accumulation x ranks)."""
    loss, _, _ = _gvpo(global_num_seqs=8)
    assert loss.item() == pytest.approx(0.73 * 4 / 8)


def test_three_responses_divide_by_k_minus_1():
    old = torch.zeros(3, 1)
    log_prob = torch.tensor([[0.3], [0.0], [-0.3]])
    loss, _ = get_policy_loss("gvpo")(old_log_prob=old, log_prob=log_prob, advantages=torch.tensor([[1.0], [0], [-1]]),
                                      response_mask=torch.ones(3, 1), index=["p", "p", "p"], gvpo_beta=1.0,
                                      rollout_n=3)
    assert loss.item() == pytest.approx(2 * 0.5 * 0.7 ** 2 / 2)


def test_a_split_group_or_missing_ids_is_refused():
    with pytest.raises(AlgorithmError, match="group 'b' has 1 of its 2 responses in this micro-batch"):
        _gvpo(index=np.array(["a", "b", "a", "c"], dtype=object))
    with pytest.raises(AlgorithmError, match="has 2 of its 4 responses"):
        _gvpo(rollout_n=4)
    with pytest.raises(AlgorithmError, match="needs the group id of every row"):
        _gvpo(index=None)


def test_the_spec_reads_the_recipe_s_keys_and_refuses_what_splits_groups():
    spec = policy_loss_spec("gvpo")
    assert spec.whole_groups and spec.knobs == {"gvpo_beta": "actor_rollout_ref.actor.gvpo_beta",
                                                "rollout_n": "actor_rollout_ref.rollout.n"}
    actor = "actor_rollout_ref.actor."
    good = {actor + "gvpo_beta": 0.1, "actor_rollout_ref.rollout.n": 4, actor + "ppo_micro_batch_size_per_gpu": 16,
            actor + "use_dynamic_bsz": False, actor + "shuffle": False, "algorithm.rollout_correction.rollout_is": None}
    assert spec.check(good.get) == []
    bad = {**good, actor + "ppo_micro_batch_size_per_gpu": 6, actor + "shuffle": True}
    assert spec.check(bad.get) == [
        "loss_mode=gvpo needs each prompt's rollout.n=4 responses in one micro-batch: make "
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=6 a multiple of 4",
        "loss_mode=gvpo keeps each prompt's responses together: set actor_rollout_ref.actor.shuffle=False"]
    problems = spec.check({**good, actor + "use_dynamic_bsz": True, actor + "gvpo_beta": 0.0,
                           "algorithm.rollout_correction.rollout_is": "token"}.get)
    assert len(problems) == 3 and "gvpo_beta > 0" in problems[0] and "use_dynamic_bsz=False" in problems[1]
    assert "rollout_is=null" in problems[2]
