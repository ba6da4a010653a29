"""Node faults on a real SLURM cluster of slurmd daemons on this host, with simulated
accelerators: a replica killed on its node mid-trial, a replica frozen (SIGSTOP) and never
continued, a replica silent for less than its lease. Every fault is injected once the store
shows the replica holding a trial with an epoch done, and the replica is held (SIGSTOP) while
that trial is picked, so it cannot finish in between on a loaded machine."""

import json
import os
import re
import signal
import subprocess
import time

import pytest

from automlperf.testing.slurm import kill_replica
from helpers import cli, hold_mid_trial, opened, sim_config, wait_for
from test_slurm import wait_job

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

LEASE_S = 10


def node_fault_config() -> str:
    """A trial of the small seed on the digits lasts seconds on these simulated devices; the
    run ends at its deadline. The epoch in flight there gets a short grace: these tests are
    about the faults, not the grace (tests/runner/test_replica.py), and a quarter of the duration
    would only lengthen the job."""
    return sim_config(max_epochs=4, lease_timeout_s=LEASE_S, stop_grace_s=10,
                      deadline_grace_s=2)



@pytest.fixture(scope="module")
def slurm_cluster_3(tmp_path_factory):
    from automlperf.testing.slurm import SlurmError, start_slurm, stop_slurm

    try:
        env = start_slurm(tmp_path_factory.mktemp("slurm3"), 3, "ampfault")
    except SlurmError as exc:
        pytest.fail(str(exc))
    yield env
    stop_slurm(env)


def submit(tmp_path, env, nodes, duration):
    (tmp_path / "sim.toml").write_text(node_fault_config())
    run_dir = tmp_path / "run"
    done = cli("slurm", "--nodes", nodes, "--duration", duration, "--run-dir", run_dir,
               "--config", tmp_path / "sim.toml", "--submit", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    return re.search(r"submitted job (\d+)", done.stdout).group(1), run_dir


def records(store):
    return ({("epoch", e.trial_id, e.epoch) for e in store.epochs(1)}
            | {("trial", t.id) for t in store.trials(1)})


def replicas_step(job, env):
    """The job step of the run's replicas."""
    steps = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i %j"], env=env,
                           capture_output=True, text=True).stdout.splitlines()
    return next(line.split()[0] for line in steps
                if line.split()[1:] == ["automlperf-replicas"])


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_killed_replica_a_frozen_replica_and_a_brief_silence(slurm_cluster_3, tmp_path):
    """Replica 2 is silent for half its lease (nothing fails), replica 0 is killed on its
    node (SIGKILL: it and what it started) and replica 1 is frozen for good, each
    mid-trial: their trials fail when their leases lapse, replica 2 carries on, the run ends
    at its deadline with every record it had, the frozen process ends with the job, and the
    run verifies."""
    env = slurm_cluster_3
    # The run's end. The faults come at the first trials, about 15 s into the clock on an
    # idle machine, and the last lease lapses 10 s after; a loaded machine starts the
    # replicas later, so the deadline leaves that more than three times over.
    duration = 90
    job, run_dir = submit(tmp_path, env, 3, f"{duration}s")
    store = opened(run_dir)

    pid2, paused = hold_mid_trial(store, run_dir, 2)
    before = records(store)
    time.sleep(LEASE_S / 2)  # the fault itself: silent for half the lease
    os.kill(pid2, signal.SIGCONT)
    resumed_at = time.time()

    _, cancelled = hold_mid_trial(store, run_dir, 0)
    kill_replica(run_dir, 0)
    frozen_pid, frozen = hold_mid_trial(store, run_dir, 1)  # and never continued
    before |= records(store)

    assert wait_job(job, env) == "COMPLETED"
    out = next((run_dir / "logs").glob("slurm-*.out")).read_text()
    assert "automlperf primary finished with status 0" in out, out[-3000:]
    wait_for(lambda: not alive(frozen_pid), 120, "the frozen replica to end with its job")

    from automlperf.store.opening import run_store

    with run_store(run_dir) as store:
        assert before <= records(store)  # nothing recorded was lost
        trials = {t.id: t for t in store.trials(1)}
        for victim in (cancelled, frozen):
            assert trials[victim.id].status == "failed"
            assert "heart-beating" in trials[victim.id].reason
        mine = [t for t in trials.values() if t.replica_index == 2]
        assert trials[paused.id].status == "completed"
        assert not [t for t in mine if t.status == "failed"]  # nothing failed spuriously
        assert any(t.created_at > resumed_at for t in mine)  # it carried on
    result = json.loads((run_dir / "result.json").read_text())
    assert not result["interrupted"] and result["elapsed_s"] == pytest.approx(duration, abs=1e-6)
    done = cli("check", run_dir, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


def test_cancelling_the_only_replica_ends_the_run_in_one_line(slurm_cluster_3, tmp_path):
    env = slurm_cluster_3
    job, run_dir = submit(tmp_path, env, 1, "15m")
    store = opened(run_dir)
    _, cancelled = hold_mid_trial(store, run_dir, 0)
    subprocess.run(["scancel", replicas_step(job, env)], env=env, check=True)
    wait_job(job, env)
    out = next((run_dir / "logs").glob("slurm-*.out")).read_text()
    assert "Traceback" not in out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "replica 0" in errors[0], out[-3000:]
    assert "automlperf primary finished with status 1" in out
    from automlperf.store.opening import run_store

    with run_store(run_dir) as store:
        assert store.trial(cancelled.id).status == "failed"
    done = cli("check", run_dir, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
