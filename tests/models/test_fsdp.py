"""FSDP2 across 2 gloo ranks equals one process; DCP checkpoints reshard between world sizes.

One spawn of 2 ranks (module fixture) does all the distributed work and writes results
to files; the tests compare them with single-process references computed here from the
formula (token-mean cross-entropy, AdamW; SGD for the architectures). Tolerance: fp32, atol 1e-5 on weights
after AdamW for all but 1e-3 of a tensor's elements (tests/adamw_weights.py), 1e-6 after SGD (see :func:`sgd`).
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from hybridflow.errors import ConfigError, ModelError
from hybridflow.models.tiny import TINY_ARCHITECTURES, build_tiny_model
from tests.adamw_weights import assert_adamw_weights_close

WORLD = 2
STEPS = 2
ATOL = 1e-5
ADAMW_LR = 1e-2
SGD_LR = 0.3
SGD_ATOL = 1e-6


def token_batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """[4, 10] token ids and a mask with ragged valid lengths (so the token count matters)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 200, (4, 10), generator=gen)
    mask = (torch.arange(10).unsqueeze(0) < torch.tensor([[10], [6], [8], [3]])).long()
    return ids, mask


def summed_token_nll(model, ids, mask) -> torch.Tensor:
    """Sum over valid next-token predictions of -log p (the numerator of a token-mean loss)."""
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return (nll * mask[:, 1:]).sum()


def adamw(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=ADAMW_LR)


def sgd(params) -> torch.optim.Optimizer:
    """Plain SGD: a weight moves by ``lr x gradient``, so two runs' weights differ by ``lr x`` their gradients'
    rounding. AdamW divides each element by ``sqrt(v) + eps`` and carries the rounding of a near-zero gradient
    up to ``lr / eps`` times further (1e6 here): Mixtral's experts have such elements (1.7e-4 of them under
    1e-7 at the first step; none in Llama's or Gemma's weights), and summing the same batch row by row instead
    of at once, in ONE process without sharding, already moved an expert weight 2.2e-5 (Llama 6.4e-6) after
    two AdamW steps. AdamW is also nearly blind to a gradient off by a constant factor (a missing average over
    ranks shows only through eps); SGD shows it in every element."""
    return torch.optim.SGD(params, lr=SGD_LR)


def reference_training(arch: str = "llama", make_optimizer=adamw):
    """One process, whole batch, token-mean loss: what the sharded run must reproduce."""
    model, _ = build_tiny_model(arch, seed=0)
    optimizer = make_optimizer(model.parameters())
    ids, mask = token_batch()
    for _ in range(STEPS):
        optimizer.zero_grad()
        (summed_token_nll(model, ids, mask) / mask[:, 1:].sum()).backward()
        optimizer.step()
    return model, optimizer


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train_sharded_steps(model, rank: int, make_optimizer=adamw) -> torch.optim.Optimizer:
    """STEPS optimizer steps of a sharded ``model`` on this rank's half of the batch, one row per micro-batch."""
    from hybridflow.models.fsdp import micro_batch_sync

    optimizer = make_optimizer(model.parameters())
    ids, mask = token_batch()
    global_tokens = mask[:, 1:].sum()
    ids, mask = ids.chunk(WORLD)[rank], mask.chunk(WORLD)[rank]
    for _ in range(STEPS):
        optimizer.zero_grad()
        for i in range(2):  # one row per micro-batch; reduce-scatter only after the last
            with micro_batch_sync(model, index=i, count=2):
                # FSDP averages gradients over ranks: scale the global-normalised loss back up.
                (summed_token_nll(model, ids[i:i + 1], mask[i:i + 1]) / global_tokens * WORLD).backward()
        optimizer.step()
    return optimizer


