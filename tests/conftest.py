"""Shared fixtures: real servers started by the tests themselves."""

import functools
import itertools
import os

import pytest

_db_names = itertools.count()


# Modules whose tests share one costly module fixture (a finished run, a pool of rank
# processes): under pytest-xdist they stay on one worker, which sets it up once.
SHARED_MODULE_FIXTURE = ("test_results", "test_trainer")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Tests that start a real server carry its lane's mark, so `make test-fast` (no root, no
    services) leaves them out without a list to keep up to date.

    On a pytest-xdist worker (`make test`, `--dist loadgroup`): every SLURM test runs on one
    worker, so each local cluster starts once and never beside another worker's (they would
    share this host's munge daemon), and the slow tests come first, so that the quick ones
    fill the workers' ends and both finish together."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        callspec = getattr(item, "callspec", None)
        on_postgres = callspec is not None and callspec.params.get("store_url") == "postgresql"
        if "pg_server" in names or on_postgres:
            item.add_marker(pytest.mark.postgres)
        if "slurm_cluster" in names or "slurm_cluster_8" in names:
            item.add_marker(pytest.mark.slurm)
        if item.get_closest_marker("dali") and not _dali_installed():
            item.add_marker(pytest.mark.skip(reason="NVIDIA DALI is not installed (make setup-dali)"))
    if not hasattr(config, "workerinput"):
        return
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif item.module is not None and item.module.__name__ in SHARED_MODULE_FIXTURE:
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    items.sort(key=_start_order)


def _start_order(item) -> int:
    """SLURM's tests first (the largest unit of work), then the other slow ones."""
    if item.get_closest_marker("slurm"):
        return 0
    return 1 if item.get_closest_marker("slow") else 2


@functools.cache
def _dali_installed() -> bool:
    from automlperf.train.data import dali_available

    return dali_available()


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory):
    """A private PostgreSQL server for the whole session (installed by
    scripts/setup-system.sh; its absence is a failure, not a skip)."""
    from automlperf.store.pgserver import PostgresError, PostgresServer

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


def start_slurm(base, nodes, cluster, memory_mb=8000):
    """A real SLURM cluster of ``nodes`` slurmd daemons on this host (runner/localslurm.py);
    its absence is a failure, not a skip."""
    from automlperf.runner.localslurm import SlurmError
    from automlperf.runner.localslurm import start_slurm as start

    try:
        return start(base, nodes, cluster, memory_mb)
    except SlurmError as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real two-node SLURM cluster on this host. Yields the environment that points
    SLURM's commands at it."""
    from automlperf.runner.localslurm import stop_slurm

    env = start_slurm(tmp_path_factory.mktemp("slurm"), 2, "amptest")
    yield env
    stop_slurm(env)


@pytest.fixture(scope="module")
def slurm_cluster_8(tmp_path_factory):
    """A real SLURM cluster of eight slurmd nodes on this host, for the tests of one module
    (light job steps only: the nodes share this machine's cores)."""
    from automlperf.runner.localslurm import stop_slurm

    env = start_slurm(tmp_path_factory.mktemp("slurm8"), 8, "amptest8")
    yield env
    stop_slurm(env)
