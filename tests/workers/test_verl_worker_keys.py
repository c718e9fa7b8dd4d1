"""verl keys that shape the workers: deprecated global micro-batch sizes, the rollout's log-prob
micro-batching, critic shuffle / rollout_n / gradient checkpointing, external_lib, chat template.

Workers are built from a PPOConfig by the real factories (hybridflow.trainer.roles.builders) on a
tiny model; a spy on the critic's ``optimizer_step`` records which rows each optimizer step saw.
"""

import sys

import pytest
import torch

from hybridflow.config import PPOConfig, load_config
from hybridflow.trainer.roles.builders import build_critic_worker, build_hybrid_engine, policy_tokenizer
from hybridflow.data.batch import Batch
from hybridflow.workers.critic import CriticWorker
from hybridflow.data.parallel import LOCAL
from hybridflow.workers.micro_batches import LogProbBatching, mini_batches, per_rank_micro_batch_size


def _cfg(model_dir, *overrides):
    return load_config(PPOConfig, [f"actor_rollout_ref.model.path={model_dir}", "algorithm.adv_estimator=gae",
                                   "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=2",
                                   *overrides])


def _batch(rows: int = 8, prompt: int = 3, response: int = 4) -> Batch:
    """Rows of a fake rollout with distinct lengths and a ``row`` id column."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([1 + i % response for i in range(rows)])
    response_mask = (torch.arange(response)[None, :] < lengths[:, None]).long()
    input_ids = torch.randint(3, 60, (rows, prompt + response), generator=gen)
    attention_mask = torch.cat([torch.ones(rows, prompt, dtype=torch.long), response_mask], dim=1)
    return Batch.from_dict(tensors={
        "input_ids": input_ids, "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0), "responses": input_ids[:, prompt:],
        "response_mask": response_mask, "values": torch.zeros(rows, response), "returns": torch.ones(rows, response),
        "row": torch.arange(rows)})


# ------------------------------------------------------------------ pure helpers
def test_deprecated_global_micro_batch_size_is_divided_over_ranks():
    assert per_rank_micro_batch_size(None, 8, 4) == 2
    assert per_rank_micro_batch_size(None, 2, 4) == 1  # never 0
    assert per_rank_micro_batch_size(3, 8, 4) == 3  # the per-GPU key wins
    assert per_rank_micro_batch_size(None, None, 4) is None


def test_mini_batch_shuffle_is_a_seeded_permutation():
    batch = _batch()
    plain = [m["row"].tolist() for m in mini_batches(batch, 4, shuffle=False, seed=1, step=1, epoch=0)]
    assert plain == [[0, 1, 2, 3], [4, 5, 6, 7]]
    shuffled = [m["row"].tolist() for m in mini_batches(batch, 4, shuffle=True, seed=1, step=1, epoch=0)]
    again = [m["row"].tolist() for m in mini_batches(batch, 4, shuffle=True, seed=1, step=1, epoch=0)]
    other_step = [m["row"].tolist() for m in mini_batches(batch, 4, shuffle=True, seed=1, step=2, epoch=0)]
    assert shuffled == again and shuffled != plain and shuffled != other_step
    assert sorted(sum(shuffled, [])) == list(range(8))


# ------------------------------------------------------------------ critic
def _rows_per_step(monkeypatch, critic: CriticWorker, batch: Batch, step: int) -> list[list[int]]:
    seen = []
    monkeypatch.setattr("hybridflow.workers.critic.optimizer_step",
                        lambda *, micros, **_: seen.append(sum((m["row"].tolist() for m in micros), [])))
    critic.update_critic(batch, step=step)
    return seen


@pytest.mark.parametrize("shuffle", [False, True])
def test_critic_shuffle_permutes_rows_between_mini_batches(monkeypatch, tiny_model_dir, shuffle):
    cfg = _cfg(tiny_model_dir, f"critic.shuffle={shuffle}", "critic.ppo_mini_batch_size=2")
    critic = build_critic_worker(LOCAL, cfg=cfg, total_steps=2).critic
    rows = _rows_per_step(monkeypatch, critic, _batch(), step=1)
    assert len(rows) == 2 and sorted(sum(rows, [])) == list(range(8))  # 2 prompts x n=2 rows per mini-batch
    assert (rows == [[0, 1, 2, 3], [4, 5, 6, 7]]) is (not shuffle)


def test_critic_follows_its_own_keys(tiny_model_dir):
    cfg = _cfg(tiny_model_dir, "critic.rollout_n=4", "critic.model.enable_gradient_checkpointing=True",
               "critic.ppo_micro_batch_size=2", "critic.forward_micro_batch_size=4")
    critic = build_critic_worker(LOCAL, cfg=cfg, total_steps=2).critic
    assert critic.schedule.rows_per_prompt == 4  # critic.rollout_n, not actor_rollout_ref.rollout.n (2)
    assert critic.model.backbone.is_gradient_checkpointing
    assert (critic.schedule.micro_batch_size, critic.forward.micro_batch_size) == (2, 4)
    plain = build_critic_worker(LOCAL, cfg=_cfg(tiny_model_dir), total_steps=2).critic
    assert not plain.model.backbone.is_gradient_checkpointing


# ------------------------------------------------------------------ actor / rollout log-probs
def test_rollout_log_prob_keys_set_the_old_log_prob_forward(tiny_model_dir):
    cfg = _cfg(tiny_model_dir, "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
               "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=21",
               "actor_rollout_ref.rollout.log_prob_micro_batch_size=3")
    actor = build_hybrid_engine(LOCAL, cfg=cfg, total_steps=2, with_rollout=False).actor
    assert actor.log_prob == LogProbBatching(micro_batch_size=3, use_dynamic_bsz=True, max_token_len=21)
    assert actor.schedule.micro_batch_size is None  # the training micro-batch keys are separate
    follows = build_hybrid_engine(LOCAL, cfg=_cfg(tiny_model_dir, "actor_rollout_ref.actor.use_dynamic_bsz=True"),
                                  total_steps=2, with_rollout=False).actor
    assert follows.log_prob.use_dynamic_bsz  # verl's default: follows actor.use_dynamic_bsz


def test_old_log_probs_do_not_depend_on_the_log_prob_micro_batching(monkeypatch, tiny_model_dir):
    import hybridflow.workers.logprob as logprob

    batch, results, calls = _batch(), [], []
    real = logprob.micro_batch_log_probs
    monkeypatch.setattr(logprob, "micro_batch_log_probs", lambda *a, **k: calls.append(1) or real(*a, **k))
    for overrides in ([], ["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3"],
                      ["actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
                       "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=16"]):
        actor = build_hybrid_engine(LOCAL, cfg=_cfg(tiny_model_dir, *overrides), total_steps=2, with_rollout=False).actor
        calls.clear()
        results.append(actor.compute_log_prob(batch, temperature=1.0)[0])
        results[-1] = (results[-1], len(calls))
    # 8 rows of 4,5,6,7,4,5,6,7 tokens: all at once; 3+3+2 rows; padded pairs of <= 16 tokens
    assert [n for _, n in results] == [1, 3, 4]
    mask = batch["response_mask"].bool()  # padding positions are not log-probs of anything
    for values, _ in results[1:]:
        torch.testing.assert_close(values[mask], results[0][0][mask], rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ model loading keys
def test_external_lib_is_imported_before_the_model_loads(tmp_path, monkeypatch, tiny_model_dir):
    (tmp_path / "my_arch_registry.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_arch_registry", raising=False)
    cfg = _cfg(tiny_model_dir, "actor_rollout_ref.model.external_lib=my_arch_registry")
    build_hybrid_engine(LOCAL, cfg=cfg, total_steps=2, with_rollout=False)
    assert sys.modules["my_arch_registry"].LOADED


def test_custom_chat_template_replaces_the_tokenizers(tiny_model_dir):
    template = "{% for m in messages %}<<{{ m['content'] }}>>{% endfor %}"
    cfg = _cfg(tiny_model_dir)
    cfg.actor_rollout_ref.model.custom_chat_template = template
    tokenizer = policy_tokenizer(cfg)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "<<hi>>"
