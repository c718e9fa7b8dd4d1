"""The CPU paged decode-attention kernel: hand-computed values, SDPA over the gathered blocks, and the engine on
both paths (the kernel, and SDPA over the slot mirror that runs where no compiler is found)."""

import math

import pytest
import torch

from hybridflow.models.segment_attention import capped_attention
from hybridflow.rollout import SamplingParams, cpu_attention, cpu_kernels
from hybridflow.rollout.native import NativeEngine
from tests.rollout.conftest import chat_prompts
from tests.rollout.test_native import hf_greedy
from tests.rollout.test_paged_engine import tight_blocks

pytestmark = pytest.mark.skipif(cpu_kernels.library() is None, reason="no C compiler: the kernel is not built")


def reference(q, keys, values, tables, lengths, scale, window=None, softcap=None):
    """SDPA (capped: the eager form) over each row's gathered blocks, positions past its length (or before its
    window) masked."""
    rows, heads, dim = q.shape
    kv_heads, _, block, _ = keys.shape
    span = tables.shape[1] * block
    flat = tables.reshape(-1).long()

    def gather(part):
        return part.index_select(1, flat).view(kv_heads, rows, span, dim).transpose(0, 1)

    key = torch.arange(span)[None]
    hidden = key >= lengths[:, None]
    if window is not None:
        hidden |= key < lengths[:, None] - window
    mask = torch.zeros(rows, 1, 1, span).masked_fill_(hidden[:, None, None], float("-inf"))
    grouped = q.view(rows, kv_heads, heads // kv_heads, dim)
    out = capped_attention(grouped, gather(keys), gather(values), mask=mask, scale=scale, softcap=softcap)
    return out.reshape(rows, heads, dim)


def test_one_row_by_hand():
    """One head, two positions in two blocks of 1 (the table reversed): scores s = (0, ln 3), so
    softmax = (1/4, 3/4) and the output is v0 / 4 + 3 v1 / 4."""
    dim = 16
    q = torch.zeros(1, 1, dim)
    q[0, 0, 0] = 1.0
    keys = torch.zeros(1, 3, 1, dim)
    values = torch.zeros(1, 3, 1, dim)
    keys[0, 2, 0, 0] = 0.0  # position 0 lives in block 2
    keys[0, 1, 0, 0] = math.log(3.0)  # position 1 in block 1
    values[0, 2, 0] = torch.arange(dim, dtype=torch.float32)
    values[0, 1, 0] = 100.0
    out = cpu_attention.paged_decode_attention(q=q, keys=keys, values=values,
                                               block_tables=torch.tensor([[2, 1]], dtype=torch.int32),
                                               lengths=torch.tensor([2]), scale=1.0, window=None)
    expected = torch.arange(dim, dtype=torch.float32) / 4 + 3 * 100.0 / 4
    torch.testing.assert_close(out[0, 0], expected)
    window_of_one = cpu_attention.paged_decode_attention(
        q=q, keys=keys, values=values, block_tables=torch.tensor([[2, 1]], dtype=torch.int32),
        lengths=torch.tensor([2]), scale=1.0, window=1)
    torch.testing.assert_close(window_of_one[0, 0], torch.full((dim,), 100.0))  # only the newest key


@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 4, 16), (6, 2, 32), (9, 3, 64), (14, 2, 64), (12, 1, 128),
                                                (20, 2, 16)])
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_sdpa_over_the_gathered_blocks(heads, kv_heads, dim, threads):
    generator = torch.Generator().manual_seed(heads * dim)
    rows, block, width = 7, 4, 9
    blocks = rows * width + 1
    keys, values = (torch.randn(kv_heads, blocks, block, dim, generator=generator) for _ in range(2))
    tables = (torch.randperm(rows * width, generator=generator) + 1).view(rows, width).to(torch.int32)
    lengths = torch.tensor([1, 4, 5, 17, 36, 2, 30])  # one position, whole blocks, partial ones, the full table
    q = torch.randn(rows, heads, dim, generator=generator)
    outer = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for window, softcap in ((None, None), (3, None), (16, None), (None, 2.0), (16, 2.0)):
            out = cpu_attention.paged_decode_attention(q=q, keys=keys, values=values, block_tables=tables,
                                                       lengths=lengths, scale=dim**-0.5, window=window,
                                                       softcap=softcap)
            expected = reference(q, keys, values, tables, lengths, dim**-0.5, window, softcap)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    finally:
        torch.set_num_threads(outer)


