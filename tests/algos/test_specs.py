"""Algorithm specs carry what an estimator or loss needs: its knobs, inputs derived from the batch, a check.

The last test is the claim of issue 39: an estimator with a new input and a new check, registered in one place
(here, as a file of algos/advantages/ would), runs from main_ppo with nothing else changed.
"""

from __future__ import annotations

import pytest
import torch

from hybridflow.algos import AlgorithmError, advantage_spec, get_policy_loss, policy_loss_spec, register_advantage
from hybridflow.algos.advantages.gdpo import reward_components
from hybridflow.config import PPOConfig, config_value, load_config
from hybridflow.errors import ConfigError
from hybridflow.trainer.main_ppo import run_ppo
from tests.trainer.ppo_fixtures import base_overrides


def settings(**values):
    """A ``setting`` over a flat {dotted key: value} table (what config_value gives for a run config)."""
    return lambda key: values[key]


def test_gdpo_spec_reads_its_weights_and_builds_the_components_from_the_reward_columns():
    batch = {"token_level_rewards": torch.zeros(3, 2), "seq_score": torch.tensor([1, 0, 1]),
             "reward_extra/fmt": torch.tensor([0.5, 0.25, 0.0], dtype=torch.float64)}
    setting = settings(**{"algorithm.gdpo_reward_keys": ["score", "fmt"], "algorithm.gdpo_reward_weights": [1.0, 2.0]})
    own = advantage_spec("gdpo").arguments(batch, setting)
    assert own["reward_weights"] == [1.0, 2.0]
    assert list(own["reward_components"]) == ["score", "fmt"]  # the keys' order: weights pair with it
    assert own["reward_components"]["score"].tolist() == [1.0, 0.0, 1.0]  # the dict's score is seq_score
    assert own["reward_components"]["fmt"].dtype == torch.float32
    assert reward_components(batch, settings(**{"algorithm.gdpo_reward_keys": None})) is None
    with pytest.raises(AlgorithmError, match=r"returned no \['acc'\]"):
        reward_components(batch, settings(**{"algorithm.gdpo_reward_keys": ["score", "acc"]}))


@pytest.mark.parametrize("keys, weights, expected", [
    (None, None, "needs algorithm.gdpo_reward_keys"),
    (["a", "b"], [1.0], "1 weights for 2 gdpo_reward_keys"),
    (["a", "b"], [1.0, 0.5], None),
    (["a"], None, None),
])
def test_gdpo_check(keys, weights, expected):
    problems = advantage_spec("gdpo").check(settings(**{"algorithm.gdpo_reward_keys": keys,
                                                        "algorithm.gdpo_reward_weights": weights}))
    assert problems == [] if expected is None else (len(problems) == 1 and expected in problems[0])


def test_sum_pi_squared_estimators_check_the_actor_switch_and_the_recompute_pass():
    table = {"algorithm.adv_estimator": "optimal_token_baseline", "algorithm.rollout_correction.bypass_mode": True,
             "actor_rollout_ref.actor.calculate_sum_pi_squared": False,
             "actor_rollout_ref.actor.use_rollout_log_probs": False}
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        problems = advantage_spec(name).check(settings(**table))
        assert [("calculate_sum_pi_squared=True" in p, "old-log-prob pass" in p) for p in problems] == [
            (True, False), (False, True)]
    assert advantage_spec("grpo").check(settings(**table)) == []  # no check: no problems


def test_needs_flags_come_from_the_specs():
    assert advantage_spec("prime").needs_reference and advantage_spec("prime").needs_implicit_prm
    assert not advantage_spec("grpo").needs_reference
    assert advantage_spec("prime").arguments({}, settings(**{"algorithm.reward_dpo_coef": 2.0,
                                                            "algorithm.reward_gt_coef": 3.0})) == {
        "reward_dpo_coef": 2.0, "reward_gt_coef": 3.0}


def test_policy_loss_specs_name_their_knobs_and_check_them():
    run = load_config(PPOConfig, ["actor_rollout_ref.model.path=/m", "actor_rollout_ref.actor.policy_loss.dro_beta=0.3",
                                  "actor_rollout_ref.actor.tau_neg=2.0"])
    setting = lambda key: config_value(run, key)  # noqa: E731
    assert policy_loss_spec("dro").knob_values(setting) == {"dro_beta": 0.3}
    assert policy_loss_spec("sapo").knob_values(setting) == {"tau_pos": 1.0, "tau_neg": 2.0}
    assert policy_loss_spec("vanilla").knob_values(setting) == {}  # the clip ratios come with every call
    assert policy_loss_spec("dro").check(setting) == []
    assert "dro_beta > 0" in policy_loss_spec("dro").check(lambda key: None)[0]
    assert set(policy_loss_spec("bypass_mode").knob_values(setting)) == {
        "loss_type", "rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
        "rollout_rs_threshold"}


def test_a_loss_reads_its_own_knobs_and_ignores_the_others():
    """The flat call builds the loss's config from its fields only: another loss's knob changes nothing, its own
    does (dro: l = -(A log p - beta/2 (log p - log q)^2); one token, A=1, log p=-1, log q=-2 -> 1 + beta/2)."""
    one = dict(old_log_prob=torch.tensor([[-2.0]]), log_prob=torch.tensor([[-1.0]]), advantages=torch.ones(1, 1),
               response_mask=torch.ones(1, 1))
    loss, _ = get_policy_loss("dro")(dro_beta=0.5, clip_cov_ratio=-1.0, tau_pos=-3.0, **one)
    assert loss.item() == pytest.approx(1.0 + 0.25)
    vanilla, _ = get_policy_loss("vanilla")(dro_beta=0.5, **one)
    assert vanilla.item() == pytest.approx(-1.2)  # rho = e, clipped to 1.2


def test_a_new_estimator_with_a_new_input_and_check_needs_only_its_registration(tmp_path, tiny_model_dir):
    seen = []

    def response_lengths(batch, setting):  # a new input, derived from the batch's columns
        return batch["response_mask"].sum(-1)

    def gamma_is_one(setting):  # a new check, one line naming the key and the fix
        return [] if setting("algorithm.gamma") == 1.0 else ["algorithm.gamma must be 1.0 for test_only_lengths"]

    @register_advantage("test_only_lengths", inputs={"lengths": response_lengths},
                        knobs={"bonus": "algorithm.norm_adv_by_std_in_grpo"}, check=gamma_is_one)
    def lengths_advantage(*, token_level_rewards, response_mask, lengths, bonus, **_):
        seen.append((lengths.clone(), response_mask.sum(-1).clone(), bonus))
        return torch.zeros_like(token_level_rewards), torch.zeros_like(token_level_rewards)

    def overrides(*extra):
        return base_overrides(tmp_path, tiny_model_dir, estimator="test_only_lengths", steps=1) + list(extra)

    with pytest.raises(ConfigError, match="algorithm.gamma must be 1.0 for test_only_lengths"):
        run_ppo(load_config(PPOConfig, overrides("algorithm.gamma=0.5")))
    assert seen == []  # refused before any model loaded
    run_ppo(load_config(PPOConfig, overrides("algorithm.norm_adv_by_std_in_grpo=False")))
    lengths, mask_lengths, bonus = seen[0]
    assert torch.equal(lengths, mask_lengths) and bonus is False
