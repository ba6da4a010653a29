"""Private PostgreSQL servers started as another host would start them: the command line
of ``python -m automlperf.store.pgserver`` in a UTS namespace with a host name of its own
(a second node sharing the file system), and the rows a test keeps in them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg


def pgserver_on(host: str | None, directory: Path, env: dict[str, str] | None = None,
                action: str = "start", *extra: str) -> subprocess.CompletedProcess[str]:
    """``python -m automlperf.store.pgserver ACTION --dir DIRECTORY [EXTRA]`` as a host
    named ``host`` would run it (None: this host)."""
    command = [sys.executable, "-m", "automlperf.store.pgserver", action, "--dir",
               str(directory), *extra]
    if host is not None:
        command = ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh",
                   *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})))


def with_password(directory: Path, printed: str) -> str:
    """The URL ``pgserver start`` printed, with the password it keeps in its folder."""
    password = (Path(directory) / "pg.password").read_text().strip()
    return printed.strip().replace("automlperf@", f"automlperf:{password}@", 1)


def _dsn(url: str) -> str:
    return url.replace("postgresql+psycopg", "postgresql")


def write_rows(url: str, *values: int) -> None:
    with psycopg.connect(_dsn(url)) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS kept (v int)")
        for v in values:
            conn.execute("INSERT INTO kept VALUES (%s)", (v,))


def rows(url: str) -> list[tuple]:
    with psycopg.connect(_dsn(url)) as conn:
        return conn.execute("SELECT v FROM kept ORDER BY v").fetchall()
