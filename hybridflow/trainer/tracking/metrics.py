"""verl's step metrics from a finished batch: scores, rewards, advantages, lengths, timing, throughput.

Names follow verl (``critic/score/mean``, ``response_length/clip_ratio``, ``timing_s/gen``,
``perf/throughput``, ...) so dashboards carry over. Statistics over tokens use the
response mask; statistics over sequences use one value per sequence.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from hybridflow.algos import masked_mean, masked_var
from hybridflow.data.batch import Batch


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(),
            f"{prefix}/min": values.min().item()}


def _masked_stats(prefix: str, values: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    valid = values[mask.bool()]
    if valid.numel() == 0:
        return {f"{prefix}/mean": 0.0, f"{prefix}/max": 0.0, f"{prefix}/min": 0.0}
    return {f"{prefix}/mean": masked_mean(values=values, mask=mask).item(), f"{prefix}/max": valid.max().item(),
            f"{prefix}/min": valid.min().item()}


def rollout_metrics(batch: Batch, *, max_response_length: int) -> dict[str, float]:
    """Score and length statistics of one step's rollout (every trainer that samples reports them)."""
    response_length = batch["response_mask"].sum(-1).float()
    prompt_length = batch["attention_mask"][:, : batch["prompts"].shape[1]].sum(-1).float()
    return {
        **_stats("critic/score", batch["token_level_scores"].sum(-1)),
        **_stats("response_length", response_length),
        "response_length/clip_ratio": (response_length >= max_response_length).float().mean().item(),
        **_stats("prompt_length", prompt_length),
    }


def data_metrics(batch: Batch, *, max_response_length: int, use_critic: bool) -> dict[str, float]:
    """Score / reward / advantage / return / value / length statistics of one step's batch."""
    mask = batch["response_mask"]
    metrics = {
        **rollout_metrics(batch, max_response_length=max_response_length),
        **_stats("critic/rewards", batch["token_level_rewards"].sum(-1)),
        **_masked_stats("critic/advantages", batch["advantages"], mask),
        **_masked_stats("critic/returns", batch["returns"], mask),
    }
    if use_critic:
        metrics.update(_masked_stats("critic/values", batch["values"], mask))
        metrics["critic/vf_explained_var"] = explained_variance(batch["values"], batch["returns"], mask)
    return metrics


def agent_metrics(batch: Batch) -> dict[str, float]:
    """verl's multi-turn metrics (``num_turns/*``, ``tool_call_counts/*``) and the mean per conversation of
    each agent count as ``multi_turn/{name}/mean`` (tool_errors, tool_timeouts, tokenization_mismatch, ...);
    nothing for a single-turn rollout."""
    if "__num_turns__" not in batch:
        return {}
    metrics = {**_stats("num_turns", torch.tensor(list(batch["__num_turns__"]))),
               **_stats("tool_call_counts", torch.tensor(list(batch["tool_call_counts"])))}
    for key in batch.keys():
        if key.startswith("agent/"):
            metrics[f"multi_turn/{key[len('agent/'):]}/mean"] = float(torch.tensor(list(batch[key])).mean())
    return metrics


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var[returns - values] / Var[returns] over valid tokens (1 = perfect critic)."""
    var_returns = masked_var(values=returns, mask=mask)
    var_error = masked_var(values=returns - values, mask=mask)
    return (1.0 - var_error / (var_returns + 1e-5)).item()


def rollout_mismatch_metrics(*, rollout_log_probs: torch.Tensor, old_log_probs: torch.Tensor,
                             mask: torch.Tensor) -> dict[str, float]:
    """How far the engine's sampling log-probs are from the trainer's recomputation.

    A silent source of instability (different kernels, dtypes or stale weights in the
    engine): reported as |p_rollout - p_train| statistics and the mean log-prob gap.
    """
    diff = (rollout_log_probs.exp() - old_log_probs.exp()).abs()
    valid = diff[mask.bool()]
    if valid.numel() == 0:
        return {}
    return {
        "training/rollout_probs_diff_mean": valid.mean().item(),
        "training/rollout_probs_diff_max": valid.max().item(),
        "training/rollout_log_probs_diff_mean": masked_mean(values=(rollout_log_probs - old_log_probs).abs(),
                                                            mask=mask).item(),
    }


def throughput_metrics(*, batch: Batch, step_seconds: float, num_workers: int = 1) -> dict[str, float]:
    """verl's perf/*: tokens processed (prompt + response) per second per worker."""
    total_tokens = float(batch["attention_mask"].sum().item())
    return {"perf/total_num_tokens": total_tokens, "perf/time_per_step": step_seconds,
            "perf/throughput": total_tokens / max(step_seconds, 1e-9) / num_workers}


def memory_metrics() -> dict[str, float]:
    """Peak memory: CUDA allocator on GPU; on CPU the resident set of this process (GiB), both the peak
    since start (``perf/max_memory_rss_gb``) and, on Linux, the peak since the previous call
    (``perf/step_peak_rss_gb``: this step's, when called once per step)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return {"perf/max_memory_allocated_gb": torch.cuda.max_memory_allocated() / 2**30,
                "perf/max_memory_reserved_gb": torch.cuda.max_memory_reserved() / 2**30}
    import resource

    global _process_peak_rss_gb
    step_peak = peak_rss_since_last_call_gb()
    if step_peak is None:  # no resettable window here: the OS's own process peak
        return {"perf/max_memory_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    # Resetting the window resets ru_maxrss too (one counter), so the process peak is the max of the windows.
    _process_peak_rss_gb = max(_process_peak_rss_gb, step_peak)
    return {"perf/max_memory_rss_gb": _process_peak_rss_gb, "perf/step_peak_rss_gb": step_peak}


_process_peak_rss_gb = 0.0


def peak_rss_since_last_call_gb() -> float | None:
    """The resident set's high-water mark (``VmHWM``) since the previous call, in GiB; ``None`` off Linux.

    Linux lets a process reset its own high-water mark to the current resident set (writing 5 to
    ``/proc/self/clear_refs``), so each call reads the mark and starts a new window.
    """
    try:
        with open("/proc/self/status") as status:
            peak_kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except (OSError, StopIteration, ValueError):
        return None
    return peak_kib / 2**20


PHASE_OBSERVERS: list = []
"""Objects with ``enter(name)`` / ``exit(name)``, called inside every timed phase's interval (a benchmark's
device synchronization and per-phase memory peaks: benchmarks/loop_step.py); empty in a training run."""


class Timer:
    """Collects ``timing_s/{name}`` durations of one step: ``with timer("gen"): ...``."""

    def __init__(self):
        self.timings: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        for observer in PHASE_OBSERVERS:
            observer.enter(name)
        try:
            yield
        finally:
            for observer in reversed(PHASE_OBSERVERS):
                observer.exit(name)
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"timing_s/{k}": v for k, v in self.timings.items()}
