"""Score a multi-turn conversation by its final answer only (a reward function file for tool-agent rows).

    custom_reward_function.path=<this file>   (hybridflow demo --preset tools sets it)

``solution_str`` of a multi-turn rollout is the whole response: generated turns *and* observations.
A last-number rule over that text would credit a number the tool printed, or one echoed back in a
tool's error message, as the model's answer. Here the data source's own scorer sees only the tool
agent's ``extra_info["final_answer"]``: the last assistant turn without its tool calls. An answer
the model read off the calculator and wrote out counts; a conversation that ended on a call has no
answer. Rows that did not run through the tool agent are scored on ``solution_str`` as usual.
"""

from __future__ import annotations

from hybridflow.rewards.registry import default_compute_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """``default_compute_score`` of the final answer (``extra_info['final_answer']``) when there is one."""
    answer = (extra_info or {}).get("final_answer", solution_str)
    return default_compute_score(data_source, answer, ground_truth, extra_info, **kwargs)
