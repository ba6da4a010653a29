"""The example job scripts run as written, on this machine, with their scheduler's
environment set (the Kubernetes manifest: tests/e2e/test_kubernetes.py). PBS Pro (with HPE
PALS), Flux and LSF have no Debian 12 packages: each script's body runs under bash with the
variables the scheduler sets (the node file, the host list) and its launcher's rank
variables, started by the stand-ins in tests/standins/ (PALS's mpiexec, `flux`) or, for LSF,
by Debian's own Open MPI mpirun. Each starts the private PostgreSQL server, the primary and
the replicas as local processes. Simulated accelerators on a small ImageNet-layout folder
(CONFIG): the scripts' plumbing is the point, and each replica trains one round, so the run
ends early."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cli, marked_env, sim_config, wait_no_strays
from trees import WNIDS, make_tree

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

REPO = Path(__file__).resolve().parents[2]
STANDINS = Path(__file__).resolve().parents[1] / "standins"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_tree(tmp_path_factory.mktemp("examples") / "imagenet", per_class=(4, 2),
                     classes=WNIDS[:10])


def settings(tmp_path):
    """Simulated devices on the small tree of DATA_DIR: the scripts pass --data-dir, which
    only a dataset of image folders reads."""
    path = tmp_path / "sim.toml"
    path.write_text(sim_config(sustained_ops=2e14, time_compression=100.0, max_rounds=1,
                               stop_grace_s=10, image_folders=True))
    return path


SICK_NODE = """#!/bin/bash
# The interpreter the job script runs, except for the replicas: replica 1's node cannot see
# the dataset (a mount namespace with an empty folder over it), and replica 0 starts only
# once replica 1 has retired, so that a launcher that ends every rank when one exits would
# end it, whatever the machine's speed.
rank=${PALS_RANKID:-${FLUX_TASK_RANK:-${OMPI_COMM_WORLD_RANK:-}}}
if [ "$rank" = 1 ] && [ "$3" = worker ]; then
    unshare --mount sh -c 'mount --bind "$0" "$DATA_DIR" && exec "$@"' EMPTY PYTHON "$@"
    status=$?
    touch EMPTY.retired
    exit $status
fi
if [ "$rank" = 0 ] && [ "$3" = worker ]; then
    for _ in $(seq 6000); do [ -e EMPTY.retired ] && break; sleep 0.1; done
