"""Training-side keys of the model and FSDP sections: dtype / mixed precision, optimizer offload,
HSDP (``fsdp_size``), entropy checkpointing and torch.compile of the log-prob math."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from hybridflow.config import PPOConfig, load_config
from hybridflow.trainer.roles.builders import build_hybrid_engine
from hybridflow.models import compute_log_probs
from hybridflow.models.tiny import build_tiny_model
from hybridflow.data.parallel import LOCAL
from hybridflow.workers.optim import TrainState, move_optimizer_state
from tests.models.test_fsdp import STEPS, _free_port, assert_same_weights, reference_training, summed_token_nll, token_batch
from tests.workers.test_verl_worker_keys import _batch


def _engine(model_dir, *overrides):
    cfg = load_config(PPOConfig, [f"actor_rollout_ref.model.path={model_dir}", "algorithm.adv_estimator=grpo",
                                  "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=2",
                                  "actor_rollout_ref.actor.use_kl_loss=True", *overrides])
    return build_hybrid_engine(LOCAL, cfg=cfg, total_steps=2)


def _linear_output_dtypes(model, run) -> set[torch.dtype]:
    seen = set()
    layer = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    handle = layer.register_forward_hook(lambda mod, args, out: seen.add(out.dtype))
    try:
        run()
    finally:
        handle.remove()
    return seen


# ------------------------------------------------------------------ dtype
def test_model_dtype_bf16_computes_in_bf16_with_fp32_weights(tiny_model_dir):
    batch = _batch()
    fp32 = _engine(tiny_model_dir, "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32")
    bf16 = _engine(tiny_model_dir, "actor_rollout_ref.model.dtype=bf16")
    actor = bf16.actor
    assert {p.dtype for p in actor.model.parameters()} == {torch.float32}  # master weights stay fp32
    dtypes = _linear_output_dtypes(actor.model, lambda: actor.compute_log_prob(batch, temperature=1.0))
    assert dtypes == {torch.bfloat16}
    assert _linear_output_dtypes(bf16.reference.model, lambda: bf16.reference.compute_ref_log_prob(
        batch, temperature=1.0)) == {torch.bfloat16}
    got, _ = actor.compute_log_prob(batch, temperature=1.0)
    want, _ = fp32.actor.compute_log_prob(batch, temperature=1.0)
    mask = batch["response_mask"].bool()
    assert not torch.equal(got[mask], want[mask])  # it really ran in bf16 ...
    torch.testing.assert_close(got[mask], want[mask], atol=0.1, rtol=0.05)  # ... close to fp32 (8-bit mantissa)
    default = _engine(tiny_model_dir)
    unset = torch.bfloat16 if torch.cuda.is_available() else torch.float32  # verl's bf16 on a GPU, fp32 on a CPU
    assert _linear_output_dtypes(default.actor.model, lambda: default.actor.compute_log_prob(
        batch, temperature=1.0)) == {unset}


def test_fsdp_mixed_precision_wins_over_model_dtype_and_model_dtype_sets_the_weights(tiny_model_dir):
    engine = _engine(tiny_model_dir, "actor_rollout_ref.model.dtype=bf16",
                     "actor_rollout_ref.actor.fsdp_config.mixed_precision=fp32",
                     "actor_rollout_ref.ref.fsdp_config.model_dtype=bf16")
    dtypes = _linear_output_dtypes(engine.actor.model, lambda: engine.actor.compute_log_prob(_batch(), temperature=1.0))
    assert dtypes == {torch.float32}
    assert {p.dtype for p in engine.reference.model.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in engine.rollout.engine.model.parameters()} == {torch.float32}  # CPU engine: fp32
    held = _engine(tiny_model_dir, "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16")
    assert {p.dtype for p in held.actor.model.parameters()} == {torch.bfloat16}


def test_verl_mixed_precision_mapping_sets_the_compute_dtype(tiny_model_dir):
    batch = _batch()
    bf16 = _engine(tiny_model_dir, "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
                   "actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32")
    assert {p.dtype for p in bf16.actor.model.parameters()} == {torch.float32}
    assert _linear_output_dtypes(bf16.actor.model, lambda: bf16.actor.compute_log_prob(
        batch, temperature=1.0)) == {torch.bfloat16}
    fp32 = _engine(tiny_model_dir, "actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype: fp32}")
    assert _linear_output_dtypes(fp32.actor.model, lambda: fp32.actor.compute_log_prob(
        batch, temperature=1.0)) == {torch.float32}


def test_unset_precision_follows_verl_on_a_gpu_and_stays_fp32_on_a_cpu():
    from hybridflow.config import PPOConfig, load_config
    from hybridflow.models.fsdp import Precision, resolve_precision
    from hybridflow.trainer.roles.builders import training_precision

    cfg = load_config(PPOConfig, ["actor_rollout_ref.model.path=/models/tiny"])
    fsdp = cfg.actor_rollout_ref.actor.fsdp_config
    # verl's FSDP engine with no mixed_precision: bf16 compute, fp32 reduction
    assert training_precision(fsdp, device=torch.device("cuda")) == Precision(torch.bfloat16, torch.float32)
    assert training_precision(fsdp, device=torch.device("cpu")) == Precision(None, torch.float32)
    assert training_precision(fsdp, "fp32", device=torch.device("cuda")) == Precision(None)  # model.dtype decides
    # verl's mapping: each key defaults to verl's value, on any device
    assert resolve_precision({}, device_type="cpu") == Precision(torch.bfloat16, torch.float32)
    assert resolve_precision({"reduce_dtype": "bf16"}) == Precision(torch.bfloat16, torch.bfloat16)
    assert resolve_precision({"param_dtype": "fp32"}, device_type="cuda") == Precision(None, torch.float32)


# ------------------------------------------------------------------ optimizer offload
def _one_step(offload: bool):
    model, _ = build_tiny_model("llama", seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = TrainState(model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0), grad_clip=1.0,
                       offload_optimizer=offload)
    ids, mask = token_batch()
    for _ in range(2):
        state.zero_grad()
        loss = summed_token_nll(model, ids, mask) / mask[:, 1:].sum()
        loss.backward()
        state.step(loss_value=loss.item())
    return model, optimizer


def test_optimizer_offload_moves_the_state_between_steps_and_changes_no_number(monkeypatch):
    import hybridflow.workers.optim as optim

    calls = []
    real = optim.move_optimizer_state
    monkeypatch.setattr(optim, "move_optimizer_state", lambda opt, **kw: calls.append(kw["to_params"]) or real(opt, **kw))
    offloaded, _ = _one_step(offload=True)
    assert calls == [True, False, True, False]  # on the device for the update, back to CPU after it
    plain, _ = _one_step(offload=False)
    assert_same_weights(offloaded.state_dict(), plain.state_dict(), atol=0)


def test_move_optimizer_state_moves_every_state_tensor():
    model, optimizer = _one_step(offload=False)
    move_optimizer_state(optimizer, to_params=False, offload_device="meta")
    states = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    assert states and all(v.is_meta for v in states)


# ------------------------------------------------------------------ entropy checkpointing / compile
def _log_probs(model, ids, **switches):
    mask = torch.ones_like(ids)
    return compute_log_probs(model, input_ids=ids, attention_mask=mask, position_ids=None, response_length=6,
                             calculate_entropy=True, **switches)


def _saved_bytes(fn) -> int:
    total = [0]

    def pack(tensor):
        total[0] += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total[0]


def test_entropy_keeps_no_softmax_for_backward_with_or_without_entropy_checkpointing():
    """The fused log-prob + entropy (hybridflow.algos.logprob_and_entropy) recomputes the softmax in its backward, so
    the entropy adds no ``[B, T, V]`` tensor to what the forward keeps, with ``entropy_checkpointing`` or without it
    (verl's key then changes nothing), and the gradients are the same."""
    model, _ = build_tiny_model("llama", seed=0)
    ids = token_batch()[0]
    mask = torch.ones_like(ids)
    without_entropy = _saved_bytes(lambda: compute_log_probs(model, input_ids=ids, attention_mask=mask,
                                                             position_ids=None, response_length=6))
    grads, saved = [], []
    for checkpointing in (False, True):
        model.zero_grad()
        saved.append(_saved_bytes(lambda: _log_probs(model, ids, entropy_checkpointing=checkpointing)))
        log_probs, entropy = _log_probs(model, ids, entropy_checkpointing=checkpointing)
        (log_probs.sum() + entropy.sum()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    vocab_bytes = ids.shape[0] * 6 * model.config.vocab_size * 4  # one [B, T, V] fp32 tensor
    assert saved[0] == saved[1] and saved[0] - without_entropy < vocab_bytes / 100
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, msg=name)


def test_torch_compile_of_the_log_prob_math_gives_the_same_numbers():
    from torch._dynamo.utils import counters

    model, _ = build_tiny_model("llama", seed=0)
    ids = token_batch()[0]
    before = sum(counters["stats"].values())
    with torch.no_grad():
        eager = _log_probs(model, ids)
        compiled = _log_probs(model, ids, use_torch_compile=True)
    assert sum(counters["stats"].values()) > before  # dynamo really ran
    for want, got in zip(eager, compiled):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------ HSDP
def _hsdp_rank(rank: int, port: int, out: str) -> None:
    """fsdp_size=1 on 2 ranks: a 2-D mesh, each rank holds whole parameters (replicated), trains like one."""
    import torch.distributed as dist

    from hybridflow.models.fsdp import data_parallel_mesh, full_state_dict, shard_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    results = {}
    for fsdp_size in (1, 2):
        model, _ = build_tiny_model("llama", seed=0)
        mesh = data_parallel_mesh("cpu", 2, fsdp_size)
        shard_model(model, mesh=mesh)
        local = sum(p.to_local().numel() for p in model.parameters())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        ids, mask = token_batch()
        global_tokens = mask[:, 1:].sum()
        ids, mask = ids.chunk(2)[rank], mask.chunk(2)[rank]
        for _ in range(STEPS):
            optimizer.zero_grad()
            (summed_token_nll(model, ids, mask) / global_tokens * 2).backward()
            optimizer.step()
        results[fsdp_size] = {"mesh": tuple(mesh.shape), "local": local, "full": full_state_dict(model)}
    torch.save(results, os.path.join(out, f"hsdp_rank{rank}.pt"))
    dist.destroy_process_group()


def test_fsdp_size_builds_an_hsdp_mesh_that_trains_like_one_process(tmp_path):
    mp.start_processes(_hsdp_rank, args=(_free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    expected, _ = reference_training()
    total = sum(p.numel() for p in expected.parameters())
    for rank in range(2):
        results = torch.load(os.path.join(tmp_path, f"hsdp_rank{rank}.pt"))
        assert results[1]["mesh"] == (2, 1) and results[1]["local"] == total  # replicated: whole parameters
        assert results[2]["mesh"] == (2,) and results[2]["local"] < total  # sharded over both ranks
        for fsdp_size in (1, 2):
            assert_same_weights(results[fsdp_size]["full"], expected.state_dict())


def test_fsdp_size_must_divide_the_ranks():
    from hybridflow.errors import ConfigError
    from hybridflow.models.fsdp import data_parallel_mesh

    with pytest.raises(ConfigError, match="fsdp_size=3 does not divide the 4"):
        data_parallel_mesh("cpu", 4, 3)
