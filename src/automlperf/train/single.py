"""Training one architecture by itself, as ``automlperf train`` does: a check that a machine
and a dataset can train, outside any run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from automlperf.config import Config, DataConfig
from automlperf.errors import UserError
from automlperf.events import EpochEvent, TrialOutcome
from automlperf.graph import Graph, seeds
from automlperf.train.spec import TrialSpec


@dataclass(kw_only=True)
class TrainRequest:
    """What ``automlperf train`` was asked; None leaves a setting to the configuration."""

    config: Config
    graph: Path | None = None
    model: str | None = None
    epochs: int = 5
    batch_size: int | None = None  # global
    devices: int | None = None
    weights_out: Path | None = None
    patience: int | None = None  # default: no early stop
    seed: int = 0


@dataclass
class TrainPlan:
    """A request checked against the machine and the data, ready to train."""

    graph: Graph
    spec: TrialSpec
    devices: list[str]
    threads: int  # per device
    data: DataConfig  # the configuration's; the pool fills in its workers
    dataset: dict[str, Any]  # name, sizes and shape of the probed dataset
    cpu_binding: str = "auto"  # train.cpu_binding

    def describe(self) -> str:
        d = self.dataset
        return (f"training {self.graph.count('conv2d')} convolutions, {len(self.graph)} layers "
                f"on {len(self.devices)} x {self.devices[0]} ({self.threads} threads each), "
                f"{d['name']}: {d['train_size']} train / {d['val_size']} val images, batch "
                f"{self.spec.batch_size}")


@dataclass
class TrainResult:
    outcome: TrialOutcome
    epochs: list[EpochEvent] = field(default_factory=list)

    @property
    def ops(self) -> int:
        return sum(e.ops for e in self.epochs)

    @property
    def seconds(self) -> float:
        return sum(e.ended_at - e.started_at for e in self.epochs)


def plan_training(req: TrainRequest) -> TrainPlan:
    """Choose the devices, probe the data (failing fast, in one line) and build the spec."""
    from automlperf.train import data as datasets
    from automlperf.hardware import accelerator_memory_gib, choose_devices, cores_available

    if req.graph is not None and req.model is not None:
        raise UserError("give --graph or --model, not both")
    cfg = req.config
    ranks = choose_devices(req.devices)
    threads = max(1, cores_available() // len(ranks))
    probe = datasets.load(cfg.data.model_copy(update={"workers": 0}))
    if req.graph is not None:
        graph = Graph.read(req.graph)
    else:
        # A seed named on the command line has its own widths; the configured one, the
        # configuration's.
        width = cfg.model.seed_width if req.model in (None, cfg.model.seed_model) else 1
        graph = seeds.seed(req.model or cfg.model.seed_model, probe.num_classes,
                           probe.image_size, probe.channels, width)
    if graph.input_shape != probe.input_shape or graph.num_classes != probe.num_classes:
        raise UserError(f"the graph takes {graph.input_shape} with {graph.num_classes} classes "
                        f"but {probe.name} has {probe.input_shape} with {probe.num_classes}; "
                        "pick a matching --image-size or graph")
    batch = req.batch_size or cfg.train.per_device_batch(accelerator_memory_gib()) * len(ranks)
    spec = TrialSpec.from_config(
        cfg.train, cfg.model.initial_weights, trial_id="train", graph=graph.to_dict(),
        epochs=req.epochs, batch_size=batch, patience=req.patience or req.epochs + 1,
        seed=req.seed, weights_out=str(req.weights_out) if req.weights_out else None)
    dataset = {"name": probe.name, "train_size": probe.train_size, "val_size": probe.val_size}
    return TrainPlan(graph, spec, ranks, threads, cfg.data, dataset, cfg.train.cpu_binding)


class _Collect:
    def __init__(self, on_epoch: Callable[[EpochEvent], None] | None) -> None:
        self.events: list[EpochEvent] = []
        self.on_epoch = on_epoch

    def epoch(self, event: EpochEvent) -> None:
        self.events.append(event)
        if self.on_epoch is not None:
            self.on_epoch(event)

    def trial(self, outcome: TrialOutcome) -> None:
        pass


def train_planned(plan: TrainPlan, on_progress: Callable[[dict[str, Any]], None] | None = None,
                  on_epoch: Callable[[EpochEvent], None] | None = None) -> TrainResult:
    """Train the plan's architecture on its devices; ``on_progress`` gets rank 0's progress
    within an epoch, ``on_epoch`` each completed epoch. Ctrl-C kills the training processes
    (mid-epoch, they would not read a polite stop) and goes on as KeyboardInterrupt."""
    from automlperf.train.pooltrainer import PoolTrainer

    trainer = PoolTrainer(plan.devices, plan.data, plan.threads, cpu_binding=plan.cpu_binding)
    trainer.start()
    sink = _Collect(on_epoch)
    try:
        outcome = trainer.train(plan.spec, sink, on_progress=on_progress)
    except KeyboardInterrupt:
        trainer.kill()
        raise
    finally:
        trainer.close()
    return TrainResult(outcome, sink.events)
