"""Opening a store by its URL: a database's (:class:`~automlperf.store.sql.SQLStore`), the
run's store service's (``store-service://FILE``:
:class:`~automlperf.store.service.client.RemoteStore`), or a run directory's ``history.db``;
which of them the processes of a run use; and a finished run's, for reading it afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from automlperf.store import pgowner
from automlperf.store.base import Store, StoreError
from automlperf.store.pgserver import PostgresServer
from automlperf.store.rundir import RunDir
from automlperf.store.service.client import SCHEME, RemoteStore, service_file
from automlperf.store.sql import SQLStore
from automlperf.store.urls import resolve_store_url


def open_store(url: str | None = None, run_dir: Path | str | None = None,
               create: bool = False) -> Store:
    """The store at ``url`` (a database's, or ``store-service://FILE``: the run's store
    service whose address is in FILE), or the run directory's ``history.db``."""
    if url is None:
        if run_dir is None:
            raise StoreError("no store: give a URL or a run directory")
        url = f"sqlite:///{Path(run_dir).resolve() / 'history.db'}"
    if url.startswith(SCHEME):
        return RemoteStore(url[len(SCHEME):])
    try:
        return SQLStore(url, create=create)
    except ModuleNotFoundError as exc:
        if "psycopg" in str(exc):
            raise StoreError("a PostgreSQL store needs the psycopg driver: "
                             "pip install 'automlperf[postgres]'") from None
        raise


def open_run_store(run_dir: Path | str, url: str | None) -> Store:
    """The store a replica (or a launcher watching replicas) of the run in ``run_dir`` uses:
    the run's store service when the store is a PostgreSQL server (the primary starts it),
    else the store itself (the run directory's SQLite file by default)."""
    if served(url):
        return RemoteStore(service_file(run_dir))
    return open_store(url, run_dir=run_dir)


def served(url: str | None) -> bool:
    """Whether a run on the store at ``url`` is served by a store service."""
    return bool(url) and str(url).startswith(("postgresql", "postgres:"))


@contextlib.contextmanager
def run_store(run_dir: Path | str, explicit: str | None = None) -> Iterator[Store]:
    """The run's store, opened for reading it afterwards. A run that used a private
    PostgreSQL server in its directory (a SLURM job without --store) gets that server started
    for as long as it is needed, then stopped again."""
    rd = RunDir(Path(run_dir))
    private = rd.path / "postgres"
    url = rd.store_url(explicit)
    server = None
    if explicit is None and url and (private / "pgdata").exists():
        verdict = pgowner.assess(private)
        if verdict.live and verdict.here:
            # Its server is up (the job still runs, or is stopping it): the password is in
            # the file only the run's owner can read.
            url = resolve_store_url(url, password_file=private / "pg.password")
        elif verdict.live and verdict.owner is not None:
            # It listens on its own host's loopback only: no other host reaches it.
            raise pgowner.StoreInUse(
                f"the run's store is served from {verdict.owner.where()} ({verdict.why}): run "
                "this there, or once the job has ended")
        else:
            # Stopped, or left by a server killed with its job (a stale postmaster.pid):
            # start it here, for as long as it is needed.
            server = PostgresServer(private)
            url = server.start()
    try:
        store = open_store(url, run_dir=rd.path)
        try:
            yield store
        finally:
            store.close()
    finally:
        if server is not None:
            server.stop()
