"""verl's main_eval (issue 60): generated responses scored offline, the mean per data source."""

import pandas as pd

from hybridflow.trainer.main_eval import main

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str.strip() == ground_truth)}
'''


def test_mean_per_data_source_with_a_custom_function(tmp_path, capsys):
    rows = [{"prompt": "p", "data_source": "a", "responses": ["1", "2"], "reward_model": {"ground_truth": "1"}},
            {"prompt": "p", "data_source": "a", "responses": ["3", "3"], "reward_model": {"ground_truth": "3"}},
            {"prompt": "p", "data_source": "b", "responses": ["x", "y", "z"], "reward_model": {"ground_truth": "q"}}]
    pd.DataFrame(rows).to_parquet(tmp_path / "gen.parquet")
    (tmp_path / "reward.py").write_text(REWARD)
    assert main([f"data.path={tmp_path / 'gen.parquet'}", f"custom_reward_function.path={tmp_path / 'reward.py'}",
                 "ray_kwargs.ray_init.num_cpus=2"]) == 0
    # a: rows score 1/2 and 1 -> 0.75; b: 0
    assert capsys.readouterr().out.strip() == "{'test_score/a': 0.75, 'test_score/b': 0.0}"


def test_built_in_scorer_and_a_missing_column(tmp_path, capsys):
    rows = [{"data_source": "openai/gsm8k", "responses": ["so #### 42", "#### 41"],
             "reward_model": {"ground_truth": "42"}}]
    pd.DataFrame(rows).to_parquet(tmp_path / "gen.parquet")
    assert main([f"data.path={tmp_path / 'gen.parquet'}"]) == 0
    assert capsys.readouterr().out.strip() == "{'test_score/openai/gsm8k': 0.5}"
    assert main([f"data.path={tmp_path / 'gen.parquet'}", "data.response_key=outputs"]) == 2
    assert "has no column(s) ['outputs']" in capsys.readouterr().err
