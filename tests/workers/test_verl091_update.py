"""Where the same keys used to train differently from verl 0.9.1 (issue 49): the clip range the defaults give,
the gradient-clip threshold, the entropy metrics and their aggregation, and the dynamic micro-batch partition.
Expected values are worked by hand from verl 0.9.1's code (``core_algos``, ``losses.ppo_loss``,
``engine_workers.train_mini_batch``, ``seqlen_balancing``); the LR schedule and the compute dtype are tested in
tests/workers/test_optim_and_micro_batches.py and tests/models/test_training_precision.py."""

import math
from collections import defaultdict

import pytest
import torch

from hybridflow.algos import get_policy_loss
from hybridflow.config import PPOConfig, load_config, validate_ppo_config
from hybridflow.config.verl_versions import grad_clip_threshold, version_notes
from hybridflow.data.balance import balance_partitions
from hybridflow.data.parallel import LOCAL
from hybridflow.errors import ConfigError
from hybridflow.trainer.loop.ppo_update import pre_update_entropy
from hybridflow.trainer.roles.builders import build_critic_worker, build_hybrid_engine, policy_objective
from hybridflow.workers.micro_batches import balanced_token_groups
from hybridflow.data.batch import Batch
from hybridflow.workers.optim import TrainState, build_optimizer, build_scheduler
from hybridflow.workers.ppo_update import UpdateSchedule, averaged, optimizer_step, ppo_mini_batches
from tests.workers.test_verl_worker_keys import _batch

MODEL = "actor_rollout_ref.model.path=/models/tiny"


def ppo(*overrides):
    return load_config(PPOConfig, [MODEL, *overrides])


# ------------------------------------------------------------------ 2. clip_ratio against clip_ratio_low/high
def _clipfrac(actor_cfg) -> float:
    """pg_clipfrac of one token whose ratio is 1.15 with a positive advantage: clipped under eps 0.1, not 0.2."""
    objective = policy_objective(actor_cfg, rollout_correction=None, max_response_length=1, setting=None)
    _, metrics = get_policy_loss(objective.loss_mode)(
        old_log_prob=torch.zeros(1, 1), log_prob=torch.full((1, 1), math.log(1.15)), advantages=torch.ones(1, 1),
        response_mask=torch.ones(1, 1), loss_agg_mode="token-mean", clip_ratio=objective.clip_ratio,
        clip_ratio_low=objective.clip_ratio_low, clip_ratio_high=objective.clip_ratio_high)
    return float(metrics["pg_clipfrac"])


def test_clip_ratio_alone_changes_nothing_as_in_verl_09_and_is_said_once():
    only = ppo("actor_rollout_ref.actor.clip_ratio=0.1").actor_rollout_ref.actor
    assert (only.clip_ratio_low, only.clip_ratio_high) == (0.2, 0.2)  # verl 0.9's actor.yaml defaults
    assert _clipfrac(only) == 0.0  # the range used is 1 +- 0.2: ratio 1.15 is inside
    (line,) = version_notes(ppo("actor_rollout_ref.actor.clip_ratio=0.1"), with_critic=False)
    assert "clip_ratio=0.1 has no effect" in line and "clip_ratio_low=0.2" in line
    # the bounds themselves, or null bounds falling back to clip_ratio, are what a user means: no line
    both = ppo("actor_rollout_ref.actor.clip_ratio_low=0.1", "actor_rollout_ref.actor.clip_ratio_high=0.1")
    assert _clipfrac(both.actor_rollout_ref.actor) == 1.0 and version_notes(both, with_critic=False) == []
    fallback = ppo("actor_rollout_ref.actor.clip_ratio=0.1", "actor_rollout_ref.actor.clip_ratio_low=null",
                   "actor_rollout_ref.actor.clip_ratio_high=null")
    assert _clipfrac(fallback.actor_rollout_ref.actor) == 1.0 and version_notes(fallback, with_critic=False) == []


