"""What training reports: one record per completed epoch, one outcome per trial, and the
small interface they are written through.

Plain data shared by the trainer (which produces it), the store (which keeps it) and the
scoring (which counts it); nothing here needs torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol


class TrialStatus(StrEnum):
    """Where a trial stands: ``running`` until it ends ``completed``, ``failed`` or
    ``stopped`` (cut short by the deadline or a stop), once. A replica's record uses the same
    words. Members are strings, stored as such."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    STOPPED = "stopped"

    @classmethod
    def final(cls) -> tuple[TrialStatus, ...]:
        return (cls.COMPLETED, cls.FAILED, cls.STOPPED)

    @classmethod
    def of_outcome(cls, status: str) -> TrialStatus:
        """How a trial whose training ended ``status`` is recorded: anything but completed
        or stopped is a failure."""
        return {"completed": cls.COMPLETED, "stopped": cls.STOPPED}.get(status, cls.FAILED)


class FailureKind(StrEnum):
    """Why a trial failed, as its trainer found it (``TrialOutcome.extra["failure"]``): out
    of memory, a non-finite loss, its data (unreadable, mismatched), a training process that
    died, or any other error. Members are strings, stored as such."""

    OOM = "oom"
    NAN = "nan"
    DATA = "data"
    CRASH = "crash"
    ERROR = "error"


@dataclass(kw_only=True)
class EpochEvent:
    """One completed epoch, the unit the score is made of (built by name: it has many
    fields, and the store's record adds its run)."""

    trial_id: Any
    epoch: int
    started_at: float
    ended_at: float
    train_images: int
    val_images: int
    steps: int
    ops: int
    train_loss: float
    val_accuracy: float
    precision: str
    batch_size: int
    world_size: int
    data_share: float  # of the training time, waiting for the next batch's data
    images_per_s: float
    skipped_images: int = 0  # unreadable training images
    val_skipped: int = 0  # unreadable validation images
    # Of the training time, the device's side: running the steps (on a CPU) or launching them
    # (on an accelerator), and waiting for the device (a copy still running, a result read,
    # the epoch's end). None in epochs recorded before it was measured apart from data_share.
    device_share: float | None = None
    compiled: bool = False  # trained through torch.compile (train.compiling decides)
    decode_path: str = ""  # what decoded the images, with its libraries' versions
    cpu_decoded: int = 0  # images a GPU decoding path left to the CPU reference
    # Mean validation loss (what early stopping may watch): the cross-entropy without label
    # smoothing (in runs of rulesets before aiperf-2021.4, the training loss's, smoothing
    # included); None in records written before it was kept, and where no validation image
    # was read.
    val_loss: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(kw_only=True)
class TrialOutcome:
    trial_id: Any
    status: str  # a final TrialStatus
    reason: str = ""
    epochs: int = 0
    best_accuracy: float | None = None
    best_epoch: int | None = None
    batch_size: int = 0
    precision: str = ""
    weights: str | None = None
    early_stopped: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class EventSink(Protocol):
    def epoch(self, event: EpochEvent) -> None: ...

    def trial(self, outcome: TrialOutcome) -> None: ...


class JsonlSink:
    """Appends one JSON object per line and flushes it to disk before returning, so an
    interrupted run keeps every event it reported."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def epoch(self, event: EpochEvent) -> None:
        self._write({"type": "epoch", **event.to_dict()})

    def trial(self, outcome: TrialOutcome) -> None:
        self._write({"type": "trial", **outcome.to_dict()})

    def close(self) -> None:
        self._file.close()


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    """Records of a JSON-lines file; a torn last line (a kill mid-write) is ignored."""
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    # One parse of the whole file (`check` reads half a million lines at 10,000 trials); a
    # file it does not parse as one object per line is read line by line.
    try:
        records = json.loads("[" + ",".join(lines) + "]")
    except json.JSONDecodeError:
        records = None
    if records is not None and len(records) == len(lines) and all(isinstance(r, dict) for r in records):
        return records
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
