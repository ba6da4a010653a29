"""The store contract, run against every backend (SQLite and a real PostgreSQL server)."""

import contextlib
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import sqlalchemy as sa

from automlperf.store import (SCHEMA_VERSION, Claim, SchemaMismatch, StoreError, open_store, redact,
                              resolve_store_url)
from automlperf.store.feed import EpochFeed
from automlperf.store.schema import T_EPOCHS
from automlperf.store.urls import normalise_url
from helpers import epoch_of as epoch
from helpers import new_claim, one_trial


class ServedStore(str):
    """The URL of a store service (``store-service://FILE``), of its database, and the
    primary's token (the calls only the primary makes)."""

    database: str
    primary_token: str


@pytest.fixture
def service_url(pg_url, tmp_path):
    """A store service, as the primary starts it, on a database of its own."""
    from automlperf.store.service.process import ServiceProcess

    open_store(pg_url, create=True).close()  # the primary makes the store first
    service = ServiceProcess(tmp_path / "served", pg_url)
    service.start()
    url = ServedStore(f"store-service://{service.file}")
    url.database = pg_url
    url.primary_token = service.primary_token
    yield url
    service.stop()


@pytest.fixture(params=["sqlite", "postgresql", pytest.param("service", marks=pytest.mark.postgres)])
def store_url(request, tmp_path):
    """One URL per store backend, and the store service before PostgreSQL: every test using
    it runs against each."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    return request.getfixturevalue("pg_url" if request.param == "postgresql" else "service_url")


def database(store_url):
    """An engine on the database behind a store URL."""
    return sa.create_engine(getattr(store_url, "database", store_url))


@pytest.fixture
def store(store_url):
    """The store at ``store_url``, as the run's primary opens it."""
    if isinstance(store_url, ServedStore):
        from automlperf.store.service.client import RemoteStore

        s = RemoteStore(store_url.removeprefix("store-service://"),
                        primary_token=store_url.primary_token)
    else:
        s = open_store(store_url, create=True)
    yield s
    s.close()


@pytest.fixture
def run(store):
    run_id = store.create_run("r", {"train": {"max_epochs": 4}}, {"host": "h"}, 600.0, 1000.0)
    seg = store.start_segment(run_id, 1000.0, 1600.0)
    rep = store.register_replica(run_id, 0, seg, "node1", 42, ["cuda:0"], 1000.0)
    return run_id, seg, rep


