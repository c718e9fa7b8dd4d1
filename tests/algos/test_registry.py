import pytest
import torch

import hybridflow.algos as algos
from hybridflow.algos.registry import Registry

# every name verl 0.9.1 registers (core_algos.AdvantageEstimator and register_policy_loss)
VERL_ADVANTAGES = {
    "gae", "grpo", "rloo", "remax", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo", "gpg", "grpo_passk",
    "grpo_vectorized", "rloo_vectorized", "optimal_token_baseline", "tir_optimal_token_baseline", "gdpo",
}
VERL_POLICY_LOSSES = {
    "vanilla", "gspo", "gpg", "clip_cov", "kl_cov", "cispo", "geo_mean", "sapo", "dppo_tv", "dppo_kl", "dro",
    "bypass_mode",
}


def test_importing_the_package_registers_every_verl_name():
    assert VERL_ADVANTAGES <= set(algos.list_advantages())
    assert VERL_POLICY_LOSSES <= set(algos.list_policy_losses())
    for name in VERL_ADVANTAGES:
        assert callable(algos.get_advantage(name))
    for name in VERL_POLICY_LOSSES:
        assert callable(algos.get_policy_loss(name))


def test_unknown_name_lists_registered_names_and_suggests_the_closest():
    with pytest.raises(algos.UnknownAlgorithmError) as err:
        algos.get_advantage("grpoo")
    message = str(err.value)
    assert "did you mean 'grpo'" in message
    assert all(name in message for name in VERL_ADVANTAGES)
    with pytest.raises(ValueError, match="registered: bypass_mode, cispo, clip_cov"):
        algos.get_policy_loss("ppo")


def test_user_registered_estimator_is_found_and_a_taken_name_is_refused():
    registry = Registry("thing")

    @registry.register("double")
    def double(*, x):
        return 2 * x

    assert registry.get("double")(x=torch.tensor(3.0)) == 6.0
    registry.register("double")(double)  # the same function again: a reload, fine
    with pytest.raises(algos.AlgorithmError, match="already registered"):

        @registry.register("double")
        def other(*, x):
            return x


def test_custom_advantage_plugs_into_the_public_registry():
    @algos.register_advantage("test_only_zero")
    def zero(*, token_level_rewards, response_mask, **_):
        return torch.zeros_like(token_level_rewards), torch.zeros_like(token_level_rewards)

    assert "test_only_zero" in algos.list_advantages()
    adv, _ = algos.get_advantage("test_only_zero")(
        token_level_rewards=torch.ones(2, 3), response_mask=torch.ones(2, 3), index=[0, 0]
    )
    assert adv.abs().sum() == 0
