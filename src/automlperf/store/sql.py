"""The store on SQLAlchemy: SQLite (one machine, the default) or PostgreSQL (clusters)."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import gc
import json
import logging
import os
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from automlperf.events import TrialStatus
from automlperf.store import connections
from automlperf.store.base import (BACKOFF_MAX_S, LEASE_EXPIRED, SCHEMA_VERSION, EpochRecord,
                                   ReplicaRecord,
                                   SampleFigures, SchemaMismatch, SegmentRecord, Store,
                                   StoreError, TrialRecord, TrialSummary, TrialTally,
                                   sample_figures)
from automlperf.store.urls import normalise_url, redact

# Bound as plain strings: the value the database stores.
RUNNING = TrialStatus.RUNNING.value

# Prefixed names: Optuna keeps its HPO studies in the same database, with tables of its own.
meta = sa.MetaData()
T_META = sa.Table("amp_meta", meta, sa.Column("key", sa.String(64), primary_key=True),
                  sa.Column("value", sa.Text, nullable=False))
T_RUNS = sa.Table(
    "amp_runs", meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("duration_s", sa.Float, nullable=False),
    sa.Column("config", sa.Text, nullable=False),
    sa.Column("system", sa.Text, nullable=False))
T_SEGMENTS = sa.Table(
    "amp_segments", meta,
    sa.Column("run_id", sa.Integer, sa.ForeignKey("amp_runs.id"), primary_key=True),
    sa.Column("idx", sa.Integer, primary_key=True),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("deadline_at", sa.Float, nullable=False),
    sa.Column("last_seen", sa.Float, nullable=False),
    sa.Column("ended_at", sa.Float))
T_REPLICAS = sa.Table(
    "amp_replicas", meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.Integer, sa.ForeignKey("amp_runs.id"), nullable=False),
    sa.Column("idx", sa.Integer, nullable=False),
    sa.Column("segment", sa.Integer, nullable=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("devices", sa.Text, nullable=False),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("last_heartbeat", sa.Float, nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("reason", sa.Text, nullable=False, default=""),
    sa.Column("ended_at", sa.Float))
T_TRIALS = sa.Table(
    "amp_trials", meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.Integer, sa.ForeignKey("amp_runs.id"), nullable=False),
    sa.Column("replica_index", sa.Integer, nullable=False),
    sa.Column("replica_id", sa.Integer, sa.ForeignKey("amp_replicas.id")),
    sa.Column("graph_hash", sa.String(64), nullable=False),
    sa.Column("graph_json", sa.Text, nullable=False),
    sa.Column("parent_id", sa.Integer, sa.ForeignKey("amp_trials.id")),
    sa.Column("morphs", sa.Text, nullable=False),
    sa.Column("round", sa.Integer, nullable=False),
    sa.Column("hparams", sa.Text, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text, nullable=False, default=""),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("finished_at", sa.Float),
    sa.Column("lease_until", sa.Float),
    sa.Column("best_accuracy", sa.Float),
    sa.Column("predicted_accuracy", sa.Float),
    sa.Column("weights_path", sa.Text),
    sa.Column("extra", sa.Text, nullable=False, default="{}"),
    sa.UniqueConstraint("run_id", "graph_hash", name="one_trial_per_architecture"),
    # Every heartbeat extends its replica's running trials: without it, a scan of them all.
    sa.Index("amp_trials_replica", "replica_id"))
T_EPOCHS = sa.Table(
    "amp_epochs", meta,
    sa.Column("trial_id", sa.Integer, sa.ForeignKey("amp_trials.id"), primary_key=True),
    sa.Column("epoch", sa.Integer, primary_key=True),
    sa.Column("run_id", sa.Integer, sa.ForeignKey("amp_runs.id"), nullable=False, index=True),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("ended_at", sa.Float, nullable=False),
    sa.Column("train_images", sa.BigInteger, nullable=False),
    sa.Column("val_images", sa.BigInteger, nullable=False),
    sa.Column("steps", sa.BigInteger, nullable=False),
    sa.Column("ops", sa.BigInteger, nullable=False),  # int64: ~3e16 per ImageNet epoch
    sa.Column("train_loss", sa.Float, nullable=False),
    sa.Column("val_accuracy", sa.Float, nullable=False),
    sa.Column("precision", sa.String(8), nullable=False),
    sa.Column("batch_size", sa.Integer, nullable=False),
    sa.Column("world_size", sa.Integer, nullable=False),
    sa.Column("data_share", sa.Float, nullable=False),
    sa.Column("images_per_s", sa.Float, nullable=False),
    sa.Column("skipped_images", sa.BigInteger, nullable=False),
    sa.Column("val_skipped", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("device_share", sa.Float),
    # Added after schema version 2 without changing it: older stores get it when opened.
    sa.Column("compiled", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("decode_path", sa.Text, nullable=False, server_default=""),
    sa.Column("cpu_decoded", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("val_loss", sa.Float))
T_SAMPLES = sa.Table(
    "amp_samples", meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.Integer, sa.ForeignKey("amp_runs.id"), nullable=False, index=True),
    sa.Column("node", sa.String(255), nullable=False),
    sa.Column("t", sa.Float, nullable=False),
    sa.Column("data", sa.Text, nullable=False),
    # What a run's figures are computed from (base.sample_figures), so that reading a long
    # run's million samples need not parse them whole: the numbers as float64 (8 GPUs' JSON
    # takes 15 times as long to parse), and the uuids and CPU counters as JSON. Empty where
    # a number would not come back exactly, and in rows stored before the columns (added
    # after schema version 1 without changing it: older stores get them when opened).
    sa.Column("figures", sa.LargeBinary),
    sa.Column("figure_keys", sa.Text))

# Added after schema version 1 without changing it: older stores get the table when opened.
T_NODES = sa.Table(
    "amp_nodes", meta,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.Integer, sa.ForeignKey("amp_runs.id"), nullable=False, index=True),
    sa.Column("replica_index", sa.Integer, nullable=False),
    sa.Column("segment", sa.Integer, nullable=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("recorded_at", sa.Float, nullable=False),
    sa.Column("data", sa.Text, nullable=False))

# EpochRecord's fields, in order, but its run.
EPOCH_FIELDS = tuple(f.name for f in dataclasses.fields(EpochRecord) if f.name != "run_id")

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


def _read_only_file(url: str) -> str | None:
    """The folder of a SQLite store's file, when its file system has turned read-only."""
    if not url.startswith("sqlite:///"):
        return None
    folder = os.path.dirname(url[len("sqlite:///"):]) or "."
    # A probe write: a file system turned read-only by an error (ext4's errors=remount-ro)
    # may still call itself read-write to statvfs() and access().
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-probe-")
    except OSError as exc:
        return folder if exc.errno == errno.EROFS else None
    os.close(fd)
    os.unlink(probe)
    return None


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


