"""The store service: one process per run that owns the database connections (a few, however
many replicas run) and serves the store's calls to every replica and to the primary over TCP
(store/service/wire.py; the client is store/service/client.py).

* Writes are committed in groups: whatever calls are waiting when the writer thread is free
  go in one transaction, and each caller is answered once it has committed, so an answer
  still means "on disk" and nothing acknowledged is lost if the service dies.
* Heartbeats, leases, the history's change log, tallies and the replicas' states are kept in
  memory (store/service/state.py) and answered without the database; heartbeats and the
  session's ``last_seen`` are written in bulk every ``net.FLUSH_S`` (asynchronous
  commit: losing the last few costs nothing, the service's restart grants a full lease of
  grace).
* Graphs are kept in a bounded cache; other reads go to the database in reader threads.

Its database side (connections, the group commit) is store/service/db.py; its network side
(listening, greeting clients, the heartbeats' flush) store/service/net.py. The primary starts
its process (store/service/process.py, store/service/__main__.py) and restarts it if it dies;
it writes where it listens, with a token only the run's user can read, to a file in the run
directory that the clients read."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from automlperf.store import reads, schema
from automlperf.store.base import (SCHEMA_VERSION, Changes, Claim, EpochRecord, ReplicaRecord,
                                   SchemaMismatch, SegmentRecord, StoreError, TrialChange,
                                   TrialSummary, TrialTally)
from automlperf.store.retry import one_line
from automlperf.store.service import wire
from automlperf.store.service.calls import CALLS, PRIMARY_ONLY
from automlperf.store.service.db import READERS, Bulk, Job, ServiceStore, Writer
from automlperf.store.service.latency import CallTimes
from automlperf.store.service.state import RunState, load_run, replica_record, trial_of
from automlperf.store.urls import redact

log = logging.getLogger("automlperf.store.service")

# Graphs kept in memory (a ResNet-50 descendant's is ~10 KB of JSON).
GRAPH_CACHE_BYTES = 256 << 20
# A history read far behind is sent the run's whole history (see op_changes), encoded at
# most every SNAPSHOT_S, when it is behind by over 2 * SNAPSHOT_MIN changes.
SNAPSHOT_S = 10.0
SNAPSHOT_MIN = 64


class Service:
    def __init__(self, url: str, token: str, restarted: bool = False,
                 primary_token: str | None = None) -> None:
        self.db = ServiceStore(url)
        # The writes, taking a call's arguments as they came over the wire.
        self.writes: Any = self.db.writes
        self.url = self.db.url
        self.token = token
        # What the primary proves besides the run's token, for the calls only it makes
        # (store/service/calls.py PRIMARY_ONLY); None: no connection is the primary's.
        self.primary_token = primary_token
        self.runs: dict[int, RunState] = {}
        self._loading: dict[int, asyncio.Future[RunState]] = {}
        self.replica_run: dict[int, int] = {}
        self.trial_run: dict[int, int] = {}
        # Everything up to this change number is in memory: what a history read vouches for.
        self.through = 0
        # When the service last came back (0: never away): its start after it died, or the
        # end of a stall or of the database's outage. Leases count from then.
        self.restored_at = time.time() if restarted else 0.0
        self.graph_cache: OrderedDict[int, str] = OrderedDict()
        # run -> (through, the answer's frame, when encoded, trials, came_back)
        self.snapshots: dict[int, tuple[int, bytes, float, int, float]] = {}
        self.graph_bytes = 0
        self.readers = ThreadPoolExecutor(READERS, thread_name_prefix="store-reader")
        self.clients: set[asyncio.StreamWriter] = set()
        self.serving: set[asyncio.Task[None]] = set()  # each connection's (kept: the loop does not)
        self.writer: Writer  # the group commit's thread, started by net.serve
        # Why a task the service cannot go on without (net.watched: the ticker) stopped.
        self.task_failed: BaseException | None = None
        self.calls = 0
        self.times = CallTimes()
        # Where the calls' times are written (net.write_times); None: nowhere.
        self.times_file: Path | None = None
        self.started_at = time.time()
        # The calls the service answers itself (from memory, or writing in bulk); the others
        # go to the database as they are (``by_database``).
        self.ops: dict[str, Callable[..., Awaitable[Any]]] = {
            name[3:]: getattr(self, name) for name in dir(self) if name.startswith("op_")}

    @property
    def came_back(self) -> float:
        """When the service, or its database, last came back from an outage (0: never)."""
        return max(self.restored_at, self.db.restored_at)

    # --- plumbing --------------------------------------------------------------------------
    async def read(self, fn: Callable[..., Any], **arguments: Any) -> Any:
        """A database read (``fn(conn, **arguments)``) in a reader thread, retried through
        outages."""
        return await asyncio.get_running_loop().run_in_executor(
            self.readers, lambda: self.db.read(fn, **arguments))

    async def write(self, op: Callable[[sa.Connection, bool], Any], again: bool,
                    apply: Callable[[Any], Any] | None = None, bulk: Bulk | None = None) -> Any:
        """Commit ``op`` with whatever else is waiting (as ``bulk``, with the others of its
        kind, where it has one); ``apply`` its result to memory (in commit order) before the
        caller is answered."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()

        def done(value: Any, error: BaseException | None) -> None:
            if error is None and apply is not None:
                try:
                    value = apply(value)
                except Exception as exc:  # noqa: BLE001 - a bug here must not stall the loop
                    log.exception("applying a write to memory failed")
                    error = exc
            if not answer.done():
                if error is not None:
                    answer.set_exception(error)
                else:
                    answer.set_result(value)

        self.writer.submit(Job(op, again, done, bulk))
        return await answer

    async def run_state(self, run_id: int) -> RunState:
        state = self.runs.get(run_id)
        if state is not None:
            return state
        loading = self._loading.get(run_id)
        if loading is None:
            loading = self._loading[run_id] = asyncio.get_running_loop().create_future()
            try:
                loaded = await self.read(load_run, run_id=run_id)
                state = RunState(run_id, loaded)
                self.runs[run_id] = state
                for rid in state.replicas:
                    self.replica_run[rid] = run_id
                for tid in state.trials:
                    self.trial_run[tid] = run_id
                loading.set_result(state)
            except BaseException as exc:
                loading.set_exception(exc)
                del self._loading[run_id]
                raise
        return await asyncio.shield(loading)

    async def run_of(self, table: sa.Table, row_id: int, known: dict[int, int]) -> RunState:
        run_id = known.get(row_id)
        if run_id is None:
            run_id = await self.read(lambda conn: conn.execute(
                sa.select(table.c.run_id).where(table.c.id == row_id)).scalar())
            if run_id is None:
                raise StoreError(f"{table.name[4:-1]} {row_id} is not in store {redact(self.url)}")
        return await self.run_state(int(run_id))

    def changed_through(self, number: int | None) -> None:
        """Everything up to change ``number`` is in memory (and what a history read vouches
        for, ``through``)."""
        if number is not None:
            self.through = max(self.through, number)

    def _keep_graph(self, trial_id: int, graph_json: str) -> None:
        if trial_id in self.graph_cache:
            self.graph_cache.move_to_end(trial_id)
            return
        self.graph_cache[trial_id] = graph_json
        self.graph_bytes += len(graph_json)
        while self.graph_bytes > GRAPH_CACHE_BYTES and self.graph_cache:
            self.graph_bytes -= len(self.graph_cache.popitem(last=False)[1])

    async def flush(self) -> None:
        """Write the heartbeats and session touches not yet written; those of a flush that
        failed are written by the next."""
        beats, touches = [], []
        for state in self.runs.values():
            beats += state.beats()
            touches += [(state.run_id, i, t) for i, t in state.touches()]
        if not beats and not touches:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(
                self.readers, self.db.flush, beats, touches)
        except BaseException:
            for rid, _, _ in beats:
                run = self.runs.get(self.replica_run.get(rid, -1))
                if run is not None:
                    run.dirty_beats.add(rid)
            for run_id, index, _ in touches:
                self.runs[run_id].dirty_segments.add(index)
            raise

    # --- runs and segments ------------------------------------------------------------------
    async def op_open(self, *, again: bool) -> int:
        """What a client's open checks: the schema, with the database's one query."""
        await self.read(lambda _conn: schema.open_check(self.db.engine, self.url, False))
        return SCHEMA_VERSION

    async def op_start_segment(self, *, run_id: int, now: float, deadline_at: float,
                               again: bool) -> int:
        state = await self.run_state(run_id)

        def apply(index: int) -> int:
            state.segments[index] = SegmentRecord(run_id=run_id, index=index, started_at=now,
                                                  deadline_at=deadline_at, last_seen=now,
                                                  ended_at=None)
            return index

        return await self.write(lambda conn, again_: self.db.writes.start_segment(
            conn, run_id=run_id, now=now, deadline_at=deadline_at, retried=again_), again, apply)

    async def op_touch_segment(self, *, run_id: int, index: int, now: float, again: bool) -> None:
        state = await self.run_state(run_id)
        seg = state.segments.get(index)
        if seg is not None and seg.ended_at is None:
            seg.last_seen = now
            state.dirty_segments.add(index)

    async def op_end_segment(self, *, run_id: int, index: int, ended_at: float,
                             again: bool) -> None:
        state = await self.run_state(run_id)

        def apply(_: Any) -> None:
            seg = state.segments.get(index)
            if seg is not None and seg.ended_at is None:
                seg.ended_at = seg.last_seen = ended_at
            state.dirty_segments.discard(index)

        await self.write(lambda conn, _r: self.db.writes.end_segment(
            conn, run_id=run_id, index=index, ended_at=ended_at), again, apply)

    async def op_segments(self, *, run_id: int, again: bool) -> list[SegmentRecord]:
        state = await self.run_state(run_id)
        return [s for _, s in sorted(state.segments.items())]

    # --- replicas ---------------------------------------------------------------------------
    async def op_register_replica(self, *, run_id: int, index: int, segment: int, host: str,
                                  pid: int, devices: list[str], now: float, again: bool) -> int:
        state = await self.run_state(run_id)

        def apply(found: tuple[int, int]) -> int:
            rid, changed = found
            state.registered(replica_record(run_id=run_id, rid=rid, index=index, segment=segment,
                                            host=host, pid=pid, devices=devices, now=now),
                             changed)
            self.replica_run[rid] = run_id
            self.changed_through(changed)
            return rid

        return await self.write(lambda conn, again_: self.db.writes.register_replica(
            conn, run_id=run_id, index=index, segment=segment, host=host, pid=pid,
            devices=devices, now=now, retried=again_), again, apply)

    async def op_heartbeat(self, *, replica_id: int, now: float, lease_s: float,
                           again: bool) -> SegmentRecord | None:
        state = await self.run_of(schema.T_REPLICAS, replica_id, self.replica_run)
        return state.beat(replica_id, now, lease_s)

    async def op_end_replica(self, *, replica_id: int, status: str, now: float, reason: str,
                             again: bool) -> None:
        state = await self.run_of(schema.T_REPLICAS, replica_id, self.replica_run)

        def apply(changed: int | None) -> None:
            if changed is not None:
                state.replica_ended(replica_id, changed, status, reason)
                self.changed_through(changed)

        await self.write(lambda conn, _r: self.db.writes.end_replica(
            conn, replica_id=replica_id, status=status, now=now, reason=reason), again, apply)

    async def op_replicas(self, *, run_id: int, again: bool) -> list[ReplicaRecord]:
        state = await self.run_state(run_id)
        return [r.record for _, r in sorted(state.replicas.items())]

    async def op_replica_changes(self, *, run_id: int, after: int, also: list[int],
                                 again: bool) -> Changes[tuple[int, ReplicaRecord]]:
        state = await self.run_state(run_id)
        return Changes(rows=state.replica_changes(after, also), through=self.through)

    async def op_silent_replicas(self, *, run_id: int, before: float, again: bool) -> list[int]:
        state = await self.run_state(run_id)
        return state.silent(before)

    # --- trials -----------------------------------------------------------------------------
    async def op_claim_trial(self, *, claim: Claim, again: bool) -> int | None:
        state = await self.run_state(claim.run_id)
        taken = state.by_hash.get(claim.graph_hash)
        if taken is not None:
            # Known here: another replica's, or this very claim's when its answer was lost.
            t = state.trials[taken]
            mine = (t.replica_id == claim.replica_id and t.created_at == claim.now
                    and t.status == "running")
            return taken if mine else None

        def apply(found: tuple[int, int] | None) -> int | None:
            if found is None:
                return None
            tid, changed = found
            state.claimed(trial_of(claim, tid, changed))
            self.trial_run[tid] = claim.run_id
            self._keep_graph(tid, claim.graph_json)
            self.changed_through(changed)
            return tid

        return await self.write(lambda conn, again_: self.db.writes.claim_trial(
            conn, claim=claim, retried=again_), again, apply)

    async def op_finish_trial(self, *, trial_id: int, status: str, now: float, reason: str,
                              best_accuracy: float | None, predicted_accuracy: float | None,
                              weights_path: str | None, extra: dict[str, Any] | None,
                              again: bool) -> bool:
        state = await self.run_of(schema.T_TRIALS, trial_id, self.trial_run)

        def apply(found: tuple[bool, int | None]) -> bool:
            ok, changed = found
            if changed is not None:
                state.ended(trial_id, changed, status, best_accuracy, predicted_accuracy)
                self.changed_through(changed)
            return ok

        return await self.write(lambda conn, _r: self.db.writes.finish_trial(
            conn, trial_id=trial_id, status=status, now=now, reason=reason,
            best_accuracy=best_accuracy, predicted_accuracy=predicted_accuracy,
            weights_path=weights_path, extra=extra), again, apply)

    async def op_expire_leases(self, *, run_id: int, now: float, again: bool) -> list[int]:
        state = await self.run_state(run_id)
        stale = state.stale(now, self.came_back)
        if not stale:
            return []

        def apply(expired: list[tuple[int, int]]) -> list[int]:
            for tid, changed in expired:
                state.ended(tid, changed, "failed", None, None)
                self.changed_through(changed)
            return [tid for tid, _ in expired]

        return await self.write(lambda conn, _r: self.db.writes.expire_leases(
            conn, run_id=run_id, now=now, stale=stale), again, apply)

    async def op_tally(self, *, run_id: int, again: bool) -> list[TrialTally]:
        return (await self.run_state(run_id)).tallies()

    async def op_summaries(self, *, run_id: int, again: bool) -> list[TrialSummary]:
        return (await self.run_state(run_id)).summaries()

    async def op_changes(self, *, run_id: int, after: int, also: list[int],
                         again: bool) -> Changes[TrialChange] | wire.Encoded | bytes:
        state = await self.run_state(run_id)
        if also:
            return Changes(rows=state.changes(after, also), through=self.through)
        # A reader far behind (its first read, or a node's read a trial later at 10,000
        # replicas) is sent the run's whole history as it stood a few seconds ago, encoded
        # once for all of them, when that is smaller than what changed since its last read.
        behind = state.changed_since(after)
        if behind > 2 * SNAPSHOT_MIN:
            snap = self.snapshots.get(run_id)
            if snap is None or snap[4] != self.came_back or (
                    time.monotonic() - snap[2] > SNAPSHOT_S and snap[0] < self.through):
                text = wire.Encoded(f"[{state.changes_text(0)},{self.through}]")
                snap = self.snapshots[run_id] = (
                    self.through, wire.answer(text, self.came_back), time.monotonic(),
                    len(state.trials), self.came_back)
            if snap[0] > after and behind > snap[3] / 2:
                return snap[1]  # the answer's frame itself
        return wire.Encoded(f"[{state.changes_text(after)},{self.through}]")

    async def op_graphs(self, *, trial_ids: list[int], again: bool) -> dict[int, str]:
        out = {i: self.graph_cache[i] for i in trial_ids if i in self.graph_cache}
        missing = [i for i in trial_ids if i not in out]
        if missing:
            fetched = await self.read(reads.graphs, ids=missing)
            for i, g in fetched.items():
                self._keep_graph(i, g)
            out.update(fetched)
        return out

    # --- epochs, samples --------------------------------------------------------------------
    async def op_record_epoch(self, *, epoch: EpochRecord, again: bool) -> None:
        await self.write(lambda conn, _r: self.db.writes.record_epoch(conn, epoch=epoch), again,
                         bulk=Bulk(self.db.writes.record_epochs, epoch))

    async def op_add_samples(self, *, run_id: int, node: str, samples: list[dict[str, Any]],
                             again: bool) -> None:
        await self.write(lambda conn, again_: self.db.writes.add_samples(
            conn, run_id=run_id, node=node, samples=samples, retried=again_), again,
            bulk=Bulk(self.db.writes.add_samples_of, (run_id, node, samples)))

    # --- the other calls: the database's own ---------------------------------------------------
    async def by_database(self, name: str, arguments: dict[str, Any], again: bool) -> Any:
        """A call the service has no handler for (it keeps nothing of it in memory): a write
        of store/writes.py's committed with the others (its value the call's), or a read of
        the database store's own (store/sql.py) in a reader thread."""
        write = getattr(self.db.writes, name, None)
        if write is not None:
            return await self.write(lambda conn, again_: write(conn, **arguments, retried=again_),
                                    again)
        read = getattr(self.db, name)
        return await asyncio.get_running_loop().run_in_executor(
            self.readers, functools.partial(read, **arguments))

    # --- a call ------------------------------------------------------------------------
    async def handle(self, message: dict[str, Any], role: str = "replica") -> bytes:
        """The answer's frame to a call from a connection of ``role`` (``primary``: it proved
        the primary's token); the time it took is counted under the call's name (a name this
        service does not have counts as "other")."""
        started = time.perf_counter()
        answer = await self._answer(message, role)
        kind = message.get("op") if isinstance(message, dict) else None
        self.times.add(kind if isinstance(kind, str) and kind in CALLS else "other",
                       time.perf_counter() - started)
        return answer

    async def _answer(self, message: dict[str, Any], role: str) -> bytes:
        self.calls += 1
        if not isinstance(message, dict) or not isinstance(message.get("a", {}), dict):
            return wire.encode({"e": "protocol", "m": "a call is {\"op\": name, \"a\": "
                                "{parameter: argument}}: use the automlperf that started the run"})
        name = message.get("op")
        call = CALLS.get(name) if isinstance(name, str) else None
        if call is None:
            return wire.encode({"e": "protocol",
                                "m": f"no call {wire.shown(name, 100)!r} in this store service"})
        if call.name in PRIMARY_ONLY and role != "primary":
            return wire.encode({"e": "protocol", "m": f"{call.name} is the primary's call, and "
                                "this connection did not prove the primary's token"})
        again = bool(message.get("r"))
        try:
            arguments = call.arguments(message.get("a", {}))
            handler = self.ops.get(call.name)
            if handler is not None:
                value = await handler(**arguments, again=again)
            else:
                value = await self.by_database(call.name, arguments, again)
        except SchemaMismatch as exc:
            return wire.encode({"e": "schema", "m": str(exc)})
        except StoreError as exc:
            return wire.encode({"e": "store", "m": str(exc)})
        except (ValueError, TypeError) as exc:
            return wire.encode({"e": "value", "m": str(exc)})
        except DBAPIError as exc:
            return wire.encode({"e": "store",
                                "m": f"store {redact(self.url)}: {one_line(exc.orig)}"})
        except Exception as exc:  # noqa: BLE001 - a bug answers its caller, the rest go on
            log.exception("call %s failed", call.name)
            return wire.encode({"e": "store", "m": f"the store service failed: "
                                f"{type(exc).__name__}: {exc}"})
        if isinstance(value, bytes):
            return value  # an answer encoded before, for several callers
        if call.encode_value is not None and not isinstance(value, wire.Encoded):
            value = call.encode_value(value)
        return wire.answer(value, self.came_back)
