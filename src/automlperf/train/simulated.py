"""A simulated accelerator: a :class:`~automlperf.train.spec.Trainer` that trains nothing.

It exists to run the rest of the benchmark (primary, replicas, search, TPE, store, monitor,
score, check, report) at a scale this machine's devices cannot give: dozens of replicas on
a few cores. A trial "trains" by waiting as long as the configured device would take for
each epoch's operations, counted by the real counter (:func:`automlperf.ops.epoch_ops` of
the candidate's graph, its batch and the dataset's real image counts), divided by the
sustained rate of the replica's simulated devices and by the time compression. Its epochs
report those real image counts and operations, and an accuracy drawn from a seeded model of
learning curves: the same for the same seed, trial and epoch.

Nothing here loads torch, reads images or writes weights: children do not inherit their
parents' weights (:attr:`SimulatedTrainer.inherits_weights`), and every figure a simulated
run produces is a model's, labelled as such in its result; it is never a measurement.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from automlperf import rules
from automlperf.config import Config, DataConfig, SimulationConfig
from automlperf.events import EpochEvent, EventSink, FailureKind, TrialOutcome, TrialStatus
from automlperf.graph import Graph, GraphError, seeds
from automlperf.ops import count, epoch_ops
from automlperf.train.spec import EarlyStopping, TrialSpec, plan_steps

DEVICE_TYPE = "sim"

# Classes, channels and images of each dataset as automlperf loads it (train/data/), so a
# simulated epoch is as long as a real one: CIFAR-10's standard split, the shipped samples'
# fixed splits (ImageNet-1k: the ruleset's counts, and synthetic: its settings).
_SHAPES: dict[str, tuple[int, int, int, int]] = {  # classes, channels, train, validation
    "cifar10": (10, 3, 50_000, 10_000),
    "builtin": (10, 1, 4_000, 1_000),
    "digits": (10, 1, 1_437, 360),
}

# (accuracy the seed model reaches over the full epoch budget, a ceiling no grown network
# passes) per dataset: the model's anchors, near what these seeds reach when trained for real
# (ResNet-50 reaches about 76 % top-1 on ImageNet; twice its operations, as ResNet-101, about
# 1.5 points more).
_ACCURACY: dict[str, tuple[float, float]] = {
    "imagenet": (0.76, 0.80),
    "cifar10": (0.92, 0.96),
    "builtin": (0.95, 0.99),
    "digits": (0.96, 0.995),
}
# A modelled preference for a per-device batch size, so that TPE has something to find.
_BEST_PER_RANK = 192
_CURVE_RATE = 5.0  # how fast a trial approaches its accuracy over the learning-rate horizon


def dataset_shape(data: DataConfig) -> dict[str, Any]:
    """What ``train.data.load(...).describe()`` says of the configured dataset, without
    loading it: its classes, image size, channels and image counts."""
    if data.dataset == "synthetic":
        classes, channels = data.synthetic_classes, 3
        train, val = data.synthetic_images, max(1, data.synthetic_images // 4)
    elif data.dataset == "imagenet":
        imagenet = rules.CURRENT.dataset
        classes, channels = imagenet.num_classes, 3
        train, val = imagenet.train_images, imagenet.val_images
    else:
        classes, channels, train, val = _SHAPES[data.dataset]
    return {"name": data.dataset, "classes": classes, "image_size": data.image_size,
            "channels": channels, "train_images": train, "val_images": val,
            "official": False, "simulated": True}


def simulated_devices(count: int) -> list[str]:
    return [f"{DEVICE_TYPE}:{i}" for i in range(count)]


def device_name(sim: SimulationConfig) -> str:
    """A name no one can take for a real device's."""
    return f"simulated accelerator ({sim.sustained_ops:.3g} OPS sustained)"


def describe_devices(sim: SimulationConfig, count: int) -> list[dict[str, Any]]:
    """The accelerator entries of a system description for ``count`` simulated devices:
    no vendor, no peak (nothing was measured), the modelled rate."""
    return [{"index": i, "name": device_name(sim), "type": DEVICE_TYPE, "vendor": "none",
             "simulated": True, "memory_gib": sim.memory_gib, "sustained_ops": sim.sustained_ops,
             "time_compression": sim.time_compression, "peak_ops": None, "peak_precision": None}
            for i in range(count)]


