"""Starting and stopping replicas: as local processes (the default), SLURM job steps
(runner/slurm.py), or not at all when the site's own launcher starts them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from automlperf.errors import UserError
from automlperf.store.urls import replica_env
from automlperf.train.oomkill import OomWatch


# When a launcher started the replicas (seconds since the epoch): a replica's start-up line
# then says how long its launch took to become its process.
LAUNCHED_ENV = "AUTOMLPERF_LAUNCHED_AT"


def process_started_at() -> float:
    """When this process started (seconds since the epoch), to the kernel's tick: its age from
    /proc (ticks since boot, against the uptime) taken from now. psutil's create_time adds
    the boot time, which Linux gives in whole seconds, so its error reaches a second."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        import psutil

        return float(psutil.Process().create_time())


class Replica(Protocol):
    """A started replica as supervision sees it: a process, or a task of a job step."""

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class Launcher(Protocol):
    @property
    def procs(self) -> Sequence[Replica]: ...

    def start(self) -> None: ...

    def alive(self) -> list[bool]: ...

    def stop(self, grace_s: float) -> None: ...


def terminate(procs: list[subprocess.Popen[bytes]], grace_s: float,
              kill: Callable[[subprocess.Popen[bytes]], None]) -> None:
    """SIGTERM every process still running, give them ``grace_s`` to stop, then ``kill``."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    if not wait_all(procs, grace_s):
        for p in procs:
            if p.poll() is None:
                kill(p)
                p.wait()


def wait_all(procs: Sequence[Replica], timeout_s: float) -> bool:
    """Wait until every process has exited, at most ``timeout_s``; whether they all did."""
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return False
    return True


def worker_command(run_dir: Path, index: int | None, threads: int | None,
                   devices: int | None, monitor: bool = True,
                   require_accelerators: bool = False,
                   retired_status: int | None = None) -> list[str]:
    """The command every replica runs, locally or under srun; ``require_accelerators`` when
    the job was given GPUs, so that a replica seeing none says so instead of training on
    its CPUs; ``retired_status``, the status a replica that retires exits with (under srun
    0: the run goes on without it, and its step is no failure in sacct)."""
    # Started after the primary opened the session: nothing to wait for.
    cmd = [sys.executable, "-m", "automlperf.cli", "worker", "--run-dir", str(run_dir),
           "--wait", "0"]
    if not monitor:
        cmd.append("--no-monitor")
    if index is not None:
        cmd += ["--replica-index", str(index)]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    if devices is not None:
        cmd += ["--devices", str(devices)]
    if require_accelerators:
        cmd.append("--require-accelerators")
    if retired_status is not None:
        cmd += ["--retired-status", str(retired_status)]
    return cmd


class LaunchError(UserError, ValueError):
    """The replicas asked for do not fit this machine."""


# The variable each runtime reads to limit a process to some of the node's devices.
VISIBILITY = {"cuda": "CUDA_VISIBLE_DEVICES", "xpu": "ZE_AFFINITY_MASK",
              "npu": "ASCEND_RT_VISIBLE_DEVICES"}


def visibility_variable() -> str:
    """The variable that limits a process to some of this node's accelerators."""
    import torch

    from automlperf.hardware import accelerator_type

    kind = accelerator_type(torch) or "cuda"
    if kind == "cuda" and getattr(torch.version, "hip", None) and \
            "HIP_VISIBLE_DEVICES" in os.environ:
        return "HIP_VISIBLE_DEVICES"
    return VISIBILITY.get(kind, "CUDA_VISIBLE_DEVICES")


def gpu_slices(replicas: int, per_replica: int | None) -> list[str]:
    """The visibility variable's value for each local replica: disjoint groups of this
    machine's accelerators (none without any)."""
    from automlperf.hardware import accelerator_nodes_present, accelerator_type, device_count

    if not accelerator_nodes_present():
        return []
    import torch

    kind = accelerator_type(torch)
    if kind is None or kind not in VISIBILITY:
        return []
    visible = os.environ.get(visibility_variable())
    ids = [d.strip() for d in visible.split(",")] if visible else \
        [str(i) for i in range(device_count(torch, kind))]
    per = per_replica or len(ids) // replicas
    if per < 1 or per * replicas > len(ids):
        raise LaunchError(f"{replicas} replica(s) x {per_replica or 1} GPU(s) need "
                          f"{replicas * (per_replica or 1)} GPUs but {len(ids)} are visible: "
                          "lower --replicas or --devices-per-replica")
    return [",".join(ids[i * per:(i + 1) * per]) for i in range(replicas)]


