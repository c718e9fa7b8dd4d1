import torch

from hybridflow.models import ValueModel, load_reward_model, load_value_model


def test_value_model_is_head_over_last_hidden_state(tiny_model_dir):
    model = load_value_model(tiny_model_dir)
    assert isinstance(model, ValueModel)
    ids = torch.tensor([[3, 8, 15, 4], [9, 9, 2, 30]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        assert torch.equal(model(ids, mask), torch.zeros(2, 4))  # zero-initialised head
        model.value_head.weight.normal_()
        model.value_head.bias.fill_(0.5)
        hidden = model.backbone(input_ids=ids, attention_mask=mask).last_hidden_state
        expected = hidden @ model.value_head.weight[0] + 0.5
        assert torch.allclose(model(ids, mask), expected, atol=1e-5)


def test_value_model_save_load_round_trip(tiny_model_dir, tmp_path):
    model = load_value_model(tiny_model_dir)
    with torch.no_grad():
        model.value_head.weight.normal_()
        model.backbone.norm.weight.mul_(1.5)
    model.save_pretrained(str(tmp_path))
    again = load_value_model(str(tmp_path))
    ids = torch.tensor([[3, 8, 15, 4]])
    with torch.no_grad():
        assert torch.equal(model(ids), again(ids))


def test_reward_model_scores_the_last_non_pad_token(tiny_model_dir):
    model = load_reward_model(tiny_model_dir)
    pad = model.config.pad_token_id
    ids = torch.tensor([[3, 8, 15, pad, pad], [9, 9, 2, 30, 7]])
    mask = (ids != pad).long()
    with torch.no_grad():
        scores = model(input_ids=ids, attention_mask=mask).logits
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        expected = torch.stack([model.score(hidden[0, 2]), model.score(hidden[1, 4])])
    assert scores.shape == (2, 1)
    assert torch.allclose(scores, expected, atol=1e-5)