class TestStoreContract:
    def test_runs_round_trip_and_schema_is_checked_on_open(self, store, store_url, run):
        run_id, _, _ = run
        got = store.run(run_id)
        assert got["config"] == {"train": {"max_epochs": 4}} and got["duration_s"] == 600.0
        again = open_store(store_url)  # a worker opens without creating
        assert again.run(run_id)["name"] == "r"
        with database(store_url).begin() as conn:
            conn.execute(sa.text("UPDATE amp_meta SET value = '99' WHERE key = 'schema_version'"))
        with pytest.raises(SchemaMismatch,
                           match=f"schema version 99; this automlperf reads version {SCHEMA_VERSION}"):
            open_store(store_url)
        with pytest.raises(StoreError, match="run 999 is not in store"):
            store.run(999)

    def test_segments(self, store, run):
        run_id, seg, _ = run
        store.touch_segment(run_id, seg, 1100.0)
        store.end_segment(run_id, seg, 1200.0)
        store.touch_segment(run_id, seg, 1300.0)  # an ended segment stays ended
        second = store.start_segment(run_id, 2000.0, 2400.0)
        segs = store.segments(run_id)
        assert [s.index for s in segs] == [0, second] == [0, 1]
        assert segs[0].end == 1200.0 and segs[1].ended_at is None and segs[1].end == 2000.0

    def test_each_architecture_is_claimed_once(self, store, run):
        run_id, seg, rep = run
        other = store.register_replica(run_id, 1, seg, "node2", 43, ["cuda:0"], 1000.0)
        first = store.claim_trial(new_claim(run_id=run_id, replica_id=rep, replica_index=0,
                                            graph_hash="h1", hparams={"batch_size": 64}, now=1000.0))
        assert first is not None
        assert store.claim_trial(new_claim(run_id=run_id, replica_id=other, replica_index=1,
                                           graph_hash="h1", now=1001.0)) is None
        second = store.claim_trial(Claim(run_id=run_id, replica_id=other, replica_index=1, graph_hash="h2",
                                         graph_json='{"g": 1}', parent_id=first, morphs=[{"op": "deepen"}],
                                         round=1, hparams={"batch_size": 32}, now=1002.0, lease_s=60.0))
        rows = store.trials(run_id)
        assert [t.id for t in rows] == [first, second]
        assert rows[1].parent_id == first and rows[1].morphs == [{"op": "deepen"}]
        assert rows[1].hparams == {"batch_size": 32} and rows[1].replica_index == 1
        assert [t.id for t in store.trials(run_id, after_id=first)] == [second]
        light = store.summaries(run_id)
        assert [(t.id, t.graph_hash, t.status, t.replica_index) for t in light] == [
            (first, "h1", "running", 0), (second, "h2", "running", 1)]
        other_run = store.create_run("r2", {}, {}, 60.0, 1000.0)
        assert store.claim_trial(new_claim(run_id=other_run, replica_id=rep, replica_index=0, graph_hash="h1"))

    def test_a_trial_finishes_once(self, store, run):
        run_id, _, rep = run
        t = store.claim_trial(new_claim(run_id=run_id, replica_id=rep, replica_index=0, graph_hash="h", now=1000.0))
        assert store.finish_trial(t, "completed", 1100.0, best_accuracy=0.7,
                                  predicted_accuracy=0.8, weights_path="w", extra={"k": 1})
        assert not store.finish_trial(t, "failed", 1200.0, reason="late")
        rec = store.trial(t)
        assert (rec.status, rec.best_accuracy, rec.finished_at, rec.reason) == ("completed", 0.7, 1100.0, "")
        assert rec.search_accuracy == 0.8 and rec.extra == {"k": 1}
        with pytest.raises(ValueError):
            store.finish_trial(t, "running", 1.0)

    def test_epochs_are_insert_only(self, store, run):
        run_id, _, rep = run
        t = store.claim_trial(new_claim(run_id=run_id, replica_id=rep, replica_index=0, graph_hash="h", now=1000.0))
        for n in (1, 0):
            store.record_epoch(epoch(run_id, t, n))
        with pytest.raises(StoreError, match="epoch 1 of trial .* is already recorded"):
            store.record_epoch(epoch(run_id, t, 1, ended=999.0))
        eps = store.epochs(run_id)
        assert [e.epoch for e in eps] == [0, 1] and eps[1] == epoch(run_id, t, 1)
        assert eps[0].ops == 10**15 and isinstance(eps[0].ops, int)
        rec = store.trial(t)
        assert rec.epochs_done == 2 and rec.best_accuracy == pytest.approx(0.51)  # so far

    def test_new_epochs_are_read_once_in_order(self, store, run):
        run_id, seg, rep = run
        other = store.register_replica(run_id, 1, seg, "node2", 43, [], 1000.0)
        a = store.claim_trial(new_claim(run_id=run_id, replica_id=rep, replica_index=0, graph_hash="a", now=1000.0))
        b = store.claim_trial(new_claim(run_id=run_id, replica_id=other, replica_index=1, graph_hash="b", now=1000.0))
        elsewhere = store.create_run("r2", {}, {}, 60.0, 1000.0)
        c = store.claim_trial(new_claim(run_id=elsewhere, replica_id=rep, replica_index=0, graph_hash="a", now=1000.0))
        feed = EpochFeed(store, run_id)
        assert feed.read() == []
        for n in range(3):  # another run's epochs in between
            store.record_epoch(epoch(run_id, a, n))
            store.record_epoch(epoch(elsewhere, c, n))
        store.record_epoch(epoch(run_id, b, 0))
        got = feed.read()
        assert [(r, e.trial_id, e.epoch) for r, e in got] == [(0, a, 0), (0, a, 1), (0, a, 2),
                                                             (1, b, 0)]
        assert got[0][1] == epoch(run_id, a, 0) and isinstance(got[0][1].ops, int)
        assert feed.read() == []
        store.record_epoch(epoch(run_id, b, 1))
        assert [(r, e.trial_id, e.epoch) for r, e in feed.read()] == [(1, b, 1)]
        assert feed.read() == [] and feed.missing == {}
        store.finish_trial(a, "completed", 1100.0)
        assert {(t.replica_index, t.status): (t.count, t.last_id) for t in store.tally(run_id)} \
            == {(0, "completed"): (1, a), (1, "running"): (1, b)}

    def test_leases_expire_when_heartbeats_stop(self, store, run):
        run_id, seg, rep = run
        silent = store.register_replica(run_id, 1, seg, "node2", 43, [], 1000.0)
        alive_t = store.claim_trial(new_claim(run_id=run_id, replica_id=rep, replica_index=0, graph_hash="a",
                                              now=1000.0, lease_s=30.0))
        dead_t = store.claim_trial(new_claim(run_id=run_id, replica_id=silent, replica_index=1, graph_hash="b",
                                             now=1000.0, lease_s=30.0))
        store.record_epoch(epoch(run_id, dead_t, 0))
        store.heartbeat(rep, 1025.0, 30.0)
        assert store.expire_leases(run_id, 1040.0) == [dead_t]
        assert store.expire_leases(run_id, 1040.0) == []
        dead = store.trial(dead_t)
        assert dead.status == "failed" and "heart-beating" in dead.reason
        assert dead.epochs_done == 1  # what it finished still counts
        assert store.trial(alive_t).status == "running"
        assert not store.finish_trial(dead_t, "completed", 1050.0)
        reps = {r.id: r for r in store.replicas(run_id)}
        assert reps[rep].last_heartbeat == 1025.0
        store.end_replica(silent, "failed", 1050.0)
        assert {r.id: r.status for r in store.replicas(run_id)}[silent] == "failed"

    def test_monitor_samples(self, store, run):
        run_id, _, _ = run
        store.add_samples(run_id, "node1", [{"t": 2.0, "cpu": 50}, {"t": 1.0, "cpu": 40}])
        store.add_samples(run_id, "node2", [])
        assert [(s["t"], s["node"]) for s in store.samples(run_id)] == [(1.0, "node1"), (2.0, "node1")]

    def test_node_descriptions(self, store, run):
        run_id, seg, _ = run
        assert store.nodes(run_id) == []
        store.record_node(run_id, 1, seg, "node2", {"ceiling_ops": 2.0, "devices": ["cuda:0"]},
                          1002.0)
        store.record_node(run_id, 0, seg, "node1", {"ceiling_ops": 1.0, "devices": ["cpu"]},
                          1001.0)
        nodes = store.nodes(run_id)
        assert [(n["host"], n["replica_index"], n["segment"], n["ceiling_ops"]) for n in nodes] \
            == [("node1", 0, seg, 1.0), ("node2", 1, seg, 2.0)]

    def test_eight_processes_writing_at_once_lose_nothing(self, store, store_url, run):
        run_id, seg, _ = run
        script = textwrap.dedent(f"""
            import sys
            from automlperf.store import Claim, EpochRecord, open_store
            w = int(sys.argv[1])
            s = open_store({store_url!r})
            rep = s.register_replica({run_id}, w, {seg}, "n", w, [], 1.0)
            for i in range(15):
                claim = dict(run_id={run_id}, replica_id=rep, replica_index=w, graph_json="{{}}", parent_id=None,
                             morphs=[], round=i, hparams={{}}, now=1.0, lease_s=60.0)
                t = s.claim_trial(Claim(graph_hash=f"w{{w}}-{{i}}", **claim))
                s.claim_trial(Claim(graph_hash="shared", **claim))
                for e in range(3):
                    s.record_epoch(EpochRecord(
                        trial_id=t, epoch=e, started_at=1.0, ended_at=2.0 + e, train_images=10,
                        val_images=5, steps=1, ops=7 * w + e, train_loss=0.1, val_accuracy=0.2,
                        precision="fp32", batch_size=8, world_size=1, data_share=0.0,
                        images_per_s=1.0, run_id={run_id}))
                s.finish_trial(t, "completed", 3.0, best_accuracy=0.2)
                s.heartbeat(rep, 3.0, 60.0)
        """)
        procs = [subprocess.Popen([sys.executable, "-c", script, str(w)], stderr=subprocess.PIPE,
                                  text=True) for w in range(8)]
        for p in procs:
            assert p.wait(timeout=180) == 0, p.stderr.read()
        trials = store.trials(run_id)
        assert len(trials) == 8 * 15 + 1  # plus exactly one "shared"
        assert sum(t.graph_hash == "shared" for t in trials) == 1
        eps = store.epochs(run_id)
        assert len(eps) == 8 * 15 * 3
        assert sum(e.ops for e in eps) == sum(15 * (3 * 7 * w + 3) for w in range(8))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_reads_of_more_ids_than_a_statement_takes_are_asked_in_parts(backend, tmp_path, request):
    """70,000 ids or change numbers (PostgreSQL takes 65,535 parameters in a statement, SQLite
    32,766): read in statements of a bounded size, not refused, and not taken for an outage
    to wait out."""
    url = f"sqlite:///{tmp_path / 'h.db'}" if backend == "sqlite" else \
        request.getfixturevalue("pg_url")
    store = open_store(url, create=True)
    store.retry_s = 5.0  # a refused statement fails the test at once, not after an outage's wait
    if backend == "sqlite":
        # SQLite's own limit since 3.32: a build may raise it (Debian's takes 250,000), which
        # would let one IN list of all 70,001 pass here and fail on another machine.
        sa.event.listen(store.engine, "connect", lambda dbapi, _: dbapi.setlimit(
            sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 32_766))
    try:
        run_id, trial = one_trial(store)
        store.record_epoch(epoch(run_id, trial, 0))
        many = list(range(70_000)) + [trial]
        assert store.graphs(many) == {trial: store.trial(trial).graph_json}
        changed = store.changes(run_id, 0).rows[0].changed
        assert [c.id for c in store.changes(run_id, 10**9, many + [changed]).rows] == [trial]
        seq = store.epochs_after(run_id, 0)[0][0]
        assert [n for n, _, _ in store.epochs_after(run_id, 10**9, many + [seq])] == [seq]
        replica_changed = store.replica_changes(run_id, 0).rows[0][0]
        assert len(store.replica_changes(run_id, 10**9, many + [replica_changed]).rows) == 1
    finally:
        store.close()


