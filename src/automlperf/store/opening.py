"""Opening a store by its URL: a database's (:class:`~automlperf.store.sql.SQLStore`), the
run's store service's (``store-service://FILE``:
:class:`~automlperf.store.service.client.RemoteStore`), or a run directory's ``history.db``; and
which of them the processes of a run use."""

from __future__ import annotations

from pathlib import Path

from automlperf.store.base import Store, StoreError
from automlperf.store.service.client import SCHEME, RemoteStore, service_file
from automlperf.store.sql import SQLStore


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