@dataclass
class LocalLauncher:
    """``replicas`` worker processes on this machine, the CPU cores divided between them
    (two processes each using every core run several times slower than one core each)."""

    run_dir: Path
    replicas: int
    store_url: str | None
    devices_per_replica: int | None = None
    cores: int = 1
    simulated: bool = False  # simulated devices: the machine's own accelerators stay unused
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    watches: list[OomWatch] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Refused here, before anything is written, when they do not fit.
        self.slices = [] if self.simulated else gpu_slices(self.replicas, self.devices_per_replica)
        self.visibility = visibility_variable() if self.slices else ""

    def start(self) -> None:
        logs = self.run_dir / "logs"
        logs.mkdir(exist_ok=True)
        threads = max(1, self.cores // self.replicas)
        slices = self.slices
        for index in range(self.replicas):
            # The store's URL in the environment, not on the command line where ps shows it;
            # no database password where the replicas use the store service.
            env = replica_env(dict(os.environ, OMP_NUM_THREADS=str(threads),
                                   MKL_NUM_THREADS=str(threads),
                                   AUTOMLPERF_LOCAL_REPLICAS=str(self.replicas)), self.store_url)
            if slices:
                env[self.visibility] = slices[index]
            with open(logs / f"replica-{index}.log", "ab") as out:
                self.procs.append(subprocess.Popen(
                    # One resource sampler per node: replica 0's.
                    worker_command(self.run_dir, index, threads, self.devices_per_replica,
                                   monitor=index == 0),
                    stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True))
            watch = OomWatch.of(self.procs[-1].pid)
            watch.arm()
            self.watches.append(watch)

    def alive(self) -> list[bool]:
        return [p.poll() is None for p in self.procs]

    def causes(self) -> list[str | None]:
        """For each replica, why it ended, where the kernel says more than its exit code:
        the out-of-memory killer, which under a job's memory limit can take a replica in the
        moment a killed training process is still returning its memory."""
        return [watch.killed(proc.poll(), log_first=True)
                for proc, watch in zip(self.procs, self.watches)]

    def stop(self, grace_s: float) -> None:
        # A replica that ignores SIGTERM loses its whole session: worker and training ranks.
        terminate(self.procs, grace_s, lambda p: os.killpg(p.pid, signal.SIGKILL))


@dataclass
class ExternalLauncher:
    """Replicas started by the site's own launcher (mpiexec, Flux, PBS, LSF, Kubernetes):
    this side starts nothing and follows the ``replicas`` expected through the store, where
    each one registers itself and heart-beats."""

    run_dir: Path
    replicas: int
    store_url: str | None
    lease_timeout_s: float = 60.0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> None:
        from automlperf.store.feed import ReplicaFeed
        from automlperf.store.opening import open_run_store
        from automlperf.store.rundir import RunDir

        rd = RunDir(self.run_dir)
        self.run_id = int(rd.meta()["run_id"])
        self.store = open_run_store(self.run_dir, rd.store_url(self.store_url))
        self.segment = self.store.segments(self.run_id)[-1]
        self.feed = ReplicaFeed(self.store, self.run_id)
        self.latest: dict[int, Any] = {}

    def _mine(self) -> dict[int, Any]:
        """The latest registration of each replica index in this session, read from the
        registrations and ends since the last look."""
        for rep in self.feed.read():
            if rep.segment == self.segment.index:
                known = self.latest.get(rep.index)
                if known is None or rep.id >= known.id:
                    self.latest[rep.index] = rep
        return self.latest

    def states(self) -> list[str]:
        """``waiting`` (not registered yet), ``up``, ``lost`` (silent past the lease
        timeout since the store was last out: killed without a chance to say so) or
        ``exited``, for each expected index and any unexpected one that registered."""
        from automlperf.store import TrialStatus
        from automlperf.store.base import BACKOFF_MAX_S

        mine = self._mine()
        before = time.time() - self.lease_timeout_s
        restored = self.store.restored_at
        # Not while the store was out: no replica could heart-beat then.
        judged = not restored or restored + BACKOFF_MAX_S < before
        silent = set(self.store.silent_replicas(self.run_id, before)) if judged else set()
        count = max([self.replicas, *(i + 1 for i in mine)])
        states = []
        for i in range(count):
            rep = mine.get(i)
            if rep is None:
                states.append("waiting")
            elif rep.status != TrialStatus.RUNNING:
                states.append("exited")
            elif rep.id in silent:
                states.append("lost")
            else:
                states.append("up")
        return states

    def alive(self) -> list[bool]:
        # A replica not yet started counts as alive: the session waits for it until the
        # deadline rather than ending before the site's launcher has got going.
        return [state in ("waiting", "up") for state in self.states()]

    def joined(self) -> int:
        return len(self._mine())

    def stop(self, grace_s: float) -> None:
        """Wait for the replicas to stop themselves: at the deadline, or when they see the
        session end (at their next heartbeat); there is nothing here to signal."""
        if time.time() < self.segment.deadline_at:
            return  # interrupted: the ended session tells them to stop
        deadline = time.monotonic() + grace_s
        while "up" in self.states() and time.monotonic() < deadline:
            time.sleep(0.5)
