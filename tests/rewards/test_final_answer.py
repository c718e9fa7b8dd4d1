"""The final-answer reward file: the data source's scorer sees the tool agent's last turn, not tool output."""

import json

from hybridflow.rewards import final_answer
from hybridflow.rewards.custom import load_reward_function

# loaded the way custom_reward_function.path=<the file> loads it (hybridflow demo --preset tools)
compute_score = load_reward_function(final_answer.__file__)

META = {"metadata": json.dumps({"source_dataset": "basic_arithmetic", "expression": "554 * 470"})}
# solution_str of a multi-turn rollout: the call, the tool's reply (an observation) and the final turn
CONVERSATION = ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "554 * 470"}}\n</tool_call>'
                "\ntool\n260380\n\nassistant\n")


def test_the_final_answer_is_scored_not_the_number_the_tool_printed():
    right = {**META, "final_answer": "260380"}
    assert compute_score("basic_arithmetic", CONVERSATION + "260380", "260380", right) == 1.0
    # the last number of the whole text is the tool's (right) result, but the model answered nothing
    assert compute_score("basic_arithmetic", CONVERSATION, "260380", {**META, "final_answer": ""}) == 0.0
    assert compute_score("basic_arithmetic", CONVERSATION + "26038", "260380", {**META, "final_answer": "26038"}) == 0.0


def test_rows_without_a_final_answer_are_scored_on_the_whole_response():
    assert compute_score("basic_arithmetic", "The answer is 260380", "260380", META) == 1.0
