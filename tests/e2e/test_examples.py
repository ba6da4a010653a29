"""The example job scripts run as written, on this machine, with their scheduler's
environment set (the Kubernetes manifest: tests/e2e/test_kubernetes.py). PBS Pro (with HPE
PALS), Flux and LSF have no Debian 12 packages: each script's body runs under bash with the
variables the scheduler sets (the node file, the host list), its replicas started one per
node by the stand-ins in tests/standins/ (PALS's mpiexec, `flux submit --cc`, LSF's
blaunch), each in a session of its own as on a node of its own. Each starts the private
PostgreSQL server, the primary and the replicas as local processes. Simulated accelerators
on a small ImageNet-layout folder (CONFIG): the scripts' plumbing is the point, and each
replica trains two rounds, so the run ends early.

On three nodes, each script outlives two failures: replica 1's node cannot see the data
(it retires at its start), and replica 2 is killed outright mid-trial (SIGKILL to its whole
process group, as its node's death or the kernel's OOM killer would: no word to anyone);
replica 0 goes on, the run finishes and verifies, and the killed replica costs the trial it
was training, failed once its lease lapses."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from automlperf.store import TrialStatus, pgowner
from helpers import (cli, hold_mid_trial, kill_outright, marked_env, opened, sim_config,
                     wait_no_strays)
from trees import WNIDS, make_tree

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

REPO = Path(__file__).resolve().parents[2]
STANDINS = Path(__file__).resolve().parents[1] / "standins"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_tree(tmp_path_factory.mktemp("examples") / "imagenet", per_class=(4, 2),
                     classes=WNIDS[:10])


LEASE_S = 10


def settings(tmp_path):
    """Simulated devices on the small tree of DATA_DIR: the scripts pass --data-dir, which
    only a dataset of image folders reads. A round's trial lasts seconds (an epoch of
    ResNet-50 at 32x32 on ImageNet's counts: about 5 s at this compression), so that one is
    caught in flight; a replica killed outright is noticed once its lease lapses."""
    path = tmp_path / "sim.toml"
    path.write_text(sim_config(sustained_ops=2e14, time_compression=5.0, max_rounds=2,
                               stop_grace_s=10, lease_timeout_s=LEASE_S, image_folders=True))
    return path


SICK_NODE = """#!/bin/bash
# The interpreter the job script runs, except for the replicas: replica 1's node cannot see
# the dataset (a mount namespace with an empty folder over it), and replica 0 starts only
# once replica 1 has retired, so that a launcher that ends every rank when one exits would
# end it, whatever the machine's speed. A replica's number is its --replica-index.
rank=""; previous=""
for arg in "$@"; do [ "$previous" = --replica-index ] && rank=$arg; previous=$arg; done
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


