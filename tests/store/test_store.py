"""The store contract, run against every backend (SQLite and a real PostgreSQL server)."""

import contextlib
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import sqlalchemy as sa

from automlperf.store import (SCHEMA_VERSION, EpochRecord, SchemaMismatch, StoreError, open_store, redact,
                              resolve_store_url)
from automlperf.store.feed import EpochFeed
from automlperf.store.schema import T_EPOCHS
from automlperf.store.urls import normalise_url


def epoch(run_id, trial_id, n, ended=None, ops=10**15):
    return EpochRecord(trial_id=trial_id, epoch=n, started_at=100.0 + n, ended_at=ended or 101.0 + n,
                       train_images=1000, val_images=200, steps=8, ops=ops, train_loss=1.5,
                       val_accuracy=0.5 + n / 100, precision="bf16", batch_size=128, world_size=2,
                       data_share=0.01, images_per_s=900.0, run_id=run_id)


class ServedStore(str):
    """The URL of a store service (``store-service://FILE``), and of its database."""

    database: str


@pytest.fixture
def service_url(pg_url, tmp_path):
    """A store service, as the primary starts it, on a database of its own."""
    from automlperf.store.service.process import ServiceProcess

    open_store(pg_url, create=True).close()  # the primary makes the store first
    service = ServiceProcess(tmp_path / "served", pg_url)
    service.start()
    url = ServedStore(f"store-service://{service.file}")
    url.database = pg_url
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
        first = store.claim_trial(run_id, rep, 0, "h1", "{}", None, [], 0, {"batch_size": 64},
                                  1000.0, 60.0)
        assert first is not None
        assert store.claim_trial(run_id, other, 1, "h1", "{}", None, [], 0, {}, 1001.0, 60.0) is None
        second = store.claim_trial(run_id, other, 1, "h2", '{"g": 1}', first,
                                   [{"op": "deepen"}], 1, {"batch_size": 32}, 1002.0, 60.0)
        rows = store.trials(run_id)
        assert [t.id for t in rows] == [first, second]
        assert rows[1].parent_id == first and rows[1].morphs == [{"op": "deepen"}]
        assert rows[1].hparams == {"batch_size": 32} and rows[1].replica_index == 1
        assert [t.id for t in store.trials(run_id, after_id=first)] == [second]
        light = store.summaries(run_id)
        assert [(t.id, t.graph_hash, t.status, t.replica_index) for t in light] == [
            (first, "h1", "running", 0), (second, "h2", "running", 1)]
        other_run = store.create_run("r2", {}, {}, 60.0, 1000.0)
        assert store.claim_trial(other_run, rep, 0, "h1", "{}", None, [], 0, {}, 1.0, 60.0)

    def test_a_trial_finishes_once(self, store, run):
        run_id, _, rep = run
        t = store.claim_trial(run_id, rep, 0, "h", "{}", None, [], 0, {}, 1000.0, 60.0)
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
        t = store.claim_trial(run_id, rep, 0, "h", "{}", None, [], 0, {}, 1000.0, 60.0)
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
        a = store.claim_trial(run_id, rep, 0, "a", "{}", None, [], 0, {}, 1000.0, 60.0)
        b = store.claim_trial(run_id, other, 1, "b", "{}", None, [], 0, {}, 1000.0, 60.0)
        elsewhere = store.create_run("r2", {}, {}, 60.0, 1000.0)
        c = store.claim_trial(elsewhere, rep, 0, "a", "{}", None, [], 0, {}, 1000.0, 60.0)
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
        alive_t = store.claim_trial(run_id, rep, 0, "a", "{}", None, [], 0, {}, 1000.0, 30.0)
        dead_t = store.claim_trial(run_id, silent, 1, "b", "{}", None, [], 0, {}, 1000.0, 30.0)
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
            from automlperf.store import EpochRecord, open_store
            w = int(sys.argv[1])
            s = open_store({store_url!r})
            rep = s.register_replica({run_id}, w, {seg}, "n", w, [], 1.0)
            for i in range(15):
                t = s.claim_trial({run_id}, rep, w, f"w{{w}}-{{i}}", "{{}}", None, [], i, {{}}, 1.0, 60.0)
                s.claim_trial({run_id}, rep, w, "shared", "{{}}", None, [], i, {{}}, 1.0, 60.0)
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


def one_trial(s, name="r", graph_hash="h"):
    """A run with one replica holding one running trial: (run id, trial id)."""
    run_id = s.create_run(name, {}, {}, 60.0, 1.0)
    seg = s.start_segment(run_id, 1.0, 100.0)
    rep = s.register_replica(run_id, 0, seg, "n", 1, [], 1.0)
    return run_id, s.claim_trial(run_id, rep, 0, graph_hash, "{}", None, [], 0, {}, 1.0, 60.0)


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


def test_a_postgres_store_from_before_epoch_numbers_gets_them(pg_url):
    s = open_store(pg_url, create=True)
    run_id, t = one_trial(s)
    with s.engine.begin() as conn:  # as an automlperf before epoch numbers made it
        conn.exec_driver_sql("ALTER TABLE amp_epochs DROP COLUMN seq")
        conn.exec_driver_sql("DELETE FROM amp_meta WHERE key = 'layout'")
    s.record_epoch(epoch(run_id, t, 0))
    s.close()
    s = open_store(pg_url)
    s.record_epoch(epoch(run_id, t, 1))
    assert [e.epoch for _, e in EpochFeed(s, run_id).read()] == [0, 1]
    s.close()


