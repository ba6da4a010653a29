"""A run longer than its partition lets a job last, on the local SLURM cluster: `automlperf
slurm --chain --partition short` reads the partition's maximum time from sinfo, queues a
chain of jobs of that limit, each after the last; a job stopped as its time limit stops it
(the same SIGTERM, sent here with scancel so that the test does not wait out the limit) is
followed by the next, which resumes the run and ends it, and cancels the job still queued.
Simulated accelerators: the jobs and the clock are the point, not the training."""

import json
import re
import subprocess

import pytest

from helpers import cli, sim_config, wait_for
from helpers import opened
from test_slurm import wait_job

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

# The local cluster's partition `short` holds jobs of 5 minutes: with a start-up allowance
# of a minute and 3 minutes for the signal's lead and the result, a job of the chain holds
# a minute of run, so a run of a minute and its grace needs two jobs, and one spare.
DURATION_S = 60
GRACE_S = 2


def test_a_chain_of_jobs_runs_the_run_across_its_partitions_time_limit(slurm_cluster, tmp_path):
    (tmp_path / "sim.toml").write_text(sim_config(sustained_ops=2e11, stop_grace_s=10,
                                                  deadline_grace_s=GRACE_S))
    run_dir = tmp_path / "run"
    common = ("--nodes", 2, "--duration", f"{DURATION_S}s", "--config", tmp_path / "sim.toml",
              "--startup-time", "1m", "--chain")
    # The default partition sets no maximum: one job holds any run.
    done = cli("slurm", *common, "--run-dir", tmp_path / "unneeded", env=slurm_cluster)
    assert done.returncode == 2 and "partition debug sets no maximum time" in done.stderr

    done = cli("slurm", *common, "--partition", "short", "--run-dir", run_dir, "--submit",
               env=slurm_cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "a chain of 3 jobs of 0:05:00" in done.stdout, done.stdout
    jobs = re.search(r"submitted jobs ([\d ]+) \(", done.stdout).group(1).split()
    assert (run_dir / "chain.jobs").read_text().split() == jobs
    for job in jobs:
        shown = subprocess.run(["scontrol", "show", "job", job, "--oneliner"], env=slurm_cluster,
                               capture_output=True, text=True).stdout
        assert "TimeLimit=00:05:00" in shown and "Partition=short" in shown
    later = subprocess.run(["scontrol", "show", "job", jobs[1], "--oneliner"], env=slurm_cluster,
                           capture_output=True, text=True).stdout
    assert f"Dependency=afterany:{jobs[0]}" in later

    store = opened(run_dir)
    wait_for(lambda: bool(store.epochs(1)), 600, "a first epoch")
    store.close()
    # What the time limit does: SIGTERM to the batch shell.
    subprocess.run(["scancel", "--batch", "--signal=TERM", jobs[0]], env=slurm_cluster, check=True)
    assert wait_job(jobs[0], slurm_cluster) == "COMPLETED"  # the script's own exit, 130
    first = (run_dir / "logs" / f"slurm-{jobs[0]}.out").read_text()
    assert "automlperf primary finished with status 130" in first and "cancelled" not in first
    assert "the chain's next job goes on with the run" in first
    assert "interrupted: continue with" not in first
    interim = json.loads((run_dir / "result.json").read_text())
    assert interim["interrupted"] and 0 < interim["elapsed_s"] < DURATION_S

    # The next job resumes the run, ends it, and cancels the spare.
    assert wait_job(jobs[1], slurm_cluster) == "COMPLETED"
    second = (run_dir / "logs" / f"slurm-{jobs[1]}.out").read_text()
    assert "automlperf resuming" in second and "status 0" in second, second
    assert f"cancelled the chain's later jobs: {jobs[2]}" in second, second
    assert wait_job(jobs[2], slurm_cluster) == "CANCELLED"
    assert (run_dir / "chain.over").read_text() == f"ended in job {jobs[1]} with status 0\n"
    result = json.loads((run_dir / "result.json").read_text())
    assert not result["interrupted"] and len(result["segments"]) == 2
    assert result["elapsed_s"] == pytest.approx(DURATION_S, abs=1e-6)
    system = json.loads((run_dir / "system.json").read_text())
    assert system["job_limit"]["chain_link"] is True
    done = cli("check", run_dir, timeout=300)
    assert done.returncode == 0 and "verified" in done.stdout, done.stdout + done.stderr

    # A resubmission gives twice the start-up the first job took, as SLURM and the clock
    # recorded it, not the fixed allowance.
    took = result["segments"][0]["started_at"] - system["job_limit"]["started_at"]
    done = cli("slurm", "--resume", "--run-dir", run_dir, env=slurm_cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    allowance = float(re.search(r"start-up (\d+) s: twice the first job's", done.stdout).group(1))
    assert allowance == pytest.approx(max(60.0, 2 * took), abs=1)
