"""The store on SQLAlchemy: SQLite (one machine, the default) or PostgreSQL (clusters). The
tables and their check on open are store/schema.py; what each write does in its transaction,
store/writes.py; the reads, store/reads.py. Here: one transaction per call, retried through
outages."""

from __future__ import annotations

import errno
import functools
import logging
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from automlperf.store import connections, reads, schema
from automlperf.store.base import (BACKOFF_MAX_S, Changes, EpochRecord, ReplicaRecord,
                                   SampleFigures, SegmentRecord, Store, StoreError,
                                   TrialChange, TrialRecord, TrialSummary, TrialTally)
from automlperf.store.schema import (EPOCH_FIELDS, T_EPOCHS, T_META, T_NODES, T_REPLICAS,
                                     T_RUNS, T_SAMPLES, T_SEGMENTS, T_TRIALS, meta)
from automlperf.store.urls import normalise_url, redact
from automlperf.store.values import bulk
from automlperf.store.writes import Writes

R = TypeVar("R")


# How long a store rides out a server restart or a network hiccup before giving up; the
# environment variable overrides it for every process of a run (replicas inherit it).
RETRY_S = 120.0
RETRY_ENV = "AUTOMLPERF_STORE_RETRY_S"
# A call still failing after this long says so once, rather than waiting out retry_s in
# silence; shorter hiccups (a lock, a reconnect) pass unremarked.
OUTAGE_NOTICE_S = 5.0
log = logging.getLogger("automlperf.store")


def _retry_s() -> float:
    value = os.environ.get(RETRY_ENV)
    if not value:
        return RETRY_S
    try:
        seconds = float(value)
    except ValueError:
        raise StoreError(f"{RETRY_ENV}={value!r} is not a number of seconds: unset it or give "
                         "one such as 120") from None
    if not seconds > 0:
        raise StoreError(f"{RETRY_ENV}={value!r} must be more than 0 seconds")
    return seconds


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, IntegrityError):
        return False
    if isinstance(exc, OperationalError):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def _sqlite_folder(url: str) -> str | None:
    """The folder of a SQLite store's file; None for other stores."""
    if not url.startswith("sqlite:///"):
        return None
    return os.path.dirname(url[len("sqlite:///"):]) or "."


def _read_only_file(url: str) -> str | None:
    """The folder of a SQLite store's file, when its file system has turned read-only."""
    folder = _sqlite_folder(url)
    if folder is None:
        return None
    # A probe write: a file system turned read-only by an error (ext4's errors=remount-ro)
    # may still call itself read-write to statvfs() and access().
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-probe-")
    except OSError as exc:
        return folder if exc.errno == errno.EROFS else None
    os.close(fd)
    os.unlink(probe)
    return None


# Less room than this beside a SQLite store whose write failed: its file system is full.
FULL_BELOW_BYTES = 1 << 20


def _full_file_system(url: str) -> str | None:
    """The folder of a SQLite store's file, when its file system has (almost) no room left.
    SQLite reports a write into a full file system as "disk I/O error" as often as
    "database or disk is full" (its WAL and shared-memory files), and waiting frees nothing."""
    folder = _sqlite_folder(url)
    if folder is None:
        return None
    try:
        found = os.statvfs(folder)
    except OSError:
        return None
    return folder if found.f_bavail * found.f_frsize < FULL_BELOW_BYTES else None


def _disk_full(exc: DBAPIError) -> bool:
    """SQLite's SQLITE_FULL, PostgreSQL's disk_full (53100): waiting would not free space."""
    return getattr(exc.orig, "sqlstate", None) == "53100" or any(
        words in str(exc.orig) for words in ("database or disk is full",
                                             "No space left on device"))


def _one_line(error: BaseException | None) -> str:
    # A driver's message may run over lines (psycopg adds a hint); an error is one line.
    return " ".join(str(error).split())[:200]


def _waiting_advice(url: str) -> str:
    if url.startswith("sqlite"):
        return "check that no other program holds its file locked and that its folder is reachable"
    return "check that its server is running and the URL is right"


# One notice per store and outage, whichever of a process's threads waits first.
_notice_lock = threading.Lock()
# Per thread: whether the call under way is a second try (see ``retried``).
_attempt = threading.local()


