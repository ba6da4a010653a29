"""The store tests' shared fixtures: a run's store service on a real PostgreSQL server."""

import pytest


@pytest.fixture
def service(pg_url, tmp_path):
    """The store service of a run in ``tmp_path / "run"``, as a run's primary starts it, on
    a database of its own whose tables are made."""
    from automlperf.store import open_store
    from automlperf.store.service.process import ServiceProcess

    open_store(pg_url, create=True).close()
    started = ServiceProcess(tmp_path / "run", pg_url)
    started.start()
    yield started
    started.stop()


@pytest.fixture
def served(service, pg_url):
    """(the store service's client, as the run's primary, the database's store)."""
    from automlperf.store import open_store
    from automlperf.store.service.client import RemoteStore

    direct = open_store(pg_url)
    remote = RemoteStore(service.file, primary_token=service.primary_token)
    yield remote, direct
    remote.close()
    direct.close()