@dataclass(frozen=True)
class CurveModel:
    """Seeded learning curves. A trial's accuracy at the end of its learning-rate horizon
    grows with its network's forward operations over the seed's (with diminishing
    returns), has an offset of its own per architecture (the same for any trial of that
    graph) and a penalty for a per-device batch far from a modelled best; each epoch's
    accuracy approaches it along a saturating curve and is drawn, like a real validation,
    as a count of correct images out of the validation set."""

    dataset: str
    classes: int
    val_images: int
    seed_forward: float  # forward operations per image of the seed model

    @classmethod
    def for_config(cls, config: Config) -> CurveModel:
        shape = dataset_shape(config.data)
        seed = seeds.seed(config.model.seed_model, shape["classes"], shape["image_size"],
                          shape["channels"], config.model.seed_width)
        return cls(config.data.dataset, shape["classes"], shape["val_images"],
                   count(seed).forward)

    @property
    def chance(self) -> float:
        return 1.0 / self.classes

    def final_accuracy(self, graph: Graph, per_rank: int, trial_seed: int) -> float:
        """The accuracy this trial would reach at the end of its learning-rate horizon."""
        if self.dataset not in _ACCURACY:  # synthetic: random labels, nothing to learn
            return self.chance
        base, ceiling = _ACCURACY[self.dataset]
        room = ceiling - base
        growth = max(0.0, math.log2(max(count(graph).forward, 1.0) / self.seed_forward))
        gain = room * (1.0 - math.exp(-growth))
        own = random.Random(f"architecture:{graph.content_hash()}").gauss(0.0, 0.1 * room)
        penalty = 0.25 * room * math.log2(max(per_rank, 1) / _BEST_PER_RANK) ** 2
        luck = random.Random(f"trial:{trial_seed}").gauss(0.0, 0.05 * room)
        return min(ceiling, max(self.chance, base + gain + own - penalty + luck))

    def mean_accuracy(self, final: float, epoch: int, horizon: int) -> float:
        """The expected accuracy after ``epoch`` (0-based) of a ``horizon``-epoch schedule."""
        progress = min(1.0, (epoch + 1) / max(1, horizon))
        reached = (1.0 - math.exp(-_CURVE_RATE * progress)) / (1.0 - math.exp(-_CURVE_RATE))
        return self.chance + (final - self.chance) * reached

    def accuracy(self, final: float, epoch: int, horizon: int, trial_seed: int) -> float:
        """One validation: correct images out of the validation set, drawn around the mean."""
        mean = self.mean_accuracy(final, epoch, horizon)
        n = self.val_images
        rng = random.Random(f"epoch:{trial_seed}:{epoch}")
        correct = round(n * mean + rng.gauss(0.0, math.sqrt(n * mean * (1.0 - mean))))
        return min(n, max(0, correct)) / n


@dataclass(frozen=True)
class EpochPlan:
    """What one simulated epoch of a trial does: the real counts and how long it waits."""

    batch_size: int  # global, a multiple of the ranks
    steps: int
    train_images: int
    val_images: int
    ops: int
    train_ops: int
    seconds: float  # wall-clock, after time compression


