"""`automlperf doctor`: one command that tells a site whether a node is ready to run the
benchmark and how close it comes to its hardware. It runs the node checklist on whatever the
node has (CUDA, ROCm, XPU or CPU only): the devices and their driver, each device's dense
ceiling in the run's precision (machine.py), the seed ResNet-50 at 224 training alone (eager,
channels last, compiled; training.py), memory at the default batch and at the top of TPE's
range (memory.py), the rank's own input pipeline alone and beside training (pipeline.py),
energy counters (machine.py), and a short `automlperf run` of the official shape on a
generated ImageNet-layout folder followed by `automlperf check`, its speed judged against the
training item's (official.py). Each item passes, warns or fails with one line saying what to
change.

``quick`` shrinks every item (a small seed at 32 px, no compilation, a run of one round) so
that the test suite can take the same path; its figures are not the official shape's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from automlperf.runner.doctor.common import STATUSES, Check, DoctorReport, DoctorRequest, Node, Shape
from automlperf.runner.doctor import machine, memory, official, pipeline, training

__all__ = ["ITEMS", "STATUSES", "Check", "DoctorReport", "DoctorRequest", "Node", "Shape",
           "run_doctor"]

# In order: later items use what earlier ones measured (the ceiling, the training rate).
ITEMS: list[tuple[str, Callable[[Node, Shape], Check]]] = [
    ("devices", machine.devices), ("ceiling", machine.ceiling),
    ("train eager", training.train_eager), ("train channels_last", training.train_channels_last),
    ("train compiled", training.train_compiled), ("memory", memory.memory),
    ("input pipeline", pipeline.pipeline), ("energy", machine.energy),
    ("official run", official.official_run)]


def run_doctor(req: DoctorRequest, on_check: Callable[[Check], None] | None = None) -> DoctorReport:
    """Run the checklist, writing ``req.out/doctor.json`` after every item (an interrupted
    doctor keeps what it measured)."""
    req.out.mkdir(parents=True, exist_ok=True)
    shape = (Shape("resnet_small", 32, 4, False) if req.quick
             else Shape("resnet50", 224, 1000, True))
    report = DoctorReport([], req.out / "doctor.json", shape)
    node = Node(req)
    from automlperf.train.data import DataError

    for name, item in ITEMS:
        started = time.monotonic()
        try:
            check = item(node, shape)
        except DataError as exc:  # its message names the problem and the fix
            check = Check(name, "fail", str(exc).splitlines()[0][:500],
                          "repair the data folder (the line above says how)")
        except Exception as exc:  # noqa: BLE001 - one broken item must not hide the others
            check = Check(name, "fail", f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                          "an unexpected error; the other items still ran")
        check.seconds = round(time.monotonic() - started, 1)
        report.checks.append(check)
        report.path.write_text(json.dumps(report.to_dict(), indent=2))
        if on_check is not None:
            on_check(check)
    return report
