"""The best trial's accuracy measured again from its saved weights, not taken on trust.

The regulated score is the score times -ln(1 - best accuracy), so an accuracy written into
the records would raise it unseen by every other check: the operation counts do not depend
on it. ``automlperf check --remeasure`` loads the best trial's weights
(``trials/<id>/weights.safetensors``, saved at its best epoch) into the architecture built
from its graph, and runs the trainer's own validation pass (:mod:`automlperf.train.evaluate`)
over the validation set, with the run's precision and over the images and batches the run's
ranks validated. It passes when the accuracy measured is within :func:`tolerance` of the one
recorded for that epoch, and when it validated as many images.

Why a tolerance at all: the weights, images and batches are the run's, but the arithmetic
need not be. Another device, driver or library version runs other kernels, which add in
another order; cuDNN's autotuner picks its kernels by timing them, so even the same GPU need
not repeat itself; and in bf16 or fp16 every activation is rounded to 8 or 11 significant
bits on the way. Each of these moves a logit by a rounding error, and an image whose two best
classes lie within that of each other may change class. Such images are few and change both
ways, so the accuracy moves by a small fraction of a percent at most: :data:`TOLERANCE` per
precision, and never less than :data:`TOLERANCE_IMAGES` images of the validation set. Weights
that are another model's move it by far more (the test swaps in another trial's).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from automlperf.config import Config
from automlperf.errors import UserError
from automlperf.store import EpochRecord, TrialRecord
from automlperf.store.base import RunRecords

# Absolute accuracy, by the precision the run validated in.
TOLERANCE = {"fp32": 0.002, "tf32": 0.003, "bf16": 0.005, "fp16": 0.005}
TOLERANCE_IMAGES = 2


class RemeasureError(UserError, ValueError):
    """The accuracy cannot be re-measured (no weights, no data); the message says why."""


def tolerance(precision: str, images: int) -> float:
    """How far the re-measured accuracy may lie from the recorded one."""
    return max(TOLERANCE.get(precision, max(TOLERANCE.values())),
               TOLERANCE_IMAGES / max(1, images))


@dataclass
class Remeasurement:
    trial: int
    epoch: int
    recorded: float
    measured: float
    correct: int
    images: int
    recorded_images: int
    precision: str
    tolerance: float
    device: str
    problem: str | None

    @property
    def ok(self) -> bool:
        return self.problem is None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def best_epoch(trial: TrialRecord, epochs: list[EpochRecord]) -> EpochRecord:
    """The epoch whose weights the trial saved: the first of its most accurate ones (the
    trainer saves only on a strict improvement)."""
    mine = sorted((e for e in epochs if e.trial_id == trial.id), key=lambda e: e.epoch)
    if not mine:
        raise RemeasureError(f"trial {trial.id} recorded no epoch: there is no accuracy to "
                             "re-measure")
    return max(mine, key=lambda e: (e.val_accuracy, -e.epoch))


def remeasure(root: Path, records: RunRecords, run_id: int, config: Config,
              result: dict[str, Any], data_dir: Path | None = None,
              device: str | None = None) -> Remeasurement:
    """Re-measure the validation accuracy of the best trial of the run (or bundle) at
    ``root`` whose records are ``records``; ``data_dir`` replaces the run's data folder."""
    if result.get("simulated"):
        raise RemeasureError("a simulated run trained no model: there are no weights to "
                             "re-measure")
    if config.data.dataset == "synthetic":
        raise RemeasureError("a run on synthetic data has no accuracy to re-measure")
    best_id = result.get("best_trial")
    trials = {t.id: t for t in records.trials(run_id)}
    if best_id not in trials:
        raise RemeasureError("the run has no best trial: no epoch was counted")
    trial = trials[best_id]
    epoch = best_epoch(trial, records.epochs(run_id))
    weights = root / "trials" / str(trial.id) / "weights.safetensors"
    if not weights.exists():
        raise RemeasureError(f"trials/{trial.id}/weights.safetensors is missing: the best "
                             "trial's weights are needed to re-measure its accuracy")
    folder = data_dir if data_dir is not None else config.data.data_dir
    if config.data.dataset in ("imagenet", "cifar10") and (folder is None
                                                           or not Path(folder).is_dir()):
        raise RemeasureError(f"the {config.data.dataset} validation set is not at "
                             f"{folder or 'the configured data_dir'}: give its folder with "
                             "--data-dir")
    return _remeasure(trial, epoch, weights, config, folder, device)


def _validation_index(folder: Path | None) -> str | None:
    """For the official archives, an index of the validation archive alone (the training
    archive, 138 GB, is neither read nor needed to re-measure an accuracy): its folder, made
    here once per archive folder and process. None for a folder, which is walked."""
    from automlperf.dataset.archive import is_archive_folder
    from automlperf.train.data.index import scan_image_folder

    if folder is None or not is_archive_folder(folder):
        return None
    key = str(Path(folder).resolve())
    if key not in _val_indexes:
        import atexit
        import shutil
        import tempfile

        where = tempfile.mkdtemp(prefix="automlperf-val-index-")
        atexit.register(shutil.rmtree, where, True)
        scan_image_folder(folder, splits=("val",)).save(where)
        _val_indexes[key] = where
    return _val_indexes[key]


_val_indexes: dict[str, str] = {}


def _remeasure(trial: TrialRecord, epoch: EpochRecord, weights: Path, config: Config,
               folder: Path | None, device_name: str | None) -> Remeasurement:
    import torch

    from automlperf.graph import Graph
    from automlperf.hardware import cores_available
    from automlperf.train.data import DataError, load
    from automlperf.train import evaluate
    from automlperf.train.evaluate import WeightsError

    try:
        device = torch.device(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as exc:
        raise RemeasureError(f"--device {device_name!r}: {exc}") from None
    section = config.data.model_copy(update={"data_dir": folder}).for_ranks(cores_available())
    world = max(1, epoch.world_size)
    per_rank = max(1, epoch.batch_size // world)
    allowed = tolerance(epoch.precision, epoch.val_images)
    graph = Graph.from_json(trial.graph_json)
    problem = None
    correct = seen = 0
    try:
        data = load(section, _validation_index(folder), device_type=device.type)
        if (graph.input_shape, graph.num_classes) != (data.input_shape, data.num_classes):
            problem = (f"trial {trial.id}'s architecture takes {graph.input_shape} images in "
                       f"{graph.num_classes} classes, but the data given are "
                       f"{data.input_shape} in {data.num_classes}: not the run's dataset")
        else:
            correct, seen = evaluate.remeasure(graph, weights, data, epoch.precision, world,
                                               per_rank, device, config.train.channels_last)
    except WeightsError as exc:
        problem = f"trials/{trial.id}/{exc}"
    except DataError as exc:
        raise RemeasureError(str(exc)) from None
    measured = correct / seen if seen else 0.0
    if problem is None and seen != epoch.val_images:
        problem = (f"validated {seen:,} images, but the run validated {epoch.val_images:,} in "
                   f"epoch {epoch.epoch}: not the same validation set")
    elif problem is None and abs(measured - epoch.val_accuracy) > allowed:
        problem = (f"trial {trial.id}'s weights score {measured:.4f} on the validation set, "
                   f"but the run recorded {epoch.val_accuracy:.4f} for epoch {epoch.epoch} "
                   f"(tolerance {allowed:.4f} in {epoch.precision})")
    return Remeasurement(trial.id, epoch.epoch, epoch.val_accuracy, measured, correct, seen,
                         epoch.val_images, epoch.precision, allowed, str(device), problem)
