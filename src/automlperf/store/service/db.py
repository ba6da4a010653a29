"""The store service's side of the database (store/service/server.py): its connections, and the
writer thread that commits the calls waiting for it in one transaction (group commit),
answering each in commit order once committed."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from automlperf.store import connections
from automlperf.store.base import StoreError
from automlperf.store.retry import one_line, retried, retrying
from automlperf.store.sql import SQLStore

log = logging.getLogger("automlperf.store.service")

# The database connections the service holds: the writer's, and its readers'.
CONNECTIONS = connections.SERVICE
READERS = CONNECTIONS - 1
# The most calls one transaction commits.
MAX_BATCH = 2_000


class ServiceStore(SQLStore):
    """The database side of the service: a pool as large as its threads."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        if not self.sqlite:
            self.engine.dispose()
            self.engine = sa.create_engine(self.url, pool_size=CONNECTIONS, max_overflow=0,
                                           pool_timeout=600,
                                           connect_args={"connect_timeout": 10})
            self.reader = self.engine.execution_options(isolation_level="AUTOCOMMIT")

    @retrying
    def commit(self, ops: list[Callable[[sa.Connection, bool], Any]]) -> list[tuple[Any, Any]]:
        """Run ``ops`` in one transaction (each given the connection and whether this is a
        second try); (result, error) of each. An op's own refusal (StoreError, ValueError)
        is its answer and leaves the others be."""
        again = retried()
        out: list[tuple[Any, Any]] = []
        with self.engine.begin() as conn:
            for op in ops:
                try:
                    out.append((op(conn, again), None))
                except (StoreError, ValueError) as exc:
                    out.append((None, exc))
                except DBAPIError:
                    raise
                except Exception as exc:  # noqa: BLE001 - see Broken
                    raise Broken(exc) from exc
        return out

    @retrying
    def read(self, fn: Callable[..., Any], **arguments: Any) -> Any:
        with self.reader.connect() as conn:
            return fn(conn, **arguments)

    @retrying
    def flush(self, beats: list[tuple[int, float, float]],
              touches: list[tuple[int, int, float]]) -> None:
        with self.engine.begin() as conn:
            if not self.sqlite:
                # A heartbeat lost in a crash costs nothing: do not wait for the disk.
                conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
            self.writes.beats(conn, beats)
            for run_id, index, last_seen in touches:
                self.writes.touch_segment(conn, run_id=run_id, index=index, now=last_seen)


