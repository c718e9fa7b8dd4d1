"""PackedResponses: the padding-free / shared-prompt row built from a PPO micro-batch, by hand."""

import torch

from hybridflow.data.packing import PackedResponses

# Two rows of one prompt [7, 8] (left-padded to 3 columns) and one row of prompt [9, 4, 5];
# responses right-padded to 3 columns. 0 is padding.
INPUT_IDS = torch.tensor([
    [0, 7, 8, 21, 22, 0],
    [0, 7, 8, 31, 0, 0],
    [9, 4, 5, 41, 42, 43],
])
ATTENTION = (INPUT_IDS != 0).long()


def test_unshared_rows_are_packed_back_to_back_with_their_own_positions():
    packed = PackedResponses(INPUT_IDS, ATTENTION, response_length=3, share_prompt=False)
    assert packed.input_ids.tolist() == [[7, 8, 21, 22, 7, 8, 31, 9, 4, 5, 41, 42, 43]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 5]]
    assert packed.bounds == [(0, 4), (4, 7), (7, 13)]
    assert packed.masks == [None, None, None]  # plain causal inside each unit
    # each response token is predicted by the token before it: the prompt's last token for the first
    assert packed.source.tolist() == [1, 2, 5, 9, 10, 11]
    assert packed.labels.tolist() == [21, 22, 31, 41, 42, 43]
    assert packed.rows.tolist() == [0, 0, 1, 2, 2, 2] and packed.cols.tolist() == [0, 1, 0, 0, 1, 2]


def test_rows_with_the_same_prompt_share_one_copy_of_it():
    packed = PackedResponses(INPUT_IDS, ATTENTION, response_length=3, share_prompt=True)
    assert packed.input_ids.tolist() == [[7, 8, 21, 22, 31, 9, 4, 5, 41, 42, 43]]
    # both responses continue from the prompt's length 2
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2, 0, 1, 2, 3, 4, 5]]
    assert packed.bounds == [(0, 5), (5, 11)]
    assert packed.source.tolist() == [1, 2, 1, 7, 8, 9]
    assert packed.labels.tolist() == [21, 22, 31, 41, 42, 43]
    # unit 0 = prompt(7, 8), response A(21, 22), response B(31): causal, and B never sees A
    expected = torch.tensor([
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(packed.masks[0], expected)
    assert packed.masks[1] is None  # a prompt with one response is a plain sequence


def test_scatter_puts_token_values_back_into_the_response_grid():
    packed = PackedResponses(INPUT_IDS, ATTENTION, response_length=3, share_prompt=True)
    grid = packed.scatter(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
    assert grid.tolist() == [[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [4.0, 5.0, 6.0]]
