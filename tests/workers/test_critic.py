"""CriticWorker on a tiny value model: V(s_t) is the head at position P-1+t; the update moves V toward returns."""

import torch

from hybridflow.algos import masked_mean
from hybridflow.trainer.roles.builders import build_critic_worker
from hybridflow.data.parallel import LOCAL
from tests.workers.test_verl_worker_keys import _batch, _cfg

PROMPT, RESPONSE = 3, 4


def critic_with_random_head(model_dir, *overrides):
    critic = build_critic_worker(LOCAL, cfg=_cfg(model_dir, *overrides), total_steps=4).critic
    with torch.no_grad():  # the head starts at zero (every value 0), which would hide an off-by-one position
        torch.manual_seed(3)
        critic.model.value_head.weight.normal_(std=0.5)
        critic.model.value_head.bias.fill_(0.1)
    return critic


def test_values_are_the_head_at_the_position_before_each_response_token(tiny_model_dir):
    critic = critic_with_random_head(tiny_model_dir, "critic.forward_micro_batch_size_per_gpu=3")
    batch = _batch(prompt=PROMPT, response=RESPONSE)
    values = critic.compute_values(batch)
    with torch.no_grad():
        full = critic.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            position_ids=batch["position_ids"])  # [B, P + T]
    expected = full[:, PROMPT - 1 : PROMPT - 1 + RESPONSE] * batch["response_mask"]  # V(s_t) = head(h[P-1+t])
    assert values.shape == (8, RESPONSE)
    torch.testing.assert_close(values, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(values, full[:, PROMPT:] * batch["response_mask"])  # the off-by-one is visible


def test_value_update_moves_values_toward_returns(tiny_model_dir):
    critic = critic_with_random_head(tiny_model_dir, "critic.optim.lr=1e-3", "critic.ppo_mini_batch_size=4",
                                     "critic.ppo_micro_batch_size_per_gpu=2")
    batch = _batch(prompt=PROMPT, response=RESPONSE)
    returns, mask = torch.full((8, RESPONSE), 2.0), batch["response_mask"]
    batch["returns"] = returns

    def error() -> float:
        return masked_mean(values=(critic.compute_values(batch) - returns) ** 2, mask=mask).item()

    before = error()
    for step in range(3):
        batch["values"] = critic.compute_values(batch)
        metrics = critic.update_critic(batch, step=step)
    assert error() < 0.8 * before
    assert metrics["critic/vf_loss"] > 0 and metrics["critic/grad_norm"] > 0