def retrying(method: Callable[..., R]) -> Callable[..., R]:
    """Retry a store method on transient failures (server restarting, network hiccup,
    database locked) with exponential back-off, for up to the store's ``retry_s``. A call
    that succeeds after failing sets the store's ``restored_at``."""

    @functools.wraps(method)
    def wrapper(self: SQLStore, *args: Any, **kwargs: Any) -> R:
        started = time.monotonic()
        delay, deadline = 0.1, started + self.retry_s
        failed = False
        while True:
            try:
                result = method(self, *args, **kwargs)
            except DBAPIError as exc:
                if _disk_full(exc):
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
                time.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
            else:
                if failed:
                    self.restored_at = time.time()
                    with _notice_lock:
                        self._outage_said = False
                return result

    return wrapper


class SQLStore(Store):
    # Whether the current outage has been announced (see ``retrying``).
    _outage_said = False

    def __init__(self, url: str, create: bool = False, retry_s: float | None = None) -> None:
        self.url = normalise_url(url)
        self.retry_s = _retry_s() if retry_s is None else retry_s
        if self.url.startswith("sqlite"):
            # The sqlite3 module commits DDL on its own, so a reader could see the schema
            # half made; with its transaction handling off and BEGIN issued here, creating
            # the schema (like every transaction) is atomic.
            self.engine = sa.create_engine(self.url, connect_args={"timeout": 60,
                                                                   "isolation_level": None},
                                           poolclass=sa.pool.NullPool)
            event.listen(self.engine, "connect", _sqlite_pragmas)
            event.listen(self.engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN"))
        else:
            # One small pool per process, shared by its threads (store/connections.py).
            self.engine = sa.create_engine(self.url, **connections.engine_kwargs())
        self._prepare(create)

    @retrying
    def _prepare(self, create: bool) -> None:
        with self.engine.begin() as conn:
            has_meta = sa.inspect(conn).has_table("amp_meta")
            if not has_meta:
                if not create:
                    raise StoreError(f"store {redact(self.url)} holds no automlperf run; "
                                     "start one with `automlperf run` first")
                meta.create_all(conn)
                self._number_epochs(conn)
                conn.execute(T_META.insert().values(key="schema_version",
                                                    value=str(SCHEMA_VERSION)))
                return
            row = conn.execute(sa.select(T_META.c.value).where(
                T_META.c.key == "schema_version")).first()
        found = row[0] if row else "none"
        if found != str(SCHEMA_VERSION):
            raise SchemaMismatch(f"store {redact(self.url)} has schema version {found}; this "
                                 f"automlperf reads version {SCHEMA_VERSION}. Use the version "
                                 "that wrote it, or start a new run directory")
        with self.engine.begin() as conn:
            if not sa.inspect(conn).has_table("amp_nodes"):
                T_NODES.create(conn)
            if not any(i["name"] == "amp_trials_replica"
                       for i in sa.inspect(conn).get_indexes("amp_trials")):
                conn.exec_driver_sql("CREATE INDEX IF NOT EXISTS amp_trials_replica "
                                     "ON amp_trials (replica_id)")
            self._number_epochs(conn)
        self._add_columns("amp_samples", (("figures", "BLOB" if self._sqlite else "BYTEA"),
                                          ("figure_keys", "TEXT")))
        self._add_columns("amp_epochs", (("val_skipped", "BIGINT NOT NULL DEFAULT 0"),
                                         ("device_share", "FLOAT"),
                                         ("compiled", "BOOLEAN NOT NULL DEFAULT FALSE"),
                                         ("decode_path", "TEXT NOT NULL DEFAULT ''"),
                                         ("cpu_decoded", "BIGINT NOT NULL DEFAULT 0"),
                                         ("val_loss", "DOUBLE PRECISION")))

    def _add_columns(self, table: str, columns: tuple[tuple[str, str], ...]) -> None:
        """Columns added after a store was made: its existing rows get their default."""
        with self.engine.begin() as conn:
            have = {c["name"] for c in sa.inspect(conn).get_columns(table)}
        for name, kind in columns:
            if name in have:
                continue
            try:
                with self.engine.begin() as conn:
                    conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN "
                                         + ("" if self._sqlite else "IF NOT EXISTS ") + f"{name} {kind}")
            except sa.exc.OperationalError as exc:
                # SQLite has no IF NOT EXISTS here: another process opening the store added it.
                if "duplicate column" not in str(exc):
                    raise

    @property
    def _sqlite(self) -> bool:
        return self.url.startswith("sqlite")

    def _number_epochs(self, conn: Any) -> None:
        """Epochs carry the order the store received them in, so a reader can ask for the
        ones after those it has: SQLite's rowid; on PostgreSQL an identity column, added to
        stores made before it (PostgreSQL numbers the rows already there)."""
        if self._sqlite or any(c["name"] == "seq" for c in sa.inspect(conn).get_columns("amp_epochs")):
            return
        conn.exec_driver_sql("ALTER TABLE amp_epochs ADD COLUMN IF NOT EXISTS seq BIGINT "
                             "GENERATED BY DEFAULT AS IDENTITY")
        conn.exec_driver_sql("CREATE INDEX IF NOT EXISTS amp_epochs_seq ON amp_epochs (seq)")

    @property
    def _seq(self) -> Any:
        return sa.literal_column("amp_epochs.rowid" if self._sqlite else "amp_epochs.seq")

    # runs and segments ---------------------------------------------------------------------
    @retrying
    def create_run(self, name: str, config: dict[str, Any], system: dict[str, Any],
                   duration_s: float, now: float) -> int:
        with self.engine.begin() as conn:
            result = conn.execute(T_RUNS.insert().values(
                name=name, created_at=now, duration_s=duration_s, config=json.dumps(config),
                system=json.dumps(system)))
            return _new_id(result)

    @retrying
    def run(self, run_id: int) -> dict[str, Any]:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(T_RUNS).where(T_RUNS.c.id == run_id)).mappings().first()
        if row is None:
            raise StoreError(f"run {run_id} is not in store {redact(self.url)}")
        return {**row, "config": json.loads(row["config"]), "system": json.loads(row["system"])}

    @retrying
    def start_segment(self, run_id: int, now: float, deadline_at: float) -> int:
        with self.engine.begin() as conn:
            last = conn.execute(sa.select(sa.func.max(T_SEGMENTS.c.idx)).where(
                T_SEGMENTS.c.run_id == run_id)).scalar()
            index = 0 if last is None else last + 1
            conn.execute(T_SEGMENTS.insert().values(run_id=run_id, idx=index, started_at=now,
                                                    deadline_at=deadline_at, last_seen=now))
            return index

    @retrying
    def touch_segment(self, run_id: int, index: int, now: float) -> None:
        with self.engine.begin() as conn:
            conn.execute(T_SEGMENTS.update().where(
                (T_SEGMENTS.c.run_id == run_id) & (T_SEGMENTS.c.idx == index)
                & T_SEGMENTS.c.ended_at.is_(None)).values(last_seen=now))

    @retrying
    def end_segment(self, run_id: int, index: int, ended_at: float) -> None:
        with self.engine.begin() as conn:
            conn.execute(T_SEGMENTS.update().where(
                (T_SEGMENTS.c.run_id == run_id) & (T_SEGMENTS.c.idx == index)
                & T_SEGMENTS.c.ended_at.is_(None)).values(ended_at=ended_at, last_seen=ended_at))

    @retrying
    def segments(self, run_id: int) -> list[SegmentRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(T_SEGMENTS).where(T_SEGMENTS.c.run_id == run_id)
                                .order_by(T_SEGMENTS.c.idx)).mappings().all()
        return [SegmentRecord(r["run_id"], r["idx"], r["started_at"], r["deadline_at"],
                              r["last_seen"], r["ended_at"]) for r in rows]

    # replicas ------------------------------------------------------------------------------
    @retrying
    def register_replica(self, run_id: int, index: int, segment: int, host: str, pid: int,
                         devices: list[str], now: float) -> int:
        with self.engine.begin() as conn:
            result = conn.execute(T_REPLICAS.insert().values(
                run_id=run_id, idx=index, segment=segment, host=host, pid=pid,
                devices=json.dumps(devices), started_at=now, last_heartbeat=now,
                status=RUNNING, reason=""))
            return _new_id(result)

    @retrying
    def heartbeat(self, replica_id: int, now: float, lease_s: float) -> None:
        with self.engine.begin() as conn:
            conn.execute(T_REPLICAS.update().where(T_REPLICAS.c.id == replica_id)
                         .values(last_heartbeat=now))
            conn.execute(T_TRIALS.update().where(
                (T_TRIALS.c.replica_id == replica_id) & (T_TRIALS.c.status == RUNNING))
                .values(lease_until=now + lease_s))

    @retrying
    def end_replica(self, replica_id: int, status: str, now: float, reason: str = "") -> None:
        with self.engine.begin() as conn:
            conn.execute(T_REPLICAS.update().where(
                (T_REPLICAS.c.id == replica_id) & (T_REPLICAS.c.status == RUNNING))
                .values(status=str(status), ended_at=now, reason=reason))

    @retrying
    def replicas(self, run_id: int) -> list[ReplicaRecord]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(T_REPLICAS).where(T_REPLICAS.c.run_id == run_id)
                                .order_by(T_REPLICAS.c.id)).mappings().all()
        return [ReplicaRecord(r["id"], r["run_id"], r["idx"], r["segment"], r["host"], r["pid"],
                              json.loads(r["devices"]), r["started_at"], r["last_heartbeat"],
                              r["status"], r["reason"]) for r in rows]

    # trials --------------------------------------------------------------------------------
    @retrying
    def claim_trial(self, run_id: int, replica_id: int, replica_index: int, graph_hash: str,
                    graph_json: str, parent_id: int | None, morphs: list[dict[str, Any]],
                    round_index: int, hparams: dict[str, Any], now: float,
                    lease_s: float) -> int | None:
        try:
            with self.engine.begin() as conn:
                result = conn.execute(T_TRIALS.insert().values(
                    run_id=run_id, replica_index=replica_index, replica_id=replica_id,
                    graph_hash=graph_hash, graph_json=graph_json, parent_id=parent_id,
                    morphs=json.dumps(morphs), round=round_index, hparams=json.dumps(hparams),
                    status=RUNNING, reason="", created_at=now, lease_until=now + lease_s,
                    extra="{}"))
                return _new_id(result)
        except IntegrityError:
            pass
        # Ours, when an earlier try committed but the server went away before saying so.
        with self.engine.connect() as conn:
            mine = conn.execute(sa.select(T_TRIALS.c.id).where(
                (T_TRIALS.c.run_id == run_id) & (T_TRIALS.c.graph_hash == graph_hash)
                & (T_TRIALS.c.replica_id == replica_id) & (T_TRIALS.c.created_at == now)
                & (T_TRIALS.c.status == RUNNING))).scalar()
        return None if mine is None else int(mine)  # None: another replica has it

    @retrying
    def finish_trial(self, trial_id: int, status: str, now: float, reason: str = "",
                     best_accuracy: float | None = None,
                     predicted_accuracy: float | None = None, weights_path: str | None = None,
                     extra: dict[str, Any] | None = None) -> bool:
        if status not in TrialStatus.final():
            raise ValueError(f"a trial ends as one of {', '.join(TrialStatus.final())}, not "
                             f"{status!r}")
        with self.engine.begin() as conn:
            result = conn.execute(T_TRIALS.update().where(
                (T_TRIALS.c.id == trial_id) & (T_TRIALS.c.status == RUNNING)).values(
                status=str(status), reason=reason, finished_at=now, lease_until=None,
                best_accuracy=best_accuracy, predicted_accuracy=predicted_accuracy,
                weights_path=weights_path, extra=json.dumps(extra or {})))
            return result.rowcount == 1

    @retrying
    def expire_leases(self, run_id: int, now: float) -> list[int]:
        expired = []
        with self.engine.begin() as conn:
            ids = conn.execute(sa.select(T_TRIALS.c.id).where(
                (T_TRIALS.c.run_id == run_id) & (T_TRIALS.c.status == RUNNING)
                & (T_TRIALS.c.lease_until < now))).scalars().all()
            for trial_id in ids:
                result = conn.execute(T_TRIALS.update().where(
                    (T_TRIALS.c.id == trial_id) & (T_TRIALS.c.status == RUNNING)
                    & (T_TRIALS.c.lease_until < now)).values(
                    status=TrialStatus.FAILED.value, finished_at=now, lease_until=None,
                    reason=LEASE_EXPIRED))
                if result.rowcount:
                    expired.append(trial_id)
        return expired

    def _trial_rows(self, where: Any) -> list[TrialRecord]:
        # Per trial, through the epochs' primary key: reading one new trial must not
        # aggregate every epoch of the run (half a million after ten hours at 512 nodes).
        mine = T_EPOCHS.c.trial_id == T_TRIALS.c.id
        n = sa.select(sa.func.count()).where(mine).scalar_subquery()
        best = sa.select(sa.func.max(T_EPOCHS.c.val_accuracy)).where(mine).scalar_subquery()
        query = (sa.select(T_TRIALS, n.label("n"), best.label("best"))
                 .where(where).order_by(T_TRIALS.c.id))
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        out = []
        for r in rows:
            best = r["best_accuracy"]
            if r["status"] == RUNNING:
                best = r["best"]  # so far
            out.append(TrialRecord(
                r["id"], r["run_id"], r["replica_index"], r["replica_id"], r["graph_hash"],
                r["graph_json"], r["parent_id"], json.loads(r["morphs"]), r["round"],
                json.loads(r["hparams"]), r["status"], r["reason"], r["created_at"],
                r["finished_at"], r["lease_until"], best, r["predicted_accuracy"],
                int(r["n"] or 0), r["weights_path"], json.loads(r["extra"])))
        return out

    @retrying
    def trials(self, run_id: int, after_id: int = 0) -> list[TrialRecord]:
        return self._trial_rows((T_TRIALS.c.run_id == run_id) & (T_TRIALS.c.id > after_id))

    @retrying
    def trial(self, trial_id: int) -> TrialRecord:
        rows = self._trial_rows(T_TRIALS.c.id == trial_id)
        if not rows:
            raise StoreError(f"trial {trial_id} is not in store {redact(self.url)}")
        return rows[0]

    @retrying
    def tally(self, run_id: int) -> list[TrialTally]:
        query = (sa.select(T_TRIALS.c.replica_index, T_TRIALS.c.status, sa.func.count(),
                           sa.func.max(T_TRIALS.c.id))
                 .where(T_TRIALS.c.run_id == run_id)
                 .group_by(T_TRIALS.c.replica_index, T_TRIALS.c.status))
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [TrialTally(int(r), str(s), int(n), int(last)) for r, s, n, last in rows]

    @retrying
    def summaries(self, run_id: int) -> list[TrialSummary]:
        cols = (T_TRIALS.c.id, T_TRIALS.c.graph_hash, T_TRIALS.c.status,
                T_TRIALS.c.replica_index, T_TRIALS.c.best_accuracy, T_TRIALS.c.predicted_accuracy)
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(*cols).where(T_TRIALS.c.run_id == run_id)
                                .order_by(T_TRIALS.c.id)).all()
        return [TrialSummary(*row) for row in rows]

    # epochs and samples --------------------------------------------------------------------
    @retrying
    def record_epoch(self, epoch: EpochRecord) -> None:
        try:
            with self.engine.begin() as conn:
                conn.execute(T_EPOCHS.insert().values(**epoch.__dict__))
        except IntegrityError:
            pass
        # The same record, when an earlier try committed but the server went away before
        # saying so: recorded once, as asked.
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(*(T_EPOCHS.c[name] for name in EPOCH_FIELDS)).where(
                (T_EPOCHS.c.trial_id == epoch.trial_id)
                & (T_EPOCHS.c.epoch == epoch.epoch))).first()
        if row is None or tuple(row) != tuple(getattr(epoch, name) for name in EPOCH_FIELDS):
            raise StoreError(f"epoch {epoch.epoch} of trial {epoch.trial_id} is already "
                             "recorded; records are never rewritten")

    @retrying
    def epochs(self, run_id: int) -> list[EpochRecord]:
        # Plain rows, in the record's field order: half a million of them in a long run.
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(*(T_EPOCHS.c[name] for name in EPOCH_FIELDS))
                                .where(T_EPOCHS.c.run_id == run_id)
                                .order_by(T_EPOCHS.c.ended_at, T_EPOCHS.c.trial_id,
                                          T_EPOCHS.c.epoch)).all()
        ops = EPOCH_FIELDS.index("ops")
        with bulk():
            # The row holds exactly the fields before run_id.
            return [EpochRecord(*r[:ops], int(r[ops]), *r[ops + 1:], run_id=run_id)  # type: ignore[misc]
                    for r in rows]

    @retrying
    def epochs_after(self, run_id: int, after: int,
                     also: Sequence[int] = ()) -> list[tuple[int, int, EpochRecord]]:
        seq = self._seq
        wanted = (T_EPOCHS.c.run_id == run_id) & (seq > after)
        if also:
            wanted = wanted | seq.in_(list(also))
        query = (sa.select(seq.label("seq"), T_TRIALS.c.replica_index, *T_EPOCHS.c)
                 .join(T_TRIALS, T_TRIALS.c.id == T_EPOCHS.c.trial_id)
                 .where(wanted).order_by(seq))
        with self.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        fields = [c.name for c in T_EPOCHS.c]
        return [(int(r["seq"]), int(r["replica_index"]),
                 EpochRecord(**{**{k: r[k] for k in fields}, "ops": int(r["ops"])}))
                for r in rows]

    @retrying
    def last_epoch_number(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.max(self._seq))
                                    .select_from(T_EPOCHS)).scalar() or 0)

    @retrying
    def add_samples(self, run_id: int, node: str, samples: list[dict[str, Any]]) -> None:
        if not samples:
            return
        rows = []
        for s in samples:
            numbers, uuids, cpu_energy = sample_figures(s)
            packed = _packed(numbers)
            rows.append({"run_id": run_id, "node": node, "t": s["t"], "data": json.dumps(s),
                         "figures": packed,
                         "figure_keys": None if packed is None else json.dumps([uuids, cpu_energy])})
        with self.engine.begin() as conn:
            conn.execute(T_SAMPLES.insert(), rows)

    @retrying
    def samples(self, run_id: int) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(T_SAMPLES.c.node, T_SAMPLES.c.data)
                                .where(T_SAMPLES.c.run_id == run_id)
                                .order_by(T_SAMPLES.c.t, T_SAMPLES.c.id)).all()
        # One parse of them all: a long run has a million samples.
        with bulk():
            parsed = json.loads("[" + ",".join(data for _, data in rows) + "]")
        for sample, (node, _) in zip(parsed, rows):
            sample["node"] = node
        return parsed

    SAMPLE_CHUNK = 20_000

    @retrying
    def sample_nodes(self, run_id: int) -> dict[str, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(T_SAMPLES.c.node, sa.func.count())
                                .where(T_SAMPLES.c.run_id == run_id)
                                .group_by(T_SAMPLES.c.node)).all()
        return {str(node): int(n) for node, n in rows}

    def sample_figure_chunks(self, run_id: int,
                             nodes: Sequence[str] | None = None) -> Iterator[list[SampleFigures]]:
        # Streamed (not retried: chunks already handed out cannot be taken back; the reader
        # starts again). A row without figures is read from its whole sample.
        wanted = T_SAMPLES.c.run_id == run_id
        if nodes is not None:
            wanted = wanted & T_SAMPLES.c.node.in_(list(nodes))
        figures, keys = T_SAMPLES.c.figures, T_SAMPLES.c.figure_keys
        whole = sa.case((figures.is_(None), T_SAMPLES.c.data), else_=sa.null())
        with self.engine.connect() as conn:
            rows = conn.execution_options(yield_per=self.SAMPLE_CHUNK).execute(
                sa.select(T_SAMPLES.c.node, T_SAMPLES.c.t, figures, keys, whole)
                .where(wanted).order_by(T_SAMPLES.c.t, T_SAMPLES.c.id))
            for part in rows.partitions():
                parsed = iter(json.loads("[" + ",".join(k for _, _, f, k, _ in part if f is not None)
                                         + "]"))
                out: list[SampleFigures] = []
                for node, t, f, _, data in part:
                    if f is not None:
                        uuids, cpu_energy = next(parsed)
                        out.append((node, t, _unpacked(f), uuids, cpu_energy))
                    else:
                        out.append((node, t, *sample_figures(json.loads(data))))
                yield out

    def sample_texts(self, run_id: int) -> Iterator[list[tuple[str, str]]]:
        # Streamed like sample_figure_chunks: a long run's samples are a gigabyte of text.
        with self.engine.connect() as conn:
            rows = conn.execution_options(yield_per=self.SAMPLE_CHUNK).execute(
                sa.select(T_SAMPLES.c.node, T_SAMPLES.c.data)
                .where(T_SAMPLES.c.run_id == run_id).order_by(T_SAMPLES.c.t, T_SAMPLES.c.id))
            for part in rows.partitions():
                yield [(node, data) for node, data in part]

    @retrying
    def record_node(self, run_id: int, replica_index: int, segment: int, host: str,
                    description: dict[str, Any], now: float) -> None:
        with self.engine.begin() as conn:
            conn.execute(T_NODES.insert().values(
                run_id=run_id, replica_index=replica_index, segment=segment, host=host,
                recorded_at=now, data=json.dumps(description)))

    @retrying
    def nodes(self, run_id: int) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(T_NODES).where(T_NODES.c.run_id == run_id)
                                .order_by(T_NODES.c.recorded_at, T_NODES.c.id)).mappings().all()
        return [{**json.loads(r["data"]), "replica_index": r["replica_index"],
                 "segment": r["segment"], "host": r["host"], "recorded_at": r["recorded_at"]}
                for r in rows]

    def close(self) -> None:
        self.engine.dispose()