class SimulatedTrainer:
    """Keeps the Trainer protocol on ``devices`` simulated devices of ``config.simulation``;
    ``clock`` and ``sleep`` are the time it waits by (injectable, so a test can run the
    timing model without waiting)."""

    inherits_weights = False  # a child starts where the curve model says, not from its parent

    def __init__(self, devices: list[str], config: Config,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.devices = list(devices)
        self.config = config
        self.sim = config.simulation
        self.clock = clock
        self.sleep = sleep
        self.shape = dataset_shape(config.data)
        self.curves: CurveModel | None = None
        self.closed = False
        # Waits up to its argument for a reason to stop, and says whether there is one: a
        # wait woken by the stop itself, where the replica offers one (runner/replica.py
        # wait_stop), instead of a look every ``poll_s``.
        self.waiter: Callable[[float], bool] | None = None

    @property
    def world(self) -> int:
        return len(self.devices)

    def start(self) -> dict[str, Any]:
        self.curves = CurveModel.for_config(self.config)
        return {"dataset": self.shape, "devices": [device_name(self.sim)] * self.world,
                "uuids": [], "simulated": True, "inherits_weights": self.inherits_weights}

    def precision(self, spec: TrialSpec) -> str:
        # The modelled device is a GPU: "auto" is what a GPU with bf16 trains in.
        return "bf16" if spec.precision == "auto" else spec.precision

    def plan(self, spec: TrialSpec, graph: Graph) -> EpochPlan:
        """One epoch's steps, images and operations, counted as the real trainer counts
        them, and the time the modelled devices take for them."""
        per_rank = spec.batch_size // self.world
        batch = per_rank * self.world
        train, val = self.shape["train_images"], self.shape["val_images"]
        steps = plan_steps(train, self.world, per_rank)
        counted = count(graph, batch_size=batch)
        ops = epoch_ops(counted, train, steps, val)
        rate = self.sim.sustained_ops * self.world * self.sim.time_compression
        return EpochPlan(batch, steps, train, val, ops, epoch_ops(counted, train, steps, 0),
                         ops / rate)

    def _wait_until(self, end: float, should_stop: Callable[[], bool] | None) -> bool:
        """Wait until ``end`` by the clock, woken by a stop (:attr:`waiter`) or looking for
        one every ``poll_s``; True if stopped first."""
        while True:
            if should_stop is not None and should_stop():
                return True
            left = end - self.clock()
            if left <= 0:
                return False
            if self.waiter is not None and self.sleep is time.sleep:
                if self.waiter(left):
                    return True
            else:
                self.sleep(min(left, self.sim.poll_s))

    def _refuse(self, spec: TrialSpec, graph: Graph) -> str | None:
        """Why the real trainer would refuse this trial, as it says it."""
        expected = (self.shape["channels"], self.shape["image_size"], self.shape["image_size"])
        if graph.input_shape != expected:
            return f"graph input {graph.input_shape} does not match the {self.shape['name']} " \
                   f"images {expected}"
        if graph.num_classes != self.shape["classes"]:
            return f"graph has {graph.num_classes} outputs but {self.shape['name']} has " \
                   f"{self.shape['classes']} classes"
        if spec.batch_size < self.world:
            return f"batch size {spec.batch_size} is smaller than the {self.world} ranks"
        return None

    def train(self, spec: TrialSpec, sink: EventSink,
              should_stop: Callable[[], bool] | None = None) -> TrialOutcome:
        if self.curves is None:
            self.start()
        assert self.curves is not None
        precision = self.precision(spec)
        outcome = TrialOutcome(trial_id=spec.trial_id, status=TrialStatus.FAILED,
                               batch_size=spec.batch_size, precision=precision, extra={"simulated": True})
        try:
            graph = Graph.from_dict(spec.graph)
        except GraphError as exc:
            outcome.reason, outcome.extra["failure"] = f"data: {exc}", FailureKind.DATA
            return outcome
        refused = self._refuse(spec, graph)
        if refused is not None:
            outcome.reason, outcome.extra["failure"] = refused, FailureKind.DATA
            return outcome
        plan = self.plan(spec, graph)
        outcome.batch_size = plan.batch_size
        final = self.curves.final_accuracy(graph, plan.batch_size // self.world, spec.seed)
        horizon = spec.horizon_epochs or spec.epochs
        best = spec.save_above
        stopper = EarlyStopping(spec.early_stop_metric, spec.patience, spec.early_stop_min_delta)
        # Epoch ends are scheduled from the trial's start, not from the end of the previous
        # wait: a real device goes on training while its host records an epoch, so the time
        # the sink takes must not stall the simulated one (only a sink slower than an epoch
        # would, as it would a real device's queue).
        began = self.clock()
        for epoch in range(spec.epochs):
            started = began + epoch * plan.seconds
            ended = began + (epoch + 1) * plan.seconds
            if spec.finish_by is not None and started >= spec.finish_by:
                outcome.status, outcome.reason = TrialStatus.STOPPED, "deadline reached"
                return outcome
            if self._wait_until(ended, should_stop):
                outcome.status, outcome.reason = TrialStatus.STOPPED, "deadline reached"
                return outcome
            accuracy = self.curves.accuracy(final, epoch, horizon, spec.seed)
            train_seconds = plan.seconds * plan.train_ops / plan.ops
            # The modelled curve has no loss of its own: the cross-entropy of its accuracy.
            loss = -math.log(max(accuracy, self.curves.chance))
            sink.epoch(EpochEvent(
                trial_id=spec.trial_id, epoch=spec.first_epoch + epoch, started_at=started,
                ended_at=ended,
                train_images=plan.train_images, val_images=plan.val_images, steps=plan.steps,
                ops=plan.ops, train_loss=loss, val_loss=loss,
                val_accuracy=accuracy, precision=precision, batch_size=plan.batch_size,
                world_size=self.world, data_share=0.0, device_share=1.0,
                images_per_s=plan.train_images / max(train_seconds, 1e-12)))
            outcome.epochs = epoch + 1
            if accuracy > best:
                best = accuracy
                outcome.best_accuracy, outcome.best_epoch = accuracy, spec.first_epoch + epoch
            if stopper.update(loss, accuracy):
                outcome.early_stopped = True
                break
        outcome.status = TrialStatus.COMPLETED
        return outcome

    def close(self) -> None:
        self.closed = True

    def kill(self) -> None:
        self.closed = True
