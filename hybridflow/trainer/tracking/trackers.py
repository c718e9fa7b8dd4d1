"""Experiment tracking: one ``Tracking`` object fans each step's metrics out to the configured backends.

Backends are chosen by name (``trainer.logger=['console','file']``, verl's names) from a
registry; each is a small class with ``log(metrics, step)`` and ``finish()``. Optional
packages (wandb, swanlab, mlflow) are imported only when their backend is asked for.

Where each backend writes (``local_dir`` is the run's log directory):

- ``console``: a compact line per step through ``tqdm.write`` (so it does not break an
  active progress bar); all metrics at DEBUG level on the ``hybridflow.tracking`` logger.
- ``file``: ``{local_dir}/metrics.jsonl``, one ``{"step": N, ...}`` line per step, flushed
  and appended (a resumed run continues the same file).
- ``tensorboard``: event files under ``{local_dir}/tensorboard``.
- ``wandb``: run files under ``{local_dir}/wandb``. The mode is ``$WANDB_MODE`` when set;
  otherwise ``online`` if ``$WANDB_API_KEY`` is set and ``offline`` if not, so a laptop
  without an account or network still records the run (``wandb sync`` uploads it later).
- ``swanlab``: run files under ``{local_dir}/swanlog``. The mode is ``$SWANLAB_MODE`` when set;
  otherwise ``cloud`` if ``$SWANLAB_API_KEY`` is set and ``offline`` if not (``swanlab sync``
  uploads an offline run later).
- ``mlflow``: ``$MLFLOW_TRACKING_URI`` when set, else the local file store
  ``file:{local_dir}/mlruns`` (``MLFLOW_ALLOW_FILE_STORE=true`` is set for it, since
  MLflow 3 otherwise refuses the file store; point ``MLFLOW_TRACKING_URI`` at
  ``sqlite:///...`` or a server to use a database instead).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from tqdm import tqdm

from hybridflow.errors import ConfigError
from hybridflow.trainer.tracking.above_bar import console_above_bar

logger = logging.getLogger("hybridflow.tracking")

# (metric, short label) shown on the console line, in this order, when present.
CONSOLE_METRICS = (
    ("critic/score/mean", "score"),
    ("response_length/mean", "resp_len"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/entropy", "entropy"),
    ("actor/ppo_kl", "ppo_kl"),
    ("train/loss", "loss"),
    ("val/loss", "val_loss"),
    ("timing_s/step", "step_s"),
)


class TrackingBackend(Protocol):
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def finish(self) -> None: ...

    # Optional: ``log_generations(samples, step)`` with samples [(input, output, score), ...]
    # (``trainer.log_val_generations``); backends without it skip the samples.


Generations = Sequence[tuple[str, str, float]]
GENERATION_COLUMNS = ("step", "input", "output", "score")


def generation_rows(samples: Generations, step: int) -> list[list[Any]]:
    """One row per sample, columns ``GENERATION_COLUMNS``."""
    return [[step, text_in, text_out, float(score)] for text_in, text_out, score in samples]


BackendFactory = Callable[..., TrackingBackend]
_BACKENDS: dict[str, BackendFactory] = {}


def register_backend(name: str) -> Callable[[BackendFactory], BackendFactory]:
    """Register a backend under ``name``, built with keywords project_name, experiment_name, config, local_dir."""

    def decorate(factory: BackendFactory) -> BackendFactory:
        _BACKENDS[name] = factory
        return factory

    return decorate


def available_backends() -> list[str]:
    return sorted(_BACKENDS)


def _import_optional(package: str):
    """Import an optional package or raise a one-line ConfigError that says how to install it."""
    try:
        return importlib.import_module(package)
    except ImportError as error:
        raise ConfigError(
            f"trainer.logger includes {package!r} but {package} is not installed: pip install 'hybridflow[{package}]'"
        ) from error


def _as_float(value: Any) -> float:
    """Metrics arrive as Python, numpy or 0-d torch numbers; backends want plain floats."""
    return float(value.item() if hasattr(value, "item") else value)


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` for backends whose params are flat."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat


def format_console_line(metrics: Mapping[str, float], step: int) -> str:
    """``step 3 | score 0.25 | resp_len 41.5 | ...``: the headline metrics that are present, 4 significant digits,
    then every validation score under its full name, as verl prints it at each ``test_freq`` (step 0 included)."""
    parts = [f"step {step}"]
    parts += [f"{label} {metrics[key]:.4g}" for key, label in CONSOLE_METRICS if key in metrics]
    parts += [f"{key} {value:.4g}" for key, value in sorted(metrics.items()) if key.startswith("val-core/")]
    return " | ".join(parts)


@register_backend("console")
class ConsoleBackend:
    def __init__(self, **_: Any):
        pass

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        tqdm.write(format_console_line(metrics, step))
        logger.debug("step %d metrics: %s", step, json.dumps(dict(metrics), sort_keys=True))

    def finish(self) -> None:
        pass


METRICS_FILE = "metrics.jsonl"
"""What the ``file`` logger writes under its ``local_dir`` (``<default_local_dir>/logs`` in a run)."""


@register_backend("file")
class JsonlBackend:
    """verl's ``file`` logger: append ``{"step": N, **metrics}`` per step to ``{local_dir}/metrics.jsonl``."""

    def __init__(self, *, local_dir: str, **_: Any):
        os.makedirs(local_dir, exist_ok=True)
        self.path = os.path.join(local_dir, METRICS_FILE)
        self._file = open(self.path, "a", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._file.write(json.dumps({"step": step, **metrics}) + "\n")
        self._file.flush()  # a crash after this step must not lose its line

    def log_generations(self, samples: Generations, step: int) -> None:
        """Append the samples to ``{local_dir}/val_generations.jsonl``, one line per sample."""
        with open(os.path.join(os.path.dirname(self.path), "val_generations.jsonl"), "a", encoding="utf-8") as fh:
            for row in generation_rows(samples, step):
                fh.write(json.dumps(dict(zip(GENERATION_COLUMNS, row)), ensure_ascii=False) + "\n")

    def resume_at(self, step: int) -> list[dict[str, float]]:
        """The rows logged up to ``step`` (a run resumed from that step's checkpoint), which stay in the file.
        Rows past it were logged by steps after the last checkpoint, which the resumed run logs again: they
        move to ``metrics.superseded.jsonl`` beside it, so the file holds each step once and nothing is lost.
        A torn last line (a crash mid-write) is dropped."""
        self._file.close()
        kept, superseded, torn = [], [], False
        with open(self.path, encoding="utf-8") as handle:
            for line in handle:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    torn = True
                    continue
                (kept if row.get("step", 0) <= step else superseded).append(row)
        if superseded:
            folder = os.path.dirname(self.path)
            with open(os.path.join(folder, "metrics.superseded.jsonl"), "a", encoding="utf-8") as handle:
                handle.writelines(json.dumps(row) + "\n" for row in superseded)
        if superseded or torn:  # rewritten, else the next row would be appended onto the torn line
            staging = self.path + ".tmp"
            with open(staging, "w", encoding="utf-8") as handle:
                handle.writelines(json.dumps(row) + "\n" for row in kept)
            os.replace(staging, self.path)
        self._file = open(self.path, "a", encoding="utf-8")
        return kept

    def finish(self) -> None:
        self._file.close()


@register_backend("tensorboard")
class TensorboardBackend:
    def __init__(self, *, local_dir: str, config: Mapping[str, Any], tensorboard_dir: str | None = None, **_: Any):
        from torch.utils.tensorboard import SummaryWriter

        # trainer.tensorboard_dir, else verl's TENSORBOARD_DIR, else beside the other logs 
        self.log_dir = tensorboard_dir or os.environ.get("TENSORBOARD_DIR") or os.path.join(local_dir, "tensorboard")
        self._writer = SummaryWriter(log_dir=self.log_dir)
        self._writer.add_text("config", json.dumps(config, indent=2, default=str))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def log_generations(self, samples: Generations, step: int) -> None:
        """One markdown text entry ``val/generations`` per validation."""
        lines = [f"**input:** {i}\n\n**output:** {o}\n\n**score:** {s}" for i, o, s in samples]
        self._writer.add_text("val/generations", "\n\n---\n\n".join(lines), global_step=step)
        self._writer.flush()

    def finish(self) -> None:
        self._writer.close()


def hosted_mode(environ: Mapping[str, str], *, product: str, online: str) -> str:
    """``$<PRODUCT>_MODE`` if set; else ``online`` with ``$<PRODUCT>_API_KEY``, offline without (no network needed)."""
    if environ.get(f"{product}_MODE"):
        return environ[f"{product}_MODE"]
    return online if environ.get(f"{product}_API_KEY") else "offline"


def wandb_mode(environ: Mapping[str, str]) -> str:
    """``$WANDB_MODE`` if set; else online with an API key, offline without."""
    return hosted_mode(environ, product="WANDB", online="online")


@register_backend("wandb")
class WandbBackend:
    def __init__(self, *, project_name: str, experiment_name: str, config: Mapping[str, Any], local_dir: str,
                 **_: Any):
        wandb = _import_optional("wandb")
        os.makedirs(local_dir, exist_ok=True)
        self._run = wandb.init(
            project=project_name, name=experiment_name, config=dict(config), dir=local_dir, mode=wandb_mode(os.environ)
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def log_generations(self, samples: Generations, step: int) -> None:
        """A ``val/generations`` table (step, input, output, score); rows of earlier steps are kept."""
        import wandb

        self._rows = getattr(self, "_rows", []) + generation_rows(samples, step)
        self._run.log({"val/generations": wandb.Table(columns=list(GENERATION_COLUMNS), data=self._rows)}, step=step)

    def finish(self) -> None:
        self._run.finish()


def swanlab_mode(environ: Mapping[str, str]) -> str:
    """``$SWANLAB_MODE`` if set; else cloud with an API key, offline without."""
    return hosted_mode(environ, product="SWANLAB", online="cloud")


@register_backend("swanlab")
class SwanlabBackend:
    def __init__(self, *, project_name: str, experiment_name: str, config: Mapping[str, Any], local_dir: str,
                 **_: Any):
        self._swanlab = _import_optional("swanlab")
        logdir = os.path.join(local_dir, "swanlog")
        os.makedirs(logdir, exist_ok=True)
        self._run = self._swanlab.init(project=project_name, experiment_name=experiment_name, config=dict(config),
                                       logdir=logdir, mode=swanlab_mode(os.environ))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._swanlab.log(dict(metrics), step=step)

    def log_generations(self, samples: Generations, step: int) -> None:
        """One ``val/generations`` text per sample (input, output and score in its caption)."""
        texts = [self._swanlab.Text(f"input: {i}\n\noutput: {o}", caption=f"score {s:.4g}") for i, o, s in samples]
        self._swanlab.log({"val/generations": texts}, step=step)

    def finish(self) -> None:
        self._swanlab.finish()


def mlflow_metric_name(name: str) -> str:
    """MLflow rejects ``@`` in metric names (``val-core/x/reward/mean@4``); spell it ``_at_`` as verl does."""
    return name.replace("@", "_at_")


@register_backend("mlflow")
class MlflowBackend:
    def __init__(self, *, project_name: str, experiment_name: str, config: Mapping[str, Any], local_dir: str,
                 **_: Any):
        self._mlflow = _import_optional("mlflow")
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = "file:" + os.path.abspath(os.path.join(local_dir, "mlruns"))
            # MLflow >= 3.x refuses the file store (maintenance mode) unless this opt-out is set.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._mlflow.set_tracking_uri(uri)
        self._mlflow.set_experiment(project_name)
        self._mlflow.start_run(run_name=experiment_name)
        # MLflow caps a param value at a few thousand characters; config values are short.
        self._mlflow.log_params({k: str(v)[:500] for k, v in _flatten(config).items()})

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._mlflow.log_metrics({mlflow_metric_name(k): v for k, v in metrics.items()}, step=step)

    def log_generations(self, samples: Generations, step: int) -> None:
        """A ``val_generations/step_{N}.json`` artifact with the samples."""
        rows = [dict(zip(GENERATION_COLUMNS, row)) for row in generation_rows(samples, step)]
        self._mlflow.log_dict(rows, f"val_generations/step_{step}.json")

    def finish(self) -> None:
        self._mlflow.end_run()


class Tracking:
    """Send each step's metrics to every backend in ``backends`` and keep them in ``history``.

    Args:
        project_name / experiment_name: ``trainer.project_name`` / ``trainer.experiment_name``.
        backends: names from :func:`available_backends` (``trainer.logger``).
        config: the resolved run config (plain dict), recorded by backends that store it.
        local_dir: where file-based backends write.
    """

    def __init__(
        self,
        project_name: str,
        experiment_name: str,
        backends: list[str] | str,
        config: Mapping[str, Any] | None = None,
        local_dir: str = "tracking",
        tensorboard_dir: str | None = None,
    ):
        names = [backends] if isinstance(backends, str) else list(backends)
        unknown = [name for name in names if name not in _BACKENDS]
        if unknown:
            raise ConfigError(f"unknown trainer.logger backend(s) {unknown}; choose from {available_backends()}")
        self.history: list[dict[str, float]] = []
        self._progress: tqdm | None = None
        settings = dict(project_name=project_name, experiment_name=experiment_name, local_dir=local_dir,
                        tensorboard_dir=tensorboard_dir)
        self._backends = [
            _BACKENDS[name](config=dict(config or {}), **settings)
            for name in dict.fromkeys(names)  # ordered, de-duplicated
        ]

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record ``metrics`` for ``step`` (numbers of any kind; NaN/inf are kept so problems stay visible)."""
        values = {key: _as_float(value) for key, value in metrics.items()}
        self.history.append({"step": step, **values})
        for backend in self._backends:
            backend.log(values, step)
        if self._progress is not None:
            self._progress.update(step - self._progress.n)
            if "critic/score/mean" in values and not math.isnan(values["critic/score/mean"]):
                self._progress.set_postfix(score=f"{values['critic/score/mean']:.3f}", refresh=False)

    def resume_at(self, step: int) -> None:
        """A run resumed from ``step``: the history starts with the steps before it, as the ``file`` backend
        logged them, so the end-of-run summary, the plots and a demo's before -> after cover the whole run
        (without the ``file`` logger they cover this process's steps only)."""
        for backend in self._backends:
            if hasattr(backend, "resume_at"):
                self.history = backend.resume_at(step) + self.history

    def log_generations(self, samples: Generations, step: int) -> None:
        """Validation samples (input, output, score) to every backend that keeps text: file, tensorboard,
        wandb, swanlab, mlflow (the console prints none)."""
        for backend in self._backends:
            if hasattr(backend, "log_generations"):
                backend.log_generations(samples, step)

    @contextlib.contextmanager
    def progress(self, total_steps: int, initial_step: int = 0) -> Iterator[tqdm]:
        """A tqdm bar over training steps that ``log`` advances; the console backend prints above it."""
        bar = tqdm(total=total_steps, initial=initial_step, desc="training", unit="step", dynamic_ncols=True)
        self._progress = bar
        try:
            with console_above_bar():  # warnings, log lines and prints start on a line of their own
                yield bar
        finally:
            self._progress = None
            bar.close()

    def finish(self) -> None:
        for backend in self._backends:
            backend.finish()


class EveryNthStep:
    """A tracking front that forwards step metrics only every ``log_freq`` steps (``+trainer.log_freq``).

    Validation before training (step 0) always goes through."""

    def __init__(self, tracking, log_freq: int):
        self.tracking, self.log_freq = tracking, log_freq

    @property
    def history(self) -> list[dict[str, float]]:
        return self.tracking.history

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        if step % self.log_freq == 0:
            self.tracking.log(metrics, step=step)

    def progress(self, total_steps: int, initial_step: int = 0):
        return self.tracking.progress(total_steps, initial_step=initial_step)

    def resume_at(self, step: int) -> None:
        self.tracking.resume_at(step)

    def finish(self) -> None:
        self.tracking.finish()
