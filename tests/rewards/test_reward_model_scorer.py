import pytest
import torch
from transformers import AutoModelForSequenceClassification

from hybridflow.errors import ModelError
from hybridflow.models.tiny import tiny_config
from hybridflow.rewards.reward_model import RewardModelScorer


@pytest.fixture(scope="module")
def reward_model(tiny_tokenizer):
    pad = tiny_tokenizer.pad_token_id
    config = tiny_config("llama", vocab_size=len(tiny_tokenizer), pad_token_id=pad, num_labels=1)
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(config, dtype=torch.float32).eval()


PROMPTS = [
    [{"role": "user", "content": "What is 2 + 3?"}],
    [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Compute 7 * 8."}],
    "Say hi",
]
RESPONSES = ["5", "The product is 56. #### 56", "hi there, what is the question"]


def test_one_score_per_sample_matching_unbatched_forward(reward_model, tiny_tokenizer):
    scorer = RewardModelScorer(model=reward_model, tokenizer=tiny_tokenizer, micro_batch_size=2)
    scores = scorer.score(prompts=PROMPTS, responses=RESPONSES)
    assert scores.shape == (3,) and scores.dtype == torch.float32
    # reference: each conversation alone, no padding, head read at the last token
    for b, (prompt, response) in enumerate(zip(PROMPTS, RESPONSES)):
        ids = torch.tensor([tiny_tokenizer(scorer.render(prompt=prompt, response=response))["input_ids"]])
        with torch.no_grad():
            expected = reward_model(input_ids=ids).logits[0, 0]
        assert scores[b] == pytest.approx(expected.item(), abs=1e-5)


def test_rendering_uses_the_rm_chat_template(reward_model, tiny_tokenizer):
    scorer = RewardModelScorer(model=reward_model, tokenizer=tiny_tokenizer)
    text = scorer.render(prompt="Say hi", response="hi")
    assert text == "<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\nhi<|im_end|>\n"


def test_left_and_right_padding_agree(reward_model, tiny_tokenizer):
    side = tiny_tokenizer.padding_side
    try:
        results = {}
        for padding_side in ("left", "right"):
            tiny_tokenizer.padding_side = padding_side
            scorer = RewardModelScorer(model=reward_model, tokenizer=tiny_tokenizer, micro_batch_size=3)
            results[padding_side] = scorer.score(prompts=PROMPTS, responses=RESPONSES)
    finally:
        tiny_tokenizer.padding_side = side
    assert torch.allclose(results["left"], results["right"], atol=1e-5)


def test_pad_id_mismatch_is_a_model_error(tiny_tokenizer):
    wrong_pad = tiny_tokenizer.pad_token_id + 1
    config = tiny_config("llama", vocab_size=len(tiny_tokenizer), pad_token_id=wrong_pad, num_labels=1)
    model = AutoModelForSequenceClassification.from_config(config)
    with pytest.raises(ModelError, match="pad_token_id"):
        RewardModelScorer(model=model, tokenizer=tiny_tokenizer)
