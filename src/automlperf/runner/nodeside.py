"""A real replica's side of its node, wired by runner/worker.py ``open_replica``: its devices
and training processes (or simulated devices), how it describes the node and measures its
ceiling at the start and the end, and the node's resource sampler."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from automlperf.config import Config
from automlperf.hardware import accelerator_memory_gib, choose_devices, cores_available
from automlperf.measure.ceiling import EndMeasurement, run_measurement
from automlperf.measure.monitor import SampleCopier
from automlperf.measure.provenance import software
from automlperf.runner.noderecords import RankEnd
from automlperf.store import Store
from automlperf.store.rundir import RunDir
from automlperf.train.pooltrainer import PoolTrainer
from automlperf.train.simulated import SimulatedTrainer, describe_devices, simulated_devices
from automlperf.train.spec import Trainer


@dataclass(frozen=True)
class Training:
    """The devices a replica trains on, with its cores per device, its trainer, the CPU
    rank's measurement of the node (None elsewhere) and the memory a device has."""

    devices: list[str]
    per_device: int
    trainer: Trainer
    measure: Callable[[], dict[str, Any]] | None
    memory_gib: float | None

    @property
    def world(self) -> int:
        return len(self.devices)


def start_training(config: Config, devices: int | None, threads: int | None,
                   require_accelerators: bool, index_dir: str | None) -> Training:
    """The replica's devices and trainer (not started): simulated devices, where nothing
    loads torch, or this node's accelerators (or its CPU) and a pool of training processes."""
    wanted = devices or config.run.devices_per_replica
    if config.simulated:
        chosen = simulated_devices(wanted or 1)
        per_device = max(1, (threads or cores_available()) // len(chosen))
        return Training(chosen, per_device, SimulatedTrainer(chosen, config), None,
                        config.simulation.memory_gib)
    chosen = choose_devices(wanted, require_accelerators or config.run.require_accelerators)
    per_device = max(1, (threads or cores_available()) // len(chosen))
    # A CPU's ceiling is measured by its one training process, which loads torch anyway: the
    # replica's process never does. Several CPU ranks would share the cores while the others
    # start, so their replica measures first, alone.
    measure = (partial(run_measurement, chosen, config.train.precision, per_device,
                       config.monitor.ceiling_s) if chosen == ["cpu"] else None)
    trainer = PoolTrainer(chosen, config.data, per_device, index_dir=index_dir,
                          first_start=measure, cpu_binding=config.train.cpu_binding)
    return Training(chosen, per_device, trainer, measure, accelerator_memory_gib())


class NodeProbe:
    """The node's description, with the software this replica trains with (``check`` holds
    it to the run's) and which copy of the data it reads (``data``: result.json counts them).
    Called before the training processes start (``started`` None), or, where the first of
    them measures the node (a CPU), with their description once they have: None until then."""

    def __init__(self, config: Config, training: Training,
                 data: dict[str, Any] | None = None) -> None:
        self.config = config
        self.training = training
        self.data = data

    def __call__(self, started: dict[str, Any] | None) -> dict[str, Any] | None:
        found = self._describe(started)
        if found is None:
            return None
        return {**found, "software": software(), **({"data": self.data} if self.data else {})}

    def _describe(self, started: dict[str, Any] | None) -> dict[str, Any] | None:
        t, config = self.training, self.config
        if config.simulated:
            # Nothing to measure: the node's own description, with the modelled devices.
            return {"system": simulated_node(config, t.world), "devices": t.devices,
                    "simulated": True, "error": "simulated accelerators: no ceiling is measured"}
        if t.measure is None:
            return run_measurement(t.devices, config.train.precision, t.per_device * t.world,
                                   config.monitor.ceiling_s)
        if started is None:
            return None
        return started.get("node") or {"devices": t.devices, "error": "the first training "
                                       "process measured no ceiling"}


def end_measurement(config: Config, training: Training,
                    local_replicas: int) -> Callable[[], dict[str, Any]] | None:
    """The ceiling again once the run's time is over: by the CPU's rank that measured the
    start, before it stops; else once the ranks have stopped, in a process of its own (the
    replica's never loads torch). None for simulated devices, and where CPU replicas share
    the node's cores (``local_replicas``): they end together and would measure beside one
    another."""
    t = training
    if config.simulated or (t.devices == ["cpu"] and local_replicas > 1):
        return None
    if isinstance(t.trainer, PoolTrainer) and t.measure is not None:
        return RankEnd(t.trainer, t.measure)
    return EndMeasurement(t.devices, config.train.precision, t.per_device * t.world,
                          config.monitor.ceiling_s)


class NodeSampler:
    """The node's sampler process, and the thread that stores what it samples."""

    def __init__(self, proc: subprocess.Popen[str], copier: SampleCopier) -> None:
        self.proc = proc
        self.copier = copier

    def terminate(self) -> None:
        self.proc.terminate()

    def wait(self, timeout: float | None = None) -> Any:
        code = self.proc.wait(timeout)
        self.copier.join(timeout)  # its last sample, taken as it stopped
        return code


def sampler_starter(rd: RunDir, config: Config, store: Store, run_id: int,
                    local_replicas: int) -> Callable[[dict[str, Any]], NodeSampler]:
    """What starts this node's resource sampler once the training processes are up, in a
    process of its own; its samples reach the store through the replica's connection."""

    def start(description: dict[str, Any]) -> NodeSampler:
        # The node's one sampler also covers the GPUs of the other replicas on the node.
        every = ["--every-gpu"] if local_replicas > 1 else []
        if config.simulated:
            every = ["--host-only"]
        node = socket.gethostname()
        rd.logs.mkdir(exist_ok=True)
        with open(rd.logs / f"monitor-{node}.log", "ab") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "automlperf.measure.monitor", "--run-dir",
                 str(rd.path), "--interval", str(config.monitor.interval_s),
                 "--uuids", ",".join(description.get("uuids", [])), "--node", node,
                 "--to-stdout", *every],
                stdout=subprocess.PIPE, stderr=log_file, text=True)
        assert proc.stdout is not None
        return NodeSampler(proc, SampleCopier(proc.stdout, store, run_id, node))

    return start


_described: dict[str, dict[str, Any]] = {}
_described_lock = threading.Lock()


def simulated_node(config: Config, world: int) -> dict[str, Any]:
    """This node's description with ``world`` modelled devices: the same for every replica a
    process hosts, so described once."""
    from automlperf.measure.system import describe

    key = f"{config.simulation.model_dump_json()}/{world}"
    with _described_lock:
        if key not in _described:
            _described[key] = describe(simulated=describe_devices(config.simulation, world))
        return _described[key]
