"""The Triton grouped experts (hybridflow/rollout/triton_moe.py) against torch: the pair alignment by hand and by its
invariants, the two grouped GEMMs against a per-token fp64 reference and :func:`grouped_experts`, and whole tiny
Mixtral / Qwen3-MoE decode steps. Compiled on a GPU, interpreted on CPU (tests/conftest.py sets TRITON_INTERPRET)."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
pytestmark = pytest.mark.triton

from hybridflow.rollout.moe import ExpertWeights, grouped_experts, moe_mlp, route  # noqa: E402
from hybridflow.rollout.triton_moe import align_pairs, grouped_swiglu_experts, slot_bound  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HIDDEN, INTERMEDIATE = 32, 24  # neither a multiple of the other; 2 I = 48 spans a partial column tile
BF16_TOLERANCE = 3e-2 if DEVICE == "cpu" else 2e-2
"""Relative error of a bf16 layer against the exact sum (torch's own bf16 experts reach 0.8 % on these shapes):
Triton's interpreter rounds fp32 -> bf16 toward zero (a GPU to nearest), a bias of up to 2^-8 at each of the five
roundings (2.1 % at worst here)."""


def random_experts(experts: int, top_k: int, *, dtype=torch.float32, seed: int = 0) -> ExpertWeights:
    generator = torch.Generator().manual_seed(seed)

    def weights(*shape, scale):
        return (torch.randn(*shape, generator=generator) * scale).to(device=DEVICE, dtype=dtype)

    return ExpertWeights(router=weights(experts, HIDDEN, scale=1.0), gate_up=weights(experts, 2 * INTERMEDIATE, HIDDEN,
                         scale=HIDDEN**-0.5), down=weights(experts, HIDDEN, INTERMEDIATE, scale=INTERMEDIATE**-0.5),
                         top_k=top_k, renormalize=False, weights_in_activation_dtype=False)


def per_token_reference(hidden, weights, ids, experts: ExpertWeights) -> torch.Tensor:
    """``sum_j w_j down_e(silu(gate_e x) * up_e x)`` one token and one choice at a time, in fp64."""
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    for n in range(hidden.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[n, j])
            gate, up = (experts.gate_up[e].double() @ hidden[n].double()).chunk(2)
            out[n] += float(weights[n, j]) * (experts.down[e].double() @ (F.silu(gate) * up)).cpu()
    return out


def check_grouped(hidden, weights, ids, experts, *, dtype):
    got = grouped_swiglu_experts(hidden, weights, ids, experts.gate_up, experts.down)
    expected = per_token_reference(hidden, weights, ids, experts)
    assert got.shape == hidden.shape and got.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got.double().cpu(), expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got, grouped_experts(hidden, weights, ids, experts, F.silu), rtol=1e-5, atol=1e-5)
    else:  # bf16: rounded where HF rounds; loose against the exact sum
        assert (got.double().cpu() - expected).norm() / expected.norm() < BF16_TOLERANCE


@pytest.mark.parametrize("count", [1, 3, 17, 64])
@pytest.mark.parametrize("experts", [4, 8, 16])
@pytest.mark.parametrize("top_k", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_experts_equal_the_per_token_sum(count, experts, top_k, dtype):
    """Routed by a random router: with 1 or 3 tokens most experts get none; 17 and 64 tokens fill blocks unevenly."""
    layer = random_experts(experts, top_k, dtype=dtype, seed=count * experts + top_k)
    hidden = torch.randn(count, HIDDEN, generator=torch.Generator().manual_seed(count)).to(DEVICE, dtype)
    weights, ids = route(hidden, layer)
    check_grouped(hidden, weights, ids, layer, dtype=dtype)


@pytest.mark.parametrize("count, top_k", [(17, 1), (64, 2), (5, 4)])
def test_grouped_experts_with_every_token_on_the_same_experts(count, top_k):
    """Every token picks experts 0 .. k - 1 (the others idle); 17 pairs is one block and a row past it."""
    layer = random_experts(8, top_k, seed=top_k)
    hidden = torch.randn(count, HIDDEN, device=DEVICE)
    ids = torch.arange(top_k, device=DEVICE).repeat(count, 1).flip(-1)
    weights = torch.rand(count, top_k, device=DEVICE) + 0.5
    check_grouped(hidden, weights, ids, layer, dtype=torch.float32)


def test_alignment_places_each_pair_in_its_experts_block():
    """Pairs p = n k + j of ids [[2, 0], [2, 1], [2, 0]], 4 experts, blocks of 4: expert 0 holds pairs 1 and 5,
    expert 1 pair 3, expert 2 pairs 0, 2, 4, expert 3 none; each group padded with 6 (past the last pair)."""
    ids = torch.tensor([[2, 0], [2, 1], [2, 0]], device=DEVICE)
    blocks = align_pairs(ids, experts=4, block_m=4)
    pad = 6
    assert blocks.sorted_pairs.shape == (slot_bound(6, 4, 4),) == (20,)  # 6 pairs + 4 groups' padding, whole blocks
    assert blocks.sorted_pairs.tolist() == [1, 5, pad, pad, 3, pad, pad, pad, 0, 2, 4, pad] + [pad] * 8
    assert blocks.block_expert.tolist() == [0, 1, 2, 4, 4]  # blocks past the used slots: E
    assert blocks.used_slots.tolist() == [12]


@pytest.mark.parametrize("count, experts, top_k, block_m", [(1, 16, 4, 16), (17, 8, 2, 16), (64, 4, 4, 16),
                                                             (33, 16, 2, 4)])
def test_alignment_invariants(count, experts, top_k, block_m):
    """Every pair once, in a block of its own expert, ascending within the expert; each used block holds one expert's
    pairs (at least one); padding only at a group's end; the used slots are whole blocks."""
    ids = torch.stack([torch.randperm(experts)[:top_k] for _ in range(count)]).to(DEVICE)
    blocks = align_pairs(ids, experts=experts, block_m=block_m)
    pairs = count * top_k
    sorted_pairs, block_expert = blocks.sorted_pairs.cpu(), blocks.block_expert.cpu()
    used = int(blocks.used_slots)
    assert used % block_m == 0 and len(sorted_pairs) >= used
    assert sorted(p for p in sorted_pairs.tolist() if p < pairs) == list(range(pairs))
    assert (sorted_pairs[used:] == pairs).all() and (block_expert[used // block_m:] == experts).all()
    flat = ids.reshape(-1).cpu()
    for b in range(used // block_m):
        block = sorted_pairs[b * block_m:(b + 1) * block_m]
        real = block[block < pairs]
        assert len(real) > 0 and (flat[real.long()] == block_expert[b]).all()
        assert (block[: len(real)] == real).all()  # padding only after the pairs
    assert (block_expert[: used // block_m].diff() >= 0).all()
    for e in range(experts):  # an expert's pairs in ascending order, all in its blocks
        mine = torch.cat([sorted_pairs[b * block_m:(b + 1) * block_m] for b in range(used // block_m)
                          if block_expert[b] == e] or [torch.tensor([], dtype=torch.int32)])
        assert mine[mine < pairs].tolist() == (flat == e).nonzero().squeeze(1).tolist()


def test_moe_mlp_takes_the_triton_path_only_when_graph_safe_and_switched_on():
    layer = random_experts(8, 2)
    layer.renormalize = True
    hidden = torch.randn(9, HIDDEN, device=DEVICE)
    assert layer.triton_grouped == (DEVICE == "cuda")  # CPU keeps the torch paths
    layer.triton_grouped = True
    triton_out = moe_mlp(hidden, layer, F.silu, graph_safe=True)
    torch.testing.assert_close(triton_out, moe_mlp(hidden, layer, F.silu), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_moe_decode_step_through_the_triton_experts_equals_the_torch_step(tiny_tokenizer, arch):
    """The whole graph-safe decode step with every MoE layer's experts as the Triton grouped GEMMs against the
    host-sized step (grouped_experts, torch ops): same logits."""
    from hybridflow.models.tiny import build_tiny_model
    from hybridflow.rollout.decoder import LlamaFamilyDecoder
    from tests.rollout.conftest import chat_prompts, prefilled_paged_cache, randomise_norms

    model, tokenizer = build_tiny_model(arch, seed=1, tokenizer=tiny_tokenizer)
    decoder = LlamaFamilyDecoder(randomise_norms(model).to(DEVICE))
    prompts = [torch.tensor(p, device=DEVICE) for p in chat_prompts(tokenizer)[:3]]
    (torch_cache, tables, positions), (triton_cache, _, _) = (prefilled_paged_cache(decoder, prompts, device=DEVICE)
                                                              for _ in range(2))
    tokens = torch.tensor([5, 6, 7], device=DEVICE)
    moe_layers = [layer.experts for layer in decoder.layers if layer.experts is not None]
    assert moe_layers
    for experts in moe_layers:
        experts.triton_grouped = False
    expected = decoder.decode(token_ids=tokens, positions=positions, cache=torch_cache, block_tables=tables,
                              context=int(positions.max()) + 1)
    for experts in moe_layers:
        experts.triton_grouped = True
    got = decoder.decode(token_ids=tokens, positions=positions, cache=triton_cache, block_tables=tables, context=None)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)



HOPPER_COMPILE = """
import inspect, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from hybridflow.rollout.triton_moe import _grouped_gemm_kernel as kernel

constants = json.loads(sys.argv[1])
names = list(inspect.signature(kernel.fn).parameters)
types = ["*bf16", "*bf16", "*bf16", "*i32", "*i32", "*i32", "*fp32"] + ["i32"] * 6
signature = {name: "constexpr" if name in constants else kind for name, kind in zip(names, types)}
source = ASTSource(fn=kernel, signature=signature, constexprs={(names.index(k),): v for k, v in constants.items()})
print(triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"])
"""
"""Compiles ``_grouped_gemm_kernel`` with bf16 tensors for sm_90 (H100 / H200) and prints its PTX: Triton's own ptxas
builds the cubin without a GPU. In a fresh process: one that imported Triton interpreting cannot compile."""


@pytest.mark.parametrize("swiglu", [True, False])  # gate|up with SwiGLU; down with the routing weights
def test_grouped_gemm_compiles_for_hopper_on_tensor_cores(swiglu):
    """What the interpreter never checks (types, layouts, the tensor-core lowering), on CPU: the bf16 kernels of
    Qwen3-30B-A3B's shape compile for sm_90 and multiply on tensor cores (``mma``)."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    constants = dict(ROWS_PER_X=8 if swiglu else 1, COLUMNS=768 if swiglu else 2048, DEPTH=2048 if swiglu else 768,
                     SWIGLU=swiglu, WEIGHTED=not swiglu, WIDEN=False, PRECISION="tf32", BLOCK_M=16, BLOCK_N=64,
                     BLOCK_K=64)
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", HOPPER_COMPILE, json.dumps(constants)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "mma.sync" in done.stdout


def test_alignment_traces_as_one_graph():
    """No host values (``int(t)``, ``.item()``, ``.tolist()`` break the graph): what a CUDA graph needs, checked on CPU
    by ``torch.compile(fullgraph=True)``. (It cannot see CUDA's ``bincount`` reading its maximum back, which
    :func:`align_pairs` avoids by construction.)"""
    ids = torch.tensor([[2, 0], [2, 1], [2, 0]], device=DEVICE)
    torch._dynamo.reset()
    traced = torch.compile(align_pairs, fullgraph=True, backend="eager")(ids, 4, 4)  # a graph break raises here
    eager = align_pairs(ids, 4, 4)
    for name in ("sorted_pairs", "block_expert", "used_slots"):
        assert torch.equal(getattr(traced, name), getattr(eager, name)), name