def test_a_statement_of_too_many_parameters_is_not_waited_out_as_an_outage():
    from sqlalchemy.exc import OperationalError

    from automlperf.store.retry import _transient

    too_many = Exception("number of parameters must be between 0 and 65535")
    assert not _transient(OperationalError("SELECT ...", {}, too_many))
    assert not _transient(OperationalError("SELECT ...", {}, Exception("too many SQL variables")))
    assert _transient(OperationalError("SELECT ...", {}, Exception("server closed the connection")))


def test_an_unreachable_postgres_server_is_retried(pg_server, pg_url):
    s = open_store(pg_url, create=True)
    run_id = s.create_run("r", {}, {}, 60.0, 1.0)
    pg_server._run("pg_ctl", "-D", str(pg_server.data), "-m", "fast", "-w", "stop")
    restart = threading.Timer(2.0, pg_server.start)
    restart.start()
    t0 = time.monotonic()
    assert s.run(run_id)["name"] == "r"  # waits out the outage
    assert time.monotonic() - t0 >= 1.5
    restart.join()
    s.retry_s = 1.0
    pg_server._run("pg_ctl", "-D", str(pg_server.data), "-m", "fast", "-w", "stop")
    try:
        with pytest.raises(StoreError, match=r"unreachable for 1 s"):
            s.run(run_id)
    finally:
        pg_server.start()
    assert "***" in str(redact(pg_url)) and pg_server.password not in redact(pg_url)


