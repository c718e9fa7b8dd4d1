"""The critic: a value model (causal-LM backbone + scalar head) and its PPO value update.

V(s_t) for response token t is read at the position *before* t (the state the token is
generated from): values[:, t] = head(h[P - 1 + t]) with P the prompt length.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass

import torch

from hybridflow.algos import masked_mean, value_loss
from hybridflow.data.batch import Batch
from hybridflow.models.logprob import packed_forward_inputs, packed_shard
from hybridflow.data.parallel import DataParallel, LOCAL
from hybridflow.workers.logprob import pack_micro_batch
from hybridflow.workers.micro_batches import LogProbBatching, micro_batches, pad_right, trimmed_inputs
from hybridflow.workers.optim import TrainState
from hybridflow.workers.ppo_update import UpdateSchedule, averaged, optimizer_step, ppo_mini_batches


def _micro_values(model, micro: Batch, *, layout: str = "padded") -> torch.Tensor:
    """Values ``[b, T]`` for one micro-batch (padded: all-pad columns trimmed, then padded back;
    packed layouts: read at each response token's predecessor in the packed row)."""
    if layout != "padded":
        packed = pack_micro_batch(micro, layout=layout)
        shard = packed_shard(model, packed)  # this rank's slice under sequence parallelism
        values = model(**packed_forward_inputs(model, packed, shard=shard))[0, shard.local_keep].float()
        return packed.scatter(shard.gather(values)) * micro["response_mask"]
    inputs, resp_len = trimmed_inputs(micro)
    values = model(**inputs)[:, -resp_len - 1 : -1].float()  # V(s_t) = head(h[P-1+t])
    return pad_right(values, micro["responses"].shape[1]) * micro["response_mask"]


@dataclass(frozen=True)
class ValueObjective:
    """The critic's clipped value loss (``algos/value_loss.py``), mapped from verl's critic keys."""

    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    max_response_length: int | None = None
    loss_scale_factor: float | None = None


class CriticWorker:
    """Value model + optimizer + schedule, told explicitly how to batch its forward and walk an update."""

    def __init__(self, *, state: TrainState, schedule: UpdateSchedule, objective: ValueObjective = ValueObjective(),
                 forward: LogProbBatching = LogProbBatching(), dp: DataParallel = LOCAL, seed: int = 0,
                 layout: str = "padded"):
        self.state = state
        self.model = state.model
        self.schedule = schedule
        self.objective = objective
        self.forward = forward
        self.dp = dp
        self.seed = seed
        self.layout = layout

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> torch.Tensor:
        """V(s_t) ``[B, T]`` for every response token (0 on padding)."""
        self.model.eval()
        pieces = micro_batches(batch, micro_batch_size=self.forward.micro_batch_size,
                               use_dynamic_bsz=self.forward.use_dynamic_bsz, max_token_len=self.forward.max_token_len,
                               dp=self.dp)
        return torch.cat([_micro_values(self.model, m, layout=self.layout) for m in pieces])

    def update_critic(self, batch: Batch, *, step: int = 0) -> dict[str, float]:
        """Value-loss steps over mini-batches x ppo_epochs (needs values, returns): the actor's loop
        (``workers/ppo_update.py``) with the clipped value loss."""
        self.model.train()
        metrics: dict[str, list[float]] = defaultdict(list)
        for counts, micros in ppo_mini_batches(batch, schedule=self.schedule, dp=self.dp, seed=self.seed, step=step):
            loss_fn = functools.partial(self._micro_loss, counts=counts)
            optimizer_step(state=self.state, dp=self.dp, micros=micros, loss_fn=loss_fn, metrics=metrics,
                           loss_key="vf_loss")
        self.state.scheduler.step()
        out = averaged(metrics, prefix="critic/")
        out["critic/lr"] = self.state.lr
        return out

    def _micro_loss(self, micro: Batch, *, counts: dict[str, float]):
        vpreds = _micro_values(self.model, micro, layout=self.layout)
        loss, micro_metrics = value_loss(
            vpreds=vpreds, values=micro["values"], returns=micro["returns"], response_mask=micro["response_mask"],
            cliprange_value=self.objective.cliprange_value, loss_agg_mode=self.objective.loss_agg_mode,
            global_num_tokens=counts["tokens"], global_num_seqs=counts["seqs"],
            max_response_length=self.objective.max_response_length,
            loss_scale_factor=self.objective.loss_scale_factor,
        )
        vpred_mean = masked_mean(values=vpreds.detach(), mask=micro["response_mask"]).item()
        return loss, {"vf_loss": loss.item()}, {"vf_clipfrac": micro_metrics["vf_clipfrac"], "vpred_mean": vpred_mean}
