"""What each write of the store does inside a transaction it is given: one call per
transaction in :class:`~automlperf.store.sql.SQLStore`, many per transaction in the store
service's group commit (store/service/db.py). Every write can be sent again after its first try
committed unseen (``retried``): it then takes effect once."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects import sqlite as sqlite_dialect

from automlperf.events import TrialStatus
from automlperf.store.base import (EPOCH_FIELDS, LEASE_EXPIRED, Claim, EpochRecord, SegmentRecord,
                                   StoreError, sample_figures)
from automlperf.store.schema import (T_EPOCHS, T_NODES, T_REPLICAS, T_RUNS,
                                     T_SAMPLES, T_SEGMENTS, T_TRIALS)
from automlperf.store.values import packed

RUNNING = TrialStatus.RUNNING.value


@functools.cache
def _other(table: sa.Table) -> Any:
    """A second name for ``table`` in a statement about itself. Made once: each new alias
    builds its whole column collection again (a third of the CPU that writing a long
    run's trials took on SQLite)."""
    return table.alias()


class Writes:
    """The writes of one store, for its dialect (``sqlite`` or PostgreSQL)."""

    def __init__(self, sqlite: bool) -> None:
        self.sqlite = sqlite
        self._insert = sqlite_dialect.insert if sqlite else postgresql.insert

    def next_change(self, table: sa.Table, run_id: Any) -> Any:
        """The change number of a row written now: the database's sequence, or on SQLite
        (whose writers take turns) the run's highest number plus one."""
        if not self.sqlite:
            return sa.func.nextval("amp_changes")
        other = _other(table)
        return (sa.select(sa.func.coalesce(sa.func.max(other.c.changed), 0) + 1)
                .where(other.c.run_id == run_id).scalar_subquery())

    # runs and segments -----------------------------------------------------------------------
    def create_run(self, conn: sa.Connection, name: str, config: dict[str, Any],
                   system: dict[str, Any], duration_s: float, now: float,
                   retried: bool = False) -> int:
        values = dict(name=name, created_at=now, duration_s=duration_s,
                      config=json.dumps(config), system=json.dumps(system))
        if retried:
            # Ours, when an earlier try committed but its answer was lost.
            mine = conn.execute(sa.select(T_RUNS.c.id).where(
                *(T_RUNS.c[k] == v for k, v in values.items()))).scalar()
            if mine is not None:
                return int(mine)
        return new_id(conn.execute(T_RUNS.insert().values(**values)))

    def extend_run(self, conn: sa.Connection, run_id: int, duration_s: float,
                   config: dict[str, Any], system: dict[str, Any], retried: bool = False) -> None:
        # The same values again on a retry: nothing to find out first.
        conn.execute(T_RUNS.update().where(T_RUNS.c.id == run_id).values(
            duration_s=duration_s, config=json.dumps(config), system=json.dumps(system)))

    def start_segment(self, conn: sa.Connection, run_id: int, now: float,
                      deadline_at: float, retried: bool = False) -> int:
        if retried:
            mine = conn.execute(sa.select(T_SEGMENTS.c.idx).where(
                (T_SEGMENTS.c.run_id == run_id) & (T_SEGMENTS.c.started_at == now)
                & (T_SEGMENTS.c.deadline_at == deadline_at))).scalar()
            if mine is not None:
                return int(mine)
        last = conn.execute(sa.select(sa.func.max(T_SEGMENTS.c.idx)).where(
            T_SEGMENTS.c.run_id == run_id)).scalar()
        index = 0 if last is None else last + 1
        conn.execute(T_SEGMENTS.insert().values(run_id=run_id, idx=index, started_at=now,
                                                deadline_at=deadline_at, last_seen=now))
        return int(index)

    def touch_segment(self, conn: sa.Connection, run_id: int, index: int, now: float) -> None:
        conn.execute(T_SEGMENTS.update().where(
            (T_SEGMENTS.c.run_id == run_id) & (T_SEGMENTS.c.idx == index)
            & T_SEGMENTS.c.ended_at.is_(None)).values(last_seen=now))

    def end_segment(self, conn: sa.Connection, run_id: int, index: int, ended_at: float) -> None:
        conn.execute(T_SEGMENTS.update().where(
            (T_SEGMENTS.c.run_id == run_id) & (T_SEGMENTS.c.idx == index)
            & T_SEGMENTS.c.ended_at.is_(None)).values(ended_at=ended_at, last_seen=ended_at))

    # replicas --------------------------------------------------------------------------------
    def register_replica(self, conn: sa.Connection, run_id: int, index: int, segment: int,
                         host: str, pid: int, devices: list[str], now: float,
                         retried: bool = False) -> tuple[int, int]:
        """(the replica's id, the change number of its registration)."""
        if retried:
            # Ours, when an earlier try committed but its answer was lost.
            mine = conn.execute(sa.select(T_REPLICAS.c.id, T_REPLICAS.c.changed).where(
                (T_REPLICAS.c.run_id == run_id) & (T_REPLICAS.c.idx == index)
                & (T_REPLICAS.c.segment == segment) & (T_REPLICAS.c.host == host)
                & (T_REPLICAS.c.pid == pid) & (T_REPLICAS.c.started_at == now))).first()
            if mine is not None:
                return int(mine[0]), int(mine[1])
        row = conn.execute(T_REPLICAS.insert().values(
            run_id=run_id, idx=index, segment=segment, host=host, pid=pid,
            devices=json.dumps(devices), started_at=now, last_heartbeat=now,
            lease_until=now, status=RUNNING, reason="",
            changed=self.next_change(T_REPLICAS, run_id))
            .returning(T_REPLICAS.c.id, T_REPLICAS.c.changed)).one()
        return int(row[0]), int(row[1])

    def heartbeat(self, conn: sa.Connection, replica_id: int, now: float,
                  lease_s: float) -> SegmentRecord | None:
        """One statement: the beat, and the replica's session as the primary last wrote it."""
        seg = T_SEGMENTS
        mine = (seg.c.run_id == T_REPLICAS.c.run_id) & (seg.c.idx == T_REPLICAS.c.segment)
        cols = [sa.select(c).where(mine).scalar_subquery()
                for c in (seg.c.started_at, seg.c.deadline_at, seg.c.last_seen, seg.c.ended_at)]
        row = conn.execute(T_REPLICAS.update().where(T_REPLICAS.c.id == replica_id)
                           .values(last_heartbeat=now, lease_until=now + lease_s)
                           .returning(T_REPLICAS.c.run_id, T_REPLICAS.c.segment, *cols)).first()
        if row is None or row[2] is None:
            return None
        run_id, index, started_at, deadline_at, last_seen, ended_at = row
        return SegmentRecord(run_id=int(run_id), index=int(index), started_at=started_at,
                             deadline_at=deadline_at, last_seen=last_seen, ended_at=ended_at)

    def beats(self, conn: sa.Connection, beats: list[tuple[int, float, float]]) -> None:
        """Many replicas' last heartbeats (id, time, lease end) at once: on PostgreSQL one
        statement of three arrays, where a statement per replica cost the store service
        (every few seconds, one per replica) as much as all the heartbeats' calls."""
        if not beats:
            return
        if self.sqlite:
            conn.execute(T_REPLICAS.update().where(T_REPLICAS.c.id == sa.bindparam("rid"))
                         .values(last_heartbeat=sa.bindparam("hb"),
                                 lease_until=sa.bindparam("lu")),
                         [{"rid": r, "hb": hb, "lu": lu} for r, hb, lu in beats])
            return
        # One type per array (psycopg refuses a list of ints and floats): a time may have
        # come as a whole number.
        conn.execute(_BEATS, {"rid": [int(r) for r, _, _ in beats],
                              "hb": [float(hb) for _, hb, _ in beats],
                              "lu": [float(lu) for _, _, lu in beats]})

    def end_replica(self, conn: sa.Connection, replica_id: int, status: str, now: float,
                    reason: str = "") -> int | None:
        """The change number of the end (None: the replica had ended already)."""
        run_id = sa.select(T_REPLICAS.c.run_id).where(T_REPLICAS.c.id == replica_id) \
            .scalar_subquery()
        changed = conn.execute(T_REPLICAS.update().where(
            (T_REPLICAS.c.id == replica_id) & (T_REPLICAS.c.status == RUNNING))
            .values(status=str(status), ended_at=now, reason=reason,
                    changed=self.next_change(T_REPLICAS, run_id))
            .returning(T_REPLICAS.c.changed)).scalar()
        return None if changed is None else int(changed)

    # trials ----------------------------------------------------------------------------------
    def claim_trial(self, conn: sa.Connection, claim: Claim,
                    retried: bool = False) -> tuple[int, int] | None:
        """(the trial's id, the change number of its claim); None: another replica has it."""
        c = claim
        row = conn.execute(self._insert(T_TRIALS).values(
            run_id=c.run_id, replica_index=c.replica_index, replica_id=c.replica_id,
            graph_hash=c.graph_hash, graph_json=c.graph_json, parent_id=c.parent_id,
            morphs=json.dumps(c.morphs), round=c.round, hparams=json.dumps(c.hparams),
            status=RUNNING, reason="", created_at=c.now, lease_until=c.now + c.lease_s,
            extra="{}", changed=self.next_change(T_TRIALS, c.run_id))
            .on_conflict_do_nothing(index_elements=["run_id", "graph_hash"])
            .returning(T_TRIALS.c.id, T_TRIALS.c.changed)).first()
        if row is None:
            # Taken: by another replica, or by this very claim, when an earlier try committed
            # but its answer was lost.
            row = conn.execute(sa.select(T_TRIALS.c.id, T_TRIALS.c.changed).where(
                (T_TRIALS.c.run_id == c.run_id) & (T_TRIALS.c.graph_hash == c.graph_hash)
                & (T_TRIALS.c.replica_id == c.replica_id) & (T_TRIALS.c.created_at == c.now)
                & (T_TRIALS.c.status == RUNNING))).first()
        return None if row is None else (int(row[0]), int(row[1]))

    def finish_trial(self, conn: sa.Connection, trial_id: int, status: str, now: float,
                     reason: str = "", best_accuracy: float | None = None,
                     predicted_accuracy: float | None = None,
                     weights_path: str | None = None,
                     extra: dict[str, Any] | None = None) -> tuple[bool, int | None]:
        """(whether the trial ended so, the change number of its end: None when it had
        ended before)."""
        if status not in TrialStatus.final():
            raise ValueError(f"a trial ends as one of {', '.join(TrialStatus.final())}, not "
                             f"{status!r}")
        run_id = sa.select(T_TRIALS.c.run_id).where(T_TRIALS.c.id == trial_id).scalar_subquery()
        changed = conn.execute(T_TRIALS.update().where(
            (T_TRIALS.c.id == trial_id) & (T_TRIALS.c.status == RUNNING)).values(
            status=str(status), reason=reason, finished_at=now, lease_until=None,
            best_accuracy=best_accuracy, predicted_accuracy=predicted_accuracy,
            weights_path=weights_path, extra=json.dumps(extra or {}),
            changed=self.next_change(T_TRIALS, run_id)).returning(T_TRIALS.c.changed)).scalar()
        if changed is not None:
            return True, int(changed)
        # Finished already: by this very call when an earlier try committed but its answer
        # was lost (the same end), or otherwise (a later attempt changes nothing).
        found = conn.execute(sa.select(T_TRIALS.c.status, T_TRIALS.c.finished_at,
                                       T_TRIALS.c.reason).where(T_TRIALS.c.id == trial_id)).first()
        return found is not None and tuple(found) == (str(status), now, reason), None

    def expire_leases(self, conn: sa.Connection, run_id: int, now: float,
                      stale: list[int] | None = None) -> list[tuple[int, int]]:
        """Fail the running trials whose lease has lapsed: the grace of their claim is over
        and their replica's heartbeat lease too (or, with ``stale``, the trials the caller
        judged so); (id, change number) of each. Their recorded epochs stay."""
        if stale is None:
            replica_lease = (sa.select(T_REPLICAS.c.lease_until)
                             .where(T_REPLICAS.c.id == T_TRIALS.c.replica_id).scalar_subquery())
            stale = list(conn.execute(sa.select(T_TRIALS.c.id).where(
                (T_TRIALS.c.run_id == run_id) & (T_TRIALS.c.status == RUNNING)
                & (T_TRIALS.c.lease_until < now)
                & (sa.func.coalesce(replica_lease, 0.0) < now))).scalars())
        expired = []
        for trial_id in stale:
            changed = conn.execute(T_TRIALS.update().where(
                (T_TRIALS.c.id == trial_id) & (T_TRIALS.c.status == RUNNING)).values(
                status=TrialStatus.FAILED.value, finished_at=now, lease_until=None,
                reason=LEASE_EXPIRED, changed=self.next_change(T_TRIALS, run_id))
                .returning(T_TRIALS.c.changed)).scalar()
            if changed is not None:
                expired.append((int(trial_id), int(changed)))
        return expired

    # epochs, samples, nodes -----------------------------------------------------------------
    def record_epoch(self, conn: sa.Connection, epoch: EpochRecord) -> None:
        (_, error), = self.record_epochs(conn, [epoch], False)
        if error is not None:
            raise error

    def record_epochs(self, conn: sa.Connection, epochs: list[EpochRecord],
                      retried: bool = False) -> list[tuple[None, StoreError | None]]:
        """Each record inserted, in one statement; (None, error) of each: a record already
        there is its own answer when it is the same (an earlier try committed but its answer
        was lost: recorded once, as asked) and refused when it differs."""
        first: dict[tuple[int, int], EpochRecord] = {}
        for e in epochs:
            first.setdefault((e.trial_id, e.epoch), e)
        if self.sqlite:
            found = conn.execute(
                self._insert(T_EPOCHS).on_conflict_do_nothing(index_elements=["trial_id", "epoch"])
                .returning(T_EPOCHS.c.trial_id, T_EPOCHS.c.epoch),
                [e.__dict__ for e in first.values()])
        else:
            found = conn.execute(_EPOCHS_INSERT, {
                name: [convert(getattr(e, name)) for e in first.values()]
                for name, convert in _EPOCH_COLUMNS})
        inserted = {tuple(row) for row in found}
        return [(None, None if (e.trial_id, e.epoch) in inserted
                 and first[(e.trial_id, e.epoch)] is e else self._rewrite(conn, e))
                for e in epochs]

    def _rewrite(self, conn: sa.Connection, epoch: EpochRecord) -> StoreError | None:
        """Why ``epoch``, whose trial and epoch are already recorded, is refused; None when
        it is what is recorded."""
        row = conn.execute(sa.select(*(T_EPOCHS.c[name] for name in EPOCH_FIELDS)).where(
            (T_EPOCHS.c.trial_id == epoch.trial_id) & (T_EPOCHS.c.epoch == epoch.epoch))).first()
        if row is None or tuple(row) != tuple(getattr(epoch, name) for name in EPOCH_FIELDS):
            return StoreError(f"epoch {epoch.epoch} of trial {epoch.trial_id} is already "
                              "recorded; records are never rewritten")
        return None

    def add_samples(self, conn: sa.Connection, run_id: int, node: str,
                    samples: list[dict[str, Any]], retried: bool = False) -> None:
        self.add_samples_of(conn, [(run_id, node, samples)], retried)

    def add_samples_of(self, conn: sa.Connection,
                       nodes: list[tuple[int, str, list[dict[str, Any]]]],
                       retried: bool = False) -> list[tuple[None, None]]:
        """The samples of each (run, node, samples), in one statement."""
        rows = []
        for run_id, node, samples in nodes:
            if retried and samples:
                # Those an earlier try stored, when its answer was lost: each sample once.
                have = set(conn.execute(sa.select(T_SAMPLES.c.t).where(
                    (T_SAMPLES.c.run_id == run_id) & (T_SAMPLES.c.node == node)
                    & T_SAMPLES.c.t.in_([s["t"] for s in samples]))).scalars())
                samples = [s for s in samples if s["t"] not in have]
            for s in samples:
                numbers, uuids, cpu_energy = sample_figures(s)
                figures = packed(numbers)
                rows.append({"run_id": run_id, "node": node, "t": s["t"], "data": json.dumps(s),
                             "figures": figures, "figure_keys": None if figures is None
                             else json.dumps([uuids, cpu_energy])})
        if rows:
            conn.execute(T_SAMPLES.insert(), rows)
        return [(None, None)] * len(nodes)

    def record_node(self, conn: sa.Connection, run_id: int, replica_index: int, segment: int,
                    host: str, description: dict[str, Any], now: float,
                    retried: bool = False) -> None:
        if retried and conn.execute(sa.select(T_NODES.c.id).where(
                (T_NODES.c.run_id == run_id) & (T_NODES.c.replica_index == replica_index)
                & (T_NODES.c.segment == segment) & (T_NODES.c.recorded_at == now))).first():
            return
        conn.execute(T_NODES.insert().values(
            run_id=run_id, replica_index=replica_index, segment=segment, host=host,
            recorded_at=now, data=json.dumps(description)))


def _array_insert(table: sa.Table, names: list[str], conflict: str, returning: str
                  ) -> tuple[sa.TextClause, list[tuple[str, Callable[[Any], Any]]]]:
    """An INSERT of many rows given as one array per column (PostgreSQL's ``unnest``): its text
    never changes, so psycopg parses it and PostgreSQL plans it once, where a row of
    placeholders per record made a new statement of each group commit (at 5,000 replicas,
    the store service spent an eighth of its time parsing them); and each column's converter
    to its array's type."""
    dialect = postgresql.dialect()
    quote = dialect.identifier_preparer.quote
    kinds = {float: (sa.Float,), int: (sa.Integer, sa.BigInteger), bool: (sa.Boolean,)}
    columns: list[tuple[str, Callable[[Any], Any]]] = []
    for name in names:
        kind = type(table.c[name].type)
        py = next((t for t, sql in kinds.items() if issubclass(kind, sql)), str)
        columns.append((name, functools.partial(_typed, py)))
    arrays = ", ".join(f"CAST(:{n} AS {table.c[n].type.compile(dialect=dialect)}[])"
                       for n in names)
    text = (f"INSERT INTO {table.name} ({', '.join(quote(n) for n in names)}) SELECT * FROM "
            f"unnest({arrays}) ON CONFLICT ({conflict}) DO NOTHING RETURNING {returning}")
    return sa.text(text), columns


def _typed(py: Callable[[Any], Any], value: Any) -> Any:
    # A float column's 100 arrives from JSON as an int: one array holds one type.
    return value if value is None else py(value)


_EPOCHS_INSERT, _EPOCH_COLUMNS = _array_insert(
    T_EPOCHS, [f.name for f in dataclasses.fields(EpochRecord)], "trial_id, epoch",
    "trial_id, epoch")

_BEATS = sa.text(
    f"UPDATE {T_REPLICAS.name} AS r SET last_heartbeat = v.hb, lease_until = v.lu "
    "FROM unnest(CAST(:rid AS integer[]), CAST(:hb AS double precision[]), "
    "CAST(:lu AS double precision[])) AS v(rid, hb, lu) WHERE r.id = v.rid")


def new_id(result: Any) -> int:
    """The id the database gave the row just inserted."""
    key = result.inserted_primary_key
    if key is None:
        raise StoreError("the database returned no id for a new row")
    return int(key[0])
