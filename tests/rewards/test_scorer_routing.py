import pytest

from hybridflow.errors import DataError
from hybridflow.rewards import registry
from hybridflow.rewards.registry import default_compute_score, get_scorer, register_scorer


def test_builtin_sources_route_to_their_scorers():
    assert default_compute_score("openai/gsm8k", "#### 4", "4") == 1.0
    assert default_compute_score("lighteval/MATH", r"\boxed{4}", "4") == 1.0
    assert default_compute_score("HuggingFaceH4/MATH-500", r"\boxed{5}", "4") == 0.0
    assert default_compute_score("chain_sum", "4", "4", {"metadata": "{}"}) == 1.0


def test_reward_kwargs_reach_the_scorer():
    assert default_compute_score("openai/gsm8k", "it is 4", "4", method="flexible") == 1.0
    assert default_compute_score("openai/gsm8k", "#### 5", "4", format_score=0.25) == 0.25


def test_unknown_source_names_known_ones_and_the_fix():
    with pytest.raises(DataError) as error:
        get_scorer("my/unknown_source")
    message = str(error.value)
    assert "my/unknown_source" in message and "openai/gsm8k" in message
    assert "custom_reward_function.path" in message and "reasoning-gym" in message


def test_register_scorer_adds_a_route(monkeypatch):
    monkeypatch.setattr(registry, "_SCORERS", dict(registry._SCORERS))

    @register_scorer("acme/echo", "acme/echo2")
    def echo(data_source, solution_str, ground_truth, extra_info=None):
        return float(solution_str == ground_truth)

    assert default_compute_score("acme/echo2", "x", "x") == 1.0
    assert "acme/echo" in registry.registered_data_sources()
    with pytest.raises(ValueError, match="already routed"):
        register_scorer("acme/echo")(lambda *a: 0.0)
