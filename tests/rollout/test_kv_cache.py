"""SlotKVCache.write: each slot's key/value lands at its own position, nothing else changes."""

import torch

from hybridflow.rollout.kv_cache import SlotKVCache


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
