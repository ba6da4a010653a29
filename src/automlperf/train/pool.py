"""A replica's training processes, from the replica's side (their own code is train/rank.py): one
per accelerator, alive across trials.

Each rank process is started with the configuration's data section (spawn pickles a
process's arguments), initialises its device, the process group and the dataset once, then
waits for trial specs. Messages are JSON over pipes (no pickled object crosses a pipe). The
parent watches every rank: a rank that dies, a failure that leaves the others stuck in a
collective, or one that may leave device or collective state broken ends that trial with a
recorded reason and the pool restarts, so the replica is ready for the next trial. An
image-folder dataset is scanned once, by the parent, for every start (unless the run's
primary did, for every replica).

Ranks ignore SIGTERM (a batch system sends it to every process of a job step at once): the
parent alone decides when they stop, so a shutdown is a stop, never a crash to recover from.
"""

from __future__ import annotations

import atexit
import fcntl
import glob
import json
import logging
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from automlperf.config import DataConfig
from automlperf.events import FailureKind, TrialOutcome, TrialStatus
from automlperf.train.oomkill import OomWatch
from automlperf.train.rank import rank_main, send
from automlperf.train.spec import TrainerError, TrialSpec

OnMessage = Callable[[str, dict[str, Any]], None]
log = logging.getLogger("automlperf.pool")


class PoolError(TrainerError):
    """The training processes could not start."""


def leaves_state_broken(outcome: dict[str, Any], device_type: str, world: int) -> bool:
    """Whether a failed trial may have left the ranks unfit for the next one: with several
    ranks, a failure can stop them at different collectives (an out-of-memory error on one
    rank mid-step); on an accelerator, an error may be sticky (a CUDA error poisons the
    context). A non-finite loss is seen by all ranks alike after an all-reduce, and a data
    mismatch is found before any collective."""
    kind = outcome.get("extra", {}).get("failure")
    if outcome.get("status") == TrialStatus.COMPLETED or (
            outcome.get("status") == TrialStatus.STOPPED and kind is None):
        return False  # completed, or stopped by every rank at an epoch's start (the deadline)
    if kind in (FailureKind.NAN, FailureKind.DATA):
        return False
    if kind == FailureKind.OOM:
        return world > 1
    return world > 1 or device_type != "cpu"


@dataclass
class _Rank:
    process: Any
    conn: Connection
    done: dict[str, Any] | None = None
    oom: OomWatch | None = None  # its memory cgroup's kill count, to tell an OOM kill


SCRATCH_PREFIX = "automlperf-pool-"
OWNER_LOCK = "owner.lock"


