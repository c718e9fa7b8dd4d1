"""PagedKVCache: each row's key/value lands at its position in its own block, gathers and block copies read
back what was written, nothing else changes."""

import pytest
import torch

from hybridflow.rollout.kv_cache import PagedKVCache, zeros_on_first_touch


def paged(**sizes) -> PagedKVCache:
    shape = dict(layers=2, blocks=6, block_size=2, kv_heads=3, max_len=6, head_dim=2) | sizes
    return PagedKVCache(**shape, dtype=torch.float32, device="cpu")


def test_write_puts_each_row_at_its_position_in_its_block_and_touches_nothing_else():
    cache = paged()
    positions = torch.tensor([0, 5, 2])  # blocks of 2: row 1 writes its block 2 (offset 1), row 2 its block 1
    tables = torch.tensor([[4, 0, 0], [1, 2, 3], [5, 1, 0]], dtype=torch.int32)
    keys = torch.arange(3 * 3 * 2, dtype=torch.float32).view(3, 3, 2) + 1
    cache.write(layer=1, rows=cache.write_rows(positions, tables), keys=keys, values=-keys)
    expected = torch.zeros(2, 2, 3, 6, 2, 2)
    for row, (block, offset) in enumerate([(4, 0), (3, 1), (1, 0)]):
        expected[1, 0, :, block, offset] = keys[row]
        expected[1, 1, :, block, offset] = -keys[row]
    assert torch.equal(cache.data, expected)


def test_write_rows_index_the_flat_layer_view():
    cache = paged(blocks=5, block_size=4, kv_heads=2, head_dim=1)
    # row of (head h, block b, offset o) in [kv_heads * blocks * block_size] is (h * blocks + b) * block_size + o
    rows = cache.write_rows(torch.tensor([3, 6]), torch.tensor([[2, 0], [1, 4]], dtype=torch.int32))
    assert rows.tolist() == [(0 * 5 + 2) * 4 + 3, (1 * 5 + 2) * 4 + 3, (0 * 5 + 4) * 4 + 2, (1 * 5 + 4) * 4 + 2]


def read_prefix(cache, blocks: list[int], length: int) -> torch.Tensor:
    """The first ``length`` positions held in ``blocks``, as ``[layers, 2, KV, length, D]``: read back through
    :class:`CachedPrefix`, as a prefill reads them."""
    out = cache.data.new_empty(*cache.data.shape[:3], length, cache.data.shape[5])
    cache.prefix(blocks, length).copy_into(out)
    return out


def test_a_prompt_written_into_blocks_reads_back_and_spans_in_table_order():
    cache = paged(layers=1, blocks=5, block_size=2, kv_heads=1, head_dim=1)
    kv = torch.arange(1.0, 6.0).view(1, 1, 1, 5, 1).expand(1, 2, 1, 5, 1).clone()  # 5 positions: 1 .. 5
    kv[:, 1] *= -1
    cache.write_prompt([3, 1, 4], kv, start=2)  # block 3 came from the prefix cache: left alone
    assert cache.data[0, 0, 0, :, :, 0].tolist() == [[0, 0], [3, 4], [0, 0], [0, 0], [5, 0]]
    cache.write_prompt([3, 1, 4], kv, start=0)
    torch.testing.assert_close(read_prefix(cache, [3, 1, 4], 5), kv)
    keys, values = cache.span(0, torch.tensor([[3, 1, 4], [4, 0, 0]]))
    assert keys.shape == (2, 1, 6, 1) and keys[0, 0, :, 0].tolist() == [1, 2, 3, 4, 5, 0]
    assert values[1, 0, :2, 0].tolist() == [-5, 0]


def test_a_chunk_starting_inside_a_block_rewrites_that_block_from_the_returned_prefix():
    cache = paged(layers=1, blocks=5, block_size=2, kv_heads=1, head_dim=1)
    kv = torch.arange(1.0, 6.0).view(1, 1, 1, 5, 1).expand(1, 2, 1, 5, 1).clone()  # positions 0 .. 4 hold 1 .. 5
    cache.data[0, 0, 0, 1] = -9.0  # block 1 (positions 2, 3) holds something else before the write
    cache.write_prompt([3, 1, 4], kv, start=3)  # a chunk of positions 3, 4 after a prefix of 3
    assert cache.data[0, 0, 0, :, :, 0].tolist() == [[0, 0], [3, 4], [0, 0], [0, 0], [5, 0]]
    torch.testing.assert_close(read_prefix(cache, [1, 4], 3)[0, 0, 0, :, 0], torch.tensor([3.0, 4.0, 5.0]))


def test_copy_blocks_copies_every_layer_and_head_of_each_pair():
    cache = paged()
    cache.data.copy_(torch.randn_like(cache.data))
    before = cache.data.clone()
    cache.copy_blocks([(1, 4), (2, 5)])
    torch.testing.assert_close(cache.data[:, :, :, [4, 5]], before[:, :, :, [1, 2]])
    torch.testing.assert_close(cache.data[:, :, :, :4], before[:, :, :, :4])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zeros_on_first_touch_is_a_writable_zero_tensor_of_its_own(dtype):
    a = zeros_on_first_touch((2, 3, 4), dtype=dtype, device="cpu")
    b = zeros_on_first_touch((2, 3, 4), dtype=dtype, device="cpu")
    assert a.shape == (2, 3, 4) and a.dtype == dtype and a.is_contiguous()
    assert torch.equal(a, torch.zeros(2, 3, 4, dtype=dtype))
    a[1, 2, 3] = 5
    assert a.sum() == 5 and b.sum() == 0
    assert zeros_on_first_touch((0, 4), dtype=dtype, device="cpu").shape == (0, 4)
