"""A store that fails: wrong at the start it is the user's to fix (exit 2); lost during the run
it is the run's failure (exit 1), which keeps what it wrote and gives the SIGTERM handler back."""

import os
import shutil
import signal
import tempfile
import threading

import pytest
from typer.testing import CliRunner

from automlperf.cli import app
from automlperf.store import open_store
from automlperf.store import retry
from automlperf.store.pgserver import PostgresServer, free_port
from helpers import fast_config

pytestmark = [pytest.mark.slow, pytest.mark.postgres]


def test_a_wrong_store_url_at_the_start_is_the_users_error(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(retry, "RETRY_S", 1.0)
    monkeypatch.setattr(retry, "OUTAGE_NOTICE_S", 0.0)  # the notice comes with the first retry
    url = f"postgresql+psycopg://nobody:pw@127.0.0.1:{free_port()}/none"
    done = CliRunner().invoke(app, ["run", "--store", url, "--run-dir", str(tmp_path / "r"),
                                    "--duration", "1m"])
    assert done.exit_code == 2, done.output
    assert "unreachable" in done.output and "Traceback" not in done.output
    # Said while it waits, once, and the error names what to check; never the password.
    notices = [r.getMessage() for r in caplog.records if r.name == "automlperf.store"]
    assert len(notices) == 1 and "retrying for up to 1 s" in notices[0] and ":pw@" not in notices[0]
    assert "check that its server is running" in done.output and ":pw@" not in done.output


def test_a_store_lost_mid_run_fails_the_run_and_keeps_it(tmp_path, monkeypatch):
    # In this process and in those the run starts (its store service, its replicas).
    monkeypatch.setenv(retry.RETRY_ENV, "2")
    # Its own server, to lose; outside pytest's base folder, whose mode another session
    # on the machine may reset while the server (another account, as root) starts.
    home = tempfile.mkdtemp(prefix="amp-lost-")
    server = PostgresServer(os.path.join(home, "pg"))
    server.start()
    url = server.create_database("lost")
    (tmp_path / "fast.toml").write_text(fast_config(stop_grace_s=5, max_rounds=40))
    run_dir = tmp_path / "run"
    lost = threading.Event()

    def stop_server_after_an_epoch() -> None:
        try:
            while not lost.is_set():
                try:
                    store = open_store(url)
                    try:
                        if store.epochs(1):
                            break
                    finally:
                        store.close()
                except Exception:  # noqa: BLE001 - the run has not created its tables yet
                    pass
                lost.wait(0.5)
        finally:
            server.stop()
            lost.set()

    watcher = threading.Thread(target=stop_server_after_an_epoch, daemon=True)
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    watcher.start()
    try:
        done = CliRunner().invoke(app, ["run", "--store", url, "--run-dir", str(run_dir),
                                        "--config", str(tmp_path / "fast.toml"),
                                        "--duration", "15m"])
        # The caller's handler is back although finishing the run raised.
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        lost.set()
        watcher.join(timeout=700)
        signal.signal(signal.SIGTERM, before)
        server.stop()
        shutil.rmtree(home, ignore_errors=True)
    assert done.exit_code == 75, done.output  # resumable: everything recorded is kept
    assert "the store failed during the run" in done.output and "unreachable" in done.output
    assert f"--resume --run-dir {run_dir}" in done.output
    assert (run_dir / "run.json").exists() and any((run_dir / "trials").iterdir())
