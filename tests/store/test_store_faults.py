"""A store that goes away mid-run: an outage the retries ride out is charged to nobody (no
live replica's trial failed, no replica stopped for the primary's silence); one past the
retry limit, or a full disk, ends the run with one line and leaves it resumable.

The end-to-end cases are the campaign's (bench/fault_cases_store.py), run smaller; the
faults are driven by conditions (an epoch recorded, the disk filled), never by how fast the
machine is."""

import importlib.util
import json
import os
import threading
import time
import types
from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from automlperf.config import Config
from automlperf.runner import session as steps
from automlperf.runner.launch import ExternalLauncher
from automlperf.store import StoreError, open_store, retry
from automlperf.store.base import BACKOFF_MAX_S, EpochRecord
from helpers import new_claim

BENCH = Path(__file__).resolve().parents[2] / "bench" / "fault_cases_store.py"


def campaign():
    spec = importlib.util.spec_from_file_location("fault_cases_store", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def epoch(run_id, trial_id, n):
    return EpochRecord(trial_id=trial_id, epoch=n, started_at=10.0 + n, ended_at=11.0 + n,
                       train_images=100, val_images=10, steps=4, ops=10**15, train_loss=0.5,
                       val_accuracy=0.5, precision="fp32", batch_size=32, world_size=1,
                       data_share=0.1, images_per_s=100.0, skipped_images=0, run_id=run_id)


def clock_with(sleep):
    """The store's clock, whose back-off between tries is ``sleep``."""
    return types.SimpleNamespace(time=time.time, monotonic=time.monotonic, sleep=sleep)


def test_a_call_that_rides_out_an_outage_notes_when_the_store_came_back(pg_server, pg_url,
                                                                       monkeypatch):
    s = open_store(pg_url, create=True)
    run_id = s.create_run("r", {}, {}, 60.0, 1.0)
    assert s.restored_at == 0.0 and s.silent_since(5.0) == 5.0
    # The server is back by the first retry, however long the machine takes to fail once.
    monkeypatch.setattr(retry, "time", clock_with(lambda _: pg_server.start()))
    pg_server._run("pg_ctl", "-D", str(pg_server.data), "-m", "fast", "-w", "stop")
    before = time.time()
    try:
        assert s.run(run_id)["name"] == "r"
    finally:
        s.close()
        if not (pg_server.data / "postmaster.pid").exists():
            pg_server.start()
    assert before <= s.restored_at <= time.time()
    # Silence written before the outage counts from when every client could find it back.
    assert s.silent_since(before - 100) == s.restored_at + BACKOFF_MAX_S
    assert s.silent_since(s.restored_at + 60) == s.restored_at + 60


class FakeClock:
    """Time that passes only when the store backs off, or when a test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class DownUntil:
    """A store whose server refuses connections until the clock reaches ``until``."""

    retry_s = 120.0
    restored_at = 0.0
    outage_said = False

    def __init__(self, clock: FakeClock, until: float, url: str) -> None:
        self.clock, self.until, self.url = clock, until, url

    @retry.retrying
    def call(self) -> str:
        if self.clock.now < self.until:
            raise sa.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))
        return "ok"


PG_URL = "postgresql+psycopg://amp:secret@db.example:5432/run"


@pytest.mark.parametrize("down_s, said", [(3.0, 0), (30.0, 1)])
def test_an_outage_is_said_once_after_five_seconds_and_a_hiccup_not_at_all(monkeypatch, caplog,
                                                                          down_s, said):
    clock = FakeClock()
    monkeypatch.setattr(retry, "time", clock)
    store = DownUntil(clock, clock.now + down_s, PG_URL)
    with caplog.at_level("WARNING", logger="automlperf.store"):
        assert store.call() == "ok"
    notices = [r.getMessage() for r in caplog.records if r.name == "automlperf.store"]
    assert len(notices) == said
    assert all("retrying for up to 120 s" in n and "secret" not in n for n in notices)
    assert store.restored_at >= clock.now - BACKOFF_MAX_S


def test_calls_waiting_on_one_outage_say_so_once_and_the_next_outage_again(monkeypatch, caplog):
    clock = FakeClock()
    monkeypatch.setattr(retry, "time", clock)
    store = DownUntil(clock, clock.now + 30.0, PG_URL)
    notices = lambda: [r for r in caplog.records if r.name == "automlperf.store"]  # noqa: E731
    second: list[str] = []
    begun: list[bool] = []
    back_off = clock.sleep

    def sleep(seconds: float) -> None:
        # Once the first call has said so, another thread's call waits on the same outage,
        # to its end, while the first is backing off.
        if notices() and not begun:
            begun.append(True)
            other = threading.Thread(target=lambda: second.append(store.call()))
            other.start()
            other.join()
        back_off(seconds)

    clock.sleep = sleep
    with caplog.at_level("WARNING", logger="automlperf.store"):
        assert store.call() == "ok"
        assert second == ["ok"] and len(notices()) == 1
        store.until = clock.now + 30.0  # a new outage, after the store came back
        store.call()
    assert len(notices()) == 2


def test_an_outage_past_the_limit_names_what_to_check_for_each_kind_of_store(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(retry, "time", clock)
    for url, advice in ((PG_URL, "check that its server is running"),
                        ("sqlite:////data/run/history.db", "holds its file locked")):
        store = DownUntil(clock, float("inf"), url)
        with pytest.raises(StoreError, match="unreachable for 120 s") as raised:
            store.call()
        line = str(raised.value)
        assert advice in line and "secret" not in line and "\n" not in line


def test_leases_are_judged_a_full_lease_after_the_store_came_back(tmp_path):
    s = open_store(None, run_dir=tmp_path, create=True)
    assert steps.leases_judged(s, time.time(), 30.0)
    s.restored_at = 1000.0
    back = 1000.0 + BACKOFF_MAX_S
    assert not steps.leases_judged(s, back + 29.9, 30.0)
    assert steps.leases_judged(s, back + 30.0, 30.0)
    s.close()


def test_an_external_launcher_does_not_call_a_replica_lost_for_the_stores_silence(tmp_path):
    (tmp_path / "config.toml").write_text('[data]\ndataset = "digits"\n')
    session = steps.prepare(Config.load(tmp_path / "config.toml"), tmp_path / "run", None,
                              False, {})
    now = time.time()
    session.store.register_replica(session.run_id, 0, session.segment, "n", 1, [], now - 100)
    launcher = ExternalLauncher(session.dir.path, 1, None, lease_timeout_s=30.0)
    launcher.start()
    assert launcher.states() == ["lost"]
    launcher.store.restored_at = now - BACKOFF_MAX_S  # the store just came back
    assert launcher.states() == ["up"]
    launcher.store.close()
    session.store.close()


def test_a_retried_claim_or_epoch_whose_first_try_committed_is_taken_once(store_url):
    s = open_store(store_url, create=True)
    run_id = s.create_run("r", {}, {}, 60.0, 1.0)
    seg = s.start_segment(run_id, 1.0, 100.0)
    mine, other = (s.register_replica(run_id, i, seg, "n", 1, [], 1.0) for i in (0, 1))
    claim = new_claim(run_id=run_id, replica_id=mine, replica_index=0, graph_hash="h", now=5.0)
    t = s.claim_trial(claim)
    # The same claim again (its first try committed, unseen) is the same trial ...
    assert s.claim_trial(claim) == t
    # ... and another replica's, or a later one, is refused as before.
    assert s.claim_trial(replace(claim, replica_id=other, replica_index=1)) is None
    assert s.claim_trial(replace(claim, now=6.0)) is None
    s.record_epoch(epoch(run_id, t, 0))
    s.record_epoch(epoch(run_id, t, 0))
    with pytest.raises(StoreError, match="already recorded"):
        s.record_epoch(EpochRecord(**{**epoch(run_id, t, 0).__dict__, "val_accuracy": 0.6}))
    assert [(e.trial_id, e.epoch) for e in s.epochs(run_id)] == [(t, 0)]
    assert [r.id for r in s.trials(run_id)] == [t]
    s.close()


def test_a_full_sqlite_store_fails_at_once_saying_so(tmp_path, monkeypatch):
    s = open_store(None, run_dir=tmp_path, create=True)
    run_id = s.create_run("r", {}, {}, 60.0, 1.0)
    with s.engine.connect() as conn:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar() + 4

    @event.listens_for(s.engine, "connect")
    def small(dbapi_conn, _record):
        dbapi_conn.execute(f"PRAGMA max_page_count={pages}")

    s.engine.dispose()  # the store keeps its connections: the limit is set on new ones

    def no_retry(_):
        raise AssertionError("a full disk was retried")

    monkeypatch.setattr(retry, "time", clock_with(no_retry))
    sample = {"t": 1.0, "host": {"note": "x" * 4000}}
    with pytest.raises(StoreError, match=r"the disk of store .*history.db is full .*free space"):
        for _ in range(100):
            s.add_samples(run_id, "n", [sample])
    s.close()
    # Every sample is whole: a transaction that did not fit left nothing.
    with sa.create_engine(f"sqlite:///{tmp_path / 'history.db'}").connect() as conn:
        rows = conn.exec_driver_sql("SELECT data FROM amp_samples").scalars().all()
    assert rows and all(json.loads(r)["host"] == sample["host"] for r in rows)


def test_a_sqlite_stores_file_system_without_room_is_full(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'history.db'}"
    assert retry.full_file_system(url) is None
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    monkeypatch.setattr(retry, "FULL_BELOW_BYTES", free + (1 << 30))
    assert retry.full_file_system(url) == str(tmp_path)
    assert retry.full_file_system("postgresql://h/db") is None


def test_the_retry_limit_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(retry.RETRY_ENV, "7.5")
    assert open_store(None, run_dir=tmp_path, create=True).retry_s == 7.5
    monkeypatch.setenv(retry.RETRY_ENV, "soon")
    with pytest.raises(StoreError, match="AUTOMLPERF_STORE_RETRY_S='soon' is not a number"):
        open_store(None, run_dir=tmp_path)


@pytest.mark.slow
@pytest.mark.postgres
def test_a_postgres_restart_mid_run_is_charged_to_no_replica(tmp_path):
    # An outage longer than a lease (and the back-off), where a live replica's lease lapses.
    found = campaign().pg_restarted(tmp_path, outage_s=14, lease_s=8, rounds=3)
    assert found["exit"] == 0, found["stderr"][-3000:]
    assert found["charged"] == 0 and found["silent"] == 0, found
    assert found["lost"] == 0 and found["records_after"] > found["records_before"]
    assert found["duplicated"] == 0 and found["epochs_logged"] == found["epochs_stored"] > 0
    assert found["check"] == "pass"


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_down_past_the_retry_limit_ends_the_run_in_one_line_and_resumes(tmp_path):
    found = campaign().pg_down(tmp_path, retry_s=4, rounds=3)
    assert found["exit"] == 75  # resumable: everything recorded is kept
    assert "Traceback" not in found["stderr"]
    (line,) = [x for x in found["stderr"].splitlines() if x.startswith("error")]
    assert "the store failed during the run: store postgresql" in line
    assert "unreachable for 4 s" in line and "--resume --run-dir" in line
    assert found["resume_exit"] == 0, found["resume_stderr"][-3000:]
    # Counted from both sides: the trial logs and the store hold the same epochs, once.
    assert found["lost"] == 0 and found["duplicated"] == 0 and found["check"] == "pass"
    assert found["epochs_logged"] == found["epochs_stored"] > 0


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_sqlite_on_a_full_disk_ends_the_run_in_one_line_and_resumes(tmp_path):
    found = campaign().sqlite_full(tmp_path, size_mb=32, rounds=3)
    assert found["exit"] == 75  # resumable: once there is room, --resume goes on
    assert "Traceback" not in found["stderr"]
    (line,) = [x for x in found["stderr"].splitlines() if x.startswith("error")]
    # Said to be full at once (SQLite may call it a disk I/O error), not retried as an outage.
    assert "is full" in line and "unreachable" not in line and "--resume --run-dir" in line
    assert found["half_written"] == []
    assert found["resume_exit"] == 0, found["resume_stderr"][-3000:]
    # Counted from both sides: the trial logs and the store hold the same epochs, once.
    assert found["lost"] == 0 and found["duplicated"] == 0 and found["check"] == "pass"
    assert found["epochs_logged"] == found["epochs_stored"] > 0


@pytest.mark.slow
@pytest.mark.postgres
def test_the_store_service_killed_then_stopped_is_charged_to_no_replica(tmp_path):
    # Stopped for longer than a lease: the silence is the service's, charged to no one.
    found = campaign().service_killed_and_stopped(tmp_path, stop_s=30, lease_s=20, rounds=3)
    assert found["exit"] == 0, found["stderr"][-3000:]
    assert found["charged"] == 0 and found["silent"] == 0, found
    # Counted from both sides: the trial logs and the store hold the same epochs, once.
    assert found["lost"] == 0 and found["duplicated"] == 0 and found["check"] == "pass"
    assert found["records_after"] > found["records_before"]
    assert found["epochs_logged"] == found["epochs_stored"] > 0