# ------------------------------------------------------------------ 3. gradient clipping
@pytest.mark.parametrize("overrides,threshold,says", [
    ((), 1.0, False),  # verl 0.9's optim.clip_grad default
    (("actor_rollout_ref.actor.optim.clip_grad=0.5",), 0.5, False),
    (("actor_rollout_ref.actor.optim.grad_clip=0.3",), 0.3, False),  # verl 0.9's deprecated spelling wins
    (("actor_rollout_ref.actor.grad_clip=0.2",), 0.2, True),  # verl < 0.9's key: it clips, and says verl 0.9 would not
    (("actor_rollout_ref.actor.grad_clip=0",), 0, True),  # hybridflow's "<= 0: no clipping", said the same way
    # a full verl 0.9 YAML carries grad_clip: 1.0 next to the clip_grad the user changed: clip_grad decides
    (("actor_rollout_ref.actor.grad_clip=1.0", "actor_rollout_ref.actor.optim.clip_grad=0.5"), 0.5, False),
])
def test_actor_clip_threshold(overrides, threshold, says):
    cfg = ppo(*overrides)
    actor = cfg.actor_rollout_ref.actor
    got, line = grad_clip_threshold("actor_rollout_ref.actor", actor.grad_clip, actor.optim)
    assert got == threshold
    assert (line is not None) == says
    if says:
        assert "verl 0.9 ignores" in line and "clips at actor_rollout_ref.actor.optim.clip_grad (1.0)" in line


def test_grad_clip_and_clip_grad_that_disagree_are_refused_in_one_line():
    cfg = ppo("actor_rollout_ref.actor.grad_clip=0.2", "actor_rollout_ref.actor.optim.clip_grad=0.5")
    with pytest.raises(ConfigError) as err:
        validate_ppo_config(cfg, check_paths=False)
    (line,) = [line for line in str(err.value).splitlines() if "grad_clip" in line]
    assert "set only actor_rollout_ref.actor.optim.clip_grad" in line


def test_workers_clip_at_the_resolved_threshold(tiny_model_dir):
    model = f"actor_rollout_ref.model.path={tiny_model_dir}"
    cfg = load_config(PPOConfig, [model, "algorithm.adv_estimator=gae", "actor_rollout_ref.actor.optim.clip_grad=0.3",
                                  "critic.grad_clip=0.7", "actor_rollout_ref.actor.ppo_mini_batch_size=2"])
    actor = build_hybrid_engine(LOCAL, cfg=cfg, total_steps=2, with_rollout=False).actor
    assert actor.state.grad_clip == 0.3
    assert build_critic_worker(LOCAL, cfg=cfg, total_steps=2).critic.state.grad_clip == 0.7
    assert version_notes(cfg, with_critic=True)[0].startswith("critic.grad_clip=0.7 clips")


# ------------------------------------------------------------------ 5. entropy metrics
def test_pre_update_entropy_is_aggregated_by_loss_agg_mode():
    entropy = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    cfg = ppo("data.max_response_length=4")
    assert pre_update_entropy(entropy, mask, cfg) == pytest.approx(6 / 3)  # token-mean: (1 + 2 + 3) / 3 tokens
    cfg = ppo("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean")
    assert pre_update_entropy(entropy, mask, cfg) == pytest.approx((1.5 + 3.0) / 2)
    cfg = ppo("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm", "data.max_response_length=4")
    assert pre_update_entropy(entropy, mask, cfg) == pytest.approx((3 / 4 + 3 / 4) / 2)


def _update(tiny_model_dir, *overrides):
    cfg = load_config(PPOConfig, [f"actor_rollout_ref.model.path={tiny_model_dir}", "algorithm.adv_estimator=grpo",
                                  "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=2",
                                  *overrides])
    actor = build_hybrid_engine(LOCAL, cfg=cfg, total_steps=2, with_rollout=False).actor
    batch = _batch()
    batch["old_log_probs"], entropy = actor.compute_log_prob(batch, temperature=1.0)
    batch["advantages"] = torch.linspace(-1, 1, len(batch))[:, None].expand_as(entropy).contiguous()
    return actor.update_policy(batch, temperature=1.0, step=1), entropy, batch["response_mask"]


def test_entropy_coeff_logs_verl_s_entropy_loss_and_leaves_the_pre_update_entropy(tiny_model_dir):
    metrics, entropy, mask = _update(tiny_model_dir, "actor_rollout_ref.actor.entropy_coeff=0.01")
    assert "actor/entropy" not in metrics  # the trainer's pre-update value is not overwritten
    # one mini-batch, one epoch: the training forward sees the pre-update weights; token-mean over the batch
    assert metrics["actor/entropy_loss"] == pytest.approx((entropy * mask).sum().item() / mask.sum().item(), rel=1e-5)
    plain, _, _ = _update(tiny_model_dir)
    assert "actor/entropy_loss" not in plain and "actor/entropy" not in plain
    asked, _, _ = _update(tiny_model_dir, "actor_rollout_ref.actor.calculate_entropy=True")  # verl's key
    assert asked["actor/entropy_loss"] == pytest.approx(metrics["actor/entropy_loss"], rel=1e-5)