def retrying(method: Callable[..., R]) -> Callable[..., R]:
    """Retry a store method on transient failures (server restarting, network hiccup,
    database locked) with exponential back-off, for up to the store's ``retry_s``. A call
    that succeeds after failing sets the store's ``restored_at``."""

    @functools.wraps(method)
    def wrapper(self: SQLStore, *args: Any, **kwargs: Any) -> R:
        started = time.monotonic()
        delay, deadline = 0.1, started + self.retry_s
        failed = False
        outer = getattr(_attempt, "retried", None)
        while True:
            _attempt.retried = failed or bool(outer)
            try:
                result = method(self, *args, **kwargs)
            except DBAPIError as exc:
                if _disk_full(exc) or _full_file_system(self.url) is not None:
                    raise StoreError(f"the disk of store {redact(self.url)} is full "
                                     f"({_one_line(exc.orig)}): free space "
                                     "there") from None
                read_only = _read_only_file(self.url)
                if read_only is not None:
                    # Waiting does not make a file system writable again: fail now, in one
                    # line, rather than after retry_s.
                    raise StoreError(f"store {redact(self.url)} cannot be written: {read_only} "
                                     f"is on a read-only file system ({_one_line(exc.orig)[:100]}); "
                                     "make it writable again") from None
                if not _transient(exc):
                    raise
                failed = True
                if time.monotonic() - started >= OUTAGE_NOTICE_S:
                    with _notice_lock:
                        first, self._outage_said = not self._outage_said, True
                    if first:
                        log.warning("store %s unavailable (%s); retrying for up to %.0f s "
                                    "(%s sets how long)", redact(self.url),
                                    _one_line(exc.orig), self.retry_s, RETRY_ENV)
                if time.monotonic() + delay > deadline:
                    raise StoreError(f"store {redact(self.url)} unreachable for "
                                     f"{self.retry_s:.0f} s: {_one_line(exc.orig)}; "
                                     f"{_waiting_advice(self.url)} ({RETRY_ENV} sets how "
                                     "long to wait)") from None
                # Jittered: the replicas of a run that lost the store together do not all
                # come back at the same instant.
                time.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, BACKOFF_MAX_S)
            else:
                if failed:
                    self.restored_at = time.time()
                    with _notice_lock:
                        self._outage_said = False
                return result
            finally:
                _attempt.retried = outer

    return wrapper


def retried() -> bool:
    """Whether the store call under way is a second try, whose first may have committed
    unseen (a write then checks before it writes again)."""
    return bool(getattr(_attempt, "retried", False))


