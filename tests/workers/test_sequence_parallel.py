"""Ulysses sequence parallelism: 2 gloo ranks splitting every packed row equal one process.

One spawn of 2 processes (module fixture, dp = 1 x sp = 2, FSDP2 over both ranks) runs the
actor (old and reference log-probs, two PPO steps with a KL loss), the critic (values, two
value-loss steps) and SFT (two steps) through the same factories as the trainers, and
writes what it got; the tests compare with the same factories at one process (sp = 1). The actor is a Mistral
with a sliding window shorter than the rows, the critic a Gemma 2 (soft-capped attention, local layers).
Tolerance: fp32, atol 1e-5 on log-probs, values, losses and gradient norms (only reduction orders
differ); 5e-5 on weights after two AdamW steps at lr 1e-2 for all but 1e-3 of each tensor's elements, and the
steps' bound on those few: AdamW's updates are about lr x sign(g), so rounding in a near-zero gradient element
can carry that element as far as a whole step (tests/adamw_weights.py; issue 48: 1 of 8,192 elements 7.4e-5
apart on an Intel Xeon). The critic's model has one
key/value head for two ranks, so its KV head is repeated (GQA path).
"""

from __future__ import annotations

import os
import socket

import pandas as pd
import pytest
import torch
import torch.multiprocessing as mp

from hybridflow.config import PPOConfig, SFTConfig, load_config
from hybridflow.data.batch import Batch
from hybridflow.errors import ConfigError
from hybridflow.models.ulysses import SequenceParallel, SequenceShard, check_heads
from hybridflow.data.parallel import LOCAL, DataParallel
from tests.adamw_weights import assert_adamw_weights_close

WORLD, ATOL, WEIGHT_ATOL = 2, 1e-5, 5e-5
LR, STEPS = 1e-2, 2
ROWS, PROMPT, RESPONSE = 4, 5, 6


def ppo_config(actor_dir: str, critic_dir: str, sp: int) -> PPOConfig:
    return load_config(PPOConfig, [
        f"actor_rollout_ref.model.path={actor_dir}", "actor_rollout_ref.model.use_remove_padding=True",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}", f"data.max_response_length={RESPONSE}",
        "algorithm.adv_estimator=gae", f"critic.model.path={critic_dir}", "critic.model.use_remove_padding=True",
        "critic.ppo_micro_batch_size_per_gpu=2", "critic.optim.lr=1e-2", f"critic.ulysses_sequence_parallel_size={sp}",
    ])