def test_micro_batch_metrics_are_averaged_per_step_then_over_steps():
    """verl: Metric MEAN within a mini-batch, then np.mean over mini-batches; not one flat mean over micro-batches.
    The "micro-batches" here are the metric values themselves; the loss is the real layer's, times 0."""
    layer = torch.nn.Linear(1, 1)
    optimizer = build_optimizer(layer.parameters(), lr=0.0, betas=(0.9, 0.999), weight_decay=0.0)
    state = TrainState(layer, optimizer, build_scheduler(optimizer, warmup_steps=0, total_steps=1, style="constant"),
                       grad_clip=1.0)

    def loss_fn(value):
        return layer(torch.ones(1, 1)).sum() * 0, {"loss": 0.0}, {"pg_clipfrac": value}

    metrics = defaultdict(list)
    optimizer_step(state=state, dp=LOCAL, micros=[1.0, 3.0], loss_fn=loss_fn, metrics=metrics)
    optimizer_step(state=state, dp=LOCAL, micros=[5.0], loss_fn=loss_fn, metrics=metrics)
    assert averaged(metrics, prefix="actor/")["actor/pg_clipfrac"] == 3.5  # (2 + 5) / 2; a flat mean gives 3


# ------------------------------------------------------------------ 5. dynamic micro-batches
def test_karmarkar_karp_breaks_ties_as_verl():
    # verl's Set order: by sum, then size, then items: of two equal one-row parts the later row's comes first
    assert balance_partitions([1, 1], 2) == [[1], [0]]


def test_dynamic_micro_batches_are_verl_s_balanced_partition():
    """Lengths 9, 8, 7, 5, 4, 3 under a 14-token budget, by hand (verl's rearrange_micro_batches):
    ceil(36 / 14) = 3 micro-batches; workloads 24576 L + L^2 order like L, so Karmarkar-Karp pairs
    {9, 3}, {8, 4}, {7, 5} (12 tokens each, all within 14); by workload, heaviest first: rows [0, 5], [1, 4],
    [2, 3]; then the even places reversed ahead of the odd: [2, 3], [0, 5], [1, 4].
    Consecutive cutting would give [9], [8], [7, 5], [4, 3]."""
    assert balanced_token_groups([9, 8, 7, 5, 4, 3], 14) == [[2, 3], [0, 5], [1, 4]]
    lengths = torch.tensor([9, 8, 7, 5, 4, 3])
    batch = Batch.from_dict(tensors={"attention_mask": (torch.arange(10)[None, :] < lengths[:, None]).long(),
                                     "response_mask": torch.ones(6, 2), "row": torch.arange(6)})
    schedule = UpdateSchedule(mini_batch_size=6, use_dynamic_bsz=True, max_token_len=14)
    ((_, micros),) = list(ppo_mini_batches(batch, schedule=schedule, dp=LOCAL, seed=0, step=0))
    assert [m["row"].tolist() for m in micros] == [[2, 3], [0, 5], [1, 4]]


def test_a_row_longer_than_the_budget_gets_a_micro_batch_of_its_own():
    assert balanced_token_groups([20, 1, 1], 10) == [[1], [0], [2]]


def _two_rank_groups(rank: int, port: int, out: str) -> None:
    import json
    import os

    import torch.distributed as dist

    from hybridflow.data.parallel import DataParallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    lengths = [[9, 8, 7, 5, 4, 3], [2, 2, 2, 2, 2, 2]][rank]
    groups = balanced_token_groups(lengths, 14, dp=DataParallel(world_size=2, rank=rank))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump(groups, fh)
    dist.destroy_process_group()


@pytest.mark.slow  # two spawned processes: ~35 s on the shared 2-core machine
def test_ranks_agree_on_the_micro_batch_count(tmp_path):
    """verl syncs the count with an all-reduce MAX: rank 1's 12 tokens alone would make 1 micro-batch, rank 0's 36
    make 3, so both run 3 (rank 1: six 2-token rows balanced as 2 + 2 + 2 rows)."""
    import json

    import torch.multiprocessing as mp

    from tests.models.test_fsdp import _free_port

    mp.start_processes(_two_rank_groups, args=(_free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    got = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert got[0] == [[2, 3], [0, 5], [1, 4]]
    assert len(got[1]) == 3 and sorted(sum(got[1], [])) == list(range(6)) and all(len(g) == 2 for g in got[1])
