"""rollout.over_sample_rate: the first ceil((1 - r) N) samples to finish are kept (hybridflow.algos.over_sample)."""

from types import SimpleNamespace

import pytest
import torch

from hybridflow.algos.errors import AlgorithmError
from hybridflow.algos.over_sample import first_finished
from hybridflow.data.batch import Batch
from hybridflow.trainer.loop.generation import Generation


def test_the_shortest_responses_finish_first_ties_by_order():
    lengths = torch.tensor([5, 2, 7, 2])
    # r = 0.5: K = ceil(0.5 * 4) = 2 -> the two length-2 samples (indices 1, 3)
    assert first_finished(response_lengths=lengths, over_sample_rate=0.5).tolist() == [False, True, False, True]
    # r = 0.3: K = ceil(0.7 * 4) = ceil(2.8) = 3 -> then the length-5 sample (index 0)
    assert first_finished(response_lengths=lengths, over_sample_rate=0.3).tolist() == [True, True, False, True]
    # r = 0: every sample; r = 0.9: K = ceil(0.4) = 1 -> the earlier of the tied shortest (index 1)
    assert first_finished(response_lengths=lengths, over_sample_rate=0.0).all()
    assert first_finished(response_lengths=lengths, over_sample_rate=0.9).tolist() == [False, True, False, False]


def test_a_rate_outside_zero_one_is_refused():
    with pytest.raises(AlgorithmError, match=r"must be in \[0, 1\)"):
        first_finished(response_lengths=torch.tensor([1, 2]), over_sample_rate=1.0)


def test_aborted_samples_carry_no_loss_tokens():
    """The trainer zeroes the aborted samples' response_mask after scoring (their scores stay)."""
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    scores = torch.tensor([0.5, 1.0, 0.0, 1.0])
    batch = Batch(tensors={"response_mask": mask.clone(), "seq_score": scores.clone()})
    rollout_cfg = SimpleNamespace(over_sample_rate=0.5)
    run = SimpleNamespace(cfg=SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=rollout_cfg)), workers=None)
    metrics = Generation(run).abort_late_samples(batch)
    # lengths 3, 1, 4, 2; K = 2 keeps rows 1 and 3
    assert batch["response_mask"].tolist() == [[0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]]
    assert torch.equal(batch["seq_score"], scores)
    assert metrics == {"rollout/aborted_share": 0.5}