def test_a_table_trimmed_to_the_longest_row_is_read_through_its_row_stride():
    """The engine passes ``block_tables[:, :ceil(context / B)]``, a view whose rows are wider than it."""
    generator = torch.Generator().manual_seed(0)
    keys, values = (torch.randn(2, 40, 4, 16, generator=generator) for _ in range(2))
    full = (torch.randperm(39, generator=generator)[:30] + 1).view(3, 10).to(torch.int32)
    trimmed = full[:, :3]
    lengths = torch.tensor([12, 5, 9])
    q = torch.randn(3, 4, 16, generator=generator)
    out = cpu_attention.paged_decode_attention(q=q, keys=keys, values=values, block_tables=trimmed, lengths=lengths,
                                               scale=0.25, window=None)
    torch.testing.assert_close(out, reference(q, keys, values, trimmed.contiguous(), lengths, 0.25))


def test_rows_read_only_their_own_positions():
    """Keys and values past a row's length are poison (NaN): a kernel that read them would return NaN."""
    keys = torch.full((1, 4, 4, 16), float("nan"))
    values = torch.full((1, 4, 4, 16), float("nan"))
    keys[0, 1, :3], values[0, 1, :3] = 0.5, 2.0  # row 0: three positions in block 1
    q = torch.ones(1, 2, 16)
    out = cpu_attention.paged_decode_attention(q=q, keys=keys, values=values,
                                               block_tables=torch.tensor([[1, 2]], dtype=torch.int32),
                                               lengths=torch.tensor([3]), scale=1.0, window=None)
    torch.testing.assert_close(out, torch.full((1, 2, 16), 2.0))


BF16_ULP = 2.0**-8
"""bf16's relative rounding step: a bf16 kernel's output is its fp32 math on the widened inputs, rounded once."""


@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (6, 2, 32), (12, 1, 128)])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_bf16_kernel_is_the_fp32_math_on_the_widened_pool_rounded_once(heads, kv_heads, dim, threads):
    """Issue 56: a bf16 pool, q and output (the engine's dtype on a CPU with bf16 units), rows in scattered blocks,
    with windows, soft caps and sinks: the reference (SDPA, and fp64 with sinks) over the same bf16 values widened."""
    generator = torch.Generator().manual_seed(heads + dim)
    rows, block, width = 5, 4, 9
    keys, values = (torch.randn(kv_heads, rows * width + 1, block, dim, generator=generator).bfloat16()
                    for _ in range(2))
    tables = (torch.randperm(rows * width, generator=generator) + 1).view(rows, width).to(torch.int32)
    lengths = torch.tensor([1, 5, 17, 36, 30])
    q = torch.randn(rows, heads, dim, generator=generator).bfloat16()
    outer = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for window, softcap in ((None, None), (3, None), (16, 2.0)):
            out = cpu_attention.paged_decode_attention(q=q, keys=keys, values=values, block_tables=tables,
                                                       lengths=lengths, scale=dim**-0.5, window=window, softcap=softcap)
            assert out.dtype == torch.bfloat16
            expected = reference(q.float(), keys.float(), values.float(), tables, lengths, dim**-0.5, window, softcap)
            torch.testing.assert_close(out.float(), expected, rtol=BF16_ULP, atol=1e-5)
        sinks = torch.randn(heads, generator=generator)
        with_sinks = cpu_attention.paged_decode_attention(q=q, keys=keys, values=values, block_tables=tables,
                                                          lengths=lengths, scale=dim**-0.5, window=None, sinks=sinks)
        fp32 = cpu_attention.paged_decode_attention(q=q.float(), keys=keys.float(), values=values.float(),
                                                    block_tables=tables, lengths=lengths, scale=dim**-0.5, window=None,
                                                    sinks=sinks)
        torch.testing.assert_close(with_sinks.float(), fp32, rtol=BF16_ULP, atol=1e-5)
    finally:
        torch.set_num_threads(outer)


