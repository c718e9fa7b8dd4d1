"""The Triton decode kernels against torch references: compiled on a GPU, interpreted on CPU
(tests/conftest.py sets ``TRITON_INTERPRET=1`` where CUDA is absent). Skipped without Triton."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
pytestmark = pytest.mark.triton

from hybridflow.rollout.decoder import LlamaFamilyDecoder  # noqa: E402
from hybridflow.rollout.triton_attention import (MAIN_CONFIG, MIN_SPLIT_TILES, PROGRAMS_PER_SM,  # noqa: E402
                                                 DecodeConfig, choose_config, paged_decode_attention)
from hybridflow.rollout.triton_fused import add_rms_norm, qkv_rope_write, silu_mul  # noqa: E402
from tests.rollout.conftest import chat_prompts, prefilled_paged_cache  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def reference_attention(q, keys, values, lengths, scale, tables, window=None, softcap=None, sinks=None):
    """fp64 softmax attention of each row over its first ``lengths[n]`` positions (the last ``window`` of them
    with a window), read through its block table row (``keys`` ``[KV, blocks, B, D]``), scores capped to
    ``c tanh(s / c)`` with a ``softcap`` ``c``; ``sinks`` ``[H]``: each head's logit appended as one more column of
    the softmax and dropped after (HF's gpt-oss ``eager_attention_forward``); ``[N, H, D]``."""
    group = q.shape[1] // keys.shape[0]
    out = []
    for n, length in enumerate(lengths):
        first = 0 if window is None else max(0, length - window)

        def row(pool):  # [H, L, D]
            return pool[:, tables[n]].flatten(1, 2)[:, first:length].double().repeat_interleave(group, 0)

        scores = torch.einsum("hd,hld->hl", q[n].double(), row(keys)) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        if sinks is not None:
            weights = torch.softmax(torch.cat([scores, sinks.double()[:, None]], dim=-1), dim=-1)[:, :-1]
        else:
            weights = torch.softmax(scores, dim=-1)
        out.append(torch.einsum("hl,hld->hd", weights, row(values)))
    return torch.stack(out)


def scattered_tables(lengths, *, block_size, width, seed=0):
    """``[N, width]`` tables whose rows own disjoint, shuffled blocks (1 ..), the null block 0 past their ends."""
    needed = [-(-length // block_size) for length in lengths]
    order = (torch.randperm(sum(needed), generator=torch.Generator().manual_seed(seed)) + 1).tolist()
    tables = []
    for count in needed:
        tables.append(order[:count] + [0] * (width - count))
        order = order[count:]
    return torch.tensor(tables, dtype=torch.int32), sum(needed) + 1


@pytest.mark.parametrize("dtype, tolerance", [
    (torch.float32, 1e-5),
    (torch.bfloat16, 1e-2),
])
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(4, 4, 16), (6, 2, 32), (9, 3, 64), (16, 8, 128)])
def test_split_k_attention_reads_each_rows_own_length_through_its_blocks(heads, kv_heads, head_dim, dtype, tolerance):
    torch.manual_seed(heads)
    block_size, width = 16, 40
    lengths = [1, 15, 16, 63, 64, 256, 257, 600]  # page (16), inner block (64) and split (256) edges
    tables, blocks = scattered_tables(lengths, block_size=block_size, width=width, seed=heads)
    q = torch.randn(len(lengths), heads, head_dim, device=DEVICE, dtype=dtype)
    keys = torch.randn(kv_heads, blocks, block_size, head_dim, dtype=dtype)
    values = torch.randn(kv_heads, blocks, block_size, head_dim, dtype=dtype)
    keys[:, 0] = values[:, 0] = float("nan")  # poison the null block and what no row may read
    for row, length in enumerate(lengths):
        last, used = tables[row, (length - 1) // block_size], (length - 1) % block_size + 1
        keys[:, last, used:] = values[:, last, used:] = float("nan")
    got = paged_decode_attention(q=q, keys=keys.to(DEVICE), values=values.to(DEVICE),
                                 lengths=torch.tensor(lengths, device=DEVICE), scale=head_dim**-0.5,
                                 block_tables=tables.to(DEVICE))
    expected = reference_attention(q, keys.to(DEVICE), values.to(DEVICE), lengths, head_dim**-0.5, tables.long())
    assert ((got.double() - expected).norm() / expected.norm()) < tolerance


@pytest.mark.parametrize("window", [1, 70, 300])  # one key; a window starting inside a block; one spanning splits
def test_split_k_attention_reads_only_the_sliding_window(window):
    torch.manual_seed(window)
    block_size, lengths = 16, [1, 63, 64, 256, 257, 600]
    tables, blocks = scattered_tables(lengths, block_size=block_size, width=40, seed=window)
    q = torch.randn(len(lengths), 6, 32, device=DEVICE)
    keys = torch.randn(2, blocks, block_size, 32)
    values = torch.randn(2, blocks, block_size, 32)
    keys[:, 0] = values[:, 0] = float("nan")  # the null block
    for row, length in enumerate(lengths):  # poison what no row may read: past its length, before its window
        positions = torch.arange(length, 40 * block_size)
        before = torch.arange(max(0, length - window))
        for hidden in (positions[positions < 40 * block_size], before):
            live = hidden[tables[row, hidden // block_size] != 0]
            for cache in (keys, values):
                cache[:, tables[row, live // block_size].long(), live % block_size] = float("nan")
    got = paged_decode_attention(q=q, keys=keys.to(DEVICE), values=values.to(DEVICE),
                                 lengths=torch.tensor(lengths, device=DEVICE), scale=32**-0.5,
                                 block_tables=tables.to(DEVICE), window=window)
    expected = reference_attention(q, keys.to(DEVICE), values.to(DEVICE), lengths, 32**-0.5, tables.long(),
                                   window=window)
    assert ((got.double() - expected).norm() / expected.norm()) < 1e-5


def test_split_k_attention_caps_the_scores_with_a_softcap():
    """Gemma 2's ``c tanh(s / c)`` on each scaled score before the softmax: scores of +-20 capped at 5 (a softmax far
    from the uncapped one), a window beside it, and the same contract as the CPU kernel."""
    torch.manual_seed(3)
    block_size, lengths = 16, [1, 40, 300]
    tables, blocks = scattered_tables(lengths, block_size=block_size, width=20, seed=3)
    q = torch.randn(len(lengths), 6, 32, device=DEVICE) * 4
    keys, values = torch.randn(2, blocks, block_size, 32), torch.randn(2, blocks, block_size, 32)
    inputs = dict(q=q, keys=keys.to(DEVICE), values=values.to(DEVICE), lengths=torch.tensor(lengths, device=DEVICE),
                  scale=32**-0.5, block_tables=tables.to(DEVICE))
    for window in (None, 50):
        got = paged_decode_attention(**inputs, window=window, softcap=5.0)
        expected = reference_attention(q, keys.to(DEVICE), values.to(DEVICE), lengths, 32**-0.5, tables.long(),
                                       window=window, softcap=5.0)
        uncapped = reference_attention(q, keys.to(DEVICE), values.to(DEVICE), lengths, 32**-0.5, tables.long(),
                                       window=window)
        assert ((uncapped - expected).norm() / expected.norm()) > 0.1  # the cap matters here
        assert ((got.double() - expected).norm() / expected.norm()) < 1e-5
    with pytest.raises(ValueError, match="softcap"):
        paged_decode_attention(**inputs, softcap=0.0)


def test_choose_config_at_the_issues_shapes():
    """Issue 46's shapes on 132 SMs: whole rows in one program once rows x KV heads fill the card, splits that give
    every SM its programs when they do not; tiles of ~16 KB of keys, whole pages, a split a multiple of a tile."""
    def choose(rows, kv_heads, head_dim, width, dtype=torch.bfloat16, sms=132):
        return choose_config(rows=rows, heads=2 * kv_heads, kv_heads=kv_heads, head_dim=head_dim, page=16, width=width,
                             dtype=dtype, sms=sms)

    qwen3 = choose(256, 8, 128, 128)  # 2,048 pairs of 2,048 positions against 16 x 132 programs: 2 splits
    assert (qwen3.split_len, qwen3.block_n, qwen3.kv_together, qwen3.unrolled) == (1024, 64, True, False)
    smollm = choose(64, 3, 64, 128)  # 192 pairs: as many splits as splits of 4 tiles allow (128-key tiles)
    assert (smollm.block_n, smollm.split_len, smollm.splits(2048)) == (128, 512, 4)
    qwen25 = choose(256, 2, 128, 128)  # 512 pairs: 5 splits wanted, 6 tiles each: 4 (a power of two)
    assert (qwen25.block_n, qwen25.split_len) == (64, 256)
    assert choose(4096, 8, 128, 128).splits(2048) == 1  # the pairs alone fill the card: one split, no combine
    assert choose(256, 8, 128, 13).split_len == 256  # a short table (208 positions): one split of its 4 tiles
    assert choose(256, 8, 128, 128, dtype=torch.float32).block_n == 32  # 16 KB of fp32 keys
    for rows in (1, 8, 64, 256, 1024):
        for kv_heads, head_dim, width in ((8, 128, 128), (3, 64, 32), (2, 128, 13)):
            config, span = choose(rows, kv_heads, head_dim, width), width * 16
            tiles = config.split_len // config.block_n
            assert config.split_len % config.block_n == 0 and config.block_n % 16 == 0
            if config.splits(span) > 1:  # else one split of the whole row
                assert tiles & (tiles - 1) == 0 and tiles >= MIN_SPLIT_TILES  # a power of two, at least the floor
                programs = rows * kv_heads * config.splits(span)
                assert programs >= PROGRAMS_PER_SM * 132 // 2 or tiles == MIN_SPLIT_TILES  # enough, or at the floor


@pytest.mark.parametrize("heads, kv_heads, head_dim, dtype", [
    (2, 2, 64, torch.float32), (4, 2, 128, torch.bfloat16), (3, 1, 64, torch.bfloat16), (6, 1, 128, torch.float32),
    (8, 1, 64, torch.float32)])  # groups 1 / 2 / 3 / 6 / 8; tiles of 64 / 64 / 128 / 32 / 64 keys
def test_every_config_the_chooser_returns_matches_the_reference(heads, kv_heads, head_dim, dtype):
    """Every config the chooser returns for this table width, head dim and dtype (over batch buckets and SM counts:
    one split a row, with no combine, and splits of 4 tiles where the row has more), and the first kernel's, over
    scattered tables, a row of 1 key and lengths off the page and the splits, with and without a window, poisoned
    past each row's end and in the null block."""
    torch.manual_seed(heads * head_dim)
    block_size, width, lengths = 16, 20, [1, 15, 63, 300]
    tables, blocks = scattered_tables(lengths, block_size=block_size, width=width, seed=heads)
    q = torch.randn(len(lengths), heads, head_dim, dtype=dtype)
    keys, values = (torch.randn(kv_heads, blocks, block_size, head_dim, dtype=dtype) for _ in range(2))
    keys[:, 0] = values[:, 0] = float("nan")
    for row, length in enumerate(lengths):
        last, used = tables[row, (length - 1) // block_size], (length - 1) % block_size + 1
        keys[:, last, used:] = values[:, last, used:] = float("nan")
    configs = {choose_config(rows=rows, heads=heads, kv_heads=kv_heads, head_dim=head_dim, page=block_size,
                             width=width, dtype=dtype, sms=sms) for rows in (1, 4, 64, 256) for sms in (1, 8, 132)}
    (block_n,) = {config.block_n for config in configs}  # the tile follows the head dim and dtype alone
    span = width * block_size
    tiles = -(-span // block_n)
    assert {config.splits(span) for config in configs} == ({1, -(-tiles // MIN_SPLIT_TILES)}
                                                           if tiles > MIN_SPLIT_TILES else {1})
    inputs = dict(q=q.to(DEVICE), keys=keys.to(DEVICE), values=values.to(DEVICE),
                  lengths=torch.tensor(lengths, device=DEVICE), scale=head_dim**-0.5, block_tables=tables.to(DEVICE))
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    for window in (None, 70):
        expected = reference_attention(q, keys, values, lengths, head_dim**-0.5, tables.long(), window=window)
        for config in configs | {MAIN_CONFIG}:
            got = paged_decode_attention(**inputs, window=window, config=config).cpu()
            assert ((got.double() - expected).norm() / expected.norm()) < tolerance, (config, window)


def test_the_chosen_kernel_compiles_for_sm90_with_keys_and_values_in_flight_together():
    """Compiled for an H100 / H200 on this machine (Triton's own ptxas; no GPU): at Qwen3-0.6B's shape the chooser's
    kernel has its software pipeline keep both tiles in shared memory one stage ahead (``K^T`` ``[128, 64]``, ``V``
    ``[64, 128]``; a ``tl.trans`` of a ``[64, 128]`` key load would stay in registers) and fits 4 programs an SM
    (<= 128 registers a thread at 4 warps; the first kernel took 244, so 2)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import triton

    if not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists():
        pytest.skip("this Triton has no NVIDIA toolchain")
    chosen = choose_config(rows=256, heads=16, kv_heads=8, head_dim=128, page=16, width=128, dtype=torch.bfloat16,
                           sms=132)
    spec = ",".join(str(int(v)) for v in (chosen.split_len, chosen.block_n, chosen.num_warps, chosen.num_stages,
                                          chosen.kv_together, chosen.unrolled))
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, str(root / "tests" / "rollout" / "sm90_compile.py"), "2", "128", spec],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    compiled = json.loads(done.stdout.splitlines()[-1])
    assert {"1x128x64xbf16", "1x64x128xbf16"} <= set(compiled["buffers"]), compiled
    assert compiled["registers"] <= 65536 // (4 * 32 * chosen.num_warps) and 4 * compiled["shared"] <= 228 * 1024


def test_a_config_whose_split_is_not_whole_tiles_is_refused():
    q, cache = torch.zeros(1, 2, 16, device=DEVICE), torch.zeros(1, 2, 16, 16, device=DEVICE)
    with pytest.raises(ValueError, match="multiple of block_n"):
        paged_decode_attention(q=q, keys=cache, values=cache, lengths=torch.tensor([1], device=DEVICE), scale=1.0,
                               block_tables=torch.ones(1, 1, dtype=torch.int32, device=DEVICE),
                               config=DecodeConfig(split_len=96, block_n=64))


def hf_rms_norm(x, weight, eps):
    return weight * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.mark.parametrize("columns", [64, 96])  # 96: a row shorter than its block
def test_add_rms_norm_is_the_residual_add_then_hf_rms_norm(columns):
    torch.manual_seed(columns)
    x, residual, weight = torch.randn(3, columns), torch.randn(3, columns), torch.rand(columns) + 0.5
    normed, summed = add_rms_norm(x=x.to(DEVICE), residual=residual.to(DEVICE), weight=weight.to(DEVICE), eps=1e-6)
    torch.testing.assert_close(summed.cpu(), x + residual)
    torch.testing.assert_close(normed.cpu(), hf_rms_norm(x + residual, weight, 1e-6))
    alone, same = add_rms_norm(x=x.to(DEVICE), residual=None, weight=weight.to(DEVICE), eps=1e-6)
    torch.testing.assert_close(alone.cpu(), hf_rms_norm(x, weight, 1e-6))
    assert same.data_ptr() == alone.data_ptr() or torch.equal(same.cpu(), x)


def gemma_rms_norm(x, weight, eps):
    """Gemma's RMSNorm: ``1 + w`` in fp32, cast after."""
    wide = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return (wide * (1.0 + weight.float())).to(x.dtype)


def test_add_rms_norm_with_a_unit_offset_is_gemmas_norm():
    torch.manual_seed(2)
    x, residual, weight = torch.randn(3, 96), torch.randn(3, 96), torch.rand(96) - 0.5
    normed, summed = add_rms_norm(x=x.to(DEVICE), residual=residual.to(DEVICE), weight=weight.to(DEVICE), eps=1e-6,
                                  unit_offset=True)
    torch.testing.assert_close(summed.cpu(), x + residual)
    torch.testing.assert_close(normed.cpu(), gemma_rms_norm(x + residual, weight, 1e-6))


def test_silu_mul_is_swiglus_gate_times_up():
    torch.manual_seed(0)
    gate_up = torch.randn(3, 2 * 1500)  # two column blocks, the second partial
    expected = F.silu(gate_up[:, :1500]) * gate_up[:, 1500:]
    torch.testing.assert_close(silu_mul(gate_up.to(DEVICE)).cpu(), expected)


def test_gelu_tanh_mul_is_geglus_gate_times_up():
    from hybridflow.rollout.triton_fused import gelu_tanh_mul

    torch.manual_seed(0)
    gate_up = 4 * torch.randn(3, 2 * 1500)  # two column blocks, the second partial; gates well into both tails
    expected = F.gelu(gate_up[:, :1500], approximate="tanh") * gate_up[:, 1500:]
    torch.testing.assert_close(gelu_tanh_mul(gate_up.to(DEVICE)).cpu(), expected)


@pytest.mark.parametrize("with_norm,rope_shift", [(False, None), (True, None), (False, [0, 2, 4]), ("gemma", None)])
def test_qkv_rope_write_rotates_q_and_k_and_fills_the_cache_through_the_table(with_norm, rope_shift):
    """``rope_shift``: a vision-language row rotates at ``position - shift`` (M-RoPE's delta) and still writes at its
    position (issue 51); ``"gemma"``: Gemma 3's q / k norms, by ``1 + w``."""
    from hybridflow.rollout.decoder import _apply_rope

    torch.manual_seed(1)
    rows, heads, kv_heads, head_dim, block_size = 3, 4, 2, 16, 4
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_dim)
    positions = torch.tensor([0, 5, 9])
    tables = torch.tensor([[3, 0, 0], [1, 4, 0], [5, 2, 6]], dtype=torch.int32)  # 9 -> block 6, offset 1
    angles = torch.arange(12)[:, None] * torch.rand(head_dim // 2)[None]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    norm = torch.rand(heads + kv_heads, head_dim) + 0.5 if with_norm else None
    keys, values = torch.zeros(kv_heads, 7, block_size, head_dim), torch.zeros(kv_heads, 7, block_size, head_dim)
    rotated_at = positions if rope_shift is None else positions - torch.tensor(rope_shift)
    moved = [t.to(DEVICE) for t in (qkv, positions, cos, sin, keys, values, tables)]
    q = qkv_rope_write(qkv=moved[0], positions=moved[1], cos=moved[2], sin=moved[3],
                       qk_norm=None if norm is None else norm.to(DEVICE), keys=moved[4], values=moved[5],
                       heads=heads, eps=1e-6, block_tables=moved[6],
                       rope_positions=None if rope_shift is None else rotated_at.to(DEVICE),
                       unit_offset=with_norm == "gemma")
    qk, v = qkv.split([(heads + kv_heads) * head_dim, kv_heads * head_dim], dim=-1)
    qk = qk.view(rows, heads + kv_heads, head_dim)
    if with_norm:
        qk = (gemma_rms_norm if with_norm == "gemma" else hf_rms_norm)(qk, norm, 1e-6)
    rotated = _apply_rope(qk, cos[rotated_at][:, None], sin[rotated_at][:, None])
    torch.testing.assert_close(q.cpu(), rotated[:, :heads])
    expected_keys, expected_values = torch.zeros_like(keys), torch.zeros_like(values)
    for n, (block, offset) in enumerate([(3, 0), (4, 1), (6, 1)]):
        expected_keys[:, block, offset] = rotated[n, heads:]
        expected_values[:, block, offset] = v[n].view(kv_heads, head_dim)
    torch.testing.assert_close(moved[4].cpu(), expected_keys)  # written there and nowhere else
    torch.testing.assert_close(moved[5].cpu(), expected_values)


def fused_equals_torch_step(model, tokenizer):
    """One decode step of three prefilled prompts through the fused Triton step and through torch ops: logits and the
    cache written (keys and values) agree."""
    model = model.to(DEVICE)
    decoder = LlamaFamilyDecoder(model)
    prompts = [torch.tensor(p, device=DEVICE) for p in chat_prompts(tokenizer)[:3]]
    (torch_cache, tables, positions), (fused_cache, _, _) = (prefilled_paged_cache(decoder, prompts, device=DEVICE)
                                                             for _ in range(2))
    tokens = torch.tensor([5, 6, 7], device=DEVICE)
    decoder.triton_kernels = decoder.fused_cpu_decode = False  # the reference: torch ops (not the C kernels either)
    expected = decoder.decode(token_ids=tokens, positions=positions, cache=torch_cache, block_tables=tables,
                              context=int(positions.max()) + 1)
    decoder.triton_kernels = True
    fused = decoder.decode(token_ids=tokens, positions=positions, cache=fused_cache, block_tables=tables, context=None)
    torch.testing.assert_close(fused, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused_cache.data, torch_cache.data, rtol=1e-5, atol=1e-5)
    return decoder


# mistral: a window of 8 shorter than the prompts; gemma3_text: 1 + w norms, four a layer and q / k norms, a scaled
# embedding, GeGLU, a rotary table per layer type; mixtral / qwen3_moe: routed experts (gathered: graph-safe).
@pytest.mark.parametrize("arch", ["llama", "qwen3", "mistral", "gemma2", "gemma3_text", "mixtral", "qwen3_moe"])
def test_fused_decode_step_equals_the_torch_step(tiny_tokenizer, arch):
    from hybridflow.models.tiny import build_tiny_model
    from tests.rollout.conftest import randomise_norms

    model, tokenizer = build_tiny_model(arch, seed=1, tokenizer=tiny_tokenizer)
    fused_equals_torch_step(randomise_norms(model), tokenizer)


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
def test_fused_decode_step_of_a_vision_language_model_equals_the_torch_step(arch):
    """The language model of a VLM (its layers under ``model.language_model``) in the fused step, each row rotating at
    ``position + delta`` (M-RoPE after images, issue 51), its vision tokens suppressed: as the torch step."""
    from hybridflow.models.tiny import build_tiny_vl_model

    model, processor = build_tiny_vl_model(arch=arch, seed=1)
    model = model.to(DEVICE)
    decoder = LlamaFamilyDecoder(model)
    prompts = [torch.tensor(p, device=DEVICE) for p in chat_prompts(processor.tokenizer)[:3]]
    (torch_cache, tables, positions), (fused_cache, _, _) = (prefilled_paged_cache(decoder, prompts, device=DEVICE)
                                                             for _ in range(2))
    tokens, rope_positions = torch.tensor([5, 6, 7], device=DEVICE), positions - torch.tensor([0, 3, 5], device=DEVICE)
    decoder.triton_kernels = decoder.fused_cpu_decode = False  # the reference: torch ops (not the C kernels either)
    expected = decoder.decode(token_ids=tokens, positions=positions, cache=torch_cache, block_tables=tables,
                              context=int(positions.max()) + 1, rope_positions=rope_positions)
    decoder.triton_kernels = True
    fused = decoder.decode(token_ids=tokens, positions=positions, cache=fused_cache, block_tables=tables, context=None,
                           rope_positions=rope_positions)
    torch.testing.assert_close(fused, expected, rtol=1e-4, atol=1e-4)
    assert fused[:, model.config.image_token_id].isneginf().all()
    torch.testing.assert_close(fused_cache.data, torch_cache.data, rtol=1e-5, atol=1e-5)


def test_one_kernel_sampling_draws_what_the_torch_sampler_draws():
    from hybridflow.rollout import SamplingParams
    from hybridflow.rollout.sampler import RowSampling, sample_tokens
    from hybridflow.rollout.triton_sampling import sample_rows

    torch.manual_seed(0)
    vocab = 5000  # three blocks, the last partial
    logits = (torch.randn(6, vocab) * 3).to(DEVICE)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.7), SamplingParams(temperature=1.0),
              SamplingParams(temperature=1.3), SamplingParams(temperature=0), SamplingParams(temperature=0.05)]
    rows = RowSampling.of(params, vocab_size=vocab, device=DEVICE)
    uniform = torch.rand(6, 1, device=DEVICE)
    tokens, logprobs = sample_rows(logits=logits, temperature=rows.temperature, greedy=rows.greedy, uniform=uniform)
    expected_tokens, expected_logprobs = sample_tokens(logits=logits.cpu(), params=RowSampling.of(
        params, vocab_size=vocab, device="cpu"), uniform=uniform.cpu())
    assert tokens.tolist() == expected_tokens.tolist()
    torch.testing.assert_close(logprobs.cpu(), expected_logprobs, rtol=1e-5, atol=1e-5)


def test_one_kernel_sampling_follows_the_uniform_draw_across_blocks():
    """A flat distribution over 5000 tokens: u picks token floor(u * V) (the CDF crosses u * total there),
    whichever of the three blocks it falls in."""
    from hybridflow.rollout.triton_sampling import sample_rows

    vocab = 5000
    uniform = torch.tensor([[0.0001], [0.3], [0.5], [0.99999]], device=DEVICE)
    tokens, logprobs = sample_rows(logits=torch.zeros(4, vocab, device=DEVICE),
                                   temperature=torch.ones(4, device=DEVICE),
                                   greedy=torch.zeros(4, dtype=torch.bool, device=DEVICE), uniform=uniform)
    assert tokens.tolist() == [0, 1500, 2500, 4999]
    torch.testing.assert_close(logprobs.cpu(), torch.full((4,), -float(torch.log(torch.tensor(5000.0)))))


@pytest.mark.skipif(DEVICE != "cuda", reason="CPU logits take the C sampler (tests/rollout/test_cpu_fused.py checks it)")
def test_the_sampling_kernel_is_checked_on_its_first_draw_and_switched_off_if_wrong(monkeypatch, caplog):
    import hybridflow.rollout.triton_sampling as kernel
    from hybridflow.rollout import SamplingParams
    from hybridflow.rollout import sampler
    from hybridflow.rollout.sampler import RowSampling

    torch.manual_seed(2)
    logits, uniform = torch.randn(3, 300, device=DEVICE), torch.rand(3, 1, device=DEVICE)
    rows = RowSampling.of([SamplingParams(temperature=0.9)] * 3, vocab_size=300, device=DEVICE)
    monkeypatch.setitem(sampler._FUSED_SAMPLING, "cuda", {"enabled": True, "checked": False})
    tokens, _ = sampler._fused_sample(logits, rows, uniform)
    assert sampler._FUSED_SAMPLING["cuda"] == {"enabled": True, "checked": True}
    assert tokens.tolist() == sampler._torch_sample(logits, rows, uniform)[0].tolist()

    sampler._FUSED_SAMPLING["cuda"]["checked"] = False
    right = kernel.sample_rows
    monkeypatch.setattr(kernel, "sample_rows", lambda **kw: ((right(**kw)[0] + 1) % 300, right(**kw)[1]))
    with caplog.at_level("WARNING"):
        assert sampler._fused_sample(logits, rows, uniform) is None
    assert not sampler._FUSED_SAMPLING["cuda"]["enabled"] and "disagreed" in caplog.text
