"""What every item of the checklist shares: its result (:class:`Check`), the request, the
shape it trains, the report, and what earlier items found for later ones (:class:`Node`)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("pass", "warn", "fail", "skip")


@dataclass
class Check:
    """One item of the checklist."""

    name: str
    status: str  # one of STATUSES
    summary: str  # the measured figures, in words
    advice: str = ""  # what to change on a warning or a failure; on a pass, what would gain
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class DoctorRequest:
    out: Path
    quick: bool = False
    devices: int | None = None
    precision: str = "auto"
    run_duration_s: float = 150.0
    data_dir: Path | None = None  # an ImageNet-layout folder of the site's; else generated


@dataclass
class Shape:
    """The model and the images the checklist trains on."""

    model: str
    image_size: int
    classes: int
    official: bool


@dataclass
class DoctorReport:
    checks: list[Check]
    path: Path  # doctor.json
    shape: Shape

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    def to_dict(self) -> dict[str, Any]:
        return {"shape": asdict(self.shape), "checks": [asdict(c) for c in self.checks],
                "passed": not self.failed, "generated_at": time.time()}


class Node:
    """What the earlier items found, for the later ones."""

    def __init__(self, req: DoctorRequest) -> None:
        from automlperf.hardware import choose_devices, cores_available
        from automlperf.train.device import channels_last_default

        self.req = req
        self.devices = choose_devices(req.devices)
        self.cores = cores_available()
        self.threads = max(1, self.cores // len(self.devices))
        self.accelerated = self.devices[0] != "cpu"
        self.channels_last = channels_last_default(self.devices[0].split(":")[0])
        self.ceiling_ops: float | None = None
        # All devices, uncompiled, in the layout a run trains in (any uncompiled rate if
        # that item failed), for sizing the pipeline's need and the official run.
        self.train_images_per_s: float | None = None
        # All devices, a first-round trial of the official shape: the compiled rate when the
        # compile rule compiles such a trial, which is what the loader has to keep up with.
        self.trial_images_per_s: float | None = None
        self.rates: dict[str, float] = {}  # images/s of each training item
        # Seconds a training item's first epoch took beyond its steady rate (start, warm-up,
        # validation and, compiled, the compilation), by item.
        self.first_overheads: dict[str, float] = {}
        self.step_ops: dict[str, float] = {}  # training OPS in steps of each item
