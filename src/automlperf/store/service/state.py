"""What the store service keeps in memory of each run it serves: segments, replicas with
their last heartbeats, and every trial's summary with its change number, so that heartbeats,
leases, history reads, tallies and the primary's watch cost no database work. Loaded from
the database when a run is first asked for (after a restart too), and updated after each
commit, in commit order, by the service's one event loop thread."""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

import sqlalchemy as sa

from automlperf.events import TrialStatus
from automlperf.store.base import (BACKOFF_MAX_S, Claim, ReplicaRecord, SegmentRecord, TrialChange,
                                   TrialSummary, TrialTally)
from automlperf.store.reads import replica_from_row
from automlperf.store.reads import segments as read_segments
from automlperf.store.schema import T_REPLICAS, T_TRIALS
from automlperf.store.service import wire

RUNNING = TrialStatus.RUNNING.value


@dataclass(kw_only=True)
class Trial:
    """A trial as the service keeps it (no graph)."""

    id: int
    replica_id: int | None
    replica_index: int
    graph_hash: str
    status: str
    best_accuracy: float | None
    predicted_accuracy: float | None
    lease_until: float | None  # the claim's grace
    created_at: float
    claimed: int  # change number of its claim (0: not known, loaded from the database)
    changed: int

    def change(self, omit_hash: bool) -> TrialChange:
        return TrialChange(id=self.id, graph_hash="" if omit_hash else self.graph_hash,
                           status=self.status, replica_index=self.replica_index,
                           best_accuracy=self.best_accuracy,
                           predicted_accuracy=self.predicted_accuracy, changed=self.changed)

    def encoded(self) -> tuple[str, str]:
        """The trial's change as a history read sends it (store/service/wire.py pack), with its hash
        and without: encoded once, sent to every reader."""
        full = json.dumps(wire.pack(self.change(False)), separators=(",", ":"))
        return full, json.dumps(wire.pack(self.change(True)), separators=(",", ":"))


@dataclass(kw_only=True)
class Replica:
    record: ReplicaRecord
    lease_until: float
    changed: int


@dataclass(kw_only=True)
class Loaded:
    """A run's rows as read from the database (in a reader thread)."""

    segments: list[SegmentRecord]
    replicas: list[tuple[ReplicaRecord, float, int]]
    trials: list[Trial]


def load_run(conn: sa.Connection, run_id: int) -> Loaded:
    r = T_REPLICAS
    reps = []
    for row in conn.execute(sa.select(r).where(r.c.run_id == run_id).order_by(r.c.id)).mappings():
        reps.append((replica_from_row(row), row["lease_until"] or row["last_heartbeat"],
                     int(row["changed"] or 0)))
    t = T_TRIALS
    trials = [Trial(id=int(row.id), replica_id=row.replica_id,
                    replica_index=int(row.replica_index), graph_hash=row.graph_hash,
                    status=row.status, best_accuracy=row.best_accuracy,
                    predicted_accuracy=row.predicted_accuracy, lease_until=row.lease_until,
                    created_at=row.created_at, claimed=0, changed=int(row.changed or 0))
              for row in conn.execute(
                  sa.select(t.c.id, t.c.replica_id, t.c.replica_index, t.c.graph_hash,
                            t.c.status, t.c.best_accuracy, t.c.predicted_accuracy,
                            t.c.lease_until, t.c.created_at, t.c.changed)
                  .where(t.c.run_id == run_id).order_by(t.c.changed))]
    return Loaded(segments=read_segments(conn, run_id), replicas=reps, trials=trials)