@contextlib.contextmanager
def committed_late(pg_url, record):
    """Inserts ``record`` in a transaction of another connection, which takes its number at
    once and commits when the block ends."""
    other = sa.create_engine(pg_url)
    try:
        with other.connect() as slow:
            with slow.begin():
                slow.execute(T_EPOCHS.insert().values(**record.__dict__))
                yield
    finally:
        other.dispose()


def test_an_epoch_committed_late_is_still_read(pg_url):
    """An epoch whose transaction took its number first but commits after a later one's is
    read when it commits, once."""
    s = open_store(pg_url, create=True)
    run_id, t = one_trial(s)
    feed = EpochFeed(s, run_id)
    s.record_epoch(epoch(run_id, t, 0))
    assert len(feed.read()) == 1
    with committed_late(pg_url, epoch(run_id, t, 1)):  # takes number 2
        s.record_epoch(epoch(run_id, t, 2))  # number 3, committed first
        assert [e.epoch for _, e in feed.read()] == [2]
    assert [e.epoch for _, e in feed.read()] == [1]
    assert feed.read() == [] and feed.missing == {}


def test_an_epoch_committed_late_before_the_first_read_is_still_read(pg_url):
    """Replicas finishing their first epochs together: number 1 commits after number 2, and
    the feed's first read sees only number 2."""
    s = open_store(pg_url, create=True)
    earlier, t0 = one_trial(s, "earlier")  # numbers below the feed's start
    s.record_epoch(epoch(earlier, t0, 0))
    run_id, t = one_trial(s, "r", "h2")
    feed = EpochFeed(s, run_id)
    with committed_late(pg_url, epoch(run_id, t, 0)):
        s.record_epoch(epoch(run_id, t, 1))
        assert [e.epoch for _, e in feed.read()] == [1]
    assert [e.epoch for _, e in feed.read()] == [0]
    assert feed.read() == [] and feed.missing == {}
    s.close()


