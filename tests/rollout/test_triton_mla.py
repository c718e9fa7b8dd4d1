"""The Triton decode attention of MLA (DeepSeek-V3) over the latent paged cache, against an fp64 reference and against
the decoder's torch step: compiled on a GPU, interpreted on CPU (tests/conftest.py sets ``TRITON_INTERPRET=1`` where
CUDA is absent). Skipped without Triton."""

import pytest
import torch

pytest.importorskip("triton")
pytestmark = pytest.mark.triton

from hybridflow.rollout.triton_attention import DecodeConfig  # noqa: E402
from hybridflow.rollout.triton_mla import mla_decode_attention  # noqa: E402
from tests.rollout.test_triton_kernels import scattered_tables  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def mla_reference(q, latents, lengths, tables, scale, rank):
    """fp64, expanded by hand: row ``n``'s first ``lengths[n]`` entries ``[c | k_pe]`` through its table; each head's
    scores ``q . entry``, softmax, the weighted latents ``c``; ``[N, H, rank]``."""
    out = []
    for n, length in enumerate(lengths):
        entries = latents[tables[n]].flatten(0, 1)[:length].double()  # [L, rank + rope]
        weights = torch.softmax(q[n].double() @ entries.T * scale, dim=-1)  # [H, L]
        out.append(weights @ entries[:, :rank])
    return torch.stack(out)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("config", [None, DecodeConfig(split_len=32, block_n=16)])  # one split a row; several