class Broken(Exception):
    """A call that failed in a way of its own (a wrong argument's type, a bug) rather than
    being refused: its transaction is rolled back, as whatever it wrote may be half done,
    and the failure is its answer alone."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class Bulk:
    """A write that one statement carries for every call of its kind in a group commit (an
    epoch record, a node's samples): ``run`` takes the connection, each call's ``item`` and
    whether this is a second try, and gives each call's (value, error)."""

    run: Callable[[sa.Connection, list[Any], bool], list[tuple[Any, Any]]]
    item: Any


@dataclass
class Job:
    op: Callable[[sa.Connection, bool], Any]
    retried: bool
    done: Callable[[Any, BaseException | None], None]
    # Committed with the other calls of its kind, when it is not a client's second try;
    # ``op`` alone when a group's transaction breaks.
    bulk: Bulk | None = None


class Writer(threading.Thread):
    """Commits the calls waiting for it in one transaction, answers each in commit order (on
    the event loop, which applies them to memory first)."""

    def __init__(self, db: ServiceStore, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(name="store-writer", daemon=True)
        self.db = db
        self.loop = loop
        self.queue: list[Job] = []
        self.ready = threading.Condition()
        self.stopping = False
        self.commits = 0
        self.committed = 0
        self.failed: BaseException | None = None
        # Called on the event loop when the writer has died: the service stops.
        self.on_failure: Callable[[], None] = lambda: None

    def submit(self, job: Job) -> None:
        with self.ready:
            self.queue.append(job)
            self.ready.notify()

    def run(self) -> None:
        try:
            self._serve()
        except BaseException as exc:
            # Every later write would wait for ever on a writer that is gone: the service
            # says why and stops, and the primary starts it again (as after a kill -9).
            log.critical("the store service's writer failed (%s: %s); stopping the service",
                         type(exc).__name__, exc, exc_info=True)
            self.failed = exc
            self.loop.call_soon_threadsafe(self.on_failure)

    def _serve(self) -> None:
        while True:
            with self.ready:
                while not self.queue and not self.stopping:
                    self.ready.wait()
                if not self.queue:
                    return
                batch, self.queue = self.queue[:MAX_BATCH], self.queue[MAX_BATCH:]
            answers = self._commit(batch)
            self.loop.call_soon_threadsafe(_answer, batch, answers)

    def _commit(self, batch: list[Job]) -> list[tuple[Any, Any]]:
        ops, places = _grouped(batch)
        try:
            answers = _spread(self.db.commit(ops), places, len(batch))
            self.commits += 1
            self.committed += len(batch)
            return answers
        except StoreError as exc:
            return [(None, exc)] * len(batch)  # the database stayed out past the retries
        except (DBAPIError, Broken):
            pass
        # One call broke the transaction (not an outage): each in a transaction of its own.
        out: list[tuple[Any, Any]] = []
        for op in (_with_retried(j) for j in batch):
            try:
                out += self.db.commit([op])
            except Broken as exc:
                out.append((None, exc.error))
            except (StoreError, DBAPIError) as exc:
                out.append((None, StoreError(one_line(getattr(exc, "orig", exc)))))
        return out

    def stop(self) -> None:
        with self.ready:
            self.stopping = True
            self.ready.notify()


def _with_retried(job: Job) -> Callable[[sa.Connection, bool], Any]:
    return lambda conn, again: job.op(conn, again or job.retried)


def _grouped(batch: list[Job]) -> tuple[list[Callable[[sa.Connection, bool], Any]],
                                          list[int | list[int]]]:
    """The transaction's ops, and the jobs each answers: a job alone, or (at the place of the
    first) every job of one bulk kind, which one statement writes: at 5,000 replicas the
    writer spent most of its time on one statement per epoch record."""
    ops: list[Callable[[sa.Connection, bool], Any] | None] = []
    places: list[int | list[int]] = []
    kinds: dict[Any, int] = {}  # a bulk kind's ``run``: its op's place
    for i, job in enumerate(batch):
        if job.bulk is None or job.retried:
            ops.append(_with_retried(job))
            places.append(i)
        elif job.bulk.run in kinds:
            cast(list, places[kinds[job.bulk.run]]).append(i)
        else:
            kinds[job.bulk.run] = len(ops)
            ops.append(None)
            places.append([i])
    for run, k in kinds.items():
        items = [cast(Bulk, batch[i].bulk).item for i in cast(list, places[k])]
        ops[k] = functools.partial(_each, run, items)
    return cast(list, ops), places


def _each(run: Callable[[sa.Connection, list[Any], bool], list[tuple[Any, Any]]],
          items: list[Any], conn: sa.Connection, again: bool) -> list[tuple[Any, Any]]:
    return run(conn, items, again)


def _spread(answers: list[tuple[Any, Any]], places: list[int | list[int]],
            n: int) -> list[tuple[Any, Any]]:
    """Each job's (value, error) from the transaction's, a bulk op's answering each member."""
    out: list[tuple[Any, Any]] = [(None, None)] * n
    for (value, error), place in zip(answers, places):
        if isinstance(place, int):
            out[place] = (value, error)
        elif error is not None:
            for i in place:
                out[i] = (None, error)
        else:
            for i, answer in zip(place, value):
                out[i] = answer
    return out


def _answer(batch: list[Job], answers: list[tuple[Any, Any]]) -> None:
    for job, (value, error) in zip(batch, answers):
        job.done(value, error)