def run_script(script, tmp_path, data, sick_node=False, kill=None, **env):
    """The example's body, run as written. With ``sick_node``, replica 1's node cannot see
    the dataset: that replica retires at its start and the run goes on with the others.
    With ``kill``, that replica is killed outright mid-trial: the run goes on without it,
    and its trial fails once its lease lapses. What ran (:class:`Ran`)."""
    run_dir = tmp_path / "run"
    path = os.pathsep.join([str(STANDINS), str(Path(sys.executable).parent), os.environ["PATH"]])
    python = sys.executable
    if sick_node:
        (tmp_path / "empty").mkdir()
        python = tmp_path / "python-sick-node"
        python.write_text(SICK_NODE.replace("EMPTY", str(tmp_path / "empty"))
                          .replace("PYTHON", sys.executable))
        python.chmod(0o755)
    # An earlier job's lines (a job that hit its walltime, or was deleted): a later job adds
    # to its logs, so that what went wrong before is still there to read.
    (run_dir / "logs").mkdir(parents=True)
    earlier = "an earlier job of this run wrote this line\n"
    for name in ("primary.log", f"replica-{kill or 0}.log"):
        (run_dir / "logs" / name).write_text(earlier)
    full = dict(os.environ, PATH=path, RUN_DIR=str(run_dir), DATA_DIR=str(data),
                CONFIG=str(settings(tmp_path)), DURATION="10m", PYTHON=str(python), **env)
    job = subprocess.Popen(["bash", str(REPO / "examples" / script)], env=full, cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = None
    try:
        store = opened(run_dir)
        owner = pgowner.read_owner(run_dir / "postgres")
        try:
            if kill is not None:
                # In a trial: its first round's lasts one epoch, so none done yet.
                pid, trial = hold_mid_trial(store, run_dir, kill, epochs=0)
                killed = (trial, kill_outright(pid))
        finally:
            store.close()
        stdout, stderr = job.communicate(timeout=900)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    logs = "".join(p.read_text() for p in sorted((run_dir / "logs").glob("*.log")))
    assert job.returncode == 0, stdout + stderr + logs
    for name in ("primary.log", f"replica-{kill or 0}.log"):
        text = (run_dir / "logs" / name).read_text()
        assert text.startswith(earlier) and len(text) > len(earlier), name
    result = json.loads((run_dir / "result.json").read_text())
    assert result["score"] > 0 and not result["failures"]
    retired = [(r["replica"], "no images" in r["reason"] or "not" in r["reason"])
               for r in result["retired"]]
    assert retired == ([(1, True)] if sick_node else []), result["retired"]
    if sick_node:
        assert "ending the others" not in stderr and "kills the rest" not in stderr
    if killed is not None:
        trial, killed_at = killed
        from automlperf.store.opening import run_store

        with run_store(run_dir) as store:
            charged = [t for t in store.trials(1) if t.replica_index == kill
                       and t.status == "failed"]
            # Replica 0 ended on its own (its rounds done, or the deadline), whenever that
            # was: a launcher that ended every rank with the killed one would have left its
            # registration to be failed by the primary.
            ended = [r.status for r in store.replicas(1) if r.index == 0]
        # The trial it was training, and no other: failed when its lease lapsed.
        assert [t.id for t in charged] == [trial.id] and "heart-beating" in charged[0].reason
        assert charged[0].finished_at > killed_at
        assert ended == [TrialStatus.COMPLETED] or ended == [TrialStatus.STOPPED], ended
        done = cli("check", run_dir, timeout=300)
        assert done.returncode == 0 and "verified" in done.stdout, done.stdout + done.stderr
        killed = {"trial": trial.id, "killed_at": killed_at, "charged": len(charged),
                  "noticed_s": charged[0].finished_at - killed_at}
    return Ran(run_dir, result, logs, owner, job.returncode, killed)


class Ran(NamedTuple):
    """An example run: its run directory, result, logs, the owner its private store's
    folder recorded while it ran, the script's exit status, and the replica killed (its
    trial, when, the trials it cost, and how long until the primary failed its trial)."""

    run_dir: Path
    result: dict
    logs: str
    owner: Any
    status: int
    killed: dict | None


def test_the_pbs_script_runs_as_written_and_outlives_a_sick_node_and_a_killed_replica(
        tmp_path, data):
    """One mpiexec per node: one node's rank that exits or dies ends that mpiexec only (one
    mpiexec of every rank ends them all); the replica that retires (its node lacks the data)
    exits 0, and the run goes on with the other two, then with one."""
    nodes = tmp_path / "nodefile"
    # A line per chunk, a node's lines together (place=scatter gives a node each here).
    nodes.write_text("x1001c0s0b0n0\nx1001c0s0b0n0\nx1001c0s0b1n0\nx1001c0s0b2n0\n")
    run_dir, result, logs, owner, *_ = run_script("pbs/automlperf.pbs", tmp_path, data, sick_node=True,
                                       kill=2, PBS_NODEFILE=str(nodes), PBS_JOBID="42.pbs",
                                       PBS_STANDIN_WALLTIME="01:00:00")
    assert "replica 1 cannot start" in logs and result["replicas"] == 3
    assert all(f"replica {i} (from --replica-index)" in logs for i in range(3))
    # The primary asked qstat for the walltime: the run fits in its hour.
    assert json.loads((run_dir / "system.json").read_text())["job_limit"]["scheduler"] == "pbs"
    # The private store's folder named this PBS job, for a later job to ask qstat about.
    assert (owner.scheduler, owner.job) == ("pbs", "42.pbs")


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
    assert done.returncode == 3, done.stdout + done.stderr  # no clock started
    last = (tmp_path / "run" / "logs" / "primary.log").read_text().strip().splitlines()[-1]
    assert "the job's time limit leaves" in last and "the clock was not started" in last
    # This job's start-up so far, the run, its grace (2.5 min) and the result's 3 min.
    assert re.search(r"submit it again with `qsub -l walltime=00:1[6-9]:00` or more$", last), last
    assert not (tmp_path / "run" / "run.json").exists()
    wait_no_strays(mark)  # the replicas did not wait out their half hour


def test_the_flux_script_runs_as_written_and_outlives_a_sick_node_and_a_killed_replica(
        tmp_path, data):
    """A job per node (flux submit --cc): one `flux run` of every replica would lose them
    all to a lost node (every rank is critical) or, 30 s after the first exits, to its
    exit-timeout (here 0 s: the stand-in's `flux run` would end the rest at once)."""
    _, result, logs, owner, *_ = run_script("flux/automlperf.flux", tmp_path, data, sick_node=True, kill=2,
                                 FLUX_STANDIN_NODES="3", FLUX_STANDIN_EXIT_TIMEOUT="0",
                                 FLUX_URI="local:///tmp/flux-standin", FLUX_STANDIN_JOBID="f2Gnq",
                                 FLUX_STANDIN_TIMELEFT="3600")
    assert "replica 1 (from --replica-index)" in logs and "replica 1 cannot start" in logs
    assert result["replicas"] == 3
    # The batch script's own instance knows its job's id in the instance that ran it.
    assert (owner.scheduler, owner.job) == ("flux", "f2Gnq")


def test_the_lsf_script_runs_as_written_and_outlives_a_killed_replica(tmp_path, data):
    """A blaunch per host: a host lost, or its replica killed outright, ends that blaunch
    only (one mpirun of every replica would end them all)."""
    # LSF lists a host once per slot.
    hosts = "hostA hostA hostB hostB hostC hostC"
    _, result, logs, owner, *_ = run_script("lsf/automlperf.lsf", tmp_path, data, kill=2,
                                        LSB_HOSTS=hosts, LSB_JOBID="42",
                                        LSF_STANDIN_RUNLIMIT="01:00:00")
    assert result["replicas"] == 3 and (owner.scheduler, owner.job) == ("lsf", "42")
    assert all(f"replica {i} (from --replica-index)" in logs for i in range(3))