class SQLStore(Store):
    # Whether the current outage has been announced (see ``retrying``).
    _outage_said = False
    SAMPLE_CHUNK = reads.SAMPLE_CHUNK

    def __init__(self, url: str, create: bool = False, retry_s: float | None = None) -> None:
        self.url = normalise_url(url)
        self.retry_s = _retry_s() if retry_s is None else retry_s
        self.sqlite = self.url.startswith("sqlite")
        if self.sqlite:
            # The sqlite3 module commits DDL on its own, so a reader could see the schema
            # half made; with its transaction handling off and BEGIN issued here, creating
            # the schema (like every transaction) is atomic.
            self.engine = sa.create_engine(self.url, connect_args={"timeout": 60,
                                                                   "isolation_level": None},
                                           poolclass=sa.pool.NullPool)
            event.listen(self.engine, "connect", _sqlite_pragmas)
            event.listen(self.engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN"))
            self.reader = self.engine
        else:
            # One small pool per process, shared by its threads (store/connections.py).
            self.engine = sa.create_engine(self.url, **connections.engine_kwargs())
            # A read is one statement: no BEGIN and ROLLBACK around it.
            self.reader = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        self.writes = Writes(self.sqlite)
        self._prepare(create)

    @retrying
    def _prepare(self, create: bool) -> None:
        schema.open_check(self.engine, self.url, create)

    def _write(self, op: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        with self.engine.begin() as conn:
            return op(conn, *args, **kwargs)

    def _read(self, op: Callable[..., R], *args: Any) -> R:
        with self.reader.connect() as conn:
            return op(conn, *args)

    # runs and segments ---------------------------------------------------------------------
    @retrying
    def create_run(self, name: str, config: dict[str, Any], system: dict[str, Any],
                   duration_s: float, now: float) -> int:
        return self._write(self.writes.create_run, name, config, system, duration_s, now)

    @retrying
    def run(self, run_id: int) -> dict[str, Any]:
        found = self._read(reads.run, run_id)
        if found is None:
            raise StoreError(f"run {run_id} is not in store {redact(self.url)}")
        return found

    @retrying
    def start_segment(self, run_id: int, now: float, deadline_at: float) -> int:
        return self._write(self.writes.start_segment, run_id, now, deadline_at)

    @retrying
    def touch_segment(self, run_id: int, index: int, now: float) -> None:
        self._write(self.writes.touch_segment, run_id, index, now)

    @retrying
    def end_segment(self, run_id: int, index: int, ended_at: float) -> None:
        self._write(self.writes.end_segment, run_id, index, ended_at)

    @retrying
    def segments(self, run_id: int) -> list[SegmentRecord]:
        return self._read(reads.segments, run_id)

    # replicas ------------------------------------------------------------------------------
    @retrying
    def register_replica(self, run_id: int, index: int, segment: int, host: str, pid: int,
                         devices: list[str], now: float) -> int:
        return self._write(self.writes.register_replica, run_id, index, segment, host, pid,
                           devices, now, retried=retried())[0]

    @retrying
    def heartbeat(self, replica_id: int, now: float, lease_s: float) -> SegmentRecord | None:
        return self._write(self.writes.heartbeat, replica_id, now, lease_s)

    @retrying
    def end_replica(self, replica_id: int, status: str, now: float, reason: str = "") -> None:
        self._write(self.writes.end_replica, replica_id, status, now, reason)

    @retrying
    def replicas(self, run_id: int) -> list[ReplicaRecord]:
        return self._read(reads.replicas, run_id)

    @retrying
    def replica_changes(self, run_id: int, after: int,
                        also: Sequence[int] = ()) -> Changes[tuple[int, ReplicaRecord]]:
        rows = self._read(reads.replica_changes, run_id, after, also)
        # SQLite's writers take turns: no number is taken by a transaction yet to commit.
        return Changes(rows, max([after, *(n for n, _ in rows)]) if self.sqlite else None)

    @retrying
    def silent_replicas(self, run_id: int, before: float) -> list[int]:
        return self._read(reads.silent_replicas, run_id, before)

    # trials --------------------------------------------------------------------------------
    @retrying
    def claim_trial(self, run_id: int, replica_id: int, replica_index: int, graph_hash: str,
                    graph_json: str, parent_id: int | None, morphs: list[dict[str, Any]],
                    round_index: int, hparams: dict[str, Any], now: float,
                    lease_s: float) -> int | None:
        claimed = self._write(self.writes.claim_trial, run_id, replica_id, replica_index,
                              graph_hash, graph_json, parent_id, morphs, round_index, hparams,
                              now, lease_s, retried=retried())
        return None if claimed is None else claimed[0]

    @retrying
    def finish_trial(self, trial_id: int, status: str, now: float, reason: str = "",
                     best_accuracy: float | None = None,
                     predicted_accuracy: float | None = None, weights_path: str | None = None,
                     extra: dict[str, Any] | None = None) -> bool:
        return self._write(self.writes.finish_trial, trial_id, status, now, reason,
                           best_accuracy, predicted_accuracy, weights_path, extra)[0]

    @retrying
    def expire_leases(self, run_id: int, now: float) -> list[int]:
        return [trial for trial, _ in self._write(self.writes.expire_leases, run_id, now)]

    @retrying
    def trials(self, run_id: int, after_id: int = 0) -> list[TrialRecord]:
        return self._read(reads.trial_rows, (T_TRIALS.c.run_id == run_id)
                          & (T_TRIALS.c.id > after_id))

    @retrying
    def trial(self, trial_id: int) -> TrialRecord:
        rows = self._read(reads.trial_rows, T_TRIALS.c.id == trial_id)
        if not rows:
            raise StoreError(f"trial {trial_id} is not in store {redact(self.url)}")
        return rows[0]

    @retrying
    def tally(self, run_id: int) -> list[TrialTally]:
        return self._read(reads.tally, run_id)

    @retrying
    def summaries(self, run_id: int) -> list[TrialSummary]:
        return self._read(reads.summaries, run_id)

    @retrying
    def changes(self, run_id: int, after: int, also: Sequence[int] = ()) -> Changes[TrialChange]:
        rows = self._read(reads.changes, run_id, after, also)
        return Changes(rows, max([after, *(r.changed for r in rows)]) if self.sqlite else None)

    @retrying
    def graphs(self, trial_ids: Sequence[int]) -> dict[int, str]:
        return self._read(reads.graphs, trial_ids)

    # epochs and samples --------------------------------------------------------------------
    @retrying
    def record_epoch(self, epoch: EpochRecord) -> None:
        self._write(self.writes.record_epoch, epoch)

    @retrying
    def epochs(self, run_id: int) -> list[EpochRecord]:
        return self._read(reads.epochs, run_id)

    @retrying
    def epochs_after(self, run_id: int, after: int,
                     also: Sequence[int] = ()) -> list[tuple[int, int, EpochRecord]]:
        with self.reader.connect() as conn:
            return reads.epochs_after(conn, self.sqlite, run_id, after, also)

    @retrying
    def last_epoch_number(self) -> int:
        with self.reader.connect() as conn:
            return reads.last_epoch_number(conn, self.sqlite)

    @retrying
    def add_samples(self, run_id: int, node: str, samples: list[dict[str, Any]]) -> None:
        if samples:
            self._write(self.writes.add_samples, run_id, node, samples, retried=retried())

    @retrying
    def samples(self, run_id: int) -> list[dict[str, Any]]:
        return self._read(reads.samples, run_id)

    @retrying
    def sample_nodes(self, run_id: int) -> dict[str, int]:
        return self._read(reads.sample_nodes, run_id)

    @retrying
    def _reachable(self) -> None:
        """Ride out an outage before a streamed read (a connection the server dropped is
        found here, not halfway through the stream)."""
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    def sample_figure_chunks(self, run_id: int,
                             nodes: Sequence[str] | None = None) -> Iterator[list[SampleFigures]]:
        # Not retried once streaming: chunks already handed out cannot be taken back; the
        # reader starts again. A cursor, so in a transaction.
        self._reachable()
        return reads.sample_figure_chunks(self.engine, run_id, nodes)

    def sample_texts(self, run_id: int) -> Iterator[list[tuple[str, str]]]:
        self._reachable()
        return reads.sample_texts(self.engine, run_id)

    @retrying
    def record_node(self, run_id: int, replica_index: int, segment: int, host: str,
                    description: dict[str, Any], now: float) -> None:
        self._write(self.writes.record_node, run_id, replica_index, segment, host, description,
                    now, retried=retried())

    @retrying
    def nodes(self, run_id: int) -> list[dict[str, Any]]:
        return self._read(reads.nodes, run_id)

    def close(self) -> None:
        self.engine.dispose()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
    cur.execute("PRAGMA synchronous=FULL")  # a record acknowledged survives a power cut
    cur.execute("PRAGMA busy_timeout=60000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def open_store(url: str | None = None, run_dir: Path | str | None = None,
               create: bool = False) -> Store:
    """The store at ``url`` (a database's, or ``store-service://FILE``: the run's store
    service whose address is in FILE), or the run directory's ``history.db``."""
    if url is None:
        if run_dir is None:
            raise StoreError("no store: give a URL or a run directory")
        url = f"sqlite:///{Path(run_dir).resolve() / 'history.db'}"
    if url.startswith("store-service://"):
        from automlperf.store.remote import open_remote

        return open_remote(url)
    try:
        return SQLStore(url, create=create)
    except ModuleNotFoundError as exc:
        if "psycopg" in str(exc):
            raise StoreError("a PostgreSQL store needs the psycopg driver: "
                             "pip install 'automlperf[postgres]'") from None
        raise


# Names other modules and old scripts import from here.
__all__ = ["EPOCH_FIELDS", "SQLStore", "T_EPOCHS", "T_META", "T_NODES", "T_REPLICAS", "T_RUNS",
           "T_SAMPLES", "T_SEGMENTS", "T_TRIALS", "bulk", "meta", "open_store", "retried",
           "retrying"]