def _rank_main(rank: int, port: int, out: str) -> None:
    """Per rank: shard, train with 2 micro-batches per step, gather, save DCP, load a 1-rank DCP."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from hybridflow.models.fsdp import full_state_dict, shard_model
    from hybridflow.models.sharded_checkpoint import load_sharded, save_sharded

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    mesh = init_device_mesh("cpu", (WORLD,))
    model, _ = build_tiny_model("llama", seed=0)
    shard_model(model, mesh=mesh, param_offload=True)
    optimizer = train_sharded_steps(model, rank)
    full = full_state_dict(model)
    torch.save(full, os.path.join(out, f"full_rank{rank}.pt"))
    save_sharded(os.path.join(out, "dcp_2ranks"), model=model, optimizer=optimizer)
    fresh, _ = build_tiny_model("llama", seed=7)
    shard_model(fresh, mesh=mesh)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    load_sharded(os.path.join(out, "dcp_1rank"), model=fresh, optimizer=fresh_opt)
    torch.save(full_state_dict(fresh), os.path.join(out, f"loaded_rank{rank}.pt"))
    dist.destroy_process_group()


SHARDED_ARCHS = ("gemma2", "mixtral")
"""Beyond llama: Gemma's four norms a layer and capped, windowed attention; Mixtral's 3-D expert weights."""


def _train_sharded(arch: str, mesh, out: str, rank: int) -> None:
    """The steps of ``_rank_main`` for ``arch``, sharded by its own decoder-layer class; saves the full weights."""
    from hybridflow.models.fsdp import full_state_dict, shard_model

    model, _ = build_tiny_model(arch, seed=0)
    shard_model(model, mesh=mesh)
    train_sharded_steps(model, rank, sgd)
    torch.save(full_state_dict(model), os.path.join(out, f"{arch}_rank{rank}.pt"))


def _rank_archs(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    for arch in SHARDED_ARCHS:
        _train_sharded(arch, init_device_mesh("cpu", (WORLD,)), out, rank)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_archs(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("fsdp_archs"))
    mp.start_processes(_rank_archs, args=(_free_port(), out), nprocs=WORLD, start_method="spawn")
    return out


@pytest.mark.parametrize("arch", SHARDED_ARCHS)
def test_two_ranks_train_each_architecture_like_one_process(two_rank_archs, arch):
    """Trained with SGD (see :func:`sgd`): the weights carry the sharded gradients' rounding, not AdamW's
    amplification of it, so any real difference in what the ranks compute shows."""
    expected, _ = reference_training(arch, sgd)
    initial, _ = build_tiny_model(arch, seed=0)
    for rank in range(WORLD):
        assert_same_weights(torch.load(os.path.join(two_rank_archs, f"{arch}_rank{rank}.pt")), expected.state_dict(),
                            atol=SGD_ATOL)
    moved = max((expected.state_dict()[k] - v).abs().max() for k, v in initial.state_dict().items())
    assert moved > 1000 * SGD_ATOL  # the comparison is not vacuous: two steps changed the weights


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    from hybridflow.models.sharded_checkpoint import save_sharded

    out = str(tmp_path_factory.mktemp("fsdp"))
    one_rank, one_rank_opt = reference_training()
    save_sharded(os.path.join(out, "dcp_1rank"), model=one_rank, optimizer=one_rank_opt)
    mp.start_processes(_rank_main, args=(_free_port(), out), nprocs=WORLD, start_method="spawn")
    return out


def assert_same_weights(got: dict, expected: dict, atol: float = ATOL) -> None:
    assert set(got) == set(expected)
    for name, tensor in expected.items():
        assert got[name].shape == tensor.shape, name
        torch.testing.assert_close(got[name], tensor, atol=atol, rtol=0, msg=name)


def test_two_ranks_train_like_one_process(two_rank_run):
    expected, _ = reference_training()
    initial, _ = build_tiny_model("llama", seed=0)
    for rank in range(WORLD):  # the gathered weights are the same full tensors on every rank
        got = torch.load(os.path.join(two_rank_run, f"full_rank{rank}.pt"))
        assert_adamw_weights_close(got, expected.state_dict(), atol=ATOL, lr=ADAMW_LR, steps=STEPS)
    moved = max((expected.state_dict()[k] - v).abs().max() for k, v in initial.state_dict().items())
    assert moved > 100 * ATOL  # the comparison is not vacuous: two steps changed the weights


def test_dcp_saved_at_two_ranks_loads_at_one(two_rank_run):
    from hybridflow.models.sharded_checkpoint import load_sharded

    expected, expected_opt = reference_training()
    model, _ = build_tiny_model("llama", seed=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    load_sharded(os.path.join(two_rank_run, "dcp_2ranks"), model=model, optimizer=optimizer)
    assert_same_weights(model.state_dict(), expected.state_dict())
    got_state, want_state = optimizer.state_dict()["state"], expected_opt.state_dict()["state"]
    assert sorted(got_state) == sorted(want_state)
    for index, want in want_state.items():
        assert float(got_state[index]["step"]) == float(want["step"]) == STEPS
        torch.testing.assert_close(got_state[index]["exp_avg_sq"], want["exp_avg_sq"], atol=1e-7, rtol=1e-4)


def test_dcp_saved_at_one_rank_loads_at_two(two_rank_run):
    expected, _ = reference_training()
    for rank in range(WORLD):
        got = torch.load(os.path.join(two_rank_run, f"loaded_rank{rank}.pt"))
        assert_same_weights(got, expected.state_dict(), atol=0.0)


def test_merge_sharded_checkpoint_to_hf_folder(two_rank_run, tmp_path):
    from transformers import AutoModelForCausalLM

    from hybridflow.models.sharded_checkpoint import FSDPModelComponent, merge_sharded_checkpoint

    expected, _ = reference_training()
    component_dir = tmp_path / "actor"
    component_dir.mkdir()
    FSDPModelComponent(expected).save_to(str(component_dir))
    merged = merge_sharded_checkpoint(str(component_dir), str(tmp_path / "hf"))
    reloaded = AutoModelForCausalLM.from_pretrained(merged)
    assert_same_weights(reloaded.state_dict(), expected.state_dict(), atol=0.0)


def test_component_round_trip_restores_scheduler_and_rng(tmp_path):
    from hybridflow.models.sharded_checkpoint import FSDPModelComponent

    model, _ = build_tiny_model("llama", seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 ** step)
    scheduler.step()
    FSDPModelComponent(model, optimizer, scheduler).save_to(str(tmp_path))
    after_save = torch.rand(3)
    other, _ = build_tiny_model("llama", seed=5)
    other_opt = torch.optim.AdamW(other.parameters(), lr=1.0)
    other_sched = torch.optim.lr_scheduler.LambdaLR(other_opt, lambda step: 0.5 ** step)
    FSDPModelComponent(other, other_opt, other_sched).load_from(str(tmp_path))
    assert other_opt.param_groups[0]["lr"] == 0.5  # 1.0 * 0.5 ** 1
    assert torch.equal(torch.rand(3), after_save)  # RNG continues where the save left it
    assert_same_weights(other.state_dict(), model.state_dict(), atol=0.0)


def test_bad_precision_and_missing_checkpoint_name_the_fix(tmp_path):
    from hybridflow.models.fsdp import resolve_precision
    from hybridflow.models.sharded_checkpoint import load_sharded

    model, _ = build_tiny_model("llama", seed=0)
    with pytest.raises(ConfigError, match="not one of fp32"):
        resolve_precision("fp8")
    with pytest.raises(ConfigError, match="not one of fp32"):
        resolve_precision({"param_dtype": "fp8"})
    with pytest.raises(ConfigError, match="no key 'param_dypte'"):
        resolve_precision({"param_dypte": "bf16"})
    with pytest.raises(ModelError, match="not a DCP checkpoint"):
        load_sharded(str(tmp_path), model=model)


def test_micro_batch_sync_is_a_no_op_on_an_unsharded_model():
    from hybridflow.models.fsdp import micro_batch_sync

    model, _ = build_tiny_model("llama", seed=0)
    with micro_batch_sync(model, index=0, count=2):
        summed_token_nll(model, *token_batch()).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES)
def test_each_architecture_shards_its_own_decoder_layer_class(arch, tiny_tokenizer):
    from hybridflow.models.fsdp import decoder_layers, layer_classes

    model, _ = build_tiny_model(arch, tokenizer=tiny_tokenizer)
    expected = type(model.model.layers[0]).__name__  # e.g. Gemma2DecoderLayer, MixtralDecoderLayer
    assert layer_classes(model) == [expected]
    assert {id(layer) for layer in decoder_layers(model)} == {id(layer) for layer in model.model.layers}
    assert len(decoder_layers(model, [expected])) == model.config.num_hidden_layers


def test_a_wrap_class_the_model_lacks_is_one_line_naming_its_classes(tiny_tokenizer):
    from hybridflow.models.fsdp import decoder_layers

    model, _ = build_tiny_model("llama", tokenizer=tiny_tokenizer)
    with pytest.raises(ConfigError, match=r"transformer_layer_cls_to_wrap=\['Qwen2DecoderLayer'\] names no module "
                                          r"of this model; its classes: .*LlamaDecoderLayer"):
        decoder_layers(model, ["Qwen2DecoderLayer"])
