import numpy as np
import pytest

from hybridflow.data.dataloader import StatefulDataLoader, epoch_order
from hybridflow.data.rl_dataset import RLDataset
from hybridflow.errors import DataError


def make_loader(n=10, batch_size=3, **kwargs):
    return StatefulDataLoader(list(range(n)), batch_size=batch_size, collate_fn=list, **kwargs)


def test_epoch_order_is_the_seeded_permutation():
    expected = np.random.default_rng([5, 2]).permutation(7).tolist()
    assert epoch_order(7, epoch=2, seed=5, shuffle=True) == expected
    assert sorted(expected) == list(range(7))
    assert epoch_order(7, epoch=2, seed=5, shuffle=False) == list(range(7))
    assert epoch_order(50, epoch=0, seed=5, shuffle=True) != epoch_order(50, epoch=1, seed=5, shuffle=True)


def test_batches_follow_the_epoch_order_and_drop_last():
    loader = make_loader(n=10, batch_size=3, shuffle=True, seed=3)
    order = epoch_order(10, epoch=0, seed=3, shuffle=True)
    assert list(loader) == [order[0:3], order[3:6], order[6:9]]
    assert len(loader) == 3
    assert loader.state_dict() == {"epoch": 1, "position": 0, "seed": 3}
    keep_last = make_loader(n=10, batch_size=3, shuffle=False, drop_last=False)
    assert list(keep_last) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert len(keep_last) == 4


def test_resume_yields_exactly_the_remaining_batches():
    reference = make_loader(shuffle=True, seed=11)
    all_batches = list(reference) + list(reference)  # two epochs
    run = make_loader(shuffle=True, seed=11)
    seen = []
    for batch in run:
        seen.append(batch)
        break
    state = run.state_dict()
    assert state == {"epoch": 0, "position": 3, "seed": 11}
    resumed = make_loader(shuffle=True, seed=999)  # the seed comes from the checkpoint
    resumed.load_state_dict(state)
    seen += list(resumed)
    seen += list(resumed)
    assert seen == all_batches


def test_resume_after_the_last_batch_starts_the_next_epoch():
    run = make_loader(shuffle=True, seed=4)
    first_epoch = []
    for batch in run:
        first_epoch.append(batch)
        if len(first_epoch) == 3:
            break
    state = run.state_dict()
    assert state == {"epoch": 1, "position": 0, "seed": 4}
    resumed = make_loader(shuffle=True, seed=4)
    resumed.load_state_dict(state)
    order = epoch_order(10, epoch=1, seed=4, shuffle=True)
    assert next(iter(resumed)) == order[:3]


def test_load_incomplete_state_and_bad_batch_size():
    with pytest.raises(DataError, match=r"dataloader state is missing \['seed'\]"):
        make_loader().load_state_dict({"epoch": 0, "position": 0})
    with pytest.raises(
        DataError, match=r"dataset has 2 samples, fewer than one batch of 3; lower data.train_batch_size"
    ):
        make_loader(n=2, batch_size=3)
    with pytest.raises(DataError, match=r"batch size must be positive"):
        make_loader(batch_size=0)


def test_resume_with_rl_dataset(tiny_tokenizer, make_rows, write_rows):
    dataset = RLDataset(write_rows(make_rows(6)), tiny_tokenizer, max_prompt_length=64)

    def loader():
        return StatefulDataLoader(dataset, batch_size=2, collate_fn=dataset.collate_fn, shuffle=True, seed=0)

    full = [batch["uid"] for batch in loader()]
    run = loader()
    iterator = iter(run)
    head = [next(iterator)["uid"]]
    resumed = loader()
    resumed.load_state_dict(run.state_dict())
    assert head + [batch["uid"] for batch in resumed] == full
