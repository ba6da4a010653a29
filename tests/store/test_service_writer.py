"""The store service's writer thread (store/service/db.py) on a real SQLite store: a call
that fails in a way of its own is its answer alone, and a writer that dies anyway says so
and stops the service rather than leaving every later write waiting."""

import asyncio
import threading

import sqlalchemy as sa

from automlperf.store import StoreError, open_store, schema
from automlperf.store.service.db import Bulk, Job, ServiceStore, Writer
from helpers import epoch_of, one_trial


def run_jobs(store, ops):
    """Submit ``ops`` (each an op, or a Job's (op, retried, bulk)) as one batch to a writer
    on a fresh event loop: (answers, failure)."""
    loop = asyncio.new_event_loop()
    writer = Writer(store, loop)
    stopped = threading.Event()
    writer.on_failure = stopped.set
    answers = {}

    def done(i):
        return lambda value, error: answers.__setitem__(i, (value, error))

    with writer.ready:  # one batch: queued before the writer looks
        writer.queue = [Job(*op[:2], done(i), op[2]) if isinstance(op, tuple)
                        else Job(op, False, done(i)) for i, op in enumerate(ops)]
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


def test_epochs_and_samples_of_many_calls_are_written_by_one_statement_each_kind(store_url):
    """A group commit's epoch records and samples go in one statement per kind: each call
    still gets its own answer (a record already there is accepted when it is the same and
    refused when it differs, also within the group), a client's second try goes alone, and
    each is written once."""
    open_store(store_url, create=True).close()
    store = ServiceStore(store_url)
    direct = open_store(store_url)
    run_id, t = one_trial(direct)
    direct.record_epoch(epoch_of(run_id, t, 0))
    statements = []
    sa.event.listen(store.engine, "before_cursor_execute",
                    lambda conn, cursor, sql, *rest: statements.append(sql))
    w = store.writes

    def epoch_job(e, retried=False):
        return (lambda conn, _r: w.record_epoch(conn, e), retried, Bulk(w.record_epochs, e))

    def samples_job(node, ts, retried=False):
        samples = [{"t": x, "cpu_percent": 50.0, "mem_used_gib": 1.0} for x in ts]
        return (lambda conn, again: w.add_samples(conn, run_id, node, samples, retried=again),
                retried, Bulk(w.add_samples_of, (run_id, node, samples)))

    changed = epoch_of(run_id, t, 5, ops=7)
    answers, failed, _ = run_jobs(store, [
        epoch_job(epoch_of(run_id, t, 0)),  # recorded before, the same: accepted
        epoch_job(epoch_of(run_id, t, 1)), samples_job("a", [1.0, 2.0]),
        epoch_job(epoch_of(run_id, t, 2)), samples_job("b", [1.0]),
        epoch_job(epoch_of(run_id, t, 1)),  # the same, twice in the group: accepted
        epoch_job(epoch_of(run_id, t, 0, ops=3)),  # recorded, different: refused
        epoch_job(epoch_of(run_id, t, 5)), epoch_job(changed),  # differ within the group
        epoch_job(epoch_of(run_id, t, 3), retried=True), samples_job("a", [2.0, 3.0], True)])
    assert failed is None
    errors = {i: e for i, (_, e) in answers.items() if e is not None}
    assert set(errors) == {6, 8} and all(isinstance(e, StoreError) for e in errors.values())
    assert "already recorded" in str(errors[6])
    inserts = [s for s in statements if s.lstrip().upper().startswith("INSERT")]
    # One statement for the group's epochs, one for its samples, one each for the two
    # second tries (the retried samples' node "a" is checked first).
    assert len(inserts) == 4, inserts
    epochs = {(e.epoch, e.ops) for e in direct.epochs(run_id)}
    assert epochs == {(0, 10**15), (1, 10**15), (2, 10**15), (3, 10**15), (5, 10**15)}
    assert sorted((s["node"], s["t"]) for s in direct.samples(run_id)) == [
        ("a", 1.0), ("a", 2.0), ("a", 3.0), ("b", 1.0)]
    direct.close()
    store.close()


def test_the_heartbeats_flush_writes_each_replicas_last_beat_and_no_other(store_url):
    open_store(store_url, create=True).close()
    store = ServiceStore(store_url)
    direct = open_store(store_url)
    run_id = direct.create_run("r", {}, {}, 60.0, 1.0)
    seg = direct.start_segment(run_id, 1.0, 100.0)
    ids = [direct.register_replica(run_id, i, seg, "n", 1, [], 1.0) for i in range(5)]
    t = schema.T_REPLICAS

    def beats():
        with store.engine.connect() as conn:
            return {r.id: (r.last_heartbeat, r.lease_until) for r in conn.execute(
                sa.select(t.c.id, t.c.last_heartbeat, t.c.lease_until))}

    before = beats()
    store.flush([(ids[0], 20.5, 80.5), (ids[3], 21.25, 81.25)], [])
    after = beats()
    assert after[ids[0]] == (20.5, 80.5) and after[ids[3]] == (21.25, 81.25)
    assert all(after[i] == before[i] for i in (ids[1], ids[2], ids[4]))
    direct.close()
    store.close()
