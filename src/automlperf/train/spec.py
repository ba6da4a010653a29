"""What the rest of the package asks of training, without torch: the trial spec and the
:class:`Trainer` protocol a replica trains through. (The dataset a replica's ranks load is the
configuration's data section itself, :class:`automlperf.config.DataConfig`.)

:class:`automlperf.train.pooltrainer.PoolTrainer` is the trainer of real runs (one process per
accelerator); anything else that keeps the protocol can stand in for it.
"""

from __future__ import annotations

from collections.abc import Callable
import math
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from automlperf.config import ModelConfig, TrainConfig
from automlperf.events import EventSink, TrialOutcome
from automlperf.errors import UserError

# The configuration models are the one source of the training defaults.
_TRAIN = TrainConfig()
_MODEL = ModelConfig()


@dataclass
class TrialSpec:
    """Everything a rank needs to train one trial; plain JSON data."""

    trial_id: Any
    graph: dict[str, Any]
    epochs: int
    batch_size: int  # global: images per optimiser step over all ranks
    patience: int
    lr_per_256: float = _TRAIN.lr_per_256
    momentum: float = _TRAIN.momentum
    nesterov: bool = _TRAIN.nesterov
    weight_decay: float = _TRAIN.weight_decay
    warmup_epochs: float = _TRAIN.warmup_epochs
    label_smoothing: float = _TRAIN.label_smoothing
    precision: str = _TRAIN.precision
    channels_last: bool | None = _TRAIN.channels_last
    compile: bool | None = _TRAIN.compile  # None: decided by train.compiling's rule
    compile_figures: dict[str, Any] | None = None  # given figures for that rule
    init: str = _MODEL.initial_weights
    seed: int = 0
    parent_graph: dict[str, Any] | None = None
    parent_weights: str | None = None
    weights_out: str | None = None
    round: int = 0
    # Epochs the learning rate decays to 0 over (a warm-up round trains fewer); default epochs.
    horizon_epochs: int | None = None
    early_stop_metric: str = _TRAIN.early_stop_metric
    early_stop_min_delta: float = _TRAIN.early_stop_min_delta
    # Wall-clock time (time.time()) from which no epoch starts: the run's deadline. The
    # epoch in flight then finishes (the replica stops it only once the grace is over).
    finish_by: float | None = None
    # A second training of the same trial (the paper's HPO order): its epochs are numbered
    # on from this one, and its weights are kept only where they beat this accuracy.
    first_epoch: int = 0
    save_above: float = -1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialSpec:
        return cls(**data)

    @classmethod
    def from_config(cls, train: TrainConfig, seed_init: str, **fields: Any) -> TrialSpec:
        """A spec with the training settings of a ``TrainConfig``; ``fields`` fill the rest."""
        return cls(lr_per_256=train.lr_per_256, momentum=train.momentum,
                   nesterov=train.nesterov, weight_decay=train.weight_decay,
                   warmup_epochs=train.warmup_epochs, label_smoothing=train.label_smoothing,
                   precision=train.precision, channels_last=train.channels_last,
                   compile=train.compile, init=seed_init,
                   compile_figures=(train.compile_figures.model_dump()
                                    if train.compile_figures else None),
                   early_stop_metric=train.early_stop_metric,
                   early_stop_min_delta=train.early_stop_min_delta, **fields)


class EarlyStopping:
    """Stop a trial after ``patience`` epochs in a row that did not improve the watched
    figure by more than ``min_delta``: the validation loss (lower is better; the paper stops
    "once the validation loss flats", its reference with Keras' ``EarlyStopping(min_delta=
    0.001)``) or the validation accuracy (higher is better)."""

    def __init__(self, metric: str, patience: int, min_delta: float = 0.0) -> None:
        if metric not in ("val_loss", "val_accuracy"):
            raise ValueError(f"early stopping watches val_loss or val_accuracy, not {metric!r}")
        self.metric, self.patience, self.min_delta = metric, patience, min_delta
        self.best: float | None = None
        self.stale = 0

    def update(self, val_loss: float | None, val_accuracy: float) -> bool:
        """Account for one epoch; True when the trial should stop after it."""
        if self.metric == "val_loss":
            value = math.inf if val_loss is None or not math.isfinite(val_loss) else val_loss
            improved = self.best is None or value < self.best - self.min_delta
        else:
            value = val_accuracy
            improved = self.best is None or value > self.best + self.min_delta
        if improved:
            self.best, self.stale = value, 0
        else:
            self.stale += 1
        return self.stale >= self.patience


def plan_steps(n: int, world: int, per_rank: int) -> int:
    """Optimiser steps per epoch, the same on every rank: a remainder too small to give
    each rank two images (BatchNorm needs two) joins the step before it."""
    batch = per_rank * world
    steps = max(1, math.ceil(n / batch))
    if steps > 1 and n - (steps - 1) * batch < 2 * world:
        steps -= 1
    return steps


class TrainerError(UserError, RuntimeError):
    """A trainer could not start; the message says why."""


class Trainer(Protocol):
    """What a replica asks of the accelerators it trains on.

    ``start`` comes first and returns the description of what was started: ``dataset``
    (the dataset's ``describe()``: ``classes``, ``image_size``, ``channels``, ...),
    ``devices`` (a name per rank) and ``uuids``. ``train`` may then run any number of trials,
    one at a time; ``close`` ends the trainer politely, ``kill`` at once.
    """

    @property
    def world(self) -> int:
        """Data-parallel ranks: a trial's global batch size is a multiple of it."""
        ...

    def start(self) -> dict[str, Any]:
        """Start; raises :class:`TrainerError` when the accelerators cannot train."""
        ...

    def train(self, spec: TrialSpec, sink: EventSink,
              should_stop: Callable[[], bool] | None = None) -> TrialOutcome:
        """Train one trial, calling ``sink.epoch`` after each completed epoch. When
        ``should_stop`` turns true the trial ends as ``stopped``; the epochs already given to
        the sink stay given. A failing trial returns ``failed`` with its reason (and
        ``extra["failure"]``: an ``events.FailureKind``); it does not raise.
        :class:`TrainerError` means the trainer itself cannot go on (its accelerators could
        not be brought back after a failure): no further trial can train."""
        ...

    def close(self) -> None:
        ...

    def kill(self) -> None:
        ...