class RunState:
    def __init__(self, run_id: int, loaded: Loaded) -> None:
        self.run_id = run_id
        self.segments = {s.index: s for s in loaded.segments}
        self.replicas: dict[int, Replica] = {}
        self.replica_log: list[tuple[int, int]] = []  # (change number, replica id)
        for rec, lease, changed in sorted(loaded.replicas, key=lambda x: x[2]):
            self.replicas[rec.id] = Replica(record=rec, lease_until=lease, changed=changed)
            self.replica_log.append((changed, rec.id))
        self.trials: dict[int, Trial] = {}
        self.rows: dict[int, tuple[str, str]] = {}  # trial -> Trial.encoded()
        self.by_hash: dict[str, int] = {}
        self.trial_log: list[tuple[int, int]] = []  # (change number, trial id)
        self.running: dict[int, set[int]] = {}  # replica id -> its running trials
        self.running_at: dict[int, set[int]] = {}  # replica index -> its running trials
        self.tally: dict[tuple[int, str], list[int]] = {}  # -> [count, newest id]
        for trial in loaded.trials:
            self._put(trial)
        self.dirty_beats: set[int] = set()
        self.dirty_segments: set[int] = set()

    # --- trials -------------------------------------------------------------------------------
    def _put(self, trial: Trial) -> None:
        old = self.trials.get(trial.id)
        if old is not None:
            self.tally[(old.replica_index, old.status)][0] -= 1
            if old.status == RUNNING:
                self.running.get(old.replica_id or 0, set()).discard(old.id)
                self.running_at.get(old.replica_index, set()).discard(old.id)
        self.trials[trial.id] = trial
        self.rows[trial.id] = trial.encoded()
        self.by_hash[trial.graph_hash] = trial.id
        self.trial_log.append((trial.changed, trial.id))
        counted = self.tally.setdefault((trial.replica_index, trial.status), [0, 0])
        counted[0] += 1
        counted[1] = max(counted[1], trial.id)
        if trial.status == RUNNING:
            self.running.setdefault(trial.replica_id or 0, set()).add(trial.id)
            self.running_at.setdefault(trial.replica_index, set()).add(trial.id)

    def claimed(self, trial: Trial) -> None:
        if trial.id not in self.trials:
            self._put(trial)

    def ended(self, trial_id: int, changed: int, status: str, best: float | None,
              predicted: float | None) -> None:
        old = self.trials.get(trial_id)
        if old is not None and old.changed < changed:
            self._put(replace(old, status=status, best_accuracy=best,
                              predicted_accuracy=predicted, lease_until=None, changed=changed))

    def changes(self, after: int, also: Sequence[int]) -> list[TrialChange]:
        """The trials whose last change is numbered above ``after`` or in ``also``. A trial
        the reader saw claimed (its claim numbered up to ``after``) comes without its hash."""
        asked = set(also)  # looked up once per trial: a list would cost trials x its length
        start = bisect.bisect_right(self.trial_log, (after, float("inf")))
        wanted = [i for _, i in self.trial_log[start:]]
        if asked:
            wanted += [t.id for t in self.trials.values() if t.changed in asked]
        out, seen = [], set()
        for trial_id in wanted:
            trial = self.trials[trial_id]
            if trial_id in seen or (trial.changed <= after and trial.changed not in asked):
                continue  # an older entry of the log; its latest follows
            seen.add(trial_id)
            out.append(trial.change(omit_hash=0 < trial.claimed <= after))
        out.sort(key=lambda c: c.changed)
        return out

    def changed_since(self, after: int) -> int:
        """How many changes are numbered above ``after`` (an upper bound on the trials)."""
        return len(self.trial_log) - bisect.bisect_right(self.trial_log, (after, float("inf")))

    def changes_text(self, after: int) -> str:
        """:meth:`changes` (without ``also``) as the JSON list a history read sends, put
        together from the rows encoded when the trials changed."""
        start = bisect.bisect_right(self.trial_log, (after, float("inf")))
        out, seen = [], set()
        for changed, trial_id in self.trial_log[start:]:
            trial = self.trials[trial_id]
            if trial.changed != changed or trial_id in seen:
                continue  # an older entry of the log; its latest follows
            seen.add(trial_id)
            out.append(self.rows[trial_id][1 if 0 < trial.claimed <= after else 0])
        return "[" + ",".join(out) + "]"

    def summaries(self) -> list[TrialSummary]:
        return [TrialSummary(id=t.id, graph_hash=t.graph_hash, status=t.status,
                             replica_index=t.replica_index, best_accuracy=t.best_accuracy,
                             predicted_accuracy=t.predicted_accuracy)
                for t in sorted(self.trials.values(), key=lambda t: t.id)]

    def tallies(self) -> list[TrialTally]:
        out = []
        for (replica_index, status), (count, last) in self.tally.items():
            if count:
                if status == RUNNING:
                    last = max(self.running_at.get(replica_index, ()), default=last)
                out.append(TrialTally(replica_index=replica_index, status=status, count=count,
                                      last_id=last))
        return out

    # --- replicas and leases ------------------------------------------------------------------
    def registered(self, record: ReplicaRecord, changed: int) -> None:
        if record.id not in self.replicas:
            self.replicas[record.id] = Replica(record=record, lease_until=record.last_heartbeat,
                                               changed=changed)
            self.replica_log.append((changed, record.id))

    def replica_ended(self, replica_id: int, changed: int, status: str, reason: str) -> None:
        rep = self.replicas.get(replica_id)
        if rep is not None and rep.changed < changed:
            rep.record = replace(rep.record, status=status, reason=reason)
            rep.changed = changed
            self.replica_log.append((changed, replica_id))

    def beat(self, replica_id: int, now: float, lease_s: float) -> SegmentRecord | None:
        rep = self.replicas[replica_id]
        rep.record.last_heartbeat = now
        rep.lease_until = now + lease_s
        self.dirty_beats.add(replica_id)
        return self.segments.get(rep.record.segment)

    def replica_changes(self, after: int,
                        also: Sequence[int]) -> list[tuple[int, ReplicaRecord]]:
        asked = set(also)
        start = bisect.bisect_right(self.replica_log, (after, float("inf")))
        ids = [i for _, i in self.replica_log[start:]]
        if asked:
            ids += [i for i, r in self.replicas.items() if r.changed in asked]
        out: dict[int, tuple[int, ReplicaRecord]] = {}
        for rid in ids:
            rep = self.replicas[rid]
            if rep.changed > after or rep.changed in asked:
                out[rid] = (rep.changed, replace(rep.record))
        return sorted(out.values(), key=lambda x: x[0])

    def silent(self, before: float) -> list[int]:
        return [rid for rid, r in self.replicas.items()
                if r.record.status == RUNNING and r.record.last_heartbeat < before]

    def stale(self, now: float, restored_at: float) -> list[int]:
        """The running trials whose lease has lapsed: their claim's grace is over and their
        replica silent for its lease, counted from when it could reach the service again
        after an outage."""
        out = []
        for rid, trials in self.running.items():
            if not trials:
                continue
            rep = self.replicas.get(rid)
            if rep is not None:
                lease = rep.lease_until
                if restored_at:
                    lease = max(lease, restored_at + BACKOFF_MAX_S
                                + (rep.lease_until - rep.record.last_heartbeat))
                if lease >= now:
                    continue
            out += [t for t in trials if (self.trials[t].lease_until or 0.0) < now]
        return sorted(out)

    def beats(self) -> list[tuple[int, float, float]]:
        """The heartbeats not yet written, taken."""
        out = [(rid, self.replicas[rid].record.last_heartbeat, self.replicas[rid].lease_until)
               for rid in self.dirty_beats]
        self.dirty_beats.clear()
        return out

    def touches(self) -> list[tuple[int, float]]:
        out = [(i, self.segments[i].last_seen) for i in self.dirty_segments
               if self.segments[i].ended_at is None]
        self.dirty_segments.clear()
        return out


def replica_record(*, run_id: int, rid: int, index: int, segment: int, host: str, pid: int,
                   devices: list[str], now: float) -> ReplicaRecord:
    """The replica a registration made, numbered ``rid``."""
    return ReplicaRecord(id=rid, run_id=run_id, index=index, segment=segment, host=host, pid=pid,
                         devices=list(devices), started_at=now, last_heartbeat=now,
                         status=RUNNING, reason="")


def trial_of(claim: Claim, tid: int, changed: int) -> Trial:
    """The trial ``claim`` made, numbered ``tid``, claimed at change ``changed``."""
    return Trial(id=tid, replica_id=claim.replica_id, replica_index=claim.replica_index,
                 graph_hash=claim.graph_hash, status=RUNNING, best_accuracy=None,
                 predicted_accuracy=None, lease_until=claim.now + claim.lease_s,
                 created_at=claim.now, claimed=changed, changed=changed)
