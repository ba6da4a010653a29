"""The private PostgreSQL server listens on its Unix socket only, in a folder only its owner
enters: no one on the host can open a connection to it over TCP, not even one that waits in
authentication to hold a slot of its ``max_connections``; an earlier version's batch script
asking it to listen everywhere gets the socket only."""

import os
import socket
import stat
import subprocess
import sys

import pytest
import sqlalchemy as sa

pytestmark = pytest.mark.postgres


def assert_socket_only(server, url):
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SHOW listen_addresses")).scalar() == ""
            assert conn.execute(sa.text("SHOW unix_socket_permissions")).scalar() == "0700"
            rules = conn.execute(sa.text(
                "SELECT type, address FROM pg_hba_file_rules")).all()
    finally:
        engine.dispose()
    assert ("host", "0.0.0.0") not in rules and ("host", "::") not in rules
    folder = os.stat(server.socket_dir)
    assert stat.S_IMODE(folder.st_mode) == 0o700
    assert "@/" in url and f"host={server.socket_dir}" in url
    for address in ("127.0.0.1", "::1"):
        with pytest.raises(OSError):
            socket.create_connection((address, server.port), timeout=30).close()


def test_the_private_server_listens_on_its_socket_only(pg_server, pg_url):
    assert_socket_only(pg_server, pg_url)


@pytest.mark.slow
def test_an_earlier_scripts_listen_all_gets_the_socket_only(tmp_path):
    from automlperf.store.pgserver import PostgresServer

    folder = tmp_path / "postgres"
    started = subprocess.run([sys.executable, "-m", "automlperf.store.pgserver", "start", "--dir",
                              str(folder), "--listen-all", "--host", "0.0.0.0"],
                             capture_output=True, text=True, timeout=300)
    try:
        assert started.returncode == 0, started.stderr
        assert "listens on its socket only" in started.stderr
        server = PostgresServer(folder)
        server.socket_dir = type(server.socket_dir)((folder / "socket-dir").read_text().strip())
        server.port = int(started.stdout.strip().rsplit("port=", 1)[1])
        password = (folder / "pg.password").read_text().strip()
        url = started.stdout.strip().replace("automlperf@", f"automlperf:{password}@", 1)
        assert_socket_only(server, url)
    finally:
        subprocess.run([sys.executable, "-m", "automlperf.store.pgserver", "stop", "--dir",
                        str(folder)], capture_output=True, timeout=700)