def rollout_batch() -> Batch:
    """2 left-padded prompts x 2 samples + right-padded responses of ragged lengths (a shared-prompt row of 23
    tokens: odd, so the last slice is padded), fixed advantages, returns and old values."""
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 200, (ROWS // 2, PROMPT), generator=gen).repeat_interleave(2, dim=0)  # n = 2
    responses = torch.randint(3, 200, (ROWS, RESPONSE), generator=gen)
    prompt_mask = (torch.arange(PROMPT) >= torch.tensor([0, 0, 3, 3]).unsqueeze(1)).long()
    response_mask = (torch.arange(RESPONSE) < torch.tensor([6, 4, 5, 1]).unsqueeze(1)).long()
    attention = torch.cat([prompt_mask, response_mask], dim=1)
    return Batch.from_dict(tensors={
        "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention, "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "advantages": torch.randn(ROWS, 1, generator=gen).expand(ROWS, RESPONSE) * response_mask,
        "returns": torch.randn(ROWS, RESPONSE, generator=gen) * response_mask,
    })


def run_actor(engine) -> dict:
    batch, out = rollout_batch(), {"old": [], "ref": [], "metrics": []}
    for step in (1, 2):
        batch["old_log_probs"], _ = engine.compute_log_prob(batch, temperature=1.0)
        batch["ref_log_probs"] = engine.compute_ref_log_prob(batch, temperature=1.0)
        out["old"].append(batch["old_log_probs"])
        out["ref"].append(batch["ref_log_probs"])
        out["metrics"].append(engine.update_policy(batch, temperature=1.0, step=step))
    out["weights"] = engine.full_weights()
    return out


def run_critic(critic) -> dict:
    batch, out = rollout_batch(), {"values": [], "metrics": []}
    for step in (1, 2):
        batch["values"] = critic.compute_values(batch)
        out["values"].append(batch["values"])
        out["metrics"].append(critic.update_critic(batch, step=step))
    from hybridflow.models.fsdp import full_state_dict

    out["weights"] = full_state_dict(critic.critic.model)
    return out


def sft_config(model_dir: str, data: str, run: str, sp: int) -> SFTConfig:
    return load_config(SFTConfig, [
        f"model.partial_pretrain={model_dir}", f"data.train_files={data}", "data.train_batch_size=4",
        "data.micro_batch_size_per_gpu=2", "data.prompt_key=prompt", "data.response_key=response",
        "use_remove_padding=true", f"ulysses_sequence_parallel_size={sp}",
        "optim.lr=1e-2", f"trainer.default_local_dir={run}", "trainer.device=cpu",
    ])


def run_sft(cfg: SFTConfig, dp: DataParallel) -> dict:
    from hybridflow.models.fsdp import full_state_dict
    from hybridflow.trainer.sft_trainer import SFTTrainer, build_dataset, build_tokenizer, load_model

    tokenizer = build_tokenizer(cfg)
    dataset = build_dataset(cfg, cfg.data.train_files, tokenizer)
    trainer = SFTTrainer(cfg, model=load_model(cfg, device=torch.device("cpu")), tokenizer=tokenizer,
                         train_dataset=dataset, val_dataset=None, dp=dp)
    samples = [dataset[i] for i in range(4)]
    metrics = [trainer.train_step(samples) for _ in range(2)]
    return {"metrics": metrics, "weights": full_state_dict(trainer.model)}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, port: int, dirs: dict) -> None:
    import torch.distributed as dist

    from hybridflow.trainer.roles.builders import build_critic_worker, build_hybrid_engine

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    world = DataParallel(world_size=WORLD, rank=rank)
    cfg = ppo_config(dirs["actor"], dirs["critic"], sp=WORLD)
    results = {
        "actor": run_actor(build_hybrid_engine(world, cfg=cfg, total_steps=2, with_rollout=False)),
        "critic": run_critic(build_critic_worker(world, cfg=cfg, total_steps=2)),
        "sft": run_sft(sft_config(dirs["actor"], dirs["sft_data"], dirs["out"] + f"/sft{rank}", sp=WORLD), world),
    }
    torch.save(results, os.path.join(dirs["out"], f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from hybridflow.models.tiny import save_tiny_model

    root = tmp_path_factory.mktemp("ulysses")
    rows = [{"prompt": f"what is {i} + {i}?", "response": f"{i} + {i} = {2 * i}, so {2 * i}" * (1 + i % 3)}
            for i in range(4)]
    pd.DataFrame(rows).to_parquet(root / "sft.parquet")
    # A window of 4 keys (rows of up to 11 tokens) and Gemma 2's capped attention: what each rank's attention
    # over the whole row must still measure in the row's own positions.
    return {"actor": save_tiny_model(str(root / "actor"), arch="mistral", seed=0, sliding_window=4),  # 4 / 2 KV heads
            "critic": save_tiny_model(str(root / "critic"), arch="gemma2", seed=1, num_key_value_heads=1),
            "sft_data": str(root / "sft.parquet"), "out": str(root)}


@pytest.fixture(scope="module")
def two_rank_results(model_dirs):
    env = {"OMP_NUM_THREADS": "1"}
    old = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        mp.start_processes(_rank_main, args=(_free_port(), model_dirs), nprocs=WORLD, start_method="spawn")
    finally:
        for key, value in old.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    return [torch.load(os.path.join(model_dirs["out"], f"rank{r}.pt"), weights_only=False) for r in range(WORLD)]


@pytest.fixture(scope="module")
def one_process_results(model_dirs):
    from hybridflow.trainer.roles.builders import build_critic_worker, build_hybrid_engine

    cfg = ppo_config(model_dirs["actor"], model_dirs["critic"], sp=1)
    return {"actor": run_actor(build_hybrid_engine(LOCAL, cfg=cfg, total_steps=2, with_rollout=False)),
            "critic": run_critic(build_critic_worker(LOCAL, cfg=cfg, total_steps=2)),
            "sft": run_sft(sft_config(model_dirs["actor"], model_dirs["sft_data"], model_dirs["out"] + "/sft", sp=1),
                           LOCAL)}


def assert_close_dicts(got: dict, expected: dict, keys=None, atol: float = ATOL) -> None:
    for key in keys or expected:
        torch.testing.assert_close(torch.as_tensor(got[key]), torch.as_tensor(expected[key]), atol=atol, rtol=0,
                                   msg=lambda text, key=key: f"{key}: {text}")


@pytest.mark.slow  # ~1 min on 2 shared cores: three model builds per rank, FSDP2 + all-to-all over gloo
@pytest.mark.parametrize("rank", range(WORLD))
def test_actor_with_sp2_equals_one_process(two_rank_results, one_process_results, rank):
    got, expected = two_rank_results[rank]["actor"], one_process_results["actor"]
    for name in ("old", "ref"):
        for a, b in zip(got[name], expected[name]):
            torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    for a, b in zip(got["metrics"], expected["metrics"]):
        assert_close_dicts(a, b, keys=("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy_loss"))  # entropy_coeff=0.01: verl's name
    assert_adamw_weights_close(got["weights"], expected["weights"], atol=WEIGHT_ATOL, lr=LR, steps=STEPS)
    assert (expected["old"][1] - expected["old"][0]).abs().max() > 100 * ATOL  # step 1 moved the policy
    assert expected["metrics"][1]["actor/kl_loss"] > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("rank", range(WORLD))
def test_critic_with_sp2_equals_one_process(two_rank_results, one_process_results, rank):
    got, expected = two_rank_results[rank]["critic"], one_process_results["critic"]
    for a, b in zip(got["values"], expected["values"]):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)
    for a, b in zip(got["metrics"], expected["metrics"]):
        assert_close_dicts(a, b, keys=("critic/vf_loss", "critic/grad_norm", "critic/vpred_mean"))
    assert_adamw_weights_close(got["weights"], expected["weights"], atol=WEIGHT_ATOL, lr=LR, steps=STEPS)
    assert (expected["values"][1] - expected["values"][0]).abs().max() > 100 * ATOL  # step 1 moved the critic


@pytest.mark.slow
@pytest.mark.parametrize("rank", range(WORLD))
def test_sft_with_sp2_equals_one_process(two_rank_results, one_process_results, rank):
    got, expected = two_rank_results[rank]["sft"], one_process_results["sft"]
    for a, b in zip(got["metrics"], expected["metrics"]):
        assert_close_dicts(a, b, keys=("train/loss", "train/grad_norm", "train/num_target_tokens"))
    assert_adamw_weights_close(got["weights"], expected["weights"], atol=WEIGHT_ATOL, lr=LR, steps=STEPS)
    assert expected["metrics"][1]["train/loss"] < expected["metrics"][0]["train/loss"]  # the step did something


# ---------------------------------------------------------------- single-process pieces (fast)
def test_a_row_is_cut_into_equal_slices_and_the_padding_is_its_own_unit():
    """31 tokens over 2 ranks: slices [0, 16) and [16, 32), one pad token in its own causal unit."""
    keep = torch.tensor([3, 4, 15, 16, 30])
    shards = [SequenceShard(SequenceParallel(size=2, rank=r), length=31, keep=keep) for r in range(2)]
    assert [(s.start, s.end) for s in shards] == [(0, 16), (16, 32)]
    assert shards[0].local_keep.tolist() == [3, 4, 15] and shards[1].local_keep.tolist() == [0, 14]
    assert (shards[0].own | shards[1].own).all() and not (shards[0].own & shards[1].own).any()
    row = torch.arange(31)[None]
    assert shards[1].slice(row, pad_value=-1).tolist() == [list(range(16, 31)) + [-1]]
    assert shards[0].layout([(0, 31)], [None]) == ([(0, 31), (31, 32)], [None, None])


def test_heads_that_do_not_split_over_the_group_are_a_clear_error():
    check_heads(num_heads=4, num_kv_heads=2, sp_size=2, key="k")
    check_heads(num_heads=4, num_kv_heads=1, sp_size=4, key="k")  # KV head repeated 4 times
    with pytest.raises(ConfigError, match="k=3 must divide the model's 4 attention heads"):
        check_heads(num_heads=4, num_kv_heads=2, sp_size=3, key="k")
    with pytest.raises(ConfigError, match="4 key/value heads: one must divide the other"):
        check_heads(num_heads=12, num_kv_heads=4, sp_size=6, key="k")


def test_sequence_parallel_needs_packed_rows_and_a_divisor_of_the_ranks(tiny_model_dir, tmp_path):
    from hybridflow.config.validate import validate_ppo_config, validate_sft_config

    base = [f"actor_rollout_ref.model.path={tiny_model_dir}", "trainer.backend=ray", "trainer.n_gpus_per_node=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "data.train_batch_size=8"]
    cfg = load_config(PPOConfig, [*base, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=3",
                                  "actor_rollout_ref.model.use_shared_prompt=False"])
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(cfg, check_paths=False)
    assert "ulysses_sequence_parallel_size=3 must divide the 4 ranks" in str(err.value)
    assert "set actor_rollout_ref.model.use_remove_padding=True" in str(err.value)
    cfg = load_config(PPOConfig, [*base, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                                  "actor_rollout_ref.model.use_remove_padding=True",
                                  "actor_rollout_ref.ref.ulysses_sequence_parallel_size=4"])
    with pytest.raises(ConfigError, match="ref.ulysses_sequence_parallel_size=4 differs"):
        validate_ppo_config(cfg, check_paths=False)
    cfg = load_config(PPOConfig, [*base, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                                  "actor_rollout_ref.model.use_remove_padding=True"])
    validate_ppo_config(cfg, check_paths=False)
    assert cfg.actor_rollout_ref.ref.ulysses_sequence_parallel_size == 2  # follows the actor
    sft = load_config(SFTConfig, [f"model.partial_pretrain={tiny_model_dir}", "ulysses_sequence_parallel_size=2"])
    with pytest.raises(ConfigError, match="set use_remove_padding=True"):
        validate_sft_config(sft, world_size=4, check_paths=False)
