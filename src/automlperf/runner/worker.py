"""The wiring of a real replica: its run directory, store, training processes (or simulated
devices), search and TPE study, the node's measurement and resource sampler, and the entry
point of ``automlperf worker``, which a launcher starts once per node. The loop they serve
is runner/replica.py."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from automlperf.config import Config
from automlperf.dataset.index import DatasetIdentityError
from automlperf.hardware import DeviceError, accelerator_memory_gib, choose_devices, cores_available
from automlperf.errors import UserError
from automlperf.measure.ceiling import EndMeasurement, run_measurement
from automlperf.measure.monitor import SampleCopier
from automlperf.measure.provenance import software
from automlperf.runner.launch import LAUNCHED_ENV, process_started_at
from automlperf.runner import nodedata
from automlperf.runner.noderecords import RankEnd
from automlperf.runner.replica import Placement, Replica
from automlperf.runner.stagecheck import StagedCheck
from automlperf.search import searcher_for
from automlperf.search.hpo import HyperSearch, batch_range, journal_path
from automlperf.store import TrialStatus, history
from automlperf.store.opening import open_run_store, served
from automlperf.store.service.client import service_file
from automlperf.store.rundir import RUN_FILE, RunDir
from automlperf.train.pooltrainer import PoolTrainer
from automlperf.train.simulated import SimulatedTrainer, describe_devices, simulated_devices
from automlperf.train.spec import Trainer

log = logging.getLogger("automlperf.replica")


class SoftwareMismatch(UserError):
    """This node's automlperf is not the one the run was started with."""


def refuse_other_code(provenance: dict[str, Any]) -> None:
    """Refuse to train with other automlperf code than the run records (an image, or a node,
    with another installation; the run's own resumed after an upgrade): its epochs would not
    be the workload's, and `check` would fail the run only once it is over."""
    mine, theirs = software(), provenance.get("source_hash")
    if theirs and mine["source_hash"] != theirs:
        raise SoftwareMismatch(
            f"this node's automlperf ({mine['automlperf_version']}, source "
            f"{mine['source_hash'][:19]}) is not the run's ({provenance.get('automlperf_version')}, "
            f"{str(theirs)[:19]}): install the run's automlperf here and in the image, or "
            "start a new run")


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



