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
        if "slurm_cluster" in names or "slurm_cluster_8" in names:
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
ClusterName={cluster}
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
"""
SLURM_NODE = ("NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=1 "
              "RealMemory={memory} State=UNKNOWN\n")


def start_slurm(base, nodes, cluster, memory_mb=8000):
    """A real SLURM cluster of ``nodes`` slurmd daemons on this host (Debian's slurm-wlm
    and munge, installed by scripts/setup-system.sh), configured in ``base``; the
    environment that points SLURM's commands at it."""
    import getpass
    import shutil
    import socket
    import subprocess
    import time

    from automlperf.store.pgserver import free_port

    for tool in ("slurmctld", "slurmd", "sbatch", "munge"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            pytest.fail(f"{tool} is not installed (run scripts/setup-system.sh)")
    (base / "state").mkdir()
    host = socket.gethostname()
    names = [f"n{i}" for i in range(1, nodes + 1)]
    conf = base / "slurm.conf"
    conf.write_text(SLURM_CONF.format(cluster=cluster, host=host, user=getpass.getuser(),
                                      dir=base, ctld_port=free_port())
                    + "".join(SLURM_NODE.format(name=n, host=host, port=free_port(),
                                                memory=memory_mb) for n in names)
                    + f"PartitionName=debug Nodes={','.join(names)} Default=YES "
                      "MaxTime=INFINITE State=UP\n")
    env = dict(os.environ, SLURM_CONF=str(conf))
    alive = subprocess.run("munge -n | unmunge", shell=True, capture_output=True)
    if alive.returncode != 0:
        subprocess.run(["/etc/init.d/munge", "start"], capture_output=True)
    sbin = "/usr/sbin/"
    subprocess.run([sbin + "slurmctld", "-f", str(conf)], env=env, check=True)
    for node in names:
        subprocess.run([sbin + "slurmd", "-f", str(conf), "-N", node], env=env, check=True)
    deadline = time.monotonic() + 300  # a guard: slurmd starts in seconds when idle
    while time.monotonic() < deadline:
        state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
        if state.stdout.split() == ["idle"]:
            break
        time.sleep(0.5)
    else:
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
        pytest.fail(f"the test SLURM cluster did not come up: {state.stdout} {state.stderr}; "
                    f"see {base}/slurmctld.log")
    return env


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A real two-node SLURM cluster on this host. Yields the environment that points
    SLURM's commands at it."""
    import subprocess

    env = start_slurm(tmp_path_factory.mktemp("slurm"), 2, "amptest")
    yield env
    subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)


@pytest.fixture(scope="module")
def slurm_cluster_8(tmp_path_factory):
    """A real SLURM cluster of eight slurmd nodes on this host, for the tests of one module
    (light job steps only: the nodes share this machine's cores)."""
    import subprocess

    env = start_slurm(tmp_path_factory.mktemp("slurm8"), 8, "amptest8")
    yield env
    subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