def test_a_locked_sqlite_database_is_waited_for(tmp_path):
    url = f"sqlite:///{tmp_path / 'h.db'}"
    s = open_store(url, create=True)
    run_id = s.create_run("r", {}, {}, 60.0, 1.0)
    blocker = sa.create_engine(url).connect()
    blocker.exec_driver_sql("BEGIN EXCLUSIVE")
    threading.Timer(1.0, lambda: (blocker.exec_driver_sql("COMMIT"), blocker.close())).start()
    assert s.start_segment(run_id, 1.0, 2.0) == 0


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


def test_a_store_from_before_node_descriptions_gets_their_table(tmp_path):
    """Schema 1 stores made without the nodes table still open, and gain it."""
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'old.db'}"
    s = open_store(url, create=True)
    run_id = s.create_run("r", {}, {}, 60.0, 1.0)
    s.close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # as an automlperf before node descriptions made it
        conn.exec_driver_sql("DROP TABLE amp_nodes")
        conn.exec_driver_sql("DELETE FROM amp_meta WHERE key = 'layout'")
    engine.dispose()
    s = open_store(url)
    assert s.nodes(run_id) == [] and s.run(run_id)["name"] == "r"
    s.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_url(request, tmp_path):
    """A database's URL (the store service serves one of these)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    return request.getfixturevalue("pg_url")


def test_a_store_from_before_change_numbers_gets_them(sql_url):
    """A store an earlier automlperf made (no change numbers, leases on the trials) opens,
    numbers its trials and replicas, and keeps its running trials' leases."""
    s = open_store(sql_url, create=True)
    run_id, t = one_trial(s)  # claimed at 1.0 with a lease of 60 s
    with s.engine.begin() as conn:
        for index in ("amp_trials_changed", "amp_trials_running", "amp_replicas_changed",
                      "amp_samples_node"):
            conn.exec_driver_sql(f"DROP INDEX {index}")
        for table, column in (("amp_trials", "changed"), ("amp_replicas", "changed"),
                              ("amp_replicas", "lease_until")):
            conn.exec_driver_sql(f"ALTER TABLE {table} DROP COLUMN {column}")
        if not s.url.startswith("sqlite"):
            conn.exec_driver_sql("DROP SEQUENCE amp_changes")
        conn.exec_driver_sql("DELETE FROM amp_meta WHERE key = 'layout'")
    s.close()
    s = open_store(sql_url)
    assert [c.id for c in s.changes(run_id, 0).rows] == [t]
    (rep,) = s.replicas(run_id)
    assert s.expire_leases(run_id, 50.0) == []  # the lease its trial had
    assert s.heartbeat(rep.id, 50.0, 60.0).index == 0
    assert s.expire_leases(run_id, 100.0) == []  # extended by the beat
    assert s.expire_leases(run_id, 120.0) == [t]
    assert [c.status for c in s.changes(run_id, 0).rows] == ["failed"]


def test_a_store_from_before_the_device_share_gets_its_column(tmp_path):
    """Epochs stored before the device's side was measured apart read as None (not measured);
    the column is added when the store is opened, and later epochs keep their figure."""
    import dataclasses

    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'old.db'}"
    s = open_store(url, create=True)
    run_id, t = one_trial(s)
    s.close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE amp_epochs DROP COLUMN device_share")
        conn.exec_driver_sql("DELETE FROM amp_meta WHERE key = 'layout'")  # none was kept then
        conn.exec_driver_sql(
            "INSERT INTO amp_epochs (trial_id, epoch, run_id, started_at, ended_at, train_images,"
            " val_images, steps, ops, train_loss, val_accuracy, precision, batch_size, world_size,"
            " data_share, images_per_s, skipped_images, val_skipped) VALUES "
            f"({t}, 0, {run_id}, 100, 101, 1000, 200, 8, 1000, 1.5, 0.5, 'bf16', 128, 2, 0.3,"
            " 900, 0, 0)")
    engine.dispose()
    s = open_store(url)
    s.record_epoch(dataclasses.replace(epoch(run_id, t, 1), device_share=0.6))
    assert [(e.epoch, e.data_share, e.device_share) for e in s.epochs(run_id)] == \
        [(0, 0.3, None), (1, 0.01, 0.6)]
    s.close()


def test_a_store_from_before_validation_losses_gets_their_column(tmp_path):
    """Epochs recorded before the validation loss was kept read back with none; new ones
    keep theirs."""
    import dataclasses

    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'old.db'}"
    s = open_store(url, create=True)
    run_id = s.create_run("r", {}, {}, 60.0, 1.0)
    seg = s.start_segment(run_id, 1.0, 61.0)
    rep = s.register_replica(run_id, 0, seg, "node1", 42, ["cpu"], 1.0)
    t = s.claim_trial(run_id, rep, 0, "h", "{}", None, [], 0, {}, 1.0, 60.0)
    s.record_epoch(epoch(run_id, t, 0))
    s.close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE amp_epochs DROP COLUMN val_loss")
        conn.exec_driver_sql("UPDATE amp_meta SET value = '2' WHERE key = 'layout'")
    engine.dispose()
    s = open_store(url)
    s.record_epoch(dataclasses.replace(epoch(run_id, t, 1), val_loss=0.875))
    assert [e.val_loss for e in s.epochs(run_id)] == [None, 0.875]
    s.close()
