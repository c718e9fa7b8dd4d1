import pytest

from hybridflow.errors import ConfigError, DataError
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


@pytest.mark.parametrize("data_source, truth, takes", [
    ("chain_sum", "4", "none"),  # reasoning-gym's scorer dropped unknown keys silently
    ("openai/gsm8k", "4", "method, format_score, score"),
])
def test_unknown_reward_kwargs_are_an_error_not_ignored(data_source, truth, takes):
    message = f"reward_kwargs.strictness is not an argument of the built-in scorer of data_source '{data_source}'"
    with pytest.raises(ConfigError, match=message + rf" \(it takes: {takes}\)"):
        default_compute_score(data_source, "4", truth, {"metadata": "{}"}, strictness=2)
    with pytest.raises(ConfigError, match=message):  # and before the run starts
        registry.check_rows_scorable([(0, data_source, truth)], files="data.train_files",
                                     reward_kwargs={"strictness": 2})


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