def open_replica(run_dir: Path, store_url: str | None, index: int, devices: int | None = None,
                 threads: int | None = None, sample: bool = True,
                 require_accelerators: bool = False, data_root: Path | None = None) -> Replica:
    """The replica of a run directory with the collaborators of a real run: the run's store,
    a pool of training processes on this node's accelerators (or, in a simulated run,
    simulated devices, and then nothing loads torch), the search and its TPE study.
    ``data_root`` is where this replica sees the run's dataset (a container's mount of it)."""
    rd = RunDir(Path(run_dir))
    run_id = int(rd.meta()["run_id"])
    url = rd.store_url(store_url)
    config = Config.load(rd.config)
    if data_root is not None and config.data.data_dir is not None:
        log.info("reading the dataset at %s (the run's %s)", data_root, config.data.data_dir)
        config = config.model_copy(update={"data": config.data.model_copy(
            update={"data_dir": data_root})})
    store = open_run_store(rd.path, url)
    recorded = store.run(run_id)["system"]
    refuse_other_code(recorded.get("provenance") or {})
    # The seed the run drew at its start, when its configuration names none.
    config = config.model_copy(update={"run": config.run.model_copy(
        update={"seed": config.seed_used(recorded)})})
    index_dir, data_record, data_check = None, None, None
    if config.data.dataset == "imagenet" and config.data.data_dir is not None:
        # The data need only be on this node, checked here, once: the copy staged on it, or
        # the shared one (runner/nodedata.py).
        try:
            here = nodedata.for_replica(rd.path, Path(config.data.data_dir), recorded)
        except BaseException:
            store.close()
            raise
        if here is not None:
            index_dir, data_record = str(here.index_dir), here.record
            if here.record.get("source") == "staged" and here.record.get("archives"):
                # Its staging's record is a file: the replica hashes the copy itself.
                data_check = StagedCheck(here.data_dir)
            config = config.model_copy(update={"data": config.data.model_copy(
                update={"data_dir": here.data_dir})})
    wanted = devices or config.run.devices_per_replica
    trainer: Trainer
    measure = None
    if config.simulated:
        chosen = simulated_devices(wanted or 1)
        per_device = max(1, (threads or cores_available()) // len(chosen))
        trainer = SimulatedTrainer(chosen, config)
        memory: float | None = config.simulation.memory_gib
    else:
        chosen = choose_devices(wanted, require_accelerators or config.run.require_accelerators)
        per_device = max(1, (threads or cores_available()) // len(chosen))
        # A CPU's ceiling is measured by its one training process, which loads torch
        # anyway: this process never does. Several CPU ranks would share the cores while
        # the others start, so their replica measures first, alone.
        measure = (partial(run_measurement, chosen, config.train.precision, per_device,
                           config.monitor.ceiling_s)
                   if chosen == ["cpu"] else None)
        trainer = PoolTrainer(chosen, config.data, per_device, index_dir=index_dir,
                              first_start=measure, cpu_binding=config.train.cpu_binding)
        memory = accelerator_memory_gib()
    place = Placement(dir=rd, run_id=run_id, config=config, index=index,
                      segment=store.segments(run_id)[-1], devices=chosen, threads=per_device)
    world = len(chosen)
    default_batch = config.train.per_device_batch(memory) * world
    search = config.search
    hpo = HyperSearch(journal_path(rd.path, index), f"run-{run_id}-replica-{index}",
                      batch_range(default_batch, search.batch_size_factors, world),
                      search.kernel_sizes, multiple=world, seed=config.seed_used() + index,
                      startup_trials=search.tpe_startup_trials)

    def probe(started: dict[str, Any] | None) -> dict[str, Any] | None:
        """The node's description and the software this replica trains with (``check``
        holds it to the run's)."""
        found = describe_node(started)
        if found is None:
            return None
        # Which copy of the data it reads, and what it was: result.json counts them.
        return {**found, "software": software(), **({"data": data_record} if data_record else {})}

    def describe_node(started: dict[str, Any] | None) -> dict[str, Any] | None:
        """The node's description: before the training processes start (None: after, from
        ``started``, the pool's description)."""
        if config.simulated:
            # Nothing to measure: the node's own description, with the modelled devices.
            return {"system": _simulated_node(config, world), "devices": chosen,
                    "simulated": True, "error": "simulated accelerators: no ceiling is measured"}
        if measure is None:
            return run_measurement(chosen, config.train.precision, per_device * world,
                                   config.monitor.ceiling_s)
        if started is None:
            return None
        return started.get("node") or {"devices": chosen, "error": "the first training "
                                       "process measured no ceiling"}

    def sampler(description: dict[str, Any]) -> NodeSampler:
        """This node's resource sampler, in a process of its own; its samples reach the
        store through this replica's connection."""
        from automlperf.runner.identity import local_size

        # The node's one sampler also covers the GPUs of the other replicas on the node.
        every = ["--every-gpu"] if local_size() > 1 else []
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

    # The ceiling again once the run's time is over: by the CPU's rank that measured the
    # start, before it stops; else once the ranks have stopped, in a process of its own (this
    # one never loads torch). Not where CPU replicas share the node's cores: they end
    # together and would measure beside one another.
    from automlperf.runner.identity import local_size

    measure_end: Callable[[], dict[str, Any]] | None = None
    shared_cores = chosen == ["cpu"] and local_size() > 1
    if isinstance(trainer, PoolTrainer) and measure is not None and not shared_cores:
        measure_end = RankEnd(trainer, measure)
    elif not config.simulated and not shared_cores:
        measure_end = EndMeasurement(chosen, config.train.precision, per_device * world,
                                     config.monitor.ceiling_s)
    replica = Replica(place, store, trainer, searcher_for(search), hpo, default_batch,
                      probe_node=probe, start_sampler=sampler if sample else None,
                      history=history.shared(store.url, run_id), measure_end=measure_end,
                      data_check=data_check)
    if isinstance(trainer, SimulatedTrainer):
        trainer.waiter = replica.wait_stop  # a simulated epoch ends early only for a stop
    return replica


_described: dict[str, dict[str, Any]] = {}
_described_lock = threading.Lock()


def _simulated_node(config: Config, world: int) -> dict[str, Any]:
    """This node's description with ``world`` modelled devices: the same for every replica a
    process hosts, so described once."""
    from automlperf.measure.system import describe

    key = f"{config.simulation.model_dump_json()}/{world}"
    with _described_lock:
        if key not in _described:
            _described[key] = describe(simulated=describe_devices(config.simulation, world))
        return _described[key]


def wait_for_session(run_dir: Path, store_url: str | None, timeout_s: float,
                     poll_s: float = 1.0) -> bool:
    """Wait until the run directory is prepared and its current session is open: a site's
    launcher may start replicas before (or while) the primary sets the run up."""
    rd = RunDir(Path(run_dir))
    deadline = time.monotonic() + timeout_s
    store = None
    try:
        while True:
            url = rd.store_url(store_url) if (rd.path / RUN_FILE).exists() else None
            # A run on a database is reached through its store service, once it listens.
            if (rd.path / RUN_FILE).exists() and (not served(url) or service_file(rd.path).exists()):
                if store is None:
                    store = open_run_store(rd.path, url)
                segments = store.segments(int(rd.meta()["run_id"]))
                if segments and segments[-1].ended_at is None and \
                        segments[-1].deadline_at > time.time():
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
    finally:
        if store is not None:
            store.close()


def run_worker(run_dir: Path, store_url: str | None, index: int | None, devices: int | None,
               threads: int | None, sample: bool = True, wait_s: float = 0.0,
               require_accelerators: bool = False, retired_status: int = 1,
               data_root: Path | None = None) -> int:
    """Entry point of ``automlperf worker``; identity from the launcher's environment when
    not given. A replica that retires (it cannot start, or cannot train) exits with
    ``retired_status``: a launcher that ends every rank on a non-zero exit would otherwise
    turn one sick node into a lost run."""
    imported = time.time()
    from automlperf.runner.identity import local_rank, replica_identity

    source = "--replica-index"
    if index is None:
        index, source = replica_identity()
        # One resource sampler per node: the first replica a launcher put there.
        sample = sample and local_rank() == 0
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s replica-{index} %(levelname)s %(message)s")
    log.info("replica %d (from %s) on %s%s", index, source, socket.gethostname(),
             ", sampling the node's resources" if sample else "")
    if wait_s > 0 and not wait_for_session(run_dir, store_url, wait_s):
        log.error("no open session of a run in %s after %.0f s: start `automlperf run "
                  "--launcher external --run-dir %s` first", run_dir, wait_s, run_dir)
        return 1
    try:
        replica = open_replica(run_dir, store_url, index, devices, threads, sample,
                               require_accelerators, data_root)
        log.info("start-up: %s", startup_line(imported, time.time()))
    except (DeviceError, DatasetIdentityError, SoftwareMismatch) as exc:
        # This node cannot train: said through the store, so that the primary retires this
        # replica in one line (and ends the run only when no replica is left).
        log.error("replica %d cannot start: %s", index, exc)
        record_cannot_start(run_dir, store_url, index, str(exc))
        return retired_status
    signal.signal(signal.SIGTERM, lambda *_: replica.stop.set())
    return retired_status if replica.run() else 0


def startup_line(imported: float, ready: float, env: dict[str, str] | None = None,
                 created: float | None = None) -> str:
    """This replica's start-up, part by part: from its launch to its process (the launcher's
    fan-out, a container's start), the interpreter and its imports, and opening the replica
    (store, data check, node description, training processes; a wait for the session
    included, where `--wait` asked for one). `created` is this process's start, read from
    the kernel unless given: each read differs by up to a tick of /proc/uptime."""
    if created is None:
        created = process_started_at()
    parts = []
    launched = (os.environ if env is None else env).get(LAUNCHED_ENV, "")
    try:
        parts.append(f"launch {created - float(launched):.2f} s")
    except ValueError:
        pass
    parts += [f"imports {imported - created:.2f} s", f"opening {ready - imported:.2f} s"]
    return ", ".join(parts)


def record_cannot_start(run_dir: Path, store_url: str | None, index: int, reason: str) -> None:
    """Register this replica in the run's current session as one that gave up at its start,
    with the reason."""
    rd = RunDir(Path(run_dir))
    store = open_run_store(rd.path, rd.store_url(store_url))
    try:
        run_id = int(rd.meta()["run_id"])
        segment = store.segments(run_id)[-1].index
        now = time.time()
        rep = store.register_replica(run_id, index, segment, socket.gethostname(), os.getpid(),
                                     [], now)
        store.end_replica(rep, TrialStatus.FAILED, now, reason)
    finally:
        store.close()
