"""The store on SQLAlchemy: SQLite (one machine, the default) or PostgreSQL (clusters). The
tables and their check on open are store/schema.py; what each write does in its transaction,
store/writes.py; the reads, store/reads.py. Here: one transaction per call, retried through
outages (store/retry.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event

from automlperf.store import connections, reads, schema
from automlperf.store.base import (Changes, Claim, EpochRecord, ReplicaRecord,
                                   SampleFigures, SegmentRecord, Store, StoreError, TrialChange,
                                   TrialRecord, TrialSummary, TrialTally)
from automlperf.store.retry import configured_retry_s, retried, retrying
from automlperf.store.schema import T_TRIALS
from automlperf.store.urls import normalise_url, redact
from automlperf.store.writes import Writes

R = TypeVar("R")


class SQLStore(Store):
    # Whether the current outage has been announced (store/retry.py ``retrying``).
    outage_said = False
    SAMPLE_CHUNK = reads.SAMPLE_CHUNK

    def __init__(self, url: str, create: bool = False, retry_s: float | None = None) -> None:
        self.url = normalise_url(url)
        self.retry_s = configured_retry_s() if retry_s is None else retry_s
        self.sqlite = self.url.startswith("sqlite")
        if self.sqlite:
            # The sqlite3 module commits DDL on its own, so a reader could see the schema
            # half made; with its transaction handling off and BEGIN issued here, creating
            # the schema (like every transaction) is atomic. A few connections are kept for
            # the next calls of the process's threads: opening the file and setting its
            # pragmas again was two thirds of an epoch's or a sample's write. More threads
            # at once than are kept open more, and never wait.
            self.engine = sa.create_engine(self.url, connect_args={"timeout": 60,
                                                                   "isolation_level": None},
                                           poolclass=sa.pool.QueuePool, pool_size=4,
                                           max_overflow=-1)
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

    def _write(self, op: Callable[..., R], **arguments: Any) -> R:
        with self.engine.begin() as conn:
            return op(conn, **arguments)

    def _read(self, op: Callable[..., R], **arguments: Any) -> R:
        with self.reader.connect() as conn:
            return op(conn, **arguments)

    # runs and segments ---------------------------------------------------------------------
    @retrying
    def create_run(self, name: str, config: dict[str, Any], system: dict[str, Any],
                   duration_s: float, now: float) -> int:
        return self._write(self.writes.create_run, name=name, config=config, system=system,
                           duration_s=duration_s, now=now, retried=retried())

    @retrying
    def extend_run(self, run_id: int, duration_s: float, config: dict[str, Any],
                   system: dict[str, Any]) -> None:
        self._write(self.writes.extend_run, run_id=run_id, duration_s=duration_s, config=config,
                    system=system)

    @retrying
    def run(self, run_id: int) -> dict[str, Any]:
        found = self._read(reads.run, run_id=run_id)
        if found is None:
            raise StoreError(f"run {run_id} is not in store {redact(self.url)}")
        return found

    @retrying
    def start_segment(self, run_id: int, now: float, deadline_at: float) -> int:
        return self._write(self.writes.start_segment, run_id=run_id, now=now,
                           deadline_at=deadline_at, retried=retried())

    @retrying
    def touch_segment(self, run_id: int, index: int, now: float) -> None:
        self._write(self.writes.touch_segment, run_id=run_id, index=index, now=now)

    @retrying
    def end_segment(self, run_id: int, index: int, ended_at: float) -> None:
        self._write(self.writes.end_segment, run_id=run_id, index=index, ended_at=ended_at)

    @retrying
    def segments(self, run_id: int) -> list[SegmentRecord]:
        return self._read(reads.segments, run_id=run_id)

    # replicas ------------------------------------------------------------------------------
    @retrying
    def register_replica(self, run_id: int, index: int, segment: int, host: str, pid: int,
                         devices: list[str], now: float) -> int:
        return self._write(self.writes.register_replica, run_id=run_id, index=index,
                           segment=segment, host=host, pid=pid, devices=devices, now=now,
                           retried=retried())[0]

    @retrying
    def heartbeat(self, replica_id: int, now: float, lease_s: float) -> SegmentRecord | None:
        return self._write(self.writes.heartbeat, replica_id=replica_id, now=now, lease_s=lease_s)

    @retrying
    def end_replica(self, replica_id: int, status: str, now: float, reason: str = "") -> None:
        self._write(self.writes.end_replica, replica_id=replica_id, status=status, now=now,
                    reason=reason)

    @retrying
    def replicas(self, run_id: int) -> list[ReplicaRecord]:
        return self._read(reads.replicas, run_id=run_id)

    @retrying
    def replica_changes(self, run_id: int, after: int,
                        also: Sequence[int] = ()) -> Changes[tuple[int, ReplicaRecord]]:
        rows = self._read(reads.replica_changes, run_id=run_id, after=after, also=also)
        # SQLite's writers take turns: no number is taken by a transaction yet to commit.
        return Changes(rows=rows,
                       through=max([after, *(n for n, _ in rows)]) if self.sqlite else None)

    @retrying
    def silent_replicas(self, run_id: int, before: float) -> list[int]:
        return self._read(reads.silent_replicas, run_id=run_id, before=before)

    # trials --------------------------------------------------------------------------------
    @retrying
    def claim_trial(self, claim: Claim) -> int | None:
        claimed = self._write(self.writes.claim_trial, claim=claim, retried=retried())
        return None if claimed is None else claimed[0]

    @retrying
    def finish_trial(self, trial_id: int, status: str, now: float, reason: str = "",
                     best_accuracy: float | None = None,
                     predicted_accuracy: float | None = None, weights_path: str | None = None,
                     extra: dict[str, Any] | None = None) -> bool:
        return self._write(self.writes.finish_trial, trial_id=trial_id, status=status, now=now,
                           reason=reason, best_accuracy=best_accuracy,
                           predicted_accuracy=predicted_accuracy, weights_path=weights_path,
                           extra=extra)[0]

    @retrying
    def expire_leases(self, run_id: int, now: float) -> list[int]:
        return [trial for trial, _ in self._write(self.writes.expire_leases, run_id=run_id,
                                                  now=now)]

    @retrying
    def trials(self, run_id: int, after_id: int = 0) -> list[TrialRecord]:
        return self._read(reads.trial_rows, where=(T_TRIALS.c.run_id == run_id)
                          & (T_TRIALS.c.id > after_id))

    @retrying
    def trial(self, trial_id: int) -> TrialRecord:
        rows = self._read(reads.trial_rows, where=T_TRIALS.c.id == trial_id)
        if not rows:
            raise StoreError(f"trial {trial_id} is not in store {redact(self.url)}")
        return rows[0]

    @retrying
    def tally(self, run_id: int) -> list[TrialTally]:
        return self._read(reads.tally, run_id=run_id)

    @retrying
    def summaries(self, run_id: int) -> list[TrialSummary]:
        return self._read(reads.summaries, run_id=run_id)

    @retrying
    def changes(self, run_id: int, after: int, also: Sequence[int] = ()) -> Changes[TrialChange]:
        rows = self._read(reads.changes, run_id=run_id, after=after, also=also)
        return Changes(rows=rows,
                       through=max([after, *(r.changed for r in rows)]) if self.sqlite else None)

    @retrying
    def graphs(self, trial_ids: Sequence[int]) -> dict[int, str]:
        return self._read(reads.graphs, ids=trial_ids)

    # epochs and samples --------------------------------------------------------------------
    @retrying
    def record_epoch(self, epoch: EpochRecord) -> None:
        self._write(self.writes.record_epoch, epoch=epoch)

    @retrying
    def epochs(self, run_id: int) -> list[EpochRecord]:
        return self._read(reads.epochs, run_id=run_id)

    @retrying
    def epochs_after(self, run_id: int, after: int,
                     also: Sequence[int] = ()) -> list[tuple[int, int, EpochRecord]]:
        with self.reader.connect() as conn:
            return reads.epochs_after(conn, self.sqlite, run_id=run_id, after=after, also=also)

    @retrying
    def last_epoch_number(self) -> int:
        with self.reader.connect() as conn:
            return reads.last_epoch_number(conn, self.sqlite)

    @retrying
    def add_samples(self, run_id: int, node: str, samples: list[dict[str, Any]]) -> None:
        if samples:
            self._write(self.writes.add_samples, run_id=run_id, node=node, samples=samples,
                        retried=retried())

    @retrying
    def samples(self, run_id: int) -> list[dict[str, Any]]:
        return self._read(reads.samples, run_id=run_id)

    @retrying
    def sample_nodes(self, run_id: int) -> dict[str, int]:
        return self._read(reads.sample_nodes, run_id=run_id)

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
        self._write(self.writes.record_node, run_id=run_id, replica_index=replica_index,
                    segment=segment, host=host, description=description, now=now,
                    retried=retried())

    @retrying
    def nodes(self, run_id: int) -> list[dict[str, Any]]:
        return self._read(reads.nodes, run_id=run_id)

    def close(self) -> None:
        self.engine.dispose()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
    cur.execute("PRAGMA synchronous=FULL")  # a record acknowledged survives a power cut
    cur.execute("PRAGMA busy_timeout=60000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()