fi
exec PYTHON "$@"
"""


def run_script(script, tmp_path, data, sick_node=False, **env):
    """The example's body, run as written. With ``sick_node``, replica 1's node cannot see
    the dataset: that replica retires at its start and the run goes on with the others."""
    run_dir = tmp_path / "run"
    path = os.pathsep.join([str(STANDINS), str(Path(sys.executable).parent), os.environ["PATH"]])
    python = sys.executable
    if sick_node:
        (tmp_path / "empty").mkdir()
        python = tmp_path / "python-sick-node"
        python.write_text(SICK_NODE.replace("EMPTY", str(tmp_path / "empty"))
                          .replace("PYTHON", sys.executable))
        python.chmod(0o755)
    full = dict(os.environ, PATH=path, RUN_DIR=str(run_dir), DATA_DIR=str(data),
                CONFIG=str(settings(tmp_path)), DURATION="10m", PYTHON=str(python), **env)
    done = subprocess.run(["bash", str(REPO / "examples" / script)], env=full, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    logs = "".join(p.read_text() for p in sorted((run_dir / "logs").glob("*.log")))
    assert done.returncode == 0, done.stdout + done.stderr + logs
    result = json.loads((run_dir / "result.json").read_text())
    assert result["score"] > 0 and not result["failures"]
    retired = [(r["replica"], "no images" in r["reason"] or "not" in r["reason"])
               for r in result["retired"]]
    assert retired == ([(1, True)] if sick_node else []), result["retired"]
    if sick_node:
        assert "ending the others" not in done.stderr and "kills the rest" not in done.stderr
    return run_dir, result, logs


def test_the_pbs_script_runs_as_written_and_outlives_a_sick_node(tmp_path, data):
    """mpiexec ends every rank when one exits non-zero: the replica that retires (its node
    lacks the data) exits 0, and the run goes on with the other."""
    nodes = tmp_path / "nodefile"
    nodes.write_text("x1001c0s0b0n0\nx1001c0s0b0n0\nx1001c0s0b1n0\n")  # a line per chunk
    run_dir, result, logs = run_script("pbs/automlperf.pbs", tmp_path, data, sick_node=True,
                                       PBS_NODEFILE=str(nodes), PBS_JOBID="42.pbs",
                                       PBS_STANDIN_WALLTIME="01:00:00")
    assert "replica 1 cannot start" in logs
    assert "replica 0 (from PALS_RANKID)" in logs and "replica 1 (from PALS_RANKID)" in logs
    # The primary asked qstat for the walltime: the run fits in its hour.
    assert json.loads((run_dir / "system.json").read_text())["job_limit"]["scheduler"] == "pbs"
    done = cli("check", run_dir, timeout=300)
    assert done.returncode == 0 and "verified" in done.stdout, done.stdout + done.stderr


def test_a_walltime_too_short_starts_no_clock_and_ends_the_waiting_replicas(tmp_path, data):
    """The walltime (asked of qstat) cannot hold a 10-minute run, its grace and its result:
    the primary refuses before the clock in one line naming the walltime to ask for, and the
    replicas, which would wait half an hour for its session, are ended; the job fails."""
    nodes = tmp_path / "nodefile"
    nodes.write_text("n1\nn2\n")
    env, mark = marked_env()
    path = os.pathsep.join([str(STANDINS), str(Path(sys.executable).parent), env["PATH"]])
    env.update(PATH=path, RUN_DIR=str(tmp_path / "run"), DATA_DIR=str(data),
               CONFIG=str(settings(tmp_path)), DURATION="10m", PYTHON=sys.executable,
               PBS_NODEFILE=str(nodes), PBS_JOBID="43.pbs", PBS_STANDIN_WALLTIME="00:12:00")
    done = subprocess.run(["bash", str(REPO / "examples" / "pbs" / "automlperf.pbs")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stdout + done.stderr
    last = (tmp_path / "run" / "logs" / "primary.log").read_text().strip().splitlines()[-1]
    assert "the job's time limit leaves" in last and "the clock was not started" in last
    # This job's start-up so far, the run, its grace (2.5 min) and the result's 3 min.
    assert re.search(r"submit it again with `qsub -l walltime=00:1[6-9]:00` or more$", last), last
    assert not (tmp_path / "run" / "run.json").exists()
    wait_no_strays(mark)  # the replicas did not wait out their half hour


def test_the_flux_script_runs_as_written_and_outlives_a_sick_node(tmp_path, data):
    """flux run would kill every task 30 s after the first exits (a replica retiring at its
    start): the script turns that off, and the run goes on with the other replica."""
    _, result, logs = run_script("flux/automlperf.flux", tmp_path, data, sick_node=True,
                                 FLUX_STANDIN_NODES="2", FLUX_STANDIN_EXIT_TIMEOUT="0",
                                 FLUX_URI="local:///tmp/flux-standin", FLUX_STANDIN_TIMELEFT="3600")
    assert "replica 1 (from FLUX_TASK_RANK)" in logs and "replica 1 cannot start" in logs


def test_the_lsf_script_runs_as_written_with_open_mpi(tmp_path, data):
    if shutil.which("mpirun") is None:
        pytest.fail("mpirun is not installed (run scripts/setup-system.sh)")
    host = socket.gethostname()
    # LSF lists a host once per slot; one host here, so one replica, started by mpirun itself.
    _, result, logs = run_script("lsf/automlperf.lsf", tmp_path, data, LSB_HOSTS=f"{host} {host}",
                                 LSB_JOBID="42", LSF_STANDIN_RUNLIMIT="01:00:00",
                                 OMPI_ALLOW_RUN_AS_ROOT="1",
                                 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_plm_rsh_agent="false")
    assert result["replicas"] == 1
    assert "replica 0 (from OMPI_COMM_WORLD_RANK)" in logs or "replica 0 (from PMIX_RANK)" in logs
