"""The synchronous rollout source: each step generates from the next prompt batch with the current weights;
with DAPO's dynamic sampling (``algorithm.filter_groups``) it generates more batches until enough prompt groups
have responses that differ; with PRIME's accuracy filter it keeps the groups that pass out of an oversampled batch."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch

from hybridflow.data.batch import Batch
from hybridflow.errors import HybridflowError
from hybridflow.trainer.loop.generation import Generation, PromptStream
from hybridflow.trainer.loop.parts import Rollout
from hybridflow.trainer.tracking.metrics import Timer

logger = logging.getLogger(__name__)


class SyncSource:
    """The next prompt batch, generated and scored now; with ``refill`` (DAPO's :class:`GroupRefill`) topped up
    from further prompt batches."""

    def __init__(self, generation: Generation, prompts: PromptStream, *, refill: "GroupRefill | None" = None):
        self.generation, self.prompts, self.refill = generation, prompts, refill

    def next_rollout(self, *, step: int, timer: Timer, metrics: dict) -> Rollout:
        prompts = next(self.prompts)
        batch = self.generation.rollout_and_score(prompts, step=step, timer=timer, metrics=metrics)
        if self.refill is not None:

            def generate_more(attempt: int) -> Batch:
                return self.generation.rollout_and_score(next(self.prompts), step=step, timer=timer, metrics={},
                                                         attempt=attempt)

            batch = self.refill(batch, generate_more, step=step, metrics=metrics)
        return Rollout(batch, prompts)

    def after_step(self, rollout: Rollout) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return self.prompts.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prompts.load_state_dict(state)

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class GroupRefill:
    """DAPO dynamic sampling (arXiv 2503.14476, Sec. 3.2): groups whose responses all get the same
    ``filter_groups.metric`` are dropped, and more prompt batches are generated until ``wanted`` groups remain."""

    filter_groups: Any
    n: int
    wanted: int

    def __call__(self, batch: Batch, generate_more: Callable[[int], Batch], *, step: int, metrics: dict) -> Batch:
        return keep_informative_groups(batch, generate_more, filter_groups=self.filter_groups, n=self.n,
                                       wanted=self.wanted, step=step, metrics=metrics)


def keep_informative_groups(batch: Batch, generate_more: Callable[[int], Batch], *, filter_groups, n: int,
                            wanted: int, step: int, metrics: dict) -> Batch:
    """The first ``wanted`` groups (n consecutive rows) with varied ``filter_groups.metric``, from ``batch`` and as
    many more generation batches (``generate_more(attempt)``, attempt 1, 2, ...) as it takes."""
    kept, num_groups, groups_seen, gen_batches = [], 0, 0, 1
    while True:
        informative = informative_rows(batch, metric=filter_groups.metric, n=n)
        kept.append(batch.index_select(informative))
        num_groups += len(informative) // n
        groups_seen += len(batch) // n
        if num_groups >= wanted:
            break
        if 0 < filter_groups.max_num_gen_batches <= gen_batches:
            raise HybridflowError(
                f"algorithm.filter_groups: only {num_groups} of {wanted} prompt groups had varied "
                f"{filter_groups.metric} after {gen_batches} generation batches; raise max_num_gen_batches "
                "(0 = no limit) or check the reward")
        batch = generate_more(gen_batches)
        gen_batches += 1
    metrics.update({"train/num_gen_batches": gen_batches, "train/num_informative_groups": num_groups})
    warn_if_filtering_is_costly(gen_batches=gen_batches, step=step, informative=num_groups, seen=groups_seen,
                                metric=filter_groups.metric)
    return Batch.concat(kept).index_select(list(range(wanted * n)))


@dataclass
class AccuracyFilter:
    """verl-recipe PRIME's filter and oversampling (``data.filter_accuracy``, ``accuracy_lower_bound`` /
    ``upper_bound``, ``filter_truncate``, ``oversample_factor``): the generation batch holds ``oversample_factor``
    times the train batch's prompts; the groups (n consecutive rows) that pass come first, the others after,
    in generation order, and the first ``wanted`` groups are trained on."""

    data: Any
    n: int
    wanted: int

    def __call__(self, batch: Batch, generate_more: Callable[[int], Batch], *, step: int, metrics: dict) -> Batch:
        passing = prime_passing_groups(batch, self.data, n=self.n)
        order = torch.argsort((~passing).to(torch.int8), stable=True)[: self.wanted]
        metrics.update({"train/prime_passing_groups": int(passing.sum()), "train/prime_groups_seen": len(passing)})
        return batch.index_select(group_rows(order.tolist(), n=self.n))


def prime_passing_groups(batch: Batch, data: Any, *, n: int) -> torch.Tensor:
    """``[groups]`` bool: the group's accuracy (mean ``seq_score`` of its n responses) lies within
    [accuracy_lower_bound, accuracy_upper_bound] (with ``filter_accuracy``) and none of its responses reached
    ``max_response_length - 1`` tokens (with ``filter_truncate``), as PRIME's ``filter_and_downsample``."""
    passing = torch.ones(len(batch) // n, dtype=torch.bool)
    if data.filter_accuracy:
        accuracy = batch["seq_score"].float().cpu().reshape(-1, n).mean(-1)
        passing &= (accuracy >= data.accuracy_lower_bound) & (accuracy <= data.accuracy_upper_bound)
    if data.filter_truncate:
        longest = batch["response_mask"].sum(-1).cpu().reshape(-1, n).max(-1).values
        passing &= longest < data.max_response_length - 1
    return passing


def informative_rows(batch: Batch, *, metric: str, n: int) -> list[int]:
    """Rows of the groups (n consecutive rows) whose ``metric`` is not constant."""
    values = {"score": batch["seq_score"], "seq_reward": batch["token_level_scores"].sum(-1)}.get(metric)
    if values is None:
        values = batch[f"reward_extra/{metric}"]  # a scorer's extra metric, e.g. DAPO's acc
    groups = values.float().reshape(-1, n)
    varied = (groups.max(dim=1).values - groups.min(dim=1).values) > 0
    return group_rows(varied.nonzero().flatten().tolist(), n=n)


def group_rows(groups: list[int], *, n: int) -> list[int]:
    """The rows of ``groups`` (indices of n-row groups), in that order."""
    return [g * n + i for g in groups for i in range(n)]


COSTLY_GEN_BATCHES = 4
"""Generation batches in one step past which dynamic sampling warns: each one is a whole rollout."""
_costly_filtering_warned = False


def warn_if_filtering_is_costly(*, gen_batches: int, step: int, informative: int, seen: int, metric: str) -> bool:
    """Warn once per process when a step needed more than ``COSTLY_GEN_BATCHES`` generation batches.
    Nothing else caps the cost (``max_num_gen_batches`` defaults to 0, no limit, as in verl): on a task the
    model almost never (or always) solves, a step takes many rollouts and the run looks stuck."""
    global _costly_filtering_warned
    if gen_batches <= COSTLY_GEN_BATCHES or _costly_filtering_warned:
        return False
    _costly_filtering_warned = True
    logger.warning(
        "dynamic sampling: step %d needed %d generation batches, only %d of %d prompt groups had varied %s; each "
        "batch is a whole rollout. The task may be too hard (or too easy) for the model: try an easier task, an "
        "SFT warm-up or a longer data.max_response_length, and cap the cost with "
        "algorithm.filter_groups.max_num_gen_batches (0 = no limit)", step, gen_batches, informative, seen, metric)
    return True
