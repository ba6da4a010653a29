"""Shared fixtures: real servers started by the tests themselves."""

import itertools
import os

import pytest

_db_names = itertools.count()


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory):
    """A private PostgreSQL server for the whole session (installed by
    scripts/setup-system.sh; its absence is a failure, not a skip)."""
    from automlperf.runner.pgserver import PostgresError, PostgresServer

    try:
        server = PostgresServer(tmp_path_factory.mktemp("postgres"))
        server.start()
    except PostgresError as exc:
        pytest.fail(f"{exc} (run scripts/setup-system.sh)")
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg_server):
    """An empty database of its own for one test."""
    return pg_server.create_database(f"t{os.getpid()}_{next(_db_names)}")


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path):
    """One URL per store backend: every test using it runs against both."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    return request.getfixturevalue("pg_url")