@pytest.mark.parametrize("heads, rank, rope", [(4, 24, 8), (20, 32, 16)])  # widths off powers of two; 2 head blocks
def test_mla_attention_reads_each_rows_latents_through_its_blocks(heads, rank, rope, config, dtype, tolerance):
    torch.manual_seed(heads)
    block_size = 8
    lengths = [1, 7, 8, 33, 64, 90]  # page (8), tile (16) and split (32) edges
    tables, blocks = scattered_tables(lengths, block_size=block_size, width=12, seed=heads)
    q = torch.randn(len(lengths), heads, rank + rope).to(dtype)
    latents = torch.randn(blocks, block_size, rank + rope).to(dtype)
    latents[0] = float("nan")  # poison the null block and what no row may read
    for row, length in enumerate(lengths):
        last, used = tables[row, (length - 1) // block_size], (length - 1) % block_size + 1
        latents[last, used:] = float("nan")
    scale = (rank + rope) ** -0.5
    got = mla_decode_attention(q=q.to(DEVICE), latents=latents.to(DEVICE), lengths=torch.tensor(lengths, device=DEVICE),
                               block_tables=tables.to(DEVICE), scale=scale, rank=rank, config=config)
    expected = mla_reference(q, latents, lengths, tables.long(), scale, rank)
    assert got.shape == (len(lengths), heads, rank) and got.dtype == dtype
    assert ((got.cpu().double() - expected).norm() / expected.norm()) < tolerance


def test_a_query_not_as_wide_as_the_cache_is_refused():
    q, latents = torch.zeros(1, 2, 32, device=DEVICE), torch.zeros(3, 8, 40, device=DEVICE)
    with pytest.raises(ValueError, match="share their last"):
        mla_decode_attention(q=q, latents=latents, lengths=torch.tensor([1], device=DEVICE), scale=1.0, rank=24,
                             block_tables=torch.ones(1, 1, dtype=torch.int32, device=DEVICE))


@pytest.mark.parametrize("variant", ["q_lora+interleaved", "q_proj+rotate_half"])
def test_the_graph_safe_triton_step_equals_the_torch_step(variant, monkeypatch):
    """One graph-safe decode step of a tiny DeepSeek-V3 (``context=None``: the Triton kernel over the pool, the sparse
    layer's routed experts Triton's grouped GEMMs) against the torch step over the same prefilled latents: logits and
    the cache."""
    from hybridflow.rollout import triton_moe
    from hybridflow.rollout.mla import MLADecoder
    from tests.rollout.conftest import chat_prompts, prefilled_paged_cache
    from tests.rollout.test_mla import VARIANTS, deepseek

    model, tokenizer = deepseek(**VARIANTS[variant])
    decoder = MLADecoder(model.to(DEVICE))
    prompts = [torch.tensor(p, device=DEVICE) for p in chat_prompts(tokenizer)]
    (torch_cache, tables, positions), (triton_cache, _, _) = (prefilled_paged_cache(decoder, prompts, device=DEVICE)
                                                              for _ in range(2))
    tokens = torch.tensor([5, 6, 7, 8], device=DEVICE)
    decoder.triton_kernels, decoder.paged_kernel = False, False  # the reference: SDPA over the gathered blocks
    expected = decoder.decode(token_ids=tokens, positions=positions, cache=torch_cache, block_tables=tables,
                              context=int(positions.max()) + 1)
    decoder.triton_kernels = True
    sparse = [moe.experts for moe in decoder.experts if moe is not None]
    for experts in sparse:
        experts.triton_grouped = True  # as on CUDA
    grouped, calls = triton_moe.grouped_swiglu_experts, []
    monkeypatch.setattr(triton_moe, "grouped_swiglu_experts", lambda *a, **k: calls.append(1) or grouped(*a, **k))
    got = decoder.decode(token_ids=tokens, positions=positions, cache=triton_cache, block_tables=tables, context=None)
    assert sparse and len(calls) == len(sparse)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(triton_cache.data, torch_cache.data, rtol=1e-5, atol=1e-5)


def test_the_engine_decodes_deepseek_through_the_triton_step_as_hf():
    """The engine's runner takes the graph-safe step once the decoder says it has the Triton kernels (on CPU: set by
    hand, run interpreted and eagerly): ragged prompts, two samples each, chunked prefill and too few blocks
    (preemption): HF's greedy tokens and the log-probs of HF's forward within 1e-5."""
    from hybridflow.rollout import SamplingParams
    from hybridflow.rollout.native import NativeEngine
    from tests.rollout.test_chunked_prefill import mixed_prompts
    from tests.rollout.test_mla import deepseek
    from tests.rollout.test_paged_engine import assert_greedy_as_hf, tight_blocks

    model, tokenizer = deepseek(kv_lora_rank=24)
    prompts, eos = mixed_prompts(tokenizer), tokenizer.eos_token_id
    params = SamplingParams(n=2, temperature=0, max_tokens=12, stop_token_ids=[eos], logprobs=True)
    engine = NativeEngine(model.to(DEVICE), tokenizer, max_num_seqs=5, max_num_batched_tokens=17,
                          enable_chunked_prefill=True, num_kv_blocks=tight_blocks(prompts, 12, spare=3),
                          decode_lanes=False, enforce_eager=True, max_model_len=max(map(len, prompts)) + 12)
    engine.decoder.triton_kernels = True
    calls = []
    step = engine.decoder._triton_attend
    engine.decoder._triton_attend = lambda *a, **k: calls.append(1) or step(*a, **k)
    assert_greedy_as_hf(engine, model, prompts, params, eos=eos)
    assert calls  # the Triton kernel ran


def test_the_chosen_mla_kernel_compiles_for_sm90():
    """Compiled for an H100 / H200 on this machine (Triton's own ptxas; no GPU) at DeepSeek-V3's shape (128 heads,
    latents of 512 + 64, bf16, 64 rows over 2,048 positions): it builds, the software pipeliner keeps the tile of
    latents (both as keys ``[512, n]`` and as values ``[n, 512]``) in shared memory a stage ahead, and two programs fit
    an SM (registers and shared memory)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import triton

    from hybridflow.rollout.triton_mla import mla_config

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists():
        pytest.skip("this Triton has no NVIDIA toolchain")
    chosen = mla_config(rows=64, heads=128, entry=576, page=16, width=128, dtype=torch.bfloat16, device="cpu")
    spec = ",".join(str(int(v)) for v in (chosen.split_len, chosen.block_n, chosen.num_warps, chosen.num_stages,
                                          chosen.kv_together, chosen.unrolled))
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, str(root / "tests" / "rollout" / "sm90_compile.py"), "mla", "128", "512",
                           "64", spec], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    compiled = json.loads(done.stdout.splitlines()[-1])
    n = chosen.block_n
    assert {f"1x512x{n}xbf16", f"1x{n}x512xbf16"} <= set(compiled["buffers"]), compiled
    assert compiled["registers"] <= 65536 // (2 * 32 * chosen.num_warps) and 2 * compiled["shared"] <= 228 * 1024
