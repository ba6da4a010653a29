"""The store's reads through a connection it is given: what a replica, the primary and the
store service read (trials, their changes and graphs, replicas, segments), and a finished
run's records in bulk (epochs, samples, nodes), which `check`, the result and the report
read."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY

from automlperf.events import TrialStatus
from automlperf.store.base import (EPOCH_FIELDS, EpochRecord, ReplicaRecord, SampleFigures,
                                   SegmentRecord, TrialChange, TrialRecord, TrialSummary,
                                   TrialTally, sample_figures)
from automlperf.store.schema import (T_EPOCHS, T_NODES, T_REPLICAS, T_RUNS,
                                     T_SAMPLES, T_SEGMENTS, T_TRIALS)
from automlperf.store.values import bulk, unpacked

RUNNING = TrialStatus.RUNNING.value
SAMPLE_CHUNK = 20_000
# Values in one IN list on SQLite, which takes at most 32,766 parameters in a statement (999
# before 3.32). PostgreSQL takes 65,535 (psycopg says so as an OperationalError, which the
# store would wait out as an outage): there a list is one array parameter.
IN_CHUNK = 10_000 if sqlite3.sqlite_version_info >= (3, 32) else 900


def one_of(conn: sa.Connection, column: Any, values: Sequence[int]) -> list[Any]:
    """Conditions, one per statement, that together hold where ``column`` is one of
    ``values``: one ``= ANY(array)`` on PostgreSQL, IN lists of IN_CHUNK on SQLite."""
    if not values:
        return []
    if conn.dialect.name == "postgresql":
        return [column == sa.any_(sa.cast(sa.bindparam("one_of", list(values),
                                                       type_=ARRAY(sa.BigInteger)),
                                          ARRAY(sa.BigInteger)))]
    ordered = list(values)
    return [column.in_(ordered[i:i + IN_CHUNK]) for i in range(0, len(ordered), IN_CHUNK)]


def _numbered(conn: sa.Connection, fetch: Callable[[Any], list[Any]], column: Any, after: int,
              also: Sequence[int], number: Callable[[Any], int], mine: Any = None) -> list[Any]:
    """The rows ``fetch(condition)`` finds whose ``column`` is above ``after`` (and ``mine``
    holds) or one of ``also``, in its order."""
    rows = fetch(column > after if mine is None else mine & (column > after))
    asked = sorted({a for a in also if a <= after})
    for condition in one_of(conn, column, asked):
        rows += fetch(condition)
    if asked:
        rows.sort(key=number)
    return rows


def epoch_seq(sqlite: bool) -> Any:
    """The number the store gave each epoch, in the order it received them."""
    return sa.literal_column("amp_epochs.rowid" if sqlite else "amp_epochs.seq")


def run(conn: sa.Connection, run_id: int) -> dict[str, Any] | None:
    row = conn.execute(sa.select(T_RUNS).where(T_RUNS.c.id == run_id)).mappings().first()
    if row is None:
        return None
    return {**row, "config": json.loads(row["config"]), "system": json.loads(row["system"])}


def segments(conn: sa.Connection, run_id: int) -> list[SegmentRecord]:
    rows = conn.execute(sa.select(T_SEGMENTS).where(T_SEGMENTS.c.run_id == run_id)
                        .order_by(T_SEGMENTS.c.idx)).mappings().all()
    return [SegmentRecord(run_id=r["run_id"], index=r["idx"], started_at=r["started_at"],
                          deadline_at=r["deadline_at"], last_seen=r["last_seen"],
                          ended_at=r["ended_at"]) for r in rows]


def replica_from_row(r: Any) -> ReplicaRecord:
    """The replica of a row of its table."""
    return ReplicaRecord(id=r["id"], run_id=r["run_id"], index=r["idx"], segment=r["segment"],
                         host=r["host"], pid=r["pid"], devices=json.loads(r["devices"]),
                         started_at=r["started_at"], last_heartbeat=r["last_heartbeat"],
                         status=r["status"], reason=r["reason"])


def replicas(conn: sa.Connection, run_id: int) -> list[ReplicaRecord]:
    rows = conn.execute(sa.select(T_REPLICAS).where(T_REPLICAS.c.run_id == run_id)
                        .order_by(T_REPLICAS.c.id)).mappings().all()
    return [replica_from_row(r) for r in rows]


def replica_changes(conn: sa.Connection, run_id: int, after: int,
                    also: Sequence[int] = ()) -> list[tuple[int, ReplicaRecord]]:
    """(change number, replica) of the replicas registered or ended since ``after``."""
    rows = _numbered(conn, lambda wanted: list(conn.execute(
        sa.select(T_REPLICAS).where((T_REPLICAS.c.run_id == run_id) & wanted)
        .order_by(T_REPLICAS.c.changed)).mappings()), T_REPLICAS.c.changed, after, also,
        lambda r: r["changed"])
    return [(int(r["changed"]), replica_from_row(r)) for r in rows]


def silent_replicas(conn: sa.Connection, run_id: int, before: float) -> list[int]:
    return [int(i) for i in conn.execute(sa.select(T_REPLICAS.c.id).where(
        (T_REPLICAS.c.run_id == run_id) & (T_REPLICAS.c.status == RUNNING)
        & (T_REPLICAS.c.last_heartbeat < before))).scalars()]


def trial_rows(conn: sa.Connection, where: Any) -> list[TrialRecord]:
    # Per trial, through the epochs' primary key: reading one new trial must not aggregate
    # every epoch of the run (half a million after ten hours at 512 nodes).
    mine = T_EPOCHS.c.trial_id == T_TRIALS.c.id
    n = sa.select(sa.func.count()).where(mine).scalar_subquery()
    best = sa.select(sa.func.max(T_EPOCHS.c.val_accuracy)).where(mine).scalar_subquery()
    cols = [c for c in T_TRIALS.c if c.name != "changed"]
    rows = conn.execute(sa.select(*cols, n.label("n"), best.label("best"))
                        .where(where).order_by(T_TRIALS.c.id)).mappings().all()
    out = []
    for r in rows:
        best = r["best_accuracy"]
        if r["status"] == RUNNING:
            best = r["best"]  # so far
        out.append(TrialRecord(
            id=r["id"], run_id=r["run_id"], replica_index=r["replica_index"],
            replica_id=r["replica_id"], graph_hash=r["graph_hash"], graph_json=r["graph_json"],
            parent_id=r["parent_id"], morphs=json.loads(r["morphs"]), round=r["round"],
            hparams=json.loads(r["hparams"]), status=r["status"], reason=r["reason"],
            created_at=r["created_at"], finished_at=r["finished_at"],
            lease_until=r["lease_until"], best_accuracy=best,
            predicted_accuracy=r["predicted_accuracy"], epochs_done=int(r["n"] or 0),
            weights_path=r["weights_path"], extra=json.loads(r["extra"])))
    return out


def tally(conn: sa.Connection, run_id: int) -> list[TrialTally]:
    query = (sa.select(T_TRIALS.c.replica_index, T_TRIALS.c.status, sa.func.count(),
                       sa.func.max(T_TRIALS.c.id))
             .where(T_TRIALS.c.run_id == run_id)
             .group_by(T_TRIALS.c.replica_index, T_TRIALS.c.status))
    return [TrialTally(replica_index=int(r), status=str(s), count=int(n), last_id=int(last))
            for r, s, n, last in conn.execute(query)]


SUMMARY = (T_TRIALS.c.id, T_TRIALS.c.graph_hash, T_TRIALS.c.status, T_TRIALS.c.replica_index,
           T_TRIALS.c.best_accuracy, T_TRIALS.c.predicted_accuracy)


def summaries(conn: sa.Connection, run_id: int) -> list[TrialSummary]:
    rows = conn.execute(sa.select(*SUMMARY).where(T_TRIALS.c.run_id == run_id)
                        .order_by(T_TRIALS.c.id)).mappings().all()
    return [TrialSummary(**row) for row in rows]


def changes(conn: sa.Connection, run_id: int, after: int,
            also: Sequence[int] = ()) -> list[TrialChange]:
    """The trials claimed or ended since change ``after`` (and those numbered in ``also``),
    in the order of their change numbers: what a history read since its last read needs."""
    rows = _numbered(conn, lambda wanted: list(conn.execute(
        sa.select(T_TRIALS.c.changed, *SUMMARY).where((T_TRIALS.c.run_id == run_id) & wanted)
        .order_by(T_TRIALS.c.changed)).mappings()), T_TRIALS.c.changed, after, also,
        lambda r: r["changed"])
    return [TrialChange(**row) for row in rows]


def graphs(conn: sa.Connection, ids: Sequence[int]) -> dict[int, str]:
    out: dict[int, str] = {}
    for condition in one_of(conn, T_TRIALS.c.id, sorted(set(ids))):
        out.update((int(t), g) for t, g in conn.execute(
            sa.select(T_TRIALS.c.id, T_TRIALS.c.graph_json).where(condition)))
    return out


def last_change(conn: sa.Connection, run_id: int) -> int:
    return int(conn.execute(sa.select(sa.func.max(T_TRIALS.c.changed))
                            .where(T_TRIALS.c.run_id == run_id)).scalar() or 0)


# --- a finished run's records, in bulk ---------------------------------------------------------
def epochs(conn: sa.Connection, run_id: int) -> list[EpochRecord]:
    # Plain rows, in the record's field order: half a million of them in a long run.
    rows = conn.execute(sa.select(*(T_EPOCHS.c[name] for name in EPOCH_FIELDS))
                        .where(T_EPOCHS.c.run_id == run_id)
                        .order_by(T_EPOCHS.c.ended_at, T_EPOCHS.c.trial_id,
                                  T_EPOCHS.c.epoch)).all()
    out = []
    with bulk():
        for r in rows:
            found = dict(zip(EPOCH_FIELDS, r))
            found["ops"] = int(found["ops"])
            out.append(EpochRecord(**found, run_id=run_id))
    return out


def epochs_after(conn: sa.Connection, sqlite: bool, run_id: int, after: int,
                 also: Sequence[int] = ()) -> list[tuple[int, int, EpochRecord]]:
    seq = epoch_seq(sqlite)
    # A number in ``also`` is asked whatever its run: one skipped may be another run's.
    rows = _numbered(conn, lambda wanted: list(conn.execute(
        sa.select(seq.label("seq"), T_TRIALS.c.replica_index, *T_EPOCHS.c)
        .join(T_TRIALS, T_TRIALS.c.id == T_EPOCHS.c.trial_id)
        .where(wanted).order_by(seq)).mappings()), seq, after, also, lambda r: r["seq"],
        mine=T_EPOCHS.c.run_id == run_id)
    fields = [c.name for c in T_EPOCHS.c]
    return [(int(r["seq"]), int(r["replica_index"]),
             EpochRecord(**{**{k: r[k] for k in fields}, "ops": int(r["ops"])}))
            for r in rows]


def last_epoch_number(conn: sa.Connection, sqlite: bool) -> int:
    return int(conn.execute(sa.select(sa.func.max(epoch_seq(sqlite)))
                            .select_from(T_EPOCHS)).scalar() or 0)


def samples(conn: sa.Connection, run_id: int) -> list[dict[str, Any]]:
    rows = conn.execute(sa.select(T_SAMPLES.c.node, T_SAMPLES.c.data)
                        .where(T_SAMPLES.c.run_id == run_id)
                        .order_by(T_SAMPLES.c.t, T_SAMPLES.c.id)).all()
    # One parse of them all: a long run has a million samples.
    with bulk():
        parsed = json.loads("[" + ",".join(data for _, data in rows) + "]")
    for sample, (node, _) in zip(parsed, rows):
        sample["node"] = node
    return parsed


def sample_nodes(conn: sa.Connection, run_id: int) -> dict[str, int]:
    rows = conn.execute(sa.select(T_SAMPLES.c.node, sa.func.count())
                        .where(T_SAMPLES.c.run_id == run_id)
                        .group_by(T_SAMPLES.c.node)).all()
    return {str(node): int(n) for node, n in rows}


def sample_figure_chunks(engine: sa.Engine, run_id: int,
                         nodes: Sequence[str] | None = None) -> Iterator[list[SampleFigures]]:
    """Streamed; a row without figures is read from its whole sample."""
    wanted = T_SAMPLES.c.run_id == run_id
    if nodes is not None:
        wanted = wanted & T_SAMPLES.c.node.in_(list(nodes))
    figures, keys = T_SAMPLES.c.figures, T_SAMPLES.c.figure_keys
    whole = sa.case((figures.is_(None), T_SAMPLES.c.data), else_=sa.null())
    with engine.connect() as conn:
        rows = conn.execution_options(yield_per=SAMPLE_CHUNK).execute(
            sa.select(T_SAMPLES.c.node, T_SAMPLES.c.t, figures, keys, whole)
            .where(wanted).order_by(T_SAMPLES.c.t, T_SAMPLES.c.id))
        for part in rows.partitions():
            parsed = iter(json.loads("[" + ",".join(k for _, _, f, k, _ in part if f is not None)
                                     + "]"))
            out: list[SampleFigures] = []
            for node, t, f, _, data in part:
                if f is not None:
                    uuids, cpu_energy = next(parsed)
                    out.append((node, t, unpacked(f), uuids, cpu_energy))
                else:
                    out.append((node, t, *sample_figures(json.loads(data))))
            yield out


def sample_texts(engine: sa.Engine, run_id: int) -> Iterator[list[tuple[str, str]]]:
    """Streamed like sample_figure_chunks: a long run's samples are a gigabyte of text."""
    with engine.connect() as conn:
        rows = conn.execution_options(yield_per=SAMPLE_CHUNK).execute(
            sa.select(T_SAMPLES.c.node, T_SAMPLES.c.data)
            .where(T_SAMPLES.c.run_id == run_id).order_by(T_SAMPLES.c.t, T_SAMPLES.c.id))
        for part in rows.partitions():
            yield [(node, data) for node, data in part]


def nodes(conn: sa.Connection, run_id: int) -> list[dict[str, Any]]:
    rows = conn.execute(sa.select(T_NODES).where(T_NODES.c.run_id == run_id)
                        .order_by(T_NODES.c.recorded_at, T_NODES.c.id)).mappings().all()
    return [{**json.loads(r["data"]), "replica_index": r["replica_index"],
             "segment": r["segment"], "host": r["host"], "recorded_at": r["recorded_at"]}
            for r in rows]
