"""A run longer than its partition lets a job last, on the local SLURM cluster: `automlperf
slurm --chain --partition short` reads the partition's maximum time from sinfo, queues a
chain of jobs of that limit, each after the last; a job stopped as its time limit stops it
(the same SIGTERM, sent here with scancel so that the test does not wait out the limit) is
followed by the next, which resumes the run and ends it, and cancels the job still queued.
The data is staged on the nodes once: the second job finds each node's copy and copies
nothing, and the copies go when the run is over. While the first job runs, `automlperf
status` reads it through its store service, as from a login node. Simulated accelerators:
the jobs and the clock are the point, not the training."""

import json
import re
import subprocess

import pytest

from helpers import cli, opened, sim_config, wait_for
from test_slurm import wait_job
from trees import WNIDS, make_tree

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

# The local cluster's partition `short` holds jobs of 5 minutes: with a start-up allowance
# of half a minute, half a minute of staging and 3 minutes for the signal's lead and the
# result, a job of the chain holds a minute of run, so a run of a minute and its grace needs
# two jobs, and one spare.
DURATION_S = 60
GRACE_S = 2


def test_a_chain_of_jobs_runs_the_run_across_its_partitions_time_limit(slurm_cluster, tmp_path):
    data = make_tree(tmp_path / "shared" / "imagenet", per_class=(3, 1), classes=WNIDS[:10])
    # An epoch of ResNet-50 at 32x32 on ImageNet's counts lasts a few seconds here.
    (tmp_path / "sim.toml").write_text(sim_config(sustained_ops=2e14, time_compression=10.0,
                                                  stop_grace_s=10, deadline_grace_s=GRACE_S,
                                                  image_folders=True))
    run_dir, local = tmp_path / "run", tmp_path / "local"
    local.mkdir()
    common = ("--nodes", 2, "--duration", f"{DURATION_S}s", "--config", tmp_path / "sim.toml",
              "--data-dir", data, "--startup-time", "30s", "--stage-to", local,
              "--stage-time", "30s", "--chain")
    # The default partition sets no maximum: one job holds any run.
    done = cli("slurm", *common, "--run-dir", tmp_path / "unneeded", env=slurm_cluster)
    assert done.returncode == 2 and "partition debug sets no maximum time" in done.stderr

    done = cli("slurm", *common, "--partition", "short", "--run-dir", run_dir, "--submit",
               env=slurm_cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    # 5 min less 30 s of start-up, 30 of staging, 2 min of lead and SLURM's minute: a minute
    # of run in each.
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
    # From the login node, while the job runs: through its store service.
    done = cli("status", run_dir, env=slurm_cluster)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"{run_dir.resolve()}: running (store service at {lines[0].split('at ')[1]}"
    assert re.match(rf"job       slurm job {jobs[0]} on 2 node\(s\), ends \S+ \S+ \(in 0:0", lines[1])
    assert any(x.startswith("replicas  2 running") for x in lines), lines
    assert "staged    on 2 of 2 node(s)" in lines
    assert any(x.startswith("valid     no, so far: simulated: simulated accelerators are never "
                            "valid; dataset: trained on imagenet") for x in lines), lines
    # What the time limit does: SIGTERM to the batch shell.
    subprocess.run(["scancel", "--batch", "--signal=TERM", jobs[0]], env=slurm_cluster, check=True)
    assert wait_job(jobs[0], slurm_cluster) == "COMPLETED"  # the script's own exit, 130
    first = (run_dir / "logs" / f"slurm-{jobs[0]}.out").read_text()
    assert "automlperf primary finished with status 130" in first and "cancelled" not in first
    assert "the chain's next job goes on with the run" in first
    assert "interrupted: continue with" not in first
    interim = json.loads((run_dir / "result.json").read_text())
    assert interim["interrupted"] and 0 < interim["elapsed_s"] < DURATION_S

    # The staged copies stay for the next job.
    assert sorted(p.name for p in local.iterdir()) == ["automlperf-run-n1", "automlperf-run-n2"]
    first_copies = [json.loads(p.read_text()) for p in sorted((run_dir / "staging").glob("n?.json"))]
    assert [(c["node"], c["copied_bytes"] > 0) for c in first_copies] == [("n1", True), ("n2", True)]

    # The next job resumes the run, ends it, and cancels the spare.
    assert wait_job(jobs[1], slurm_cluster) == "COMPLETED"
    second = (run_dir / "logs" / f"slurm-{jobs[1]}.out").read_text()
    assert "automlperf resuming" in second and "status 0" in second, second
    assert f"cancelled the chain's later jobs: {jobs[2]}" in second, second
    assert wait_job(jobs[2], slurm_cluster) == "CANCELLED"
    assert (run_dir / "chain.over").read_text() == f"ended in job {jobs[1]} with status 0\n"
    # Staged once: the second job found each copy and copied nothing; its end, the run's,
    # removed the copies (their records kept).
    staged = "".join(p.read_text() for p in (run_dir / "logs").glob("stage-*.log"))
    assert len(re.findall(r"staged in \S+ in [\d.]+ s", staged)) == 4, staged
    assert staged.count("removed this node's copy") == 2
    kept = [json.loads(p.read_text()) for p in sorted((run_dir / "staging").glob("n?-*.json"))]
    assert [(k["node"], k["copied_bytes"]) for k in kept] == [("n1", 0), ("n2", 0)]
    assert not any(local.iterdir())
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
