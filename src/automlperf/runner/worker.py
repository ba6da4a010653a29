"""The wiring of a real replica: its run directory, store, training processes (or simulated
devices), search and TPE study, the node's measurement and resource sampler, and the entry
point of ``automlperf worker``, which a launcher starts once per node. The loop they serve
is runner/replica.py."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from automlperf.config import Config
from automlperf.dataset.index import DatasetIdentityError
from automlperf.hardware import DeviceError
from automlperf.errors import UserError
from automlperf.measure.provenance import software
from automlperf.runner.launch import LAUNCHED_ENV, process_started_at
from automlperf.runner import nodedata
from automlperf.runner.nodeside import NodeProbe, end_measurement, sampler_starter, start_training
from automlperf.runner.replica import Placement, Replica
from automlperf.runner.stagecheck import StagedCheck
from automlperf.search import searcher_for
from automlperf.search.hpo import HyperSearch, batch_range, journal_path
from automlperf.store import TrialStatus, history
from automlperf.store.opening import open_run_store, served
from automlperf.store.service.client import service_file
from automlperf.store.rundir import RUN_FILE, RunDir
from automlperf.train.simulated import SimulatedTrainer

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


def open_replica(run_dir: Path, store_url: str | None, index: int, devices: int | None = None,
                 threads: int | None = None, sample: bool = True,
                 require_accelerators: bool = False, data_root: Path | None = None) -> Replica:
    """The replica of a run directory with the collaborators of a real run: the run's store,
    a pool of training processes on this node's accelerators (or, in a simulated run,
    simulated devices, and then nothing loads torch), the search and its TPE study.
    ``data_root`` is where this replica sees the run's dataset (a container's mount of it)."""
    from automlperf.runner.identity import local_size

    rd = RunDir(Path(run_dir))
    run_id = int(rd.meta()["run_id"])
    config = Config.load(rd.config)
    if data_root is not None and config.data.data_dir is not None:
        log.info("reading the dataset at %s (the run's %s)", data_root, config.data.data_dir)
        config = _with_data_dir(config, data_root)
    store = open_run_store(rd.path, rd.store_url(store_url))
    recorded = store.run(run_id)["system"]
    refuse_other_code(recorded.get("provenance") or {})
    # The seed the run drew at its start, when its configuration names none.
    config = config.model_copy(update={"run": config.run.model_copy(
        update={"seed": config.seed_used(recorded)})})
    try:
        here = _node_data(rd, config, recorded)
    except BaseException:
        store.close()
        raise
    if here is not None:
        config = _with_data_dir(config, here.data_dir)
    training = start_training(config, devices, threads, require_accelerators,
                              None if here is None else str(here.index_dir))
    world, search = training.world, config.search
    place = Placement(dir=rd, run_id=run_id, config=config, index=index,
                      segment=store.segments(run_id)[-1], devices=training.devices,
                      threads=training.per_device)
    default_batch = config.train.per_device_batch(training.memory_gib) * world
    hpo = HyperSearch(journal_path(rd.path, index), f"run-{run_id}-replica-{index}",
                      batch_range(default_batch, search.batch_size_factors, world),
                      search.kernel_sizes, multiple=world, seed=config.seed_used() + index,
                      startup_trials=search.tpe_startup_trials)
    staged = here is not None and here.record.get("source") == "staged" and \
        bool(here.record.get("archives"))
    replica = Replica(
        place, store, training.trainer, searcher_for(search), hpo, default_batch,
        probe_node=NodeProbe(config, training, None if here is None else here.record),
        start_sampler=(sampler_starter(rd, config, store, run_id, local_size()) if sample
                       else None),
        history=history.shared(store.url, run_id),
        measure_end=end_measurement(config, training, local_size()),
        # A staging's record is a file: the replica hashes the staged copy itself.
        data_check=StagedCheck(here.data_dir) if here is not None and staged else None)
    if isinstance(training.trainer, SimulatedTrainer):
        # A simulated epoch ends early only for a stop.
        training.trainer.waiter = replica.wait_stop
    return replica


def _with_data_dir(config: Config, data_dir: Path | str) -> Config:
    return config.model_copy(update={"data": config.data.model_copy(
        update={"data_dir": data_dir})})


def _node_data(rd: RunDir, config: Config, recorded: dict[str, Any]) -> nodedata.NodeData | None:
    """The copy of an ImageNet dataset this node reads, checked here, once: the copy staged
    on it, or the shared one (runner/nodedata.py); None for other data."""
    if config.data.dataset != "imagenet" or config.data.data_dir is None:
        return None
    return nodedata.for_replica(rd.path, Path(config.data.data_dir), recorded)


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