def fp64_reference(q, keys, values, tables, lengths, scale, window=None, softcap=None, sinks=None):
    """The formula in float64, one row and query head at a time, over the positions its table points to: the
    ``window`` newest, the capped scores ``c tanh(s / c)``, a sink logit per head joining the softmax."""
    rows, heads, dim = q.shape
    kv_heads, _, block, _ = keys.shape
    out = torch.empty(rows, heads, dim, dtype=torch.float64)
    for n in range(rows):
        length = int(lengths[n])
        positions = torch.arange(max(0, length - window) if window else 0, length)
        slots = tables[n].long()[positions // block], positions % block
        for h in range(heads):
            kv = h // (heads // kv_heads)
            key, value = keys[kv][slots].double(), values[kv][slots].double()
            s = scale * key @ q[n, h].double()
            s = softcap * torch.tanh(s / softcap) if softcap else s
            logits = s if sinks is None else torch.cat([s, sinks[h : h + 1].double()])
            out[n, h] = torch.softmax(logits, 0)[: len(positions)] @ value
    return out


@pytest.mark.parametrize("heads,kv_heads,dim", [(9, 3, 64), (5, 5, 16), (10, 2, 48), (16, 1, 128), (12, 4, 32)])
def test_the_bf16_kernel_against_fp64_over_the_engines_blocks(heads, kv_heads, dim):
    """Issue 56: the bf16 kernel reads the pool in place, 16 positions at a time, with an online softmax. Blocks of 16
    (the engine's), ragged rows on each side of a block and tile boundary, grouped queries (5: the loop not unrolled),
    head dims with and without a 32-dim part (the vdpbf16ps path's), scores spread wide (the running maximum moves
    between tiles), windows starting mid-tile, soft caps, sinks; against float64 over the same bf16 values.
    Tolerance: the bf16 output is fp32 math rounded once, so within bf16's relative step (2**-8) of the exact value,
    plus 1e-5 for fp32 sums."""
    generator = torch.Generator().manual_seed(heads * dim + kv_heads)
    lengths = torch.tensor([1, 15, 16, 17, 32, 33, 70, 47])
    rows, block, width = len(lengths), 16, 5
    keys, values = (3 * torch.randn(kv_heads, rows * width + 1, block, dim, generator=generator) for _ in range(2))
    keys[:, :, :, 0] += torch.linspace(-8, 8, rows * width + 1)[None, :, None]  # maxima in early and late tiles
    keys, values = keys.bfloat16(), values.bfloat16()
    tables = (torch.randperm(rows * width, generator=generator) + 1).view(rows, width).to(torch.int32)
    q = torch.randn(rows, heads, dim, generator=generator).bfloat16()
    sinks = torch.randn(heads, generator=generator)
    for window, softcap, sink in ((None, None, None), (20, None, None), (None, 5.0, None), (None, None, sinks),
                                  (7, 5.0, sinks)):
        out = cpu_attention.paged_decode_attention(q=q, keys=keys, values=values, block_tables=tables, lengths=lengths,
                                                   scale=dim**-0.5, window=window, softcap=softcap, sinks=sink)
        expected = fp64_reference(q, keys, values, tables, lengths, dim**-0.5, window, softcap, sink)
        torch.testing.assert_close(out.double(), expected, rtol=BF16_ULP, atol=1e-5)


def test_this_build_scores_bf16_with_the_cpus_bf16_units_where_it_has_them():
    """The default build (``-march=native``) takes vdpbf16ps where the CPU has AVX-512-BF16; test_cpu_kernels builds
    the widening path (AVX-512 and AVX2) and runs the tests above on it."""
    from hybridflow.cpu import cpu_flags

    if cpu_kernels.build_flags()[0] != "-march=native":
        pytest.skip("a build for another -march")
    assert cpu_kernels.library().paged_decode_attention_bf16_dot_units() == ("avx512_bf16" in cpu_flags())


def test_the_bf16_kernel_reads_only_its_rows_positions():
    """The bf16 twin widens whole blocks: NaN past a row's length is widened, never read into the output."""
    keys = torch.full((1, 4, 4, 16), float("nan"), dtype=torch.bfloat16)
    values = keys.clone()
    keys[0, 1, :3], values[0, 1, :3] = 0.5, 2.0
    out = cpu_attention.paged_decode_attention(q=torch.ones(1, 2, 16, dtype=torch.bfloat16), keys=keys, values=values,
                                               block_tables=torch.tensor([[1, 2]], dtype=torch.int32),
                                               lengths=torch.tensor([3]), scale=1.0, window=None)
    torch.testing.assert_close(out.float(), torch.full((1, 2, 16), 2.0))


def guarded_bf16(shape):
    """A bf16 tensor of ``shape`` (one page of bytes) that ends where an unreadable page starts: a read past its last
    element faults (the test process dies, the test fails)."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    assert math.prod(shape) * 2 == page
    region = mmap.mmap(-1, 2 * page)
    start = ctypes.addressof(ctypes.c_char.from_buffer(region))
    no_access = 0  # PROT_NONE
    assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(start + page), ctypes.c_size_t(page), no_access) == 0
    return torch.frombuffer(region, dtype=torch.bfloat16, count=page // 2).view(shape)


def test_the_bf16_kernel_reads_no_key_past_a_rows_last_position():
    """Issue 56: a tile of 16 positions in blocks of 4 reads only the row's 3 positions of its last block, the pool's
    last 3 x 32 bytes before an unreadable page (keys and values alike)."""
    import mmap

    blocks = mmap.PAGESIZE // (4 * 16 * 2)
    keys, values = guarded_bf16((1, blocks, 4, 16)), guarded_bf16((1, blocks, 4, 16))
    keys.fill_(0.5), values.fill_(2.0)
    table = torch.tensor([[0, blocks - 1]], dtype=torch.int32)
    out = cpu_attention.paged_decode_attention(q=torch.ones(1, 1, 16, dtype=torch.bfloat16), keys=keys, values=values,
                                               block_tables=table, lengths=torch.tensor([7]), scale=1.0, window=None)
    torch.testing.assert_close(out.float(), torch.full((1, 1, 16), 2.0))


def test_a_pool_and_queries_of_different_dtypes_are_refused():
    q, keys = torch.ones(1, 2, 16, dtype=torch.bfloat16), torch.zeros(1, 4, 4, 16)
    with pytest.raises(ValueError, match="all fp32 or all bf16"):
        cpu_attention.paged_decode_attention(q=q, keys=keys, values=keys, lengths=torch.tensor([2]), scale=1.0,
                                             block_tables=torch.tensor([[1]], dtype=torch.int32), window=None)


def test_shapes_it_cannot_take_run_sdpa_instead():
    assert not cpu_attention.supports(dtype=torch.float16, heads=4, kv_heads=2, head_dim=64)
    assert cpu_attention.supports(dtype=torch.bfloat16, heads=4, kv_heads=2, head_dim=64)
    assert not cpu_attention.supports(dtype=torch.float32, heads=4, kv_heads=2, head_dim=24)
    assert not cpu_attention.supports(dtype=torch.float32, heads=34, kv_heads=2, head_dim=64)  # 17 per KV head
    assert cpu_attention.supports(dtype=torch.float32, heads=4, kv_heads=2, head_dim=64)


@pytest.mark.parametrize("path", ["kernel", "mirror"])
def test_the_engine_on_each_cpu_attention_path_is_greedy_token_exact_with_hf(tiny, path):
    """Every tiny architecture under preemption (Gemma 2's soft caps and windows included)."""
    model, tokenizer = tiny
    prompts, eos = chat_prompts(tokenizer), tokenizer.eos_token_id
    engine = NativeEngine(model, tokenizer, num_kv_blocks=tight_blocks(prompts, 40), decode_lanes=False)
    if path == "mirror":
        engine.decoder.paged_cpu_attention = False
    completions = engine.generate(prompts, SamplingParams(n=2, temperature=0, max_tokens=40, stop_token_ids=[eos]))
    assert engine.preemptions > 0
    references = [hf_greedy(model, prompt, max_new_tokens=40, eos=eos) for prompt in prompts]
    assert [c.token_ids for c in completions] == [references[c.prompt_index] for c in completions]
    kernel = path == "kernel"
    assert engine.decoder.paged_cpu_attention == kernel
    assert (engine.mirror is None) == kernel  # the kernel reads the pool: no second copy of the keys


def test_a_block_id_outside_the_pool_is_refused_not_read():
    q, keys = torch.ones(1, 2, 16), torch.zeros(2, 4, 4, 16)
    with pytest.raises(RuntimeError, match="refused"):
        cpu_attention.paged_decode_attention(q=q, keys=keys, values=keys, lengths=torch.tensor([6]), scale=1.0,
                                             block_tables=torch.tensor([[1, 9]], dtype=torch.int32), window=None)


def test_a_row_longer_than_its_table_is_refused_even_within_a_window():
    """9 positions over a table of 2 blocks of 4: its third block would be read past the table's row."""
    q, keys = torch.ones(2, 2, 16), torch.zeros(2, 6, 4, 16)
    tables = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="refused"):
        cpu_attention.paged_decode_attention(q=q, keys=keys, values=keys, block_tables=tables, scale=1.0,
                                             lengths=torch.tensor([9, 2]), window=4)
