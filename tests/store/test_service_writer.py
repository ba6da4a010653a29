"""The store service's writer thread (store/service/db.py) on a real SQLite store: a call
that fails in a way of its own is its answer alone, and a writer that dies anyway says so
and stops the service rather than leaving every later write waiting."""

import asyncio
import threading

import sqlalchemy as sa

from automlperf.store import open_store, schema
from automlperf.store.service.db import Job, ServiceStore, Writer


def run_jobs(store, ops):
    """Submit ``ops`` as one batch to a writer on a fresh event loop: (answers, failure)."""
    loop = asyncio.new_event_loop()
    writer = Writer(store, loop)
    stopped = threading.Event()
    writer.on_failure = stopped.set
    answers = {}

    def done(i):
        return lambda value, error: answers.__setitem__(i, (value, error))

    with writer.ready:  # one batch: queued before the writer looks
        writer.queue = [Job(op, False, done(i)) for i, op in enumerate(ops)]
    writer.start()
    writer.stop()
    writer.join(timeout=120)
    loop.run_until_complete(asyncio.sleep(0))  # the answers the writer handed the loop
    loop.close()
    return answers, writer.failed, stopped.is_set()


def service_store(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    open_store(url, create=True).close()
    return ServiceStore(url)


def insert_run(name):
    def op(conn, again):
        return conn.execute(schema.T_RUNS.insert().values(
            name=name, config="{}", system="{}", duration_s=1.0, created_at=1.0)
            .returning(schema.T_RUNS.c.id)).scalar()
    return op


def test_a_call_that_breaks_is_its_own_answer_and_leaves_nothing_half_written(tmp_path):
    store = service_store(tmp_path)

    def half_then_broken(conn, again):
        insert_run("half")(conn, again)
        raise TypeError("a float was expected, not 'soon'")

    answers, failed, stopped = run_jobs(store, [insert_run("a"), half_then_broken,
                                                insert_run("b")])
    assert failed is None and not stopped
    assert answers[0][1] is None and answers[2][1] is None
    assert isinstance(answers[1][1], TypeError) and "soon" in str(answers[1][1])
    with store.engine.connect() as conn:
        names = set(conn.execute(sa.select(schema.T_RUNS.c.name)).scalars())
    assert names == {"a", "b"}  # the broken call's half is rolled back


def test_a_writer_that_dies_stops_the_service(tmp_path):
    store = service_store(tmp_path)

    class Fatal(BaseException):
        pass

    def fatal(conn, again):
        raise Fatal("the writer's thread is gone")

    answers, failed, stopped = run_jobs(store, [fatal])
    assert isinstance(failed, Fatal) and stopped
