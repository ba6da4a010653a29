"""Shared fixtures: real servers started by the tests themselves."""

import functools
import itertools
import os

import pytest

_db_names = itertools.count()


def pytest_collection_modifyitems(items):
    """Tests that start a real server carry its lane's mark, so `make test-fast` (no root, no
    services) leaves them out without a list to keep up to date."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        callspec = getattr(item, "callspec", None)
        on_postgres = callspec is not None and callspec.params.get("store_url") == "postgresql"
        if "pg_server" in names or on_postgres:
            item.add_marker(pytest.mark.postgres)
        if "slurm_cluster" in names:
            item.add_marker(pytest.mark.slurm)
        if item.get_closest_marker("dali") and not _dali_installed():
            item.add_marker(pytest.mark.skip(reason="NVIDIA DALI is not installed (make setup-dali)"))


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


SLURM_CONF = """\
ClusterName=amptest
SlurmctldHost={host}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
SlurmctldPort={ctld_port}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool-%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
KillWait=10
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=n1 NodeHostname={host} NodeAddr=127.0.0.1 Port={port1} CPUs=1 RealMemory=8000 State=UNKNOWN
NodeName=n2 NodeHostname={host} NodeAddr=127.0.0.1 Port={port2} CPUs=1 RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real two-node SLURM cluster on this host (Debian's slurm-wlm and munge, installed
    by scripts/setup-system.sh), configured in a temporary directory. Yields the environment
    that points SLURM's commands at it."""
    import getpass
    import shutil
    import socket
    import subprocess
    import time

    from automlperf.store.pgserver import free_port

    for tool in ("slurmctld", "slurmd", "sbatch", "munge"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            pytest.fail(f"{tool} is not installed (run scripts/setup-system.sh)")
    base = tmp_path_factory.mktemp("slurm")
    (base / "state").mkdir()
    conf = base / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=socket.gethostname(), user=getpass.getuser(),
                                      dir=base, ctld_port=free_port(), port1=free_port(),
                                      port2=free_port()))
    env = dict(os.environ, SLURM_CONF=str(conf))
    alive = subprocess.run("munge -n | unmunge", shell=True, capture_output=True)
    if alive.returncode != 0:
        subprocess.run(["/etc/init.d/munge", "start"], capture_output=True)
    sbin = "/usr/sbin/"
    subprocess.run([sbin + "slurmctld", "-f", str(conf)], env=env, check=True)
    for node in ("n1", "n2"):
        subprocess.run([sbin + "slurmd", "-f", str(conf), "-N", node], env=env, check=True)
    deadline = time.monotonic() + 300  # a guard: slurmd starts in seconds when idle
    while time.monotonic() < deadline:
        state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
        if state.stdout.split() == ["idle"]:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"the test SLURM cluster did not come up: {state.stdout} {state.stderr}; "
                    f"see {base}/slurmctld.log")
    yield env
    subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