def new_scratch() -> tuple[str, int]:
    """A private folder for a pool (its rendezvous files and dataset index) and the file
    descriptor of the lock that marks it in use. The kernel drops the lock when its owner
    dies, however it dies, so the next pool can tell a folder left by a killed one."""
    remove_stale_scratch()
    folder = tempfile.mkdtemp(prefix=SCRATCH_PREFIX)
    # Locked before it takes its name: a folder with a lock file is never seen unlocked
    # while its owner lives.
    hidden = os.path.join(folder, f".{OWNER_LOCK}")
    fd = os.open(hidden, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass  # a file system without locks: the folder is never taken for stale
    os.rename(hidden, os.path.join(folder, OWNER_LOCK))
    return folder, fd


def remove_stale_scratch(root: str | None = None) -> list[str]:
    """Remove the pool folders under ``root`` (the temporary directory) whose owner is gone
    (a replica killed with SIGKILL cleans nothing); the folders removed. Folders of live
    pools, of other users, and without a lock file are left alone."""
    removed = []
    for folder in glob.glob(os.path.join(root or tempfile.gettempdir(), SCRATCH_PREFIX + "*")):
        try:
            if os.stat(folder).st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(folder, OWNER_LOCK), os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # its owner is alive
            continue
        try:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(fd)
    return removed


@dataclass
class DevicePool:
    """Training processes for ``devices`` (e.g. ``["cuda:0", "cuda:1"]`` or ``["cpu"]``), each
    loading the configuration's data section ``data`` with ``threads_per_rank`` cores."""

    devices: list[str]
    data: DataConfig
    threads_per_rank: int = 1
    # A scanned index of the image folder, given by the caller, who saw the data is here (a
    # run's primary scans once for every replica); None: the pool scans the folder itself.
    index_dir: str | None = None
    start_timeout_s: float = 300.0
    failure_grace_s: float = 10.0
    start_attempts: int = 3  # failed starts in a row before the pool gives up
    restart_backoff_s: float = 5.0
    stop_wait_s: float = 15.0  # how long close() waits for the ranks to stop, all together
    # Run by rank 0 at the first start, before the process group, its result the
    # description's "node": a CPU pool's measurement of the node, by a process that has
    # torch loaded anyway (picklable: a function of a module, or a partial of one); and
    # again between trials when asked (measure_again).
    first_start: Callable[[], dict[str, Any]] | None = None
    cpu_binding: str = "auto"  # train.cpu_binding: ranks placed on their device's cores
    description: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0
    start_error: str | None = None  # why the last start failed, while the pool is down
    _ranks: list[_Rank] = field(default_factory=list)
    _scratch: str = ""
    _scratch_lock: int = -1
    _starts: int = 0

    def __post_init__(self) -> None:
        if not self.devices:
            raise PoolError("no devices to train on")
        self.data = self.data.for_ranks(self.threads_per_rank)
        # Rendezvous files and the dataset's index, for the pool's lifetime.
        self._scratch, self._scratch_lock = new_scratch()
        # Ranks are not daemonic, so at exit multiprocessing would wait for them: a pool that
        # an error or Ctrl-C left open must kill them first (handlers run last-in, first-out).
        atexit.register(self.kill)
        try:
            self._prepare_data()
            self._start()
        except BaseException:
            self.close()
            raise

    def _prepare_data(self) -> None:
        """Scan an image-folder dataset here, once, unless the caller gave its index (a run's
        primary saves one in the run directory): every rank start (and restart) maps the
        saved index instead of walking a million files on a shared file system."""
        if self.data.dataset != "imagenet" or self.index_dir is not None:
            return
        from automlperf.train.data import DataError, prepare_index

        folder = os.path.join(self._scratch, "index")
        try:
            prepare_index(self.data.data_dir, folder)
        except DataError as exc:
            raise PoolError(str(exc)) from None
        self.index_dir = folder

    @property
    def world(self) -> int:
        return len(self.devices)

    def _start(self, should_stop: Callable[[], bool] | None = None) -> None:
        ctx = mp.get_context("spawn")
        # A fresh file per start: no port chosen here and bound later by rank 0, which
        # another process could take in between. Removed once every rank has joined.
        for stale in glob.glob(os.path.join(self._scratch, "rendezvous-*")):
            os.remove(stale)  # of a start that failed
        rendezvous_file = os.path.join(self._scratch, f"rendezvous-{self._starts}")
        rendezvous = f"file://{rendezvous_file}"
        self._starts += 1
        self._ranks = []
        for index, device in enumerate(self.devices):
            parent, child = ctx.Pipe()
            # Not daemonic: a daemonic process may not start children, and a rank must be
            # able to start data-loading workers. Ranks still never outlive the pool: each
            # asks the kernel to kill it when this process dies (die_with_parent), and
            # close() and kill() end them otherwise.
            measure = self.first_start if index == 0 else None
            proc = ctx.Process(target=rank_main, name=f"automlperf-rank{index}", daemon=False,
                               args=(index, self.world, rendezvous, device, self.threads_per_rank,
                                     self.data, self.index_dir, child, os.getpid(), measure,
                                     self.cpu_binding, self._starts == 1))
            proc.start()
            child.close()
            self._ranks.append(_Rank(proc, parent, oom=OomWatch.of(proc.pid or 0)))
        deadline = time.monotonic() + self.start_timeout_s
        ready = 0
        while ready < self.world:
            for r, rank in enumerate(self._ranks):
                if rank.done is not None:
                    continue
                if rank.conn.poll(0.05):
                    try:
                        msg = json.loads(rank.conn.recv_bytes())
                    except EOFError:
                        msg = {"kind": "fatal", "error": "exited during start-up"}
                    if msg["kind"] == "fatal":
                        self._abort_start()
                        raise PoolError(f"training process {r} ({self.devices[r]}) failed to "
                                        f"start: {msg['error']}")
                    rank.done = msg
                    ready += 1
                elif not rank.process.is_alive():
                    self._abort_start()
                    raise PoolError(f"training process {r} ({self.devices[r]}) exited with "
                                    f"code {rank.process.exitcode} during start-up")
            if time.monotonic() > deadline:
                self._abort_start()
                raise PoolError(f"training processes did not start in {self.start_timeout_s:.0f} s")
            if should_stop is not None and should_stop():
                self._abort_start()
                return
        if os.path.exists(rendezvous_file):
            os.remove(rendezvous_file)
        hello = [r.done or {} for r in self._ranks]
        self.description = {"dataset": hello[0]["dataset"],
                            "devices": [h["device"] for h in hello],
                            "uuids": [h["uuid"] for h in hello if h["uuid"]],
                            "binding": [h.get("binding") for h in hello],
                            **({"node": hello[0]["node"]} if "node" in hello[0] else {})}
        for rank in self._ranks:
            rank.done = None
        self.start_error = None

    def _abort_start(self) -> None:
        self._kill()
        self._ranks = []

    def run(self, spec: TrialSpec, on_message: OnMessage | None = None,
            should_stop: Callable[[], bool] | None = None) -> TrialOutcome:
        """Train one trial on every rank; rank 0's progress and epoch messages go to
        ``on_message``. ``should_stop`` is polled: when it turns true the ranks are killed
        (epochs already reported stay reported) and the trial ends as ``stopped``; a rank
        that dies then is part of the stop, not a crash, and nothing restarts."""

        def stopped() -> TrialOutcome:
            self._restart(kill_only=True)
            return TrialOutcome(trial_id=spec.trial_id, status=TrialStatus.STOPPED,
                                reason="deadline reached", batch_size=spec.batch_size)

        def died(idx: int, code: int | None, oom: str | None) -> TrialOutcome:
            # A rank the kernel killed for memory is out of memory like one whose allocation
            # failed, with the same fix; any other death is a crash.
            if oom is not None:
                return TrialOutcome(trial_id=spec.trial_id, status=TrialStatus.FAILED,
                                    reason=f"oom: training process {idx} ({self.devices[idx]}) was "
                                    f"killed by signal 9: {oom}", epochs=reported,
                                    batch_size=spec.batch_size,
                                    extra={"failure": FailureKind.OOM, "oom_kill": True})
            return TrialOutcome(trial_id=spec.trial_id, status=TrialStatus.FAILED,
                                reason=f"crash: training process {idx} exited with code {code}",
                                epochs=reported, batch_size=spec.batch_size,
                                extra={"failure": FailureKind.CRASH})

        if not self._ranks:
            if should_stop is not None and should_stop():
                return stopped()
            raise PoolError(f"the training processes are not running: {self.start_error}")
        reported = 0  # epochs rank 0 reported in this trial

        def counted(kind: str, msg: dict[str, Any]) -> None:
            nonlocal reported
            reported += kind == "epoch"
            if on_message is not None:
                on_message(kind, msg)

        for rank in self._ranks:
            rank.done = None
            if rank.oom is not None:
                rank.oom.arm()
            send(rank.conn, "trial", {"spec": spec.to_dict()})
        failed_at: float | None = None
        while True:
            if should_stop is not None and should_stop():
                return stopped()
            waitables = [r.conn for r in self._ranks if r.done is None]
            waitables += [r.process.sentinel for r in self._ranks if r.done is None]
            for ready in wait(waitables, timeout=0.2):
                for idx, rank in enumerate(self._ranks):
                    if ready is rank.conn:
                        self._receive(idx, rank, counted)
                    elif ready is rank.process.sentinel and rank.done is None:
                        # Drain what it said before dying.
                        while rank.conn.poll() and self._receive(idx, rank, counted):
                            pass
                        if rank.done is None:
                            # The sentinel closes as the process dies, a moment before
                            # its exit status can be collected.
                            rank.process.join(timeout=30)
                            code = rank.process.exitcode
                            if should_stop is not None and should_stop():
                                return stopped()
                            oom = rank.oom.killed(code) if rank.oom is not None else None
                            self._restart(should_stop=should_stop)
                            return died(idx, code, oom)
            outcomes = [r.done for r in self._ranks]
            finished = [o for o in outcomes if o is not None]
            if len(finished) == len(outcomes):
                first_bad = next((o for o in finished if o["status"] != TrialStatus.COMPLETED), None)
                device_type = self.devices[0].split(":")[0]
                if first_bad is not None and leaves_state_broken(first_bad, device_type,
                                                                 self.world):
                    self._restart(should_stop=should_stop)
                return TrialOutcome(**(first_bad or finished[0]))
            if any(o["status"] != TrialStatus.COMPLETED for o in finished):
                # One rank failed; the others may wait forever in a collective.
                failed_at = failed_at or time.monotonic()
                if time.monotonic() - failed_at > self.failure_grace_s:
                    bad = next(o for o in outcomes
                               if o is not None and o["status"] != TrialStatus.COMPLETED)
                    self._restart(should_stop=should_stop)
                    return TrialOutcome(**bad)

    def _receive(self, idx: int, rank: _Rank, on_message: OnMessage | None) -> bool:
        """Handle one message; False when the rank's end of the pipe is closed."""
        try:
            msg = json.loads(rank.conn.recv_bytes())
        except EOFError:
            return False
        kind = msg.pop("kind")
        if kind == "done":
            rank.done = msg["outcome"]
        elif on_message is not None:
            on_message(kind, msg)
        return True

    def _restart(self, kill_only: bool = False,
                 should_stop: Callable[[], bool] | None = None) -> None:
        """Kill the ranks and start new ones. A start that fails leaves the pool down, to
        be tried again before the next trial (``ensure_running``): one bad start (a device
        still busy, a slow file system) must not end the replica."""
        self._kill()
        self._ranks = []
        if kill_only or (should_stop is not None and should_stop()):
            return
        self.restarts += 1
        try:
            self._start(should_stop)
        except PoolError as exc:
            self.start_error = str(exc)
            log.warning("restarting the training processes failed: %s", exc)

    def _kill(self) -> None:
        for rank in self._ranks:
            if rank.process.is_alive():
                os.kill(rank.process.pid, signal.SIGKILL)
        self._join_all(10.0)
        for rank in self._ranks:
            rank.conn.close()
            if rank.oom is not None:
                rank.oom.close()

    def _join_all(self, wait_s: float) -> None:
        """Wait for every rank against one deadline, not ``wait_s`` for each in turn."""
        deadline = time.monotonic() + wait_s
        for rank in self._ranks:
            rank.process.join(timeout=max(0.0, deadline - time.monotonic()))

    def ensure_running(self, should_stop: Callable[[], bool] | None = None) -> None:
        """Start the ranks if they are down, trying ``start_attempts`` times in a row."""
        attempt = 0
        while not self._ranks:
            if should_stop is not None and should_stop():
                return
            if attempt >= self.start_attempts:
                raise PoolError(f"the training processes failed to start {attempt} times in a "
                                f"row; the last time: {self.start_error}")
            if attempt:
                time.sleep(self.restart_backoff_s * attempt)
            attempt += 1
            try:
                self._start(should_stop)
            except PoolError as exc:
                self.start_error = str(exc)

    def measure_again(self, timeout_s: float = 300.0) -> dict[str, Any] | None:
        """``first_start``'s measurement again, by rank 0 between trials (a CPU node's ceiling
        at the run's end, by the process that measured it at the start, with torch loaded);
        None where no rank is up to ask (a pool stopped by a kill, or never given one)."""
        if self.first_start is None or not self._ranks or not self._ranks[0].process.is_alive():
            return None
        conn = self._ranks[0].conn
        try:
            send(conn, "measure", {})
            if not conn.poll(timeout_s):
                return {"devices": self.devices,
                        "error": f"the measurement took over {timeout_s:.0f} s"}
            msg = json.loads(conn.recv_bytes())
        except (OSError, EOFError, ValueError) as exc:
            return {"devices": self.devices, "error": f"the measurement failed: {exc}"}
        return msg.get("node") or {"devices": self.devices, "error": "the training process "
                                   "measured nothing"}

    def kill(self) -> None:
        """End every rank now (Ctrl-C): what they reported stays reported."""
        self._shutdown(graceful=False)

    def close(self) -> None:
        """Ask every rank to stop, give them ``stop_wait_s`` together, then kill the rest."""
        self._shutdown(graceful=True)

    def _shutdown(self, graceful: bool) -> None:
        if graceful:
            for rank in self._ranks:
                try:
                    send(rank.conn, "stop", {})
                except (OSError, ValueError):
                    pass
            self._join_all(self.stop_wait_s)
        self._kill()
        self._ranks = []
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = ""
        if self._scratch_lock >= 0:
            os.close(self._scratch_lock)
            self._scratch_lock = -1
        atexit.unregister(self.kill)

    def __enter__(self) -> DevicePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