def test_the_numbers_asked_for_again_are_bounded(tmp_path, monkeypatch):
    """Another run interleaved for hours leaves many skipped numbers: the feed asks again
    for the most recent ones only, so its statement never outgrows the driver's limit."""
    import automlperf.store.feed as feed_module
    s = open_store(f"sqlite:///{tmp_path / 'store.db'}", create=True)
    run_id = s.create_run("r", {}, {}, 60.0, 1.0)
    feed = EpochFeed(s, run_id)
    asked = []
    real = s.epochs_after
    monkeypatch.setattr(s, "epochs_after", lambda r, after, also=(): asked.append(list(also))
                        or real(r, after, also))
    monkeypatch.setattr(feed_module, "MAX_MISSING", 5)
    feed.missing = dict.fromkeys(range(1, 20), 0.0)
    feed.clock = lambda: 1.0
    feed.read()
    assert asked == [[15, 16, 17, 18, 19]]
    s.close()


def test_a_locked_sqlite_database_is_waited_for(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    s = open_store(url, create=True)
    run_id = s.create_run("r", {}, {}, 60.0, 1.0)
    blocker = sa.create_engine(url).connect()
    blocker.exec_driver_sql("BEGIN EXCLUSIVE")
    threading.Timer(1.0, lambda: (blocker.exec_driver_sql("COMMIT"), blocker.close())).start()
    assert s.start_segment(run_id, 1.0, 2.0) == 0


def test_a_sqlite_store_keeps_its_connections_and_shares_them_between_threads(tmp_path):
    """Calls after the first open no file (each open set its pragmas again: most of a call's
    CPU); threads writing at once each get a connection, and every write lands."""
    s = open_store(None, run_dir=tmp_path, create=True)
    opened = []
    sa.event.listen(s.engine, "connect", lambda *_: opened.append(1))
    run_id = s.create_run("r", {}, {}, 60.0, 1.0)
    seg = s.start_segment(run_id, 1.0, 61.0)
    rep = s.register_replica(run_id, 0, seg, "n", 1, ["cpu"], 1.0)
    for k in range(20):
        t = s.claim_trial(new_claim(run_id=run_id, replica_id=rep, replica_index=0,
                                    graph_hash=f"h{k}"))
        s.record_epoch(epoch(run_id, t, 0))
        s.heartbeat(rep, 2.0, 60.0)
    assert len(opened) <= 1 and len(s.trials(run_id)) == 20
    start = threading.Barrier(8)

    def claims(w):
        start.wait()
        for k in range(10):
            s.claim_trial(new_claim(run_id=run_id, replica_id=rep, replica_index=0,
                                    graph_hash=f"w{w}-{k}"))

    threads = [threading.Thread(target=claims, args=(w,)) for w in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    trials = s.trials(run_id)
    assert len(trials) == 100 and len({t.graph_hash for t in trials}) == 100
    s.close()


def test_a_directory_without_a_store_is_refused(tmp_path):
    with pytest.raises(StoreError, match="holds no automlperf run"):
        open_store(run_dir=tmp_path)


def test_urls(monkeypatch, tmp_path):
    assert normalise_url("postgresql://u:p@h/db") == "postgresql+psycopg://u:p@h/db"
    assert normalise_url("history.db").startswith("sqlite:////")
    assert redact("connect postgresql+psycopg://u:pa55@h:5/db now") == "connect postgresql+psycopg://u:***@h:5/db now"
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"
    monkeypatch.setenv("AUTOMLPERF_STORE_URL", "postgresql://alice@db:5432/amp")
    (tmp_path / "pw").write_text("s e/cret\n")
    monkeypatch.setenv("AUTOMLPERF_STORE_PASSWORD_FILE", str(tmp_path / "pw"))
    assert resolve_store_url(None) == "postgresql://alice:s%20e%2Fcret@db:5432/amp"
    monkeypatch.setenv("AUTOMLPERF_STORE_PASSWORD", "x")
    assert resolve_store_url("postgresql://bob:given@db/amp") == "postgresql://bob:given@db/amp"


def test_a_store_being_created_is_never_seen_half_made(tmp_path):
    """A reader polls the file while it is created: it may find nothing or an empty file,
    never a schema half made. The watcher says when it is polling, and stops once it has
    opened the finished store (or after a guard of two minutes)."""
    path = tmp_path / "h.db"
    watcher = textwrap.dedent(f"""
        import os, time
        from automlperf.store import SchemaMismatch, StoreError, open_store
        seen = set()
        print("polling", flush=True)
        end = time.monotonic() + 120
        while "ok" not in seen and time.monotonic() < end:
            if os.path.exists({str(path)!r}):
                try:
                    open_store("sqlite:///{path}").close(); seen.add("ok")
                except SchemaMismatch:
                    seen.add("half-made")
                except StoreError:
                    seen.add("empty")
        print(sorted(seen))
    """)
    proc = subprocess.Popen([sys.executable, "-c", watcher], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "polling"
    open_store(f"sqlite:///{path}", create=True).create_run("r", {}, {}, 1.0, 1.0)
    seen = proc.communicate(timeout=300)[0]
    assert "half-made" not in seen and "ok" in seen


def test_replicas_are_not_given_the_databases_password(monkeypatch, tmp_path):
    """Replicas of a run on PostgreSQL reach it through the run's store service: the URL's
    scheme is all they need, and neither the password nor where to read it is passed on (by
    the local launcher's processes, or the SLURM step's environment)."""
    import json

    from automlperf.runner import launch
    from automlperf.store.urls import replica_env

    given = {"AUTOMLPERF_STORE_PASSWORD": "s3cret", "AUTOMLPERF_STORE_PASSWORD_FILE": "/pw",
             "HOME": "/home/u"}
    assert replica_env(given, "postgresql+psycopg://u:s3cret@db/amp") == {
        "HOME": "/home/u", "AUTOMLPERF_STORE_URL": "postgresql+psycopg://u@db/amp"}
    sqlite = f"sqlite:///{tmp_path / 'h.db'}"
    assert replica_env(given, sqlite) == {**given, "AUTOMLPERF_STORE_URL": sqlite}
    started = []

    class Recorded:
        pid = 1

        def __init__(self, cmd, env, **kwargs):
            started.append(env)

    monkeypatch.setattr(launch.subprocess, "Popen", Recorded)
    monkeypatch.setattr(launch.OomWatch, "of", staticmethod(lambda pid: type(
        "W", (), {"arm": lambda self: None})()))
    monkeypatch.setenv("AUTOMLPERF_STORE_PASSWORD", "s3cret")
    (tmp_path / "logs").mkdir()
    launch.LocalLauncher(tmp_path, 2, "postgresql+psycopg://u:s3cret@db/amp",
                         simulated=True).start()
    assert len(started) == 2 and all("s3cret" not in json.dumps(env) for env in started)
