"""SlotKVCache.write: each slot's key/value lands at its own position, nothing else changes."""

import pytest
import torch

from hybridflow.rollout.kv_cache import SlotKVCache, zeros_on_first_touch


def test_write_puts_each_slot_at_its_position_and_touches_nothing_else():
    cache = SlotKVCache(layers=2, slots=4, kv_heads=3, max_len=5, head_dim=2, dtype=torch.float32, device="cpu")
    positions = torch.tensor([0, 4, 2])  # three live slots, each at its own length
    keys = torch.arange(3 * 3 * 2, dtype=torch.float32).view(3, 3, 2) + 1
    values = -keys
    cache.write(layer=1, rows=cache.write_rows(positions), keys=keys, values=values)
    expected = torch.zeros(2, 2, 4, 3, 5, 2)
    for slot, position in enumerate(positions.tolist()):
        expected[1, 0, slot, :, position] = keys[slot]
        expected[1, 1, slot, :, position] = values[slot]
    assert torch.equal(cache.data, expected)


def test_write_rows_index_the_flat_layer_view():
    cache = SlotKVCache(layers=1, slots=3, kv_heads=2, max_len=7, head_dim=1, dtype=torch.float32, device="cpu")
    # row of (slot s, head h, position p) in [slots * kv_heads * max_len] is (s * kv_heads + h) * max_len + p
    rows = cache.write_rows(torch.tensor([3, 6]))
    assert rows.tolist() == [0 * 7 + 3, 1 * 7 + 3, 2 * 7 + 6, 3 * 7 + 6]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zeros_on_first_touch_is_a_writable_zero_tensor_of_its_own(dtype):
    a = zeros_on_first_touch((2, 3, 4), dtype=dtype, device="cpu")
    b = zeros_on_first_touch((2, 3, 4), dtype=dtype, device="cpu")
    assert a.shape == (2, 3, 4) and a.dtype == dtype and a.is_contiguous()
    assert torch.equal(a, torch.zeros(2, 3, 4, dtype=dtype))
    a[1, 2, 3] = 5
    assert a.sum() == 5 and b.sum() == 0
    assert zeros_on_first_touch((0, 4), dtype=dtype, device="cpu").shape == (0, 4)