_EXACT = 2**53  # integers up to this come back from a float64 unchanged


def _packed(numbers: list[Any]) -> bytes | None:
    """The numbers as little-endian float64, or None where one would not come back as it
    was (not a number, or an integer too large)."""
    for v in numbers:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, int)
                                                                      and abs(v) > _EXACT):
            return None
    packed = array("d", numbers)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def _unpacked(data: bytes) -> list[float]:
    numbers = array("d", bytes(data))
    if sys.byteorder == "big":
        numbers.byteswap()
    return numbers.tolist()


@contextlib.contextmanager
def bulk() -> Iterator[None]:
    """Building a long run's rows (a million samples, half a million epochs): Python's cycle
    collector would walk every one of them again and again as they accumulate, and they hold
    no cycles, so it waits until they are built."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _new_id(result: Any) -> int:
    """The id the database gave the row just inserted."""
    key = result.inserted_primary_key
    if key is None:
        raise StoreError("the database returned no id for a new row")
    return int(key[0])


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
    cur.execute("PRAGMA synchronous=FULL")  # a record acknowledged survives a power cut
    cur.execute("PRAGMA busy_timeout=60000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def open_store(url: str | None = None, run_dir: Path | str | None = None,
               create: bool = False) -> SQLStore:
    """The store at ``url``, or the run directory's ``history.db``."""
    if url is None:
        if run_dir is None:
            raise StoreError("no store: give a URL or a run directory")
        url = f"sqlite:///{Path(run_dir).resolve() / 'history.db'}"
    try:
        return SQLStore(url, create=create)
    except ModuleNotFoundError as exc:
        if "psycopg" in str(exc):
            raise StoreError("a PostgreSQL store needs the psycopg driver: "
                             "pip install 'automlperf[postgres]'") from None
        raise


__all__ = ["SQLStore", "open_store"]
